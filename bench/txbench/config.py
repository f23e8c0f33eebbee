"""How much of each measure a run does: the full run (for docs/BENCHMARKS.md, on a quiet
machine) and --quick (a few iterations at small sizes: for CI, to keep the harness working)."""
from dataclasses import dataclass, field

GIB = 1 << 30


def write_files(count):
    """Shell that writes `count` new small files f1..fN in the current directory."""
    return f"for i in $(seq {count}); do echo $i > f$i; done"


def write_bytes(size):
    """Shell that writes one file of `size` bytes (a multiple of 1 MiB)."""
    return f"dd if=/dev/zero of=big bs=1M count={size >> 20} status=none"


@dataclass
class Change:
    """One change whose commit is timed against the same writes done natively."""
    label: str
    script: str
    files: int = 0
    size: int = 0
    # Written into a directory that already exists in the workspace (each file committed by
    # its own rename) rather than into a new one (committed by one rename of the directory).
    existing_dir: bool = False


@dataclass
class Config:
    quick: bool
    sizes: tuple            # workspace sizes in files; the first is the reference
    latency_runs: int       # interleaved runs of each latency variant
    naive_big_runs: int     # the naive snapshot on the bigger workspace copies it twice per run
    scaling_runs: int
    commit_runs: int        # one-file commits in each workspace size
    throughput_runs: int
    changes: list = field(default_factory=list)
    change_rounds: int = 3
    big_change_rounds: int = 3   # rounds for changes of 1 GiB and more
    rollbacks: list = field(default_factory=list)
    rollback_rounds: int = 3
    session_commands: int = 0   # 0: all of them
    session_rounds: int = 1
    policy_rounds: int = 5


def full():
    return Config(
        quick=False,
        sizes=(100, 10_000, 100_000),
        latency_runs=200,
        naive_big_runs=15,
        scaling_runs=100,
        commit_runs=50,
        throughput_runs=200,
        changes=changes(10_000, GIB),
        change_rounds=7,
        big_change_rounds=3,
        rollbacks=rollbacks(10_000),
        rollback_rounds=7,
        session_commands=0,
        session_rounds=3,
        policy_rounds=5,
    )


def quick():
    return Config(
        quick=True,
        sizes=(100, 1_000),
        latency_runs=5,
        naive_big_runs=2,
        scaling_runs=5,
        commit_runs=3,
        throughput_runs=10,
        changes=changes(1_000, 16 << 20),
        change_rounds=2,
        big_change_rounds=1,
        rollbacks=rollbacks(1_000),
        rollback_rounds=2,
        session_commands=20,
        session_rounds=1,
        policy_rounds=1,
    )


def changes(many, size):
    return [
        Change("1 new file", write_files(1), files=1),
        Change("100 new files", write_files(100), files=100),
        Change(f"{many:,} new files", write_files(many), files=many),
        Change(f"{many:,} new files in an existing directory", write_files(many), files=many, existing_dir=True),
        Change(f"one {size_label(size)} file", write_bytes(size), size=size),
    ]


def rollbacks(many):
    return [
        ("`false` (nothing written)", "false"),
        (f"{many:,} new files, then `exit 1`", f"mkdir gen && cd gen && {write_files(many)}; exit 1"),
    ]


def size_label(size):
    return f"{size // GIB} GiB" if size >= GIB else f"{size >> 20} MiB"
