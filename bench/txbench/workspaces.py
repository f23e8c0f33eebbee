"""Scratch workspaces under one root, with the hygiene DESIGN §8 asks for on these disks.

ext4 without a journal is slow to create files for minutes after a bulk delete, so nothing is
deleted while measuring: every timed run that needs an empty directory gets a fresh one, and
the whole root is removed once, after the last measure.
"""
import os
import shutil


def make_files(path, count, per_dir=1000):
    """Create `path` holding `count` small files, `d<k>/f<i>`, at most `per_dir` per directory."""
    os.makedirs(path, exist_ok=True)
    for i in range(count):
        d = os.path.join(path, f"d{i // per_dir}")
        if i % per_dir == 0:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}"), "w") as f:
            f.write("x\n")


class Scratch:
    """The benchmark's directory tree: populated workspaces (built once, reused) and fresh
    empty directories (one per timed run that needs one)."""

    def __init__(self, root):
        self.root = root
        self._count = 0
        self._populated = {}
        os.makedirs(root)

    def fresh(self, name):
        """A new empty directory that no earlier run has touched."""
        self._count += 1
        path = os.path.join(self.root, f"{name}-{self._count}")
        os.makedirs(path)
        return path

    def populated(self, kind, files):
        """The workspace `kind` with `files` small files, created on first use. Each tool gets
        its own `kind`, so state one tool leaves (txbox's `.txbox/`) never skews another."""
        key = (kind, files)
        if key not in self._populated:
            path = os.path.join(self.root, f"{kind}-{files}")
            make_files(path, files)
            os.sync()  # the new files' writeback must not land on the first timed runs
            self._populated[key] = path
        return self._populated[key]

    def remove(self):
        """Delete everything, after measuring."""
        shutil.rmtree(self.root, ignore_errors=True)
