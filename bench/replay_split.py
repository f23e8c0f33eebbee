#!/usr/bin/env python3
"""The replayed agent session (bench/txbench/session.py), taken apart command by command.

    bench/replay_split.py [--rounds 3] [--out split.json] target/release/txbox

Runs the harness's own `replay_round` (every command natively, through `txbox run -c` and over
`POST /v1/run`, interleaved on three identical trees) for each round, then sums, over the
commands, each command's median added time across the rounds: an estimate that a few commands
varying by tens of milliseconds between rounds (builds) move less than the harness's median
round does. Prints both ways' totals and medians per command, and the commands the API way adds
the most to; `--out` keeps every command's medians as JSON.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from txbench import config, session, suites  # noqa: E402
from txbench.workspaces import Scratch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("txbox")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    scratch = Scratch(f"/var/tmp/txbox-split-{os.getpid()}")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ctx = suites.Context(txbox=os.path.abspath(args.txbox), cfg=config.full(), scratch=scratch, repo=repo,
                         bwrap=False)
    cmds = session.commands(0)
    per = [[] for _ in cmds]
    try:
        for r in range(args.rounds):
            steps, diffs = session.replay_round(ctx, cmds, r)
            if diffs["txbox"] or diffs["api"]:
                sys.exit(f"the replays' trees differ: {diffs}")
            for i, s in enumerate(steps):
                per[i].append(s)
    finally:
        scratch.remove()
    rows = []
    for cmd, ss in zip(cmds, per):
        n = statistics.median(x["native_s"] for x in ss)
        rows.append({"cmd": cmd, "native_s": n, "cli_added_s": statistics.median(x["txbox_s"] for x in ss) - n,
                     "api_added_s": statistics.median(x["api_s"] for x in ss) - n})
    native = sum(r["native_s"] for r in rows)
    print(f"{len(rows)} commands, {args.rounds} rounds; native {native:.2f} s (sum of medians)")
    for way, key in (("txbox run -c", "cli_added_s"), ("POST /v1/run", "api_added_s")):
        added = sum(r[key] for r in rows)
        per_cmd = statistics.median(r[key] for r in rows)
        print(f"{way:<14} added {added * 1e3:6.0f} ms ({100 * added / native:+.1f}%), median {per_cmd * 1e3:.2f} ms per command")
    print("most added over the API:")
    for r in sorted(rows, key=lambda r: r["api_added_s"], reverse=True)[:10]:
        print(f"  {r['api_added_s'] * 1e3:7.1f} ms  (native {r['native_s'] * 1e3:6.1f} ms)  {session.describe(r['cmd'])[:70]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
