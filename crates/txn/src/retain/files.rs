//! The files a retained transaction keeps for its undo, besides its record: their formats, and
//! a directory's attributes (taken, compared, set).
//!
//! ```text
//! retain-pre   (a commit, written before its commit point)
//!   txbox-retain-pre v1
//!   dir HEXPATH ATTRS          each directory whose attributes the commit sets, as it was
//!   inner HEXPATH FINGERPRINT  each entry inside a tree the commit moves in whole, as classified
//!   restat HEXPATH             entries the commit changes itself (fixups): fingerprinted after
//!   displaced BYTES DIRS       what the commit takes out of the workspace (an estimate)
//! retained     (a commit or an undo, written once it was applied)
//!   txbox-retained v1
//!   kind commit|undo
//!   workspace HEXPATH
//!   generation N               its line in the workspace's commit log
//!   time MS
//!   threshold NS               a ctime taken after it was applied (see `Inner::Since`)
//!   flags kept_only|-
//!   parts ID,ID…               the retained directories its undo uses (its own first)
//!   undoes ID,ID…|-            for an undo: the transactions it undid
//!   post I FINGERPRINT         what step I of its record placed, as it left it
//!   after I ATTRS              the attributes step I set
//!   restat HEXPATH FINGERPRINT an entry of a placed tree, as it left it
//! ```
//!
//! Both are sealed (crate::seal) for their transaction; the last line is the MAC. Paths are
//! hex; `-` is the workspace root.
//!
//! Owns: these formats, and reading and setting a directory's attributes. May not touch:
//! anything but the handles it is given.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use crate::hex::{hex, path_from_hex, path_to_hex, unhex};
use crate::session::Fingerprint;

/// A path in one of these files: hex, `-` for the workspace root.
pub(crate) fn hex_path(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        "-".to_string()
    } else {
        path_to_hex(p)
    }
}

/// Back from [`hex_path`]: only relative paths of plain components (or the root).
pub(crate) fn unhex_rel(s: &str) -> Option<PathBuf> {
    if s == "-" {
        return Some(PathBuf::new());
    }
    path_from_hex(s).filter(|p| is_plain_relative(p))
}

/// A non-empty relative path of plain components only (no `..`, `.`, root).
pub(crate) fn is_plain_relative(p: &Path) -> bool {
    !p.as_os_str().is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)))
}

/// A directory's attributes as a commit sets them (`DirMeta`): mode, owner, times, xattrs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirAttrs {
    pub ino: u64,
    /// Permission bits (with setuid, setgid, sticky).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    /// Every extended attribute, sorted by name.
    pub xattrs: Vec<(OsString, Vec<u8>)>,
}

impl DirAttrs {
    /// The attributes of the directory open as `fd`.
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<DirAttrs> {
        let st = rustix::fs::fstat(fd)?;
        let mut xattrs = Vec::new();
        for name in list_xattrs(fd)? {
            match get_xattr(fd, &name) {
                Ok(v) => xattrs.push((name, v)),
                // Removed meanwhile, or not readable by us: not ours to keep.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA) | Some(libc::EPERM)) => {}
                Err(e) => return Err(e),
            }
        }
        xattrs.sort();
        Ok(DirAttrs {
            ino: st.st_ino,
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            atime: (st.st_atime, st.st_atime_nsec as i64),
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            xattrs,
        })
    }

    pub fn render(&self) -> String {
        let x = if self.xattrs.is_empty() {
            "-".to_string()
        } else {
            self.xattrs.iter().map(|(n, v)| format!("{}={}", hex(n.as_bytes()), hex(v))).collect::<Vec<_>>().join(",")
        };
        format!(
            "{} {:o} {} {} {}.{} {}.{} {x}",
            self.ino, self.mode, self.uid, self.gid, self.atime.0, self.atime.1, self.mtime.0, self.mtime.1
        )
    }

    pub fn parse(words: &[&str]) -> Option<DirAttrs> {
        let [ino, mode, uid, gid, atime, mtime, x] = words else { return None };
        let time = |s: &str| -> Option<(i64, i64)> {
            let (a, b) = s.split_once('.')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        };
        let xattrs = if *x == "-" {
            Vec::new()
        } else {
            x.split(',')
                .map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((OsString::from_vec(unhex(k)?), unhex(v)?))
                })
                .collect::<Option<Vec<_>>>()?
        };
        Some(DirAttrs {
            ino: ino.parse().ok()?,
            mode: u32::from_str_radix(mode, 8).ok()?,
            uid: uid.parse().ok()?,
            gid: gid.parse().ok()?,
            atime: time(atime)?,
            mtime: time(mtime)?,
            xattrs,
        })
    }
}

fn list_xattrs(fd: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut buf = vec![0u8; 1024];
    loop {
        match rustix::fs::flistxattr(fd, &mut buf) {
            Ok(n) => {
                return Ok(buf[..n]
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| OsString::from_vec(s.to_vec()))
                    .collect())
            }
            Err(rustix::io::Errno::RANGE) => {
                let len: usize = rustix::fs::flistxattr(fd, &mut [0u8; 0][..])?;
                buf.resize(len.max(buf.len() * 2), 0);
            }
            Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
}

fn get_xattr(fd: BorrowedFd<'_>, name: &OsString) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        match rustix::fs::fgetxattr(fd, name.as_os_str(), &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => {
                let len: usize = rustix::fs::fgetxattr(fd, name.as_os_str(), &mut [0u8; 0][..])?;
                buf.resize(len.max(buf.len() * 2), 0);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Which attributes an undo sets on a directory (the ones the undone transaction changed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttrSet {
    pub mode: Option<u32>,
    pub owner: Option<(u32, u32)>,
    /// (atime, mtime)
    pub times: Option<((i64, i64), (i64, i64))>,
    pub xattrs: Option<Vec<(OsString, Vec<u8>)>>,
}

impl AttrSet {
    pub fn is_empty(&self) -> bool {
        self.mode.is_none() && self.owner.is_none() && self.times.is_none() && self.xattrs.is_none()
    }

    /// Apply to the directory open (read-only) as `fd`. Extended attributes not wanted are
    /// removed only in the `user.` namespace, as a commit does.
    pub fn apply(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        if let Some((uid, gid)) = self.owner {
            let st = rustix::fs::fstat(fd)?;
            if (st.st_uid, st.st_gid) != (uid, gid) {
                rustix::fs::fchown(
                    fd,
                    Some(rustix::process::Uid::from_raw(uid)),
                    Some(rustix::process::Gid::from_raw(gid)),
                )?;
            }
        }
        if let Some(mode) = self.mode {
            rustix::fs::fchmod(fd, rustix::fs::Mode::from_raw_mode(mode))?;
        }
        if let Some(want) = &self.xattrs {
            for name in list_xattrs(fd)? {
                if name.as_bytes().starts_with(b"user.") && !want.iter().any(|(w, _)| *w == name) {
                    match rustix::fs::fremovexattr(fd, name.as_os_str()) {
                        Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            for (name, value) in want {
                rustix::fs::fsetxattr(fd, name.as_os_str(), value, rustix::fs::XattrFlags::empty())?;
            }
        }
        if let Some((a, m)) = self.times {
            let ts = |(s, ns): (i64, i64)| rustix::fs::Timespec { tv_sec: s, tv_nsec: ns as _ };
            match rustix::fs::futimens(fd, &rustix::fs::Timestamps { last_access: ts(a), last_modification: ts(m) }) {
                Ok(()) => {}
                // Only its owner (or CAP_FOWNER) may set a directory's times. Another user's (a
                // shared workspace root) keeps the times its entries' renames gave it, as a
                // commit leaves them (`check::dir_meta_plan`).
                Err(rustix::io::Errno::PERM)
                    if rustix::fs::fstat(fd)?.st_uid != rustix::process::geteuid().as_raw() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    pub fn render(&self) -> String {
        let mode = self.mode.map_or("-".into(), |m| format!("{m:o}"));
        let owner = self.owner.map_or("-".into(), |(u, g)| format!("{u}:{g}"));
        let times = self.times.map_or("-".into(), |(a, m)| format!("{}.{}/{}.{}", a.0, a.1, m.0, m.1));
        let xattrs = match &self.xattrs {
            None => "-".to_string(),
            Some(x) if x.is_empty() => "=".to_string(),
            Some(x) => x.iter().map(|(n, v)| format!("{}={}", hex(n.as_bytes()), hex(v))).collect::<Vec<_>>().join(","),
        };
        format!("{mode} {owner} {times} {xattrs}")
    }

    pub fn parse(words: &[&str]) -> Option<AttrSet> {
        let [mode, owner, times, xattrs] = words else { return None };
        let mode = match *mode {
            "-" => None,
            m => Some(u32::from_str_radix(m, 8).ok()?),
        };
        let owner = match *owner {
            "-" => None,
            o => {
                let (u, g) = o.split_once(':')?;
                Some((u.parse().ok()?, g.parse().ok()?))
            }
        };
        let time = |s: &str| -> Option<(i64, i64)> {
            let (a, b) = s.split_once('.')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        };
        let times = match *times {
            "-" => None,
            t => {
                let (a, m) = t.split_once('/')?;
                Some((time(a)?, time(m)?))
            }
        };
        let xattrs = match *xattrs {
            "-" => None,
            "=" => Some(Vec::new()),
            x => Some(
                x.split(',')
                    .map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((OsString::from_vec(unhex(k)?), unhex(v)?))
                    })
                    .collect::<Option<Vec<_>>>()?,
            ),
        };
        Some(AttrSet { mode, owner, times, xattrs })
    }
}

/// What a commit keeps for its undo before its commit point (`retain-pre`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pre {
    /// Directories whose attributes the commit sets, as they were.
    pub dirs: BTreeMap<PathBuf, DirAttrs>,
    /// Entries inside trees the commit moves in whole, as classified.
    pub inner: BTreeMap<PathBuf, Fingerprint>,
    /// Entries the commit changes itself after classification: fingerprinted after it.
    pub restat: Vec<PathBuf>,
    pub displaced_bytes: u64,
    pub displaced_dirs: usize,
}

const PRE_MAGIC: &str = "txbox-retain-pre v1";

impl Pre {
    pub fn render(&self) -> String {
        let mut s = format!("{PRE_MAGIC}\n");
        for (p, a) in &self.dirs {
            s.push_str(&format!("dir {} {}\n", hex_path(p), a.render()));
        }
        for (p, fp) in &self.inner {
            s.push_str(&format!("inner {} {}\n", hex_path(p), fp.render()));
        }
        for p in &self.restat {
            s.push_str(&format!("restat {}\n", hex_path(p)));
        }
        s.push_str(&format!("displaced {} {}\n", self.displaced_bytes, self.displaced_dirs));
        s
    }

    pub fn parse(body: &str) -> Option<Pre> {
        let mut lines = body.lines();
        if lines.next()? != PRE_MAGIC {
            return None;
        }
        let mut pre = Pre::default();
        // Collected first and built in bulk: `render` wrote them in order, and the maps are built
        // from sorted input in one pass, where inserting one by one compared every path
        // component by component against the tree (~12 ms for 10,000 entries).
        let mut dirs = Vec::new();
        let mut inner = Vec::new();
        for line in lines {
            let w: Vec<&str> = line.split(' ').collect();
            match w.as_slice() {
                ["dir", p, rest @ ..] => dirs.push((unhex_rel(p)?, DirAttrs::parse(rest)?)),
                ["inner", p, rest @ ..] => inner
                    .push((unhex_rel(p).filter(|p| !p.as_os_str().is_empty())?, Fingerprint::parse(&rest.join(" "))?)),
                ["restat", p] => pre.restat.push(unhex_rel(p)?),
                ["displaced", b, d] => {
                    pre.displaced_bytes = b.parse().ok()?;
                    pre.displaced_dirs = d.parse().ok()?;
                }
                _ => return None,
            }
        }
        pre.dirs = dirs.into_iter().collect();
        pre.inner = inner.into_iter().collect();
        Some(pre)
    }
}

/// Whether a retained transaction was a commit or an undo (which records its steps in an undo
/// record instead of a commit record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainedKind {
    Commit,
    Undo,
}

/// What a transaction keeps for its undo once applied (`retained`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retained {
    pub kind: RetainedKind,
    pub workspace: PathBuf,
    pub generation: u64,
    pub time_ms: u64,
    /// A ctime taken after the transaction was applied: an entry of a tree it put back (not one
    /// it classified) with a ctime before it is unchanged since (see `entry::Inner::Since`).
    pub threshold_ns: i128,
    /// A transaction that only kept build output (issue #15): not what `undo` calls the last
    /// commit, never undone by `--to`.
    pub kept_only: bool,
    /// The retained directories its undo uses, its own first.
    pub parts: Vec<String>,
    /// For an undo: the transactions it undid.
    pub undoes: Vec<String>,
    /// Step index → what that step placed, as the transaction left it.
    pub post: BTreeMap<usize, Fingerprint>,
    /// Step index → the attributes that step set.
    pub after: BTreeMap<usize, DirAttrs>,
    /// Entries of placed trees fingerprinted after the transaction (see [`Pre::restat`]).
    pub restat: BTreeMap<PathBuf, Fingerprint>,
}

const RETAINED_MAGIC: &str = "txbox-retained v1";

fn ids(list: &[String]) -> String {
    if list.is_empty() {
        "-".to_string()
    } else {
        list.join(",")
    }
}

fn parse_ids(s: &str) -> Option<Vec<String>> {
    if s == "-" {
        return Some(Vec::new());
    }
    s.split(',').map(|id| crate::layout::valid_id(id).then(|| id.to_string())).collect()
}

impl Retained {
    pub fn render(&self) -> String {
        let mut s = format!("{RETAINED_MAGIC}\n");
        s.push_str(&format!(
            "kind {}\n",
            match self.kind {
                RetainedKind::Commit => "commit",
                RetainedKind::Undo => "undo",
            }
        ));
        s.push_str(&format!("workspace {}\n", path_to_hex(&self.workspace)));
        s.push_str(&format!("generation {}\n", self.generation));
        s.push_str(&format!("time {}\n", self.time_ms));
        s.push_str(&format!("threshold {}\n", self.threshold_ns));
        s.push_str(&format!("flags {}\n", if self.kept_only { "kept_only" } else { "-" }));
        s.push_str(&format!("parts {}\n", ids(&self.parts)));
        s.push_str(&format!("undoes {}\n", ids(&self.undoes)));
        for (i, fp) in &self.post {
            s.push_str(&format!("post {i} {}\n", fp.render()));
        }
        for (i, a) in &self.after {
            s.push_str(&format!("after {i} {}\n", a.render()));
        }
        for (p, fp) in &self.restat {
            s.push_str(&format!("restat {} {}\n", hex_path(p), fp.render()));
        }
        s
    }

    pub fn parse(body: &str) -> Option<Retained> {
        let mut lines = body.lines();
        if lines.next()? != RETAINED_MAGIC {
            return None;
        }
        let mut field =
            |name: &str| -> Option<String> { lines.next()?.strip_prefix(name)?.strip_prefix(' ').map(str::to_string) };
        let kind = match field("kind")?.as_str() {
            "commit" => RetainedKind::Commit,
            "undo" => RetainedKind::Undo,
            _ => return None,
        };
        let workspace = path_from_hex(&field("workspace")?).filter(|p| crate::layout::is_normal_absolute(p))?;
        let generation = field("generation")?.parse().ok()?;
        let time_ms = field("time")?.parse().ok()?;
        let threshold_ns = field("threshold")?.parse().ok()?;
        let kept_only = match field("flags")?.as_str() {
            "-" => false,
            "kept_only" => true,
            _ => return None,
        };
        let parts = parse_ids(&field("parts")?)?;
        let undoes = parse_ids(&field("undoes")?)?;
        let mut r = Retained {
            kind,
            workspace,
            generation,
            time_ms,
            threshold_ns,
            kept_only,
            parts,
            undoes,
            post: BTreeMap::new(),
            after: BTreeMap::new(),
            restat: BTreeMap::new(),
        };
        for line in lines {
            let w: Vec<&str> = line.split(' ').collect();
            match w.as_slice() {
                ["post", i, rest @ ..] => {
                    r.post.insert(i.parse().ok()?, Fingerprint::parse(&rest.join(" "))?);
                }
                ["after", i, rest @ ..] => {
                    r.after.insert(i.parse().ok()?, DirAttrs::parse(rest)?);
                }
                ["restat", p, rest @ ..] => {
                    r.restat.insert(unhex_rel(p)?, Fingerprint::parse(&rest.join(" "))?);
                }
                _ => return None,
            }
        }
        (!r.parts.is_empty()).then_some(r)
    }
}

/// Read a sealed file `rel` beneath `dir` (at most `limit` bytes) and open it for transaction
/// `id`; None if it is missing, Err(InvalidData) if it does not verify.
pub(crate) fn read_sealed(
    dir: BorrowedFd<'_>,
    rel: &Path,
    seal: &crate::seal::Seal,
    domain: crate::seal::Domain,
    id: &str,
    limit: usize,
) -> io::Result<Option<String>> {
    let bytes = match crate::fsx::read_small(dir, rel, limit) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match seal.open(domain, id, &bytes) {
        Some(body) => Ok(Some(body.to_string())),
        None => Err(io::Error::new(io::ErrorKind::InvalidData, "does not verify")),
    }
}

/// Write `body` sealed for `id` as `name` in `dir` (replaced whole; synced when `durable`).
pub(crate) fn write_sealed(
    dir: impl AsFd,
    name: &str,
    seal: &crate::seal::Seal,
    domain: crate::seal::Domain,
    id: &str,
    body: &str,
    durable: bool,
) -> io::Result<()> {
    crate::fsx::replace(dir.as_fd(), name, seal.seal(domain, id, body).as_bytes(), durable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Kind;

    fn attrs() -> DirAttrs {
        DirAttrs {
            ino: 42,
            mode: 0o2755,
            uid: 1000,
            gid: 100,
            atime: (1, 2),
            mtime: (1_700_000_000, 999_999_999),
            xattrs: vec![(OsString::from("user.a b"), b"\n\xff".to_vec()), (OsString::from("user.e"), Vec::new())],
        }
    }

    #[test]
    fn files_round_trip() {
        let fp = Fingerprint::Present { kind: Kind::File, ino: 7, mtime_ns: -5, ctime_ns: 9, size: 3 };
        let mut pre = Pre { displaced_bytes: 4096, displaced_dirs: 2, ..Pre::default() };
        pre.dirs.insert(PathBuf::new(), attrs());
        pre.dirs.insert(PathBuf::from("a/b"), DirAttrs { xattrs: Vec::new(), ..attrs() });
        pre.inner.insert(PathBuf::from("n/\n\u{e9}"), fp);
        pre.restat.push(PathBuf::from("n/x"));
        assert_eq!(Pre::parse(&pre.render()), Some(pre));
        let mut r = Retained {
            kind: RetainedKind::Undo,
            workspace: PathBuf::from("/w s"),
            generation: 12,
            time_ms: 1,
            threshold_ns: 1_700_000_000_123_456_789,
            kept_only: true,
            parts: vec!["0123456789abcdef".into(), "fedcba9876543210".into()],
            undoes: vec!["fedcba9876543210".into()],
            post: BTreeMap::new(),
            after: BTreeMap::new(),
            restat: BTreeMap::new(),
        };
        r.post.insert(3, fp);
        r.after.insert(4, attrs());
        r.restat.insert(PathBuf::from("n/x"), fp);
        assert_eq!(Retained::parse(&r.render()), Some(r));
        let set =
            AttrSet { mode: Some(0o700), owner: Some((1, 2)), times: Some(((1, 2), (3, 4))), xattrs: Some(vec![]) };
        assert_eq!(AttrSet::parse(&set.render().split(' ').collect::<Vec<_>>()), Some(set));
        let none = AttrSet::default();
        assert_eq!(AttrSet::parse(&none.render().split(' ').collect::<Vec<_>>()), Some(none));
    }

    #[test]
    fn paths_stay_relative_and_ids_valid() {
        for bad in ["/etc", "../x", "a/../../b", "./a"] {
            assert_eq!(unhex_rel(&path_to_hex(Path::new(bad))), None, "{bad}");
        }
        assert_eq!(unhex_rel("-"), Some(PathBuf::new()));
        assert_eq!(parse_ids("0123456789abcdef,../etc"), None);
    }
}
