"""A small but real project for the replayed agent session: a C library (`libtally`: headers,
sources, a test binary, a Makefile) and a Python package (`inventory`, with unittest tests),
plus docs, data and a script: about 70 files, committed to git.

The Python package ships with one real bug (a discount above 100% gives a negative price) that
its tests catch, so the session can fail a test, fix it and pass, as agents do. Every file gets
the same fixed mtime so that two trees made at different moments are identical.
"""
import os
import subprocess

C_MODULES = ["strbuf", "vec", "hashmap", "counter", "stats", "histogram", "csv", "arena", "list",
             "sort", "fmt", "parse"]
PY_MODULES = ["models", "store", "pricing", "units", "report", "csvio", "search", "validate"]
FIXED_MTIME = 1767225600  # 2026-01-01T00:00:00Z

# A fixed identity and clock for git, in the generator and in both replays alike.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Bench Agent", "GIT_AUTHOR_EMAIL": "agent@example.com",
    "GIT_COMMITTER_NAME": "Bench Agent", "GIT_COMMITTER_EMAIL": "agent@example.com",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}

MAKEFILE = """\
CC ?= cc
CFLAGS ?= -O2 -Wall -Wextra
CPPFLAGS += -Iinclude -Itests
SRC := $(wildcard src/*.c)
OBJ := $(SRC:src/%.c=build/%.o)
TESTS := $(wildcard tests/*.c)

.PHONY: all test clean

all: build/libtally.a build/test_tally

build:
\tmkdir -p build

build/%.o: src/%.c include/tally/config.h | build
\t$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

build/libtally.a: $(OBJ)
\tar rcs $@ $^

build/test_tally: $(TESTS) tests/list.h tests/check.h build/libtally.a
\t$(CC) $(CPPFLAGS) $(CFLAGS) $(TESTS) build/libtally.a -o $@

test: build/test_tally
\t./build/test_tally

clean:
\trm -rf build
"""

C_HEADER = """\
#ifndef TALLY_{M}_H
#define TALLY_{M}_H
#include <stddef.h>

/* {m}: a growable array of longs with the statistics the {m} code needs. */
typedef struct {{
    long *items;
    size_t len, cap;
}} tally_{m};

int tally_{m}_init(tally_{m} *t, size_t cap);
int tally_{m}_push(tally_{m} *t, long v);
long tally_{m}_sum(const tally_{m} *t);
long tally_{m}_max(const tally_{m} *t);
void tally_{m}_free(tally_{m} *t);

#endif
"""

C_SOURCE = """\
/* {m}: part of libtally. */
#include <stdlib.h>
#include "tally/config.h"
#include "tally/{m}.h"

int tally_{m}_init(tally_{m} *t, size_t cap)
{{
    t->len = 0;
    t->cap = cap ? cap : 1;
    t->items = malloc(t->cap * sizeof *t->items);
    return t->items ? 0 : -1;
}}

int tally_{m}_push(tally_{m} *t, long v)
{{
    if (t->len == TALLY_MAX_ITEMS)
        return -1;
    if (t->len == t->cap) {{
        size_t cap = t->cap * 2;
        long *items = realloc(t->items, cap * sizeof *items);
        if (!items)
            return -1;
        t->items = items;
        t->cap = cap;
    }}
    t->items[t->len++] = v;
    return 0;
}}

long tally_{m}_sum(const tally_{m} *t)
{{
    long s = 0;
    for (size_t i = 0; i < t->len; i++)
        s += t->items[i];
    return s;
}}

long tally_{m}_max(const tally_{m} *t)
{{
    long m = t->len ? t->items[0] : 0;
    for (size_t i = 1; i < t->len; i++)
        if (t->items[i] > m)
            m = t->items[i];
    return m;
}}

void tally_{m}_free(tally_{m} *t)
{{
    free(t->items);
    t->items = NULL;
    t->len = t->cap = 0;
}}
"""

C_TEST = """\
#include "tally.h"
#include "check.h"

int test_{m}(void)
{{
    int fails = 0;
    tally_{m} t;
    CHECK(tally_{m}_init(&t, 4) == 0);
    for (long i = 1; i <= 10; i++)
        CHECK(tally_{m}_push(&t, i) == 0);
    CHECK(tally_{m}_sum(&t) == 55);
    CHECK(tally_{m}_max(&t) == 10);
    tally_{m}_free(&t);
    return fails;
}}
"""

CHECK_H = """\
#ifndef CHECK_H
#define CHECK_H
#include <stdio.h>
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: CHECK failed: %s\\n", __FILE__, __LINE__, #c); fails++; } } while (0)
#endif
"""

TEST_MAIN = """\
#include <stdio.h>

#define T(name) int test_##name(void);
#include "list.h"
#undef T

int main(void)
{
    int fails = 0, suites = 0;
#define T(name) fails += test_##name(); suites++;
#include "list.h"
#undef T
    if (fails) {
        printf("%d checks failed\\n", fails);
        return 1;
    }
    printf("all %d test suites passed\\n", suites);
    return 0;
}
"""

PY_FILES = {
    "python/pyproject.toml": '[project]\nname = "inventory"\nversion = "0.3.0"\nrequires-python = ">=3.9"\n',
    "python/inventory/__init__.py": '"""A small inventory library: items, a store, pricing and reports."""\n__version__ = "0.3.0"\n',
    "python/inventory/models.py": '''\
from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    sku: str
    name: str
    category: str
    price_cents: int
    qty: int

    @property
    def value_cents(self):
        return self.price_cents * self.qty
''',
    "python/inventory/store.py": '''\
from .models import Item


class Store:
    """Items by SKU."""

    def __init__(self):
        self._items = {}

    def add(self, item: Item):
        if item.sku in self._items:
            raise KeyError(f"duplicate sku {item.sku}")
        self._items[item.sku] = item
        return len(self._items)

    def remove(self, sku):
        return self._items.pop(sku)

    def get(self, sku):
        return self._items.get(sku)

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(sorted(self._items.values(), key=lambda i: i.sku))

    def total_value_cents(self):
        return sum(i.value_cents for i in self._items.values())
''',
    "python/inventory/pricing.py": '''\
def apply_discount(price_cents, percent):
    """The price after a discount of `percent` (0-100), in whole cents, rounded down."""
    return price_cents * (100 - percent) // 100


def with_tax(price_cents, rate_percent):
    """The price with tax added, rounded to the nearest cent."""
    return (price_cents * (100 + rate_percent) + 50) // 100
''',
    "python/inventory/units.py": '''\
def cents_to_str(cents):
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100}.{cents % 100:02d}"


def parse_price(text):
    """Parse '12.34' into 1234 cents."""
    whole, _, frac = text.strip().partition(".")
    return int(whole) * 100 + int((frac + "00")[:2])
''',
    "python/inventory/report.py": '''\
from collections import defaultdict

from .units import cents_to_str


def by_category(store):
    totals = defaultdict(int)
    for item in store:
        totals[item.category] += item.value_cents
    return dict(sorted(totals.items()))


def render(store):
    lines = [f"{len(store)} items, total {cents_to_str(store.total_value_cents())}"]
    for cat, cents in by_category(store).items():
        lines.append(f"  {cat:<12} {cents_to_str(cents):>10}")
    return "\\n".join(lines)
''',
    "python/inventory/csvio.py": '''\
import csv

from .models import Item
from .store import Store
from .units import parse_price


def load(path):
    store = Store()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            store.add(Item(row["sku"], row["name"], row["category"], parse_price(row["price"]), int(row["qty"])))
    return store
''',
    "python/inventory/search.py": '''\
def find(store, text):
    text = text.lower()
    return [i for i in store if text in i.name.lower()]


def in_category(store, category):
    return [i for i in store if i.category == category]
''',
    "python/inventory/validate.py": '''\
def problems(store):
    out = []
    for item in store:
        if item.qty < 0:
            out.append(f"{item.sku}: negative quantity")
        if item.price_cents <= 0:
            out.append(f"{item.sku}: price must be positive")
    return out
''',
    "python/inventory/cli.py": '''\
import argparse
import sys

from . import csvio, report, validate


def main(argv=None):
    ap = argparse.ArgumentParser(prog="inventory")
    ap.add_argument("command", choices=["report", "check"])
    ap.add_argument("csv")
    a = ap.parse_args(argv)
    try:
        store = csvio.load(a.csv)
    except OSError as e:
        print(f"inventory: {e}", file=sys.stderr)
        return 1
    if a.command == "report":
        print(report.render(store))
        return 0
    found = validate.problems(store)
    print("\\n".join(found) or "ok")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
''',
    "python/tests/__init__.py": "",
    "python/tests/test_models.py": '''\
import unittest

from inventory.models import Item


class ItemTest(unittest.TestCase):
    def test_value(self):
        self.assertEqual(Item("a", "A", "x", 250, 4).value_cents, 1000)
''',
    "python/tests/test_store.py": '''\
import unittest

from inventory.models import Item
from inventory.store import Store


class StoreTest(unittest.TestCase):
    def test_add_get_remove(self):
        s = Store()
        self.assertEqual(s.add(Item("a", "A", "x", 100, 1)), 1)
        self.assertEqual(s.get("a").name, "A")
        s.remove("a")
        self.assertEqual(len(s), 0)

    def test_duplicate(self):
        s = Store()
        s.add(Item("a", "A", "x", 100, 1))
        with self.assertRaises(KeyError):
            s.add(Item("a", "B", "x", 100, 1))

    def test_total(self):
        s = Store()
        s.add(Item("a", "A", "x", 100, 2))
        s.add(Item("b", "B", "y", 50, 3))
        self.assertEqual(s.total_value_cents(), 350)
''',
    "python/tests/test_pricing.py": '''\
import unittest

from inventory.pricing import apply_discount, with_tax


class PricingTest(unittest.TestCase):
    def test_discount(self):
        self.assertEqual(apply_discount(1000, 15), 850)

    def test_discount_is_clamped(self):
        self.assertEqual(apply_discount(1000, 150), 0)
        self.assertEqual(apply_discount(1000, -5), 1000)

    def test_tax(self):
        self.assertEqual(with_tax(1000, 20), 1200)
''',
    "python/tests/test_units.py": '''\
import unittest

from inventory.units import cents_to_str, parse_price


class UnitsTest(unittest.TestCase):
    def test_roundtrip(self):
        for text in ["0.05", "1.50", "12.34", "100.00"]:
            self.assertEqual(cents_to_str(parse_price(text)), text)
''',
    "python/tests/test_report.py": '''\
import unittest

from inventory.models import Item
from inventory.report import by_category
from inventory.store import Store


class ReportTest(unittest.TestCase):
    def test_by_category(self):
        s = Store()
        s.add(Item("a", "A", "tools", 100, 2))
        s.add(Item("b", "B", "food", 50, 1))
        self.assertEqual(by_category(s), {"food": 50, "tools": 200})
''',
    "python/tests/test_csvio.py": '''\
import os
import unittest

from inventory import csvio

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "items.csv")


class CsvTest(unittest.TestCase):
    def test_load(self):
        store = csvio.load(DATA)
        self.assertEqual(len(store), 24)
''',
    "python/tests/test_search.py": '''\
import unittest

from inventory.models import Item
from inventory.search import find
from inventory.store import Store


class SearchTest(unittest.TestCase):
    def test_find(self):
        s = Store()
        s.add(Item("a", "Claw Hammer", "tools", 100, 2))
        self.assertEqual([i.sku for i in find(s, "hammer")], ["a"])
''',
}

CATEGORIES = ["tools", "garden", "kitchen", "office"]

DOCS = {
    "README.md": """\
# tally + inventory

`libtally` (C, `src/`, `include/`, `tests/`) counts and summarises numbers;
`inventory` (Python, `python/`) keeps a store of items and reports on it.

Build and test: `make test` and `cd python && python3 -m unittest discover -s tests`,
or `scripts/check.sh` for both. Usage: see docs/usage.md.
""",
    "CHANGELOG.md": "# Changelog\n\n## 0.3.0\n\n- CSV import\n- Category report\n",
    "LICENSE": "Copyright the tally authors. Licensed under the Apache License, Version 2.0.\n",
    ".gitignore": "build/\n__pycache__/\n*.pyc\n",
    "docs/usage.md": "# Usage\n\n    cd python && python3 -m inventory.cli report ../data/items.csv\n",
    "docs/design.md": "# Design\n\nEach libtally module owns a growable array; limits live in `include/tally/config.h`.\n",
    "scripts/check.sh": "#!/bin/sh\nset -e\nmake -s test\ncd python && python3 -m unittest discover -s tests -q\n",
}


def c_files():
    files = {"Makefile": MAKEFILE, "tests/check.h": CHECK_H, "tests/main.c": TEST_MAIN}
    files["include/tally/config.h"] = "#ifndef TALLY_CONFIG_H\n#define TALLY_CONFIG_H\n#define TALLY_MAX_ITEMS 4096\n#endif\n"
    files["include/tally/version.h"] = '#ifndef TALLY_VERSION_H\n#define TALLY_VERSION_H\n#define TALLY_VERSION "1.0.0"\n#endif\n'
    files["include/tally.h"] = "".join(f'#include "tally/{m}.h"\n' for m in C_MODULES)
    files["tests/list.h"] = "".join(f"T({m})\n" for m in C_MODULES)
    for m in C_MODULES:
        files[f"include/tally/{m}.h"] = C_HEADER.format(m=m, M=m.upper())
        files[f"src/{m}.c"] = C_SOURCE.format(m=m)
        files[f"tests/test_{m}.c"] = C_TEST.format(m=m)
    return files


def items_csv():
    rows = ["sku,name,category,price,qty"]
    for i in range(24):
        cat = CATEGORIES[i % len(CATEGORIES)]
        rows.append(f"S{i:03d},Item {i} {cat},{cat},{3 + (i * 7) % 40}.{(i * 13) % 100:02d},{(i * 5) % 17}")
    return "\n".join(rows) + "\n"


def all_files():
    files = {**c_files(), **PY_FILES, **DOCS, "data/items.csv": items_csv()}
    return files


def create(root):
    """Write the project into the empty directory `root` and commit it to a new git repository."""
    for rel, text in all_files().items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            os.utime(os.path.join(dirpath, name), (FIXED_MTIME, FIXED_MTIME))
    env = dict(os.environ, **GIT_ENV)
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "Initial import"]):
        subprocess.run(argv, cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)
    os.utime(root, (FIXED_MTIME, FIXED_MTIME))
