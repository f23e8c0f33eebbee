//! Undo at the library level: a realistic commit is retained, undone exactly, redone exactly;
//! an undo cut after its N-th mutating call, for every N, recovers to all-old or all-new, and
//! the retained data stays consistent (the next undo toggles again); conflicts refuse.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use txbox_txn::commit::{self, CommitTarget, CrashHook};
use txbox_txn::layout::TxKind;
use txbox_txn::retain::{self, Budget, KeepOptions, MinFree};
use txbox_txn::seal::Key;
use txbox_txn::state::{StateDir, TxDir};
use txbox_txn::undo::{self, Target, UndoError, UndoOptions};

/// Everything undo must restore: kind, mode, owner, content or target, xattrs, the mtime of
/// non-directories (the same inode comes back) and hard-link groups.
fn digest(root: &Path) -> BTreeMap<Vec<u8>, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, String>, inodes: &mut BTreeMap<u64, Vec<Vec<u8>>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let mut xattrs: Vec<String> = Vec::new();
            if !md.file_type().is_symlink() {
                if let Ok(names) = xattr_names(&p) {
                    for n in names {
                        let mut v = vec![0u8; 4096];
                        let k = rustix::fs::lgetxattr(&p, n.as_str(), &mut v).unwrap_or(0);
                        xattrs.push(format!("{n}={:?}", &v[..k]));
                    }
                }
            }
            xattrs.sort();
            let own = format!("{:o} {}:{} {:?}", md.mode() & 0o7777, md.uid(), md.gid(), xattrs);
            let desc = if md.is_dir() {
                walk(root, &p, out, inodes);
                format!("dir {own}")
            } else if md.file_type().is_symlink() {
                format!(
                    "link {} {}",
                    std::fs::read_link(&p).unwrap().display(),
                    md.mtime_nsec() + md.mtime() * 1_000_000_000
                )
            } else {
                if md.nlink() > 1 {
                    inodes.entry(md.ino()).or_default().push(rel.clone());
                }
                format!("file {own} {:?} {}", std::fs::read(&p).unwrap(), md.mtime_nsec() + md.mtime() * 1_000_000_000)
            };
            out.insert(rel, desc);
        }
    }
    let mut out = BTreeMap::new();
    let mut inodes = BTreeMap::new();
    walk(root, root, &mut out, &mut inodes);
    let mut groups: Vec<Vec<Vec<u8>>> = inodes.into_values().filter(|g| g.len() > 1).collect();
    for g in &mut groups {
        g.sort();
    }
    groups.sort();
    for (i, g) in groups.iter().enumerate() {
        for name in g {
            if let Some(d) = out.get_mut(name) {
                d.push_str(&format!(" group{i}"));
            }
        }
    }
    out
}

fn xattr_names(p: &Path) -> std::io::Result<Vec<String>> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::llistxattr(p, &mut buf)?;
    Ok(buf[..n].split(|b| *b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect())
}

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn whiteout(p: &Path) -> bool {
    rustix::fs::mknodat(rustix::fs::CWD, p, rustix::fs::FileType::CharacterDevice, rustix::fs::Mode::empty(), 0).is_ok()
}

/// A workspace, and a transaction's upper layer holding every kind of change: new files and
/// trees, replaced files, a type change, a deleted tree and file, a symlink retargeted, an
/// xattr and a mode changed, a hard-link group made, an empty directory, odd names.
fn build(root: &Path) -> Option<(PathBuf, StateDir, String)> {
    let ws = root.join("ws");
    for i in 0..12 {
        write(&ws.join(format!("src/f{i}.rs")), &format!("old {i}\n"));
    }
    write(&ws.join("doomed/a.txt"), "a");
    write(&ws.join("doomed/deep/b.txt"), "b");
    std::fs::create_dir_all(ws.join("doomed/empty")).unwrap();
    write(&ws.join("replaced/old.txt"), "old");
    write(&ws.join("typechange"), "was a file");
    write(&ws.join("gone\nname \u{e9}.txt"), "bye");
    write(&ws.join("attrs/x"), "x");
    std::os::unix::fs::symlink("src/f0.rs", ws.join("link")).unwrap();
    let state = StateDir::open_with_key(&root.join("state"), Key::from_bytes([9; 32])).unwrap();
    let id = TxDir::create(&state, &ws, TxKind::Run).unwrap().id.clone();
    let up = state.tx_dir(&id).join("upper");
    for i in (0..12).step_by(3) {
        write(&up.join(format!("src/f{i}.rs")), &format!("new {i}\n"));
    }
    for i in 0..8 {
        write(&up.join(format!("gen/sub/g{i}.txt")), &format!("gen {i}\n"));
    }
    std::fs::create_dir_all(up.join("gen/empty")).unwrap();
    std::fs::hard_link(up.join("gen/sub/g0.txt"), up.join("gen/hard")).unwrap();
    write(&up.join("replaced/new.txt"), "new");
    rustix::fs::lsetxattr(up.join("replaced").as_path(), "user.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())
        .unwrap();
    std::fs::create_dir_all(up.join("typechange")).unwrap();
    write(&up.join("typechange/inside.txt"), "now a dir");
    std::os::unix::fs::symlink("src/f3.rs", up.join("link")).unwrap();
    // attrs/: a directory whose mode and xattrs change (a copy-up of it with new attributes).
    std::fs::create_dir_all(up.join("attrs")).unwrap();
    std::fs::set_permissions(up.join("attrs"), std::fs::Permissions::from_mode(0o700)).unwrap();
    rustix::fs::lsetxattr(up.join("attrs").as_path(), "user.note", b"hi", rustix::fs::XattrFlags::empty()).unwrap();
    for w in ["doomed", "gone\nname \u{e9}.txt"] {
        if !whiteout(&up.join(w)) {
            eprintln!("SKIP undo tests: cannot create whiteouts (mknod needs CAP_MKNOD; run as root)");
            return None;
        }
    }
    Some((ws, state, id))
}

/// Commit transaction `id` with retention, as the engine does.
fn commit_retained(ws: &Path, state: &StateDir, id: &str) {
    commit_kept(ws, state, id, false);
}

/// [`commit_retained`], saying whether the transaction only kept build output (issue #15).
fn commit_kept(ws: &Path, state: &StateDir, id: &str, kept_only: bool) {
    let tx = state.tx_dir(id);
    let upper = tx.join("upper");
    let cs = txbox_txn::classify(&upper, ws, &HashSet::new()).unwrap();
    retain::prepare(state, id, ws, &cs).unwrap();
    let paths: Vec<PathBuf> = cs.changes.iter().map(|c| c.path.clone()).collect();
    let generation = state.log_commit_of(ws, Some(id), &paths).unwrap();
    let record = state.record_path(id);
    let target = CommitTarget {
        tx: id,
        workspace: ws,
        upper: &upper,
        trash: &tx.join("trash"),
        record: &record,
        seal: state.seal(),
        relief: None,
    };
    commit::commit(&target, &cs, &mut CrashHook::default(), &mut || {}).unwrap();
    let kept = retain::keep_commit(state, id, Some(generation), &KeepOptions { budget: budget(), kept_only }).unwrap();
    assert!(kept.retained, "{kept:?}");
}

/// The default budget, but never yielding to a nearly full disk: these tests run on shared
/// machines whose disks fill and empty with other work.
fn budget() -> Budget {
    Budget { min_free: MinFree::Bytes(0), ..Budget::DEFAULT }
}

fn undo_last(state: &StateDir, ws: &Path, hook: &mut CrashHook) -> Result<undo::Undone, UndoError> {
    undo::undo(state, ws, &Target::Last, &UndoOptions { budget: budget() }, hook)
}

fn scratch(name: &str) -> PathBuf {
    let base = PathBuf::from(format!("/var/tmp/txbox-undo-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    base
}

#[test]
fn undo_restores_exactly_and_undo_of_undo_redoes() {
    let base = scratch("exact");
    let Some((ws, state, id)) = build(&base) else { return };
    let before = digest(&ws);
    commit_retained(&ws, &state, &id);
    let after = digest(&ws);
    assert_ne!(before, after);
    let u = undo_last(&state, &ws, &mut CrashHook::default()).unwrap();
    assert!(u.conflicts.is_empty(), "{:?}", u.conflicts);
    assert_eq!(u.undone, vec![id.clone()]);
    assert_eq!(digest(&ws), before, "undo did not restore the tree exactly");
    let r = undo_last(&state, &ws, &mut CrashHook::default()).unwrap();
    assert!(r.conflicts.is_empty(), "{:?}", r.conflicts);
    assert_eq!(r.undone, vec![u.tx.clone()]);
    assert_eq!(digest(&ws), after, "undo of the undo did not redo exactly");
    // And once more, both ways.
    undo_last(&state, &ws, &mut CrashHook::default()).unwrap();
    assert_eq!(digest(&ws), before);
    undo_last(&state, &ws, &mut CrashHook::default()).unwrap();
    assert_eq!(digest(&ws), after);
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn an_undo_cut_at_every_step_recovers_to_old_or_new_and_stays_undoable() {
    let base = scratch("crash");
    let Some((ws, state, id)) = build(&base.join("reference")) else { return };
    let before = digest(&ws);
    commit_retained(&ws, &state, &id);
    let mut full = CrashHook::default();
    undo_last(&state, &ws, &mut full).unwrap();
    assert_eq!(digest(&ws), before);
    let total = full.calls();
    assert!(total > 10, "an undo of a realistic commit makes many mutating calls, saw {total}");
    let (mut saw_old, mut saw_new) = (0, 0);
    for n in 1..=total {
        let root = base.join(format!("n{n}"));
        let (ws, state, id) = build(&root).unwrap();
        // Digests hold mtimes: each tree is compared with itself.
        let before = digest(&ws);
        commit_retained(&ws, &state, &id);
        let after = digest(&ws);
        match undo_last(&state, &ws, &mut CrashHook::after(n)) {
            Err(UndoError::Injected(_)) => {}
            other => panic!("cut at {n}: expected the injected stop, got {other:?}"),
        }
        txbox_txn::recover(&state, None, &mut CrashHook::default()).unwrap();
        let got = digest(&ws);
        let undone = if got == before {
            saw_new += 1;
            true
        } else if got == after {
            saw_old += 1;
            false
        } else {
            panic!("undo cut after {n} of {total} calls: the workspace is neither before nor after the undo");
        };
        assert!(
            std::fs::read_dir(state.root.join("journal")).unwrap().next().is_none(),
            "recovery left a record behind (cut at {n})"
        );
        // The retained data is consistent: the next undo toggles.
        let next = undo_last(&state, &ws, &mut CrashHook::default()).unwrap();
        assert!(next.conflicts.is_empty(), "cut at {n}: {:?}", next.conflicts);
        assert_eq!(digest(&ws), if undone { after.clone() } else { before.clone() }, "cut at {n}: next undo");
        let _ = std::fs::remove_dir_all(&root);
    }
    assert!(saw_old >= 1 && saw_new >= 1, "old {saw_old}, new {saw_new}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn recovery_of_a_cut_undo_is_idempotent_when_cut_itself() {
    let base = scratch("crash2");
    if build(&base.join("reference")).is_none() {
        return;
    }
    for m in 1..20 {
        let root = base.join(format!("m{m}"));
        let (ws, state, id) = build(&root).unwrap();
        let before = digest(&ws);
        commit_retained(&ws, &state, &id);
        // Cut just after the commit point, then cut recovery at every step.
        let _ = undo_last(&state, &ws, &mut CrashHook::after(2));
        let _ = txbox_txn::recover(&state, None, &mut CrashHook::after(m));
        txbox_txn::recover(&state, None, &mut CrashHook::default()).unwrap();
        assert_eq!(digest(&ws), before, "recovery cut at {m} then resumed did not finish the undo");
        let _ = std::fs::remove_dir_all(&root);
    }
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_transaction_that_only_kept_build_output_is_not_the_last_commit() {
    let base = scratch("keptonly");
    let Some((ws, state, id)) = build(&base) else { return };
    let before = digest(&ws);
    commit_retained(&ws, &state, &id);
    let after = digest(&ws);
    // A later transaction that only kept build output (committed although its command failed).
    let kept = TxDir::create(&state, &ws, TxKind::Run).unwrap().id.clone();
    write(&state.tx_dir(&kept).join("upper/target/out.o"), "object");
    commit_kept(&ws, &state, &kept, true);
    assert!(ws.join("target/out.o").exists());
    // `undo` with no id passes over it to the real last commit; the build output stays.
    let u = undo_last(&state, &ws, &mut CrashHook::default()).unwrap();
    assert!(u.conflicts.is_empty(), "{:?}", u.conflicts);
    assert_eq!(u.undone, vec![id.clone()], "undo took the kept-only transaction for the last commit");
    assert!(ws.join("target/out.o").exists());
    let mut without_output = digest(&ws);
    without_output.retain(|k, _| !k.starts_with(b"target"));
    assert_eq!(without_output, before);
    // Redo, then undo the kept-only one by its id: it is undoable that way.
    undo_last(&state, &ws, &mut CrashHook::default()).unwrap();
    let r = undo::undo(
        &state,
        &ws,
        &Target::Tx(kept.clone()),
        &UndoOptions { budget: budget() },
        &mut CrashHook::default(),
    )
    .unwrap();
    assert!(r.conflicts.is_empty(), "{:?}", r.conflicts);
    assert_eq!(r.undone, vec![kept]);
    assert!(!ws.join("target").exists());
    assert_eq!(digest(&ws), after);
    let _ = std::fs::remove_dir_all(&base);
}
