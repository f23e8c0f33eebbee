#!/usr/bin/env python3
"""Interleaved A/B of Claude Code's PreToolUse hook for its Bash tool: the `sh` + `python3` script
the examples shipped until 405ea87 (taken from git; with the `python3` first on PATH, and with
/usr/bin/python3) against `txbox hook || exit 2`, each run through `sh -c` as Claude Code runs
hooks, fed a captured event on stdin.

    bench/hook_ab.py target/release/txbox [--rounds 10] [--per-round 10]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

EVENT = json.dumps({"session_id": "s", "cwd": "/tmp", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                    "tool_input": {"command": "grep -rn 'TODO' src | head -20", "description": "d"}}).encode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("txbox")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=10)
    args = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="txbox-hook-ab-", dir="/var/tmp")
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir)
    shutil.copy(args.txbox, os.path.join(bindir, "txbox"))
    old = os.path.join(tmp, "txbox-bash-hook")
    with open(old, "wb") as f:
        f.write(subprocess.run(["git", "-C", repo, "show", "405ea87^:examples/claude-code/txbox-bash-hook"],
                               check=True, capture_output=True).stdout)
    os.chmod(old, 0o755)
    sysbin = os.path.join(tmp, "sysbin")
    os.makedirs(sysbin)
    os.symlink("/usr/bin/python3", os.path.join(sysbin, "python3"))
    path = os.environ.get("PATH", "/usr/bin:/bin")
    variants = {
        "sh + python3 (first on PATH)": (["sh", "-c", old], f"{bindir}:{path}"),
        "sh + /usr/bin/python3": (["sh", "-c", old], f"{bindir}:{sysbin}:/usr/bin:/bin"),
        "txbox hook || exit 2": (["sh", "-c", "txbox hook || exit 2"], f"{bindir}:{path}"),
    }
    times = {k: [] for k in variants}
    order = list(variants.items())
    for r in range(args.rounds):
        k = r % len(order)
        for name, (argv, p) in order[k:] + order[:k]:
            for _ in range(args.per_round):
                t = time.perf_counter()
                out = subprocess.run(argv, input=EVENT, capture_output=True, env=dict(os.environ, PATH=p))
                times[name].append(time.perf_counter() - t)
                if out.returncode != 0 or b"updatedInput" not in out.stdout:
                    raise SystemExit(f"{name}: {out}")
    for name, ts in times.items():
        print(f"{name:<30} median {statistics.median(ts) * 1e3:8.2f} ms  (n={len(ts)})")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
