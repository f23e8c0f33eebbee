"""Running commands with a stopwatch, interleaving variants, and summarising samples.

Every measure in this harness is a list of wall-clock seconds per variant, collected
round-robin (A B C, then B C A, ...) so that drift of the machine (other builds, writeback,
the slow period after a bulk delete) hits every variant alike. Summaries are medians; results
are reported as differences and ratios of medians taken within one run, never as absolute
times compared across runs.
"""
import os
import shlex
import statistics
import subprocess
import time
from dataclasses import dataclass


class BenchError(Exception):
    """A benchmark command did not do what the measure needs; the message names the command."""


@dataclass
class Sample:
    seconds: float
    returncode: int
    stdout: str
    stderr: str


def run_timed(argv, cwd, env=None, expect=0, capture=False):
    """Run `argv` in `cwd` and return a Sample. Output is read through pipes (as an agent
    would) and kept only when `capture` is set. Raises BenchError naming the command when the
    exit status is not `expect` (None accepts any status)."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    dt = time.perf_counter() - t0
    if expect is not None and p.returncode != expect:
        err = p.stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise BenchError(
            f"benchmark command failed (exit {p.returncode}, expected {expect}) in {cwd}:\n"
            f"  {shlex.join(argv)}\n" + "".join(f"  | {line}\n" for line in err)
        )
    if not capture:
        return Sample(dt, p.returncode, "", "")
    return Sample(dt, p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))


def seconds(argv, cwd, env=None, expect=0):
    """Wall-clock seconds of one run of `argv` (see run_timed)."""
    return run_timed(argv, cwd, env=env, expect=expect).seconds


def interleave(variants, rounds, warmup=1, settle=False):
    """Time each variant `rounds` times, round-robin with the starting variant rotating.

    `variants` maps a name to a function `f(round_index) -> seconds` (round_index is -1 for
    warm-up runs, which are not recorded). With `settle`, every run is followed by an untimed
    sync(2), so that data one variant left dirty is not written back during the next one's
    timing (each variant is charged for what it waits for itself, as its user would be).
    Returns {name: [seconds, ...]}.
    """
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name](-1)
            if settle:
                os.sync()
    samples = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(variants[name](r))
            if settle:
                os.sync()
    return samples


def median_ms(xs):
    return statistics.median(xs) * 1e3


def summary(xs):
    """Median, min and max in ms, and the number of samples."""
    return {"median_ms": median_ms(xs), "min_ms": min(xs) * 1e3, "max_ms": max(xs) * 1e3, "n": len(xs)}


def ratio(a, b):
    """a / b, or None when b is zero (so JSON says null rather than failing)."""
    return a / b if b else None
