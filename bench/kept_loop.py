#!/usr/bin/env python3
"""The failing-`cargo test` loop with and without kept build output (#15, docs/BENCHMARKS.md).

Two identical crates (a library of generated functions and one failing test, no dependencies,
built offline); each round runs `txbox run -- cargo test --offline` once in each, interleaved:
A with kept directories (the default), B with `--no-keep`. Reports wall-time medians per
attempt after the first, and how many attempts compiled the crate.

    python3 bench/kept_loop.py [TXBOX] [ROUNDS]
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TXBOX = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/txbox")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
CARGO = shutil.which("cargo") or "cargo"


def make_crate(ws):
    os.makedirs(os.path.join(ws, "src"))
    with open(os.path.join(ws, "Cargo.toml"), "w") as f:
        f.write('[package]\nname = "loop"\nversion = "0.1.0"\nedition = "2021"\n')
    with open(os.path.join(ws, "src/lib.rs"), "w") as f:
        for i in range(400):
            f.write(f"pub fn f{i}(x: u64) -> u64 {{ let v: Vec<u64> = (0..x).map(|k| k * {i} + 1).collect(); v.iter().sum() }}\n")
        f.write("#[test]\nfn fails() { assert_eq!(f1(3), 0); }\n")


def attempt(ws, state, keep):
    cmd = [TXBOX, "--state-dir", state, "--json", "run", "-C", ws]
    if not keep:
        cmd.append("--no-keep")
    cmd += ["--", CARGO, "test", "--offline"]
    t = time.monotonic()
    out = subprocess.run(cmd, cwd=ws, capture_output=True, text=True)
    ms = (time.monotonic() - t) * 1e3
    import json
    j = json.loads(out.stdout)
    assert j["outcome"] == "rolled_back", j
    return ms, "Compiling loop" in j["stderr"]


def main():
    root = tempfile.mkdtemp(prefix="txbox-kept-loop-", dir="/var/tmp")
    try:
        runs = {True: [], False: []}
        compiled = {True: 0, False: 0}
        spaces = {}
        for keep in (True, False):
            ws = os.path.join(root, f"ws-{keep}")
            state = os.path.join(root, f"state-{keep}")
            os.makedirs(state)
            make_crate(ws)
            spaces[keep] = (ws, state)
            attempt(ws, state, keep)  # the first attempt compiles either way
        for r in range(ROUNDS):
            order = (True, False) if r % 2 == 0 else (False, True)
            for keep in order:
                ms, c = attempt(*spaces[keep], keep)
                runs[keep].append(ms)
                compiled[keep] += c
        a, b = statistics.median(runs[True]), statistics.median(runs[False])
        print(f"rounds: {ROUNDS} (after one untimed first attempt each), cargo: {CARGO}")
        print("| variant | median per failing attempt | attempts that compiled |")
        print("|---|---|---|")
        print(f"| kept build output (default) | {a:.0f} ms | {compiled[True]} of {ROUNDS} |")
        print(f"| `--no-keep` | {b:.0f} ms | {compiled[False]} of {ROUNDS} |")
        print(f"ratio: {b / a:.1f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
