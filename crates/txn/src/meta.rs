//! File metadata as the transaction layer sees it: kinds, comparable attributes, and extended
//! attributes with overlayfs's own names told apart from the user's.

use std::ffi::{CStr, CString, OsStr, OsString};
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

/// The xattr prefixes under which overlayfs stores its own bookkeeping.
const OVERLAY_PREFIXES: [&[u8]; 2] = [b"user.overlay.", b"trusted.overlay."];

/// How one extended attribute found in an upper layer must be treated when committing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrClass {
    /// An ordinary attribute of the user's: commit as is.
    User,
    /// overlayfs's own (`user.overlay.opaque`, `.origin`, `.impure`, ...): never commit.
    Overlay,
    /// A user attribute whose name itself starts with an overlay prefix; overlayfs stores it
    /// escaped (`user.overlay.overlay.x` holds the user's `user.overlay.x`). Commit it unescaped.
    Escaped { real: OsString },
}

pub fn classify_xattr(name: &OsStr) -> XattrClass {
    let b = name.as_bytes();
    for prefix in OVERLAY_PREFIXES {
        if let Some(rest) = b.strip_prefix(prefix) {
            if let Some(inner) = rest.strip_prefix(b"overlay.") {
                let mut real = prefix.to_vec();
                real.extend_from_slice(inner);
                return XattrClass::Escaped { real: OsString::from_vec(real) };
            }
            return XattrClass::Overlay;
        }
    }
    XattrClass::User
}

/// List the names of the extended attributes of `path` (not following a final symlink).
pub fn list_xattrs(path: &Path) -> io::Result<Vec<OsString>> {
    list_names(|buf| rustix::fs::llistxattr(path, buf))
}

/// The same for `name` in the directory open as `dir` (whose path is `dir_path`), without
/// walking the whole path again: `listxattrat` (Linux 6.13), or `llistxattr` on the full path
/// on older kernels. Classifying a large new tree spent most of its time in path walks.
pub fn list_xattrs_at(dir: BorrowedFd<'_>, dir_path: &Path, name: &OsStr) -> io::Result<Vec<OsString>> {
    static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
    if !UNSUPPORTED.load(Ordering::Relaxed) {
        let cname = CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        match list_names(|buf| listxattrat(dir, &cname, buf)) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => UNSUPPORTED.store(true, Ordering::Relaxed),
            other => return other,
        }
    }
    list_xattrs(&dir_path.join(name))
}

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
fn list_names(mut list: impl FnMut(&mut [u8]) -> Result<usize, rustix::io::Errno>) -> io::Result<Vec<OsString>> {
    let mut buf = vec![0u8; 1024];
    loop {
        match list(&mut buf) {
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

/// The user-visible xattrs of an object in an upper layer: overlay's own dropped, escaped ones
/// unescaped. Sorted by name, so two sets compare with `==`.
pub fn user_xattrs_of_upper(path: &Path) -> io::Result<Vec<(OsString, Vec<u8>)>> {
    let mut out = Vec::new();
    for name in list_xattrs(path)? {
        match classify_xattr(&name) {
            XattrClass::User => out.push((name.clone(), get_xattr(path, &name)?)),
            XattrClass::Escaped { real } => out.push((real, get_xattr(path, &name)?)),
            XattrClass::Overlay => {}
        }
    }
    out.sort();
    Ok(out)
}

/// The xattrs of an object in the real workspace, sorted by name.
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
        std::fs::remove_dir_all(&d)
    }

    #[test]
    fn overlay_xattrs_are_told_apart() {
        assert_eq!(classify_xattr(OsStr::new("user.mime")), XattrClass::User);
        assert_eq!(classify_xattr(OsStr::new("user.overlay.opaque")), XattrClass::Overlay);
        assert_eq!(classify_xattr(OsStr::new("trusted.overlay.origin")), XattrClass::Overlay);
        assert_eq!(
            classify_xattr(OsStr::new("user.overlay.overlay.note")),
            XattrClass::Escaped { real: OsString::from("user.overlay.note") }
        );
        assert_eq!(classify_xattr(OsStr::new("security.selinux")), XattrClass::User);
    }
}
