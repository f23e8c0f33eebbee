#!/usr/bin/env python3
"""txbox benchmark: the measures of DESIGN §8 as medians and ratios within one run, against
the alternatives a user would pick (bare commands, bubblewrap, a naive copy-the-workspace
snapshot), and a realistic agent session replayed natively and through txbox.

usage: python3 bench/run.py [--txbox target/release/txbox] [--quick] [--out FILE.json]
                            [--markdown FILE.md] [--charts DIR] [--only SUITE,...] [--root DIR]

Measures (see each function's docstring in bench/txbench/ for exactly what its numbers mean):
  latency     `txbox run -- true` vs bare `true`, bubblewrap with a read-only root, and the
              naive snapshot (bench/naive_snapshot.sh) on a small and a bigger workspace
  scaling     `txbox run -- true` and a one-file commit on 100, 10,000, 100,000 files
  throughput  sequential `txbox run` per second
  change      commit of 1, 100, 10,000 new files and a 1 GiB file vs the same writes natively
  rollback    failing runs: excess over native, and txbox's own time after the command exits
  policy      policy evaluation median / p99 (in process, via cargo and an example)
  session     ~200 real agent commands on a generated C + Python project, native vs txbox
Variants are interleaved (A B A B, rotating) so machine drift hits them alike. --quick runs a
few iterations at small sizes (CI keeps the harness working with it; no timing assertions).
Workspaces live under --root (default /var/tmp); nothing is deleted until every measure is
done (ext4 without a journal is slow to create files right after a bulk delete).
Charts (SVG) go to --charts, or next to --out.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from txbench import api, charts, config, report, session, suites  # noqa: E402
from txbench.timing import BenchError  # noqa: E402
from txbench.workspaces import Scratch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CORPUS = os.path.join(os.path.dirname(REPO), "shared", "corpus", "agent_sessions.jsonl")
SUITES = {
    "latency": suites.latency,
    "scaling": suites.scaling,
    "throughput": suites.throughput,
    "change": suites.change_size,
    "rollback": suites.rollback,
    "session": session.session,
    "policy": suites.policy,
    "api": api.api,
}
RESULT_KEYS = {"change": "change_size"}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--txbox", default=os.path.join(REPO, "target", "release", "txbox"), help="binary under test")
    ap.add_argument("--quick", action="store_true", help="few iterations, small sizes (CI)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--markdown", help="write the results as Markdown tables here")
    ap.add_argument("--charts", help="directory for the SVG charts (default: the directory of --out)")
    ap.add_argument("--only", help="comma-separated subset of: " + ", ".join(SUITES))
    ap.add_argument("--root", default="/var/tmp", help="where scratch workspaces are made (the workspace's kind of filesystem)")
    ap.add_argument("--corpus", default=DEFAULT_CORPUS, help="agent_sessions.jsonl for the policy latency (optional)")
    return ap.parse_args(argv)


def read_first(path, prefix):
    try:
        with open(path) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(prefix)), "?")
    except OSError:
        return "?"


def filesystem_of(path):
    """The filesystem type and mount point holding `path`."""
    best, fstype = "", "?"
    with open("/proc/self/mounts") as f:
        for line in f:
            _, mnt, typ = line.split()[:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fstype = mnt, typ
    return f"{fstype} at {best}"


def loadavg():
    """The 1-minute load average: how busy the machine was (other builds make numbers noisy)."""
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def machine(args, txbox):
    mem_kib = int(read_first("/proc/meminfo", "MemTotal").split()[0])
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 " + shlex.join(["bench/run.py", *sys.argv[1:]]),
        "quick": args.quick,
        "nproc": os.cpu_count(),
        "cpu": read_first("/proc/cpuinfo", "model name"),
        "memory_gib": mem_kib / (1 << 20),
        "kernel": platform.release(),
        "filesystem": filesystem_of(os.path.realpath(args.root)),
        "txbox": txbox,
        "txbox_commit": rev or "?",
        "load_start": loadavg(),
    }


def selected(args):
    names = args.only.split(",") if args.only else list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise SystemExit(f"unknown suite(s) {unknown}; choose from {list(SUITES)}")
    return names


def run_suites(names, ctx):
    results = {}
    for name in names:
        print(f"== {name}", file=sys.stderr, flush=True)
        results[RESULT_KEYS.get(name, name)] = SUITES[name](ctx)
    return results


def write_outputs(args, res):
    chart_dir = args.charts or (os.path.dirname(os.path.abspath(args.out)) if args.out else None)
    written = charts.write(res, chart_dir) if chart_dir else []
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
    if args.markdown:
        md_dir = os.path.dirname(os.path.abspath(args.markdown))
        with open(args.markdown, "w") as f:
            f.write(report.markdown(res, [os.path.relpath(c, md_dir) for c in written]))
    for path in [args.out, args.markdown, *written]:
        if path:
            print(f"wrote {path}", file=sys.stderr)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    txbox = os.path.abspath(args.txbox)
    if not os.access(txbox, os.X_OK):
        raise SystemExit(f"no txbox binary at {txbox}: build it with `cargo build --release` or pass --txbox")
    names = selected(args)
    bwrap, bwrap_note = suites.bwrap_status()
    print(f"bubblewrap: {bwrap_note}", file=sys.stderr)
    cfg = config.quick() if args.quick else config.full()
    scratch = Scratch(os.path.join(args.root, f"txbox-bench-{os.getpid()}"))
    ctx = suites.Context(txbox=txbox, cfg=cfg, scratch=scratch, repo=REPO, bwrap=bwrap,
                         corpus=args.corpus if os.path.exists(args.corpus) else "")
    res = {"meta": {**machine(args, txbox), "bwrap": bwrap_note}}
    try:
        res.update(run_suites(names, ctx))
        res["meta"]["load_end"] = loadavg()
    except BenchError as e:
        raise SystemExit(f"bench/run.py: {e}")
    finally:
        print("== cleaning up scratch workspaces", file=sys.stderr)
        scratch.remove()
    res["targets"] = [{"measure": m, "result": r, "target": t, "met": ok} for m, r, t, ok in report.targets(res)]
    write_outputs(args, res)
    print(report.markdown(res))
    mismatch = res.get("session", {}).get("identical") is False
    if mismatch:
        print("bench/run.py: the native and txbox replays of the session differ (see above)", file=sys.stderr)
    return 1 if mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
