//! Every name in txbox's state, and where the state directory lives.
//!
//! ```text
//! BASE = ${XDG_STATE_HOME:-$HOME/.local/state}/txbox      0700, the user's own
//!   key                  the per-user secret (crate::seal), 0600
//!   elsewhere            state directories in use on other filesystems (sealed lines)
//! STATE = BASE when it is in the workspace's `Place`: filesystem and mount (else see `candidates`)
//!   txbox-state          the marker: this directory was made by txbox (sealed)
//!   tx/<id>/             a transaction: meta, owner.lock, upper, work, trash,  (a run)
//!                                       applied (its commit record, once applied)
//!                                       meta, owner.lock, status, steps/N/{upper,work},
//!                                       fingerprints, last_step, hold        (a session)
//!   tx/.spare-<n>        an empty run's directory kept for the next run
//!   gone/<id>            retired transaction directories, deleted by a collector
//!   kept/<id>/           a committed transaction's retained directory (undo data, crate::retain):
//!                        upper, trash, applied, retained, retain-pre, bytes, consumed
//!   kept/index           retained transactions in the order they were kept, with running totals
//!   kept/head            where in the index the oldest live entry may be; kept/pending: unmeasured;
//!                        kept/totals: how many are retained and their bytes
//!   journal/<id>.commit  commit records (sealed); journal/<id>.undo: undo records (crate::undo)
//!   locks/<hash>.lock    per-workspace commit lock; locks/<hash>.commits its commit log
//!   locks/gc.lock        held by the collector of `gone`; locks/kept.lock: the retention index's
//!   warm/                warm sandbox servers' sockets, locks and premounted views' directories
//!                        (`<socket>.next`; crate sandbox, through `StateDir::warm_dir`)
//!   audit.log            the hash-chained audit log
//!   audit.head           its head record: the last entry's number, hash and offset (sealed)
//!   reserve              space held back for commits on a full filesystem
//! ```
//!
//! Owns: the names above, the kinds and statuses of transactions, the base directory and the
//! choice of a workspace's state directory. Pure but for [`base_dir`] (the environment),
//! [`private_dir`] and [`mount_root`] (metadata only); reads and writes nothing else.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use sha2::{Digest, Sha256};

use crate::fsx::{self, PathError};
use crate::hex::hex;
use crate::seal::KeyError;

pub const KEY: &str = "key";
pub const MARKER: &str = "txbox-state";
pub const REGISTRY: &str = "elsewhere";
pub const TX: &str = "tx";
pub const JOURNAL: &str = "journal";
pub const LOCKS: &str = "locks";
pub const WARM: &str = "warm";
pub const RETIRED: &str = "gone";
pub const AUDIT: &str = "audit.log";
/// Retained transactions: what an undo needs (crate::retain).
pub const KEPT: &str = "kept";
pub const AUDIT_HEAD: &str = "audit.head";
/// A file of [`RESERVE_BYTES`] allocated blocks, given up when the filesystem is full so that
/// a commit (a deletion freeing space, say) can still be applied.
pub const RESERVE: &str = "reserve";
pub const RESERVE_BYTES: u64 = 4 << 20;
/// The directories every state directory has.
pub const SUBDIRS: [&str; 5] = [TX, JOURNAL, LOCKS, RETIRED, KEPT];
/// The collector's lock (in `locks`).
pub const GC_LOCK: &str = "gc.lock";
/// The retention index's lock (in `locks`): held while the index changes and while an undo
/// consumes retained transactions.
pub const KEPT_LOCK: &str = "kept.lock";

// Inside `kept/`.
/// Retained transactions in the order they were kept (crate::retain's index).
pub const KEPT_INDEX: &str = "index";
/// The index's head: the byte offset of its oldest line that may still be live.
pub const KEPT_HEAD: &str = "head";
/// Retained transactions whose size is still to be measured, one id a line.
pub const KEPT_PENDING: &str = "pending";
/// How many transactions are retained and how many bytes they hold: `COUNT BYTES [recount]`.
pub const KEPT_TOTALS: &str = "totals";

pub const SPARE_PREFIX: &str = ".spare-";
/// How many spare run directories a state directory keeps.
pub const SPARES: usize = 4;

// Inside `tx/<id>/`.
pub const META: &str = "meta";
pub const OWNER_LOCK: &str = "owner.lock";
pub const UPPER: &str = "upper";
pub const WORK: &str = "work";
pub const TRASH: &str = "trash";
/// A transaction's commit record once applied: moved here from the journal.
pub const APPLIED: &str = "applied";
pub const STEPS: &str = "steps";
pub const STATUS: &str = "status";
pub const FINGERPRINTS: &str = "fingerprints";
pub const LAST_STEP: &str = "last_step";
/// A session's `--allow-host` items from `begin` (sealed), for every step.
pub const ALLOW_HOSTS: &str = "allow_hosts";
/// Why a held transaction waits for a person (sealed): what the commit-time policy found.
pub const HOLD: &str = "hold";
pub const DIFF_PREFIX: &str = "diff-";

// Inside `tx/<id>/` (written while committing) and `kept/<id>/` (after).
/// What an undo needs that the commit record does not say, taken before the commit point (sealed).
pub const RETAIN_PRE: &str = "retain-pre";
/// The commit or undo record once applied (sealed): a commit's is its [`APPLIED`] mark, moved
/// along with its directory into `kept/`; an undo's is moved there from the journal.
pub const KEPT_RECORD: &str = APPLIED;
/// What an undo needs, taken after the transaction was applied (sealed); its presence makes a
/// retained transaction undoable.
pub const RETAINED: &str = "retained";
/// The bytes a retained directory holds, as last counted (a number; `~N`: an estimate).
pub const BYTES: &str = "bytes";
/// Present once an undo consumed the transaction: its data then belongs to that undo.
pub const CONSUMED: &str = "consumed";

pub const RECORD_SUFFIX: &str = ".commit";
/// Undo records (`journal/<id>.undo`): an undo's commit point.
pub const UNDO_SUFFIX: &str = ".undo";
pub const TMP_SUFFIX: &str = ".tmp";

/// The state directory inside the workspace: the last resort (see [`candidates`]), and
/// where txbox before this layout kept its state by default.
pub const IN_WORKSPACE: &str = ".txbox";
/// Session layers next to a workspace whose state directory lies inside it (overlayfs refuses
/// a lower layer nested in another): `<parent>/.<name>.txbox-layers/<id>`.
pub const LAYERS_SUFFIX: &str = ".txbox-layers";
/// A per-user state directory at the root of the workspace's mount: `.txbox-state-<uid>`.
pub const AT_MOUNT_PREFIX: &str = ".txbox-state-";

/// What a transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxKind {
    /// One command, owned by a live process (`run`).
    Run,
    /// `begin` / `exec` / `commit`: outlives the processes that work on it.
    Session,
    /// `undo`: owned by a live process, like a run, but runs no command.
    Undo,
}

impl TxKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TxKind::Run => "run",
            TxKind::Session => "session",
            TxKind::Undo => "undo",
        }
    }

    pub fn parse(s: &str) -> Option<TxKind> {
        match s {
            "run" => Some(TxKind::Run),
            "session" => Some(TxKind::Session),
            "undo" => Some(TxKind::Undo),
            _ => None,
        }
    }
}

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Open,
    /// Its commit began: a crash before the commit record means it is to be discarded.
    Committing,
    /// The commit-time policy held it for a person (`txbox approve`, or `rollback`); no more
    /// steps run in it.
    Held,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Open => "open",
            Status::Committing => "committing",
            Status::Held => "held",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "open" => Some(Status::Open),
            "committing" => Some(Status::Committing),
            "held" => Some(Status::Held),
            _ => None,
        }
    }
}

/// Transaction ids are 16 lowercase hex digits; anything else is refused before it can name
/// a path.
pub fn valid_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `journal/<id>.commit`.
pub fn record_name(id: &str) -> String {
    format!("{id}{RECORD_SUFFIX}")
}

/// A journal entry's transaction id, and whether it is a temporary file (`<id>.commit.tmp`);
/// None for anything that is neither.
pub fn record_id(name: &OsStr) -> Option<(&str, bool)> {
    let name = std::str::from_utf8(name.as_bytes()).ok()?;
    let (stem, tmp) = match name.strip_suffix(TMP_SUFFIX) {
        Some(s) => (s, true),
        None => (name, false),
    };
    let id = stem.strip_suffix(RECORD_SUFFIX)?;
    valid_id(id).then_some((id, tmp))
}

/// `journal/<id>.undo`.
pub fn undo_record_name(id: &str) -> String {
    format!("{id}{UNDO_SUFFIX}")
}

/// An undo record's transaction id, and whether it is a temporary file (`<id>.undo.tmp`).
pub fn undo_record_id(name: &OsStr) -> Option<(&str, bool)> {
    let name = std::str::from_utf8(name.as_bytes()).ok()?;
    let (stem, tmp) = match name.strip_suffix(TMP_SUFFIX) {
        Some(s) => (s, true),
        None => (name, false),
    };
    let id = stem.strip_suffix(UNDO_SUFFIX)?;
    valid_id(id).then_some((id, tmp))
}

/// `spare-<slot>` in `tx`.
pub fn spare_name(slot: usize) -> String {
    format!("{SPARE_PREFIX}{slot}")
}

/// The name of a workspace's files in `locks`: a hash of its path.
fn workspace_hash(workspace: &Path) -> String {
    hex(&Sha256::digest(workspace.as_os_str().as_bytes())[..8])
}

pub fn lock_name(workspace: &Path) -> String {
    format!("{}.lock", workspace_hash(workspace))
}

pub fn commit_log_name(workspace: &Path) -> String {
    format!("{}.commits", workspace_hash(workspace))
}

/// Whether `p` is an absolute path without `.`, `..` or empty components: the only form a
/// workspace read back from a record or `meta` may have.
pub fn is_normal_absolute(p: &Path) -> bool {
    p.is_absolute() && p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// Where a session's step layers live, derived from what cannot be forged: the state root,
/// the transaction id and its (authenticated) workspace. Normally `STATE/tx/<id>/steps`; when
/// the state directory lies inside the workspace, next to the workspace (see
/// [`LAYERS_SUFFIX`]). None when the workspace is `/` with the state inside it.
pub fn steps_root(state_root: &Path, id: &str, workspace: &Path) -> Option<PathBuf> {
    if !state_root.starts_with(workspace) {
        return Some(state_root.join(TX).join(id).join(STEPS));
    }
    Some(layers_next_to(workspace)?.join(id))
}

/// One overlay layer of a transaction: its id, its step (a session's; None for a run) and
/// whether it is the upper directory (else the work directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerName {
    pub id: String,
    pub step: Option<u32>,
    pub upper: bool,
}

/// Which layer `rel` (a path relative to a state directory) is, if it is one:
/// `tx/<id>/{upper,work}` (a run) or `tx/<id>/steps/<n>/{upper,work}` (a session's step), with
/// a valid id and a plain decimal step. A warm server lays overlays only on these.
pub fn layer_name(rel: &Path) -> Option<LayerName> {
    let parts: Vec<&str> = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => n.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let part = |p: &str| match p {
        UPPER => Some(true),
        WORK => Some(false),
        _ => None,
    };
    let (id, step, upper) = match parts.as_slice() {
        [TX, id, p] => (*id, None, part(p)?),
        [TX, id, STEPS, n, p] if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0') => {
            (*id, Some(n.parse().ok()?), part(p)?)
        }
        _ => return None,
    };
    valid_id(id).then(|| LayerName { id: id.to_string(), step, upper })
}

/// `<parent>/.<name>.txbox-layers` for a workspace.
pub fn layers_next_to(workspace: &Path) -> Option<PathBuf> {
    let (parent, name) = (workspace.parent()?, workspace.file_name()?);
    let mut dir_name = std::ffi::OsString::from(".");
    dir_name.push(name);
    dir_name.push(LAYERS_SUFFIX);
    Some(parent.join(dir_name))
}

/// The base directory: `${XDG_STATE_HOME:-$HOME/.local/state}/txbox`. A relative
/// `XDG_STATE_HOME` is ignored, as the XDG specification asks.
pub fn base_dir() -> Result<PathBuf, KeyError> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    base_dir_from(env("XDG_STATE_HOME"), env("HOME"))
}

fn base_dir_from(xdg_state_home: Option<PathBuf>, home: Option<PathBuf>) -> Result<PathBuf, KeyError> {
    match (xdg_state_home.filter(|p| p.is_absolute()), home.filter(|p| p.is_absolute())) {
        (Some(x), _) => Ok(x.join("txbox")),
        (None, Some(h)) => Ok(h.join(".local/state/txbox")),
        (None, None) => Err(KeyError::NoHome),
    }
}

/// Open the directory `path`, which must be this user's and closed to everyone else (mode
/// 0700 or stricter) and not a symlink; with `create`, made (parents too, 0700) if missing.
/// Parents may be symlinks (a home on another disk): they are the user's own setup; the
/// directory itself may not, or anyone who could plant one there would choose where txbox
/// keeps its key.
pub fn private_dir(path: &Path, create: bool) -> Result<OwnedFd, KeyError> {
    if create {
        match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(KeyError::Unsafe {
                    path: path.to_path_buf(),
                    why: "cannot be made by this user (permission denied)".into(),
                    fix: "set XDG_STATE_HOME or HOME to a directory of this user's",
                })
            }
            Err(e) => return Err(PathError::new(path, "create", e).into()),
        }
    }
    let unsafe_dir = |why: String, fix: &'static str| KeyError::Unsafe { path: path.to_path_buf(), why, fix };
    let fd =
        rustix::fs::open(path, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| match e {
                rustix::io::Errno::LOOP => unsafe_dir("is a symlink".into(), "remove it"),
                rustix::io::Errno::NOTDIR => unsafe_dir("is not a directory".into(), "remove it"),
                e => PathError::new(path, "open", e.into()).into(),
            })?;
    let st = rustix::fs::fstat(&fd).map_err(fsx::at(path, "stat"))?;
    if st.st_uid != rustix::process::geteuid().as_raw() {
        return Err(unsafe_dir(
            format!("belongs to uid {}, not to this user ({})", st.st_uid, rustix::process::geteuid().as_raw()),
            "set XDG_STATE_HOME or HOME to a directory of this user's",
        ));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(unsafe_dir(format!("has mode {:o}", st.st_mode & 0o7777), "chmod 700 it"));
    }
    Ok(fd)
}

/// Where a directory is, for renames: its filesystem and its mount. Commits are renames, and a
/// rename never crosses a mount, not even between two mounts of one filesystem (a bind mount:
/// `EXDEV`), so where the kernel says (`STATX_MNT_ID`, Linux 5.8) the mount counts too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    dev: u64,
    mount: Option<u64>,
}

impl Place {
    /// Where `path` is (following symlinks, as the paths txbox renames through do).
    pub fn of(path: &Path) -> std::io::Result<Place> {
        Self::statx(rustix::fs::CWD, path, rustix::fs::AtFlags::empty())
    }

    /// Where the open directory `fd` is.
    pub fn of_fd(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Place> {
        Self::statx(fd, Path::new(""), rustix::fs::AtFlags::EMPTY_PATH)
    }

    fn statx(dir: std::os::fd::BorrowedFd<'_>, path: &Path, flags: rustix::fs::AtFlags) -> std::io::Result<Place> {
        use rustix::fs::StatxFlags;
        let st = rustix::fs::statx(dir, path, flags, StatxFlags::BASIC_STATS | StatxFlags::MNT_ID)?;
        let dev = rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor);
        let mount = (st.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(st.stx_mnt_id);
        Ok(Place { dev, mount })
    }

    /// Whether a rename can move an object from one to the other.
    pub fn same(&self, other: &Place) -> bool {
        self.dev == other.dev && self.mount.zip(other.mount).is_none_or(|(a, b)| a == b)
    }
}

/// The root of the mount `dir` is on (the highest ancestor in the same [`Place`]).
pub fn mount_root(dir: &Path) -> Option<PathBuf> {
    let place = Place::of(dir).ok()?;
    let mut root = dir.to_path_buf();
    while let Some(parent) = root.parent() {
        if !Place::of(parent).ok()?.same(&place) {
            break;
        }
        root = parent.to_path_buf();
    }
    Some(root)
}

/// Where a workspace's state directory may live, best first, when none is named: the base
/// directory if it is in the workspace's [`Place`] (commits are renames, so layers must be on
/// the same filesystem and mount as the workspace); else a per-user directory at the root of
/// the workspace's mount (unless that root is the workspace itself); else, as a last resort,
/// `.txbox` inside the workspace.
pub fn candidates(base: &Path, workspace: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let (Ok(ws), Ok(b)) = (Place::of(workspace), Place::of(base)) {
        if ws.same(&b) {
            out.push(base.to_path_buf());
            return out;
        }
    }
    if let Some(root) = mount_root(workspace).filter(|r| r != workspace && !r.starts_with(workspace)) {
        out.push(root.join(format!("{AT_MOUNT_PREFIX}{}", rustix::process::geteuid().as_raw())));
    }
    out.push(workspace.join(IN_WORKSPACE));
    out
}

/// What to tell about a workspace's `.txbox` that is not its state directory (the state of an
/// earlier txbox version, which kept it there by default, or one a repository shipped): it is
/// plain content of the workspace now, and txbox never reads it. Only if it holds unfinished
/// commit records is there something to say, since the workspace may then be half-changed.
pub fn earlier_state_note(workspace: &Path, state_root: &Path) -> Option<String> {
    let old = workspace.join(IN_WORKSPACE);
    if old == state_root {
        return None;
    }
    let unfinished = std::fs::read_dir(old.join(JOURNAL))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().as_bytes().ends_with(RECORD_SUFFIX.as_bytes()))
        .count();
    (unfinished > 0).then(|| {
        format!(
            "{} holds {unfinished} unfinished commit record(s) of an earlier txbox version, which this \
             version does not trust or apply; the workspace may be half-changed. To finish them, run \
             that version's `txbox recover -C {}`; if you do not need them, delete {}",
            old.display(),
            workspace.display(),
            old.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_refuse_strangers() {
        let id = "0123456789abcdef";
        assert_eq!(record_id(OsStr::new(&record_name(id))), Some((id, false)));
        assert_eq!(record_id(OsStr::new(&format!("{}{TMP_SUFFIX}", record_name(id)))), Some((id, true)));
        for bad in ["x.commit", "0123456789ABCDEF.commit", "0123456789abcdef.commit.old", "../0123456789abcdef.commit"]
        {
            assert_eq!(record_id(OsStr::new(bad)), None, "{bad}");
        }
        assert_eq!(undo_record_id(OsStr::new(&undo_record_name(id))), Some((id, false)));
        assert_eq!(record_id(OsStr::new(&undo_record_name(id))), None, "an undo record is no commit record");
        assert_eq!(undo_record_id(OsStr::new(&record_name(id))), None);
        for k in [TxKind::Run, TxKind::Session, TxKind::Undo] {
            assert_eq!(TxKind::parse(k.as_str()), Some(k));
        }
        for s in [Status::Open, Status::Committing] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert!(valid_id(id) && !valid_id("0123456789abcde") && !valid_id("../3456789abcdef0"));
    }

    #[test]
    fn workspaces_read_back_must_be_plain_absolute_paths() {
        for ok in ["/w", "/w/s p a c e", "/"] {
            assert!(is_normal_absolute(Path::new(ok)), "{ok}");
        }
        for bad in ["w", "/w/../etc", "./w", ""] {
            assert!(!is_normal_absolute(Path::new(bad)), "{bad}");
        }
    }

    #[test]
    fn layers_are_named_by_transaction_and_step() {
        let id = "0123456789abcdef";
        let l = |s: &str| layer_name(Path::new(s));
        assert_eq!(l(&format!("tx/{id}/upper")), Some(LayerName { id: id.into(), step: None, upper: true }));
        assert_eq!(
            l(&format!("tx/{id}/steps/12/work")),
            Some(LayerName { id: id.into(), step: Some(12), upper: false })
        );
        for bad in [
            format!("tx/{id}/trash"),
            format!("tx/{id}/steps/01/upper"),
            format!("tx/{id}/steps/x/upper"),
            format!("tx/{id}/../{id}/upper"),
            format!("tx/{id}/upper/sub"),
            "tx/.spare-0/upper".to_string(),
            "journal/upper".to_string(),
            format!("/tx/{id}/upper"),
            "gone/0123456789abcdef/upper".to_string(),
        ] {
            assert_eq!(l(&bad), None, "{bad}");
        }
    }

    #[test]
    fn session_layers_live_in_the_state_unless_it_is_inside_the_workspace() {
        let id = "0123456789abcdef";
        assert_eq!(
            steps_root(Path::new("/s"), id, Path::new("/w")),
            Some(PathBuf::from("/s/tx/0123456789abcdef/steps"))
        );
        assert_eq!(
            steps_root(Path::new("/p/w/.txbox"), id, Path::new("/p/w")),
            Some(PathBuf::from("/p/.w.txbox-layers/0123456789abcdef"))
        );
        assert_eq!(steps_root(Path::new("/.txbox"), id, Path::new("/")), None);
    }

    #[test]
    fn the_base_directory_follows_xdg() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(base_dir_from(p("/x"), p("/h")).ok(), p("/x/txbox"));
        assert_eq!(base_dir_from(p("rel"), p("/h")).ok(), p("/h/.local/state/txbox"));
        assert_eq!(base_dir_from(None, p("/h")).ok(), p("/h/.local/state/txbox"));
        assert!(base_dir_from(None, None).is_err() && base_dir_from(None, p("h")).is_err());
    }
}
