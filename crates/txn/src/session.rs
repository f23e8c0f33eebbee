//! Multi-step transactions: one overlay layer per successful step (a savepoint), squashed into
//! one upper layer when the transaction commits; and base fingerprints for conflict detection.
//!
//! ```text
//! STEPS/<n>/{upper,work}   step n's layer (kept only if the step succeeded); STEPS is derived
//!                          by `StateDir::steps_root`, never read from disk
//! ```
//!
//! Owns: the layers under a steps root it is given, and the fingerprints' format (the state
//! directory seals and stores them). May not touch: the state directory's own files.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::changeset::{ChangeOp, ChangeSet};
use crate::fsx::{remove_tree, PathError};
use crate::hex::{path_from_hex, path_to_hex};
use crate::meta::{self, Kind};

#[derive(Debug, thiserror::Error)]
#[error("transaction layers: {0}")]
pub struct LayerError(pub PathError);

impl From<PathError> for LayerError {
    fn from(e: PathError) -> LayerError {
        LayerError(e)
    }
}

fn at<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> LayerError + 'a {
    move |source| LayerError(PathError::new(path, what, source))
}

/// The kept steps of a session whose layers live in `steps`, bottom (oldest) first: (step
/// number, upper layer). Entries that are not plain directories named by a number are ignored.
pub fn layers(steps: &Path) -> Result<Vec<(u32, PathBuf)>, LayerError> {
    let dir = steps;
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(at(dir, "list steps")(e)),
    };
    for e in rd {
        let e = e.map_err(at(dir, "list steps"))?;
        let real_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if let Some(n) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()).filter(|_| real_dir) {
            out.push((n, e.path().join(crate::layout::UPPER)));
        }
    }
    out.sort();
    // The newest step may have been served by a warm server that has not detached its overlay
    // yet; its layers are handed out only once no overlay uses them (older steps were waited
    // for in their turn).
    if let Some(work) = out.last().and_then(|(_, upper)| upper.parent()).map(|step| step.join(crate::layout::WORK)) {
        match crate::fsx::wait_unlocked(&work) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(at(&work, "wait for the warm server to release")(e))
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Create the directories of step `n` in `steps`. The upper root mirrors the root as the steps
/// below show it: the workspace root as it is now while no kept step changed it (the first
/// step, or a layer `below` whose root is still `base.upper`, `base` being the base in effect
/// when that step was made), else the topmost earlier layer's (which holds what its step did
/// to the root). Returns the step's directories and the base in effect for it: a new one when
/// the root was mirrored from the workspace, else `base` (None: a session from before bases
/// were kept).
pub fn create_step(
    steps: &Path,
    n: u32,
    workspace: &Path,
    below: Option<&Path>,
    base: Option<&RootBase>,
) -> Result<(PathBuf, PathBuf, Option<RootBase>), LayerError> {
    let step = steps.join(n.to_string());
    std::fs::DirBuilder::new().mode(0o700).create(&step).map_err(at(&step, "create step"))?;
    let upper = step.join(crate::layout::UPPER);
    let work = step.join(crate::layout::WORK);
    std::fs::DirBuilder::new().mode(0o700).create(&upper).map_err(at(&upper, "create upper"))?;
    std::fs::DirBuilder::new().mode(0o700).create(&work).map_err(at(&work, "create work"))?;
    let carried = match (below, base) {
        (None, _) => None,
        (Some(b), Some(base)) if root_digest(b, true).map_err(at(b, "read the root below"))? == base.upper => None,
        // A session from before root bases were kept carries its root as it did then.
        (Some(b), _) => Some(b),
    };
    match carried {
        Some(b) => {
            let md = std::fs::symlink_metadata(b).map_err(at(b, "stat the root below"))?;
            let xattrs = meta::committed_xattrs_of_upper(b).map_err(at(b, "read the root below"))?;
            mirror_root_as(&upper, &md, &xattrs).map_err(at(&upper, "mirror the root below"))?;
            Ok((upper, work, base.copied()))
        }
        None => {
            let base = mirror_root(&upper, workspace).map_err(at(&upper, "mirror the workspace root"))?;
            Ok((upper, work, Some(base)))
        }
    }
}

/// Where a transaction's root started: digests ([`root_digest`]) of the workspace root's
/// attributes when its upper root was made, and of the upper root [`mirror_root`] made of
/// them. While a layer's root is still `upper`, the transaction has not changed the root, and
/// a difference from the workspace root is someone else's change (made there meanwhile),
/// which must neither show in the next step nor be undone by the commit ([`rebase_root`]);
/// once it has, a workspace root that moved from `workspace` too is a conflict
/// ([`Fingerprints::conflicts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootBase {
    pub workspace: [u8; 32],
    pub upper: [u8; 32],
}

/// A digest of a directory's own attributes as a commit compares them: mode, owner, group and
/// the extended attributes a commit carries (`layer`: of a layer's directory, overlay's own
/// names left out; else of the workspace's).
pub fn root_digest(dir: &Path, layer: bool) -> io::Result<[u8; 32]> {
    let md = std::fs::symlink_metadata(dir)?;
    let xattrs = if layer { meta::committed_xattrs_of_upper(dir)? } else { meta::committed_xattrs_of_lower(dir)? };
    Ok(digest_of(&md, &xattrs))
}

fn digest_of(md: &std::fs::Metadata, xattrs: &[(std::ffi::OsString, Vec<u8>)]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    use std::os::unix::ffi::OsStrExt;
    let mut h = Sha256::new();
    h.update(format!("mode {:o} uid {} gid {}\n", md.mode() & 0o7777, md.uid(), md.gid()));
    for (name, value) in xattrs {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update((value.len() as u64).to_le_bytes());
        h.update(value);
    }
    h.finalize().into()
}

/// Give an upper root (fresh, or a spare an earlier run left, possibly for another workspace)
/// the workspace root's mode, owner, times and the extended attributes a commit carries
/// (`user.*`, POSIX ACLs): overlay shows the upper root's attributes as the merged root's, and
/// an untouched root must not look changed (nor be chowned at commit, nor lose its names).
/// Without `CAP_CHOWN` the owner stays ours, and the group is the workspace's if this process
/// is in it, else ours; `check::root_owner_changed` tells such a difference from a command's.
/// Returns the transaction's [`RootBase`].
pub fn mirror_root(upper: &Path, workspace: &Path) -> io::Result<RootBase> {
    let ws_md = std::fs::metadata(workspace)?;
    let xattrs = meta::committed_xattrs_of_lower(workspace)?;
    mirror_root_as(upper, &ws_md, &xattrs)?;
    Ok(RootBase { workspace: digest_of(&ws_md, &xattrs), upper: root_digest(upper, true)? })
}

/// [`mirror_root`] from attributes read already (`md`, `xattrs`).
fn mirror_root_as(upper: &Path, md: &std::fs::Metadata, xattrs: &[(std::ffi::OsString, Vec<u8>)]) -> io::Result<()> {
    apply_dir_attrs(upper, md, xattrs)?;
    let up = std::fs::symlink_metadata(upper)?;
    let p = crate::check::Privileges::current();
    if p.chown {
        if (up.uid(), up.gid()) != (md.uid(), md.gid()) {
            std::os::unix::fs::lchown(upper, Some(md.uid()), Some(md.gid()))?;
        }
        return Ok(());
    }
    // What `check::root_owner_changed` expects of a root nobody changed. A filesystem that
    // refuses it leaves the root looking changed: not a reason to refuse the run.
    let gid = if crate::check::member_groups().contains(&md.gid()) { md.gid() } else { p.egid };
    if up.gid() != gid {
        let _ = std::os::unix::fs::lchown(upper, None, Some(gid));
    }
    Ok(())
}

/// At a session's commit (or `diff`): a root the session never changed (`base.upper` still)
/// gets the workspace root's mode, owner and names as they are now, its times kept, so that a
/// change made to the workspace root meanwhile is not undone. Without a base (a session from
/// before bases were kept) nothing changes.
pub fn rebase_root(upper: &Path, workspace: &Path, base: Option<&RootBase>) -> Result<(), LayerError> {
    let Some(base) = base else { return Ok(()) };
    if root_digest(upper, true).map_err(at(upper, "read the upper root"))? != base.upper {
        return Ok(());
    }
    let md = std::fs::symlink_metadata(upper).map_err(at(upper, "stat the upper root"))?;
    mirror_root(upper, workspace).map_err(at(upper, "mirror the workspace root"))?;
    set_times(&md, upper).map_err(at(upper, "keep the upper root's times"))
}

/// Give directory `to` the mode and times `md` records and exactly the committed extended
/// attributes `xattrs`, in an order an ordinary user can: the names while `to` is still
/// writable by its owner (setting a `user.*` name on a directory needs write permission, which
/// a mode like 0555 takes away), then the mode, then the times.
fn apply_dir_attrs(to: &Path, md: &std::fs::Metadata, xattrs: &[(std::ffi::OsString, Vec<u8>)]) -> io::Result<()> {
    // The mode lifted here is replaced by `md`'s just below.
    writable_by_owner(to)?;
    sync_xattrs(to, xattrs)?;
    set_dir_attrs(md, to)
}

/// Make the committed extended attributes of `dir` (a layer's directory) exactly `want`: the
/// other names first, the ACLs last (`meta::acls_last`: an ACL can take the owner's write
/// permission away, which a `user.*` name on a directory needs).
fn sync_xattrs(dir: &Path, want: &[(std::ffi::OsString, Vec<u8>)]) -> io::Result<()> {
    let have = meta::committed_xattrs_of_upper(dir)?;
    if have.as_slice() == want {
        return Ok(());
    }
    for acls in [false, true] {
        for (name, _) in have.iter().filter(|(n, _)| meta::is_acl(n) == acls && !want.iter().any(|(w, _)| w == n)) {
            match rustix::fs::lremovexattr(dir, name.as_os_str()) {
                Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
        for (name, value) in want.iter().filter(|w| meta::is_acl(&w.0) == acls && !have.contains(w)) {
            rustix::fs::lsetxattr(dir, name.as_os_str(), value, rustix::fs::XattrFlags::empty())?;
        }
    }
    Ok(())
}

/// Drop step `n` of the layers in `steps` (a failed step, or one rolled back to an earlier
/// savepoint).
pub fn drop_step(steps: &Path, n: u32) -> Result<(), LayerError> {
    Ok(remove_tree(&steps.join(n.to_string()))?)
}

fn is_opaque(p: &Path) -> bool {
    matches!(meta::get_xattr(p, std::ffi::OsStr::new("user.overlay.opaque")).as_deref(), Ok(b"y"))
}

/// Merge `top` into `bottom` with overlay semantics, so that `bottom` alone then means what
/// the two layers meant stacked. Consumes `top` (entries are renamed, not copied).
pub fn squash_pair(bottom: &Path, top: &Path) -> Result<(), LayerError> {
    squash_dir(bottom, top, Path::new(""))?;
    // The root's own attributes (mode, mtime) are the top layer's.
    copy_dir_attrs(top, bottom).map_err(at(bottom, "copy root attributes"))
}

fn squash_dir(bottom: &Path, top: &Path, rel: &Path) -> Result<(), LayerError> {
    let tdir = meta::join(top, rel);
    // Entries leave `tdir` and enter (or replace entries of) the same directory below: both
    // must be writable by their owner for that, whatever mode a step left them at (`chmod 555
    // d`). `tdir` gets its mode back below, before the caller copies its attributes to the
    // directory below (copy_dir_attrs), which gives that one its final mode.
    let bdir = meta::join(bottom, rel);
    writable_by_owner(&bdir).map_err(at(&bdir, "make writable for the squash"))?;
    let restore = writable_by_owner(&tdir).map_err(at(&tdir, "make writable for the squash"))?;
    squash_entries(bottom, top, rel, &tdir)?;
    if let Some(mode) = restore {
        std::fs::set_permissions(&tdir, std::fs::Permissions::from_mode(mode))
            .map_err(at(&tdir, "give back its mode after the squash"))?;
    }
    Ok(())
}

fn squash_entries(bottom: &Path, top: &Path, rel: &Path, tdir: &Path) -> Result<(), LayerError> {
    let mut names: Vec<_> = std::fs::read_dir(tdir)
        .map_err(at(tdir, "list layer"))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(at(tdir, "list layer"))?;
    names.sort();
    for name in names {
        let p = rel.join(&name);
        let t = top.join(&p);
        let b = bottom.join(&p);
        let tmd = std::fs::symlink_metadata(&t).map_err(at(&t, "stat"))?;
        let bmd = std::fs::symlink_metadata(&b).ok();
        let merge_into_dir = tmd.is_dir() && !is_opaque(&t) && bmd.as_ref().is_some_and(|m| m.is_dir());
        if merge_into_dir {
            squash_dir(bottom, top, &p)?;
            copy_dir_attrs(&t, &b).map_err(at(&b, "copy dir attributes"))?;
            continue;
        }
        // Whiteouts, opaque directories, files, symlinks and directories with nothing below:
        // the top entry replaces whatever the bottom layer had.
        if bmd.is_some() {
            remove_tree(&b)?;
        }
        move_down(&t, &b, &tmd).map_err(at(&t, "move into lower layer"))?;
        // A plain directory over a whiteout (or a file) in the layer below hid everything
        // beneath it; now that it sits directly on the workspace it must say so itself.
        if tmd.is_dir() && bmd.is_some() {
            rustix::fs::lsetxattr(b.as_path(), "user.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())
                .map_err(|e| at(&b, "mark opaque")(e.into()))?;
        }
    }
    Ok(())
}

/// Give a directory of this user's owner write if it lacks it (a layer's directory); its mode
/// before, if it was changed.
fn writable_by_owner(dir: &Path) -> io::Result<Option<u32>> {
    let md = std::fs::symlink_metadata(dir)?;
    if md.is_dir() && md.mode() & 0o200 == 0 && md.uid() == rustix::process::geteuid().as_raw() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode((md.mode() & 0o7777) | 0o200))?;
        return Ok(Some(md.mode() & 0o7777));
    }
    Ok(None)
}

/// Rename `t` (of the layer above, whose metadata is `tmd`) to `b` (in the layer below). A
/// directory changes parent, which takes write permission on it (its `..` entry changes): one
/// without owner write (a command's `chmod 555 d`) gets it for the move, then its mode back.
fn move_down(t: &Path, b: &Path, tmd: &std::fs::Metadata) -> io::Result<()> {
    let restore = if tmd.is_dir() { writable_by_owner(t)? } else { None };
    std::fs::rename(t, b)?;
    if let Some(mode) = restore {
        std::fs::set_permissions(b, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Give directory `to` (of the layer below) the attributes of `from` (the same directory in the
/// layer above, copied up from it): mode, times, owner, and the extended attributes a commit
/// carries. Overlay's own names stay each layer's.
fn copy_dir_attrs(from: &Path, to: &Path) -> io::Result<()> {
    let md = std::fs::symlink_metadata(from)?;
    let to_md = std::fs::symlink_metadata(to)?;
    if (md.uid(), md.gid()) != (to_md.uid(), to_md.gid()) {
        std::os::unix::fs::lchown(to, Some(md.uid()), Some(md.gid()))?;
    }
    apply_dir_attrs(to, &md, &meta::committed_xattrs_of_upper(from)?)
}

/// Copy a layer as hard links (files, symlinks and whiteouts share inodes; directories are new
/// with the same mode, xattrs and times). Squashing a copy only renames and removes entries, so
/// the original layers are left intact: this is how `diff` looks at a session without
/// collapsing its savepoints.
pub fn link_copy(src: &Path, dst: &Path) -> Result<(), LayerError> {
    let md = std::fs::symlink_metadata(src).map_err(at(src, "stat"))?;
    std::fs::DirBuilder::new().mode(0o700).create(dst).map_err(at(dst, "create"))?;
    // Every name, overlay's own too (they say what the layer means), the ACLs last; a copy
    // that lacked one would show `diff` something other than what the commit applies.
    for (name, value) in meta::acls_last(meta::xattrs_of_lower(src).map_err(at(src, "read xattrs"))?) {
        rustix::fs::lsetxattr(dst, name.as_os_str(), &value, rustix::fs::XattrFlags::empty())
            .map_err(|e| at(dst, "copy xattrs")(e.into()))?;
    }
    let entries: Vec<_> =
        std::fs::read_dir(src).map_err(at(src, "list"))?.collect::<Result<_, _>>().map_err(at(src, "list"))?;
    for e in entries {
        let s = e.path();
        let d = dst.join(e.file_name());
        if e.file_type().map_err(at(&s, "stat"))?.is_dir() {
            link_copy(&s, &d)?;
        } else {
            std::fs::hard_link(&s, &d).map_err(at(&s, "link"))?;
        }
    }
    set_dir_attrs(&md, dst).map_err(at(dst, "copy attributes"))
}

/// Give directory `to` the mode and times recorded in `md`.
fn set_dir_attrs(md: &std::fs::Metadata, to: &Path) -> io::Result<()> {
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(md.mode() & 0o7777))?;
    set_times(md, to)
}

/// Give `to` the access and modification times recorded in `md`.
fn set_times(md: &std::fs::Metadata, to: &Path) -> io::Result<()> {
    let ts = |s: i64, ns: i64| rustix::fs::Timespec { tv_sec: s, tv_nsec: ns as _ };
    let times = rustix::fs::Timestamps {
        last_access: ts(md.atime(), md.atime_nsec()),
        last_modification: ts(md.mtime(), md.mtime_nsec()),
    };
    rustix::fs::utimensat(rustix::fs::CWD, to, &times, rustix::fs::AtFlags::empty())?;
    Ok(())
}

/// What a workspace path looked like when a transaction first touched it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fingerprint {
    Absent,
    Present { kind: Kind, ino: u64, mtime_ns: i128, ctime_ns: i128, size: u64 },
}

impl Fingerprint {
    pub fn of(path: &Path) -> io::Result<Fingerprint> {
        match std::fs::symlink_metadata(path) {
            Ok(md) => Ok(Fingerprint::of_metadata(&md)),
            Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) => {
                Ok(Fingerprint::Absent)
            }
            Err(e) => Err(e),
        }
    }

    /// The fingerprint of an object whose metadata is `md`.
    pub fn of_metadata(md: &std::fs::Metadata) -> Fingerprint {
        Fingerprint::Present {
            kind: Kind::of(md),
            ino: md.ino(),
            mtime_ns: i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec()),
            ctime_ns: i128::from(md.ctime()) * 1_000_000_000 + i128::from(md.ctime_nsec()),
            size: md.size(),
        }
    }

    /// Whether `now` is the same object, unchanged. Directories compare by identity only:
    /// entries added next to ours by someone else are not a conflict.
    pub fn unchanged(&self, now: &Fingerprint) -> bool {
        match (self, now) {
            (Fingerprint::Absent, Fingerprint::Absent) => true,
            (
                Fingerprint::Present { kind: Kind::Dir, ino: a, .. },
                Fingerprint::Present { kind: Kind::Dir, ino: b, .. },
            ) => a == b,
            (a, b) => a == b,
        }
    }

    pub fn render(&self) -> String {
        match self {
            Fingerprint::Absent => "absent".into(),
            Fingerprint::Present { kind, ino, mtime_ns, ctime_ns, size } => {
                format!("{} {ino} {mtime_ns} {ctime_ns} {size}", kind.as_str())
            }
        }
    }

    pub fn parse(s: &str) -> Option<Fingerprint> {
        if s == "absent" {
            return Some(Fingerprint::Absent);
        }
        let w: Vec<&str> = s.split(' ').collect();
        match w.as_slice() {
            [k, ino, m, c, size] => Some(Fingerprint::Present {
                kind: Kind::parse(k)?,
                ino: ino.parse().ok()?,
                mtime_ns: m.parse().ok()?,
                ctime_ns: c.parse().ok()?,
                size: size.parse().ok()?,
            }),
            _ => None,
        }
    }
}

/// A digest as [`Fingerprints::render`] writes it (one spelling per value: `hex::unhex`).
fn digest_from_hex(h: &str) -> Option<[u8; 32]> {
    crate::hex::unhex(h)?.try_into().ok()
}

/// The base fingerprints of a transaction: path → what the workspace held there.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fingerprints {
    pub paths: BTreeMap<PathBuf, Fingerprint>,
    /// The last step whose layer was fingerprinted: a kept layer above it (a step cut short
    /// between keeping its layer and saving these) has paths without a base.
    pub covers: u32,
    /// The root's base in effect when each kept step was made (a run held for a person: step
    /// 1's, from `begin`). Per step, because `rollback --to N` makes step N the top again.
    /// Empty for a transaction from before bases were kept.
    pub roots: BTreeMap<u32, RootBase>,
}

impl Fingerprints {
    /// The text stored (sealed) by `StateDir::save_fingerprints`.
    pub fn render(&self) -> String {
        let mut text = format!("covers {}\n", self.covers);
        for (n, r) in &self.roots {
            text.push_str(&format!("root {n} {} {}\n", crate::hex::hex(&r.workspace), crate::hex::hex(&r.upper)));
        }
        for (p, fp) in &self.paths {
            text.push_str(&format!("{} {}\n", path_to_hex(p), fp.render()));
        }
        text
    }

    /// Back from [`render`](Self::render); None for anything else (a verified file that does
    /// not parse is damaged all the same).
    pub fn parse(text: &str) -> Option<Fingerprints> {
        let mut lines = text.lines();
        let covers = lines.next()?.strip_prefix("covers ")?.parse().ok()?;
        let mut paths = BTreeMap::new();
        let mut roots = BTreeMap::new();
        let mut lines = lines.peekable();
        // A path line starts with hex digits: "root" cannot be one.
        while let Some(r) = lines.peek().and_then(|l| l.strip_prefix("root ")) {
            let mut w = r.split(' ');
            let n = w.next().filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))?;
            let (n, ws, up) = (n.parse().ok()?, w.next()?, w.next()?);
            if w.next().is_some() {
                return None;
            }
            roots.insert(n, RootBase { workspace: digest_from_hex(ws)?, upper: digest_from_hex(up)? });
            lines.next();
        }
        for line in lines {
            let (h, rest) = line.split_once(' ')?;
            paths.insert(path_from_hex(h)?, Fingerprint::parse(rest)?);
        }
        Some(Fingerprints { paths, covers, roots })
    }

    /// Refuse to commit `layers` if one of them was kept without its fingerprints.
    pub fn check_covers(&self, layers: &[(u32, PathBuf)]) -> Result<(), LayerError> {
        match layers.iter().find(|(n, _)| *n > self.covers) {
            None => Ok(()),
            Some((_, upper)) => Err(LayerError(PathError::new(
                upper,
                "step kept without its base fingerprints (cut short?); roll back to an earlier step",
                io::ErrorKind::InvalidData.into(),
            ))),
        }
    }

    /// Record, for every path step `n`'s layer touches and that has no fingerprint yet, what
    /// the workspace holds there now (the transaction's base for that path).
    pub fn record_layer(&mut self, n: u32, upper: &Path, workspace: &Path) -> Result<(), LayerError> {
        self.walk(upper, workspace, Path::new(""))?;
        self.covers = self.covers.max(n);
        Ok(())
    }

    fn walk(&mut self, upper: &Path, workspace: &Path, rel: &Path) -> Result<(), LayerError> {
        let dir = meta::join(upper, rel);
        for e in std::fs::read_dir(&dir).map_err(at(&dir, "list layer"))? {
            let e = e.map_err(at(&dir, "list layer"))?;
            let p = rel.join(e.file_name());
            let fp = match self.paths.get(&p) {
                Some(fp) => *fp,
                None => {
                    let fp = Fingerprint::of(&workspace.join(&p)).map_err(at(&p, "fingerprint"))?;
                    self.paths.insert(p.clone(), fp);
                    fp
                }
            };
            if e.file_type().map_err(at(&p, "stat"))?.is_dir()
                && matches!(fp, Fingerprint::Present { kind: Kind::Dir, .. })
            {
                self.walk(upper, workspace, &p)?;
            }
        }
        Ok(())
    }

    /// The root's base in effect for the top kept step of `layers`.
    pub fn root_of(&self, layers: &[(u32, PathBuf)]) -> Option<RootBase> {
        layers.last().and_then(|(n, _)| self.roots.get(n)).copied()
    }

    /// Paths of the change set whose workspace object changed since the base; the root when
    /// the transaction changed its attributes and the workspace root's changed since `root`
    /// (the base in effect for the top step, [`root_of`](Self::root_of)) too (a root it did not
    /// change was [`rebase_root`]d: no change of it is in `cs`).
    pub fn conflicts(
        &self,
        cs: &ChangeSet,
        workspace: &Path,
        root: Option<&RootBase>,
    ) -> Result<Vec<PathBuf>, LayerError> {
        let mut out = Vec::new();
        for c in &cs.changes {
            if let ChangeOp::DirMeta { visible } = c.op {
                if let (true, true, Some(base)) = (visible, c.path.as_os_str().is_empty(), root) {
                    if root_digest(workspace, false).map_err(at(workspace, "read the workspace root"))?
                        != base.workspace
                    {
                        // Named as a path: the workspace root itself.
                        out.push(PathBuf::from("."));
                    }
                }
                continue;
            }
            let Some(base) = self.paths.get(&c.path) else { continue };
            let now = Fingerprint::of(&workspace.join(&c.path)).map_err(at(&c.path, "fingerprint"))?;
            if !base.unchanged(&now) {
                out.push(c.path.clone());
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::lock_tests::{held_as_a_warm_server_does, waits_for_release};

    #[test]
    fn layers_wait_until_no_overlay_uses_the_newest_step() -> Result<(), LayerError> {
        let steps = std::env::temp_dir().join(format!("txbox-layers-wait-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&steps);
        for n in [1, 3] {
            for d in ["upper", "work"] {
                let p = steps.join(n.to_string()).join(d);
                std::fs::create_dir_all(&p).map_err(at(&p, "mkdir"))?;
            }
        }
        // Not layers: a file and a symlink with a step's name.
        std::fs::write(steps.join("4"), "x").map_err(at(&steps, "write"))?;
        std::os::unix::fs::symlink("/", steps.join("5")).map_err(at(&steps, "symlink"))?;
        // Step 3's overlay is not detached yet.
        let work = steps.join("3/work");
        let held = held_as_a_warm_server_does(&work).map_err(at(&work, "flock"))?;
        let t = steps.clone();
        let got = waits_for_release(held, move || layers(&t), || {})?;
        assert_eq!(got.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1, 3]);
        std::fs::remove_dir_all(&steps).map_err(at(&steps, "cleanup"))
    }

    #[test]
    fn fingerprints_round_trip_and_compare() -> Result<(), LayerError> {
        let d = std::env::temp_dir().join(format!("txbox-fp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).map_err(at(&d, "mkdir"))?;
        let f = d.join("a\nb");
        std::fs::write(&f, "x").map_err(at(&f, "write"))?;
        let mut fps = Fingerprints { covers: 3, ..Fingerprints::default() };
        let fp = Fingerprint::of(&f).map_err(at(&f, "stat"))?;
        assert!(matches!(fp, Fingerprint::Present { kind: Kind::File, size: 1, .. }));
        assert!(fp.unchanged(&fp) && !fp.unchanged(&Fingerprint::Absent));
        fps.paths.insert(PathBuf::from("a\nb"), fp);
        fps.paths.insert(PathBuf::from("gone"), Fingerprint::Absent);
        assert_eq!(Fingerprints::parse(&fps.render()), Some(fps.clone()));
        assert!(Fingerprints::parse("covers 1\nzz absent\n").is_none());
        // With the root's bases per step, which no path line can be mistaken for.
        let mut with_root = fps.clone();
        with_root.roots.insert(1, RootBase { workspace: [7; 32], upper: [0xab; 32] });
        with_root.roots.insert(3, RootBase { workspace: [1; 32], upper: [2; 32] });
        let text = with_root.render();
        assert!(text.lines().nth(1).is_some_and(|l| l.starts_with("root 1 ")), "{text}");
        assert_eq!(Fingerprints::parse(&text), Some(with_root.clone()));
        assert_eq!(with_root.root_of(&[(1, d.clone()), (3, d.clone())]), with_root.roots.get(&3).copied());
        assert_eq!(with_root.root_of(&[(1, d.clone())]), with_root.roots.get(&1).copied());
        assert_eq!(with_root.root_of(&[(2, d.clone())]), None);
        let plus = format!("covers 1\nroot +1 {} {}\n", "0".repeat(64), "0".repeat(64));
        let plus_hex = format!("covers 1\nroot 1 +{} {}\n", "0".repeat(63), "0".repeat(64));
        for bad in ["covers 1\nroot 1 00 11\n", "covers 1\nroot x 00 11\n", "covers 1\nroot 1\n", &plus, &plus_hex] {
            assert!(Fingerprints::parse(bad).is_none(), "{bad}");
        }
        // Root lines only right after `covers`.
        let z = "0".repeat(64);
        let misplaced = format!("{}\nroot 1 {z} {z}\n", fps.render().trim_end());
        assert!(Fingerprints::parse(&misplaced).is_none());
        // Kept layers above what the fingerprints cover are refused.
        assert!(fps.check_covers(&[(1, d.clone()), (3, d.clone())]).is_ok());
        assert!(fps.check_covers(&[(4, d.clone())]).is_err());
        std::fs::remove_dir_all(&d).map_err(at(&d, "cleanup"))
    }
}
