//! Crash injection: stop a realistic commit after its N-th mutating filesystem call, for every
//! N, then recover. The workspace must be exactly the old state or exactly the new one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use txbox_txn::commit::{self, CommitError, CommitTarget, CrashHook};
use txbox_txn::layout::TxKind;
use txbox_txn::seal::Key;
use txbox_txn::state::{StateDir, TxDir};

fn digest(root: &Path) -> BTreeMap<Vec<u8>, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let desc = if md.is_dir() {
                walk(root, &p, out);
                format!("dir {:o}", md.mode() & 0o7777)
            } else if md.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else {
                format!("file {:o} {:?}", md.mode() & 0o7777, std::fs::read(&p).unwrap())
            };
            out.insert(rel, desc);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A workspace and an overlay-style upper layer holding every kind of change.
fn build(root: &Path) -> Option<(PathBuf, StateDir, String)> {
    let ws = root.join("ws");
    for i in 0..30 {
        write(&ws.join(format!("src/f{i}.rs")), &format!("old {i}\n"));
    }
    write(&ws.join("doomed/a.txt"), "a");
    write(&ws.join("doomed/deep/b.txt"), "b");
    write(&ws.join("replaced/old.txt"), "old");
    write(&ws.join("typechange"), "was a file");
    write(&ws.join("gone.txt"), "bye");
    std::os::unix::fs::symlink("src/f0.rs", ws.join("link")).unwrap();
    let state = StateDir::open_with_key(&root.join("state"), Key::from_bytes([9; 32])).unwrap();
    // A run's directory whose process is gone (its lock released).
    let id = TxDir::create(&state, &ws, TxKind::Run).unwrap().id.clone();
    let tx = state.tx_dir(&id);
    let up = tx.join("upper");
    std::fs::create_dir_all(&up).unwrap();
    std::fs::set_permissions(&up, std::fs::Permissions::from_mode(std::fs::metadata(&ws).unwrap().mode() & 0o7777))
        .unwrap();
    for i in (0..30).step_by(3) {
        write(&up.join(format!("src/f{i}.rs")), &format!("new {i}\n"));
    }
    for i in 0..20 {
        write(&up.join(format!("gen/g{i}.txt")), &format!("gen {i}\n"));
    }
    write(&up.join("replaced/new.txt"), "new");
    rustix::fs::lsetxattr(up.join("replaced").as_path(), "user.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())
        .unwrap();
    std::fs::create_dir_all(up.join("typechange")).unwrap();
    write(&up.join("typechange/inside.txt"), "now a dir");
    std::os::unix::fs::symlink("src/f3.rs", up.join("link")).unwrap();
    // Whiteouts: 0:0 character devices. Creating them needs CAP_MKNOD.
    for w in ["doomed", "gone.txt"] {
        if rustix::fs::mknodat(
            rustix::fs::CWD,
            up.join(w).as_path(),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            0,
        )
        .is_err()
        {
            eprintln!("SKIP crash injection: cannot create whiteouts (mknod needs CAP_MKNOD; run as root)");
            return None;
        }
    }
    Some((ws, state, id))
}

fn commit_with(ws: &Path, state: &StateDir, id: &str, hook: &mut CrashHook) -> Result<(), CommitError> {
    commit_calling(ws, state, id, hook, &mut || {})
}

fn commit_calling(
    ws: &Path,
    state: &StateDir,
    id: &str,
    hook: &mut CrashHook,
    at_commit_point: &mut dyn FnMut(),
) -> Result<(), CommitError> {
    let tx = state.tx_dir(id);
    let upper = tx.join("upper");
    let cs = txbox_txn::classify(&upper, ws, &HashSet::new()).unwrap();
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
    commit::commit(&target, &cs, hook, at_commit_point)
}

#[test]
fn a_commit_cut_at_every_step_recovers_to_old_or_new() {
    let base = PathBuf::from(format!("/var/tmp/txbox-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let reference = base.join("reference");
    let Some((ws, state, id)) = build(&reference) else { return };
    let old = digest(&ws);
    let mut full = CrashHook::default();
    commit_with(&ws, &state, &id, &mut full).unwrap();
    let new = digest(&ws);
    assert_ne!(old, new);
    assert!(new.contains_key(b"gen/g7.txt".as_slice()) && !new.contains_key(b"doomed".as_slice()));
    let total = full.calls();
    assert!(total > 10, "a realistic commit makes many mutating calls, saw {total}");
    eprintln!("cutting a commit of {total} mutating calls at each of them");
    let (mut saw_old, mut saw_new) = (0, 0);
    for n in 1..=total {
        let root = base.join(format!("n{n}"));
        let (ws, state, id) = build(&root).unwrap();
        match commit_with(&ws, &state, &id, &mut CrashHook::after(n)) {
            Err(CommitError::Injected(_)) => {}
            other => panic!("cut at {n}: expected the injected stop, got {other:?}"),
        }
        // Recovery runs as any later txbox command would: find records, roll forward.
        txbox_txn::recover(&state, None, &mut CrashHook::default()).unwrap();
        let got = digest(&ws);
        if got == old {
            saw_old += 1;
        } else if got == new {
            saw_new += 1;
        } else {
            panic!("cut after {n} of {total} calls: the workspace is neither old nor new");
        }
        assert!(state.pending_records().unwrap().is_empty(), "recovery left a commit record");
        assert!(!state.tx_dir(&id).exists(), "recovery left the transaction directory");
        let _ = std::fs::remove_dir_all(&root);
    }
    // Before the commit point the old state survives; after it, the new one always wins.
    assert!(saw_old >= 1 && saw_new >= 1, "old {saw_old}, new {saw_new}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn recovery_is_idempotent_when_interrupted_itself() {
    let base = PathBuf::from(format!("/var/tmp/txbox-crash2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let reference = base.join("reference");
    let Some((ws, state, id)) = build(&reference) else { return };
    commit_with(&ws, &state, &id, &mut CrashHook::default()).unwrap();
    let new = digest(&ws);
    // Cut the commit just after its commit point, then cut recovery itself at every step.
    for m in 1..12 {
        let root = base.join(format!("m{m}"));
        let (ws, state, id) = build(&root).unwrap();
        let _ = commit_with(&ws, &state, &id, &mut CrashHook::after(3));
        if state.pending_records().unwrap().is_empty() {
            continue;
        }
        let _ = txbox_txn::recover(&state, None, &mut CrashHook::after(m));
        txbox_txn::recover(&state, None, &mut CrashHook::default()).unwrap();
        assert_eq!(digest(&ws), new, "recovery cut at {m} then resumed did not reach the new state");
        let _ = std::fs::remove_dir_all(&root);
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// Recovery after the commit point meets a name the transaction creates already taken by
/// someone else (made between the crash and the recovery): it refuses and leaves that object
/// alone, never taking it for its own creation or replacing it.
#[test]
fn recovery_refuses_a_created_name_someone_else_took() {
    let base = PathBuf::from(format!("/var/tmp/txbox-crash3-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let Some((ws, state, id)) = build(&base) else { return };
    // Cut just after the commit point, before the first step is applied.
    match commit_with(&ws, &state, &id, &mut CrashHook::after(2)) {
        Err(CommitError::Injected(_)) => {}
        other => panic!("expected the injected stop, got {other:?}"),
    }
    assert_eq!(state.pending_records().unwrap().len(), 1, "the commit record is durable");
    assert!(!ws.join("gen").exists(), "nothing applied yet");
    write(&ws.join("gen"), "someone else's\n");
    assert!(
        txbox_txn::recover(&state, None, &mut CrashHook::default()).is_err(),
        "recovery took a foreign gen for its own"
    );
    assert_eq!(std::fs::read_to_string(ws.join("gen")).unwrap(), "someone else's\n");
    let _ = std::fs::remove_dir_all(&base);
}

/// An error after the commit point is no crash but is handled like one (#14.1): the commit says
/// it is committed and unfinished, keeps its record and everything the record needs, recovery
/// refuses (saying what it needs) while the cause lasts, and applies the rest once it is gone.
/// Before the fix the transaction directory was deleted and the record pointed at nothing.
#[test]
fn an_error_after_the_commit_point_leaves_the_commit_to_recovery() {
    let base = PathBuf::from(format!("/var/tmp/txbox-crash4-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let Some((ws, state, id)) = build(&base.join("reference")) else { return };
    commit_with(&ws, &state, &id, &mut CrashHook::default()).unwrap();
    let new = digest(&ws);
    let (ws, state, id) = build(&base.join("cut")).unwrap();
    // Something moves a directory the commit is about to change, right after its commit point.
    let (src, aside) = (ws.join("src"), base.join("cut/src-aside"));
    let err =
        commit_calling(&ws, &state, &id, &mut CrashHook::default(), &mut || std::fs::rename(&src, &aside).unwrap());
    match &err {
        Err(e @ CommitError::Unfinished { .. }) => {
            assert!(e.committed() && e.to_string().contains("recover"), "{e}");
        }
        other => panic!("expected a commit left to recovery, got {other:?}"),
    }
    assert_eq!(state.pending_records().unwrap().len(), 1, "the record was not kept");
    assert!(state.tx_dir(&id).join("upper").is_dir(), "the layers the record needs were removed");
    assert!(state.remove_tx(&id).is_err(), "a committed transaction's layers could be removed");
    // While the cause lasts, recovery says what it cannot do, and changes nothing more.
    let half = digest(&ws);
    let e = txbox_txn::recover(&state, None, &mut CrashHook::default()).unwrap_err().to_string();
    assert!(e.contains(&id) && e.contains("txbox recover"), "{e}");
    assert_eq!(digest(&ws), half);
    std::fs::rename(&aside, &src).unwrap();
    let done = txbox_txn::recover(&state, None, &mut CrashHook::default()).unwrap();
    assert!(matches!(done.as_slice(), [txbox_txn::Recovered::RolledForward { .. }]), "{done:?}");
    assert_eq!(digest(&ws), new, "recovery did not finish the commit");
    assert!(state.pending_records().unwrap().is_empty() && !state.tx_dir(&id).exists());
    let _ = std::fs::remove_dir_all(&base);
}
