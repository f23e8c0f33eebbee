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

/// Create the directories of step `n` in `steps`. The upper root mirrors the root as the
/// steps below show it: the topmost earlier layer's (`below`, which mirrored the one before it
/// and holds what its step did to the root), or the workspace root's for the first step.
pub fn create_step(
    steps: &Path,
    n: u32,
    workspace: &Path,
    below: Option<&Path>,
) -> Result<(PathBuf, PathBuf), LayerError> {
    let step = steps.join(n.to_string());
    std::fs::DirBuilder::new().mode(0o700).create(&step).map_err(at(&step, "create step"))?;
    let upper = step.join(crate::layout::UPPER);
    let work = step.join(crate::layout::WORK);
    let root = below.unwrap_or(workspace);
    let root_md = std::fs::metadata(root).map_err(at(root, "stat the root below"))?;
    std::fs::DirBuilder::new().mode(0o700).create(&upper).map_err(at(&upper, "create upper"))?;
    std::fs::DirBuilder::new().mode(0o700).create(&work).map_err(at(&work, "create work"))?;
    mirror_root(&upper, root, &root_md).map_err(at(&upper, "mirror the root below"))?;
    Ok((upper, work))
}

/// Give an upper root (fresh, or a spare an earlier run left, possibly for another workspace)
/// the workspace root's mode, owner and times: overlay shows the upper root's attributes as
/// the merged root's, and an untouched root must not look changed (nor be chowned at commit).
/// Without root the owner stays ours, and the group is the workspace's only if this process is
/// in it; `check::root_owner_changed` tells such a difference from a command's. The extended
/// attributes a commit carries (`user.*`, POSIX ACLs) are mirrored too: the root's own would
/// otherwise look removed, and the first commit would remove them from the workspace.
pub fn mirror_root(upper: &Path, workspace: &Path, ws_md: &std::fs::Metadata) -> io::Result<()> {
    set_dir_attrs(ws_md, upper)?;
    mirror_xattrs(upper, workspace)?;
    let up = std::fs::symlink_metadata(upper)?;
    if (up.uid(), up.gid()) == (ws_md.uid(), ws_md.gid()) {
        return Ok(());
    }
    if rustix::process::geteuid().is_root() {
        return std::os::unix::fs::lchown(upper, Some(ws_md.uid()), Some(ws_md.gid()));
    }
    if up.gid() != ws_md.gid() && crate::check::member_groups().contains(&ws_md.gid()) {
        // A filesystem that refuses it leaves the root looking changed, as before: not a
        // reason to refuse the run.
        let _ = std::os::unix::fs::lchown(upper, None, Some(ws_md.gid()));
    }
    Ok(())
}

/// Give `upper` exactly the extended attributes of `root` (the workspace root, or an earlier
/// layer's upper root) that a commit carries: those it lacks, and none of its own (a spare kept
/// from another workspace's run may have some).
fn mirror_xattrs(upper: &Path, root: &Path) -> io::Result<()> {
    sync_xattrs(upper, &meta::committed_xattrs_of_lower(root)?)
}

/// Make the committed extended attributes of `dir` (a layer's directory) exactly `want`.
fn sync_xattrs(dir: &Path, want: &[(std::ffi::OsString, Vec<u8>)]) -> io::Result<()> {
    let have = meta::committed_xattrs_of_upper(dir)?;
    if have.as_slice() == want {
        return Ok(());
    }
    for (name, _) in have.iter().filter(|(n, _)| !want.iter().any(|(w, _)| w == n)) {
        match rustix::fs::lremovexattr(dir, name.as_os_str()) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for (name, value) in want.iter().filter(|w| !have.contains(w)) {
        rustix::fs::lsetxattr(dir, name.as_os_str(), value, rustix::fs::XattrFlags::empty())?;
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
    let mut names: Vec<_> = std::fs::read_dir(&tdir)
        .map_err(at(&tdir, "list layer"))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(at(&tdir, "list layer"))?;
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
        std::fs::rename(&t, &b).map_err(at(&t, "move into lower layer"))?;
        // A plain directory over a whiteout (or a file) in the layer below hid everything
        // beneath it; now that it sits directly on the workspace it must say so itself.
        if tmd.is_dir() && bmd.is_some() {
            rustix::fs::lsetxattr(b.as_path(), "user.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())
                .map_err(|e| at(&b, "mark opaque")(e.into()))?;
        }
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
    set_dir_attrs(&md, to)?;
    sync_xattrs(to, &meta::committed_xattrs_of_upper(from)?)
}

/// Copy a layer as hard links (files, symlinks and whiteouts share inodes; directories are new
/// with the same mode, xattrs and times). Squashing a copy only renames and removes entries, so
/// the original layers are left intact: this is how `diff` looks at a session without
/// collapsing its savepoints.
pub fn link_copy(src: &Path, dst: &Path) -> Result<(), LayerError> {
    let md = std::fs::symlink_metadata(src).map_err(at(src, "stat"))?;
    std::fs::DirBuilder::new().mode(0o700).create(dst).map_err(at(dst, "create"))?;
    for (name, value) in meta::xattrs_of_lower(src).map_err(at(src, "read xattrs"))? {
        let _ = rustix::fs::lsetxattr(dst, name.as_os_str(), &value, rustix::fs::XattrFlags::empty());
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

/// The base fingerprints of a transaction: path → what the workspace held there.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fingerprints {
    pub paths: BTreeMap<PathBuf, Fingerprint>,
    /// The last step whose layer was fingerprinted: a kept layer above it (a step cut short
    /// between keeping its layer and saving these) has paths without a base.
    pub covers: u32,
}

impl Fingerprints {
    /// The text stored (sealed) by `StateDir::save_fingerprints`.
    pub fn render(&self) -> String {
        let mut text = format!("covers {}\n", self.covers);
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
        for line in lines {
            let (h, rest) = line.split_once(' ')?;
            paths.insert(path_from_hex(h)?, Fingerprint::parse(rest)?);
        }
        Some(Fingerprints { paths, covers })
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

    /// Paths of the change set whose workspace object changed since the base.
    pub fn conflicts(&self, cs: &ChangeSet, workspace: &Path) -> Result<Vec<PathBuf>, LayerError> {
        let mut out = Vec::new();
        for c in &cs.changes {
            if matches!(c.op, ChangeOp::DirMeta { .. }) {
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
        // Kept layers above what the fingerprints cover are refused.
        assert!(fps.check_covers(&[(1, d.clone()), (3, d.clone())]).is_ok());
        assert!(fps.check_covers(&[(4, d.clone())]).is_err());
        std::fs::remove_dir_all(&d).map_err(at(&d, "cleanup"))
    }
}
