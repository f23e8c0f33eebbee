//! The state directory: where transactions, the journal, locks and the audit log live (names
//! and placement: [`crate::layout`]).
//!
//! Nothing read from it is trusted: txbox uses a state directory only if its marker verifies
//! with the user's key ([`crate::seal`]) and binds this very directory; every file that names
//! a path or decides what happens to one (`meta`, `status`, `fingerprints`, commit records) is
//! sealed the same way and bound to its transaction; every other path is derived from the
//! transaction id; and every directory inside is opened beneath the root without following a
//! symlink. A state directory txbox did not make is refused, never repaired.
//!
//! Owns: the state directory's files and directories (creation, locking, retirement and
//! deletion, spares). May not touch: the workspace (that is `commit`'s), the audit log's
//! content (`audit`'s), the warm servers' sockets (`sandbox`'s, under [`StateDir::warm_dir`]).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags};

use crate::fsx::{self, at, PathError};
use crate::hex::{path_from_hex, path_to_hex};
use crate::journal::{self, CommitRecord, JournalError};
use crate::layout::{self, Status, TxKind};
use crate::seal::{Domain, Key, KeyError, Seal};
use crate::session::Fingerprints;

pub use crate::fsx::remove_tree;
pub use crate::hex::hex;
pub use crate::layout::valid_id;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state directory: {0}")]
    Io(PathError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("unknown transaction id `{0}` (see `txbox list`)")]
    UnknownTx(String),
    #[error(
        "the state directory {state} is on another filesystem or mount than the workspace \
         {workspace}; commits are renames, which never cross a mount (not even a bind mount of one \
         filesystem), so put the state directory on the workspace's mount (--state-dir)"
    )]
    CrossDevice { state: PathBuf, workspace: PathBuf },
    #[error(
        "{path} is not a txbox state directory: {why}. txbox uses only state directories it made \
         itself (a repository can ship one, a command can write one); {fix}"
    )]
    NotOurs { path: PathBuf, why: String, fix: String },
    #[error("{path} does not verify (forged, damaged, or copied from elsewhere); txbox will not act on it. {fix}")]
    Forged { path: PathBuf, fix: &'static str },
    #[error("a session name must be 1 to {max} printable characters, got {0:?}", max = MAX_NAME)]
    BadName(String),
    #[error(
        "transaction {0} is committed and waits for recovery to apply it: its layers stay until then          (`txbox recover`)"
    )]
    Committed(String),
}

impl From<PathError> for StateError {
    fn from(e: PathError) -> StateError {
        StateError::Io(e)
    }
}

/// How long a transaction directory without a valid `meta` is left alone (it may be in the
/// middle of being created, or of taking a spare) before it counts as a crash's leftover.
const YOUNG: std::time::Duration = std::time::Duration::from_secs(600);
/// Retired directories a warm server may leave for its idle time before a collector is
/// started anyway (under sustained load the server is never idle).
pub const RETIRED_BOUND: u64 = 8;
const MAX_NAME: usize = 128;
/// The largest `meta`, `status` or marker read back (they are a few hundred bytes).
const SMALL: usize = 64 << 10;
/// The largest fingerprints file or commit record read back.
const LARGE: usize = 1 << 30;

/// A state directory txbox made, opened and checked. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StateDir {
    /// Its absolute path (parents resolved).
    pub root: PathBuf,
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// O_PATH handle on the root: every directory inside is opened beneath it.
    fd: OwnedFd,
    seal: Seal,
    /// The base directory holding the key (its real path).
    base: PathBuf,
    /// What commands must not see: the root, and the base unless it holds the root.
    hidden: Vec<PathBuf>,
}

/// An exclusive flock, released on drop.
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

fn flock(path: &Path, op: FlockOperation) -> Result<Option<Lock>, StateError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(at(path, "open lock"))?;
    match rustix::fs::flock(&file, op) {
        Ok(()) => Ok(Some(Lock { _file: file })),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(PathError::new(path, "lock", e.into()).into()),
    }
}

/// `flock` the existing file `rel` beneath `dir` without creating it: Some(lock), None if
/// someone holds it, Err(NotFound) if there is no such file.
fn try_lock_beneath(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<Option<Lock>> {
    let fd = fsx::open_beneath(dir, rel, OFlags::RDONLY, Mode::empty())?;
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(Lock { _file: File::from(fd) })),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Everything the root's identity is made of: its inode and birth time (stable across
/// reboots, unlike device numbers), else its device. A marker copied into another directory,
/// or a directory restored from a copy, no longer verifies.
fn identity(fd: BorrowedFd<'_>, path: &Path) -> Result<Vec<u8>, StateError> {
    use rustix::fs::StatxFlags;
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::INO | StatxFlags::BTIME)
        .map_err(at(path, "statx"))?;
    Ok(if st.stx_mask & StatxFlags::BTIME.bits() != 0 {
        format!("ino {} btime {}.{}", st.stx_ino, st.stx_btime.tv_sec, st.stx_btime.tv_nsec).into_bytes()
    } else {
        format!("ino {} dev {}:{}", st.stx_ino, st.stx_dev_major, st.stx_dev_minor).into_bytes()
    })
}

const MARKER_BODY: &str = "txbox-state v1\n";

/// Whether a directory may become a state directory: nothing in it but what the base
/// directory holds anyway (the key and its temporaries, the registry).
fn blank(names: &[std::ffi::OsString]) -> bool {
    names.iter().all(|n| {
        n == layout::KEY
            || n == layout::REGISTRY
            || n.as_bytes().ends_with(layout::TMP_SUFFIX.as_bytes())
                && (n.as_bytes().starts_with(layout::KEY.as_bytes())
                    || n.as_bytes().starts_with(layout::MARKER.as_bytes())
                    || n.as_bytes().starts_with(layout::REGISTRY.as_bytes()))
    })
}

impl StateDir {
    /// Open (or, when `create`, make) the state directory `root` with `key`; `base` is where
    /// the key lives. Refused: a symlink, a directory of another user's or writable by
    /// others, and a directory txbox did not make (no marker, a marker that does not verify).
    /// A missing or empty directory is initialized.
    fn open_with(root: &Path, key: Key, base: PathBuf, create: bool) -> Result<Option<StateDir>, StateError> {
        if create {
            match std::fs::DirBuilder::new().mode(0o700).create(root) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(PathError::new(root, "create", e).into()),
            }
        }
        let not_ours = |why: String, fix: String| StateError::NotOurs { path: root.to_path_buf(), why, fix };
        let fd = match rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) if !create => return Ok(None),
            Err(rustix::io::Errno::LOOP) => {
                return Err(not_ours("it is a symlink".into(), "name the real directory".into()))
            }
            Err(rustix::io::Errno::NOTDIR) => {
                return Err(not_ours("it is not a directory".into(), "name a directory".into()))
            }
            Err(e) => return Err(PathError::new(root, "open", e.into()).into()),
        };
        let st = rustix::fs::fstat(&fd).map_err(at(root, "stat"))?;
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me {
            return Err(not_ours(
                format!("it belongs to uid {}, not to this user ({me})", st.st_uid),
                "use a directory of your own (--state-dir)".into(),
            ));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(not_ours(
                format!("others may write to it (mode {:o})", st.st_mode & 0o7777),
                format!("chmod 700 {}", root.display()),
            ));
        }
        let seal = Seal::new(key, &identity(fd.as_fd(), root)?);
        Self::check_marker(fd.as_fd(), root, &seal)?;
        let mut made = false;
        for sub in layout::SUBDIRS {
            match rustix::fs::mkdirat(&fd, sub, Mode::from_raw_mode(0o700)) {
                Ok(()) => made = true,
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(PathError::new(&root.join(sub), "create", e.into()).into()),
            }
        }
        // Once: a commit flushes the directories it uses below these, never the root itself
        // (`durable::before_record`).
        if made {
            fsx::sync_dir(fd.as_fd()).map_err(at(root, "sync"))?;
        }
        // Comparisons with the workspace need the real path (parents may be symlinks; the
        // root itself is not, it was opened O_NOFOLLOW).
        let real = std::fs::canonicalize(root).map_err(at(root, "resolve"))?;
        let base = if base == root { real.clone() } else { std::fs::canonicalize(&base).unwrap_or(base) };
        let mut hidden = vec![real.clone()];
        if !real.starts_with(&base) {
            hidden.push(base.clone());
        }
        Ok(Some(StateDir { root: real, inner: Arc::new(Inner { fd, seal, base, hidden }) }))
    }

    /// Accept `root` only if its marker verifies; initialize it if it is blank.
    fn check_marker(fd: BorrowedFd<'_>, root: &Path, seal: &Seal) -> Result<(), StateError> {
        let not_ours = |why: &str, fix: &str| StateError::NotOurs {
            path: root.to_path_buf(),
            why: why.to_string(),
            fix: format!("{fix}: {}", root.display()),
        };
        // Twice at most: a concurrent first use may initialize it between our two looks.
        for _ in 0..2 {
            match fsx::read_small(fd, Path::new(layout::MARKER), SMALL) {
                Ok(bytes) if seal.open(Domain::Marker, "", &bytes) == Some(MARKER_BODY) => return Ok(()),
                Ok(_) => {
                    return Err(not_ours(
                        "its marker does not verify: it was made with another key (another user's, \
                         or with another $HOME or XDG_STATE_HOME, or a key that was replaced), or \
                         moved or copied from where txbox made it",
                        "move it aside (its unfinished commits cannot be trusted) and txbox starts \
                         afresh, or name another directory with --state-dir",
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let names = fsx::list(fd).map_err(at(root, "list"))?;
                    if names.iter().any(|n| n == layout::MARKER) {
                        continue;
                    }
                    if !blank(&names) {
                        return Err(not_ours(
                            "it is not empty and has no marker (state of an earlier txbox version, \
                             a directory shipped in a repository, or one txbox did not make)",
                            "move it aside or delete it, or name an empty or new directory with \
                             --state-dir (an earlier version's unfinished commits are finished by \
                             that version's `txbox recover`)",
                        ));
                    }
                    return Self::initialize(fd, root, seal);
                }
                Err(e) => return Err(not_ours(&format!("its marker cannot be read ({e})"), "move it aside")),
            }
        }
        Err(not_ours("its marker keeps changing", "move it aside"))
    }

    /// Make an empty directory a state directory: closed to others, then the marker (last,
    /// durably: a directory is ours once it is there).
    fn initialize(fd: BorrowedFd<'_>, root: &Path, seal: &Seal) -> Result<(), StateError> {
        let dir = rustix::fs::openat(fd, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(at(root, "open"))?;
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700)).map_err(at(root, "chmod"))?;
        let marker = seal.seal(Domain::Marker, "", MARKER_BODY);
        fsx::replace(fd, layout::MARKER, marker.as_bytes(), true).map_err(at(root, "write marker"))?;
        Ok(())
    }

    /// The state directory `root` with `key`, made or initialized if missing or empty; the
    /// key's base directory is taken to be `root` (tests, and tools that bring their own key).
    pub fn open_with_key(root: &Path, key: Key) -> Result<StateDir, StateError> {
        Self::open_with(root, key, root.to_path_buf(), true)?
            .ok_or_else(|| PathError::new(root, "open", io::ErrorKind::NotFound.into()).into())
    }

    /// The state directory for `workspace`: `explicit` (`--state-dir`, `TXBOX_STATE_DIR`) if
    /// given, else the first of [`layout::candidates`] that can serve. Made if missing.
    pub fn for_workspace(explicit: Option<&Path>, workspace: &Path) -> Result<StateDir, StateError> {
        Self::locate_for(explicit, workspace, true)?
            .ok_or_else(|| PathError::new(workspace, "find state directory", io::ErrorKind::NotFound.into()).into())
    }

    /// Like [`for_workspace`](Self::for_workspace), but makes nothing: None when the
    /// workspace has no state directory yet (for `list`, `log`, `recover`).
    pub fn existing_for_workspace(explicit: Option<&Path>, workspace: &Path) -> Result<Option<StateDir>, StateError> {
        Self::locate_for(explicit, workspace, false)
    }

    fn locate_for(explicit: Option<&Path>, workspace: &Path, create: bool) -> Result<Option<StateDir>, StateError> {
        let base = layout::base_dir()?;
        let key = Key::load_or_create(&base)?;
        if let Some(dir) = explicit {
            let dir = resolve_explicit(dir);
            return Self::open_with(&dir, key, base, create);
        }
        let candidates = layout::candidates(&base, workspace);
        let last = candidates.len().saturating_sub(1);
        for (i, dir) in candidates.iter().enumerate() {
            let opened = if dir == &base {
                // The base directory is always there (it holds the key).
                Self::open_with(dir, key.clone(), base.clone(), true)
            } else {
                Self::open_with(dir, key.clone(), base.clone(), create)
            };
            match opened {
                Ok(Some(s)) => {
                    if s.root != base {
                        s.register(&base, &key);
                    }
                    return Ok(Some(s));
                }
                Ok(None) => continue,
                // A fallback that someone else made, squatted or that is unusable: try the
                // next; the last one's refusal is the answer.
                Err(e) if i < last && !matches!(e, StateError::Key(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Where [`find_tx`](Self::find_tx) and [`find_kept`](Self::find_kept) look: `explicit`,
    /// else the base directory and those registered on other filesystems; with the key and
    /// the base directory they are opened with.
    fn places(explicit: Option<&Path>) -> Result<(Vec<PathBuf>, Key, PathBuf), StateError> {
        let base = layout::base_dir()?;
        let key = Key::load_or_create(&base)?;
        let mut places = match explicit {
            Some(dir) => vec![resolve_explicit(dir)],
            None => {
                let mut v = vec![base.clone()];
                v.extend(registered(&base, &key));
                v
            }
        };
        places.dedup();
        Ok((places, key, base))
    }

    /// The state directory holding transaction `id`: `explicit` if given, else the base
    /// directory's, else one of those registered on other filesystems. Works from any
    /// directory.
    pub fn find_tx(explicit: Option<&Path>, id: &str) -> Result<StateDir, StateError> {
        if !valid_id(id) {
            return Err(StateError::UnknownTx(id.to_string()));
        }
        let (places, key, base) = Self::places(explicit)?;
        for dir in places {
            // Unusable places (gone, not ours) are not where the transaction is.
            let state = match Self::open_with(&dir, key.clone(), base.clone(), false) {
                Ok(Some(s)) => s,
                Ok(None) | Err(_) if explicit.is_none() => continue,
                Ok(None) => return Err(StateError::UnknownTx(id.to_string())),
                Err(e) => return Err(e),
            };
            if state.read_meta(id).is_ok() {
                return Ok(state);
            }
        }
        Err(StateError::UnknownTx(id.to_string()))
    }

    /// The state directory holding the retained transaction `id` (`kept/<id>`, see
    /// [`crate::retain`]), looked for as [`find_tx`](Self::find_tx) does.
    pub fn find_kept(explicit: Option<&Path>, id: &str) -> Result<StateDir, StateError> {
        if !valid_id(id) {
            return Err(StateError::UnknownTx(id.to_string()));
        }
        let (places, key, base) = Self::places(explicit)?;
        for dir in places {
            let Ok(Some(state)) = Self::open_with(&dir, key.clone(), base.clone(), false) else { continue };
            if fsx::dir_beneath(state.fd(), &Path::new(layout::KEPT).join(id)).is_ok() {
                return Ok(state);
            }
        }
        Err(StateError::UnknownTx(id.to_string()))
    }

    /// An existing state directory by path (the background collector), None if it is gone.
    pub fn open_existing(root: &Path) -> Result<Option<StateDir>, StateError> {
        let base = layout::base_dir()?;
        let key = Key::load_or_create(&base)?;
        Self::open_with(root, key, base, false)
    }

    /// Remember a state directory on another filesystem than the base directory's, so that
    /// transaction ids resolve from anywhere (best effort: it is only a shortcut).
    fn register(&self, base: &Path, key: &Key) {
        let seal = Seal::unbound(key.clone());
        if registered(base, key).contains(&self.root) {
            return;
        }
        let line = path_to_hex(&self.root);
        let entry = format!("{line} {}\n", hex(&seal.mac(Domain::Registry, "", line.as_bytes())));
        let Ok(dir) = layout::private_dir(base, false) else { return };
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if let Ok(fd) = rustix::fs::openat(&dir, layout::REGISTRY, flags, Mode::from_raw_mode(0o600)) {
            // One write of a short line: appends of whole lines do not interleave.
            let _ = rustix::io::write(&fd, entry.as_bytes());
        }
    }

    pub fn seal(&self) -> &Seal {
        &self.inner.seal
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// Everything a sandboxed command must not see, nor a commit include: this directory and
    /// the key's.
    pub fn hidden(&self) -> &[PathBuf] {
        &self.inner.hidden
    }

    /// Where the key lives (its directory).
    pub fn base(&self) -> &Path {
        &self.inner.base
    }

    pub fn check_same_fs(&self, workspace: &Path) -> Result<(), StateError> {
        let s = layout::Place::of_fd(self.fd().as_fd()).map_err(at(&self.root, "stat"))?;
        let w = layout::Place::of(workspace).map_err(at(workspace, "stat workspace"))?;
        if !s.same(&w) {
            return Err(StateError::CrossDevice { state: self.root.clone(), workspace: workspace.to_path_buf() });
        }
        Ok(())
    }

    /// A directory beneath the root, opened without following any symlink.
    pub(crate) fn dir(&self, rel: &str) -> Result<OwnedFd, StateError> {
        fsx::dir_beneath(self.fd(), Path::new(rel)).map_err(|e| PathError::new(&self.root.join(rel), "open", e).into())
    }

    pub fn tx_dir(&self, id: &str) -> PathBuf {
        self.root.join(layout::TX).join(id)
    }

    fn tx_rel(id: &str, name: &str) -> PathBuf {
        Path::new(layout::TX).join(id).join(name)
    }

    pub fn record_path(&self, id: &str) -> PathBuf {
        self.root.join(layout::JOURNAL).join(layout::record_name(id))
    }

    pub fn audit_path(&self) -> PathBuf {
        self.root.join(layout::AUDIT)
    }

    pub fn audit_head_path(&self) -> PathBuf {
        self.root.join(layout::AUDIT_HEAD)
    }

    /// The audit log, opened for appending (an error if it cannot be written).
    pub fn audit_log(&self) -> Result<crate::audit::Log, crate::audit::AuditError> {
        crate::audit::Log::open(&self.audit_path(), &self.audit_head_path(), self.seal())
    }

    /// Check the audit log against its chain and head record.
    pub fn verify_audit(&self) -> Result<crate::audit::Report, crate::audit::AuditError> {
        crate::audit::verify(&self.audit_path(), &self.audit_head_path(), self.seal())
    }

    /// Where warm sandbox servers keep their sockets.
    pub fn warm_dir(&self) -> PathBuf {
        self.root.join(layout::WARM)
    }

    /// Where a session's step layers live (derived, see [`layout::steps_root`]), checked to be
    /// a plain directory reached through no symlink wherever txbox made the path (so a swapped
    /// `steps` cannot redirect a step's deletion), if it exists yet.
    pub fn steps_root(&self, id: &str, workspace: &Path) -> Result<PathBuf, StateError> {
        let root = layout::steps_root(&self.root, id, workspace).ok_or_else(|| {
            PathError::new(
                workspace,
                "place session layers (the workspace is /; give --state-dir outside it)",
                io::ErrorKind::InvalidInput.into(),
            )
        })?;
        let checked = match root.strip_prefix(&self.root) {
            Ok(rel) => fsx::dir_beneath(self.fd(), rel).map(drop),
            Err(_) => {
                // Next to the workspace: the two components below the workspace's parent
                // (which the operator chose) are txbox's and are checked.
                let parent = root.parent().and_then(Path::parent).unwrap_or(Path::new("/"));
                let rel = root.strip_prefix(parent).unwrap_or(&root);
                rustix::fs::open(parent, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                    .map_err(io::Error::from)
                    .and_then(|fd| fsx::dir_beneath(fd.as_fd(), rel).map(drop))
            }
        };
        match checked {
            Ok(()) => Ok(root),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(root),
            Err(e) => Err(PathError::new(&root, "open session layers (a symlink or not a directory?)", e).into()),
        }
    }

    /// A scratch directory for `diff` inside a session's directory.
    pub fn diff_scratch(&self, id: &str) -> PathBuf {
        self.tx_dir(id).join(format!("{}{}", layout::DIFF_PREFIX, std::process::id()))
    }

    /// Block until this process holds the workspace's commit lock.
    pub fn lock_workspace(&self, workspace: &Path) -> Result<Lock, StateError> {
        let path = self.root.join(layout::LOCKS).join(layout::lock_name(workspace));
        flock(&path, FlockOperation::LockExclusive)?
            .ok_or_else(|| PathError::new(&path, "lock", io::ErrorKind::WouldBlock.into()).into())
    }

    /// Block until this process holds the lock `locks/<name>` (a name of [`layout`]).
    pub(crate) fn lock_named(&self, name: &str) -> Result<Lock, StateError> {
        let path = self.root.join(layout::LOCKS).join(name);
        flock(&path, FlockOperation::LockExclusive)?
            .ok_or_else(|| PathError::new(&path, "lock", io::ErrorKind::WouldBlock.into()).into())
    }

    fn commit_log(&self, workspace: &Path) -> PathBuf {
        self.root.join(Self::commit_log_rel(workspace))
    }

    /// The workspace's commit log, relative to the state directory (a commit flushes it).
    pub fn commit_log_rel(workspace: &Path) -> PathBuf {
        Path::new(layout::LOCKS).join(layout::commit_log_name(workspace))
    }

    /// The workspace's commit generation: how many transactions txbox has committed into it.
    /// Read under the workspace lock.
    pub fn generation(&self, workspace: &Path) -> Result<u64, StateError> {
        Ok(self.commits_since(workspace, u64::MAX)?.0)
    }

    /// The current generation, and the paths changed by commits after generation `since`.
    /// Every `run` asks this, so only the log's tail is read: generations grow line by line,
    /// and reading stops at the first complete line at or before `since`.
    pub fn commits_since(&self, workspace: &Path, since: u64) -> Result<(u64, Vec<PathBuf>), StateError> {
        let log = self.commit_log(workspace);
        let text = match std::fs::File::open(&log) {
            Ok(mut f) => tail_after(&mut f, since).map_err(at(&log, "read commit log"))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, Vec::new())),
            Err(e) => return Err(PathError::new(&log, "read commit log", e).into()),
        };
        let mut generation = 0;
        let mut paths = Vec::new();
        for (g, words) in complete_lines(&text) {
            generation = generation.max(g);
            if g > since {
                paths.extend(words.split(' ').filter(|w| !w.is_empty()).filter_map(path_from_hex));
            }
        }
        Ok((generation, paths))
    }

    /// Record that the next commit changes `paths` (before its commit point: a commit that then
    /// fails leaves a harmless extra entry, never a missing one). Under the workspace lock.
    pub fn log_commit(&self, workspace: &Path, paths: &[PathBuf]) -> Result<u64, StateError> {
        self.log_commit_of(workspace, None, paths)
    }

    /// [`log_commit`](Self::log_commit), naming the transaction (`@<id>`, a word no reader of
    /// paths takes for one: it is not hex), so that undo can tell which commit a generation was.
    pub fn log_commit_of(&self, workspace: &Path, tx: Option<&str>, paths: &[PathBuf]) -> Result<u64, StateError> {
        let generation = self.generation(workspace)? + 1;
        let mut line = generation.to_string();
        if let Some(id) = tx.filter(|id| valid_id(id)) {
            line.push_str(" @");
            line.push_str(id);
        }
        for p in paths {
            line.push(' ');
            line.push_str(&path_to_hex(p));
        }
        line.push('\n');
        self.append_commit_log(workspace, &line)?;
        Ok(generation)
    }

    /// Say that the commit logged as `generation` by `tx` did not happen (it failed before its
    /// commit point): `<generation> !<id>`, which changes neither the generation nor the paths.
    pub fn cancel_commit(&self, workspace: &Path, generation: u64, tx: &str) -> Result<(), StateError> {
        if !valid_id(tx) {
            return Err(StateError::UnknownTx(tx.to_string()));
        }
        self.append_commit_log(workspace, &format!("{generation} !{tx}\n"))
    }

    fn append_commit_log(&self, workspace: &Path, line: &str) -> Result<(), StateError> {
        use std::io::Write;
        let log = self.commit_log(workspace);
        let mut f =
            std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(at(&log, "open commit log"))?;
        f.write_all(line.as_bytes()).map_err(at(&log, "append commit log"))?;
        Ok(())
    }

    /// The workspace's whole commit history, oldest first: each generation with the transaction
    /// that logged it (if it said) and whether it was cancelled. Reads the whole log: for undo,
    /// not for every run.
    pub fn commit_history(&self, workspace: &Path) -> Result<Vec<Logged>, StateError> {
        let log = self.commit_log(workspace);
        let text = match std::fs::read(&log) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(PathError::new(&log, "read commit log", e).into()),
        };
        let mut out: Vec<Logged> = Vec::new();
        for (generation, words) in complete_lines(&text) {
            let mut tx = None;
            let mut cancelled = None;
            let mut paths = Vec::new();
            for w in words.split(' ').filter(|w| !w.is_empty()) {
                if let Some(id) = w.strip_prefix('@').filter(|id| valid_id(id)) {
                    tx = Some(id.to_string());
                } else if let Some(id) = w.strip_prefix('!').filter(|id| valid_id(id)) {
                    cancelled = Some(id.to_string());
                } else if let Some(p) = path_from_hex(w) {
                    paths.push(p);
                }
            }
            match cancelled {
                Some(id) => {
                    for l in out.iter_mut().rev().filter(|l| l.generation == generation) {
                        if l.tx.as_deref() == Some(id.as_str()) {
                            l.cancelled = true;
                        }
                    }
                }
                None => out.push(Logged { generation, tx, cancelled: false, paths }),
            }
        }
        Ok(out)
    }

    /// Commit records waiting to be applied (left by a crash, or being applied right now by
    /// a commit of another workspace). Temporary records whose writer is gone are removed on
    /// the way; any other name in the journal is ignored.
    pub fn pending_records(&self) -> Result<Vec<PathBuf>, StateError> {
        let journal = self.dir(layout::JOURNAL)?;
        let names = fsx::list(journal.as_fd()).map_err(at(&self.root.join(layout::JOURNAL), "list"))?;
        let mut out = Vec::new();
        for name in names {
            match layout::record_id(&name) {
                Some((_, false)) => out.push(self.root.join(layout::JOURNAL).join(&name)),
                Some((id, true)) => {
                    // A record still being written belongs to a process that holds its
                    // transaction's owner lock.
                    let writer_alive =
                        matches!(try_lock_beneath(self.fd(), &Self::tx_rel(id, layout::OWNER_LOCK)), Ok(None));
                    if !writer_alive {
                        let _ = rustix::fs::unlinkat(&journal, name.as_os_str(), AtFlags::empty());
                    }
                }
                None => {}
            }
        }
        out.sort();
        Ok(out)
    }

    /// Read and check a commit record found by [`pending_records`](Self::pending_records):
    /// its MAC (this state directory, this transaction), its name, and that every path in it
    /// is the one derived from its transaction id and workspace. Ok(None) if it vanished
    /// (its commit finished meanwhile).
    pub fn read_record(&self, path: &Path) -> Result<Option<CommitRecord>, StateError> {
        let name = path.file_name().unwrap_or_default();
        let Some((id, false)) = layout::record_id(name) else {
            return Err(StateError::Forged { path: path.to_path_buf(), fix: "it is no commit record's name" });
        };
        let journal = self.dir(layout::JOURNAL)?;
        let text = match fsx::read_small(journal.as_fd(), Path::new(name), LARGE) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(StateError::Forged {
                    path: path.to_path_buf(),
                    fix: leak_fix(e.raw_os_error() == Some(libc::ELOOP)),
                })
            }
        };
        // A hard link to a record elsewhere (another transaction's name) is no record of ours.
        let links = rustix::fs::statat(&journal, name, AtFlags::SYMLINK_NOFOLLOW).map(|s| s.st_nlink).unwrap_or(0);
        if links > 1 {
            return Err(StateError::Forged { path: path.to_path_buf(), fix: leak_fix(false) });
        }
        let record = journal::parse(&text, path, self.seal(), id)?;
        let refused = |why: &str| -> StateError {
            JournalError::Refused { path: path.to_path_buf(), why: why.to_string() }.into()
        };
        if !layout::is_normal_absolute(&record.workspace) {
            return Err(refused("its workspace is not a plain absolute path"));
        }
        // Replayed: a record of a transaction that is over (records go before their directory).
        match fsx::dir_beneath(self.fd(), &Path::new(layout::TX).join(id)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(refused("its transaction no longer exists (an old record put back?); delete it"))
            }
            Err(_) => return Err(refused("its transaction directory is not a plain directory")),
        }
        if record.trash != self.tx_dir(id).join(layout::TRASH) {
            return Err(refused("its trash is not its transaction's"));
        }
        let run_upper = self.tx_dir(id).join(layout::UPPER);
        let session_upper = layout::steps_root(&self.root, id, &record.workspace)
            .and_then(|root| record.upper.strip_prefix(root).ok().map(Path::to_path_buf))
            .is_some_and(|rest| {
                let mut c = rest.components();
                matches!(
                    (c.next(), c.next(), c.next()),
                    (Some(std::path::Component::Normal(n)), Some(std::path::Component::Normal(u)), None)
                        if n.to_str().is_some_and(|n| n.parse::<u32>().is_ok()) && u == layout::UPPER
                )
            });
        if record.upper != run_upper && !session_upper {
            return Err(refused("its upper layer is not its transaction's"));
        }
        Ok(Some(record))
    }

    /// All transaction ids with a directory (other names in `tx` are ignored).
    pub fn tx_ids(&self) -> Result<Vec<String>, StateError> {
        let tx = self.dir(layout::TX)?;
        let mut out: Vec<String> = fsx::list(tx.as_fd())
            .map_err(at(&self.root.join(layout::TX), "list"))?
            .into_iter()
            .filter_map(|n| n.into_string().ok())
            .filter(|n| valid_id(n))
            .collect();
        out.sort();
        Ok(out)
    }

    /// What transaction `id` is, if its `meta` verifies.
    pub fn read_meta(&self, id: &str) -> Result<TxMeta, StateError> {
        if !valid_id(id) {
            return Err(StateError::UnknownTx(id.to_string()));
        }
        let rel = Self::tx_rel(id, layout::META);
        let bytes = match fsx::read_small(self.fd(), &rel, SMALL) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StateError::UnknownTx(id.to_string())),
            Err(e) => return Err(PathError::new(&self.root.join(&rel), "read", e).into()),
        };
        let forged = || StateError::Forged { path: self.root.join(&rel), fix: "roll the transaction back" };
        let body = self.seal().open(Domain::Meta, id, &bytes).ok_or_else(forged)?;
        TxMeta::parse(body).ok_or_else(forged)
    }

    /// Write transaction `id`'s `meta` (sealed). In place and not synced: a run's meta is
    /// rewritten on every transaction that takes a spare, and a torn one does not verify.
    fn write_meta(&self, id: &str, meta: &TxMeta, durable: bool) -> Result<(), StateError> {
        let dir = self.dir(&format!("{}/{id}", layout::TX))?;
        let text = self.seal().seal(Domain::Meta, id, &meta.render());
        let p = self.tx_dir(id).join(layout::META);
        if durable {
            fsx::replace(dir.as_fd(), layout::META, text.as_bytes(), true).map_err(at(&p, "write"))?;
        } else {
            // Overwritten in place, not replaced: freeing the file's block and allocating
            // another costs a discard on a filesystem mounted with `discard`, on every run.
            fsx::overwrite(dir.as_fd(), layout::META, text.as_bytes()).map_err(at(&p, "write"))?;
        }
        Ok(())
    }

    /// A session's status; Err if it does not verify.
    pub fn status(&self, id: &str) -> Result<Status, StateError> {
        let rel = Self::tx_rel(id, layout::STATUS);
        let bytes = fsx::read_small(self.fd(), &rel, SMALL).map_err(at(&self.root.join(&rel), "read"))?;
        self.seal()
            .open(Domain::Status, id, &bytes)
            .and_then(|b| Status::parse(b.trim_end()))
            .ok_or_else(|| StateError::Forged { path: self.root.join(&rel), fix: "roll the transaction back" })
    }

    pub fn set_status(&self, id: &str, status: Status) -> Result<(), StateError> {
        let dir = self.dir(&format!("{}/{id}", layout::TX))?;
        let text = self.seal().seal(Domain::Status, id, &format!("{}\n", status.as_str()));
        fsx::replace(dir.as_fd(), layout::STATUS, text.as_bytes(), true)
            .map_err(|e| PathError::new(&self.tx_dir(id).join(layout::STATUS), "write", e).into())
    }

    /// A session's base fingerprints. Missing, damaged or forged: refused (without them a
    /// commit could not tell that someone else changed a path).
    pub fn load_fingerprints(&self, id: &str) -> Result<Fingerprints, StateError> {
        let rel = Self::tx_rel(id, layout::FINGERPRINTS);
        let path = self.root.join(&rel);
        let forged = || StateError::Forged { path: path.clone(), fix: "roll the transaction back and redo it" };
        let bytes = match fsx::read_small(self.fd(), &rel, LARGE) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(forged()),
            Err(e) => return Err(PathError::new(&path, "read", e).into()),
        };
        let body = self.seal().open(Domain::Fingerprints, id, &bytes).ok_or_else(forged)?;
        Fingerprints::parse(body).ok_or_else(forged)
    }

    /// Save a session's fingerprints durably (sealed, synced, then renamed into place).
    pub fn save_fingerprints(&self, id: &str, fps: &Fingerprints) -> Result<(), StateError> {
        let dir = self.dir(&format!("{}/{id}", layout::TX))?;
        let text = self.seal().seal(Domain::Fingerprints, id, &fps.render());
        fsx::replace(dir.as_fd(), layout::FINGERPRINTS, text.as_bytes(), true)
            .map_err(|e| PathError::new(&self.tx_dir(id).join(layout::FINGERPRINTS), "write", e).into())
    }

    /// The highest step number a session has used (0: none). Step numbers keep growing even
    /// when steps are undone, so a number names one step forever.
    pub fn last_step(&self, id: &str) -> u32 {
        fsx::read_small(self.fd(), &Self::tx_rel(id, layout::LAST_STEP), 64)
            .ok()
            .and_then(|b| std::str::from_utf8(&b).ok()?.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn set_last_step(&self, id: &str, n: u32) -> Result<(), StateError> {
        let dir = self.dir(&format!("{}/{id}", layout::TX))?;
        fsx::replace(dir.as_fd(), layout::LAST_STEP, n.to_string().as_bytes(), false)
            .map_err(|e| PathError::new(&self.tx_dir(id).join(layout::LAST_STEP), "write", e).into())
    }

    /// A session's `--allow-host` items from `begin` (none if it was begun without). Forged or
    /// damaged: refused, never read as a different list.
    pub fn allow_hosts(&self, id: &str) -> Result<Vec<String>, StateError> {
        let rel = Self::tx_rel(id, layout::ALLOW_HOSTS);
        let path = self.root.join(&rel);
        let bytes = match fsx::read_small(self.fd(), &rel, SMALL) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(PathError::new(&path, "read", e).into()),
        };
        let body = self
            .seal()
            .open(Domain::AllowHosts, id, &bytes)
            .ok_or_else(|| StateError::Forged { path: path.clone(), fix: "roll the transaction back" })?;
        Ok(body.lines().map(str::to_string).collect())
    }

    /// Record a session's `--allow-host` items (sealed, one per line; an item has no newline).
    pub fn set_allow_hosts(&self, id: &str, items: &[String]) -> Result<(), StateError> {
        let dir = self.dir(&format!("{}/{id}", layout::TX))?;
        let body: String = items.iter().map(|i| format!("{}\n", i.replace('\n', " "))).collect();
        let text = self.seal().seal(Domain::AllowHosts, id, &body);
        fsx::replace(dir.as_fd(), layout::ALLOW_HOSTS, text.as_bytes(), true)
            .map_err(|e| PathError::new(&self.tx_dir(id).join(layout::ALLOW_HOSTS), "write", e).into())
    }

    /// Block until this process is the only one working on transaction `id`.
    pub fn lock_tx(&self, id: &str) -> Result<Lock, StateError> {
        self.read_meta(id)?;
        self.lock_owner(id)
    }

    /// Create a session transaction's directory (no layers yet).
    pub fn create_session(&self, workspace: &Path, name: Option<&str>) -> Result<String, StateError> {
        self.create_session_with(workspace, name, None)
    }

    /// [`create_session`](Self::create_session), recording `strict_since`: for a session with
    /// strict isolation, the workspace's commit generation when it began (sealed in its meta,
    /// so the check at commit cannot be switched off on disk).
    pub fn create_session_with(
        &self,
        workspace: &Path,
        name: Option<&str>,
        strict_since: Option<u64>,
    ) -> Result<String, StateError> {
        if let Some(n) = name {
            if n.is_empty() || n.len() > MAX_NAME || n.chars().any(char::is_control) {
                return Err(StateError::BadName(n.to_string()));
            }
        }
        let id = new_tx_id();
        let dir = self.tx_dir(&id);
        let tx = self.dir(layout::TX)?;
        rustix::fs::mkdirat(&tx, id.as_str(), Mode::from_raw_mode(0o700)).map_err(at(&dir, "create"))?;
        let meta = TxMeta {
            workspace: workspace.to_path_buf(),
            kind: TxKind::Session,
            name: name.map(str::to_string),
            strict_since,
        };
        // Meta first: from then on the session is one `list` shows and `rollback` removes,
        // whatever a crash leaves of the rest.
        self.write_meta(&id, &meta, true)?;
        self.set_status(&id, Status::Open)?;
        self.save_fingerprints(&id, &Fingerprints::default())?;
        let steps = self.steps_root(&id, workspace)?;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&steps).map_err(at(
            &steps,
            "create session layers (outside the workspace; give --state-dir outside the workspace if this fails)",
        ))?;
        Ok(id)
    }

    /// Retire a transaction's directory in O(1): move it to `gone/`. Deleting it is then a
    /// collector's job ([`collect_retired`](Self::collect_retired)), and no one mistakes it
    /// for a live transaction. False if there was nothing to move (someone else did).
    pub fn retire_tx(&self, id: &str) -> Result<bool, StateError> {
        if !valid_id(id) {
            return Err(StateError::UnknownTx(id.to_string()));
        }
        // A transaction with a commit record is committed: its layers are what the record
        // applies, and only recovery, having applied it, may remove them (#14.1).
        let record = Path::new(layout::JOURNAL).join(layout::record_name(id));
        if rustix::fs::statat(self.fd(), &record, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
            return Err(StateError::Committed(id.to_string()));
        }
        let (tx, gone) = (self.dir(layout::TX)?, self.dir(layout::RETIRED)?);
        match fsx::rename_noreplace(tx.as_fd(), OsStr::new(id), gone.as_fd(), OsStr::new(id)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(PathError::new(&self.tx_dir(id), "retire", e).into()),
        }
    }

    /// How many retired directories wait for a collector (O(1): a directory's link count
    /// is two plus its subdirectories; ext4 says 1 beyond 65,000, which counts as many).
    pub fn retired_count(&self) -> u64 {
        match rustix::fs::statat(self.fd(), layout::RETIRED, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_nlink >= 2 => st.st_nlink - 2,
            Ok(_) => u64::MAX,
            Err(_) => 0,
        }
    }

    /// Whether a background collector should be started now: retired directories wait and no
    /// collector is at work. After a warm run, only beyond [`RETIRED_BOUND`] (its server
    /// deletes them when idle, off every caller's path); after a cold run, whenever any wait.
    pub fn collector_wanted(&self, cold: bool) -> bool {
        let waiting = self.retired_count();
        if waiting == 0 || (!cold && waiting <= RETIRED_BOUND) {
            return false;
        }
        // Free now means no collector runs; the one started takes the lock itself.
        matches!(self.gc_lock(false), Ok(Some(_)))
    }

    /// Whether no collector is at work right now.
    pub fn collector_idle(&self) -> bool {
        matches!(self.gc_lock(false), Ok(Some(_)))
    }

    fn gc_lock(&self, wait: bool) -> Result<Option<Lock>, StateError> {
        let path = self.root.join(layout::LOCKS).join(layout::GC_LOCK);
        let op = if wait { FlockOperation::LockExclusive } else { FlockOperation::NonBlockingLockExclusive };
        flock(&path, op)
    }

    /// The collector: delete retired directories until none is left, unless another
    /// collector is at it. Directories a warm server still has mounted (it share-locks their
    /// `work` until its overlay is detached) are left for the next pass. Returns how many
    /// were deleted.
    pub fn collect_retired(&self) -> Result<usize, StateError> {
        let mut deleted = 0;
        // Two rounds: a retirement that saw our lock held while we finished our last pass left
        // its directory to us, so look again once the lock is released.
        for _ in 0..2 {
            let Some(lock) = self.gc_lock(false)? else { return Ok(deleted) };
            let gone = self.dir(layout::RETIRED)?;
            loop {
                let names = fsx::list(gone.as_fd()).map_err(at(&self.root.join(layout::RETIRED), "list"))?;
                let mut progress = 0;
                for name in names {
                    if fsx::is_locked(gone.as_fd(), &Path::new(&name).join(layout::WORK)) {
                        continue;
                    }
                    // Best effort: a warm server may be deleting the same tree.
                    if fsx::remove_tree_at(gone.as_fd(), &name).is_ok() {
                        progress += 1;
                    }
                }
                deleted += progress;
                if progress == 0 {
                    break;
                }
            }
            drop(lock);
            if self.retired_count() == 0 {
                break;
            }
        }
        Ok(deleted)
    }

    /// Remove a transaction's directory now (and a session's layers next to the workspace).
    /// It is first moved to `gone/`, so a half-deleted directory is never mistaken for a live
    /// transaction, and of two removers only the one whose move succeeded deletes it.
    pub fn remove_tx(&self, id: &str) -> Result<(), StateError> {
        if !valid_id(id) {
            return Err(StateError::UnknownTx(id.to_string()));
        }
        self.drop_outside_layers(id);
        if !self.retire_tx(id)? {
            return Ok(());
        }
        // Once retired the transaction is gone; what deleting leaves (a collector at the same
        // tree, a directory it cannot enter) is the collector's.
        if let Ok(gone) = self.dir(layout::RETIRED) {
            let _ = fsx::remove_tree_at(gone.as_fd(), OsStr::new(id));
        }
        Ok(())
    }

    /// Delete a session's layers kept next to the workspace (when the state directory is
    /// inside it), found from the authenticated meta only: a transaction whose meta does not
    /// verify has none there that txbox would touch. Best effort: what stays is harmless.
    pub(crate) fn drop_outside_layers(&self, id: &str) {
        let Ok(meta) = self.read_meta(id) else { return };
        if meta.kind != TxKind::Session {
            return;
        }
        if let Ok(steps) = self.steps_root(id, &meta.workspace) {
            if !steps.starts_with(&self.root) && remove_tree(&steps).is_ok() {
                // The shared `.<name>.txbox-layers`, once empty.
                if let Some(parent) = steps.parent() {
                    let _ = std::fs::remove_dir(parent);
                }
            }
        }
    }

    /// Discard transactions whose owning process is gone and which hold no open session:
    /// leftovers of a killed `run`, or of a session commit cut short before its commit
    /// record. Each is taken under its owner lock and moved aside before it is deleted, so
    /// concurrent recoveries never fight over one. `looked_at` counts the entries examined.
    pub fn discard_abandoned(&self, looked_at: &mut usize) -> Result<Vec<Abandoned>, StateError> {
        let mut out = Vec::new();
        for id in self.tx_ids()? {
            *looked_at += 1;
            let rel = Path::new(layout::TX).join(&id);
            // Only a real directory is a transaction; a symlink or a file is never acted on.
            let Ok(dir) = fsx::dir_beneath(self.fd(), &rel) else { continue };
            let discard = match self.read_meta(&id) {
                Ok(m) if m.kind == TxKind::Session => matches!(self.status(&id), Ok(Status::Committing)),
                Ok(_) => true,
                // No meta that verifies: in the middle of its creation (a fresh directory,
                // or a spare just renamed to this id, whose meta still names its old id), or
                // a crash's leftover once old. A session (it has a status) is never
                // discarded on a guess.
                Err(_) => {
                    let st = rustix::fs::fstat(&dir).map_err(at(&self.tx_dir(&id), "stat"))?;
                    let changed = std::time::UNIX_EPOCH + std::time::Duration::from_secs(st.st_ctime.max(0) as u64);
                    let old = changed.elapsed().is_ok_and(|age| age > YOUNG);
                    old && rustix::fs::statat(&dir, layout::STATUS, AtFlags::SYMLINK_NOFOLLOW).is_err()
                }
            };
            if !discard {
                continue;
            }
            let record = Path::new(layout::JOURNAL).join(layout::record_name(&id));
            if rustix::fs::statat(self.fd(), &record, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                continue;
            }
            // An undo past its commit point: its trash holds what it took from the workspace.
            let undo = Path::new(layout::JOURNAL).join(layout::undo_record_name(&id));
            if rustix::fs::statat(self.fd(), &undo, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                continue;
            }
            let lock = match try_lock_beneath(dir.as_fd(), Path::new(layout::OWNER_LOCK)) {
                Ok(Some(l)) => Some(l),
                Ok(None) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(_) => continue,
            };
            // Retired, not deleted here: recovery runs before every transaction and stays
            // O(1) in what it deletes; the collector does the rest. The lock was taken through
            // the directory seen above: if it has moved since (its run recycled it as a
            // spare and let go), there is nothing here to discard.
            // Its commit was applied if its record was marked so: the process died after its
            // commit, before cleaning up (and perhaps before its audit entry).
            let landed = self.applied_record(dir.as_fd(), &id);
            self.drop_outside_layers(&id);
            let moved = self.retire_tx(&id)?;
            drop(lock);
            if moved {
                out.push(Abandoned { id, landed });
            }
        }
        Ok(out)
    }

    /// The record a transaction's commit left in its directory once applied
    /// ([`layout::APPLIED`]), if it verifies, with its time (ms since the epoch).
    fn applied_record(&self, dir: BorrowedFd<'_>, id: &str) -> Option<(CommitRecord, u64)> {
        let text = fsx::read_small(dir, Path::new(layout::APPLIED), LARGE).ok()?;
        let st = rustix::fs::statat(dir, layout::APPLIED, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let record = journal::parse(&text, &self.tx_dir(id).join(layout::APPLIED), self.seal(), id).ok()?;
        let ms = u64::try_from(st.st_mtime).unwrap_or(0) * 1000 + st.st_mtime_nsec / 1_000_000;
        Some((record, ms))
    }

    /// The state directory's space reserve, tended at the start of every transaction: given up
    /// when less than it is free (so that the transaction, a deletion freeing space say, has
    /// room: #14.1), made again once the filesystem has room to spare. Costs a `statfs` and,
    /// when space is plentiful, a `stat`; making it, once, a `fallocate`.
    pub fn tend_reserve(&self) {
        let Ok(avail) = crate::check::available(self.fd()) else { return };
        if avail < layout::RESERVE_BYTES {
            self.release_reserve();
        } else if avail > 8 * layout::RESERVE_BYTES
            && rustix::fs::statat(self.fd(), layout::RESERVE, AtFlags::SYMLINK_NOFOLLOW).is_err()
        {
            self.make_reserve();
        }
    }

    /// Give up the space reserve if less than it is free (before a commit: its log lines,
    /// record and directories need room too).
    pub fn release_reserve_if_low(&self) {
        if crate::check::available(self.fd()).is_ok_and(|a| a < layout::RESERVE_BYTES) {
            self.release_reserve();
        }
    }

    /// Give up the space reserve; true if there was one (space was freed).
    pub fn release_reserve(&self) -> bool {
        rustix::fs::unlinkat(self.fd(), layout::RESERVE, AtFlags::empty()).is_ok()
    }

    /// Make the reserve: an unnamed file (`O_TMPFILE`, so a crash leaves nothing behind) whose
    /// blocks are allocated, then linked into place.
    fn make_reserve(&self) {
        let flags = OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC;
        let Ok(fd) = rustix::fs::openat(self.fd(), ".", flags, Mode::from_raw_mode(0o600)) else { return };
        if rustix::fs::fallocate(&fd, rustix::fs::FallocateFlags::empty(), 0, layout::RESERVE_BYTES).is_err() {
            return;
        }
        use std::os::fd::AsRawFd;
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        // Another process may have made one meanwhile (EEXIST): then ours goes with its fd.
        let _ = rustix::fs::linkat(
            rustix::fs::CWD,
            proc_path.as_str(),
            self.fd(),
            layout::RESERVE,
            AtFlags::SYMLINK_FOLLOW,
        );
    }

    /// Keep the directory of a transaction that left nothing in it (a run that wrote nothing,
    /// or rolled back nothing) for the next transaction, instead of deleting it: one rename
    /// now, one rename then. On ext4 without a journal a new inode may not reuse one freed in
    /// the last minutes, and the allocator scans past every such inode: with directories
    /// created and deleted per transaction that made each `begin` slower the more
    /// transactions ran (up to ~2 ms here). False when the directory cannot serve again or
    /// enough spares are kept; the caller then deletes or retires it as before. The caller
    /// still holds the transaction's owner lock, so recovery never takes it for abandoned.
    pub fn recycle_tx(&self, id: &str) -> bool {
        if !reusable(&self.tx_dir(id)) {
            return false;
        }
        let Ok(tx) = self.dir(layout::TX) else { return false };
        // A slot that holds a spare refuses the rename.
        (0..layout::SPARES).any(|slot| {
            fsx::rename_noreplace(tx.as_fd(), OsStr::new(id), tx.as_fd(), OsStr::new(&layout::spare_name(slot))).is_ok()
        })
    }

    /// Take a spare directory as `id`; false if there is none. The spare keeps the `meta` of
    /// the transaction that left it, sealed for that transaction's id: until this one's is
    /// written, recovery sees a young directory without a valid meta and leaves it alone.
    ///
    /// A spare whose overlay a warm server still keeps (its `work` share-locked: the server lets
    /// a run's view go only when idle, as the last reference syncs the whole filesystem) is
    /// passed over rather than waited for. The server never locks a spare anew, so a spare seen
    /// free stays free.
    fn claim_spare(&self, id: &str) -> bool {
        let Ok(tx) = self.dir(layout::TX) else { return false };
        (0..layout::SPARES).any(|slot| {
            let spare = layout::spare_name(slot);
            !fsx::is_locked(tx.as_fd(), &Path::new(&spare).join(layout::WORK))
                && fsx::rename_noreplace(tx.as_fd(), OsStr::new(&spare), tx.as_fd(), OsStr::new(id)).is_ok()
        })
    }
}

/// An explicitly named state directory: its real path (the operator named it, symlinks and
/// all) if it exists, else as given.
fn resolve_explicit(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// The state directories on other filesystems, from the base directory's registry: each
/// line sealed with the key alone, so a line someone else wrote is skipped.
fn registered(base: &Path, key: &Key) -> Vec<PathBuf> {
    let seal = Seal::unbound(key.clone());
    let Ok(dir) = layout::private_dir(base, false) else { return Vec::new() };
    let Ok(bytes) = fsx::read_small(dir.as_fd(), Path::new(layout::REGISTRY), 1 << 20) else { return Vec::new() };
    let mut out = Vec::new();
    for line in String::from_utf8_lossy(&bytes).lines() {
        let Some((h, mac)) = line.split_once(' ') else { continue };
        if seal.verify(Domain::Registry, "", h.as_bytes(), mac) {
            if let Some(p) = path_from_hex(h).filter(|p| layout::is_normal_absolute(p) && !out.contains(p)) {
                out.push(p);
            }
        }
    }
    out
}

fn leak_fix(symlink: bool) -> &'static str {
    if symlink {
        "it is a symlink, not a record txbox wrote; delete it"
    } else {
        "it is not a record txbox wrote for this transaction; delete it"
    }
}

/// The complete lines of a commit-log excerpt as (generation, rest). A last line without its
/// newline was cut by a crash: it was never followed by its commit, so it does not count.
fn complete_lines(text: &[u8]) -> Vec<(u64, String)> {
    let whole = match text.iter().rposition(|b| *b == b'\n') {
        Some(i) => &text[..i],
        None => return Vec::new(),
    };
    whole
        .split(|b| *b == b'\n')
        .filter_map(|l| {
            let line = String::from_utf8_lossy(l);
            let (g, rest) = line.split_once(' ').unwrap_or((&line, ""));
            g.parse::<u64>().ok().map(|g| (g, rest.to_string()))
        })
        .collect()
}

/// The end of the log, from the first complete line whose generation is at or before `since`
/// (or the whole file). Lines before the excerpt's first newline may be cut and are dropped.
fn tail_after(f: &mut File, since: u64) -> io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let len = f.seek(SeekFrom::End(0))?;
    let mut chunk = 4096u64;
    loop {
        let start = len.saturating_sub(chunk);
        f.seek(SeekFrom::Start(start))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        if start == 0 {
            return Ok(buf);
        }
        if let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let rest = buf.split_off(nl + 1);
            if complete_lines(&rest).first().is_some_and(|(g, _)| *g <= since) {
                return Ok(rest);
            }
        }
        chunk = chunk.saturating_mul(4);
    }
}

/// Whether a finished run's directory can serve another run exactly as a new one would: only
/// `owner.lock`, `meta`, an empty `upper` without extended attributes (overlayfs may have
/// marked it opaque or impure) and a `work` holding at most overlayfs's own empty `work`.
fn reusable(dir: &Path) -> bool {
    let names = |p: &Path| -> Option<Vec<std::ffi::OsString>> {
        std::fs::read_dir(p).ok()?.map(|e| e.ok().map(|e| e.file_name())).collect()
    };
    let Some(mut top) = names(dir) else { return false };
    top.sort();
    if top != [layout::META, layout::OWNER_LOCK, layout::UPPER, layout::WORK] {
        return false;
    }
    let upper = dir.join(layout::UPPER);
    // overlayfs records the instance's uuid on the upper root of every mount; it says nothing
    // about the view (unlike opaque, impure, redirect or origin) and a persistent overlay
    // keeps it across mounts, as a reused upper does here.
    let harmless = |x: &std::ffi::OsString| x == "user.overlay.uuid" || x == "trusted.overlay.uuid";
    let empty_upper = names(&upper).is_some_and(|n| n.is_empty())
        && crate::meta::list_xattrs(&upper).is_ok_and(|x| x.iter().all(harmless));
    let work = dir.join(layout::WORK);
    let clean_work = match names(&work) {
        Some(n) if n.is_empty() => true,
        Some(n) if n == ["work"] => {
            // overlayfs makes its own `work` mode 0000: without root it cannot be listed until
            // its owner (this user, in a user namespace's mount) gives itself read access; the
            // next mount replaces it anyway.
            let inner = work.join("work");
            names(&inner)
                .or_else(|| readable_by_owner(&inner).then(|| names(&inner)).flatten())
                .is_some_and(|w| w.is_empty())
        }
        _ => false,
    };
    let real_dirs =
        [layout::UPPER, layout::WORK].iter().all(|d| std::fs::symlink_metadata(dir.join(d)).is_ok_and(|m| m.is_dir()));
    empty_upper && clean_work && real_dirs
}

/// Give a directory of this user's that its owner cannot read (overlayfs's `work/work`, 0000)
/// read and search permission for its owner; false if it is not such a directory.
fn readable_by_owner(dir: &Path) -> bool {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Ok(md) = std::fs::symlink_metadata(dir) else { return false };
    md.is_dir()
        && md.uid() == rustix::process::geteuid().as_raw()
        && md.mode() & 0o500 != 0o500
        && std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).is_ok()
}

/// A transaction recovery retired: its process was gone and it had no commit record.
#[derive(Debug, Clone)]
pub struct Abandoned {
    pub id: String,
    /// Its applied commit record and when it was written: the transaction landed.
    pub landed: Option<(CommitRecord, u64)>,
}

/// A transaction's directory, created and owned by this process.
#[derive(Debug)]
pub struct TxDir {
    pub id: String,
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub trash: PathBuf,
    /// Where its root started (`session::mirror_root`): a held run keeps it.
    pub root_base: crate::session::RootBase,
    _owner: Lock,
}

/// What a transaction is, stored sealed in `tx/<id>/meta`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxMeta {
    pub workspace: PathBuf,
    pub kind: TxKind,
    /// A session's name, given at `begin`.
    pub name: Option<String>,
    /// Strict isolation: the workspace's commit generation when the session began.
    pub strict_since: Option<u64>,
}

impl TxMeta {
    fn render(&self) -> String {
        let mut s = format!("workspace {}\nkind {}\n", path_to_hex(&self.workspace), self.kind.as_str());
        if let Some(n) = &self.name {
            s.push_str(&format!("name {}\n", hex(n.as_bytes())));
        }
        if let Some(g) = self.strict_since {
            s.push_str(&format!("strict {g}\n"));
        }
        s
    }

    /// Parse a verified body; the workspace must be a plain absolute path.
    fn parse(body: &str) -> Option<TxMeta> {
        let mut lines = body.lines();
        let workspace = path_from_hex(lines.next()?.strip_prefix("workspace ")?)?;
        let kind = TxKind::parse(lines.next()?.strip_prefix("kind ")?)?;
        let mut next = lines.next();
        let name = match next.and_then(|l| l.strip_prefix("name ")) {
            Some(h) => {
                next = lines.next();
                Some(String::from_utf8(crate::hex::unhex(h)?).ok()?)
            }
            None => None,
        };
        let strict_since = match next {
            Some(l) => {
                next = lines.next();
                Some(l.strip_prefix("strict ")?.parse().ok()?)
            }
            None => None,
        };
        (layout::is_normal_absolute(&workspace) && next.is_none()).then_some(TxMeta {
            workspace,
            kind,
            name,
            strict_since,
        })
    }
}

/// One commit of a workspace's commit log ([`StateDir::commit_history`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub generation: u64,
    /// The transaction that logged it (logs written before undo existed do not say).
    pub tx: Option<String>,
    /// It failed before its commit point: nothing changed.
    pub cancelled: bool,
    pub paths: Vec<PathBuf>,
}

/// A fresh transaction id: 16 random hex digits.
pub fn new_tx_id() -> String {
    let mut b = [0u8; 8];
    crate::seal::random(&mut b);
    hex(&b)
}

impl TxDir {
    /// Create `tx/<id>/{upper,work}` for `workspace`. The upper root copies the workspace root's
    /// mode, owner and committed extended attributes, because overlay shows the upper root's
    /// attributes as the merged root's.
    pub fn create(state: &StateDir, workspace: &Path, kind: TxKind) -> Result<TxDir, StateError> {
        let id = new_tx_id();
        let dir = state.tx_dir(&id);
        // A spare left by an earlier transaction (`recycle_tx`) has every piece already.
        let reused = state.claim_spare(&id);
        if !reused {
            let tx = state.dir(layout::TX)?;
            rustix::fs::mkdirat(&tx, id.as_str(), Mode::from_raw_mode(0o700)).map_err(at(&dir, "create"))?;
        }
        let owner = state.lock_owner(&id)?;
        let (upper, work) = (dir.join(layout::UPPER), dir.join(layout::WORK));
        if reused {
            // A spare is claimed only when its `work` is not locked (`claim_spare`); should a
            // server hold it all the same, its overlay must be gone first: wait for that.
            fsx::wait_unlocked(&work).map_err(at(&work, "wait for the warm server to release"))?;
        }
        state.write_meta(
            &id,
            &TxMeta { workspace: workspace.to_path_buf(), kind, name: None, strict_since: None },
            false,
        )?;
        if !reused {
            // Writable by us until its attributes are the workspace root's (a `user.*` name
            // cannot be set on a directory of mode 0555 without root).
            std::fs::DirBuilder::new().mode(0o700).create(&upper).map_err(at(&upper, "create"))?;
            std::fs::DirBuilder::new().mode(0o700).create(&work).map_err(at(&work, "create"))?;
        }
        // Mode, times, owner and extended attributes of the workspace root, so an untouched
        // root is not a change.
        let root_base = crate::session::mirror_root(&upper, workspace).map_err(at(&upper, "mirror workspace root"))?;
        let trash = dir.join(layout::TRASH);
        Ok(TxDir { id, dir, upper, work, trash, root_base, _owner: owner })
    }
}

/// Held transactions (the commit-time policy's `hold`): why they wait, and a run made a
/// session so that `diff`, `approve` and `rollback` take it from there.
impl StateDir {
    /// Record durably (sealed) why session `id` is held. The text is the caller's.
    pub fn set_hold(&self, id: &str, text: &str) -> Result<(), StateError> {
        let dir = self.dir(&format!("{}/{id}", layout::TX))?;
        // A sealed body is whole lines.
        let body = if text.ends_with('\n') { text.to_string() } else { format!("{text}\n") };
        let sealed = self.seal().seal(Domain::Hold, id, &body);
        fsx::replace(dir.as_fd(), layout::HOLD, sealed.as_bytes(), true)
            .map_err(|e| PathError::new(&self.tx_dir(id).join(layout::HOLD), "write", e).into())
    }

    /// Why session `id` is held, if it is (None: it never was). A record that does not verify
    /// is refused.
    pub fn hold(&self, id: &str) -> Result<Option<String>, StateError> {
        let rel = Self::tx_rel(id, layout::HOLD);
        let bytes = match fsx::read_small(self.fd(), &rel, SMALL) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(PathError::new(&self.root.join(&rel), "read", e).into()),
        };
        let forged = || StateError::Forged { path: self.root.join(&rel), fix: "roll the transaction back" };
        let body = self.seal().open(Domain::Hold, id, &bytes).ok_or_else(forged)?;
        Ok(Some(body.trim_end_matches('\n').to_string()))
    }

    /// Keep a run whose commit was held as a session of one step, under the same id: its upper
    /// and work become step 1's, `fps` (taken under the workspace lock when it was held) its
    /// base, `hold` why it waits. The meta, written last and durably, is the moment it becomes
    /// a session; a crash before leaves a run, which recovery discards as any other.
    pub fn hold_run(&self, tx: &TxDir, workspace: &Path, fps: &Fingerprints, hold: &str) -> Result<(), StateError> {
        let id = tx.id.as_str();
        // A warm server may still have the run's overlay mounted: wait until it lets go.
        fsx::wait_unlocked(&tx.work).map_err(at(&tx.work, "wait for the warm server to release"))?;
        let steps = self.steps_root(id, workspace)?;
        let step = steps.join("1");
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&step).map_err(at(&step, "create"))?;
        let from = self.dir(&format!("{}/{id}", layout::TX))?;
        let to = rustix::fs::open(
            &step,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(at(&step, "open"))?;
        for name in [layout::UPPER, layout::WORK] {
            fsx::rename_noreplace(from.as_fd(), OsStr::new(name), to.as_fd(), OsStr::new(name))
                .map_err(at(&tx.dir.join(name), "move into step 1"))?;
        }
        self.set_last_step(id, 1)?;
        self.save_fingerprints(id, fps)?;
        self.set_hold(id, hold)?;
        self.set_status(id, Status::Held)?;
        // A held run waits for a person, who judges it later: only overlaps with its own paths
        // (the fingerprints) refuse the approval, not strict isolation's "anything committed".
        self.write_meta(
            id,
            &TxMeta { workspace: workspace.to_path_buf(), kind: TxKind::Session, name: None, strict_since: None },
            true,
        )
    }
}

impl StateDir {
    /// Take the owner lock of a transaction directory (blocking: the run that recycled a
    /// spare this process just claimed releases its lock right after).
    fn lock_owner(&self, id: &str) -> Result<Lock, StateError> {
        let path = self.tx_dir(id).join(layout::OWNER_LOCK);
        let fd = fsx::open_beneath(
            self.fd(),
            &Self::tx_rel(id, layout::OWNER_LOCK),
            OFlags::RDWR | OFlags::CREATE,
            Mode::from_raw_mode(0o600),
        )
        .map_err(at(&path, "open lock"))?;
        rustix::fs::flock(&fd, FlockOperation::LockExclusive).map_err(at(&path, "lock"))?;
        Ok(Lock { _file: File::from(fd) })
    }
}

/// For tests of what waits for a warm server ([`fsx::wait_unlocked`]): its lock, and the check.
#[cfg(test)]
pub(crate) mod lock_tests {
    use super::*;

    /// What a warm server holds while its overlay uses `work`: a shared `flock` on it.
    pub(crate) fn held_as_a_warm_server_does(work: &Path) -> io::Result<File> {
        let held = File::open(work)?;
        rustix::fs::flock(&held, FlockOperation::LockShared)?;
        Ok(held)
    }

    /// Run `f` on a thread: it must not finish while `held` is held (then `meanwhile` runs),
    /// and must finish once it is dropped. Returns what `f` returned.
    pub(crate) fn waits_for_release<T: Send + 'static>(
        held: File,
        f: impl FnOnce() -> T + Send + 'static,
        meanwhile: impl FnOnce(),
    ) -> T {
        let (done, finished) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            let out = f();
            let _ = done.send(());
            out
        });
        // Something that did not wait would be done at once.
        assert!(
            finished.recv_timeout(std::time::Duration::from_millis(300)).is_err(),
            "went ahead while a warm server held the lock"
        );
        meanwhile();
        drop(held);
        assert!(
            finished.recv_timeout(std::time::Duration::from_secs(20)).is_ok(),
            "still waiting after the lock was released"
        );
        match worker.join() {
            Ok(out) => out,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

#[cfg(test)]
mod tests;
