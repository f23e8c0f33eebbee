//! The flushes of a real commit, recorded through the `durable::Flusher` seam with what the
//! filesystem looked like at each, checked against the ordering rules of docs/RELIABILITY.md
//! ("Power loss: the ordering argument"): every object the record points at, and every
//! directory on the way to it, durable before the record has its name; the record's name
//! durable before anything is applied; both directories of every rename durable before the
//! record leaves the journal. Unprivileged (no whiteouts: deletions come from an opaque
//! directory), so it runs as root and as any user.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use txbox_txn::commit::{self, CommitError, CommitTarget, CrashHook, Durability};
use txbox_txn::durable::{Flush, FlushError, Flusher, Fsync, How};
use txbox_txn::layout::TxKind;
use txbox_txn::seal::Key;
use txbox_txn::state::{StateDir, TxDir};

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

struct Setup {
    root: PathBuf,
    ws: PathBuf,
    state: StateDir,
    id: String,
}

impl Setup {
    fn tx(&self) -> PathBuf {
        self.state.tx_dir(&self.id)
    }
    fn upper(&self) -> PathBuf {
        self.tx().join("upper")
    }
    fn trash(&self) -> PathBuf {
        self.tx().join("trash")
    }
    fn record(&self) -> PathBuf {
        self.state.record_path(&self.id)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A workspace and an upper layer with a replaced file, a new file at the root, a new
/// directory with a file in it, and a directory made opaque (its old file deleted, its
/// attributes copied).
fn build(tag: &str) -> Setup {
    let root = PathBuf::from(format!("/var/tmp/txbox-durability-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let ws = root.join("ws");
    write(&ws.join("src/a.rs"), "old\n");
    write(&ws.join("doomed/y"), "bye\n");
    write(&ws.join("keep/x"), "x\n");
    let state = StateDir::open_with_key(&root.join("state"), Key::from_bytes([5; 32])).unwrap();
    let id = TxDir::create(&state, &ws, TxKind::Run).unwrap().id.clone();
    let s = Setup { root, ws, state, id };
    let up = s.upper();
    write(&up.join("src/a.rs"), "new\n");
    write(&up.join("src/new/b.rs"), "b\n");
    write(&up.join("top.txt"), "top\n");
    std::fs::create_dir_all(up.join("doomed")).unwrap();
    rustix::fs::lsetxattr(up.join("doomed").as_path(), "user.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())
        .unwrap();
    write(&s.root.join("state/locks/test.commits"), "1 00\n");
    s
}

/// What the filesystem looked like when a batch was flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    pending: bool,
    record: bool,
    applied_to_ws: bool,
    marked_applied: bool,
}

struct Recorder<'a> {
    s: &'a Setup,
    batches: Vec<(Vec<Flush>, Seen)>,
    /// Fail the batch with this index (0-based), after recording it.
    fail_at: Option<usize>,
}

impl Flusher for Recorder<'_> {
    fn flush(&mut self, batch: &[Flush]) -> Result<(), FlushError> {
        let record = self.s.record();
        let seen = Seen {
            pending: txbox_txn::journal::pending_path(&record).exists(),
            record: record.exists(),
            applied_to_ws: self.s.ws.join("top.txt").exists(),
            marked_applied: self.s.tx().join("applied").exists(),
        };
        self.batches.push((batch.to_vec(), seen));
        if self.fail_at == Some(self.batches.len() - 1) {
            return Err(FlushError { flush: batch[0].clone(), source: std::io::Error::from_raw_os_error(libc::EIO) });
        }
        Fsync.flush(batch)
    }
}

fn run(s: &Setup, flusher: &mut Recorder<'_>) -> Result<(), CommitError> {
    let upper = s.upper();
    let cs = txbox_txn::classify(&upper, &s.ws, &HashSet::new()).unwrap();
    let record = s.record();
    let trash = s.trash();
    let target = CommitTarget {
        tx: &s.id,
        workspace: &s.ws,
        upper: &upper,
        trash: &trash,
        record: &record,
        seal: s.state.seal(),
        relief: None,
    };
    let state = &s.state.root;
    let mut d = Durability {
        before: vec![Flush::data(state, Path::new("locks/test.commits"))],
        after: vec![Flush::data(state, Path::new("locks/test.commits"))],
        flusher,
    };
    commit::commit_with(&target, &cs, &mut CrashHook::default(), &mut || {}, &mut d)
}

fn paths(batch: &[Flush], how: How) -> HashSet<PathBuf> {
    batch.iter().filter(|f| f.how == how).map(Flush::path).collect()
}

fn missing(batch: &[Flush], how: How, want: &[PathBuf]) -> Vec<PathBuf> {
    let have = paths(batch, how);
    want.iter().filter(|p| !have.contains(*p)).cloned().collect()
}

#[test]
fn every_needed_flush_happens_and_in_the_order_the_guarantee_needs() {
    let s = build("order");
    let mut rec = Recorder { s: &s, batches: Vec::new(), fail_at: None };
    run(&s, &mut rec).unwrap();
    let b = rec.batches.clone();
    assert_eq!(b.len(), 4, "content, commit point, applied, retired: {b:#?}");
    let journal = s.record().parent().unwrap().to_path_buf();
    let (up, ws, st) = (s.upper(), s.ws.clone(), s.state.root.clone());

    // 1. Before the record has its name: everything it points at, and the record itself.
    let (content, seen) = &b[0];
    assert_eq!(*seen, Seen { pending: true, record: false, applied_to_ws: false, marked_applied: false });
    let files = [
        up.join("src/a.rs"),
        up.join("top.txt"),
        up.join("src/new/b.rs"),
        journal.join(format!("{}.tmp", s.record().file_name().unwrap().to_string_lossy())),
    ];
    assert_eq!(missing(content, How::File, &files), Vec::<PathBuf>::new(), "files: {content:#?}");
    let dirs = [
        up.join("src/new"), // a new directory, moved whole
        up.join("src"),     // holds what moves (a.rs, new)
        up.clone(),         // holds top.txt, src, doomed
        up.join("doomed"),  // its attributes are copied from here, by recovery too
        s.trash(),          // recovery opens it
        s.tx(),             // holds upper and the new trash
        st.join("tx"),      // holds the transaction, renamed from a spare
    ];
    assert_eq!(missing(content, How::Dir, &dirs), Vec::<PathBuf>::new(), "directories: {content:#?}");
    assert!(paths(content, How::Data).contains(&st.join("locks/test.commits")), "the caller's log");
    assert!(content.iter().all(|f| f.how != How::Fs), "a small commit needs no syncfs: {content:#?}");

    // 2. The commit point: the record's name, before anything is applied.
    assert_eq!(b[1].0, vec![Flush::dir(&journal, Path::new(""))]);
    assert_eq!(b[1].1, Seen { pending: false, record: true, applied_to_ws: false, marked_applied: false });

    // 3. Applied, the record still in the journal: both directories of every rename.
    let (applied, seen) = &b[2];
    assert_eq!(*seen, Seen { pending: false, record: true, applied_to_ws: true, marked_applied: false });
    let dirs = [
        ws.clone(),         // gained top.txt
        up.clone(),         // lost it
        ws.join("src"),     // a.rs exchanged, new moved in
        up.join("src"),     // the other side of both
        ws.join("src/new"), // moved between parents: its `..`
        ws.join("doomed"),  // lost y; and its attributes
        s.trash(),          // gained y
    ];
    assert_eq!(missing(applied, How::Dir, &dirs), Vec::<PathBuf>::new(), "directories: {applied:#?}");
    assert!(paths(applied, How::Data).contains(&st.join("locks/test.commits")), "the caller's log");

    // 4. The record left the journal (into the transaction, as `applied`) once all of that was
    //    durable, and that is made durable last.
    assert_eq!(b[3].0, vec![Flush::dir(&journal, Path::new(""))]);
    assert_eq!(b[3].1, Seen { pending: false, record: false, applied_to_ws: true, marked_applied: true });
    assert_eq!(std::fs::read_to_string(s.ws.join("src/new/b.rs")).unwrap(), "b\n");
    assert!(!s.ws.join("doomed/y").exists());
}

/// A flush that fails before the commit point refuses the commit whole: no record (pending or
/// not), nothing applied. One that fails after it leaves the commit to recovery, the record and
/// the layers kept; recovery then finishes it (or, the record already marked applied, cleans up).
#[test]
fn a_failed_flush_refuses_before_the_commit_point_and_defers_after_it() {
    for (at, committed) in [(0, false), (1, false), (2, true), (3, true)] {
        let s = build(&format!("fail{at}"));
        let mut rec = Recorder { s: &s, batches: Vec::new(), fail_at: Some(at) };
        let e = run(&s, &mut rec).unwrap_err();
        assert_eq!(e.committed(), committed, "flush {at} failing: {e}");
        assert!(!txbox_txn::journal::pending_path(&s.record()).exists(), "flush {at}: a pending record stayed");
        if committed {
            // In the journal, or (its move out of the journal not known durable) as `applied`.
            let kept = s.state.pending_records().unwrap().len() == 1 || s.tx().join("applied").exists();
            assert!(kept, "flush {at}: the record was not kept");
            txbox_txn::recover(&s.state, None, &mut CrashHook::default()).unwrap();
        } else {
            assert!(s.state.pending_records().unwrap().is_empty(), "flush {at}: a refused commit left its record");
            assert!(!s.ws.join("top.txt").exists(), "flush {at}: applied without a commit point");
            continue;
        }
        assert_eq!(std::fs::read_to_string(s.ws.join("top.txt")).unwrap(), "top\n", "flush {at}");
        assert!(s.state.pending_records().unwrap().is_empty());
    }
}
