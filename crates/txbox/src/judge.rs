//! The commit-time policy on a real change set: the paths it changes, and the two sides of
//! each (the workspace now, and the transaction's layer over it) read the safe way. Every
//! byte there is the command's or the repository's: nothing is followed (no symlink, at any
//! component), only regular files are opened (after a look through an `O_PATH` handle, so a
//! device is never opened), and at most [`MAX_JUDGED`] bytes are read. What cannot be read
//! that way is reported as such, and the judge holds it.

use std::cell::OnceCell;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use txbox_policy::{ChangeKind, CommitChange, CommitFiles, CommitFinding, FileContent, ObjectKind, Policy};
use txbox_txn::changeset::ChangeSet;
use txbox_txn::fsx::open_beneath;
use txbox_txn::meta::{self, display_rel};

/// Files larger than this are not judged by their content (held whole).
pub const MAX_JUDGED: u64 = 1 << 20;

/// Judge `cs` (classified from `upper` over `workspace`) with `policy`'s commit rules.
pub fn judge(policy: &Policy, cs: &ChangeSet, upper: &Path, workspace: &Path) -> Vec<CommitFinding> {
    let mut changes = Vec::with_capacity(cs.added.len() + cs.modified.len() + cs.deleted.len());
    let mut push = |paths: &[PathBuf], change: ChangeKind| {
        changes.extend(paths.iter().map(|p| CommitChange { path: display_rel(p), change }));
    };
    push(&cs.added, ChangeKind::Added);
    push(&cs.modified, ChangeKind::Modified);
    push(&cs.deleted, ChangeKind::Deleted);
    if changes.is_empty() {
        return Vec::new();
    }
    let sides = Sides::new(workspace, upper, cs);
    policy.judge_commit(&changes, &sides)
}

/// The workspace and the transaction's layer, each opened once, when first needed (a change
/// set no rule looks at needs neither).
struct Sides<'a> {
    workspace: &'a Path,
    upper: &'a Path,
    ws: OnceCell<Option<OwnedFd>>,
    up: OnceCell<Option<OwnedFd>>,
    /// Paths the change set deletes: below them the workspace's objects are gone too.
    deleted: HashSet<&'a Path>,
}

impl<'a> Sides<'a> {
    fn new(workspace: &'a Path, upper: &'a Path, cs: &'a ChangeSet) -> Sides<'a> {
        Sides {
            workspace,
            upper,
            ws: OnceCell::new(),
            up: OnceCell::new(),
            deleted: cs.deleted.iter().map(PathBuf::as_path).collect(),
        }
    }

    fn ws(&self) -> Option<&OwnedFd> {
        self.ws.get_or_init(|| open_dir(self.workspace)).as_ref()
    }

    fn up(&self) -> Option<&OwnedFd> {
        self.up.get_or_init(|| open_dir(self.upper)).as_ref()
    }

    /// Where the object at `path` comes from after the commit: the layer (Some(true)), the
    /// workspace (Some(false)), or nowhere (None: deleted, whited out, or below an object of
    /// the layer that hides the workspace's: an opaque directory, a file).
    fn after_from(&self, path: &Path) -> Option<bool> {
        let up = self.up()?;
        if self.deleted.iter().any(|d| path.starts_with(d)) {
            return None;
        }
        let stat = |p: &Path| rustix::fs::statat(up, p, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok();
        let mut at = PathBuf::new();
        let mut comps = path.components().peekable();
        while let Some(c) = comps.next() {
            at.push(c);
            let Some(st) = stat(&at) else { return Some(false) };
            let ft = FileType::from_raw_mode(st.st_mode);
            if ft == FileType::CharacterDevice && st.st_rdev == 0 {
                return None;
            }
            if comps.peek().is_none() {
                return Some(true);
            }
            if ft != FileType::Directory {
                return None;
            }
            // Below an opaque directory only the layer's objects exist.
            if matches!(meta::get_xattr(&self.upper.join(&at), OsStr::new("user.overlay.opaque")).as_deref(), Ok(b"y"))
            {
                return stat(path).map(|_| true);
            }
        }
        Some(false)
    }

    fn read(&self, from_layer: bool, path: &str) -> FileContent {
        if path.contains(char::REPLACEMENT_CHARACTER) {
            // Judged by a lossy name: the file may not be the one named here. Never a pass.
            return FileContent::Unreadable("its name is not UTF-8".into());
        }
        let dir = if from_layer { self.up() } else { self.ws() };
        let Some(dir) = dir else { return FileContent::Unreadable("cannot open its directory".into()) };
        read_regular(dir, Path::new(path))
    }
}

fn open_dir(p: &Path) -> Option<OwnedFd> {
    rustix::fs::open(p, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()).ok()
}

fn kind_of(mode: u32) -> ObjectKind {
    match FileType::from_raw_mode(mode) {
        FileType::RegularFile => ObjectKind::File,
        FileType::Directory => ObjectKind::Dir,
        FileType::Symlink => ObjectKind::Symlink,
        _ => ObjectKind::Other,
    }
}

/// What `rel` beneath `dir` is, without following anything.
fn stat_kind(dir: &OwnedFd, rel: &Path) -> Result<ObjectKind, FileContent> {
    match open_beneath(dir.as_fd(), rel, OFlags::PATH, Mode::empty()) {
        Ok(fd) => {
            rustix::fs::fstat(&fd).map(|st| kind_of(st.st_mode)).map_err(|e| FileContent::Unreadable(e.to_string()))
        }
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => Ok(ObjectKind::Absent),
            // The final component is a symlink (O_NOFOLLOW with O_PATH opens it; a symlink on
            // the way is refused: ELOOP / EXDEV under RESOLVE_NO_SYMLINKS).
            _ => Err(FileContent::Unreadable(format!("reached through a symlink or beyond the workspace ({e})"))),
        },
    }
}

/// A regular file's bytes, read beneath `dir`; anything else says what it is.
fn read_regular(dir: &OwnedFd, rel: &Path) -> FileContent {
    match stat_kind(dir, rel) {
        Ok(ObjectKind::Absent) => return FileContent::Absent,
        Ok(ObjectKind::File) => {}
        Ok(k) => return FileContent::NotRegular(k),
        Err(c) => return c,
    }
    let fd = match open_beneath(dir.as_fd(), rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) => return FileContent::Unreadable(e.to_string()),
    };
    let mut f = std::fs::File::from(fd);
    let size = match f.metadata() {
        Ok(md) if !md.is_file() => return FileContent::NotRegular(ObjectKind::Other),
        Ok(md) if md.size() > MAX_JUDGED => {
            return FileContent::Unreadable(format!("{} bytes, more than the {} judged", md.size(), MAX_JUDGED))
        }
        Ok(md) => md.size(),
        Err(e) => return FileContent::Unreadable(e.to_string()),
    };
    // Room for all of it and one byte more: one read for the content, one that says it ended.
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).saturating_add(1));
    match f.by_ref().take(MAX_JUDGED + 1).read_to_end(&mut bytes) {
        Ok(n) if n as u64 > MAX_JUDGED => FileContent::Unreadable(format!("more than the {MAX_JUDGED} bytes judged")),
        Ok(_) => FileContent::Regular(bytes),
        Err(e) => FileContent::Unreadable(e.to_string()),
    }
}

impl CommitFiles for Sides<'_> {
    fn workspace(&self) -> &Path {
        self.workspace
    }

    fn kind_after(&self, path: &str) -> ObjectKind {
        if path.contains(char::REPLACEMENT_CHARACTER) {
            // A lossy name cannot be looked up: taken for what could lead anywhere.
            return ObjectKind::Symlink;
        }
        let rel = Path::new(OsStr::new(path));
        let dir = match self.after_from(rel) {
            None => return ObjectKind::Absent,
            Some(true) => self.up(),
            Some(false) => self.ws(),
        };
        match dir.map(|d| stat_kind(d, rel)) {
            Some(Ok(k)) => k,
            _ => ObjectKind::Other,
        }
    }

    fn before(&self, path: &str) -> FileContent {
        self.read(false, path)
    }

    fn after(&self, path: &str) -> FileContent {
        match self.after_from(Path::new(path)) {
            None => FileContent::Absent,
            Some(layer) => self.read(layer, path),
        }
    }
}

/// Judge what an undo would change (`txbox_txn::undo::Touched`) with `policy`'s commit rules,
/// as a commit of the same change would be: an object put back is read from the retained data
/// (beneath `kept/`, nothing followed), the workspace side as for a commit.
pub fn judge_undo(policy: &Policy, workspace: &Path, touched: &txbox_txn::undo::Touched) -> Vec<CommitFinding> {
    let sides = UndoSides {
        workspace,
        ws: open_dir(workspace),
        kept: open_dir(&touched.kept),
        placed: touched.placed.iter().map(|(p, k)| (p.as_path(), k.as_path())).collect(),
        removed: touched.removed.iter().map(PathBuf::as_path).collect(),
    };
    let mut changes = Vec::with_capacity(touched.placed.len() + touched.removed.len());
    for (p, _) in &touched.placed {
        let was = sides.ws.as_ref().map(|d| stat_kind(d, p));
        let change = if matches!(was, Some(Ok(ObjectKind::Absent))) { ChangeKind::Added } else { ChangeKind::Modified };
        changes.push(CommitChange { path: display_rel(p), change });
    }
    for p in &touched.removed {
        changes.push(CommitChange { path: display_rel(p), change: ChangeKind::Deleted });
    }
    if changes.is_empty() {
        return Vec::new();
    }
    policy.judge_commit(&changes, &sides)
}

/// The two sides of an undo: the workspace now, and after it the retained objects it puts
/// back over the workspace minus what it removes.
struct UndoSides<'a> {
    workspace: &'a Path,
    ws: Option<OwnedFd>,
    kept: Option<OwnedFd>,
    placed: std::collections::HashMap<&'a Path, &'a Path>,
    removed: HashSet<&'a Path>,
}

impl UndoSides<'_> {
    /// Where `path` is after the undo: beneath `kept/` (Some(Some)), in the workspace
    /// (Some(None)), or nowhere (None).
    fn after_at(&self, path: &Path) -> Option<Option<&Path>> {
        if let Some(k) = self.placed.get(path) {
            return Some(Some(k));
        }
        if self.removed.iter().any(|r| path.starts_with(r)) {
            return None;
        }
        Some(None)
    }
}

impl CommitFiles for UndoSides<'_> {
    fn workspace(&self) -> &Path {
        self.workspace
    }

    fn kind_after(&self, path: &str) -> ObjectKind {
        if path.contains(char::REPLACEMENT_CHARACTER) {
            return ObjectKind::Symlink;
        }
        let rel = Path::new(OsStr::new(path));
        let found = match self.after_at(rel) {
            None => return ObjectKind::Absent,
            Some(Some(k)) => self.kept.as_ref().map(|d| stat_kind(d, k)),
            Some(None) => self.ws.as_ref().map(|d| stat_kind(d, rel)),
        };
        match found {
            Some(Ok(k)) => k,
            _ => ObjectKind::Other,
        }
    }

    fn before(&self, path: &str) -> FileContent {
        if path.contains(char::REPLACEMENT_CHARACTER) {
            return FileContent::Unreadable("its name is not UTF-8".into());
        }
        match &self.ws {
            Some(d) => read_regular(d, Path::new(path)),
            None => FileContent::Unreadable("cannot open the workspace".into()),
        }
    }

    fn after(&self, path: &str) -> FileContent {
        if path.contains(char::REPLACEMENT_CHARACTER) {
            return FileContent::Unreadable("its name is not UTF-8".into());
        }
        let rel = Path::new(OsStr::new(path));
        let (dir, at) = match self.after_at(rel) {
            None => return FileContent::Absent,
            Some(Some(k)) => (self.kept.as_ref(), k),
            Some(None) => (self.ws.as_ref(), rel),
        };
        match dir {
            Some(d) => read_regular(d, at),
            None => FileContent::Unreadable("cannot open its directory".into()),
        }
    }
}

/// Mark a directory of a layer opaque, as overlayfs does (for tests of `Sides::after_from`).
#[cfg(test)]
fn mark_opaque(p: &Path) -> std::io::Result<()> {
    rustix::fs::lsetxattr(p, "user.overlay.opaque", b"y", rustix::fs::XattrFlags::empty()).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sides_test_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("txbox-judge-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn the_after_side_is_the_layer_over_the_workspace() -> std::io::Result<()> {
        let d = sides_test_dir("after");
        let (ws, up) = (d.join("ws"), d.join("up"));
        for p in ["ws/a", "ws/keep", "ws/op", "up/a", "up/op"] {
            std::fs::create_dir_all(d.join(p))?;
        }
        std::fs::write(ws.join("a/old"), "ws")?;
        std::fs::write(ws.join("keep/x"), "kept")?;
        std::fs::write(ws.join("op/gone"), "hidden")?;
        std::fs::write(up.join("a/new"), "layer")?;
        mark_opaque(&up.join("op"))?;
        std::os::unix::fs::symlink("/etc/passwd", up.join("a/link"))?;
        std::os::unix::fs::symlink("/etc", up.join("sneaky"))?;
        let cs = ChangeSet::default();
        let s = Sides::new(&ws, &up, &cs);
        assert_eq!(s.after("a/new"), FileContent::Regular(b"layer".to_vec()));
        assert_eq!(s.after("a/old"), FileContent::Regular(b"ws".to_vec()));
        assert_eq!(s.before("keep/x"), FileContent::Regular(b"kept".to_vec()));
        assert_eq!(s.after("op/gone"), FileContent::Absent);
        assert_eq!(s.after("a/link"), FileContent::NotRegular(ObjectKind::Symlink));
        assert_eq!(s.kind_after("a/link"), ObjectKind::Symlink);
        assert!(matches!(s.after("sneaky/passwd"), FileContent::Absent | FileContent::Unreadable(_)));
        assert_eq!(s.before("nothing"), FileContent::Absent);
        assert!(matches!(s.after("a/\u{fffd}"), FileContent::Unreadable(_)));
        std::fs::remove_dir_all(&d)
    }

    #[test]
    fn devices_are_never_opened_and_large_files_not_read() -> std::io::Result<()> {
        let d = sides_test_dir("special");
        std::fs::create_dir_all(&d)?;
        rustix::fs::mknodat(rustix::fs::CWD, d.join("fifo"), FileType::Fifo, Mode::from_raw_mode(0o600), 0)?;
        std::fs::File::create(d.join("big"))?.set_len(MAX_JUDGED + 1)?;
        let fd = rustix::fs::open(&d, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        assert_eq!(read_regular(&fd, Path::new("fifo")), FileContent::NotRegular(ObjectKind::Other));
        assert!(matches!(read_regular(&fd, Path::new("big")), FileContent::Unreadable(_)));
        std::fs::remove_dir_all(&d)
    }
}
