//! Change-set classification: what an overlay upper layer means for the real workspace.
//!
//! The upper layer of a `userxattr` overlay (no redirect_dir, no metacopy, no index) encodes
//! changes as follows, and this module turns that encoding into a [`ChangeSet`]:
//! - a 0:0 character device is a whiteout: the lower entry of that name is deleted;
//! - a directory with `user.overlay.opaque=y` hides the whole lower directory of that name
//!   (a directory deleted and created again); new directories may carry it too;
//! - any other entry is the object as it is now; overlay copies objects up even when nothing
//!   changed (open for writing, chown to the same owner), so unchanged copies are filtered out;
//! - overlay's own xattrs (`user.overlay.*`: every overlay is mounted with `userxattr`) are
//!   bookkeeping; the escaped `user.overlay.overlay.*` names hold the command's own
//!   `user.overlay.*` attributes.
//!
//! Only an allowlist of extended attributes is committed (`meta::classify_xattr`): `user.*`
//! but `user.overlay.*`, and POSIX ACLs. Everything else a committed object carries is removed
//! first and listed in [`ChangeSet::dropped_xattrs`]: file capabilities, `trusted.*`, other
//! `security.*` labels, and the command's `user.overlay.*` names, which a later overlay would
//! interpret. Labels the host's LSM puts on every new file (they are on the transaction's own
//! upper root) are the LSM's, and left to it.
//!
//! Classification only reads. What must be fixed in the upper before its objects can be moved
//! into the workspace is recorded as [`Fixup`]s, applied later by `prepare`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::Metadata;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::meta::{self, Kind, XattrClass};
use crate::session::Fingerprint;

/// One change to one path of the workspace (paths are relative to the workspace root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: PathBuf,
    pub op: ChangeOp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeOp {
    /// The upper object (a whole subtree for a directory) takes the path; `old` is what the
    /// workspace holds there now, if anything.
    Put { new: Kind, old: Option<Kind> },
    /// The workspace object at the path goes away (a whole subtree for a directory).
    Delete { old: Kind },
    /// A directory present on both sides keeps its entries; its own attributes (mode, mtime,
    /// xattrs) come from the upper. `visible` is false when only the mtime moved.
    DirMeta { visible: bool },
}

/// A repair of the upper layer needed before an object can be committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fixup {
    /// Remove a whiteout, device node, FIFO or socket inside a subtree being moved.
    RemoveNode(PathBuf),
    /// Remove an xattr that is not committed: overlay's own, or one off the allowlist.
    RemoveXattr(PathBuf, OsString),
    /// Strip setuid/setgid/sticky.
    Chmod(PathBuf, u32),
}

/// The classified content of one upper layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeSet {
    pub changes: Vec<Change>,
    pub fixups: Vec<Fixup>,
    /// Special files (devices, FIFOs, sockets) the command created: reported, never committed.
    pub skipped: Vec<PathBuf>,
    /// For reporting: every path that appears, changes or disappears.
    pub added: Vec<PathBuf>,
    pub modified: Vec<PathBuf>,
    pub deleted: Vec<PathBuf>,
    /// For undo ([`crate::retain`]): every entry inside a directory the commit moves in whole (a
    /// new tree, or one that replaces another object), as classified. Renaming the directory
    /// changes none of them, so this is what the workspace holds there once committed, but for
    /// entries the commit itself changes (fixups, other names of a hard-linked inode).
    pub placed_inner: Vec<(PathBuf, Fingerprint)>,
    /// For undo: the entries of `placed_inner` with other names (hard links): committing
    /// another name changes their ctime, so they are fingerprinted again once committed.
    pub placed_linked: Vec<PathBuf>,
    /// For undo: the bytes (blocks) of the non-directories the commit removes or replaces,
    /// and how many removed or replaced directories that does not count.
    pub displaced_bytes: u64,
    pub displaced_dirs: usize,
    /// Extended attributes off the commit allowlist, by path and the name the command sees:
    /// removed from committed objects, and set on unchanged ones to no effect. Never committed.
    pub dropped_xattrs: Vec<(PathBuf, OsString)>,
    /// Bytes the commit adds to the workspace's filesystem: the allocated blocks (`st_blocks`)
    /// of every object it moves in (new and replaced files, symlinks and directories, whole new
    /// trees), each inode once. A sparse file counts the blocks it allocated, not its length;
    /// `fallocate`d space counts in full.
    pub bytes: u64,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Number of changes that alter the workspace visibly (for summaries).
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.added.len(), self.modified.len(), self.deleted.len())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("classifying the upper layer at {path}: {source}")]
pub struct ClassifyError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

trait Ctx<T> {
    fn at(self, path: &Path) -> Result<T, ClassifyError>;
}

impl<T> Ctx<T> for io::Result<T> {
    fn at(self, path: &Path) -> Result<T, ClassifyError> {
        self.map_err(|source| ClassifyError { path: path.to_path_buf(), source })
    }
}

fn lstat_opt(path: &Path) -> Result<Option<Metadata>, ClassifyError> {
    match std::fs::symlink_metadata(path) {
        Ok(md) => Ok(Some(md)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        // A path component that became a non-directory in the workspace: nothing there.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(None),
        Err(e) => Err(e).at(path),
    }
}

/// The entries of the upper directory `dir`, sorted by name, each with its metadata: an
/// `fstatat` on the directory's handle (`DirEntry::metadata`), not following links, instead of
/// a walk of the entry's whole path. Names are sorted before the entries are stat-ed (sorting
/// (name, metadata) pairs moved ~200 bytes per element), and the directory is closed before
/// this returns.
fn stat_entries(dir: &Path) -> Result<Vec<(OsString, Metadata)>, ClassifyError> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        entries.push((entry.file_name(), entry));
    }
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    entries
        .into_iter()
        .map(|(name, entry)| {
            let md = entry.metadata().at(&entry.path())?;
            Ok((name, md))
        })
        .collect()
}

/// An upper directory being classified: its path, and a handle on it (`O_NOFOLLOW`) for
/// `listxattrat` on its entries, opened when first needed and closed before the classifier
/// descends, so that a deep tree never holds a descriptor per level.
struct DirAt {
    path: PathBuf,
    fd: Option<rustix::fd::OwnedFd>,
}

impl DirAt {
    fn new(path: PathBuf) -> DirAt {
        DirAt { path, fd: None }
    }

    /// The xattr names of the entry `name`, through the handle.
    fn list_xattrs(&mut self, lister: &mut meta::XattrLister, name: &OsStr) -> io::Result<Vec<OsString>> {
        if self.fd.is_none() {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            self.fd = Some(rustix::fs::open(&self.path, flags, Mode::empty())?);
        }
        match &self.fd {
            Some(fd) => lister.list_at(fd.as_fd(), &self.path, name),
            None => Err(io::Error::other("directory handle lost")),
        }
    }

    /// Close the handle (before descending into a subdirectory); reopened when next needed.
    fn close(&mut self) {
        self.fd = None;
    }
}

fn sorted_names(dir: &Path) -> Result<Vec<OsString>, ClassifyError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).at(dir)? {
        names.push(entry.at(dir)?.file_name());
    }
    names.sort();
    Ok(names)
}

/// Whether overlayfs marked an upper directory opaque. Only its own `userxattr` marker counts:
/// a `trusted.overlay.opaque` in the layer was set by the command (as root), and must not make
/// the classifier delete what the command saw.
fn is_opaque(path: &Path) -> Result<bool, ClassifyError> {
    match meta::get_xattr(path, std::ffi::OsStr::new("user.overlay.opaque")) {
        Ok(v) => Ok(v == b"y"),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA) | Some(libc::ENOTSUP) | Some(libc::EPERM)) => {
            Ok(false)
        }
        Err(e) => Err(e).at(path),
    }
}

/// The LSM labels the kernel put on the transaction's own upper root (`security.selinux` on an
/// SELinux host, ...): every new object gets one, the LSM refuses their removal, and they say
/// what the host's policy decided, not the command. File capabilities are never among them.
fn kernel_labels(upper: &Path) -> Result<Vec<OsString>, ClassifyError> {
    Ok(meta::list_xattrs(upper)
        .at(upper)?
        .into_iter()
        .filter(|n| n.as_bytes().starts_with(b"security.") && n.as_bytes() != b"security.capability")
        .collect())
}

struct Classifier<'a> {
    upper: &'a Path,
    lower: &'a Path,
    exclude: &'a HashSet<PathBuf>,
    out: ChangeSet,
    /// Upper inodes with more than one link that are committed, and unchanged copies of
    /// linked inodes: a hard-link group is committed whole or not at all.
    put_inodes: HashSet<u64>,
    /// Directories whose list of entries changed: only their mtime is worth committing.
    entries_changed: HashSet<PathBuf>,
    fixed_inodes: HashSet<u64>,
    linked_noops: HashMap<u64, Vec<(PathBuf, Kind)>>,
    /// See [`kernel_labels`].
    kernel_labels: Vec<OsString>,
    /// Linked inodes whose blocks are already in `out.bytes`.
    counted_inodes: HashSet<u64>,
    /// Lists the xattrs of new trees' entries, its buffers reused.
    lister: meta::XattrLister,
}

/// Classify `upper` against `lower` (the real workspace). `exclude` lists relative paths that are
/// never part of a change set (the state directory when it lives inside the workspace).
pub fn classify(upper: &Path, lower: &Path, exclude: &HashSet<PathBuf>) -> Result<ChangeSet, ClassifyError> {
    let mut c = Classifier {
        upper,
        lower,
        exclude,
        out: ChangeSet::default(),
        put_inodes: HashSet::new(),
        entries_changed: HashSet::new(),
        fixed_inodes: HashSet::new(),
        linked_noops: HashMap::new(),
        kernel_labels: kernel_labels(upper)?,
        counted_inodes: HashSet::new(),
        lister: meta::XattrLister::default(),
    };
    let root = PathBuf::new();
    c.walk(&root, false)?;
    let upper_root = std::fs::symlink_metadata(upper).at(upper)?;
    let lower_root = std::fs::symlink_metadata(lower).at(lower)?;
    c.dir_meta(&root, &upper_root, &lower_root)?;
    c.close_link_groups()?;
    let out = &mut c.out;
    out.added.sort();
    out.modified.sort();
    out.deleted.sort();
    out.skipped.sort();
    out.dropped_xattrs.sort();
    out.dropped_xattrs.dedup();
    Ok(c.out)
}

impl Classifier<'_> {
    /// Walk the upper directory `rel`, whose lower counterpart is a directory. In `full` mode the
    /// upper directory replaces the lower one entirely (opaque): lower names absent from the
    /// upper are deleted. Otherwise absence means unchanged and whiteouts mark deletions.
    fn walk(&mut self, rel: &Path, full: bool) -> Result<(), ClassifyError> {
        let mut dir = DirAt::new(meta::join(self.upper, rel));
        let entries = stat_entries(&dir.path)?;
        if full {
            let ldir = meta::join(self.lower, rel);
            let present: BTreeSet<&OsStr> = entries.iter().map(|(n, _)| n.as_os_str()).collect();
            for name in sorted_names(&ldir)? {
                let p = rel.join(&name);
                if present.contains(name.as_os_str()) || self.exclude.contains(&p) {
                    continue;
                }
                if let Some(l) = lstat_opt(&self.lower.join(&p))? {
                    self.delete(p, &l);
                }
            }
        }
        for (name, u) in entries {
            let p = rel.join(&name);
            if self.exclude.contains(&p) {
                continue;
            }
            self.entry(p, full, u, &mut dir, &name)?;
        }
        Ok(())
    }

    /// The upper entry `name` of `dir` (metadata `u`), at `p` in the workspace.
    fn entry(
        &mut self,
        p: PathBuf,
        full: bool,
        u: Metadata,
        dir: &mut DirAt,
        name: &OsStr,
    ) -> Result<(), ClassifyError> {
        let lpath = self.lower.join(&p);
        let l = lstat_opt(&lpath)?;
        if meta::is_whiteout(&u) {
            // A whiteout deletes the workspace entry of its name, in an opaque directory too
            // (squashed session layers leave whiteouts inside directories made opaque later).
            if let Some(l) = &l {
                self.delete(p, l);
            }
            return Ok(());
        }
        let new = Kind::of(&u);
        let old = l.as_ref().map(Kind::of);
        match (new, &l) {
            (Kind::Special, _) => {
                self.out.skipped.push(p.clone());
                if let Some(l) = &l {
                    // The command replaced something with an object we do not commit: the
                    // closest faithful result is that the old object is gone.
                    self.delete(p, l);
                }
            }
            (Kind::Dir, Some(l)) if Kind::of(l) == Kind::Dir => {
                let upath = self.upper.join(&p);
                let opaque = full || is_opaque(&upath)?;
                dir.close();
                self.walk(&p, opaque)?;
                self.dir_meta(&p, &u, l)?;
            }
            (_, Some(l)) if self.unchanged(&self.upper.join(&p), &u, &lpath, l)? => {
                // Not committed; what the command set off the allowlist is still reported.
                if new != Kind::Symlink {
                    self.report_drops(&p, &self.upper.join(&p), &lpath)?;
                }
                if u.nlink() > 1 && new == Kind::File {
                    self.linked_noops.entry(u.ino()).or_default().push((p, new));
                }
            }
            _ => {
                if let Some(l) = &l {
                    self.displaced(l);
                }
                self.put(p, new, old, &u, dir, name)?
            }
        }
        Ok(())
    }

    fn unchanged(&self, upath: &Path, u: &Metadata, lpath: &Path, l: &Metadata) -> Result<bool, ClassifyError> {
        if !meta::same_attributes(u, l) {
            return Ok(false);
        }
        let same = match Kind::of(u) {
            Kind::File => meta::same_file_content(upath, lpath, u.size()).at(upath)?,
            Kind::Symlink => std::fs::read_link(upath).at(upath)? == std::fs::read_link(lpath).at(lpath)?,
            _ => false,
        };
        Ok(same
            && meta::committed_xattrs_of_upper(upath).at(upath)? == meta::committed_xattrs_of_lower(lpath).at(lpath)?)
    }

    /// Report the attributes off the allowlist that an object present on both sides, and not
    /// committed as a whole (an unchanged copy-up, a directory whose attributes are copied),
    /// carries in the upper layer and not, or not with that value, in the workspace.
    fn report_drops(&mut self, p: &Path, upath: &Path, lpath: &Path) -> Result<(), ClassifyError> {
        let mut lower = None;
        for name in meta::list_xattrs(upath).at(upath)? {
            let XattrClass::Dropped { real } = meta::classify_xattr(&name) else { continue };
            if self.kernel_labels.contains(&name) {
                continue;
            }
            if lower.is_none() {
                lower = Some(meta::xattrs_of_lower(lpath).at(lpath)?);
            }
            let value = meta::get_xattr(upath, &name).at(upath)?;
            let same = lower.as_ref().is_some_and(|l| l.iter().any(|(n, v)| *n == name && *v == value));
            if !same {
                self.out.dropped_xattrs.push((p.to_path_buf(), real));
            }
        }
        Ok(())
    }

    /// Add an object the commit moves in to the bytes it adds (a linked inode once).
    fn count(&mut self, md: &Metadata) {
        if md.nlink() > 1 && !md.is_dir() && !self.counted_inodes.insert(md.ino()) {
            return;
        }
        self.out.bytes = self.out.bytes.saturating_add(md.blocks().saturating_mul(512));
    }

    fn delete(&mut self, p: PathBuf, l: &Metadata) {
        let old = Kind::of(l);
        self.displaced(l);
        self.entries_changed.insert(p.parent().map(Path::to_path_buf).unwrap_or_default());
        self.out.deleted.push(p.clone());
        self.out.changes.push(Change { path: p, op: ChangeOp::Delete { old } });
    }

    /// Count an object the commit takes out of the workspace (kept for undo).
    fn displaced(&mut self, l: &Metadata) {
        if l.is_dir() {
            self.out.displaced_dirs += 1;
        } else {
            self.out.displaced_bytes = self.out.displaced_bytes.saturating_add(l.blocks().saturating_mul(512));
        }
    }

    /// Commit the upper entry `name` of `dir` (metadata `u`) at `p`, a whole subtree for a
    /// directory.
    fn put(
        &mut self,
        p: PathBuf,
        new: Kind,
        old: Option<Kind>,
        u: &Metadata,
        dir: &mut DirAt,
        name: &OsStr,
    ) -> Result<(), ClassifyError> {
        if old != Some(new) {
            self.entries_changed.insert(p.parent().map(Path::to_path_buf).unwrap_or_default());
        }
        if old.is_some() {
            self.out.modified.push(p.clone());
        } else {
            self.out.added.push(p.clone());
        }
        if u.nlink() > 1 && new == Kind::File {
            self.put_inodes.insert(u.ino());
        }
        self.count(u);
        self.fixups_of_entry(&p, u, dir, name)?;
        if new == Kind::Dir {
            dir.close();
            self.new_subtree(&p)?;
        }
        self.out.changes.push(Change { path: p, op: ChangeOp::Put { new, old } });
        Ok(())
    }

    /// Everything below a directory that is moved whole: report it, and record what must be
    /// cleaned out of it first. Entries are examined relative to their directory (stat through
    /// the directory's handle, xattrs with `listxattrat`): new trees can hold many files, and
    /// walking each one's whole path dominated the time otherwise.
    fn new_subtree(&mut self, rel: &Path) -> Result<(), ClassifyError> {
        let mut dir = DirAt::new(self.upper.join(rel));
        for (name, u) in stat_entries(&dir.path)? {
            let p = rel.join(&name);
            if meta::is_whiteout(&u) {
                self.out.fixups.push(Fixup::RemoveNode(p));
                continue;
            }
            match Kind::of(&u) {
                Kind::Special => {
                    self.out.skipped.push(p.clone());
                    self.out.fixups.push(Fixup::RemoveNode(p));
                }
                kind => {
                    self.out.added.push(p.clone());
                    // A symlink can have other names too (`ln` links the link itself).
                    if u.nlink() > 1 && kind != Kind::Dir {
                        self.out.placed_linked.push(p.clone());
                    }
                    if u.nlink() > 1 && kind == Kind::File {
                        self.put_inodes.insert(u.ino());
                    }
                    self.count(&u);
                    self.fixups_of_entry(&p, &u, &mut dir, &name)?;
                    // In walk order (sorted), as `retain` builds its map from it.
                    if kind == Kind::Dir {
                        self.out.placed_inner.push((p.clone(), Fingerprint::of_metadata(&u)));
                        dir.close();
                        self.new_subtree(&p)?;
                    } else {
                        self.out.placed_inner.push((p, Fingerprint::of_metadata(&u)));
                    }
                }
            }
        }
        Ok(())
    }

    /// [`Self::fixups_for`] the entry `name` of `dir`, its xattrs listed through the
    /// directory's handle (`listxattrat`, Linux 6.13; its path on older kernels).
    fn fixups_of_entry(&mut self, p: &Path, u: &Metadata, dir: &mut DirAt, name: &OsStr) -> Result<(), ClassifyError> {
        let mut lister = std::mem::take(&mut self.lister);
        let listed = self.fixups_for(p, u, || dir.list_xattrs(&mut lister, name));
        self.lister = lister;
        listed
    }

    /// Record the repairs the object at `p` (metadata `u`) needs; `xattrs` lists its xattr names.
    fn fixups_for(
        &mut self,
        p: &Path,
        u: &Metadata,
        xattrs: impl FnOnce() -> io::Result<Vec<OsString>>,
    ) -> Result<(), ClassifyError> {
        // Names of one inode share its attributes: repair each inode once.
        if u.nlink() > 1 && !u.is_dir() && !self.fixed_inodes.insert(u.ino()) {
            return Ok(());
        }
        let mode = u.mode() & 0o7777;
        if mode & !meta::COMMIT_MODE_MASK != 0 && Kind::of(u) != Kind::Symlink {
            self.out.fixups.push(Fixup::Chmod(p.to_path_buf(), mode & meta::COMMIT_MODE_MASK));
        }
        for name in xattrs().at(&self.upper.join(p))? {
            match meta::classify_xattr(&name) {
                XattrClass::Committed => {}
                XattrClass::Overlay => self.out.fixups.push(Fixup::RemoveXattr(p.to_path_buf(), name)),
                XattrClass::Dropped { .. } if self.kernel_labels.contains(&name) => {}
                XattrClass::Dropped { real } => {
                    self.out.dropped_xattrs.push((p.to_path_buf(), real));
                    self.out.fixups.push(Fixup::RemoveXattr(p.to_path_buf(), name));
                }
            }
        }
        Ok(())
    }

    fn dir_meta(&mut self, p: &Path, u: &Metadata, l: &Metadata) -> Result<(), ClassifyError> {
        let upath = meta::join(self.upper, p);
        let lpath = meta::join(self.lower, p);
        // The root's owner is the one `begin` could give it (`check::root_owner_changed`).
        let owner_changed = if p.as_os_str().is_empty() {
            let groups = crate::check::member_groups();
            crate::check::root_owner_changed(
                (u.uid(), u.gid()),
                (l.uid(), l.gid()),
                &crate::check::Privileges::current(),
                |g| groups.contains(&g),
            )
        } else {
            u.uid() != l.uid() || u.gid() != l.gid()
        };
        let visible = (u.mode() & meta::COMMIT_MODE_MASK) != (l.mode() & meta::COMMIT_MODE_MASK)
            || owner_changed
            || meta::committed_xattrs_of_upper(&upath).at(&upath)?
                != meta::committed_xattrs_of_lower(&lpath).at(&lpath)?;
        // Only allowlisted attributes are copied onto the workspace directory.
        self.report_drops(p, &upath, &lpath)?;
        // Copy-ups touch the upper directory's mtime too; only a real change of entries counts.
        let moved = self.entries_changed.contains(p) && (u.mtime() != l.mtime() || u.mtime_nsec() != l.mtime_nsec());
        if visible || moved {
            if visible && !p.as_os_str().is_empty() {
                self.out.modified.push(p.to_path_buf());
            }
            self.out.changes.push(Change { path: p.to_path_buf(), op: ChangeOp::DirMeta { visible } });
        }
        Ok(())
    }

    /// A hard link made in the transaction to an existing file copies that file up: if any
    /// name of the inode is committed, all its names are, so the link group survives.
    fn close_link_groups(&mut self) -> Result<(), ClassifyError> {
        let mut extra = Vec::new();
        for (ino, paths) in self.linked_noops.drain() {
            if self.put_inodes.contains(&ino) {
                extra.extend(paths);
            }
        }
        extra.sort();
        for (p, kind) in extra {
            let upath = self.upper.join(&p);
            let u = std::fs::symlink_metadata(&upath).at(&upath)?;
            self.fixups_for(&p, &u, || meta::list_xattrs(&upath))?;
            self.out.modified.push(p.clone());
            self.out.changes.push(Change { path: p, op: ChangeOp::Put { new: kind, old: Some(kind) } });
        }
        Ok(())
    }
}
