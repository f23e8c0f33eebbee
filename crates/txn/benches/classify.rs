//! In-process micro-benchmarks of change-set classification (`txbox_txn::classify`) on
//! synthetic upper layers built by hand, as overlayfs would leave them (plain files and
//! directories; whiteouts need root's mknod and are covered by tests/classify.rs):
//! - `new_files`: a new directory of N small files (cost should follow N);
//! - `new_files_in_existing_dir`: N small files new in a directory the workspace has;
//! - `modified_files`: N copied-up files whose content changed;
//! - `unchanged_copy_ups`: N files copied up but identical (filtered out of the change set);
//! - `workspace_size`: one new file in a workspace of N files (cost should not follow N).
//!
//! `cargo bench -p txbox-txn` measures; `cargo bench -p txbox-txn -- --test` runs each case once
//! (CI). Fixtures (tests/fixture, shared with tests/classify.rs) live under /var/tmp, the
//! workspace's kind of filesystem rather than tmpfs, and are removed when each benchmark ends.

use std::path::Path;

#[path = "../tests/fixture/mod.rs"]
mod fixture;
use fixture::{set_mtime, write, Fixture};

fn main() {
    divan::main();
}

fn metadata(p: &Path) -> std::fs::Metadata {
    match std::fs::symlink_metadata(p) {
        Ok(md) => md,
        Err(e) => panic!("stat {}: {e}", p.display()),
    }
}

/// `n` small files `dir/d<k>/f<i>` under `base`, at most 1,000 per directory.
fn fill(base: &Path, dir: &str, n: usize) {
    for i in 0..n {
        write(&base.join(format!("{dir}/d{}/f{i}", i / 1000)), "x\n");
    }
}

/// Copy the lower directory `rel` into the upper as overlay's copy-up would (directories and
/// files with their mtimes), with new file contents when `change` is set.
fn copy_up_tree(l: &Fixture, rel: &str, change: bool) {
    copy_up_dir(&l.lower.join(rel), &l.upper.join(rel), change);
}

fn copy_up_dir(src: &Path, dst: &Path, change: bool) {
    if let Err(e) = std::fs::create_dir_all(dst) {
        panic!("creating {}: {e}", dst.display());
    }
    let entries = match std::fs::read_dir(src) {
        Ok(rd) => rd.filter_map(Result::ok).map(|e| e.path()).collect::<Vec<_>>(),
        Err(e) => panic!("reading {}: {e}", src.display()),
    };
    for from in entries {
        let to = dst.join(from.file_name().unwrap_or_default());
        if from.is_dir() {
            copy_up_dir(&from, &to, change);
        } else {
            write(&to, if change { "changed\n" } else { "x\n" });
            set_mtime(&to, &metadata(&from));
        }
    }
    set_mtime(dst, &metadata(src));
}

/// Classify once outside the timing and check the fixture means what the benchmark says.
fn check(l: &Fixture, added: usize, modified: usize) {
    let (a, m, _) = l.classify().counts();
    if (a, m) != (added, modified) {
        panic!("fixture {}: expected +{added} ~{modified}, classified +{a} ~{m}", l.root.display());
    }
}

const SIZES: &[usize] = &[1, 100, 10_000];

#[divan::bench(args = SIZES)]
fn new_files(bencher: divan::Bencher, n: usize) {
    let l = Fixture::new(&format!("new-{n}"));
    fill(&l.lower, "src", 100);
    fill(&l.upper, "gen", n);
    check(&l, n + n.div_ceil(1000) + 1, 0);
    bencher.counter(n).bench_local(|| l.classify());
}

/// `n` new files in a directory the workspace already has (each its own change, classified by
/// the walk of directories present on both sides rather than as a new tree).
#[divan::bench(args = SIZES)]
fn new_files_in_existing_dir(bencher: divan::Bencher, n: usize) {
    let l = Fixture::new(&format!("new-existing-{n}"));
    fill(&l.lower, "src", 100);
    for i in 0..n {
        write(&l.upper.join(format!("src/d0/new{i}")), "x\n");
    }
    for d in ["src/d0", "src"] {
        set_mtime(&l.upper.join(d), &metadata(&l.lower.join(d)));
    }
    check(&l, n, 0);
    bencher.counter(n).bench_local(|| l.classify());
}

/// A workspace of `n` files under `src/`, all copied up; with new contents when `change` is set.
fn copied_up(name: &str, n: usize, change: bool) -> Fixture {
    let l = Fixture::new(&format!("{name}-{n}"));
    fill(&l.lower, "src", n);
    copy_up_tree(&l, "src", change);
    check(&l, 0, if change { n } else { 0 });
    l
}

#[divan::bench(args = SIZES)]
fn modified_files(bencher: divan::Bencher, n: usize) {
    let l = copied_up("modified", n, true);
    bencher.counter(n).bench_local(|| l.classify());
}

#[divan::bench(args = SIZES)]
fn unchanged_copy_ups(bencher: divan::Bencher, n: usize) {
    let l = copied_up("unchanged", n, false);
    bencher.counter(n).bench_local(|| l.classify());
}

#[divan::bench(args = [100, 10_000])]
fn workspace_size(bencher: divan::Bencher, n: usize) {
    let l = Fixture::new(&format!("workspace-{n}"));
    fill(&l.lower, "src", n);
    write(&l.upper.join("NEW"), "x\n");
    check(&l, 1, 0);
    bencher.bench_local(|| l.classify());
}
