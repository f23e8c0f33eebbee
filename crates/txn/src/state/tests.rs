use super::lock_tests::held_as_a_warm_server_does;
use super::*;
use crate::journal::JournalStep;
use crate::plan::Step;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

type R = Result<(), Box<dyn std::error::Error>>;

fn key() -> Key {
    Key::from_bytes([42; 32])
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Result<Scratch, PathError> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let d = std::env::temp_dir().join(format!("txbox-state-{}-{name}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("ws")).map_err(at(&d, "mkdir"))?;
        Ok(Scratch(d))
    }

    fn ws(&self) -> PathBuf {
        self.0.join("ws")
    }

    fn state(&self) -> Result<StateDir, StateError> {
        StateDir::open_with_key(&self.0.join("state"), key())
    }

    /// A decoy directory outside the state and the workspace, with what it holds.
    fn decoy(&self) -> Result<PathBuf, PathError> {
        let d = self.0.join("decoy");
        for sub in ["upper/f", "trash/g", "steps/1/upper/h", "ws/i"] {
            let p = d.join(sub);
            std::fs::create_dir_all(p.parent().unwrap_or(&d)).map_err(at(&p, "mkdir"))?;
            std::fs::write(&p, "decoy").map_err(at(&p, "write"))?;
        }
        Ok(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = remove_tree(&self.0);
    }
}

/// Every path, type, size and content under `root` (symlinks not followed).
fn digest(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(md) = std::fs::symlink_metadata(&p) else { continue };
            let what = if md.is_dir() {
                todo.push(p.clone());
                "dir".to_string()
            } else if md.file_type().is_symlink() {
                format!("link {:?}", std::fs::read_link(&p).ok())
            } else {
                format!("file {:?}", std::fs::read(&p).ok())
            };
            out.insert(p, what);
        }
    }
    out
}

#[test]
fn a_state_directory_is_used_only_if_txbox_made_it() -> R {
    let s = Scratch::new("marker")?;
    // Missing or empty: initialized, closed to others, marked.
    let fresh = s.0.join("fresh");
    let state = StateDir::open_with_key(&fresh, key())?;
    assert_eq!(std::fs::metadata(&fresh)?.mode() & 0o777, 0o700);
    assert!(fresh.join(layout::MARKER).is_file());
    drop(state);
    StateDir::open_with_key(&fresh, key())?;
    let empty = s.0.join("empty");
    std::fs::create_dir(&empty)?;
    std::fs::set_permissions(&empty, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    StateDir::open_with_key(&empty, key())?;

    let refused = |dir: &Path, what: &str| match StateDir::open_with_key(dir, key()) {
        Err(StateError::NotOurs { .. }) => {}
        other => panic!("{what}: expected a refusal, got {other:?}"),
    };
    // What an earlier version, a repository or a command left: not empty, no marker.
    let shipped = s.0.join("shipped");
    std::fs::create_dir_all(shipped.join("journal"))?;
    std::fs::write(shipped.join("journal/0123456789abcdef.commit"), "txbox-commit v1\n")?;
    refused(&shipped, "a directory with content and no marker");
    // A genuine marker copied into another directory: bound to the directory it was made for.
    let copy = s.0.join("copy");
    std::fs::create_dir(&copy)?;
    std::fs::copy(fresh.join(layout::MARKER), copy.join(layout::MARKER))?;
    refused(&copy, "a marker copied from another state directory");
    // Another key (another user's, a replaced key).
    match StateDir::open_with_key(&fresh, Key::from_bytes([1; 32])) {
        Err(StateError::NotOurs { .. }) => {}
        other => panic!("another key: expected a refusal, got {other:?}"),
    }
    // A symlink to a real state directory, a file, a directory others may write to.
    std::os::unix::fs::symlink(&fresh, s.0.join("link"))?;
    refused(&s.0.join("link"), "a symlink");
    std::fs::write(s.0.join("file"), "x")?;
    refused(&s.0.join("file"), "a file");
    let open_dir = s.0.join("open");
    StateDir::open_with_key(&open_dir, key())?;
    std::fs::set_permissions(&open_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    refused(&open_dir, "a directory others may write to");
    // The refusal says what to do.
    let msg = StateDir::open_with_key(&shipped, key()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("move it aside") && msg.contains("--state-dir"), "{msg}");
    Ok(())
}

#[test]
fn forged_meta_status_and_symlinked_transactions_are_never_acted_on() -> R {
    let s = Scratch::new("forged")?;
    let state = s.state()?;
    let decoy = s.decoy()?;
    let before = digest(&decoy);
    let other = StateDir::open_with_key(&s.0.join("other"), key())?;

    // A session of another state directory, copied in whole under its own id.
    let foreign = other.create_session(&decoy, Some("foreign"))?;
    let mut copy = std::process::Command::new("cp");
    copy.arg("-a").arg(other.tx_dir(&foreign)).arg(state.tx_dir(&foreign));
    assert!(copy.status()?.success());
    assert!(matches!(state.read_meta(&foreign), Err(StateError::Forged { .. })));
    assert!(state.lock_tx(&foreign).is_err());
    // Plain-text meta naming the decoy as workspace, status `committing` (an earlier
    // version's format, or a forger's).
    let plain = "00000000000000f1";
    std::fs::create_dir_all(state.tx_dir(plain).join("upper"))?;
    std::fs::write(
        state.tx_dir(plain).join("meta"),
        format!("workspace {}\nkind session\n", hex(decoy.as_os_str().as_bytes())),
    )?;
    std::fs::write(state.tx_dir(plain).join("status"), "committing\n")?;
    std::fs::write(state.tx_dir(plain).join("steps_root"), hex(decoy.join("steps").as_os_str().as_bytes()))?;
    assert!(state.read_meta(plain).is_err() && state.status(plain).is_err());
    // meta sealed for another transaction id (what a spare carries).
    let moved = "00000000000000f2";
    let real = state.create_session(&s.ws(), None)?;
    std::fs::create_dir(state.tx_dir(moved))?;
    std::fs::copy(state.tx_dir(&real).join("meta"), state.tx_dir(moved).join("meta"))?;
    assert!(matches!(state.read_meta(moved), Err(StateError::Forged { .. })));
    // tx/<id> as a symlink to the decoy.
    let linked = "00000000000000f3";
    std::os::unix::fs::symlink(&decoy, state.tx_dir(linked))?;

    let mut looked = 0;
    let discarded = state.discard_abandoned(&mut looked)?;
    assert!(discarded.is_empty(), "discarded {discarded:?} on a guess");
    for id in [foreign.as_str(), plain, moved, linked] {
        state.remove_tx(id)?;
    }
    state.collect_retired()?;
    assert_eq!(digest(&decoy), before, "something outside the state directory changed");
    assert!(!state.tx_dir(linked).exists() && std::fs::symlink_metadata(state.tx_dir(linked)).is_err());
    // The real session is untouched by all this.
    assert_eq!(state.read_meta(&real)?.kind, TxKind::Session);
    // Its layers swapped for a symlink to the decoy: refused, not followed.
    let steps = state.steps_root(&real, &s.ws())?;
    std::fs::remove_dir(&steps)?;
    std::os::unix::fs::symlink(decoy.join("steps"), &steps)?;
    assert!(state.steps_root(&real, &s.ws()).is_err(), "a symlinked steps directory was accepted");
    state.remove_tx(&real)?;
    assert_eq!(digest(&decoy), before);
    Ok(())
}

#[test]
fn session_state_is_sealed_and_damage_is_refused() -> R {
    let s = Scratch::new("session")?;
    let state = s.state()?;
    let id = state.create_session(&s.ws(), Some("my session"))?;
    let meta = state.read_meta(&id)?;
    assert_eq!((meta.kind, meta.workspace, meta.name.as_deref()), (TxKind::Session, s.ws(), Some("my session")));
    assert_eq!(state.status(&id)?, Status::Open);
    state.set_status(&id, Status::Committing)?;
    assert_eq!(state.status(&id)?, Status::Committing);
    for bad in ["", "a\nb", "\x1b[31mred", &"x".repeat(MAX_NAME + 1)] {
        assert!(matches!(state.create_session(&s.ws(), Some(bad)), Err(StateError::BadName(_))), "{bad:?}");
    }

    let mut fps = state.load_fingerprints(&id)?;
    assert_eq!(fps, Fingerprints::default());
    std::fs::write(s.ws().join("f"), "x")?;
    let layer = s.0.join("layer");
    std::fs::create_dir_all(&layer)?;
    std::fs::write(layer.join("f"), "y")?;
    fps.record_layer(1, &layer, &s.ws())?;
    state.save_fingerprints(&id, &fps)?;
    assert_eq!(state.load_fingerprints(&id)?, fps);
    let file = state.tx_dir(&id).join(layout::FINGERPRINTS);
    let good = std::fs::read(&file)?;
    let first_nl = good.iter().position(|c| *c == b'\n').map_or(0, |i| i + 1);
    let damaged: [(&str, Vec<u8>); 4] = [
        ("truncated", good[..good.len() / 2].to_vec()),
        ("emptied", Vec::new()),
        ("a flipped byte", good.iter().enumerate().map(|(i, b)| if i == 3 { b ^ 1 } else { *b }).collect()),
        // The first path's line gone: a valid-looking file that forgets a base.
        ("a line dropped", {
            let second = good[first_nl..].iter().position(|c| *c == b'\n').map_or(first_nl, |i| first_nl + i + 1);
            [&good[..first_nl], &good[second..]].concat()
        }),
    ];
    for (what, bytes) in &damaged {
        std::fs::write(&file, bytes)?;
        assert!(matches!(state.load_fingerprints(&id), Err(StateError::Forged { .. })), "{what} went unnoticed");
    }
    std::fs::remove_file(&file)?;
    assert!(matches!(state.load_fingerprints(&id), Err(StateError::Forged { .. })), "a deleted file went unnoticed");
    // Another session's (valid) fingerprints do not stand in.
    let other = state.create_session(&s.ws(), None)?;
    std::fs::copy(state.tx_dir(&other).join(layout::FINGERPRINTS), &file)?;
    assert!(state.load_fingerprints(&id).is_err());
    Ok(())
}

/// A record as `commit` writes it, for transaction `id`, with its paths derived as they are.
fn record_for(state: &StateDir, id: &str, ws: &Path) -> CommitRecord {
    CommitRecord {
        tx: id.to_string(),
        workspace: ws.to_path_buf(),
        upper: state.tx_dir(id).join(layout::UPPER),
        trash: state.tx_dir(id).join(layout::TRASH),
        steps: vec![JournalStep { step: Step::DirMeta { path: PathBuf::new() }, ino: 0, old_ino: 0 }],
    }
}

#[test]
fn records_are_checked_before_anything_is_applied() -> R {
    let s = Scratch::new("records")?;
    let state = s.state()?;
    let decoy = s.decoy()?;
    let tx = TxDir::create(&state, &s.ws(), TxKind::Run)?;
    let write = |r: &CommitRecord, name: &str| {
        journal::write_durably(&state.root.join(layout::JOURNAL).join(name), r, state.seal())
    };
    let good = record_for(&state, &tx.id, &s.ws());
    write(&good, &layout::record_name(&tx.id))?;
    let path = state.record_path(&tx.id);
    assert_eq!(state.pending_records()?, vec![path.clone()]);
    assert_eq!(state.read_record(&path)?, Some(good.clone()));
    // A session's layer is its transaction's too.
    let mut session = good.clone();
    session.upper = state.steps_root(&tx.id, &s.ws())?.join("3").join(layout::UPPER);
    write(&session, &layout::record_name(&tx.id))?;
    assert!(state.read_record(&path)?.is_some());

    let refused = |r: CommitRecord, what: &str| -> R {
        write(&r, &layout::record_name(&tx.id))?;
        assert!(state.read_record(&path).is_err(), "{what} was accepted");
        Ok(())
    };
    for (upper, what) in [
        (decoy.join("upper"), "an upper elsewhere"),
        (state.tx_dir(&tx.id).join("steps/x/upper"), "a step that is no number"),
        (state.steps_root(&tx.id, &s.ws())?.join("1/upper/../../../../.."), "a step path climbing out"),
        (state.tx_dir("0000000000000001").join(layout::UPPER), "another transaction's upper"),
    ] {
        refused(CommitRecord { upper, ..good.clone() }, what)?;
    }
    refused(CommitRecord { trash: decoy.join("trash"), ..good.clone() }, "a trash elsewhere")?;
    refused(CommitRecord { workspace: PathBuf::from("ws"), ..good.clone() }, "a relative workspace")?;
    refused(CommitRecord { workspace: s.ws().join("../decoy/ws"), ..good.clone() }, "a workspace with ..")?;

    // Another state directory's genuine record, as a symlink, a hard link, or a copy.
    let other = StateDir::open_with_key(&s.0.join("other"), key())?;
    let theirs = TxDir::create(&other, &decoy.join("ws"), TxKind::Run)?;
    let their_record = other.record_path(&theirs.id);
    journal::write_durably(&their_record, &record_for(&other, &theirs.id, &decoy.join("ws")), other.seal())?;
    std::fs::remove_file(&path)?;
    std::os::unix::fs::symlink(&their_record, &path)?;
    assert!(state.read_record(&path).is_err(), "a symlinked record");
    std::fs::remove_file(&path)?;
    std::fs::hard_link(&their_record, &path)?;
    assert!(state.read_record(&path).is_err(), "a hard-linked record");
    std::fs::remove_file(&path)?;
    std::fs::copy(&their_record, &path)?;
    assert!(state.read_record(&path).is_err(), "a copied record");
    // Ours, under another transaction's name (that transaction exists).
    std::fs::remove_file(&path)?;
    let second = TxDir::create(&state, &s.ws(), TxKind::Run)?;
    write(&good, &layout::record_name(&second.id))?;
    assert!(state.read_record(&state.record_path(&second.id)).is_err(), "a renamed record");
    std::fs::remove_file(state.record_path(&second.id))?;
    // Replayed: a genuine record of a transaction that is over.
    write(&good, &layout::record_name(&tx.id))?;
    let saved = std::fs::read(&path)?;
    let id = tx.id.clone();
    drop(tx);
    // A committed transaction's layers stay until its record is applied (#14.1).
    assert!(matches!(state.remove_tx(&id), Err(StateError::Committed(_))));
    assert!(state.tx_dir(&id).is_dir());
    std::fs::remove_file(&path)?;
    state.remove_tx(&id)?;
    std::fs::write(&path, &saved)?;
    assert!(matches!(state.read_record(&path), Err(StateError::Journal(JournalError::Refused { .. }))));
    // Other names in the journal are not records at all.
    std::fs::write(state.root.join(layout::JOURNAL).join("x.commit"), &saved)?;
    assert_eq!(state.pending_records()?, vec![path.clone()]);
    // Recovery refuses them all, and nothing outside moved.
    let before = digest(&decoy);
    assert!(crate::recover(&state, None, &mut crate::CrashHook::default()).is_err());
    assert_eq!(digest(&decoy), before);
    Ok(())
}

#[test]
fn leftover_temporary_records_are_removed_unless_their_writer_lives() -> R {
    let s = Scratch::new("tmp")?;
    let state = s.state()?;
    let live = TxDir::create(&state, &s.ws(), TxKind::Run)?;
    let journal = state.root.join(layout::JOURNAL);
    let tmp = |id: &str| journal.join(format!("{}{}", layout::record_name(id), layout::TMP_SUFFIX));
    std::fs::write(tmp(&live.id), "half a record")?;
    std::fs::write(tmp("00000000000000d1"), "half a record")?;
    assert!(state.pending_records()?.is_empty());
    assert!(tmp(&live.id).exists(), "removed while its writer holds the transaction");
    assert!(!tmp("00000000000000d1").exists(), "left behind by a dead writer");
    Ok(())
}

#[test]
fn retired_directories_stay_bounded_and_recovery_does_not_look_at_them() -> R {
    let s = Scratch::new("retired")?;
    let state = s.state()?;
    let mut looked_at = Vec::new();
    for n in 1..=200u64 {
        // A run that wrote something, retired as `drop_tx` does after a warm run.
        let tx = TxDir::create(&state, &s.ws(), TxKind::Run)?;
        std::fs::create_dir_all(tx.upper.join("d"))?;
        std::fs::write(tx.upper.join("d/f"), "x")?;
        let id = tx.id.clone();
        drop(tx);
        state.retire_tx(&id)?;
        assert_eq!(state.retired_count(), n);
        assert_eq!(state.collector_wanted(false), n > RETIRED_BOUND);
        assert!(state.collector_wanted(true));
        let mut stats = crate::RecoverStats::default();
        crate::recover_counting(&state, Some(&s.ws()), &mut crate::CrashHook::default(), &mut stats)?;
        looked_at.push(stats.looked_at);
    }
    assert!(looked_at.iter().all(|n| *n == looked_at[0]), "recovery looked at more as history grew: {looked_at:?}");
    // A collector at work: no second one wanted.
    let busy = state.gc_lock(false)?;
    assert!(!state.collector_wanted(true));
    assert_eq!(state.collect_retired()?, 0, "two collectors at once");
    drop(busy);
    // One still mounted by a warm server (its work share-locked) is left for later.
    let tx = TxDir::create(&state, &s.ws(), TxKind::Run)?;
    let (id, work) = (tx.id.clone(), tx.work.clone());
    let held = held_as_a_warm_server_does(&work)?;
    drop(tx);
    state.retire_tx(&id)?;
    assert_eq!(state.collect_retired()?, 200);
    assert_eq!(state.retired_count(), 1);
    drop(held);
    assert_eq!(state.collect_retired()?, 1);
    assert_eq!(state.retired_count(), 0);
    assert!(!state.collector_wanted(true));
    Ok(())
}

/// #14.5: a run taking a spare while another process's recovery looks for abandoned
/// transactions. The spare arrives under its new id with the meta of the run that left it;
/// recovery must never take it for abandoned and delete it under its new owner.
#[test]
fn taking_a_spare_races_no_recovery() -> R {
    let s = Scratch::new("race")?;
    let state = s.state()?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (st, ws, halt) = (state.clone(), s.ws(), stop.clone());
    let recovery = std::thread::spawn(move || -> Result<usize, StateError> {
        let mut rounds = 0;
        while !halt.load(std::sync::atomic::Ordering::Relaxed) {
            let mut looked = 0;
            let gone = st.discard_abandoned(&mut looked)?;
            assert!(gone.is_empty(), "discarded live transactions {gone:?}");
            let _ = &ws;
            rounds += 1;
        }
        Ok(rounds)
    });
    let mut taken = 0;
    for _ in 0..3000 {
        let tx = TxDir::create(&state, &s.ws(), TxKind::Run)?;
        assert!(tx.upper.is_dir() && tx.work.is_dir());
        if state.recycle_tx(&tx.id) {
            taken += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = recovery.join().map_err(|_| "recovery thread panicked")??;
    assert!(taken > 2900 && rounds > 0, "spares taken {taken}, recovery rounds {rounds}");
    Ok(())
}

#[test]
fn a_spare_still_locked_by_a_warm_server_is_passed_over_not_waited_for() -> R {
    let s = Scratch::new("spare-lock")?;
    let state = s.state()?;
    let a = TxDir::create(&state, &s.ws(), TxKind::Run)?;
    let held = held_as_a_warm_server_does(&a.work)?;
    let work_ino = std::fs::metadata(&a.work)?.ino();
    assert!(state.recycle_tx(&a.id));
    drop(a);
    // Taken while the server holds it, this would wait (or share upper and work): a new
    // directory instead, at once (this thread would block forever otherwise).
    let b = TxDir::create(&state, &s.ws(), TxKind::Run)?;
    assert_ne!(std::fs::metadata(&b.work)?.ino(), work_ino, "took the spare a server still holds");
    drop(b);
    // Released, the spare serves the next run.
    drop(held);
    let c = TxDir::create(&state, &s.ws(), TxKind::Run)?;
    assert_eq!(std::fs::metadata(&c.work)?.ino(), work_ino, "the released spare was not taken");
    Ok(())
}

#[test]
fn an_empty_run_directory_serves_the_next_run_and_nothing_else() -> R {
    let s = Scratch::new("spare")?;
    let state = s.state()?;
    let root = s.0.join("other-ws");
    std::fs::create_dir(&root)?;
    let ws = s.ws();
    let ino = |p: &Path| std::fs::metadata(p).map(|m| m.ino()).unwrap_or(0);

    // A run that wrote nothing (overlayfs left its empty work/work and its uuid on the
    // upper root): kept, then reused.
    // As root, the first workspace belongs to someone else: the spare must not carry that
    // owner over to the next workspace (overlay shows it as the root's, a commit copies it).
    let root_user = rustix::process::geteuid().is_root();
    if root_user {
        std::os::unix::fs::chown(&ws, Some(1000), Some(1000))?;
    }
    let a = TxDir::create(&state, &ws, TxKind::Run)?;
    if root_user {
        let up = std::fs::metadata(&a.upper)?;
        assert_eq!((up.uid(), up.gid()), (1000, 1000), "a fresh upper takes the workspace's owner");
    }
    std::fs::create_dir(a.work.join("work"))?;
    rustix::fs::lsetxattr(&a.upper, "user.overlay.uuid", b"0123", rustix::fs::XattrFlags::empty())?;
    let upper_ino = ino(&a.upper);
    assert!(state.recycle_tx(&a.id));
    drop(a);
    let mut looked = 0;
    assert!(state.discard_abandoned(&mut looked)?.is_empty(), "a spare is not an abandoned transaction");
    state.collect_retired()?;
    let b = TxDir::create(&state, &root, TxKind::Run)?;
    assert_eq!(ino(&b.upper), upper_ino, "the spare was not reused");
    assert_eq!(state.read_meta(&b.id)?.workspace, root, "meta not rewritten");
    let (up, want) = (std::fs::metadata(&b.upper)?, std::fs::metadata(&root)?);
    assert_eq!(
        (up.uid(), up.gid(), up.mode()),
        (want.uid(), want.gid(), want.mode()),
        "the spare's upper mirrors the new workspace root"
    );
    assert!(std::fs::read_dir(&b.upper).map(|mut d| d.next().is_none()).unwrap_or(false));

    // What a run left behind keeps a directory from serving again.
    std::fs::write(b.upper.join("f"), "x")?;
    assert!(!state.recycle_tx(&b.id));
    std::fs::remove_file(b.upper.join("f"))?;
    rustix::fs::lsetxattr(&b.upper, "user.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())?;
    assert!(!state.recycle_tx(&b.id), "an opaque upper would hide the workspace");
    drop(b);
    let c = TxDir::create(&state, &ws, TxKind::Run)?;
    std::fs::create_dir(&c.trash)?;
    assert!(!state.recycle_tx(&c.id));
    drop(c);
    // Nor anything overlayfs's work directory still holds, nor a work that is no directory.
    for leftover in ["work/x", "index", "link"] {
        let d = TxDir::create(&state, &ws, TxKind::Run)?;
        std::fs::create_dir_all(d.work.join("work"))?;
        if leftover == "link" {
            std::fs::remove_dir_all(&d.work)?;
            std::os::unix::fs::symlink(&d.upper, &d.work)?;
        } else {
            std::fs::create_dir(d.work.join(leftover))?;
        }
        assert!(!state.recycle_tx(&d.id), "work holding {leftover} was kept as a spare");
    }

    // No more than SPARES are kept.
    let runs: Vec<TxDir> =
        (0..layout::SPARES + 1).map(|_| TxDir::create(&state, &ws, TxKind::Run)).collect::<Result<_, _>>()?;
    let kept = runs.iter().filter(|t| state.recycle_tx(&t.id)).count();
    assert_eq!(kept, layout::SPARES);
    Ok(())
}

#[test]
fn commit_log_is_read_from_its_tail_with_the_same_answers() -> R {
    let s = Scratch::new("commitlog")?;
    let state = s.state()?;
    let ws = Path::new("/w");
    assert_eq!(state.commits_since(ws, 0)?, (0, Vec::new()));
    // Enough entries, with long paths, that the tail reader must widen its window.
    for g in 1..=3000u64 {
        let paths = vec![PathBuf::from(format!("dir{g}/{}", "x".repeat(40))), PathBuf::from(format!("f{g}"))];
        assert_eq!(state.log_commit(ws, &paths)?, g);
    }
    assert_eq!(state.generation(ws)?, 3000);
    for since in [0u64, 1, 1234, 2999, 3000] {
        let (g, paths) = state.commits_since(ws, since)?;
        assert_eq!(g, 3000);
        let want: Vec<PathBuf> = (since + 1..=3000).map(|g| PathBuf::from(format!("f{g}"))).collect();
        // The `f<g>` path of each entry (Path::starts_with compares whole components).
        let got: Vec<PathBuf> = paths.into_iter().filter(|p| p.to_str().is_some_and(|s| s.starts_with('f'))).collect();
        assert!(
            got == want,
            "since {since}: {} paths, first {:?}, want {} from {:?}",
            got.len(),
            got.first(),
            want.len(),
            want.first()
        );
    }
    // A line cut by a crash (no newline) is no commit.
    let log = state.commit_log(ws);
    let mut f = std::fs::OpenOptions::new().append(true).open(&log)?;
    std::io::Write::write_all(&mut f, b"3001 6631")?;
    assert_eq!(state.generation(ws)?, 3000);
    assert!(state.commits_since(ws, 3000)?.1.is_empty());
    Ok(())
}
