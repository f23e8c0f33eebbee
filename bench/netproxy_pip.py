#!/usr/bin/env python3
"""`pip install` of ten packages through txbox's proxy (`--allow-host @pypi`) against the host's
network (`--network host`), interleaved A/B per docs/BENCHMARKS.md's method (issue #15: at most
5% slower).

    bench/netproxy_pip.py [--txbox target/release/txbox] [--rounds 7] [--before OTHER_TXBOX]

Needs this machine's package index (whatever pip is configured with: the @pypi preset reads
pip's own configuration). Each timed run is one `txbox run` that installs the packages with
`--no-cache-dir --no-deps` into the sandbox's private /tmp, so every run downloads everything
and commits nothing. If the index's names resolve to non-public addresses here (a mirror on a
private network), the first run's refusals name them and they are added to the allowlist, as a
user would. Prints medians, their difference and ratio, and the verdict. With `--before`, a
third variant runs the proxy of another build (interleaved with the others, the order rotating
each round), for an A/B of a change to the proxy.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PACKAGES = ["six", "idna", "attrs", "packaging", "pyparsing", "toml", "tomli", "typing-extensions", "zipp",
            "iniconfig"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--txbox", default="target/release/txbox")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--python", default=None, help="the Python whose pip runs (default: python3's own)")
    ap.add_argument("--before", default=None, help="another txbox whose proxy runs as a third variant")
    args = ap.parse_args()
    txbox = os.path.abspath(args.txbox)
    python = args.python or subprocess.run(["python3", "-c", "import sys; print(sys.executable)"],
                                           capture_output=True, text=True, check=True).stdout.strip()
    root = tempfile.mkdtemp(prefix="txbox-bench-pip-", dir="/var/tmp")
    ws, state = os.path.join(root, "ws"), os.path.join(root, "state")
    os.makedirs(ws)
    os.makedirs(state)
    pip = [python, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-deps", "--disable-pip-version-check",
           "--target", "/tmp/site"] + PACKAGES
    env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1")

    def once(net, exe=txbox):
        t = time.perf_counter()
        base = [exe, "--state-dir", state, "--json", "run", "-C", ws]
        p = subprocess.run(base + net + ["--"] + pip, env=env, capture_output=True, text=True)
        elapsed = time.perf_counter() - t
        result = json.loads(p.stdout)
        return elapsed, result

    allow = "@pypi"
    for _ in range(3):
        _, r = once(["--allow-host", allow])
        if r["outcome"] == "committed":
            break
        extra = [c["reason"].rsplit("--allow-host ", 1)[1].rstrip(")")
                 for c in (r.get("network") or {}).get("connections", []) if c.get("code") == "non-public"]
        if not extra:
            sys.exit(f"pip through {allow} failed:\n{r['stderr'][-2000:]}\n{json.dumps(r.get('network'), indent=1)}")
        allow += "," + ",".join(sorted(set(extra)))
    variants = [("host", ["--network", "host"], [], txbox), ("proxy", ["--allow-host", allow], [], txbox)]
    if args.before:
        variants.append(("before", ["--allow-host", allow], [], os.path.abspath(args.before)))
    for _, net, _, exe in variants:
        _, r = once(net, exe)  # warm-up
        if r["outcome"] != "committed":
            sys.exit(f"{net}: {r['outcome']}: {r['stderr'][-2000:]}")
    connections = 0
    loads = [os.getloadavg()[0]]
    for n in range(args.rounds):
        k = n % len(variants)
        order = variants[k:] + variants[:k]
        for name, net, times, exe in order if n % 2 == 0 else order[::-1]:
            t, r = once(net, exe)
            if r["outcome"] != "committed":
                sys.exit(f"{name}: {r['outcome']}: {r['stderr'][-2000:]}")
            if name == "proxy":
                connections = len(r["network"]["connections"])
            times.append(t)
        loads.append(os.getloadavg()[0])
    host = statistics.median(variants[0][2])
    proxy = statistics.median(variants[1][2])
    ratio = proxy / host
    # The two runs of a round ran side by side, in alternating order: their ratio sees the same
    # machine, which matters on a host whose load swings.
    paired = statistics.median(p / h for h, p in zip(variants[0][2], variants[1][2]))
    print(f"pip install of {len(PACKAGES)} packages (--no-cache-dir --no-deps), {args.rounds} interleaved rounds")
    print(f"allowlist: {allow}; {connections} connections through the proxy per run")
    print(f"{'variant':<8} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, _, times, _ in variants:
        print(f"{name:<8} {statistics.median(times):>9.3f} {min(times):>7.3f} {max(times):>7.3f}")
    print(f"proxy - host: {proxy - host:+.3f} s, ratio of medians {ratio:.3f}, median of paired ratios "
          f"{paired:.3f} ({'within' if paired <= 1.05 else 'over'} the 5% target)")
    if args.before:
        before = variants[2][2]
        print(f"before - host: {statistics.median(before) - host:+.3f} s, ratio of medians "
              f"{statistics.median(before) / host:.3f}, median of paired ratios "
              f"{statistics.median(b / h for h, b in zip(variants[0][2], before)):.3f}")
    print(f"load average (1 min) over the rounds: {min(loads):.2f}-{max(loads):.2f}")
    subprocess.run(["rm", "-rf", root])


if __name__ == "__main__":
    main()
