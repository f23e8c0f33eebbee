//! In-process micro-benchmark of the commit-time policy (`txbox::judge::judge`): what judging
//! costs a one-file commit with the built-in rules, in a git workspace (its `.git/config` is
//! read for the hooks path and includes), in a workspace without `.git`, and for a commit that
//! changes nothing.
//!
//! `cargo bench -p txbox --bench judge` measures; `cargo bench -p txbox --bench judge -- --test`
//! runs each case once (CI). The fixtures live under /var/tmp and are removed at the end.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use txbox_policy::Policy;
use txbox_txn::ChangeSet;

fn main() {
    divan::main();
}

/// A workspace with one file, its upper layer with that file changed, and whether the
/// workspace is a git checkout.
struct Fixture {
    root: PathBuf,
    ws: PathBuf,
    upper: PathBuf,
}

impl Fixture {
    fn new(name: &str, git: bool) -> Fixture {
        let root = PathBuf::from(format!("/var/tmp/txbox-bench-judge-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (ws, upper) = (root.join("ws"), root.join("up"));
        let write = |p: &Path, text: &str| {
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
            }
            std::fs::write(p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        };
        if git {
            write(
                &ws.join(".git/config"),
                "[core]\n\trepositoryformatversion = 0\n\tbare = false\n[user]\n\tname = d\n",
            );
            std::fs::create_dir_all(ws.join(".git/hooks")).unwrap_or_else(|e| panic!("mkdir hooks: {e}"));
        }
        write(&ws.join("src/main.rs"), "old");
        write(&upper.join("src/main.rs"), "new");
        Fixture { root, ws, upper }
    }

    fn changes(&self) -> ChangeSet {
        txbox_txn::classify(&self.upper, &self.ws, &HashSet::new()).unwrap_or_else(|e| panic!("classify: {e}"))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn judge_case(bencher: divan::Bencher, f: &Fixture, cs: &ChangeSet) {
    let policy = Policy::builtin();
    bencher.bench_local(|| {
        let found = txbox::judge::judge(&policy, cs, &f.upper, &f.ws);
        assert!(found.is_empty(), "a one-file source change is not held: {found:?}");
        found
    });
}

#[divan::bench]
fn one_file_git_workspace(bencher: divan::Bencher) {
    let f = Fixture::new("git", true);
    let cs = f.changes();
    judge_case(bencher, &f, &cs);
}

#[divan::bench]
fn one_file_no_git(bencher: divan::Bencher) {
    let f = Fixture::new("plain", false);
    let cs = f.changes();
    judge_case(bencher, &f, &cs);
}

#[divan::bench]
fn nothing_changed(bencher: divan::Bencher) {
    let f = Fixture::new("nothing", true);
    judge_case(bencher, &f, &ChangeSet::default());
}
