#!/usr/bin/env python3
"""Interleaved A/B of `txbox run` between two binaries (or more), per docs/BENCHMARKS.md's method.

    bench/ab.py --rounds 15 --per-round 20 before=/path/to/old/txbox after=target/release/txbox
    bench/ab.py --shell 'echo $RANDOM > f' before=/path/to/old/txbox after=target/release/txbox
    bench/ab.py --file f2 --shell 'cat f2' before=/path/to/old/txbox after=target/release/txbox
    bench/ab.py --env off:TXBOX_RETAIN_COUNT=0 on=target/release/txbox off=target/release/txbox
    bench/ab.py --user txbox-test before=/path/to/old/txbox after=target/release/txbox   # unprivileged

Each variant gets its own scratch workspace and state directory (`--state-dir`; a variant named
`NAME:default` uses the default state directory instead, with HOME set to a scratch home), one
untimed warm-up, then rounds in rotating order (A B, B A, ...), each round `--per-round` timed
runs of the command. Prints the median per variant and its difference and ratio to the first.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="NAME=BINARY or NAME:default=BINARY")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per-round", type=int, default=20)
    ap.add_argument("--command", default="true", help="argv of the command, split on spaces")
    ap.add_argument("--shell", help="a shell command line instead (`txbox run -c STRING`)")
    ap.add_argument("--file", action="append", default=[], help="a small file put in each workspace first (repeatable)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME:VAR=VALUE",
                    help="set VAR for variant NAME only (repeatable): one binary, two settings")
    ap.add_argument("--user", help="run every variant as this user (through setpriv; the scratch "
                    "areas are given to it; needs root): the unprivileged, user-namespace mode")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="txbox-ab-", dir="/var/tmp")
    os.chmod(root, 0o755)
    as_user = []
    if args.user:
        import pwd
        pw = pwd.getpwnam(args.user)
        as_user = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]
    variants = []
    for spec in args.variants:
        name, binary = spec.split("=", 1)
        default = name.endswith(":default")
        d = os.path.join(root, name.replace(":", "-"))
        os.makedirs(os.path.join(d, "ws"))
        for f in args.file:
            with open(os.path.join(d, "ws", f), "w") as out:
                out.write("a small file\n")
        os.makedirs(os.path.join(d, "state"))
        os.makedirs(os.path.join(d, "home"))
        env = dict(os.environ, HOME=os.path.join(d, "home"))
        env.pop("XDG_STATE_HOME", None)
        env.pop("TXBOX_STATE_DIR", None)
        for e in args.env:
            who, assignment = e.split(":", 1)
            if who == name:
                var, value = assignment.split("=", 1)
                env[var] = value
        if args.user:
            subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", d], check=True)
        argv = as_user + [os.path.abspath(binary)]
        if not default:
            argv += ["--state-dir", os.path.join(d, "state")]
        argv += ["run", "-C", os.path.join(d, "ws")]
        argv += ["-c", args.shell] if args.shell else ["--"] + args.command.split()
        variants.append((name, argv, env, []))

    def once(argv, env):
        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t

    for _, argv, env, _ in variants:
        for _ in range(3):  # warm-up: state directory, warm server
            once(argv, env)
        time.sleep(0.2)
    for r in range(args.rounds):
        k = r % len(variants)
        for name, argv, env, times in variants[k:] + variants[:k]:
            times.extend(once(argv, env) for _ in range(args.per_round))
    base = statistics.median(variants[0][3])
    print(f"{'variant':<10} {'median ms':>10} {'diff ms':>9} {'ratio':>7}  (n={len(variants[0][3])} each)")
    for name, _, _, times in variants:
        m = statistics.median(times)
        print(f"{name:<10} {m * 1e3:>10.3f} {(m - base) * 1e3:>+9.3f} {m / base:>7.3f}")
    time.sleep(1)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
