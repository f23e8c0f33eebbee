#!/usr/bin/env python3
"""Interleaved A/B of the commits retention touches, and of undo (issue #16).

    bench/undo_ab.py --rounds 7 base=/path/to/main/txbox branch=target/release/txbox
    bench/undo_ab.py --rounds 7 off=target/release/txbox:TXBOX_RETAIN_COUNT=0 on=target/release/txbox

A variant is NAME=BINARY[:VAR=VALUE,...]: the variables are set for its runs (retention off is
TXBOX_RETAIN_COUNT=0; such a variant is not asked to undo).

Cases, each on a fresh workspace made natively before every timed run:
  delete-tree   `rm -rf big` where big/ holds 10,000 small files (one commit step)
  delete-files  `rm big/f*`: the same 10,000 files removed one by one (10,000 steps)
  replace-1000  `for f in m/*; do echo x >> $f; done` over 1,000 files (1,000 exchanges)
For each, the wall time of `txbox run` and its commit and cleanup phases (TXBOX_TIMING). For
variants whose binary has `undo`, the deletions are then undone: the wall time of `txbox undo`
and the space the undo data holds (`du` of the state directory's `kept/`). Between runs the background collectors are
given time to finish (their work is not on the caller's path, but it shares the CPU).

Rounds rotate the order of the variants (A B, B A, ...); medians are printed.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

CASES = {
    "delete-tree": ("big", 10000, "rm -rf big"),
    "delete-files": ("big", 10000, "rm big/f*"),
    "replace-1000": ("m", 1000, "for f in m/*; do echo x >> $f; done"),
}


def populate(ws, d, n):
    os.makedirs(os.path.join(ws, d))
    for i in range(n):
        with open(os.path.join(ws, d, f"f{i:05}"), "w") as f:
            f.write(f"file {i}\n")
    subprocess.run(["sync", "-f", ws], check=True)


def phases(stderr):
    out = {}
    for line in stderr.splitlines():
        if line.startswith("txbox timing (ms):"):
            for part in line.split(":", 1)[1].split(","):
                k, v = part.split()
                out[k] = float(v)
    return out


def wait_collectors(state, limit=60.0):
    gone = os.path.join(state, "gone")
    t = time.time()
    while time.time() - t < limit:
        if not os.path.isdir(gone) or not os.listdir(gone):
            break
        time.sleep(0.2)
    time.sleep(0.3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="NAME=BINARY")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="txbox-undo-ab-", dir="/var/tmp")
    variants = []
    for spec in args.variants:
        name, binary = spec.split("=", 1)
        extra = {}
        if ":" in binary:
            binary, env_spec = binary.split(":", 1)
            extra = dict(kv.split("=", 1) for kv in env_spec.split(",") if kv)
        d = os.path.join(root, name)
        os.makedirs(os.path.join(d, "state"))
        os.makedirs(os.path.join(d, "home"))
        has_undo = subprocess.run([binary, "undo", "--help"], capture_output=True).returncode == 0
        has_undo = has_undo and extra.get("TXBOX_RETAIN_COUNT") != "0"
        variants.append({"name": name, "bin": os.path.abspath(binary), "dir": d, "undo": has_undo, "env": extra})
    cases = args.cases.split(",")
    results = {v["name"]: {c: {"run": [], "commit": [], "cleanup": [], "undo": [], "kept": []} for c in cases} for v in variants}

    def once(v, case):
        d, n, cmd = CASES[case]
        ws = os.path.join(v["dir"], "ws")
        shutil.rmtree(ws, ignore_errors=True)
        os.makedirs(ws)
        populate(ws, d, n)
        env = dict(os.environ, HOME=os.path.join(v["dir"], "home"), TXBOX_TIMING="1", **v["env"])
        env.pop("XDG_STATE_HOME", None)
        state = os.path.join(v["dir"], "state")
        base = [v["bin"], "--state-dir", state]
        t = time.perf_counter()
        p = subprocess.run(base + ["run", "-C", ws, "-c", cmd], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        assert p.returncode == 0, p.stderr
        ph = phases(p.stderr)
        r = results[v["name"]][case]
        r["run"].append(wall * 1e3)
        r["commit"].append(ph.get("commit", 0.0))
        r["cleanup"].append(ph.get("cleanup", 0.0))
        if v["undo"] and case.startswith("delete"):
            wait_collectors(state)
            time.sleep(1.0)  # the background collector measures what was kept
            du = subprocess.run(["du", "-s", "-B1", os.path.join(state, "kept")], capture_output=True, text=True)
            r["kept"].append(int(du.stdout.split()[0]) if du.returncode == 0 else 0)
            t = time.perf_counter()
            u = subprocess.run(base + ["--json", "undo", "-C", ws], env=env, capture_output=True, text=True)
            uw = time.perf_counter() - t
            assert u.returncode == 0, u.stdout + u.stderr
            assert os.path.exists(os.path.join(ws, d, "f09999")), "undo did not restore"
            r["undo"].append(uw * 1e3)
            # Keep the state directory from growing across rounds.
            subprocess.run(base + ["gc", "--purge-all"], env=env, capture_output=True)
        wait_collectors(state)

    for v in variants:  # warm-up: state directory, warm server
        once(v, cases[-1])
    for r in range(args.rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            for c in cases:
                once(v, c)

    med = lambda xs: statistics.median(xs) if xs else float("nan")
    print(f"rounds: {args.rounds} (interleaved, medians in ms)")
    print(f"{'case':<14} {'variant':<8} {'run':>9} {'commit':>9} {'cleanup':>9} {'undo':>9} {'kept MiB':>9}")
    for c in cases:
        for v in variants:
            x = results[v["name"]][c]
            kept = med(x["kept"]) / 2**20 if x["kept"] else float("nan")
            print(
                f"{c:<14} {v['name']:<8} {med(x['run']):>9.1f} {med(x['commit']):>9.1f} "
                f"{med(x['cleanup']):>9.2f} {med(x['undo']):>9.1f} {kept:>9.1f}"
            )
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(results, f)
    print(f"raw: {os.path.join(root, 'results.json')}")
    for v in variants:  # the workspaces and state directories (10,000 files each)
        shutil.rmtree(v["dir"], ignore_errors=True)


if __name__ == "__main__":
    main()
