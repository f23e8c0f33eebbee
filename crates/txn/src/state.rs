//! The state directory: where transactions, the journal, locks and the audit log live.
//!
//! ```text
//! STATE/
//!   tx/<id>/meta        what the transaction is (workspace, kind)
//!   tx/<id>/owner.lock  flocked by the process running the transaction
//!   tx/<id>/upper work  overlay layers (upper on the workspace's filesystem)
//!   tx/<id>/trash/      workspace objects removed by the commit, until cleanup
//!   journal/<id>.commit commit records: the commit point of each transaction
//!   locks/<hash>.lock   one per workspace: commits and recovery serialize on it
//!   audit.log           hash-chained JSON lines
//! ```

use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state directory {path}: {what}: {source}")]
    Io { path: PathBuf, what: &'static str, source: io::Error },
    #[error("unknown transaction id `{0}` (see `txbox list`)")]
    UnknownTx(String),
    #[error(
        "the state directory {state} is on another filesystem than the workspace {workspace}; \
         commits are renames, so put the state directory on the workspace's filesystem (--state-dir)"
    )]
    CrossDevice { state: PathBuf, workspace: PathBuf },
}

fn io_at<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> StateError + 'a {
    move |source| StateError::Io { path: path.to_path_buf(), what, source }
}

#[derive(Debug, Clone)]
pub struct StateDir {
    pub root: PathBuf,
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
        .open(path)
        .map_err(io_at(path, "open lock"))?;
    match rustix::fs::flock(&file, op) {
        Ok(()) => Ok(Some(Lock { _file: file })),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(io_at(path, "lock")(e.into())),
    }
}

/// Wait until no one holds a `flock` on the directory `dir` (take an exclusive lock, drop it).
/// A warm server share-locks the work directory of the overlay it has mounted until it has
/// detached it: this waits until the layers are no overlay's any more.
pub(crate) fn wait_unlocked(dir: &Path) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    Ok(rustix::fs::flock(&fd, FlockOperation::LockExclusive)?)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl StateDir {
    /// The state directory for `workspace`: `--state-dir` if given, else `<workspace>/.txbox`.
    pub fn for_workspace(explicit: Option<&Path>, workspace: &Path) -> StateDir {
        StateDir { root: explicit.map(Path::to_path_buf).unwrap_or_else(|| workspace.join(".txbox")) }
    }

    /// Create the layout if missing (mode 0700: other users have no business in it).
    pub fn ensure(&self) -> Result<(), StateError> {
        for sub in ["", "tx", "journal", "locks"] {
            let p = self.root.join(sub);
            match std::fs::DirBuilder::new().mode(0o700).create(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_at(&p, "create")(e)),
            }
        }
        Ok(())
    }

    pub fn check_same_fs(&self, workspace: &Path) -> Result<(), StateError> {
        let s = std::fs::metadata(&self.root).map_err(io_at(&self.root, "stat"))?;
        let w = std::fs::metadata(workspace).map_err(io_at(workspace, "stat workspace"))?;
        if s.dev() != w.dev() {
            return Err(StateError::CrossDevice { state: self.root.clone(), workspace: workspace.to_path_buf() });
        }
        Ok(())
    }

    pub fn tx_dir(&self, id: &str) -> PathBuf {
        self.root.join("tx").join(id)
    }

    pub fn record_path(&self, id: &str) -> PathBuf {
        self.root.join("journal").join(format!("{id}.commit"))
    }

    pub fn audit_path(&self) -> PathBuf {
        self.root.join("audit.log")
    }

    /// Block until this process holds the workspace's commit lock.
    pub fn lock_workspace(&self, workspace: &Path) -> Result<Lock, StateError> {
        let name = hex(&Sha256::digest(workspace.as_os_str().as_bytes())[..8]);
        let path = self.root.join("locks").join(format!("{name}.lock"));
        flock(&path, FlockOperation::LockExclusive)?
            .ok_or_else(|| io_at(&path, "lock")(io::ErrorKind::WouldBlock.into()))
    }

    fn commit_log(&self, workspace: &Path) -> PathBuf {
        let name = hex(&Sha256::digest(workspace.as_os_str().as_bytes())[..8]);
        self.root.join("locks").join(format!("{name}.commits"))
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
            Ok(mut f) => tail_after(&mut f, since).map_err(io_at(&log, "read commit log"))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, Vec::new())),
            Err(e) => return Err(io_at(&log, "read commit log")(e)),
        };
        let mut generation = 0;
        let mut paths = Vec::new();
        for (g, words) in complete_lines(&text) {
            generation = generation.max(g);
            if g > since {
                paths.extend(words.split(' ').filter(|w| !w.is_empty()).filter_map(crate::journal::path_from_hex));
            }
        }
        Ok((generation, paths))
    }

    /// Record that the next commit changes `paths` (before its commit point: a commit that then
    /// fails leaves a harmless extra entry, never a missing one). Under the workspace lock.
    pub fn log_commit(&self, workspace: &Path, paths: &[PathBuf]) -> Result<u64, StateError> {
        use std::io::Write;
        let generation = self.generation(workspace)? + 1;
        let mut line = generation.to_string();
        for p in paths {
            line.push(' ');
            line.push_str(&hex(p.as_os_str().as_bytes()));
        }
        line.push('\n');
        let log = self.commit_log(workspace);
        let mut f =
            std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(io_at(&log, "open commit log"))?;
        f.write_all(line.as_bytes()).map_err(io_at(&log, "append commit log"))?;
        Ok(generation)
    }

    /// Commit records waiting to be applied (left by a crash).
    pub fn pending_records(&self) -> Result<Vec<PathBuf>, StateError> {
        let dir = self.root.join("journal");
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_at(&dir, "list journal")(e)),
        };
        for entry in entries {
            let p = entry.map_err(io_at(&dir, "list journal"))?.path();
            if p.extension().is_some_and(|e| e == "commit") {
                out.push(p);
            }
        }
        out.sort();
        Ok(out)
    }

    /// All transaction ids with a directory.
    pub fn tx_ids(&self) -> Result<Vec<String>, StateError> {
        let dir = self.root.join("tx");
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_at(&dir, "list transactions")(e)),
        };
        for entry in entries {
            let e = entry.map_err(io_at(&dir, "list transactions"))?;
            if let Some(s) = e.file_name().to_str() {
                out.push(s.to_string());
            }
        }
        out.sort();
        Ok(out)
    }

    /// A session's status (`open`, `committing`), if recorded.
    pub fn status(&self, id: &str) -> Option<String> {
        std::fs::read_to_string(self.tx_dir(id).join("status")).ok().map(|s| s.trim().to_string())
    }

    pub fn set_status(&self, id: &str, status: &str) -> Result<(), StateError> {
        let p = self.tx_dir(id).join("status");
        let tmp = self.tx_dir(id).join("status.tmp");
        std::fs::write(&tmp, format!("{status}\n")).map_err(io_at(&tmp, "write status"))?;
        std::fs::rename(&tmp, &p).map_err(io_at(&p, "write status"))
    }

    /// Block until this process is the only one working on transaction `id`.
    pub fn lock_tx(&self, id: &str) -> Result<Lock, StateError> {
        let dir = self.tx_dir(id);
        if !valid_id(id) || !dir.join("meta").exists() {
            return Err(StateError::UnknownTx(id.to_string()));
        }
        flock(&dir.join("owner.lock"), FlockOperation::LockExclusive)?
            .ok_or_else(|| io_at(&dir, "lock tx")(io::ErrorKind::WouldBlock.into()))
    }

    /// Create a session transaction's directory (no layers yet).
    pub fn create_session(&self, workspace: &Path, name: Option<&str>) -> Result<String, StateError> {
        let id = new_tx_id();
        let dir = self.tx_dir(&id);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(io_at(&dir, "create tx dir"))?;
        TxMeta { workspace: workspace.to_path_buf(), kind: "session".into() }.write(&dir)?;
        if let Some(n) = name {
            std::fs::write(dir.join("name"), n).map_err(io_at(&dir, "write name"))?;
        }
        self.set_status(&id, "open")?;
        Ok(id)
    }

    /// Retire a transaction's directory in O(1): rename it aside as `.gone-<id>`. Deleting
    /// it is then anyone's job (`collect_garbage`, or recovery), and no one mistakes it for a
    /// live transaction.
    pub fn retire_tx(&self, id: &str) -> Result<(), StateError> {
        let dir = self.tx_dir(id);
        let aside = self.root.join("tx").join(format!(".gone-{id}"));
        match std::fs::rename(&dir, &aside) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_at(&dir, "move aside")(e)),
        }
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
        let dir = self.tx_dir(id);
        if !reusable(&dir) {
            return false;
        }
        // A slot that holds a spare refuses the rename (a non-empty directory is not replaced).
        (0..SPARES).any(|slot| std::fs::rename(&dir, self.spare_path(slot)).is_ok())
    }

    /// Take a spare directory as `dir`; false if there is none.
    fn claim_spare(&self, dir: &Path) -> bool {
        (0..SPARES).any(|slot| std::fs::rename(self.spare_path(slot), dir).is_ok())
    }

    fn spare_path(&self, slot: usize) -> PathBuf {
        self.root.join("tx").join(format!("{SPARE}{slot}"))
    }

    /// Delete every retired transaction directory retired at least `older_than` ago (younger
    /// ones belong to the warm server that will delete them when idle).
    pub fn collect_garbage(&self, older_than: std::time::Duration) -> Result<(), StateError> {
        let now = std::time::SystemTime::now();
        for id in self.tx_ids()? {
            if id.starts_with(".gone-") {
                // A young one is its collector's (a warm server deletes what the runs it served
                // retired, when idle); recovery takes over only if that collector is gone.
                let retired = std::fs::symlink_metadata(self.tx_dir(&id))
                    .ok()
                    .map(|m| std::time::UNIX_EPOCH + std::time::Duration::from_secs(m.ctime().max(0) as u64));
                if retired.and_then(|t| now.duration_since(t).ok()).is_some_and(|age| age < older_than) {
                    continue;
                }
                // Best effort: several collectors may race on the same directory.
                let _ = remove_tree(&self.tx_dir(&id));
            }
        }
        Ok(())
    }

    /// Remove a transaction's directory. It is first renamed aside, so a half-deleted
    /// directory is never mistaken for a live transaction.
    pub fn remove_tx(&self, id: &str) -> Result<(), StateError> {
        let dir = self.tx_dir(id);
        // A session whose layers live next to the workspace: remove them first (the record of
        // where they are is in the directory removed below).
        if dir.join("steps_root").exists() {
            let layers = crate::session::steps_root(&dir);
            remove_tree(&layers)?;
            if let Some(parent) = layers.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
        let aside = self.root.join("tx").join(format!(".gone-{id}"));
        match std::fs::rename(&dir, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at(&dir, "move aside")(e)),
        }
        remove_tree(&aside)
    }

    /// Transactions whose owning process is gone and which hold no open session: leftovers of a
    /// killed `run` (retired `.gone-*` directories are `collect_garbage`'s).
    pub fn abandoned(&self) -> Result<Vec<String>, StateError> {
        let mut out = Vec::new();
        for id in self.tx_ids()? {
            if id.starts_with(".gone-") || id.starts_with(SPARE) {
                continue;
            }
            let dir = self.tx_dir(&id);
            let meta = TxMeta::read(&dir).ok();
            // No meta yet: another process is creating this transaction right now (its lock
            // and meta follow the mkdir). Only a long-stale one is a crash leftover.
            if meta.is_none() {
                let young = std::fs::metadata(&dir)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_none_or(|age| age < std::time::Duration::from_secs(600));
                if young {
                    continue;
                }
            }
            // An open session outlives its processes; only one whose commit was cut short
            // before its commit record (status `committing`) is abandoned.
            if meta.as_ref().is_some_and(|m| m.kind == "session") && self.status(&id).as_deref() != Some("committing") {
                continue;
            }
            if self.record_path(&id).exists() {
                continue;
            }
            if flock(&dir.join("owner.lock"), FlockOperation::NonBlockingLockExclusive)?.is_some() {
                out.push(id);
            }
        }
        Ok(out)
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

/// The prefix of a spare transaction directory (`StateDir::recycle_tx`).
const SPARE: &str = ".spare-";
/// How many spare directories a state directory keeps.
const SPARES: usize = 4;

/// Whether a finished run's directory can serve another run exactly as a new one would: only
/// `owner.lock`, `meta`, an empty `upper` without extended attributes (overlayfs may have
/// marked it opaque or impure) and a `work` holding at most overlayfs's own empty `work`.
fn reusable(dir: &Path) -> bool {
    let names = |p: &Path| -> Option<Vec<std::ffi::OsString>> {
        std::fs::read_dir(p).ok()?.map(|e| e.ok().map(|e| e.file_name())).collect()
    };
    let Some(mut top) = names(dir) else { return false };
    top.sort();
    if top != ["meta", "owner.lock", "upper", "work"] {
        return false;
    }
    let upper = dir.join("upper");
    // overlayfs records the instance's uuid on the upper root of every mount; it says nothing
    // about the view (unlike opaque, impure, redirect or origin) and a persistent overlay
    // keeps it across mounts, as a reused upper does here.
    let harmless = |x: &std::ffi::OsString| x == "user.overlay.uuid" || x == "trusted.overlay.uuid";
    let empty_upper = names(&upper).is_some_and(|n| n.is_empty())
        && crate::meta::list_xattrs(&upper).is_ok_and(|x| x.iter().all(harmless));
    let work = dir.join("work");
    let clean_work = match names(&work) {
        Some(n) if n.is_empty() => true,
        Some(n) if n == ["work"] => names(&work.join("work")).is_some_and(|w| w.is_empty()),
        _ => false,
    };
    let real_dirs = ["upper", "work"].iter().all(|d| std::fs::symlink_metadata(dir.join(d)).is_ok_and(|m| m.is_dir()));
    empty_upper && clean_work && real_dirs
}

/// Remove a tree, tolerating its absence. Directories made unwritable by the command are made
/// writable first (we own everything in the upper layer).
pub fn remove_tree(path: &Path) -> Result<(), StateError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Ok(md) if !md.is_dir() => return std::fs::remove_file(path).map_err(io_at(path, "remove")),
        _ => {}
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            make_writable(path);
            std::fs::remove_dir_all(path).map_err(io_at(path, "remove"))
        }
        Err(e) => Err(io_at(path, "remove")(e)),
    }
}

fn make_writable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if md.is_dir() {
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
            if let Ok(rd) = std::fs::read_dir(path) {
                for e in rd.flatten() {
                    make_writable(&e.path());
                }
            }
        }
    }
}

/// A transaction's directory, created and owned by this process.
#[derive(Debug)]
pub struct TxDir {
    pub id: String,
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub trash: PathBuf,
    _owner: Lock,
}

/// What a transaction is, stored in `tx/<id>/meta`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxMeta {
    pub workspace: PathBuf,
    /// `run` (one command, owned by a live process) or `session` (begin/exec/commit).
    pub kind: String,
}

impl TxMeta {
    pub fn write(&self, dir: &Path) -> Result<(), StateError> {
        let text = format!("workspace {}\nkind {}\n", hex(self.workspace.as_os_str().as_bytes()), self.kind);
        let p = dir.join("meta");
        // Overwritten in place, not truncated first: freeing the file's block and allocating
        // another costs a discard on a filesystem mounted with `discard`, for a spare
        // directory's meta (see `recycle_tx`) on every transaction.
        let write = || -> io::Result<()> {
            let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(&p)?;
            io::Write::write_all(&mut f, text.as_bytes())?;
            f.set_len(text.len() as u64)
        };
        write().map_err(io_at(&p, "write meta"))
    }

    pub fn read(dir: &Path) -> Result<TxMeta, StateError> {
        let p = dir.join("meta");
        let text = std::fs::read_to_string(&p).map_err(io_at(&p, "read meta"))?;
        let mut ws = None;
        let mut kind = None;
        for line in text.lines() {
            if let Some(h) = line.strip_prefix("workspace ") {
                ws = crate::journal::path_from_hex(h);
            } else if let Some(k) = line.strip_prefix("kind ") {
                kind = Some(k.to_string());
            }
        }
        match (ws, kind) {
            (Some(workspace), Some(kind)) => Ok(TxMeta { workspace, kind }),
            _ => Err(io_at(&p, "parse meta")(io::ErrorKind::InvalidData.into())),
        }
    }
}

/// Transaction ids are 16 lowercase hex digits; anything else is refused before it can name
/// a path.
pub fn valid_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A fresh transaction id: 16 random hex digits.
pub fn new_tx_id() -> String {
    let mut b = [0u8; 8];
    let mut filled = 0;
    while filled < b.len() {
        match rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            // getrandom cannot fail on Linux ≥ 3.17 once the pool is initialised; fall back to
            // the clock rather than panic.
            Err(_) => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                b.copy_from_slice(&(t as u64 ^ u64::from(std::process::id())).to_le_bytes());
                break;
            }
        }
    }
    hex(&b)
}

impl TxDir {
    /// Create `tx/<id>/{upper,work}` for `workspace`. The upper root copies the workspace root's
    /// mode and owner, because overlay shows the upper root's attributes as the merged root's.
    pub fn create(state: &StateDir, workspace: &Path, kind: &str) -> Result<TxDir, StateError> {
        let id = new_tx_id();
        let dir = state.tx_dir(&id);
        // A spare left by an earlier transaction (`recycle_tx`) has every piece already.
        let reused = state.claim_spare(&dir);
        if !reused {
            std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(io_at(&dir, "create tx dir"))?;
        }
        let owner = flock(&dir.join("owner.lock"), FlockOperation::LockExclusive)?
            .ok_or_else(|| io_at(&dir, "lock tx")(io::ErrorKind::WouldBlock.into()))?;
        if reused {
            // The run that left it may have been served by a warm server, which detaches its
            // overlay after answering and share-locks `work` until then: wait for that.
            let work = dir.join("work");
            wait_unlocked(&work).map_err(io_at(&work, "wait for the warm server to release"))?;
        }
        TxMeta { workspace: workspace.to_path_buf(), kind: kind.to_string() }.write(&dir)?;
        let ws_md = std::fs::metadata(workspace).map_err(io_at(workspace, "stat workspace"))?;
        let upper = dir.join("upper");
        let work = dir.join("work");
        if !reused {
            std::fs::DirBuilder::new()
                .mode(ws_md.mode() & 0o7777)
                .create(&upper)
                .map_err(io_at(&upper, "create upper"))?;
            std::fs::DirBuilder::new().mode(0o700).create(&work).map_err(io_at(&work, "create work"))?;
        }
        // Mode (exactly: DirBuilder's is filtered by the umask), times and owner of the
        // workspace root, so an untouched root is not a change.
        crate::session::mirror_root(&upper, &ws_md).map_err(io_at(&upper, "mirror workspace root"))?;
        let trash = dir.join("trash");
        Ok(TxDir { id, dir, upper, work, trash, _owner: owner })
    }
}

/// For tests of what waits for a warm server ([`wait_unlocked`]): its lock, and the check.
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
mod tests {
    use super::lock_tests::{held_as_a_warm_server_does, waits_for_release};
    use super::*;

    #[test]
    fn a_spare_still_locked_by_a_warm_server_is_taken_only_once_released() -> Result<(), StateError> {
        let root = std::env::temp_dir().join(format!("txbox-spare-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).map_err(io_at(&root, "mkdir"))?;
        let state = StateDir { root: root.join("state") };
        state.ensure()?;
        let a = TxDir::create(&state, &root, "run")?;
        let held = held_as_a_warm_server_does(&a.work).map_err(io_at(&a.work, "flock"))?;
        let spare_work = a.work.clone();
        assert!(state.recycle_tx(&a.id));
        drop(a);
        let (st, ws) = (state.clone(), root.clone());
        let b = waits_for_release(
            held,
            move || TxDir::create(&st, &ws, "run"),
            || {
                assert!(!spare_work.exists(), "the claim renamed the spare before waiting");
            },
        )?;
        assert!(b.work.is_dir());
        drop(b);
        std::fs::remove_dir_all(&root).map_err(io_at(&root, "cleanup"))
    }

    #[test]
    fn an_empty_run_directory_serves_the_next_run_and_nothing_else() -> Result<(), StateError> {
        use std::os::unix::fs::MetadataExt;
        let root = std::env::temp_dir().join(format!("txbox-spare-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).map_err(io_at(&root, "mkdir"))?;
        let state = StateDir { root: root.join("state") };
        state.ensure()?;
        let ws = root.join("ws");
        std::fs::create_dir_all(&ws).map_err(io_at(&ws, "mkdir"))?;
        let ino = |p: &Path| std::fs::metadata(p).map(|m| m.ino()).unwrap_or(0);

        // A run that wrote nothing (overlayfs left its empty work/work and its uuid on the
        // upper root): kept, then reused.
        // As root, the first workspace belongs to someone else: the spare must not carry that
        // owner over to the next workspace (overlay shows it as the root's, a commit copies it).
        let root_user = rustix::process::geteuid().is_root();
        if root_user {
            std::os::unix::fs::chown(&ws, Some(1000), Some(1000)).map_err(io_at(&ws, "chown"))?;
        }
        let a = TxDir::create(&state, &ws, "run")?;
        if root_user {
            let up = std::fs::metadata(&a.upper).map_err(io_at(&a.upper, "stat"))?;
            assert_eq!((up.uid(), up.gid()), (1000, 1000), "a fresh upper takes the workspace's owner");
        }
        std::fs::create_dir(a.work.join("work")).map_err(io_at(&a.work, "mkdir"))?;
        rustix::fs::lsetxattr(&a.upper, "user.overlay.uuid", b"0123", rustix::fs::XattrFlags::empty())
            .map_err(|e| io_at(&a.upper, "xattr")(e.into()))?;
        let upper_ino = ino(&a.upper);
        assert!(state.recycle_tx(&a.id));
        drop(a);
        assert!(state.abandoned()?.is_empty(), "a spare is not an abandoned transaction");
        state.collect_garbage(std::time::Duration::ZERO)?;
        let b = TxDir::create(&state, &root, "run")?;
        assert_eq!(ino(&b.upper), upper_ino, "the spare was not reused");
        assert_eq!(TxMeta::read(&b.dir)?.workspace, root, "meta not rewritten");
        let (up, want) = (
            std::fs::metadata(&b.upper).map_err(io_at(&b.upper, "stat"))?,
            std::fs::metadata(&root).map_err(io_at(&root, "stat"))?,
        );
        assert_eq!(
            (up.uid(), up.gid(), up.mode()),
            (want.uid(), want.gid(), want.mode()),
            "the spare's upper mirrors the new workspace root"
        );
        assert!(std::fs::read_dir(&b.upper).map(|mut d| d.next().is_none()).unwrap_or(false));

        // What a run left behind keeps a directory from serving again.
        std::fs::write(b.upper.join("f"), "x").map_err(io_at(&b.upper, "write"))?;
        assert!(!state.recycle_tx(&b.id));
        std::fs::remove_file(b.upper.join("f")).map_err(io_at(&b.upper, "rm"))?;
        rustix::fs::lsetxattr(&b.upper, "user.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())
            .map_err(|e| io_at(&b.upper, "xattr")(e.into()))?;
        assert!(!state.recycle_tx(&b.id), "an opaque upper would hide the workspace");
        drop(b);
        let c = TxDir::create(&state, &ws, "run")?;
        std::fs::create_dir(&c.trash).map_err(io_at(&c.trash, "mkdir"))?;
        assert!(!state.recycle_tx(&c.id));
        drop(c);
        // Nor anything overlayfs's work directory still holds, nor a work that is no directory.
        for leftover in ["work/x", "index", "link"] {
            let d = TxDir::create(&state, &ws, "run")?;
            std::fs::create_dir_all(d.work.join("work")).map_err(io_at(&d.work, "mkdir"))?;
            if leftover == "link" {
                std::fs::remove_dir_all(&d.work).map_err(io_at(&d.work, "rm"))?;
                std::os::unix::fs::symlink(&d.upper, &d.work).map_err(io_at(&d.work, "symlink"))?;
            } else {
                std::fs::create_dir(d.work.join(leftover)).map_err(io_at(&d.work, "mkdir"))?;
            }
            assert!(!state.recycle_tx(&d.id), "work holding {leftover} was kept as a spare");
        }

        // No more than SPARES are kept.
        let runs: Vec<TxDir> = (0..SPARES + 1).map(|_| TxDir::create(&state, &ws, "run")).collect::<Result<_, _>>()?;
        let kept = runs.iter().filter(|t| state.recycle_tx(&t.id)).count();
        assert_eq!(kept, SPARES);
        std::fs::remove_dir_all(&root).map_err(io_at(&root, "cleanup"))?;
        Ok(())
    }

    #[test]
    fn commit_log_is_read_from_its_tail_with_the_same_answers() -> Result<(), StateError> {
        let root = std::env::temp_dir().join(format!("txbox-commitlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let state = StateDir { root: root.clone() };
        state.ensure()?;
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
            let got: Vec<PathBuf> =
                paths.into_iter().filter(|p| p.to_str().is_some_and(|s| s.starts_with('f'))).collect();
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
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).map_err(io_at(&log, "open"))?;
        std::io::Write::write_all(&mut f, b"3001 6631").map_err(io_at(&log, "append"))?;
        assert_eq!(state.generation(ws)?, 3000);
        assert!(state.commits_since(ws, 3000)?.1.is_empty());
        let _ = std::fs::remove_dir_all(&root);
        Ok(())
    }
}
