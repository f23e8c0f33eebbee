#!/usr/bin/env python3
"""Interleaved A/B of `txbox run -- true` and a one-file commit between binaries.

    bench/ab_true.py ROUNDS NAME=BINARY NAME=BINARY ...

Each binary gets its own one-file workspace under /var/tmp/bench; rounds alternate the order;
medians and minima in ms are printed.
"""
import subprocess, time, statistics as st, sys, os
bins = dict(a.split("=", 1) for a in sys.argv[2:])
rounds = int(sys.argv[1])
ws = {}
for k in bins:
    d = f"/var/tmp/bench/abws-{k}"; os.makedirs("/var/tmp/bench", exist_ok=True); subprocess.run(["rm", "-rf", d]); os.makedirs(d + "/d0"); open(d + "/d0/f1", "w").write("x\n")
    ws[k] = d
cases = {"true": ["--", "true"], "one-file": ["-c", "echo $RANDOM > d0/f1"]}
res = {(k, c): [] for k in bins for c in cases}
for k in bins:
    for c in cases: subprocess.run([bins[k], "run", *cases[c]], cwd=ws[k], capture_output=True)
names = list(bins)
for r in range(rounds):
    order = names if r % 2 == 0 else names[::-1]
    for c in cases:
        for k in order:
            t = time.perf_counter(); p = subprocess.run([bins[k], "run", *cases[c]], cwd=ws[k], capture_output=True)
            res[(k, c)].append((time.perf_counter() - t) * 1e3); assert p.returncode == 0, p.stderr
for c in cases:
    print(c, "  ".join(f"{k} {st.median(res[(k, c)]):.2f} ms (min {min(res[(k, c)]):.2f})" for k in names))
