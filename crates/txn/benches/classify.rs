//! In-process micro-benchmarks of change-set classification (`txbox_txn::classify`) on
//! synthetic upper layers built by hand, as overlayfs would leave them (plain files and
//! directories; whiteouts need root's mknod and are covered by tests/classify.rs):
//! - `new_files`: a new directory of N small files (cost should follow N);
//! - `modified_files`: N copied-up files whose content changed;
//! - `unchanged_copy_ups`: N files copied up but identical (filtered out of the change set);
//! - `workspace_size`: one new file in a workspace of N files (cost should not follow N).
//!
//! `cargo bench -p txbox-txn` measures; `cargo bench -p txbox-txn -- --test` runs each case once
//! (CI). Fixtures live under /var/tmp (the workspace's kind of filesystem, not tmpfs) and are
//! removed when each benchmark ends.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn main() {
    divan::main();
}

/// A lower (the workspace) and an upper layer, deleted on drop.
struct Layers {
    root: PathBuf,
    lower: PathBuf,
    upper: PathBuf,
}

impl Layers {
    fn new(name: &str) -> Layers {
        let root = PathBuf::from(format!("/var/tmp/txbox-bench-classify-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (lower, upper) = (root.join("lower"), root.join("upper"));
        mkdir(&lower);
        mkdir(&upper);
        // The upper root mirrors the lower root, as txbox creates it.
        copy_mtime(&lower, &upper);
        Layers { root, lower, upper }
    }

    fn classify(&self) -> txbox_txn::changeset::ChangeSet {
        let exclude: HashSet<PathBuf> = [PathBuf::from(".txbox")].into_iter().collect();
        match txbox_txn::classify(&self.upper, &self.lower, &exclude) {
            Ok(cs) => cs,
            Err(e) => panic!("classify failed on the fixture {}: {e}", self.root.display()),
        }
    }
}

impl Drop for Layers {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn mkdir(p: &Path) {
    if let Err(e) = std::fs::create_dir_all(p) {
        panic!("creating {}: {e}", p.display());
    }
}

fn write(p: &Path, text: &str) {
    if let Err(e) = std::fs::write(p, text) {
        panic!("writing {}: {e}", p.display());
    }
}

fn copy_mtime(from: &Path, to: &Path) {
    let md = match std::fs::symlink_metadata(from) {
        Ok(md) => md,
        Err(e) => panic!("stat {}: {e}", from.display()),
    };
    let ts = rustix::fs::Timespec { tv_sec: md.mtime(), tv_nsec: md.mtime_nsec() as _ };
    let times = rustix::fs::Timestamps { last_access: ts, last_modification: ts };
    if let Err(e) = rustix::fs::utimensat(rustix::fs::CWD, to, &times, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        panic!("utimensat {}: {e}", to.display());
    }
}

/// `n` small files `dir/f<i>` under `base`, in directories of at most 1,000 entries.
fn fill(base: &Path, dir: &str, n: usize) {
    for i in 0..n {
        let d = base.join(format!("{dir}/d{}", i / 1000));
        if i % 1000 == 0 {
            mkdir(&d);
        }
        write(&d.join(format!("f{i}")), "x\n");
    }
}

/// Copy the lower directory `rel` into the upper as overlay's copy-up would (directories and
/// files with their mtimes), with new file contents when `change` is set.
fn copy_up_tree(l: &Layers, rel: &str, change: bool) {
    copy_up_dir(&l.lower.join(rel), &l.upper.join(rel), change);
}

fn copy_up_dir(src: &Path, dst: &Path, change: bool) {
    mkdir(dst);
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
            copy_mtime(&from, &to);
        }
    }
    copy_mtime(src, dst);
}

/// Classify once outside the timing and check the fixture means what the benchmark says.
fn check(l: &Layers, added: usize, modified: usize) {
    let (a, m, _) = l.classify().counts();
    if (a, m) != (added, modified) {
        panic!("fixture {}: expected +{added} ~{modified}, classified +{a} ~{m}", l.root.display());
    }
}

const SIZES: &[usize] = &[1, 100, 10_000];

#[divan::bench(args = SIZES)]
fn new_files(bencher: divan::Bencher, n: usize) {
    let l = Layers::new(&format!("new-{n}"));
    fill(&l.lower, "src", 100);
    fill(&l.upper, "gen", n);
    check(&l, n + n.div_ceil(1000) + 1, 0);
    bencher.counter(n).bench_local(|| l.classify());
}

#[divan::bench(args = SIZES)]
fn modified_files(bencher: divan::Bencher, n: usize) {
    let l = Layers::new(&format!("modified-{n}"));
    fill(&l.lower, "src", n);
    copy_up_tree(&l, "src", true);
    check(&l, 0, n);
    bencher.counter(n).bench_local(|| l.classify());
}

#[divan::bench(args = SIZES)]
fn unchanged_copy_ups(bencher: divan::Bencher, n: usize) {
    let l = Layers::new(&format!("unchanged-{n}"));
    fill(&l.lower, "src", n);
    copy_up_tree(&l, "src", false);
    check(&l, 0, 0);
    bencher.counter(n).bench_local(|| l.classify());
}

#[divan::bench(args = [100, 10_000])]
fn workspace_size(bencher: divan::Bencher, n: usize) {
    let l = Layers::new(&format!("workspace-{n}"));
    fill(&l.lower, "src", n);
    write(&l.upper.join("NEW"), "x\n");
    check(&l, 1, 0);
    bencher.bench_local(|| l.classify());
}
