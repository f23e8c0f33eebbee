"""The measures of DESIGN §8, each a function of a Context returning a JSON-ready dict.

Every function's docstring says what its numbers mean. Variants compared in one measure are
interleaved (timing.interleave); results are medians, their differences and their ratios.
"""
import json
import os
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass

from . import config
from .timing import BenchError, interleave, median_ms, ratio, run_timed, seconds, summary
from .workspaces import Scratch

HERE = os.path.dirname(os.path.abspath(__file__))
NAIVE = os.path.join(os.path.dirname(HERE), "naive_snapshot.sh")
# Bubblewrap with a read-only root: the isolation a user could get without transactions.
BWRAP = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
ONE_FILE = "echo $RANDOM > d0/f1"


@dataclass
class Context:
    txbox: str          # absolute path of the binary under test
    cfg: object         # config.Config
    scratch: Scratch
    repo: str           # the txbox source tree (for cargo and the policy example)
    bwrap: bool         # whether bubblewrap runs here
    corpus: str = ""    # agent_sessions.jsonl for the policy latency, if present

    def tx(self, *args):
        return [self.txbox, "run", *args]


def bwrap_status():
    """(usable, note): whether `bwrap` runs the benchmark's command line on this host."""
    if shutil.which("bwrap") is None:
        return False, "bubblewrap not installed (apt-get install bubblewrap): comparison skipped"
    p = subprocess.run(BWRAP + ["true"], capture_output=True, text=True)
    if p.returncode != 0:
        return False, f"bubblewrap fails here ({p.stderr.strip()}): comparison skipped"
    return True, subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()


def naive_run(ctx, workspace, argv, expect=0):
    """Seconds of one naive-snapshot run of `argv` on `workspace` (bench/naive_snapshot.sh)."""
    return seconds([NAIVE, workspace, ctx.scratch.fresh("naive-copy"), *argv], workspace, expect=expect)


def latency(ctx):
    """Added latency of one transaction that changes nothing, on the smallest workspace:
    `txbox run -- true` against bare `true`, against bubblewrap with a read-only root
    (isolation only: no copy-on-write, no commit, no policy), and against the naive snapshot
    (copy the workspace with `cp -a`, run there, copy back). `added_ms` is each variant's median
    minus bare `true`'s. Then txbox against the naive snapshot on the second workspace size,
    where copying starts to cost: `naive_over_txbox` is the ratio of their medians. Runs are
    settled (untimed sync after each), so the copies' writeback does not land on txbox."""
    small, big = ctx.cfg.sizes[0], ctx.cfg.sizes[1]
    ws_tx, ws_naive = ctx.scratch.populated("txbox", small), ctx.scratch.populated("naive", small)
    variants = {
        "bare true": lambda r: seconds(["true"], ws_tx),
        "txbox run -- true": lambda r: seconds(ctx.tx("--", "true"), ws_tx),
    }
    if ctx.bwrap:
        variants["bwrap read-only root"] = lambda r: seconds(BWRAP + ["true"], ws_tx)
    variants["naive snapshot"] = lambda r: naive_run(ctx, ws_naive, ["true"])
    s = interleave(variants, ctx.cfg.latency_runs, settle=True)
    bare = median_ms(s["bare true"])
    out = {
        "workspace_files": small,
        "variants": {k: summary(v) for k, v in s.items()},
        "added_ms": {k: median_ms(v) - bare for k, v in s.items() if k != "bare true"},
    }
    tx_big, naive_big = ctx.scratch.populated("txbox", big), ctx.scratch.populated("naive", big)
    s = interleave({
        "txbox run -- true": lambda r: seconds(ctx.tx("--", "true"), tx_big),
        "naive snapshot": lambda r: naive_run(ctx, naive_big, ["true"]),
    }, ctx.cfg.naive_big_runs, settle=True)
    out["big"] = {
        "workspace_files": big,
        "variants": {k: summary(v) for k, v in s.items()},
        "naive_over_txbox": ratio(median_ms(s["naive snapshot"]), median_ms(s["txbox run -- true"])),
    }
    return out


def scaling(ctx):
    """Cost against workspace size: `txbox run -- true`, and a transaction that rewrites one
    file (`echo $RANDOM > d0/f1`, committed), in workspaces of each size, interleaved.
    `*_ratio` is each size's median over the smallest workspace's (1.0 = independent of size)."""
    ws = {n: ctx.scratch.populated("txbox", n) for n in ctx.cfg.sizes}
    out = {"sizes": list(ctx.cfg.sizes)}
    for name, argv, runs in (("true", ctx.tx("--", "true"), ctx.cfg.scaling_runs),
                             ("one_file_commit", ctx.tx("-c", ONE_FILE), ctx.cfg.commit_runs)):
        s = interleave({n: (lambda r, w=w: seconds(argv, w)) for n, w in ws.items()}, runs)
        ref = median_ms(s[ctx.cfg.sizes[0]])
        out[name] = {str(n): summary(v) for n, v in s.items()}
        out[name + "_ratio"] = {str(n): ratio(median_ms(v), ref) for n, v in s.items()}
    return out


def throughput(ctx):
    """Sequential transactions per second: `txbox run` back to back (each waits for the
    previous), for a transaction that changes nothing and for a one-file commit."""
    ws = ctx.scratch.populated("txbox", ctx.cfg.sizes[0])
    out = {}
    for name, argv in (("true", ctx.tx("--", "true")), ("one_file_commit", ctx.tx("-c", ONE_FILE))):
        seconds(argv, ws)
        t0 = time.perf_counter()
        for _ in range(ctx.cfg.throughput_runs):
            seconds(argv, ws)
        out[name + "_tx_per_s"] = ctx.cfg.throughput_runs / (time.perf_counter() - t0)
    out["runs"] = ctx.cfg.throughput_runs
    return out


def change_run(ctx, kind, workspace, change, subdir):
    """Seconds of one `kind` run (native, native-sync or txbox) of `change` in `workspace`,
    writing into the new directory `subdir` (made beforehand, untimed, for existing_dir)."""
    if change.existing_dir:
        os.mkdir(os.path.join(workspace, subdir))
        script = f"cd {subdir} && {change.script}"
    else:
        script = f"mkdir {subdir} && cd {subdir} && {change.script}"
    if kind == "txbox":
        return seconds(ctx.tx("-c", script), workspace)
    if kind == "native-sync":
        script += " && sync -f ."
    return seconds(["bash", "-c", script], workspace)


def change_size(ctx):
    """Commit cost against the size of the change: the same writes done natively (`bash -c`),
    natively followed by `sync -f` (as durable as a txbox commit, which syncs), and in
    `txbox run -c` (written through overlayfs, classified, journaled, committed, synced).
    Each round writes into a new directory (or, for `existing_dir` changes, into a directory
    created beforehand, outside the timing) of a per-variant workspace; runs are settled
    (untimed sync after each) so no variant pays another's writeback. `over_native` and
    `over_native_sync` are ratios of medians."""
    ws = {k: ctx.scratch.populated(k, ctx.cfg.sizes[0]) for k in ("native", "native-sync", "txbox")}
    counter = iter(range(10**9))
    out = []
    for ch in ctx.cfg.changes:
        rounds = ctx.cfg.big_change_rounds if ch.size >= config.GIB else ctx.cfg.change_rounds
        s = interleave({k: (lambda r, k=k, ch=ch: change_run(ctx, k, ws[k], ch, f"change-{next(counter)}")) for k in ws},
                       rounds, warmup=0, settle=True)
        tx = median_ms(s["txbox"])
        out.append({
            "label": ch.label, "files": ch.files, "bytes": ch.size, "existing_dir": ch.existing_dir,
            "variants": {k: summary(v) for k, v in s.items()},
            "over_native": ratio(tx, median_ms(s["native"])),
            "over_native_sync": ratio(tx, median_ms(s["native-sync"])),
            "added_ms": tx - median_ms(s["native"]),
        })
    return out


def parse_timing(stderr):
    """{phase: ms} from the `txbox timing (ms): policy 0.6, ..., audit 0.1` line that
    TXBOX_TIMING=1 makes txbox print."""
    for line in stderr.splitlines():
        if line.startswith("txbox timing (ms):"):
            parts = (p.strip().rpartition(" ") for p in line.split(":", 1)[1].split(","))
            return {k: float(v) for k, _, v in parts if k}
    raise BenchError("txbox printed no `txbox timing (ms):` line although TXBOX_TIMING=1 was set")


def after_exit_ms(phases):
    """Milliseconds txbox spends after the sandboxed command has exited and been reaped:
    every phase after `sandbox` (rollback or commit, cleanup, audit)."""
    names = list(phases)
    return sum(phases[k] for k in names[names.index("sandbox") + 1:])


def rollback(ctx):
    """Rollback latency. A command that fails (exit 1) is run natively (each round in a fresh
    directory) and through `txbox run -c` (rolled back), interleaved. `excess_ms` is the
    difference of medians: everything txbox adds, including the sandbox and writing through
    overlayfs. `return_after_exit` is the honest rollback figure: from txbox's own phase
    timings (TXBOX_TIMING=1), the time between the command's exit and txbox returning (the
    rollback itself, which renames the layer aside for a background collector, and the audit
    record). `next_recover_ms` is the `recover` phase at the start of each txbox run, where
    the previous rollback's layer, if still being deleted, is finished off. The background deletion of the rolled-back layer is not settled: it is txbox's
    own cost, and shows in the next runs (see docs/BENCHMARKS.md)."""
    ws_tx = ctx.scratch.populated("txbox-rollback", ctx.cfg.sizes[0])
    env = dict(os.environ, TXBOX_TIMING="1")
    out = []
    for label, script in ctx.cfg.rollbacks:
        after, recover = [], []

        def txbox_run(r, script=script, after=after, recover=recover):
            smp = run_timed(ctx.tx("-c", script), ws_tx, env=env, expect=1, capture=True)
            if r >= 0:
                phases = parse_timing(smp.stderr)
                after.append(after_exit_ms(phases))
                recover.append(phases.get("recover", 0.0))
            return smp.seconds

        s = interleave({
            "native": lambda r, script=script: seconds(["bash", "-c", script], ctx.scratch.fresh("rollback-native"), expect=1),
            "txbox": txbox_run,
        }, ctx.cfg.rollback_rounds, settle=True)
        out.append({
            "label": label,
            "variants": {k: summary(v) for k, v in s.items()},
            "excess_ms": median_ms(s["txbox"]) - median_ms(s["native"]),
            "return_after_exit_ms": {"median": statistics.median(after), "max": max(after)},
            "next_recover_ms": {"median": statistics.median(recover), "max": max(recover)},
        })
    return out


def policy(ctx):
    """Policy evaluation latency in-process, one command string at a time (median, p99, max
    in µs): the representative strings of crates/policy/benches/commands and every command
    of the agent-session corpus when present. Runs the example `policy_latency` through cargo;
    skipped, saying why, where cargo or the sources are missing."""
    if shutil.which("cargo") is None or not os.path.exists(os.path.join(ctx.repo, "Cargo.toml")):
        return {"skipped": "needs cargo and the txbox sources"}
    argv = ["cargo", "run", "--release", "-q", "-p", "txbox-policy", "--example", "policy_latency",
            "--", "--rounds", str(ctx.cfg.policy_rounds)]
    if ctx.corpus:
        argv.append(ctx.corpus)
    p = subprocess.run(argv, cwd=ctx.repo, capture_output=True, text=True)
    if p.returncode != 0:
        raise BenchError(f"policy latency example failed (exit {p.returncode}): {' '.join(argv)}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)
