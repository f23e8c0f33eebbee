//! The commit executor: prepare, check, write the commit point, apply, finish. And recovery,
//! which is the same apply run again.
//!
//! Crash windows and why each is safe:
//! - before the record is durable: the workspace is untouched; recovery discards the tx;
//! - after it: every step checks by inode whether it already happened, so applying the record
//!   again (recovery) completes exactly the missing steps; replaced objects wait in the upper
//!   layer (swapped there by `RENAME_EXCHANGE`) and deleted ones in the trash until cleanup;
//! - after the final sync: the record is moved into the transaction's directory as `applied`
//!   (the "applied" mark); a crash before that directory is removed leaves garbage that
//!   recovery removes, knowing from `applied` that the transaction landed. A transaction
//!   prepared for undo is kept instead, `applied` and all ([`crate::retain`]).
//!
//! An error is no crash, but after the commit point it is handled like one (#14.1): nothing the
//! record needs is removed, and the caller is told the change is committed and left for
//! recovery ([`CommitError::Unfinished`]). What can be known to fail is checked before the
//! commit point instead ([`crate::check`]): permissions, descriptors, space.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, OFlags, RenameFlags, Timestamps};

use crate::beneath::Beneath;
use crate::changeset::{ChangeSet, Fixup};
use crate::check::{self, Attrs, Denied, Permissions};
use crate::durable::{self, Flush, FlushError, Flusher, Fsync};
use crate::journal::{self, CommitRecord, JournalError, JournalStep};
use crate::meta::{self, Kind};
use crate::plan::{self, Step};

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("commit step `{step}` on {path}: {source}")]
    Io { step: &'static str, path: PathBuf, source: io::Error },
    #[error("{path} changed in the workspace during the transaction ({what}); nothing was applied")]
    Conflict { path: PathBuf, what: String },
    #[error("cannot commit {}: {why}; nothing was applied", shown(path))]
    NotPermitted { path: PathBuf, why: String },
    #[error("{0}; nothing was applied")]
    NoRoom(String),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("commit stopped by the crash-injection hook after {0} mutating calls")]
    Injected(usize),
    /// Past the commit point: the transaction is committed, applying it stopped, and recovery
    /// applies the rest (the record and everything it needs are kept).
    #[error(
        "the change is committed, but applying it stopped: {source}. It is finished by recovery, which \
         every txbox command on this workspace runs first (or `txbox recover`){}",
        needs(source)
    )]
    Unfinished { source: Box<CommitError> },
}

impl CommitError {
    /// Whether the transaction passed its commit point (it lands, now or by recovery).
    pub fn committed(&self) -> bool {
        matches!(self, CommitError::Unfinished { .. })
    }

    /// The OS error underneath, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            CommitError::Io { source, .. } => source.raw_os_error(),
            CommitError::Journal(JournalError::Io { source, .. } | JournalError::InPlace { source, .. }) => {
                source.raw_os_error()
            }
            CommitError::Unfinished { source } => source.errno(),
            _ => None,
        }
    }
}

fn shown(path: &Path) -> String {
    let s = meta::display_rel(path);
    if s.is_empty() {
        "the workspace root".to_string()
    } else {
        format!("`{s}`")
    }
}

/// What recovery needs to get past `e`, as a clause for a message ("" when nothing particular).
pub fn needs(e: &CommitError) -> &'static str {
    match e.errno() {
        Some(libc::ENOSPC | libc::EDQUOT) => "; it needs free space on the workspace's filesystem",
        Some(libc::EMFILE | libc::ENFILE) => "; it needs more file descriptors (raise `ulimit -n`)",
        Some(libc::EACCES | libc::EPERM) => "; it needs permission to change the path named",
        Some(libc::EROFS) => "; it needs the workspace's filesystem writable",
        Some(libc::EIO) => "; the filesystem reported an I/O error: check the disk",
        _ => "",
    }
}

fn io_err<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CommitError + 'a {
    move |source| CommitError::Io { step, path: path.to_path_buf(), source }
}

impl From<FlushError> for CommitError {
    fn from(e: FlushError) -> CommitError {
        CommitError::Io { step: "flush", path: e.flush.path(), source: e.source }
    }
}

/// What a commit makes durable besides its own objects, and the seam that does it
/// ([`crate::durable`]).
pub struct Durability<'a> {
    /// Flushed before the commit record is written (the workspace's commit log).
    pub before: Vec<Flush>,
    /// Flushed after applying, before the record leaves the journal (the audit log and head).
    pub after: Vec<Flush>,
    pub flusher: &'a mut dyn Flusher,
}

/// Counts mutating filesystem calls and stops the commit after the N-th one: the test hook that
/// lets crash-injection tests cut a commit at every point. `TXBOX_CRASH_AFTER=N` sets it for a
/// real process, which then exits at once as if killed.
#[derive(Debug, Default)]
pub struct CrashHook {
    pub stop_after: Option<usize>,
    pub exit_process: bool,
    /// Called with (steps applied, steps in all) while a record is applied; front ends use it
    /// to draw progress for long commits.
    pub progress: Option<fn(usize, usize)>,
    calls: usize,
}

impl CrashHook {
    pub fn from_env() -> CrashHook {
        let stop_after = std::env::var("TXBOX_CRASH_AFTER").ok().and_then(|v| v.parse().ok());
        CrashHook { stop_after, exit_process: stop_after.is_some(), progress: None, calls: 0 }
    }

    pub fn after(n: usize) -> CrashHook {
        CrashHook { stop_after: Some(n), exit_process: false, progress: None, calls: 0 }
    }

    /// One more point where a crash may strike: before a mutating call, or between two phases
    /// a crash could separate (the audit append, the cleanup after a commit).
    pub fn tick(&mut self) -> Result<(), CommitError> {
        self.calls += 1;
        if self.stop_after.is_some_and(|n| self.calls >= n) {
            if self.exit_process {
                // Simulates SIGKILL: no destructors, no cleanup.
                std::process::exit(137);
            }
            return Err(CommitError::Injected(self.calls));
        }
        Ok(())
    }

    pub fn calls(&self) -> usize {
        self.calls
    }
}

/// Where a transaction's pieces live, for one commit.
pub struct CommitTarget<'a> {
    pub tx: &'a str,
    pub workspace: &'a Path,
    pub upper: &'a Path,
    pub trash: &'a Path,
    pub record: &'a Path,
    /// Seals the record for its state directory (`StateDir::seal`).
    pub seal: &'a crate::seal::Seal,
    /// Frees space when the filesystem is full (the state directory's reserve,
    /// `StateDir::release_reserve`); true if it freed some, and the failed step is tried again.
    pub relief: Option<&'a dyn Fn() -> bool>,
}

/// Commit `cs` (classified from `target.upper`) into the workspace. On Ok the change set is in
/// the workspace and durable. On Err the transaction is not committed and nothing was changed,
/// except for [`CommitError::Unfinished`]: committed, and recovery applies the rest.
/// `at_commit_point` runs once the record is durable, before anything is applied (the audit
/// entry is appended there, and made durable by the commit's flush after applying).
pub fn commit(
    target: &CommitTarget<'_>,
    cs: &ChangeSet,
    hook: &mut CrashHook,
    at_commit_point: &mut dyn FnMut(),
) -> Result<(), CommitError> {
    let mut fsync = Fsync;
    let mut d = Durability { before: Vec::new(), after: Vec::new(), flusher: &mut fsync };
    commit_with(target, cs, hook, at_commit_point, &mut d)
}

/// [`commit`], flushing `d.before` with the content before the record and `d.after` with the
/// applied steps, every flush through `d.flusher`.
pub fn commit_with(
    target: &CommitTarget<'_>,
    cs: &ChangeSet,
    hook: &mut CrashHook,
    at_commit_point: &mut dyn FnMut(),
    d: &mut Durability<'_>,
) -> Result<(), CommitError> {
    let steps = plan::plan(cs);
    if steps.is_empty() {
        return Ok(());
    }
    // 1. Repair the upper layer so its objects can move as they are.
    apply_fixups(target.upper, &cs.fixups)?;
    // 2. Record inode numbers, check that the workspace still holds what we classified and
    //    that every step will be permitted.
    let mut ws = Beneath::open(target.workspace).map_err(io_err("open workspace", target.workspace))?;
    let mut up = Beneath::open(target.upper).map_err(io_err("open upper", target.upper))?;
    let mut perms = Permissions::default();
    let mut jsteps = Vec::with_capacity(steps.len());
    for step in steps {
        let js = identify(&mut ws, &mut up, step)?;
        check_step(&mut ws, &mut up, target.upper, &js, &mut perms)?;
        jsteps.push(js);
    }
    // Applying resolves every path afresh: a handle kept from here would follow a directory
    // someone moved meanwhile, wherever it went.
    drop(up);
    relieved(target, || std::fs::create_dir_all(target.trash).map_err(io_err("create trash", target.trash)))?;
    let record = CommitRecord {
        tx: target.tx.to_string(),
        workspace: target.workspace.to_path_buf(),
        upper: target.upper.to_path_buf(),
        trash: target.trash.to_path_buf(),
        steps: jsteps,
    };
    // 3. What must be durable before the record points at it (`durable::before_record`).
    let journal_dir = target.record.parent().unwrap_or(Path::new("."));
    let pending = journal::pending_path(target.record);
    let before = durable::before_record(
        &durable::Before {
            state_root: journal_dir.parent().unwrap_or(journal_dir),
            upper: target.upper,
            trash: target.trash,
            logs: &d.before,
            journal_dir,
            record_tmp: Path::new(pending.file_name().unwrap_or_default()),
        },
        &record.steps,
    )
    .map_err(io_err("list the upper layer to flush", target.upper))?;
    // 4. Room to apply it: descriptors held until then, space (the reserve given up if need be).
    let text = record.render(target.seal);
    let fds = check::reserve_fds(ws.root()).map_err(CommitError::NoRoom)?;
    ensure_space(target, &ws, &record, text.len())?;
    drop(ws);
    // 5. The commit point: the record, written, flushed with the content, renamed, and its
    //    directory flushed.
    hook.tick()?;
    match relieved(target, || write_record(target.record, &text, &before, d.flusher)) {
        Ok(()) => {}
        Err(CommitError::Journal(e @ JournalError::InPlace { .. })) => {
            return Err(CommitError::Unfinished { source: Box::new(e.into()) })
        }
        Err(e) => return Err(e),
    }
    // 6. Apply, 7. mark applied. From here on an error leaves the commit to recovery.
    let applied = (|| {
        hook.tick()?;
        at_commit_point();
        drop(fds);
        if let Err(e) = apply_record_with(&record, hook, &d.after, d.flusher) {
            // Applying is idempotent: after space was freed, go again from the start.
            let full = matches!(e.errno(), Some(libc::ENOSPC | libc::EDQUOT));
            if !(full && target.relief.is_some_and(|r| r())) {
                return Err(e);
            }
            apply_record_with(&record, hook, &d.after, d.flusher)?;
        }
        finish_with(target.record, hook, d.flusher)
    })();
    match applied {
        Ok(()) => Ok(()),
        Err(e @ CommitError::Injected(_)) => Err(e),
        Err(e) => Err(CommitError::Unfinished { source: Box::new(e) }),
    }
}

/// Write the record under its temporary name, flush it with `before` (the content it points
/// at), rename it to `path` and flush the journal directory: Ok is the commit point. Before
/// that, an error leaves no record behind.
fn write_record(path: &Path, text: &str, before: &[Flush], flusher: &mut dyn Flusher) -> Result<(), CommitError> {
    let pending = journal::write_pending(path, text)?;
    if let Err(e) = flusher.flush(before) {
        journal::discard_pending(&pending);
        return Err(e.into());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    journal::publish(&pending, path, || flusher.flush(&[Flush::dir(dir, Path::new(""))]).map_err(|e| e.source))?;
    Ok(())
}

/// Run `f`; if it failed because the filesystem is full and `target.relief` freed space, once
/// more.
fn relieved<T>(target: &CommitTarget<'_>, mut f: impl FnMut() -> Result<T, CommitError>) -> Result<T, CommitError> {
    match f() {
        Err(e) if matches!(e.errno(), Some(libc::ENOSPC | libc::EDQUOT)) && target.relief.is_some_and(|r| r()) => f(),
        r => r,
    }
}

/// Refuse before the commit point when applying could run out of space: what the record and the
/// workspace's directories may need, the state directory's reserve given up first.
fn ensure_space(
    target: &CommitTarget<'_>,
    ws: &Beneath,
    record: &CommitRecord,
    record_bytes: usize,
) -> Result<(), CommitError> {
    let need = check::space_needed(record_bytes, &record.steps);
    let avail = || check::available(ws.root()).map_err(io_err("statfs", target.workspace));
    if avail()? >= need {
        return Ok(());
    }
    if target.relief.is_some_and(|r| r()) && avail()? >= need {
        return Ok(());
    }
    Err(CommitError::NoRoom(format!(
        "the workspace's filesystem is full: applying this commit needs about {} KiB, {} KiB are free; free \
         space and run it again",
        need.div_ceil(1024),
        avail()? / 1024
    )))
}

/// Apply a commit record: every step at most once, whatever already happened (recovery), and
/// make what it changed durable.
pub fn apply_record(record: &CommitRecord, hook: &mut CrashHook) -> Result<(), CommitError> {
    apply_record_with(record, hook, &[], &mut Fsync)
}

/// [`apply_record`], flushing `logs` with what the steps changed, through `flusher`.
pub fn apply_record_with(
    record: &CommitRecord,
    hook: &mut CrashHook,
    logs: &[Flush],
    flusher: &mut dyn Flusher,
) -> Result<(), CommitError> {
    let mut ws = Beneath::open(&record.workspace).map_err(io_err("open workspace", &record.workspace))?;
    let mut up = Beneath::open(&record.upper).map_err(io_err("open upper", &record.upper))?;
    let trash = Beneath::open(&record.trash).map_err(io_err("open trash", &record.trash))?;
    apply_steps(&mut ws, &mut up, &trash, record, hook)?;
    // Descriptors back for the flush (the budget held before the commit point covers both).
    drop((ws, up, trash));
    let after = durable::after_apply(&record.workspace, &record.upper, &record.trash, &record.steps, logs);
    Ok(flusher.flush(&after)?)
}

fn apply_steps(
    ws: &mut Beneath,
    up: &mut Beneath,
    trash: &Beneath,
    record: &CommitRecord,
    hook: &mut CrashHook,
) -> Result<(), CommitError> {
    let total = record.steps.len();
    let privs = check::Privileges::current();
    for (i, js) in record.steps.iter().enumerate() {
        apply_step(ws, up, trash, record, js, &privs, hook)?;
        if let Some(p) = hook.progress.filter(|_| i % 256 == 255 || i + 1 == total) {
            p(i + 1, total);
        }
    }
    Ok(())
}

/// Mark the record applied, durably: it moves into its transaction's directory as `applied`
/// (one rename, no more than deleting it cost), where recovery finds it if the process dies
/// before cleaning up, and tells an applied transaction from an abandoned one.
pub fn finish(record: &Path, hook: &mut CrashHook) -> Result<(), CommitError> {
    finish_with(record, hook, &mut Fsync)
}

/// [`finish`], flushing the journal directory through `flusher`.
pub fn finish_with(record: &Path, hook: &mut CrashHook, flusher: &mut dyn Flusher) -> Result<(), CommitError> {
    hook.tick()?;
    let Some(dir) = record.parent() else { return Ok(()) };
    let id = record.file_name().and_then(|n| crate::layout::record_id(n)).map(|(id, _)| id.to_string());
    let applied = id.and_then(|id| Some(dir.parent()?.join(crate::layout::TX).join(id).join(crate::layout::APPLIED)));
    let moved = match &applied {
        Some(to) => std::fs::rename(record, to),
        None => Err(io::ErrorKind::NotFound.into()),
    };
    match moved {
        Ok(()) => {}
        // No transaction directory to keep it in (or the record is gone already): delete it.
        Err(e) if e.kind() == io::ErrorKind::NotFound => match std::fs::remove_file(record) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove commit record", record)(e)),
        },
        Err(e) => return Err(io_err("mark commit record applied", record)(e)),
    }
    Ok(flusher.flush(&[Flush::dir(dir, Path::new(""))])?)
}

fn stat_at(b: &mut Beneath, rel: &Path) -> io::Result<Option<rustix::fs::Stat>> {
    if rel.as_os_str().is_empty() {
        return Ok(Some(rustix::fs::fstat(b.root())?));
    }
    let (dir, name) = b.parent(rel)?;
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn kind_of_mode(mode: u32) -> Kind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFREG => Kind::File,
        libc::S_IFLNK => Kind::Symlink,
        _ => Kind::Special,
    }
}

/// Attach inode numbers to a step and check the workspace against the change set.
fn identify(ws: &mut Beneath, up: &mut Beneath, step: Step) -> Result<JournalStep, CommitError> {
    let path = step.path().clone();
    let conflict = |what: String| CommitError::Conflict { path: path.clone(), what };
    let ws_stat = |ws: &mut Beneath| stat_at(ws, &path).map_err(io_err("stat workspace", &path));
    let up_ino = |up: &mut Beneath| -> Result<u64, CommitError> {
        match stat_at(up, &path).map_err(io_err("stat upper", &path))? {
            Some(st) => Ok(st.st_ino),
            None => {
                Err(CommitError::Io { step: "stat upper", path: path.clone(), source: io::ErrorKind::NotFound.into() })
            }
        }
    };
    let (ino, old_ino) = match &step {
        Step::Remove { kind, .. } => match ws_stat(ws)? {
            Some(st) if kind_of_mode(st.st_mode) == *kind => (st.st_ino, 0),
            Some(_) => return Err(conflict(format!("no longer a {}", kind.as_str()))),
            None => return Err(conflict("already gone".into())),
        },
        Step::Create { .. } => match ws_stat(ws)? {
            None => (up_ino(up)?, 0),
            Some(_) => return Err(conflict("created by someone else".into())),
        },
        Step::Replace { old, .. } => match ws_stat(ws)? {
            Some(st) if kind_of_mode(st.st_mode) == *old => (up_ino(up)?, st.st_ino),
            Some(_) => return Err(conflict(format!("no longer a {}", old.as_str()))),
            None => return Err(conflict("deleted by someone else".into())),
        },
        Step::DirMeta { .. } => match ws_stat(ws)? {
            Some(st) if kind_of_mode(st.st_mode) == Kind::Dir => (0, 0),
            _ => return Err(conflict("no longer a directory".into())),
        },
    };
    Ok(JournalStep { step, ino, old_ino })
}

fn apply_step(
    ws: &mut Beneath,
    up: &mut Beneath,
    trash: &Beneath,
    record: &CommitRecord,
    js: &JournalStep,
    privs: &check::Privileges,
    hook: &mut CrashHook,
) -> Result<(), CommitError> {
    let path = js.step.path();
    let current = |ws: &mut Beneath| stat_at(ws, path).map_err(io_err("stat workspace", path));
    match &js.step {
        Step::Remove { kind, slot, .. } => {
            let slot_name = slot.to_string();
            let done = match rustix::fs::statat(trash.root(), slot_name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st.st_ino == js.ino,
                Err(_) => false,
            };
            if done {
                return Ok(());
            }
            match current(ws)? {
                Some(st) if st.st_ino == js.ino => {}
                _ => return Err(CommitError::Conflict { path: path.clone(), what: "changed before removal".into() }),
            }
            hook.tick()?;
            let (dir, name) = ws.parent(path).map_err(io_err("open parent", path))?;
            rustix::fs::renameat_with(dir, name, trash.root(), slot_name.as_str(), RenameFlags::NOREPLACE)
                .map_err(|e| io_err("remove (rename to trash)", path)(e.into()))?;
            if *kind == Kind::Dir {
                ws.forget(path);
            }
        }
        Step::Create { .. } => {
            // Rename first, look second: a creation already applied (by an earlier run of
            // this record) fails here, ENOENT for the moved source or EEXIST for the taken
            // name, and the inode at the target says whether that failure means done. The
            // common case, a creation not yet applied, costs one call instead of three.
            hook.tick()?;
            let (udir, uname) = up.parent(path).map_err(io_err("open upper parent", path))?;
            let (dir, name) = ws.parent(path).map_err(io_err("open parent", path))?;
            if let Err(e) = rustix::fs::renameat_with(udir, uname, dir, name, RenameFlags::NOREPLACE) {
                match stat_at(ws, path) {
                    Ok(Some(st)) if st.st_ino == js.ino => {}
                    _ => return Err(io_err("create (rename into workspace)", path)(e.into())),
                }
            }
        }
        Step::Replace { old, .. } => {
            match current(ws)? {
                Some(st) if st.st_ino == js.ino => return Ok(()),
                Some(st) if st.st_ino == js.old_ino => {}
                _ => {
                    return Err(CommitError::Conflict { path: path.clone(), what: "changed before replacement".into() })
                }
            }
            hook.tick()?;
            let (udir, uname) = up.parent(path).map_err(io_err("open upper parent", path))?;
            let (dir, name) = ws.parent(path).map_err(io_err("open parent", path))?;
            rustix::fs::renameat_with(udir, uname, dir, name, RenameFlags::EXCHANGE)
                .map_err(|e| io_err("replace (exchange)", path)(e.into()))?;
            if *old == Kind::Dir {
                ws.forget(path);
            }
        }
        Step::DirMeta { .. } => {
            hook.tick()?;
            copy_dir_meta(ws, &meta::join(&record.upper, path), path, privs, hook)?;
        }
    }
    Ok(())
}

/// Check, before the commit point, that applying `js` will be permitted.
fn check_step(
    ws: &mut Beneath,
    up: &mut Beneath,
    upper: &Path,
    js: &JournalStep,
    perms: &mut Permissions,
) -> Result<(), CommitError> {
    let path = js.step.path();
    let denied = |Denied(why): Denied| CommitError::NotPermitted { path: path.clone(), why };
    match &js.step {
        Step::DirMeta { .. } => {
            let privs = *perms.privileges();
            dir_meta_plan_for(ws, &meta::join(upper, path), path, &privs).map(drop)
        }
        _ => perms.check_rename(ws, up, js).map_err(io_err("check permissions", path))?.map_err(denied),
    }
}

/// The workspace directory `rel`, opened, and what giving it the attributes of `upper_dir`
/// takes (refused with `NotPermitted` when it cannot be done).
fn dir_meta_plan_for(
    ws: &mut Beneath,
    upper_dir: &Path,
    rel: &Path,
    privs: &check::Privileges,
) -> Result<(std::fs::Metadata, OwnedFd, check::DirMetaPlan), CommitError> {
    let u = std::fs::symlink_metadata(upper_dir).map_err(io_err("stat upper dir", upper_dir))?;
    let fd = crate::fsx::open_beneath(ws.root(), rel, OFlags::RDONLY | OFlags::DIRECTORY, rustix::fs::Mode::empty())
        .map_err(io_err("open dir", rel))?;
    let cur = rustix::fs::fstat(&fd).map_err(|e| io_err("stat dir", rel)(e.into()))?;
    let plan = check::dir_meta_plan(
        Attrs { uid: cur.st_uid, gid: cur.st_gid, mode: cur.st_mode },
        Attrs { uid: u.uid(), gid: u.gid(), mode: u.mode() },
        privs,
        || check::xattrs_already(fd.as_fd(), &meta::committed_xattrs_of_upper(upper_dir)?),
    )
    .map_err(|Denied(why)| CommitError::NotPermitted { path: rel.to_path_buf(), why })?;
    Ok((u, fd, plan))
}

/// Give the workspace directory `rel` the mode, owner, committed xattrs and times of `upper_dir`,
/// as far as [`check::dir_meta_plan`] says this user may (it was checked before the commit
/// point).
fn copy_dir_meta(
    ws: &mut Beneath,
    upper_dir: &Path,
    rel: &Path,
    privs: &check::Privileges,
    hook: &mut CrashHook,
) -> Result<(), CommitError> {
    let (u, fd, plan) = dir_meta_plan_for(ws, upper_dir, rel, privs)?;
    if let Some((uid, gid)) = plan.chown {
        rustix::fs::fchown(&fd, Some(rustix::process::Uid::from_raw(uid)), Some(rustix::process::Gid::from_raw(gid)))
            .map_err(|e| io_err("chown dir", rel)(e.into()))?;
    }
    // The names before the mode: without root, setting a `user.*` name on a directory takes
    // write permission on it, which the new mode (0555, say) may not give. Where the directory
    // has no owner write now, it is given it for as long as the names take (this runs after the
    // commit point, and again in recovery: each order of these calls must succeed whenever the
    // check before the commit point passed).
    if plan.xattrs {
        let now = rustix::fs::fstat(&fd).map_err(|e| io_err("stat dir", rel)(e.into()))?;
        let lift = now.st_mode & 0o200 == 0 && privs.owns(now.st_uid);
        let chmod = |mode: u32| {
            rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode))
                .map_err(|e| io_err("chmod dir", rel)(e.into()))
        };
        if lift {
            chmod((now.st_mode & 0o7777) | 0o200)?;
            // A crash here leaves the directory with owner write it should not keep: recovery
            // runs this step again from that state, and must end where this run would have.
            hook.tick()?;
        }
        sync_xattrs(&fd, upper_dir, rel)?;
        if lift && plan.chmod.is_none() {
            chmod(now.st_mode & 0o7777)?;
        }
    }
    if let Some(mode) = plan.chmod {
        rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode))
            .map_err(|e| io_err("chmod dir", rel)(e.into()))?;
    }
    if plan.times {
        let ts = |s: i64, ns: i64| rustix::fs::Timespec { tv_sec: s, tv_nsec: ns as _ };
        let times =
            Timestamps { last_access: ts(u.atime(), u.atime_nsec()), last_modification: ts(u.mtime(), u.mtime_nsec()) };
        rustix::fs::futimens(&fd, &times).map_err(|e| io_err("set dir times", rel)(e.into()))?;
    }
    Ok(())
}

/// Make the workspace directory's allowlisted xattrs (`meta::is_committed_name`) those of the
/// upper directory; others (the host's labels, ...) are neither copied nor removed.
fn sync_xattrs(fd: &OwnedFd, upper_dir: &Path, rel: &Path) -> Result<(), CommitError> {
    let want = meta::committed_xattrs_of_upper(upper_dir).map_err(io_err("read upper xattrs", upper_dir))?;
    let mut buf = vec![0u8; 4096];
    let have: Vec<Vec<u8>> = match rustix::fs::flistxattr(fd, &mut buf) {
        Ok(n) => buf[..n].split(|b| *b == 0).filter(|s| !s.is_empty()).map(<[u8]>::to_vec).collect(),
        Err(_) => Vec::new(),
    };
    use std::os::unix::ffi::OsStrExt;
    // The other names first, the ACLs last: setting an access ACL sets the owner's mode bits
    // from it, and one without owner write would refuse every `user.*` name after it.
    for acls in [false, true] {
        for name in &have {
            let n = OsStr::from_bytes(name);
            if meta::is_acl(n) == acls && !want.iter().any(|(w, _)| w.as_os_str() == n) && meta::is_committed_name(n) {
                rustix::fs::fremovexattr(fd, n).map_err(|e| io_err("remove xattr", rel)(e.into()))?;
            }
        }
        for (name, value) in want.iter().filter(|(n, _)| meta::is_acl(n) == acls) {
            rustix::fs::fsetxattr(fd, name.as_os_str(), value, rustix::fs::XattrFlags::empty())
                .map_err(|e| io_err("set xattr", rel)(e.into()))?;
        }
    }
    Ok(())
}

/// Repair the upper layer before its objects move (before the commit point, so a crash here
/// only affects a transaction that will be discarded).
pub fn apply_fixups(upper: &Path, fixups: &[Fixup]) -> Result<(), CommitError> {
    for f in fixups {
        match f {
            Fixup::RemoveNode(p) => {
                let full = upper.join(p);
                std::fs::remove_file(&full).map_err(io_err("remove special file", &full))?;
            }
            Fixup::RemoveXattr(p, name) => {
                let full = upper.join(p);
                match rustix::fs::lremovexattr(&full, name.as_os_str()) {
                    Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                    Err(e) => return Err(io_err("remove xattr off the commit allowlist", &full)(e.into())),
                }
            }
            Fixup::Chmod(p, mode) => {
                use std::os::unix::fs::PermissionsExt;
                let full = upper.join(p);
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(*mode))
                    .map_err(io_err("strip mode bits", &full))?;
            }
        }
    }
    Ok(())
}
