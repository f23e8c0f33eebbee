//! File metadata as the transaction layer sees it: kinds, comparable attributes, and extended
//! attributes with overlayfs's own names told apart from the user's.

use std::ffi::{CStr, OsStr, OsString};
use std::fs::Metadata;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// The type of a filesystem object, as far as a commit cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// Device nodes, FIFOs and sockets: never committed, only reported.
    Special,
}

impl Kind {
    pub fn of(md: &Metadata) -> Kind {
        let ft = md.file_type();
        if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else if ft.is_symlink() {
            Kind::Symlink
        } else {
            Kind::Special
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Special => "special",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "file" => Kind::File,
            "dir" => Kind::Dir,
            "symlink" => Kind::Symlink,
            "special" => Kind::Special,
            _ => return None,
        })
    }
}

/// An overlayfs whiteout: a 0:0 character device (all whiteouts share one inode on 6.x).
pub fn is_whiteout(md: &Metadata) -> bool {
    md.file_type().is_char_device() && md.rdev() == 0
}

/// The prefix of overlayfs's own xattrs. Every overlay txbox mounts uses `userxattr` (root's
/// too), so overlay's bookkeeping is `user.overlay.*` and nothing else; `trusted.overlay.*`
/// names in an upper layer were set by the command itself.
const OVERLAY_PREFIX: &[u8] = b"user.overlay.";
/// How overlayfs stores a name that itself starts with its prefix (`user.overlay.x` set by a
/// command is `user.overlay.overlay.x` in the upper layer).
const ESCAPED_PREFIX: &[u8] = b"user.overlay.overlay.";
/// The POSIX ACLs, the only `system.*` attributes a commit carries.
const POSIX_ACLS: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

/// What a commit does with one extended attribute found on an object of an upper layer. Only
/// an allowlist is committed: a `security.capability` set inside would otherwise give any
/// user who runs the file its capabilities, and an `user.overlay.*` name would be interpreted
/// by every later overlay whose lower layer is the workspace (a file marked as a redirect or a
/// whiteout becomes unreadable and undeletable there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrClass {
    /// On the allowlist, committed as is: `user.*` but `user.overlay.*`, and the POSIX ACLs
    /// `system.posix_acl_access` and `system.posix_acl_default`.
    Committed,
    /// overlayfs's own bookkeeping (`user.overlay.opaque`, `.origin`, `.impure`, ...):
    /// removed before the commit, never reported.
    Overlay,
    /// Anything else: removed before the commit and reported. `security.*` (capabilities,
    /// SELinux, SMACK, IMA and EVM labels), `trusted.*`, other `system.*` and other
    /// namespaces, and the `user.overlay.*` names a command set, which overlayfs stores
    /// escaped: `real` is the name as the command set it.
    Dropped { real: OsString },
}

/// How a name found in an upper layer (written through a `userxattr` overlay) is committed.
pub fn classify_xattr(name: &OsStr) -> XattrClass {
    let b = name.as_bytes();
    if let Some(inner) = b.strip_prefix(ESCAPED_PREFIX) {
        let mut real = OVERLAY_PREFIX.to_vec();
        real.extend_from_slice(inner);
        return XattrClass::Dropped { real: OsString::from_vec(real) };
    }
    if b.starts_with(OVERLAY_PREFIX) {
        return XattrClass::Overlay;
    }
    if is_committed_name(name) {
        XattrClass::Committed
    } else {
        XattrClass::Dropped { real: name.to_os_string() }
    }
}

/// Whether `name` is a POSIX ACL. Setting the access ACL also sets the owner's, group's and
/// others' mode bits from it, so whoever sets names on a directory sets the ACLs last: an ACL
/// that gives the owner no write would take away the write permission that setting a `user.*`
/// name on a directory needs ([`acls_last`]).
pub fn is_acl(name: &OsStr) -> bool {
    POSIX_ACLS.contains(&name.as_bytes())
}

/// Names in the order to set (or remove) them: every other name first, the ACLs last.
pub fn acls_last<T>(mut names: Vec<(OsString, T)>) -> Vec<(OsString, T)> {
    names.sort_by_key(|(n, _)| is_acl(n));
    names
}

/// Whether a name is on the commit allowlist (the name as the command sees it).
pub fn is_committed_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    (b.starts_with(b"user.") && !b.starts_with(OVERLAY_PREFIX)) || POSIX_ACLS.contains(&b)
}

/// List the names of the extended attributes of `path` (not following a final symlink).
pub fn list_xattrs(path: &Path) -> io::Result<Vec<OsString>> {
    list_names(|buf| rustix::fs::llistxattr(path, buf))
}

/// The same for `name` in the directory open as `dir` (whose path is `dir_path`), without
/// walking the whole path again: `listxattrat` (Linux 6.13), or `llistxattr` on the full path
/// on older kernels. Classifying a large new tree spent most of its time in path walks.
pub fn list_xattrs_at(dir: BorrowedFd<'_>, dir_path: &Path, name: &OsStr) -> io::Result<Vec<OsString>> {
    XattrLister::default().list_at(dir, dir_path, name)
}

/// [`list_xattrs_at`] for many names in a row, with its buffers kept between calls: a new tree
/// of 10,000 files otherwise allocated a name and a listing buffer for each.
#[derive(Debug, Default)]
pub struct XattrLister {
    /// The name being listed, NUL-terminated.
    name: Vec<u8>,
    /// The listing, grown as the kernel asks.
    buf: Vec<u8>,
}

impl XattrLister {
    /// The xattr names of `name` in the directory open as `dir` (path `dir_path`), not
    /// following a final symlink; the same answer as [`list_xattrs_at`].
    pub fn list_at(&mut self, dir: BorrowedFd<'_>, dir_path: &Path, name: &OsStr) -> io::Result<Vec<OsString>> {
        if LISTXATTRAT_MISSING.load(Ordering::Relaxed) {
            return list_xattrs(&dir_path.join(name));
        }
        self.name.clear();
        self.name.extend_from_slice(name.as_bytes());
        self.name.push(0);
        let cname = CStr::from_bytes_with_nul(&self.name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if self.buf.is_empty() {
            self.buf.resize(1024, 0);
        }
        match list_names_in(&mut self.buf, |buf| listxattrat(dir, cname, buf)) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                LISTXATTRAT_MISSING.store(true, Ordering::Relaxed);
                list_xattrs(&dir_path.join(name))
            }
            other => other,
        }
    }
}

/// Set once `listxattrat` answered ENOSYS (a kernel before 6.13): paths are used from then on.
static LISTXATTRAT_MISSING: AtomicBool = AtomicBool::new(false);

/// `listxattrat(2)`, not following a final symlink.
fn listxattrat(dir: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Result<usize, rustix::io::Errno> {
    // The number of listxattrat in the kernel's unified table of new system calls.
    const SYS_LISTXATTRAT: libc::c_long = 465;
    // SAFETY: the kernel reads the NUL-terminated `name` and writes at most `buf.len()` bytes
    // to `buf`; both outlive the call, and `dir` is an open descriptor for its duration.
    let r = unsafe {
        libc::syscall(
            SYS_LISTXATTRAT,
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    match usize::try_from(r) {
        Ok(n) => Ok(n),
        Err(_) => Err(rustix::io::Errno::from_io_error(&io::Error::last_os_error()).unwrap_or(rustix::io::Errno::IO)),
    }
}

/// Names from a `listxattr`-style call, growing the buffer as the call asks.
fn list_names(list: impl FnMut(&mut [u8]) -> Result<usize, rustix::io::Errno>) -> io::Result<Vec<OsString>> {
    list_names_in(&mut vec![0u8; 1024], list)
}

/// [`list_names`] into `buf` (not empty), which keeps its size for the next call.
fn list_names_in(
    buf: &mut Vec<u8>,
    mut list: impl FnMut(&mut [u8]) -> Result<usize, rustix::io::Errno>,
) -> io::Result<Vec<OsString>> {
    loop {
        match list(buf) {
            Ok(n) => {
                return Ok(buf[..n]
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| OsString::from_vec(s.to_vec()))
                    .collect())
            }
            Err(rustix::io::Errno::RANGE) => {
                let len = list(&mut [])?;
                buf.resize(len.max(buf.len() * 2), 0);
            }
            // Filesystems or objects without xattr support have none to commit.
            Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
}

pub fn get_xattr(path: &Path, name: &OsStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        match rustix::fs::lgetxattr(path, name, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => {
                let len: usize = rustix::fs::lgetxattr(path, name, &mut [0u8; 0][..])?;
                buf.resize(len.max(buf.len() * 2), 0);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The xattrs a commit carries of an object in an upper layer ([`XattrClass::Committed`]),
/// sorted by name, so two sets compare with `==`.
pub fn committed_xattrs_of_upper(path: &Path) -> io::Result<Vec<(OsString, Vec<u8>)>> {
    let mut out = Vec::new();
    for name in list_xattrs(path)? {
        if classify_xattr(&name) == XattrClass::Committed {
            out.push((name.clone(), get_xattr(path, &name)?));
        }
    }
    out.sort();
    Ok(out)
}

/// The xattrs of an object in the real workspace that a commit would carry, sorted by name:
/// what a committed object's [`committed_xattrs_of_upper`] is compared with.
pub fn committed_xattrs_of_lower(path: &Path) -> io::Result<Vec<(OsString, Vec<u8>)>> {
    let mut out = Vec::new();
    for name in list_xattrs(path)? {
        if is_committed_name(&name) {
            out.push((name.clone(), get_xattr(path, &name)?));
        }
    }
    out.sort();
    Ok(out)
}

/// Every xattr of an object, sorted by name (copies of layers keep them all).
pub fn xattrs_of_lower(path: &Path) -> io::Result<Vec<(OsString, Vec<u8>)>> {
    let mut out = Vec::new();
    for name in list_xattrs(path)? {
        out.push((name.clone(), get_xattr(path, &name)?));
    }
    out.sort();
    Ok(out)
}

/// Permission bits a commit may carry: setuid, setgid and sticky are stripped.
pub const COMMIT_MODE_MASK: u32 = 0o777;

/// True when the two objects have the same attributes a commit reproduces (not content).
pub fn same_attributes(a: &Metadata, b: &Metadata) -> bool {
    Kind::of(a) == Kind::of(b)
        && a.mode() == b.mode()
        && a.uid() == b.uid()
        && a.gid() == b.gid()
        && a.size() == b.size()
        && a.mtime() == b.mtime()
        && a.mtime_nsec() == b.mtime_nsec()
}

/// True when two regular files, both of `size` bytes by their metadata, hold the same bytes.
/// The buffers fit the size (up to 64 KiB): unchanged copy-ups are mostly small files, and
/// allocating and zeroing 128 KiB for each made comparing them cost more than a real change.
pub fn same_file_content(a: &Path, b: &Path, size: u64) -> io::Result<bool> {
    use std::io::Read;
    let mut fa = std::fs::File::open(a)?;
    let mut fb = std::fs::File::open(b)?;
    // One byte more than the size, so that growth since the stat shows as a difference.
    let cap = usize::try_from(size).unwrap_or(usize::MAX).saturating_add(1).min(64 * 1024);
    let mut ba = vec![0u8; cap];
    let mut bb = vec![0u8; cap];
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }

    fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match f.read(&mut buf[n..])? {
                0 => break,
                k => n += k,
            }
        }
        Ok(n)
    }
}

/// Join a relative path (possibly empty, meaning the root) onto a root.
pub fn join(root: &Path, rel: &Path) -> std::path::PathBuf {
    if rel.as_os_str().is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// Lossy text for a path, for human and JSON output (names may be any bytes).
pub fn display_rel(rel: &Path) -> String {
    String::from_utf8_lossy(rel.as_os_str().as_bytes()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn xattrs_listed_through_a_directory_handle_are_those_of_the_path() -> io::Result<()> {
        let d = std::env::temp_dir().join(format!("txbox-xattrs-at-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        let f = d.join("f \n\u{e9}");
        std::fs::write(&f, "x")?;
        // More names than the first buffer holds, to take the growing path too.
        for i in 0..60 {
            let name = format!("user.{}{i}", "n".repeat(20));
            rustix::fs::lsetxattr(&f, name.as_str(), b"v", rustix::fs::XattrFlags::empty())?;
        }
        std::os::unix::fs::symlink("f", d.join("link"))?;
        let dir = std::fs::File::open(&d)?;
        for name in ["f \n\u{e9}", "link"] {
            let mut at = list_xattrs_at(dir.as_fd(), &d, OsStr::new(name))?;
            let mut by_path = list_xattrs(&d.join(name))?;
            at.sort();
            by_path.sort();
            assert_eq!(at, by_path, "{name}");
        }
        assert_eq!(list_xattrs_at(dir.as_fd(), &d, OsStr::new("f \n\u{e9}"))?.len(), 60);
        assert!(list_xattrs_at(dir.as_fd(), &d, OsStr::new("absent")).is_err());
        // One lister for many names: its buffers, grown by the first, give each its own answer.
        let mut lister = XattrLister::default();
        for name in ["f \n\u{e9}", "link", "f \n\u{e9}", "link"] {
            let mut at = lister.list_at(dir.as_fd(), &d, OsStr::new(name))?;
            let mut by_path = list_xattrs(&d.join(name))?;
            at.sort();
            by_path.sort();
            assert_eq!(at, by_path, "{name}");
        }
        assert!(lister.list_at(dir.as_fd(), &d, OsStr::new("absent")).is_err());
        assert!(lister.list_at(dir.as_fd(), &d, OsStr::new("a\0b")).is_err());
        std::fs::remove_dir_all(&d)
    }

    #[test]
    fn only_the_allowlist_is_committed() {
        let class = |n: &str| classify_xattr(OsStr::new(n));
        let dropped = |n: &str| XattrClass::Dropped { real: OsString::from(n) };
        for kept in ["user.mime", "user.", "user.overlayish", "system.posix_acl_access", "system.posix_acl_default"] {
            assert_eq!(class(kept), XattrClass::Committed, "{kept}");
        }
        for own in ["user.overlay.opaque", "user.overlay.origin", "user.overlay.uuid", "user.overlay."] {
            assert_eq!(class(own), XattrClass::Overlay, "{own}");
        }
        for never in [
            "security.capability",
            "security.selinux",
            "security.SMACK64",
            "security.SMACK64EXEC",
            "security.ima",
            "security.evm",
            "security.apparmor",
            "trusted.x",
            "trusted.overlay.opaque",
            "trusted.overlay.overlay.redirect",
            "system.nfs4_acl",
            "system.posix_acl_accessX",
            "btrfs.compression",
            "User.x",
            "",
        ] {
            assert_eq!(class(never), dropped(never), "{never}");
        }
        // The command's own `user.overlay.*` names, stored escaped, are dropped under the
        // name the command used, at any depth of escaping.
        assert_eq!(class("user.overlay.overlay.redirect"), dropped("user.overlay.redirect"));
        assert_eq!(class("user.overlay.overlay.overlay.x"), dropped("user.overlay.overlay.x"));
        assert!(!is_committed_name(OsStr::new("user.overlay.redirect")));
        assert!(is_committed_name(OsStr::new("user.note")));
    }
}
