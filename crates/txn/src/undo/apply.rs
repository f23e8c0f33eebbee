//! The undo executor: write the undo record (the commit point), apply its steps, keep what
//! undoing the undo needs, consume what it undid, mark it applied. Every step checks on the
//! private side (this undo's trash, the retained data) whether it already happened, so applying
//! a record again completes exactly what is missing: that is recovery ([`recover_pending`]).
//!
//! Crash windows:
//! - before the record is durable: nothing changed; recovery discards the undo's directory;
//! - after it, while applying: recovery applies the rest;
//! - after applying: the undo's `retained` file, its move to `kept/`, the `consumed` marks of
//!   what it undid and the record's move into its directory are each done at most once, in this
//!   order; recovery does what is missing and asks for a recount of the retention totals.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};

use crate::beneath::Beneath;
use crate::commit::CrashHook;
use crate::fsx;
use crate::layout;
use crate::meta::Kind;
use crate::retain::files::{read_sealed, write_sealed, DirAttrs, Retained, RetainedKind};
use crate::retain::index::Index;
use crate::retain::{self, attrs_at, fingerprint_of_stat};
use crate::seal::Domain;
use crate::session::Fingerprint;
use crate::state::StateDir;
use crate::undo::plan::View;
use crate::undo::record::{Src, UndoOp, UndoRecord};
use crate::undo::UndoError;

fn io_at<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> UndoError + 'a {
    move |source| UndoError::Io { step, path: path.to_path_buf(), source }
}

fn errno_at<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(rustix::io::Errno) -> UndoError + 'a {
    move |e| UndoError::Io { step, path: path.to_path_buf(), source: e.into() }
}

pub(crate) fn tick(hook: &mut CrashHook) -> Result<(), UndoError> {
    hook.tick().map_err(|_| UndoError::Injected(hook.calls()))
}

/// Parent directories of retained objects, opened beneath `kept/` (a bounded cache).
struct Store {
    kept: OwnedFd,
    dirs: HashMap<PathBuf, OwnedFd>,
}

impl Store {
    fn open(state: &StateDir) -> Result<Store, UndoError> {
        Ok(Store { kept: retain::kept_dir(state)?, dirs: HashMap::new() })
    }

    /// The directory holding `src` and its name there.
    fn parent(&mut self, src: &Src) -> io::Result<(BorrowedFd<'_>, OsString)> {
        let rel = src.beneath_kept();
        let name = rel.file_name().map(OsStr::to_os_string).ok_or(io::ErrorKind::InvalidInput)?;
        let dir = rel.parent().map(Path::to_path_buf).unwrap_or_default();
        if !self.dirs.contains_key(&dir) {
            if self.dirs.len() >= 256 {
                self.dirs.clear();
            }
            let fd = fsx::dir_beneath(self.kept.as_fd(), &dir)?;
            self.dirs.insert(dir.clone(), fd);
        }
        match self.dirs.get(&dir) {
            Some(fd) => Ok((fd.as_fd(), name)),
            None => Err(io::Error::other("directory cache lost an entry")),
        }
    }

    fn stat(&mut self, src: &Src) -> io::Result<Option<rustix::fs::Stat>> {
        let (dir, name) = match self.parent(src) {
            Ok(p) => p,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => return Ok(None),
            Err(e) => return Err(e),
        };
        match rustix::fs::statat(dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// The planner's view of the real workspace and retained data.
pub(crate) struct RealView {
    ws: Beneath,
    store: Store,
}

impl RealView {
    pub(crate) fn open(state: &StateDir, workspace: &Path) -> Result<RealView, UndoError> {
        Ok(RealView {
            ws: Beneath::open(workspace).map_err(io_at("open workspace", workspace))?,
            store: Store::open(state)?,
        })
    }
}

impl View for RealView {
    fn stat(&mut self, rel: &Path) -> io::Result<Option<Fingerprint>> {
        if rel.as_os_str().is_empty() {
            return Ok(Some(fingerprint_of_stat(&rustix::fs::fstat(self.ws.root())?)));
        }
        let (dir, name) = match self.ws.parent(rel) {
            Ok(p) => p,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => return Ok(None),
            Err(e) => return Err(e),
        };
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(fingerprint_of_stat(&st))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn list_stat(&mut self, rel: &Path) -> io::Result<Vec<(OsString, Fingerprint)>> {
        let fd = fsx::open_beneath(self.ws.root(), rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        let mut out = Vec::new();
        for name in fsx::list(fd.as_fd())? {
            match rustix::fs::statat(&fd, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => out.push((name, fingerprint_of_stat(&st))),
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    fn attrs(&mut self, rel: &Path) -> io::Result<DirAttrs> {
        attrs_at(&self.ws, rel)
    }

    fn stat_kept(&mut self, src: &Src) -> io::Result<Option<Fingerprint>> {
        Ok(self.store.stat(src)?.map(|st| fingerprint_of_stat(&st)))
    }

    fn attrs_kept(&mut self, src: &Src) -> io::Result<DirAttrs> {
        let fd = fsx::open_beneath(
            self.store.kept.as_fd(),
            &src.beneath_kept(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )?;
        DirAttrs::of(fd.as_fd())
    }
}

/// Write `rec` durably as `journal/<id>.undo`: temporary file, fsync, rename, fsync of the
/// directory. When this returns Ok the undo is committed.
pub(crate) fn write_record(state: &StateDir, rec: &UndoRecord) -> Result<(), UndoError> {
    let journal = state.dir(layout::JOURNAL)?;
    let name = layout::undo_record_name(&rec.tx);
    let tmp = format!("{name}{}", layout::TMP_SUFFIX);
    let path = state.root.join(layout::JOURNAL).join(&name);
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&journal, tmp.as_str(), flags, Mode::from_raw_mode(0o600))
        .map_err(errno_at("write undo record", &path))?;
    fsx::write_all(&fd, rec.render(state.seal()).as_bytes()).map_err(io_at("write undo record", &path))?;
    rustix::fs::fsync(&fd).map_err(errno_at("write undo record", &path))?;
    drop(fd);
    rustix::fs::renameat(&journal, tmp.as_str(), &journal, name.as_str())
        .map_err(errno_at("write undo record", &path))?;
    fsx::sync_dir(journal.as_fd()).map_err(io_at("sync journal", &path))
}

/// This undo's own directory: `tx/<id>` while it runs, `kept/<id>` once it is kept. The bool
/// says which (true: still in `tx/`).
fn own_dir(state: &StateDir, id: &str) -> Result<(OwnedFd, bool), UndoError> {
    match fsx::dir_beneath(state.fd(), &Path::new(layout::TX).join(id)) {
        Ok(fd) => return Ok((fd, true)),
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(io_at("open undo directory", &state.tx_dir(id))(e));
        }
        Err(_) => {}
    }
    let kept = state.root.join(layout::KEPT).join(id);
    fsx::dir_beneath(state.fd(), &Path::new(layout::KEPT).join(id))
        .map(|fd| (fd, false))
        .map_err(|e| UndoError::Damaged(format!("undo {id}: its directory is gone ({}: {e})", kept.display())))
}

/// Apply every step of `rec` not applied yet, then flush the workspace's filesystem.
pub(crate) fn apply_ops(state: &StateDir, rec: &UndoRecord, hook: &mut CrashHook) -> Result<(), UndoError> {
    let mut ws = Beneath::open(&rec.workspace).map_err(io_at("open workspace", &rec.workspace))?;
    let mut store = Store::open(state)?;
    let (own, _) = own_dir(state, &rec.tx)?;
    let trash =
        fsx::dir_beneath(own.as_fd(), Path::new(layout::TRASH)).map_err(io_at("open undo trash", &rec.workspace))?;
    for op in &rec.ops {
        apply_op(&mut ws, &mut store, trash.as_fd(), op, hook)?;
    }
    let root = rustix::fs::openat(ws.root(), ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(errno_at("open workspace", &rec.workspace))?;
    rustix::fs::syncfs(&root).map_err(errno_at("syncfs", &rec.workspace))
}

fn ws_stat(ws: &mut Beneath, path: &Path) -> Result<Option<rustix::fs::Stat>, UndoError> {
    let (dir, name) = ws.parent(path).map_err(io_at("open parent", path))?;
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(errno_at("stat workspace", path)(e)),
    }
}

fn apply_op(
    ws: &mut Beneath,
    store: &mut Store,
    trash: BorrowedFd<'_>,
    op: &UndoOp,
    hook: &mut CrashHook,
) -> Result<(), UndoError> {
    let conflict = |path: &Path, what: &str| UndoError::Conflict { path: path.to_path_buf(), what: what.to_string() };
    match op {
        UndoOp::Remove { path, kind, ino, slot } => {
            let slot = slot.to_string();
            if rustix::fs::statat(trash, slot.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| st.st_ino == *ino) {
                return Ok(());
            }
            if ws_stat(ws, path)?.is_none_or(|st| st.st_ino != *ino) {
                return Err(conflict(path, "changed before it was removed"));
            }
            tick(hook)?;
            let (dir, name) = ws.parent(path).map_err(io_at("open parent", path))?;
            rustix::fs::renameat_with(dir, name, trash, slot.as_str(), RenameFlags::NOREPLACE)
                .map_err(errno_at("remove (rename to trash)", path))?;
            if *kind == Kind::Dir {
                ws.forget(path);
            }
        }
        UndoOp::Restore { path, src, .. } => {
            // Rename first, look second (as a commit's creation): the planner saw the retained
            // object with its inode under the retention lock; a restore already applied (by an
            // earlier run of this record) fails here with ENOENT for the moved source, and
            // nothing else takes from the retained data of a pending undo. One call, not two.
            tick(hook)?;
            let (sdir, sname) = store.parent(src).map_err(io_at("open retained data", path))?;
            let (dir, name) = ws.parent(path).map_err(io_at("open parent", path))?;
            match rustix::fs::renameat_with(sdir, sname.as_os_str(), dir, name, RenameFlags::NOREPLACE) {
                Ok(()) => {}
                Err(rustix::io::Errno::NOENT) => {
                    if store.stat(src).map_err(io_at("stat retained object", path))?.is_some() {
                        return Err(conflict(path, "its directory was removed meanwhile"));
                    }
                }
                Err(rustix::io::Errno::EXIST) => return Err(conflict(path, "created by someone else meanwhile")),
                Err(e) => return Err(errno_at("restore (rename into workspace)", path)(e)),
            }
        }
        UndoOp::Exchange { path, kind, ino, src, src_kind, src_ino } => {
            match store.stat(src).map_err(io_at("stat retained object", path))? {
                Some(st) if st.st_ino == *ino => return Ok(()),
                Some(st) if st.st_ino == *src_ino => {}
                _ => return Err(UndoError::Damaged(format!("the retained copy of {} is missing", path.display()))),
            }
            if ws_stat(ws, path)?.is_none_or(|st| st.st_ino != *ino) {
                return Err(conflict(path, "changed before it was exchanged back"));
            }
            tick(hook)?;
            let (sdir, sname) = store.parent(src).map_err(io_at("open retained data", path))?;
            let (dir, name) = ws.parent(path).map_err(io_at("open parent", path))?;
            rustix::fs::renameat_with(sdir, sname.as_os_str(), dir, name, RenameFlags::EXCHANGE)
                .map_err(errno_at("exchange back", path))?;
            if *kind == Kind::Dir || *src_kind == Kind::Dir {
                ws.forget(path);
            }
        }
        UndoOp::Attrs { path, ino, set, .. } => {
            let fd = fsx::open_beneath(ws.root(), path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .map_err(io_at("open directory", path))?;
            if rustix::fs::fstat(&fd).map_err(errno_at("stat directory", path))?.st_ino != *ino {
                return Err(conflict(path, "replaced before its attributes were set back"));
            }
            tick(hook)?;
            set.apply(fd.as_fd()).map_err(io_at("set attributes back", path))?;
        }
    }
    Ok(())
}

/// After the record is durable: apply it, keep what undoing this undo needs, consume what it
/// undid, mark it applied. `idx` is held by the caller. `recovering`: a recovery, which may
/// repeat a totals change: a recount is asked for.
pub(crate) fn finish(
    state: &StateDir,
    idx: &Index<'_>,
    rec: &UndoRecord,
    generation: Option<u64>,
    hook: &mut CrashHook,
    recovering: bool,
) -> Result<(), UndoError> {
    apply_ops(state, rec, hook)?;
    let id = rec.tx.as_str();
    let (own, in_tx) = own_dir(state, id)?;
    let verified = matches!(
        read_sealed(own.as_fd(), Path::new(layout::RETAINED), state.seal(), Domain::Retained, id, 1 << 30),
        Ok(Some(_))
    );
    let pending = rec.ops.iter().any(|op| matches!(op, UndoOp::Remove { .. }));
    if !verified {
        let retained = taken_after(state, rec, own.as_fd(), generation, pending)?;
        tick(hook)?;
        write_sealed(own.as_fd(), layout::RETAINED, state.seal(), Domain::Retained, id, &retained.render(), false)
            .map_err(io_at("write retained", &state.tx_dir(id)))?;
    }
    drop(own);
    if in_tx {
        idx.append(id)?;
        tick(hook)?;
        let txs = state.dir(layout::TX)?;
        fsx::rename_noreplace(txs.as_fd(), OsStr::new(id), idx.kept(), OsStr::new(id))
            .map_err(io_at("move to kept", &state.tx_dir(id)))?;
        idx.adjust(1, 0)?;
        if pending {
            idx.add_pending(id)?;
        }
    }
    for undone in &rec.undoes {
        let marker = Path::new(undone).join(layout::CONSUMED);
        if rustix::fs::statat(idx.kept(), marker.as_path(), AtFlags::SYMLINK_NOFOLLOW).is_ok() {
            continue;
        }
        tick(hook)?;
        let dir = fsx::dir_beneath(idx.kept(), Path::new(undone))
            .map_err(io_at("mark undone", &state.root.join(layout::KEPT).join(undone)))?;
        fsx::replace(dir.as_fd(), layout::CONSUMED, format!("{id}\n").as_bytes(), false)
            .map_err(io_at("mark undone", &state.root.join(layout::KEPT).join(undone)))?;
        idx.adjust(-1, 0)?;
    }
    tick(hook)?;
    let journal = state.dir(layout::JOURNAL)?;
    let name = layout::undo_record_name(id);
    let keep = Path::new(id).join(layout::KEPT_RECORD);
    match rustix::fs::renameat(&journal, name.as_str(), idx.kept(), keep.as_path()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(errno_at("keep undo record", &state.root.join(layout::JOURNAL).join(&name))(e)),
    }
    fsx::sync_dir(journal.as_fd()).map_err(io_at("sync journal", &state.root.join(layout::JOURNAL)))?;
    if recovering {
        idx.flag_recount()?;
    }
    Ok(())
}

/// What undoing this undo needs, taken once it is applied.
fn taken_after(
    state: &StateDir,
    rec: &UndoRecord,
    own: BorrowedFd<'_>,
    generation: Option<u64>,
    pending: bool,
) -> Result<Retained, UndoError> {
    let mut ws = Beneath::open(&rec.workspace).map_err(io_at("open workspace", &rec.workspace))?;
    let mut post = std::collections::BTreeMap::new();
    let mut after = std::collections::BTreeMap::new();
    for (i, op) in rec.ops.iter().enumerate() {
        match op {
            UndoOp::Restore { path, kind, ino, .. } | UndoOp::Exchange { path, src_kind: kind, src_ino: ino, .. } => {
                // A later step of the same undo may have moved the object on (undoing several
                // transactions: a file put back, then its directory removed). Undoing this undo
                // puts it back first and then compares it by inode only: kind and inode suffice.
                let fp = match ws_stat(&mut ws, path) {
                    Ok(Some(st)) if st.st_ino == *ino => fingerprint_of_stat(&st),
                    Ok(_) | Err(UndoError::Io { .. }) => {
                        Fingerprint::Present { kind: *kind, ino: *ino, mtime_ns: 0, ctime_ns: 0, size: 0 }
                    }
                    Err(e) => return Err(e),
                };
                post.insert(i, fp);
            }
            UndoOp::Attrs { path, .. } => {
                after.insert(i, attrs_at(&ws, path).map_err(io_at("read attributes", path))?);
            }
            UndoOp::Remove { .. } => {}
        }
    }
    let threshold_ns = retain::stamp(own, 0, pending).map_err(io_at("write bytes", &state.tx_dir(&rec.tx)))?;
    let mut parts = vec![rec.tx.clone()];
    parts.extend(rec.parts.iter().filter(|p| **p != rec.tx).cloned());
    Ok(Retained {
        kind: RetainedKind::Undo,
        workspace: rec.workspace.clone(),
        generation: generation.unwrap_or_else(|| retain::generation_of(state, &rec.workspace, &rec.tx)),
        time_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        threshold_ns,
        kept_only: false,
        parts,
        undoes: rec.undoes.clone(),
        post,
        after,
        restat: Default::default(),
    })
}

/// An undo recovery finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredUndo {
    pub tx: String,
    pub workspace: PathBuf,
    /// What it changed, by step.
    pub changes: crate::audit::Counts,
    /// When its record was written (its commit point), in ms since the epoch.
    pub committed_ms: u64,
}

/// Finish undos cut short by a crash (records in the journal): of `workspace` only (the caller
/// holds its lock), or of every workspace, each locked in turn. Temporary records whose writer
/// is gone are removed. Returns the undos finished.
pub fn recover_pending(
    state: &StateDir,
    workspace: Option<&Path>,
    hook: &mut CrashHook,
    looked_at: &mut usize,
) -> Result<Vec<RecoveredUndo>, UndoError> {
    let journal = state.dir(layout::JOURNAL)?;
    let names = fsx::list(journal.as_fd()).map_err(io_at("list journal", &state.root.join(layout::JOURNAL)))?;
    let mut out = Vec::new();
    for name in names {
        let Some((id, tmp)) = layout::undo_record_id(&name) else { continue };
        *looked_at += 1;
        if tmp {
            let rel = Path::new(layout::TX).join(id).join(layout::OWNER_LOCK);
            if !fsx::is_locked(state.fd(), &rel) {
                let _ = rustix::fs::unlinkat(&journal, name.as_os_str(), AtFlags::empty());
            }
            continue;
        }
        let Some(rec) = read_pending(state, id)? else { continue };
        if workspace.is_some_and(|w| w != rec.workspace) {
            continue;
        }
        let _lock = match workspace {
            Some(_) => None,
            None => Some(state.lock_workspace(&rec.workspace)?),
        };
        // Its undo may have finished while we waited for the lock.
        let Some(rec) = read_pending(state, id)? else { continue };
        let committed_ms = rustix::fs::statat(&journal, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map(|st| u64::try_from(st.st_mtime).unwrap_or(0) * 1000 + st.st_mtime_nsec / 1_000_000)
            .unwrap_or(0);
        let idx = Index::lock(state)?;
        finish(state, &idx, &rec, None, hook, true)?;
        out.push(RecoveredUndo {
            tx: rec.tx.clone(),
            workspace: rec.workspace.clone(),
            changes: rec.counts(),
            committed_ms,
        });
    }
    Ok(out)
}

/// A pending undo record, verified; None if it is gone (finished meanwhile).
fn read_pending(state: &StateDir, id: &str) -> Result<Option<UndoRecord>, UndoError> {
    let journal = state.dir(layout::JOURNAL)?;
    let name = layout::undo_record_name(id);
    let path = state.root.join(layout::JOURNAL).join(&name);
    let text = match fsx::read_small(journal.as_fd(), Path::new(&name), 1 << 30) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(UndoError::Journal(format!("{}: {e} (not a record txbox wrote; delete it)", path.display())))
        }
    };
    let links = rustix::fs::statat(&journal, name.as_str(), AtFlags::SYMLINK_NOFOLLOW).map(|s| s.st_nlink).unwrap_or(0);
    if links > 1 {
        return Err(UndoError::Journal(format!(
            "{}: hard-linked, not a record txbox wrote; delete it",
            path.display()
        )));
    }
    let rec = UndoRecord::parse(&text, state.seal(), id).map_err(|what| {
        UndoError::Journal(format!(
            "undo record {} does not verify ({what}): damaged, forged, or not written by txbox for this \
             transaction of this state directory; refusing to guess: inspect it, and delete it if you did not expect it",
            path.display()
        ))
    })?;
    // Replayed: an undo that is over has no directory in `tx/` and its record in `kept/`.
    let in_tx = fsx::dir_beneath(state.fd(), &Path::new(layout::TX).join(id)).is_ok();
    let kept_unfinished = fsx::dir_beneath(state.fd(), &Path::new(layout::KEPT).join(id)).is_ok()
        && rustix::fs::statat(
            state.fd(),
            Path::new(layout::KEPT).join(id).join(layout::KEPT_RECORD).as_path(),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .is_err();
    if !in_tx && !kept_unfinished {
        return Err(UndoError::Journal(format!(
            "{}: its undo no longer exists (an old record put back?); delete it",
            path.display()
        )));
    }
    Ok(Some(rec))
}
