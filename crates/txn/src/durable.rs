//! What a commit makes durable, and when: the flush plan (data, built from the commit's steps)
//! and the seam that executes it ([`Flusher`]).
//!
//! A commit waits for the disk at four points, each a *batch* of flushes that must all have
//! returned before the commit goes on (the order inside a batch does not matter):
//!
//! 1. [`before_record`]: everything the record will point at: every object moved into the
//!    workspace (a new directory with its whole subtree), every upper directory on the way to
//!    one, the upper directories whose attributes are copied, the transaction's directories
//!    (`tx/<id>`, `tx`, the new trash), the caller's logs (the commit log), and the record
//!    itself under its temporary name;
//! 2. the journal directory, after the record is renamed to its final name: the commit point;
//! 3. [`after_apply`]: both directories of every rename the steps made (the workspace parent
//!    and the upper parent or the trash), every directory moved into the workspace (its `..`),
//!    every directory whose attributes were copied, and the caller's logs (the audit log and
//!    its head);
//! 4. the journal directory, after the record left it (`commit::finish`).
//!
//! A batch that cannot be expressed as fsyncs (a symlink, which has no descriptor to sync; an
//! upper layer outside the state directory, whose ancestors are not ours to list) or that
//! would take more than [`MAX_FSYNCS`] of them is one `syncfs` of the workspace's filesystem
//! instead, as every batch was before #18: the same guarantee, paid for by the whole
//! filesystem.
//!
//! Owns: the list of what to flush. May not touch: anything but the descriptors it opens to
//! flush (reads the upper layer to list a new directory's subtree).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rustix::fs::{Mode, OFlags};

use crate::fsx::open_beneath;
use crate::journal::JournalStep;
use crate::meta::Kind;
use crate::plan::Step;

/// Above this many fsyncs a batch is one `syncfs` (docs/BENCHMARKS.md, "Durability of a
/// one-file commit"). `TXBOX_MAX_FSYNCS=N` sets another bound for a process (0: every batch a
/// `syncfs`), for measuring on a given disk.
pub const MAX_FSYNCS: usize = 64;

/// [`MAX_FSYNCS`], or `TXBOX_MAX_FSYNCS` when set (read once).
pub fn max_fsyncs() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| std::env::var("TXBOX_MAX_FSYNCS").ok().and_then(|v| v.parse().ok()).unwrap_or(MAX_FSYNCS))
}

/// Flushes of one batch run on at most this many threads (each holds one descriptor while it
/// flushes, within the budget `check::FD_BUDGET` keeps for after the commit point).
pub const THREADS: usize = 4;

/// How an object is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum How {
    /// `fsync` of a file: its data and its inode.
    File,
    /// `fdatasync` of a file only appended to or rewritten in place (a log).
    Data,
    /// `fsync` of a directory: its entries and attributes.
    Dir,
    /// `syncfs` of the whole filesystem that holds `root`.
    Fs,
}

/// One flush: `rel` beneath `root` (opened without following any symlink beneath `root`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Flush {
    pub how: How,
    pub root: PathBuf,
    pub rel: PathBuf,
}

impl Flush {
    pub fn file(root: &Path, rel: &Path) -> Flush {
        Flush { how: How::File, root: root.to_path_buf(), rel: rel.to_path_buf() }
    }

    pub fn data(root: &Path, rel: &Path) -> Flush {
        Flush { how: How::Data, root: root.to_path_buf(), rel: rel.to_path_buf() }
    }

    pub fn dir(root: &Path, rel: &Path) -> Flush {
        Flush { how: How::Dir, root: root.to_path_buf(), rel: rel.to_path_buf() }
    }

    pub fn fs(root: &Path) -> Flush {
        Flush { how: How::Fs, root: root.to_path_buf(), rel: PathBuf::new() }
    }

    /// The full path (for messages and tests).
    pub fn path(&self) -> PathBuf {
        crate::meta::join(&self.root, &self.rel)
    }
}

/// A flush that failed: which, and the OS's answer.
#[derive(Debug, thiserror::Error)]
#[error("flush ({:?}) of {}: {source}", flush.how, flush.path().display())]
pub struct FlushError {
    pub flush: Flush,
    pub source: io::Error,
}

/// The seam over every wait for the disk in a commit: a batch, all of it durable when it
/// returns Ok. Tests record the batches (and what the filesystem looked like at each).
pub trait Flusher {
    fn flush(&mut self, batch: &[Flush]) -> Result<(), FlushError>;
}

/// A batch under construction: no duplicates, and the fallback to `syncfs`.
#[derive(Debug, Default)]
pub struct Batch {
    items: Vec<Flush>,
    seen: std::collections::HashSet<Flush>,
    /// Set when something in the batch cannot be fsynced: the batch is a `syncfs` of this.
    whole_fs: Option<PathBuf>,
}

impl Batch {
    pub fn push(&mut self, f: Flush) {
        if self.seen.insert(f.clone()) {
            self.items.push(f);
        }
    }

    pub fn extend(&mut self, fs: impl IntoIterator<Item = Flush>) {
        for f in fs {
            self.push(f);
        }
    }

    /// Something below `root` cannot be fsynced: flush the filesystem instead.
    pub fn need_fs(&mut self, root: &Path) {
        self.whole_fs.get_or_insert_with(|| root.to_path_buf());
    }

    /// Whether the batch is a `syncfs` already, whatever is added (planning can stop: a commit
    /// of 10,000 files need not list them to know it).
    pub fn settled(&self) -> bool {
        self.whole_fs.is_some() || self.items.len() > max_fsyncs()
    }

    /// The flushes, or one `syncfs` of `fs_root`'s filesystem if they cannot all be fsyncs or
    /// there are more than [`max_fsyncs`].
    pub fn finish(self, fs_root: &Path) -> Vec<Flush> {
        match self.whole_fs {
            Some(root) => vec![Flush::fs(&root)],
            None if self.items.len() > max_fsyncs() => vec![Flush::fs(fs_root)],
            None => self.items,
        }
    }
}

/// The directories `rel` is in, beneath its root: `a/b/c` → `a/b`, `a`, `` (the root).
fn parents(rel: &Path) -> impl Iterator<Item = &Path> {
    rel.ancestors().skip(1)
}

/// Batch 1: what must be durable before the commit record is written (see the module doc).
/// `state_root` holds the transaction's directories; `logs` are the caller's (the commit log);
/// `record_tmp` is the record under its temporary name (`journal_dir`-relative).
pub struct Before<'a> {
    pub state_root: &'a Path,
    pub upper: &'a Path,
    pub trash: &'a Path,
    pub logs: &'a [Flush],
    pub journal_dir: &'a Path,
    pub record_tmp: &'a Path,
}

pub fn before_record(b: &Before<'_>, steps: &[JournalStep]) -> io::Result<Vec<Flush>> {
    let mut batch = Batch::default();
    for js in steps {
        if batch.settled() {
            break;
        }
        let path = js.step.path();
        match &js.step {
            Step::Create { kind, .. } | Step::Replace { new: kind, .. } => {
                object(&mut batch, b.upper, path, *kind)?;
                batch.extend(parents(path).map(|p| Flush::dir(b.upper, p)));
            }
            // Its attributes are read from the upper directory when applied (again, by recovery).
            Step::DirMeta { .. } => {
                batch.push(Flush::dir(b.upper, path));
                batch.extend(parents(path).map(|p| Flush::dir(b.upper, p)));
            }
            // Moves a workspace object away: nothing of the transaction's is needed for it but
            // the trash, which is below.
            Step::Remove { .. } => {}
        }
    }
    // The way to the upper layer and the trash from the state directory, whose own entries
    // were made durable when it was set up (`StateDir::open`).
    for top in [b.upper, b.trash] {
        match top.strip_prefix(b.state_root) {
            Ok(rel) => {
                batch.push(Flush::dir(top, Path::new("")));
                batch.extend(parents(rel).filter(|p| !p.as_os_str().is_empty()).map(|p| Flush::dir(b.state_root, p)));
            }
            Err(_) => batch.need_fs(b.state_root),
        }
    }
    batch.extend(b.logs.iter().cloned());
    batch.push(Flush::file(b.journal_dir, b.record_tmp));
    Ok(batch.finish(b.upper))
}

/// The upper object `rel` of kind `kind`, and for a directory everything below it.
fn object(batch: &mut Batch, upper: &Path, rel: &Path, kind: Kind) -> io::Result<()> {
    match kind {
        Kind::File => batch.push(Flush::file(upper, rel)),
        Kind::Dir => {
            batch.push(Flush::dir(upper, rel));
            let dir = crate::meta::join(upper, rel);
            // In the directory's order, not sorted: a batch is a set, and one that settles on a
            // `syncfs` (a large tree) stops reading here instead of listing every entry first.
            for e in std::fs::read_dir(&dir)? {
                if batch.settled() {
                    break;
                }
                let e = e?;
                // The type from the directory entry (no stat unless the filesystem omits it).
                let ft = e.file_type()?;
                let kind = if ft.is_dir() {
                    Kind::Dir
                } else if ft.is_file() {
                    Kind::File
                } else if ft.is_symlink() {
                    Kind::Symlink
                } else {
                    Kind::Special
                };
                object(batch, upper, &rel.join(e.file_name()), kind)?;
            }
        }
        // A symlink has no descriptor to fsync; nothing else is ever moved (fixups removed it).
        Kind::Symlink | Kind::Special => batch.need_fs(upper),
    }
    Ok(())
}

/// Batch 3: what must be durable before the record may leave the journal (see the module doc):
/// derived from the record alone, so recovery, which does not know which steps a crash cut,
/// flushes the same.
pub fn after_apply(workspace: &Path, upper: &Path, trash: &Path, steps: &[JournalStep], logs: &[Flush]) -> Vec<Flush> {
    let mut batch = Batch::default();
    for js in steps {
        if batch.settled() {
            break;
        }
        let path = js.step.path();
        let parent = path.parent().unwrap_or(Path::new(""));
        match &js.step {
            Step::Remove { .. } => {
                batch.push(Flush::dir(workspace, parent));
                batch.push(Flush::dir(trash, Path::new("")));
            }
            Step::Create { kind, .. } | Step::Replace { new: kind, .. } => {
                batch.push(Flush::dir(workspace, parent));
                batch.push(Flush::dir(upper, parent));
                // A directory that moved between parents has a new `..`.
                if *kind == Kind::Dir {
                    batch.push(Flush::dir(workspace, path));
                }
            }
            Step::DirMeta { .. } => batch.push(Flush::dir(workspace, path)),
        }
    }
    batch.extend(logs.iter().cloned());
    batch.finish(workspace)
}

/// The flusher of a real commit: every flush of a batch, on up to [`THREADS`] threads at once
/// (the device then merges their cache flushes into few), the first error reported. The
/// calling thread flushes too; the others are [`helpers`], started once per process (starting
/// three threads and joining them cost ~0.1 ms per batch, two batches per commit).
#[derive(Debug, Default)]
pub struct Fsync;

impl Flusher for Fsync {
    fn flush(&mut self, batch: &[Flush]) -> Result<(), FlushError> {
        let shared = std::sync::Arc::new(Shared {
            roots: open_roots(batch)?,
            batch: batch.to_vec(),
            next: AtomicUsize::new(0),
            failed: Mutex::new(None),
            active: Mutex::new(0),
            idle: std::sync::Condvar::new(),
        });
        if batch.len() > 1 {
            if let Some(h) = helpers() {
                for _ in 1..batch.len().min(THREADS) {
                    h.offer(&shared);
                }
            }
        }
        // The calling thread works until nothing is left to take, so a batch never waits for a
        // helper that has not started: a helper only finishes what it took.
        shared.work();
        shared.wait_for_helpers();
        let failed = shared.failed.lock().map(|mut f| f.take());
        match failed {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(e),
            Err(_) => Err(FlushError { flush: batch[0].clone(), source: io::Error::other("a flush thread panicked") }),
        }
    }
}

/// One batch, shared by the thread that flushes it and the helpers that join in.
struct Shared {
    roots: Vec<(PathBuf, OwnedFd)>,
    batch: Vec<Flush>,
    /// The next flush to take.
    next: AtomicUsize,
    failed: Mutex<Option<FlushError>>,
    /// Helpers at work on this batch.
    active: Mutex<usize>,
    idle: std::sync::Condvar,
}

impl Shared {
    /// Take flushes and do them until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(f) = self.batch.get(i) else { break };
            let root = self.roots.iter().find(|(p, _)| *p == f.root).map(|(_, fd)| fd);
            let r = match root {
                Some(fd) => flush_one(fd, f),
                None => Err(io::ErrorKind::NotFound.into()),
            };
            if let Err(source) = r {
                if let Ok(mut slot) = self.failed.lock() {
                    slot.get_or_insert(FlushError { flush: f.clone(), source });
                }
            }
        }
    }

    /// A helper's part: join in if flushes are left (counted, under the lock the batch's own
    /// thread waits with), then work.
    fn help(&self) {
        {
            let Ok(mut active) = self.active.lock() else { return };
            if self.next.load(Ordering::Relaxed) >= self.batch.len() {
                return;
            }
            *active += 1;
        }
        // Counted down however `work` ends, a panic included, or the batch would wait forever.
        struct Done<'a>(&'a Shared);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                if let Ok(mut active) = self.0.active.lock() {
                    *active -= 1;
                }
                self.0.idle.notify_all();
            }
        }
        let _done = Done(self);
        self.work();
    }

    /// Once nothing is left to take: wait for the helpers still flushing what they took.
    fn wait_for_helpers(&self) {
        let Ok(mut active) = self.active.lock() else { return };
        while *active > 0 {
            match self.idle.wait(active) {
                Ok(a) => active = a,
                Err(_) => return,
            }
        }
    }
}

/// Threads that join in the batches of this process: `THREADS - 1` of them, started at the
/// first batch of more than one flush, for the process's life. None if not one could be
/// started, and None in a child forked after they were: the calling thread then flushes alone.
/// (Threads do not survive `fork`; a lock one of them held at that moment would stay locked in
/// the child for good, so the child must not touch their queue.)
fn helpers() -> Option<&'static Helpers> {
    // The process that started them, and how many it started.
    static STARTED: std::sync::OnceLock<(u32, usize)> = std::sync::OnceLock::new();
    let (pid, started) = *STARTED.get_or_init(|| {
        let spawn = || std::thread::Builder::new().name("txbox-fsync".into()).spawn(|| HELPERS.serve());
        (std::process::id(), (1..THREADS).filter(|_| spawn().is_ok()).count())
    });
    (started > 0 && pid == std::process::id()).then_some(&HELPERS)
}

static HELPERS: Helpers =
    Helpers { queue: Mutex::new(std::collections::VecDeque::new()), ready: std::sync::Condvar::new() };

/// Batches offered to the helpers. An entry whose flushes were all taken by the time a helper
/// looks costs it nothing, so the queue drains however busy they were.
struct Helpers {
    queue: Mutex<std::collections::VecDeque<std::sync::Arc<Shared>>>,
    ready: std::sync::Condvar,
}

impl Helpers {
    /// Ask one helper to join in `batch`.
    fn offer(&self, batch: &std::sync::Arc<Shared>) {
        if let Ok(mut q) = self.queue.lock() {
            q.push_back(std::sync::Arc::clone(batch));
        }
        self.ready.notify_one();
    }

    fn serve(&self) {
        loop {
            let job = {
                let Ok(mut q) = self.queue.lock() else { return };
                loop {
                    if let Some(job) = q.pop_front() {
                        break job;
                    }
                    q = match self.ready.wait(q) {
                        Ok(q) => q,
                        Err(_) => return,
                    };
                }
            };
            job.help();
        }
    }
}

/// Each distinct root of `batch`, opened once (O_PATH).
fn open_roots(batch: &[Flush]) -> Result<Vec<(PathBuf, OwnedFd)>, FlushError> {
    let mut roots: Vec<(PathBuf, OwnedFd)> = Vec::new();
    for f in batch {
        if roots.iter().any(|(p, _)| *p == f.root) {
            continue;
        }
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(&f.root, flags, Mode::empty())
            .map_err(|e| FlushError { flush: f.clone(), source: e.into() })?;
        roots.push((f.root.clone(), fd));
    }
    Ok(roots)
}

fn flush_one(root: &OwnedFd, f: &Flush) -> io::Result<()> {
    let flags = match f.how {
        How::Dir | How::Fs => OFlags::RDONLY | OFlags::DIRECTORY,
        How::File | How::Data => OFlags::RDONLY | OFlags::NONBLOCK,
    };
    let fd = open_beneath(root.as_fd(), &f.rel, flags, Mode::empty())?;
    match f.how {
        How::File | How::Dir => rustix::fs::fsync(&fd)?,
        How::Data => rustix::fs::fdatasync(&fd)?,
        How::Fs => rustix::fs::syncfs(&fd)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn js(step: Step) -> JournalStep {
        JournalStep { step, ino: 1, old_ino: 0 }
    }

    fn before<'a>(upper: &'a Path, logs: &'a [Flush]) -> Before<'a> {
        Before {
            state_root: Path::new("/st"),
            upper,
            trash: Path::new("/st/tx/a/trash"),
            logs,
            journal_dir: Path::new("/st/journal"),
            record_tmp: Path::new("a.commit.tmp"),
        }
    }

    fn has(plan: &[Flush], how: How, path: &str) -> bool {
        plan.iter().any(|f| f.how == how && f.path() == Path::new(path))
    }

    #[test]
    fn before_the_record_every_moved_file_its_upper_directories_the_tx_chain_the_logs_and_the_record() -> io::Result<()>
    {
        let upper = Path::new("/st/tx/a/upper");
        let logs = [Flush::data(Path::new("/st"), Path::new("locks/h.commits"))];
        let steps = [
            js(Step::Remove { path: "gone/x".into(), kind: Kind::File, slot: 0 }),
            js(Step::Create { path: "src/deep/new.rs".into(), kind: Kind::File }),
            js(Step::Replace { path: "top.txt".into(), new: Kind::File, old: Kind::File }),
            js(Step::DirMeta { path: "meta/d".into() }),
        ];
        let plan = before_record(&before(upper, &logs), &steps)?;
        for (how, p) in [
            (How::File, "/st/tx/a/upper/src/deep/new.rs"),
            (How::File, "/st/tx/a/upper/top.txt"),
            (How::Dir, "/st/tx/a/upper/src/deep"),
            (How::Dir, "/st/tx/a/upper/src"),
            (How::Dir, "/st/tx/a/upper"),
            (How::Dir, "/st/tx/a/upper/meta/d"),
            (How::Dir, "/st/tx/a/upper/meta"),
            (How::Dir, "/st/tx/a/trash"),
            (How::Dir, "/st/tx/a"),
            (How::Dir, "/st/tx"),
            (How::Data, "/st/locks/h.commits"),
            (How::File, "/st/journal/a.commit.tmp"),
        ] {
            assert!(has(&plan, how, p), "{how:?} {p} missing from {plan:#?}");
        }
        // Nothing of the workspace (a removal needs nothing before the record), nothing twice.
        assert!(!plan.iter().any(|f| f.path().to_string_lossy().contains("gone")), "{plan:#?}");
        assert_eq!(plan.len(), 12, "{plan:#?}");
        Ok(())
    }

    #[test]
    fn a_symlink_an_upper_outside_the_state_dir_or_too_many_flushes_fall_back_to_syncfs() -> io::Result<()> {
        let upper = Path::new("/st/tx/a/upper");
        let link = [js(Step::Create { path: "l".into(), kind: Kind::Symlink })];
        assert_eq!(before_record(&before(upper, &[]), &link)?, vec![Flush::fs(upper)]);
        let outside = Path::new("/elsewhere/upper");
        let file = [js(Step::Create { path: "f".into(), kind: Kind::File })];
        assert!(matches!(before_record(&before(outside, &[]), &file)?.as_slice(), [f] if f.how == How::Fs));
        let many: Vec<_> =
            (0..MAX_FSYNCS).map(|i| js(Step::Create { path: format!("f{i}").into(), kind: Kind::File })).collect();
        assert!(matches!(before_record(&before(upper, &[]), &many)?.as_slice(), [f] if f.how == How::Fs));
        let few = &many[..MAX_FSYNCS - 8];
        assert!(before_record(&before(upper, &[]), few)?.iter().all(|f| f.how != How::Fs));
        Ok(())
    }

    #[test]
    fn after_applying_both_directories_of_every_rename_moved_directories_attributes_and_logs() {
        let (ws, up, trash) = (Path::new("/w"), Path::new("/st/tx/a/upper"), Path::new("/st/tx/a/trash"));
        let logs = [Flush::data(Path::new("/st"), Path::new("audit.log"))];
        let steps = [
            js(Step::Remove { path: "old/x".into(), kind: Kind::File, slot: 0 }),
            js(Step::Create { path: "a/b/new".into(), kind: Kind::Dir }),
            js(Step::Replace { path: "r.txt".into(), new: Kind::File, old: Kind::File }),
            js(Step::DirMeta { path: "m".into() }),
        ];
        let plan = after_apply(ws, up, trash, &steps, &logs);
        for p in
            ["/w/old", "/st/tx/a/trash", "/w/a/b", "/st/tx/a/upper/a/b", "/w/a/b/new", "/w", "/st/tx/a/upper", "/w/m"]
        {
            assert!(has(&plan, How::Dir, p), "{p} missing from {plan:#?}");
        }
        assert!(has(&plan, How::Data, "/st/audit.log"));
        assert_eq!(plan.len(), 9, "{plan:#?}");
    }

    #[test]
    fn a_new_directory_is_flushed_with_everything_below_it() -> io::Result<()> {
        let root = std::env::temp_dir().join(format!("txbox-durable-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let upper = root.join("tx/a/upper");
        std::fs::create_dir_all(upper.join("gen/sub"))?;
        std::fs::write(upper.join("gen/one"), "1")?;
        std::fs::write(upper.join("gen/sub/two"), "2")?;
        let b = Before { state_root: &root, trash: &root.join("tx/a/trash"), ..before(&upper, &[]) };
        let plan = before_record(&b, &[js(Step::Create { path: "gen".into(), kind: Kind::Dir })])?;
        for (how, rel) in [(How::Dir, "gen"), (How::File, "gen/one"), (How::Dir, "gen/sub"), (How::File, "gen/sub/two")]
        {
            assert!(plan.contains(&Flush { how, root: upper.clone(), rel: rel.into() }), "{rel} missing: {plan:#?}");
        }
        std::os::unix::fs::symlink("one", upper.join("gen/sub/link"))?;
        let plan = before_record(&b, &[js(Step::Create { path: "gen".into(), kind: Kind::Dir })])?;
        assert_eq!(plan, vec![Flush::fs(&upper)], "a symlink inside makes it a syncfs");
        std::fs::remove_dir_all(&root)
    }

    #[test]
    fn the_real_flusher_syncs_files_directories_and_reports_what_failed() -> io::Result<()> {
        let root = std::env::temp_dir().join(format!("txbox-durable-real-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("d"))?;
        std::fs::write(root.join("d/f"), "x")?;
        let ok =
            [Flush::file(&root, Path::new("d/f")), Flush::dir(&root, Path::new("d")), Flush::dir(&root, Path::new(""))];
        Fsync.flush(&ok).map_err(|e| e.source)?;
        Fsync.flush(&[Flush::fs(&root)]).map_err(|e| e.source)?;
        let missing = [Flush::dir(&root, Path::new("d")), Flush::dir(&root, Path::new("gone"))];
        let e = Fsync.flush(&missing).err().map(|e| e.flush.rel);
        assert_eq!(e, Some(PathBuf::from("gone")));
        // Beneath its root: a symlink is never followed.
        std::os::unix::fs::symlink("/", root.join("up"))?;
        assert!(Fsync.flush(&[Flush::dir(&root, Path::new("up"))]).is_err());
        std::fs::remove_dir_all(&root)
    }

    /// A process forked after the helpers started flushes alone: their threads are not in it,
    /// and their queue's lock, held by one of them at the fork, would never be let go there.
    #[test]
    fn a_forked_child_flushes_without_the_parents_helpers() -> io::Result<()> {
        let root = std::env::temp_dir().join(format!("txbox-durable-fork-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        std::fs::write(root.join("a"), "x")?;
        std::fs::write(root.join("b"), "y")?;
        let batch = vec![Flush::file(&root, Path::new("a")), Flush::file(&root, Path::new("b"))];
        // The helpers are started, and their queue is locked at the fork, as a helper taking a
        // batch would hold it.
        Fsync.flush(&batch).map_err(|e| e.source)?;
        assert!(helpers().is_some(), "no helper started: the test shows nothing");
        let held = HELPERS.queue.lock().map_err(|_| io::Error::other("poisoned"))?;
        // SAFETY: the child flushes the batch (fsync, allocation: glibc's allocator is reset for
        // a forked child) and leaves with _exit; an alarm ends it if it hangs on the lock.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: async-signal-safe calls in the forked child, which never returns.
            unsafe {
                libc::alarm(10);
                libc::_exit(if Fsync.flush(&batch).is_ok() { 0 } else { 1 });
            }
        }
        drop(held);
        assert!(pid > 0, "fork: {}", io::Error::last_os_error());
        let mut status = 0;
        // SAFETY: waiting for the child just forked, into a local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child's flush hung or failed: status {status:#x}"
        );
        std::fs::remove_dir_all(&root)
    }

    /// Batches from several threads at once (as `serve` commits), through the one set of
    /// helpers: every one finishes, and each reports its own failure, wherever it was flushed.
    #[test]
    fn batches_from_many_threads_share_the_helpers() -> io::Result<()> {
        let root = std::env::temp_dir().join(format!("txbox-durable-many-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        for i in 0..6 {
            std::fs::write(root.join(format!("f{i}")), "x")?;
        }
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let root = root.clone();
                std::thread::spawn(move || {
                    for round in 0..30 {
                        let mut batch: Vec<Flush> =
                            (0..6).map(|i| Flush::file(&root, Path::new(&format!("f{i}")))).collect();
                        // Every third round of each thread, one flush fails, at a place that
                        // moves through the batch.
                        let bad = (round % 3 == 0).then(|| (round + t) % 7);
                        if let Some(at) = bad {
                            batch.insert(at.min(batch.len()), Flush::file(&root, Path::new(&format!("gone-{t}"))));
                        }
                        let r = Fsync.flush(&batch);
                        match bad {
                            None => assert!(r.is_ok(), "thread {t} round {round}: {r:?}"),
                            Some(_) => assert_eq!(
                                r.err().map(|e| e.flush.rel),
                                Some(PathBuf::from(format!("gone-{t}"))),
                                "thread {t} round {round}"
                            ),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().is_ok(), "a flushing thread panicked");
        }
        std::fs::remove_dir_all(&root)
    }
}
