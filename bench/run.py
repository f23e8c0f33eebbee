#!/usr/bin/env python3
"""txbox benchmark: the measures of DESIGN §8 as ratios within one run.

usage: bench/run.py [--txbox target/release/txbox] [--quick] [--out FILE]

Measures (medians, interleaved A B A B so drift hits both sides alike):
  1. added latency of `txbox run -- true` over bare `true`
  2. the same on a 100,000-file workspace vs a 100-file one (ratio), and a one-file commit in
     each (ratio)
  3. commit of 10,000 new small files vs writing them natively (ratio)
  4. rollback of a transaction that wrote 10,000 files (time to return)
  5. sequential `txbox run` throughput
--quick runs a few iterations of each (for CI: keeps the harness from rotting; no timing
assertions). Workspaces live under /var/tmp; they are renamed aside between timed runs and
deleted only after measuring (ext4 without a journal is slow to create files right after a
bulk delete).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = "/var/tmp/txbox-bench-%d" % os.getpid()


def timed(argv, cwd, env=None):
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"benchmark command failed ({p.returncode}): {argv}")
    return dt


def make_ws(path, files):
    os.makedirs(path, exist_ok=True)
    per_dir = 1000
    for i in range(files):
        d = os.path.join(path, f"d{i // per_dir}")
        if i % per_dir == 0:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}"), "w") as f:
            f.write("x\n")


def median_ms(xs):
    return statistics.median(xs) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--txbox", default="target/release/txbox")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    txbox = os.path.abspath(a.txbox)
    n = 5 if a.quick else 200
    big_files = 2_000 if a.quick else 100_000
    commit_files = 500 if a.quick else 10_000
    rounds = 2 if a.quick else 7
    os.makedirs(ROOT, exist_ok=True)
    res = {"quick": a.quick, "host": os.uname().release, "nproc": os.cpu_count()}
    try:
        small, big = os.path.join(ROOT, "small"), os.path.join(ROOT, "big")
        make_ws(small, 100)
        make_ws(big, big_files)
        run = [txbox, "run", "--", "true"]
        bare, tx_small, tx_big = [], [], []
        for _ in range(n):
            bare.append(timed(["true"], small))
            tx_small.append(timed(run, small))
            tx_big.append(timed(run, big))
        res["bare_true_ms"] = median_ms(bare)
        res["txbox_true_ms"] = median_ms(tx_small)
        res["added_latency_ms"] = median_ms(tx_small) - median_ms(bare)
        res["big_ws_files"] = big_files
        res["big_vs_small_ratio"] = median_ms(tx_big) / median_ms(tx_small)
        t0 = time.perf_counter()
        for _ in range(n):
            subprocess.run(run, cwd=small, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        res["sequential_tx_per_s"] = n / (time.perf_counter() - t0)
        # A one-file change committed in each: cost must follow the change, not the workspace.
        one = [txbox, "run", "-c", "echo $RANDOM > d0/f1"]
        c_small, c_big = [], []
        for _ in range(max(n // 4, 3)):
            c_small.append(timed(one, small))
            c_big.append(timed(one, big))
        res["one_file_commit_small_ms"] = median_ms(c_small)
        res["one_file_commit_big_ms"] = median_ms(c_big)
        res["one_file_commit_big_vs_small_ratio"] = median_ms(c_big) / median_ms(c_small)

        script = f"mkdir -p gen; cd gen; for i in $(seq {commit_files}); do echo $i > f$i; done"
        native, txc, rb = [], [], []
        for r in range(rounds):
            a_ws = os.path.join(ROOT, f"native{r}")
            b_ws = os.path.join(ROOT, f"tx{r}")
            c_ws = os.path.join(ROOT, f"rb{r}")
            for w in (a_ws, b_ws, c_ws):
                os.makedirs(w)
            native.append(timed(["bash", "-c", script], a_ws))
            txc.append(timed([txbox, "run", "-c", script], b_ws))
            rb_script = script + "; exit 1"
            t0 = time.perf_counter()
            subprocess.run([txbox, "run", "-c", rb_script], cwd=c_ws, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            total = time.perf_counter() - t0
            # The rollback's own share: total minus the in-sandbox time of the same script.
            rb.append(total)
        res["commit_files"] = commit_files
        res["native_write_ms"] = median_ms(native)
        res["txbox_write_commit_ms"] = median_ms(txc)
        res["commit_vs_native_ratio"] = median_ms(txc) / median_ms(native)
        res["rollback_run_ms"] = median_ms(rb)
        # Rollback alone, from the timing log of one run.
        w = os.path.join(ROOT, "rbt")
        os.makedirs(w)
        p = subprocess.run([txbox, "run", "-c", script + "; exit 1"], cwd=w, capture_output=True, text=True,
                           env=dict(os.environ, TXBOX_TIMING="1"))
        for part in p.stderr.split("timing (ms):")[-1].split(","):
            k, _, v = part.strip().partition(" ")
            if k == "rollback":
                res["rollback_alone_ms"] = float(v)
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
