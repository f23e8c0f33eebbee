"""A realistic agent session replayed natively and through txbox, on the project of project.py.

The ~200 commands follow what coding agents run on such a tree (the mix of
`/work/shared/corpus/agent_sessions.jsonl`: mostly searches and reads, then edits, builds and
test runs, git, and some failures): orient, run the tests and fix a failing one, explore every
module, add a C feature through a compile error, add a Python feature, refactor with a
build/test loop, then housekeeping. The first 20 commands are a session on their own (used by
--quick): orientation, a build, a failing test, a fix, a typo.
"""
import os

from . import api, project
from .timing import BenchError, ratio, run_timed

PY = "cd python && python3 -m unittest"

MEDIAN_H = """cat > include/tally/median.h <<'EOF'
#ifndef TALLY_MEDIAN_H
#define TALLY_MEDIAN_H
#include <stddef.h>

/* The median of n values (the upper one of the middle two when n is even); 0 when n is 0. */
long tally_median(const long *values, size_t n);

#endif
EOF"""

# Deliberately missing a semicolon: the session's next `make` fails, as agents' builds do.
MEDIAN_C = """cat > src/median.c <<'EOF'
/* median: part of libtally. */
#include <stdlib.h>
#include <string.h>
#include "tally/median.h"

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

long tally_median(const long *values, size_t n)
{
    if (n == 0)
        return 0;
    long *sorted = malloc(n * sizeof *sorted);
    if (!sorted)
        return 0;
    memcpy(sorted, values, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_long);
    long m = sorted[n / 2]
    free(sorted);
    return m;
}
EOF"""

MEDIAN_TEST = """cat > tests/test_median.c <<'EOF'
#include "tally.h"
#include "tally/median.h"
#include "check.h"

int test_median(void)
{
    int fails = 0;
    long odd[] = {5, 1, 3};
    long even[] = {4, 1, 3, 2};
    CHECK(tally_median(odd, 3) == 3);
    CHECK(tally_median(even, 4) == 3);
    CHECK(tally_median(odd, 0) == 0);
    return fails;
}
EOF"""

EXPORT_PY = """cat > python/inventory/export.py <<'EOF'
import json


def to_json(store):
    \"\"\"The store as a JSON list of items, sorted by SKU.\"\"\"
    return json.dumps([{"sku": i.sku, "name": i.name, "qty": i.qty} for i in store], indent=2)
EOF"""

EXPORT_TEST = """cat > python/tests/test_export.py <<'EOF'
import json
import unittest

from inventory.export import to_json
from inventory.models import Item
from inventory.store import Store


class ExportTest(unittest.TestCase):
    def test_to_json(self):
        s = Store()
        s.add(Item("b", "B", "x", 100, 2))
        s.add(Item("a", "A", "x", 100, 1))
        self.assertEqual([d["sku"] for d in json.loads(to_json(s))], ["a", "b"])
        self.assertEqual(json.loads(to_json(s))[0]["price_cents"], 100)
EOF"""

PY_EDIT = """python3 - <<'EOF'
p = "python/inventory/export.py"
s = open(p).read()
s = s.replace('"qty": i.qty}', '"qty": i.qty, "price_cents": i.price_cents}')
open(p, "w").write(s)
EOF"""

NOTES = """cat > NOTES.md <<'EOF'
# Notes
- pricing: discounts above 100% gave negative prices (test_discount_is_clamped)
- next: a median for libtally
EOF"""


def orientation():
    """The first 20 commands: a session on their own."""
    return [
        "ls",
        "git status",
        "cat README.md",
        "ls -la src include/tally tests python/inventory",
        "git log --oneline | head -5",
        "make -j2",
        "./build/test_tally",
        f"{PY} discover -s tests -q",
        'grep -rn "def apply_discount" python/',
        "sed -n '1,40p' python/inventory/pricing.py",
        f"{PY} -q tests.test_pricing",
        r"sed -i 's/^    return price_cents \* (100 - percent) \/\/ 100$/    percent = min(max(percent, 0), 100)\n&/' python/inventory/pricing.py",
        f"{PY} -q tests.test_pricing",
        "git diff",
        "mkae test",
        'grep -rn "TALLY_MAX_ITEMS" include src | head',
        NOTES,
        "wc -l src/*.c include/tally/*.h | tail -1",
        "cat src/no_such_file.c",
        "git status --short",
    ]


def explore():
    """Reading every module, as agents do before changing code."""
    cmds = []
    for m in project.C_MODULES:
        cmds += [f"sed -n '1,30p' src/{m}.c", f'grep -n "tally_{m}_" include/tally/{m}.h', f"grep -c CHECK tests/test_{m}.c"]
    for m in project.PY_MODULES:
        cmds += [rf'grep -n "^def \|^class \|^    def " python/inventory/{m}.py', f"wc -l python/inventory/{m}.py"]
        if f"python/tests/test_{m}.py" in project.PY_FILES:
            cmds.append(f"head -15 python/tests/test_{m}.py")
    cmds += [
        'find . -name "*.py" -not -path "./.git/*" | sort',
        "find src include tests -name '*.[ch]' | wc -l",
        'grep -rln "realloc" src | head',
        "cat Makefile",
        "cat tests/list.h",
        "head -20 tests/main.c",
        "cat docs/design.md",
        "head -5 data/items.csv",
    ]
    return cmds


def c_feature():
    """Add `tally_median` to libtally, through a compile error and its fix."""
    return [
        'grep -rn "sum" include/tally/stats.h',
        "cat include/tally/stats.h",
        MEDIAN_H,
        MEDIAN_C,
        "make",
        "make 2>&1 | grep -n error",
        "sed -n '20,30p' src/median.c",
        r"sed -i 's/long m = sorted\[n \/ 2\]$/long m = sorted[n \/ 2];/' src/median.c",
        "make",
        MEDIAN_TEST,
        "echo 'T(median)' >> tests/list.h",
        "make && ./build/test_tally",
        r'''sed -i 's/#include "tally\/stats.h"/&\n#include "tally\/median.h"/' include/tally.h''',
        "cat include/tally.h",
        "make -j2 && ./build/test_tally",
        "git diff --stat",
        "git status --short",
        "git add -A && git commit -q -m 'Add tally_median; clamp discounts'",
        "git log --oneline | head -3",
        "git show --stat HEAD | tail -8",
        "git grep -n tally_median",
    ]


def py_feature():
    """Add a JSON export to the Python package, with a test that first fails."""
    return [
        "cd python && python3 -c 'import inventory; print(inventory.__version__)'",
        "cd python && python3 -m inventory.cli report ../data/items.csv",
        "cd python && python3 -m inventory.cli check ../data/items.csv",
        "cd python && python3 -m inventory.cli report ../data/missing.csv",
        "cat python/inventory/store.py",
        EXPORT_PY,
        EXPORT_TEST,
        f"{PY} -q tests.test_export",
        "sed -n '1,10p' python/inventory/export.py",
        PY_EDIT,
        f"{PY} -q tests.test_export",
        f"{PY} discover -s tests -q",
        "sed -i 's/__version__ = \"0.3.0\"/__version__ = \"0.4.0\"/' python/inventory/__init__.py",
        "sed -i 's/^version = \"0.3.0\"/version = \"0.4.0\"/' python/pyproject.toml",
        'grep -rn "0.4.0" python',
        "sed -i 's/^## 0.3.0/## 0.4.0\\n\\n- JSON export\\n- tally_median\\n\\n## 0.3.0/' CHANGELOG.md",
        "head -8 CHANGELOG.md",
        "pyhton3 -m unittest",
        "cd python && python3 -m py_compile inventory/*.py",
        "git diff --stat",
    ]


def refactor_loop():
    """Edit one module at a time and rebuild and test after each edit."""
    cmds = []
    for m in project.C_MODULES[:6]:
        cmds += [
            rf"sed -i 's/^\/\* {m}: part of libtally/\/* {m}: part of libtally (tally_{m}_*)/' src/{m}.c",
            "make -j2 2>&1 | tail -2",
            "./build/test_tally | tail -1",
        ]
    return cmds


def housekeeping():
    """Searches, data pipelines, files moved and copied, scripts, a clean rebuild, a commit."""
    return [
        "cut -d, -f3 data/items.csv | tail -n +2 | sort | uniq -c | sort -rn",
        "awk -F, 'NR > 1 { n += $5 } END { print n }' data/items.csv",
        "sort -t, -k5 -n data/items.csv | head -5",
        "tail -n +2 data/items.csv | wc -l",
        "grep -c ',tools,' data/items.csv",
        "find . -name '*.o' | wc -l",
        "ls build",
        "ar t build/libtally.a",
        "nm build/libtally.a | grep -c ' T '",
        "du -sh build | cut -f2",
        "cp data/items.csv data/items.bak.csv",
        "diff <(sort data/items.csv) <(sort data/items.bak.csv) && echo same",
        "rm data/items.bak.csv",
        "mv docs/usage.md docs/USAGE.md",
        "sed -i 's/docs\\/usage.md/docs\\/USAGE.md/' README.md",
        'grep -rn "USAGE" README.md',
        "bash -n scripts/check.sh",
        "./scripts/check.sh",
        "chmod +x scripts/check.sh && ./scripts/check.sh",
        "mkdir -p out && cd python && python3 -m inventory.cli report ../data/items.csv > ../out/report.txt",
        "cat out/report.txt",
        "cd python && python3 -c 'from inventory import csvio, export; print(export.to_json(csvio.load(\"../data/items.csv\")))' > ../out/items.json",
        "python3 -c 'import json; print(len(json.load(open(\"out/items.json\"))))'",
        "head -c 200 out/items.json",
        'grep -rn "TODO\\|FIXME" src include python || true',
        'grep -rn "TODO" src',
        "make clean && make -j2",
        "./build/test_tally",
        "make test",
        "rm -f NOTES.md",
        "ls -la",
        "git status --short",
        "git add -A && git commit -q -m 'JSON export, usage doc renamed, module comments'",
        "git log --oneline",
        "git diff HEAD~1 --stat | tail -3",
        "git blame -L 1,3 src/vec.c | cut -c1-8 | sort -u | wc -l",
        "echo 'out/' >> .gitignore && git status --short",
        "find . -newer Makefile -type f -not -path './.git/*' -not -path './build/*' | sort | head -20",
        "ls python/tests",
        "cat .gitignore",
        "ls -R python | head -30",
        "sed -n '/def main/,/^$/p' python/inventory/cli.py",
        "awk '/^long/ { print FILENAME \": \" $0 }' src/*.c | head",
        "ls src/*.c | xargs wc -l | sort -n | tail -3",
        "grep -rl 'stdlib.h' src | xargs grep -c malloc",
        'grep -rn "import" python/inventory/*.py | wc -l',
        "git diff HEAD~2 -- python | head -40",
        "cd python && python3 -m inventory.cli check ../data/items.csv",
        "tr ',' '\\t' < data/items.csv | head -3",
        "grep -n 'T(' tests/list.h | tail -2",
        "sed -n '1,12p' include/tally/median.h",
        "cat out/report.txt | head -3",
        "git log --format='%h %s' -3",
        f"{PY} discover -s tests -q",
    ]


def commands(limit=0):
    """The session's command strings in order; the first `limit` of them when limit > 0."""
    cmds = orientation() + explore() + c_feature() + py_feature() + refactor_loop() + housekeeping()
    return cmds[:limit] if limit else cmds


def tree_listing(root):
    """{relative path: (kind, mode, content)} for the comparison of two replays. `.git` and
    `.txbox` are left out (index stat data and txbox's state differ by design), and so is the
    content of `*.pyc` files (it holds source mtimes, which the two replays set a few
    milliseconds apart)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in (".git", ".txbox")]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            st = os.lstat(path)
            if os.path.islink(path):
                out[rel] = ("link", 0, os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("dir", st.st_mode & 0o7777, None)
            else:
                content = None if name.endswith(".pyc") else open(path, "rb").read()
                out[rel] = ("file", st.st_mode & 0o7777, content)
    return out


def tree_differences(a, b):
    """Paths whose kind, mode or content differ between the trees `a` and `b`."""
    la, lb = tree_listing(a), tree_listing(b)
    return sorted(p for p in la.keys() | lb.keys() if la.get(p) != lb.get(p))


def replay_round(ctx, cmds, round_index):
    """Replay `cmds` on three fresh identical trees, natively, through `txbox run -c` and over
    the HTTP API (`POST /v1/run` to a `txbox serve` started for the round with the same
    environment, on a kept-alive connection), command by command, the order rotated at each
    command. Returns per-command seconds and exit codes, and the trees' differences from the
    native one."""
    trees = {name: ctx.scratch.fresh(f"session-{name}") for name in ("native", "txbox", "api")}
    for t in trees.values():
        project.create(t)
    env = dict(os.environ, **project.GIT_ENV, LC_ALL="C")
    run_timed([ctx.txbox, "run", "--", "true"], trees["txbox"], env=env)  # state directory created untimed
    steps = []
    with api.Server(ctx, [trees["api"]], env=env) as server:
        runner = api.Runner(server, trees["api"])
        runner.run("true")  # its first transaction starts the warm server, untimed
        for i, cmd in enumerate(cmds):
            got = {}

            def native():
                n = run_timed(["bash", "-c", cmd], trees["native"], env=env, expect=None)
                got["native"] = (n.seconds, n.returncode)

            def cli():
                t = run_timed([ctx.txbox, "run", "-c", cmd], trees["txbox"], env=env, expect=None, capture=True)
                if t.returncode in (125, 126):
                    got["txbox_why"] = t.stderr.strip()[-500:]
                got["txbox"] = (t.seconds, t.returncode)

            def http():
                seconds, code, result = runner.run(cmd)
                if code in (125, 126):
                    got["api_why"] = str(result.get("error") or result.get("decision") or result)[-500:]
                got["api"] = (seconds, code)

            order = [native, cli, http]
            k = (i + round_index) % len(order)
            for f in order[k:] + order[:k]:
                f()
            for way in ("txbox", "api"):
                if got[way][1] in (125, 126) and got["native"][1] not in (125, 126):
                    raise BenchError(f"txbox ({way}) could not run session command {i + 1} (exit {got[way][1]}):\n"
                                     f"  {cmd}\n  | {got.get(way + '_why', '')}")
            steps.append({"cmd": cmd, "native_s": got["native"][0], "txbox_s": got["txbox"][0], "api_s": got["api"][0],
                          "native_rc": got["native"][1], "txbox_rc": got["txbox"][1], "api_rc": got["api"][1]})
        runner.conn.close()
    return steps, {way: tree_differences(trees["native"], trees[way]) for way in ("txbox", "api")}


def session(ctx):
    """The replayed agent session: total wall time of the whole command list natively
    (`bash -c` in the tree), through `txbox run -c` (one transaction and one txbox process per
    command, default options) and over the HTTP API (one transaction per `POST /v1/run`, as an
    MCP or HTTP agent runs it: no process per command), interleaved command by command on three
    identical fresh trees; the median over rounds (each way's own). `overhead_pct` = (txbox -
    native) / native; `per_tx_ms` = the added time divided by the number of commands; `api` the
    same over HTTP. Correctness checks: every command exits with the same status all three ways,
    and the trees end identical (see tree_listing)."""
    cmds = commands(ctx.cfg.session_commands)
    rounds = []
    for r in range(ctx.cfg.session_rounds):
        steps, diffs = replay_round(ctx, cmds, r)
        rounds.append({
            "native_s": sum(s["native_s"] for s in steps),
            "txbox_s": sum(s["txbox_s"] for s in steps),
            "api_s": sum(s["api_s"] for s in steps),
            "exit_mismatches": [s["cmd"] for s in steps if not s["native_rc"] == s["txbox_rc"] == s["api_rc"]],
            "tree_differences": sorted(set(diffs["txbox"]) | set(diffs["api"])),
            "steps": steps,
        })

    def middle(way):
        return sorted(rounds, key=lambda r: r[way + "_s"] - r["native_s"])[len(rounds) // 2]

    mid, mid_api = middle("txbox"), middle("api")
    added = mid["txbox_s"] - mid["native_s"]
    added_api = mid_api["api_s"] - mid_api["native_s"]
    slowest = sorted(mid["steps"], key=lambda s: s["txbox_s"] - s["native_s"], reverse=True)[:5]
    return {
        "commands": len(cmds),
        "failing_commands": sum(1 for s in mid["steps"] if s["native_rc"] != 0),
        "rounds": len(rounds),
        "native_s": mid["native_s"],
        "txbox_s": mid["txbox_s"],
        "overhead_pct": 100 * ratio(added, mid["native_s"]),
        "per_tx_ms": 1e3 * added / len(cmds),
        "api": {
            "native_s": mid_api["native_s"],
            "txbox_s": mid_api["api_s"],
            "overhead_pct": 100 * ratio(added_api, mid_api["native_s"]),
            "per_tx_ms": 1e3 * added_api / len(cmds),
        },
        "most_added": [{"cmd": describe(s["cmd"]), "added_ms": 1e3 * (s["txbox_s"] - s["native_s"])} for s in slowest],
        "identical": all(not r["exit_mismatches"] and not r["tree_differences"] for r in rounds),
        "exit_mismatches": sorted({c for r in rounds for c in r["exit_mismatches"]}),
        "tree_differences": sorted({p for r in rounds for p in r["tree_differences"]})[:50],
        "paper": {"overhead_pct": 14.5, "per_tx_s": 1.8, "source": "arXiv 2512.12806"},
    }


def describe(cmd):
    """A one-line form of a command for reports."""
    first = cmd.splitlines()[0]
    return first if len(first) <= 80 else first[:77] + "..."
