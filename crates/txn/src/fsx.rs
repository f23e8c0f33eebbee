//! Filesystem helpers every module of the crate shares: the one error type for "this call on
//! this path failed", opening beneath a directory without following symlinks, small files
//! read and replaced through directory handles, and deleting a tree without ever following a
//! symlink or holding more than two descriptors.
//!
//! Owns no names and no policy: callers say which directory and which entry. Depends on nothing
//! else in the crate.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, RenameFlags, ResolveFlags};

/// A filesystem call that failed on a path: what was being done, where, and the OS's answer
/// (part of the message, so it is not also given as the error's source).
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {error}", path.display())]
pub struct PathError {
    pub path: PathBuf,
    pub what: &'static str,
    pub error: io::Error,
}

impl PathError {
    pub fn new(path: &Path, what: &'static str, error: io::Error) -> PathError {
        PathError { path: path.to_path_buf(), what, error }
    }

    pub fn kind(&self) -> io::ErrorKind {
        self.error.kind()
    }
}

/// `map_err(at(path, "read meta"))`: attach the path and the step to an I/O error.
pub fn at<'a, E: Into<io::Error>>(path: &'a Path, what: &'static str) -> impl FnOnce(E) -> PathError + 'a {
    move |e| PathError::new(path, what, e.into())
}

/// Resolution that stays beneath the starting directory and follows no symlink at all.
pub const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Open `rel` beneath `dir` without following any symlink (`openat2`; retries the EAGAIN a
/// concurrent rename can cause).
pub fn open_beneath(dir: BorrowedFd<'_>, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let rel: &Path = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    loop {
        match rustix::fs::openat2(dir, rel, flags | OFlags::CLOEXEC | OFlags::NOFOLLOW, mode, BENEATH) {
            Err(rustix::io::Errno::AGAIN) => continue,
            r => return r.map_err(Into::into),
        }
    }
}

/// A directory handle on `rel` beneath `dir` (O_PATH: for *at calls, not for listing).
pub fn dir_beneath(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    open_beneath(dir, rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
}

/// The names in a directory (without `.` and `..`).
pub fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let fd = rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let mut d = rustix::fs::Dir::read_from(&fd)?;
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_os_string());
        }
    }
    Ok(out)
}

/// Read a small regular file `rel` beneath `dir`: never through a symlink, never a FIFO or a
/// device (which could block or lie), at most `limit` bytes (more is an error, not a cut).
pub fn read_small(dir: BorrowedFd<'_>, rel: &Path, limit: usize) -> io::Result<Vec<u8>> {
    let fd = open_beneath(dir, rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
    let st = rustix::fs::fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
    }
    if st.st_size < 0 || st.st_size as u64 > limit as u64 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("larger than {limit} bytes")));
    }
    let mut buf = vec![0u8; st.st_size as usize + 1];
    let mut n = 0;
    loop {
        match rustix::io::read(&fd, &mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                if n == buf.len() {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "grew while read"));
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(n);
    Ok(buf)
}

/// Replace the file `name` in directory `dir` with `bytes`: written to a temporary name,
/// then renamed over it, so a reader sees the old content or the new, never a mix. With
/// `durable`, the file is synced before the rename and the directory after it.
pub fn replace(dir: BorrowedFd<'_>, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    // A temporary name of this writer's own: two processes replacing the same file (two
    // first uses of a state directory) must not write into one temporary file.
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = format!("{name}.{}-{n}.tmp", std::process::id());
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, tmp.as_str(), flags, Mode::from_raw_mode(0o600))?;
    write_all(&fd, bytes)?;
    if durable {
        rustix::fs::fsync(&fd)?;
    }
    drop(fd);
    rustix::fs::renameat(dir, tmp.as_str(), dir, name)?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Overwrite the file `name` in `dir` in place (created if missing), no temporary file: for
/// files that are rewritten on every transaction, where a rename would free and allocate a
/// block each time. Readers must tell a torn file from a whole one (a MAC does).
pub fn overwrite(dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> io::Result<()> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?;
    write_all(&fd, bytes)?;
    rustix::fs::ftruncate(&fd, bytes.len() as u64)?;
    Ok(())
}

pub fn write_all(fd: &OwnedFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// fsync a directory given by any handle (O_PATH handles cannot be synced: reopen).
pub fn sync_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    let fd = rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    Ok(rustix::fs::fsync(&fd)?)
}

/// Rename `from` in `from_dir` to `to` in `to_dir`, refusing to replace anything there.
pub fn rename_noreplace(from_dir: BorrowedFd<'_>, from: &OsStr, to_dir: BorrowedFd<'_>, to: &OsStr) -> io::Result<()> {
    Ok(rustix::fs::renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE)?)
}

/// Wait until no one holds a `flock` on the directory `dir` (take an exclusive lock, drop it).
/// A warm server share-locks the work directory of the overlay it has mounted until it has
/// detached it: this waits until the layers are no overlay's any more.
pub fn wait_unlocked(dir: &Path) -> io::Result<()> {
    let fd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    Ok(rustix::fs::flock(&fd, FlockOperation::LockExclusive)?)
}

/// Whether someone holds a `flock` on `rel` beneath `dir` right now (a missing entry is free).
pub fn is_locked(dir: BorrowedFd<'_>, rel: &Path) -> bool {
    let Ok(fd) = open_beneath(dir, rel, OFlags::RDONLY, Mode::empty()) else { return false };
    matches!(rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive), Err(rustix::io::Errno::WOULDBLOCK))
}

/// Remove the tree at `path`, tolerating its absence; see [`remove_tree_at`]. The last
/// component is not followed: a symlink there is removed itself.
pub fn remove_tree(path: &Path) -> Result<(), PathError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(PathError::new(path, "remove", io::ErrorKind::InvalidInput.into()));
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    let dir = match rustix::fs::open(parent, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(d) => d,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(PathError::new(path, "remove", e.into())),
    };
    remove_tree_at(dir.as_fd(), name).map_err(at(path, "remove"))
}

/// Remove the entry `name` of `parent` and, if it is a directory, everything below it.
///
/// Never follows a symlink (each directory is opened `O_NOFOLLOW`, and a symlink is unlinked
/// like a file), so a tree a command built cannot redirect the deletion. Iterative, with at
/// most two descriptors open whatever the depth (the way back up is `..`, checked by inode
/// against the way down): a command's 100,000-deep directory neither overflows the stack nor
/// runs out of descriptors. Directories left without owner permissions are given them back.
/// Entries that vanish meanwhile are fine: another collector deleting the same tree finishes it.
pub fn remove_tree_at(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let top = match open_dir_for_removal(parent, name) {
        Ok(Some(fd)) => fd,
        Ok(None) => return Ok(()),
        Err(e) => return Err(e),
    };
    /// One level on the way down: the directory's name in its parent, its inode, the parent's
    /// inode (to check `..` on the way back), and the entries not looked at yet.
    struct Level {
        name: OsString,
        parent_ino: u64,
        rest: Vec<OsString>,
    }
    let mut cur = top;
    let mut stack: Vec<Level> = Vec::new();
    let mut rest = list(cur.as_fd())?;
    loop {
        let mut descended = false;
        while let Some(entry) = rest.pop() {
            match unlink_entry(cur.as_fd(), &entry)? {
                Unlinked::Done => {}
                Unlinked::Dir(child) => {
                    let parent_ino = rustix::fs::fstat(&cur)?.st_ino;
                    let child_rest = list(child.as_fd())?;
                    stack.push(Level { name: entry, parent_ino, rest: std::mem::replace(&mut rest, child_rest) });
                    cur = child;
                    descended = true;
                    break;
                }
            }
        }
        if descended {
            continue;
        }
        // `cur` is empty now.
        let Some(level) = stack.pop() else { break };
        let up =
            match rustix::fs::openat(&cur, "..", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) {
                Ok(up) => up,
                // `cur` was removed under us: another collector is deleting this tree.
                Err(rustix::io::Errno::NOENT) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
        if rustix::fs::fstat(&up)?.st_ino != level.parent_ino {
            return Err(io::Error::other("a directory was moved during its removal"));
        }
        remove_empty_dir(up.as_fd(), &level.name)?;
        cur = up;
        rest = level.rest;
    }
    drop(cur);
    remove_empty_dir(parent, name)
}

enum Unlinked {
    Done,
    Dir(OwnedFd),
}

/// Unlink a non-directory, or open a directory to descend into it.
fn unlink_entry(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Unlinked> {
    for attempt in 0..2 {
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => return Ok(Unlinked::Done),
            Err(rustix::io::Errno::ISDIR) => {
                return match open_dir_for_removal(dir, name)? {
                    Some(fd) => Ok(Unlinked::Dir(fd)),
                    None => Ok(Unlinked::Done),
                }
            }
            Err(rustix::io::Errno::ACCESS | rustix::io::Errno::PERM) if attempt == 0 => writable(dir)?,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::ErrorKind::PermissionDenied.into())
}

fn remove_empty_dir(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    for attempt in 0..2 {
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(rustix::io::Errno::ACCESS | rustix::io::Errno::PERM) if attempt == 0 => writable(parent)?,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::ErrorKind::PermissionDenied.into())
}

/// Open `name` in `dir` as a directory to empty it (None: it is gone, or was not a directory
/// and has been unlinked). Without owner permissions, they are given back first.
fn open_dir_for_removal(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<OwnedFd>> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for attempt in 0..2 {
        match rustix::fs::openat(dir, name, flags, Mode::empty()) {
            Ok(fd) => return Ok(Some(fd)),
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            // A symlink (ELOOP with O_NOFOLLOW) or a file: unlinked, never followed.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                return match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
            Err(rustix::io::Errno::ACCESS) if attempt == 0 => {
                // chmod follows symlinks, but `name` is no symlink: that would have been ELOOP.
                rustix::fs::chmodat(dir, name, Mode::from_raw_mode(0o700), AtFlags::empty())?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::ErrorKind::PermissionDenied.into())
}

/// Give a directory back its owner's permissions so entries can be removed from it.
fn writable(dir: BorrowedFd<'_>) -> io::Result<()> {
    let fd = rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    Ok(rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> Result<PathBuf, PathError> {
        let d = std::env::temp_dir().join(format!("txbox-fsx-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).map_err(at(&d, "mkdir"))?;
        Ok(d)
    }

    #[test]
    fn removal_never_follows_symlinks_and_survives_locked_and_deep_trees() -> Result<(), PathError> {
        let d = scratch("remove")?;
        let decoy = d.join("decoy");
        std::fs::create_dir_all(decoy.join("keep")).map_err(at(&decoy, "mkdir"))?;
        std::fs::write(decoy.join("keep/f"), "x").map_err(at(&decoy, "write"))?;
        let t = d.join("tree");
        std::fs::create_dir_all(t.join("a/b")).map_err(at(&t, "mkdir"))?;
        std::fs::write(t.join("a/b/f"), "x").map_err(at(&t, "write"))?;
        std::os::unix::fs::symlink(&decoy, t.join("a/to-decoy")).map_err(at(&t, "symlink"))?;
        std::os::unix::fs::symlink(decoy.join("keep"), t.join("to-keep")).map_err(at(&t, "symlink"))?;
        std::fs::create_dir(t.join("locked")).map_err(at(&t, "mkdir"))?;
        std::fs::write(t.join("locked/f"), "x").map_err(at(&t, "write"))?;
        std::fs::set_permissions(t.join("locked"), std::fs::Permissions::from_mode(0o000)).map_err(at(&t, "chmod"))?;
        std::fs::set_permissions(t.join("a"), std::fs::Permissions::from_mode(0o500)).map_err(at(&t, "chmod"))?;
        // Deeper than any sane stack of recursive calls or descriptors would allow.
        let mut deep = t.join("deep");
        std::fs::create_dir(&deep).map_err(at(&deep, "mkdir"))?;
        let fd = rustix::fs::open(&deep, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).map_err(at(&deep, "open"))?;
        let mut cur = fd;
        for _ in 0..3000 {
            rustix::fs::mkdirat(&cur, "d", Mode::from_raw_mode(0o700)).map_err(at(&deep, "mkdirat"))?;
            cur = rustix::fs::openat(&cur, "d", OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
                .map_err(at(&deep, "openat"))?;
        }
        drop(cur);
        deep.push("d");
        remove_tree(&t)?;
        assert!(!t.exists());
        assert_eq!(std::fs::read_to_string(decoy.join("keep/f")).map_err(at(&decoy, "read"))?, "x");
        // A symlink itself at the top is removed, not what it points to.
        std::os::unix::fs::symlink(&decoy, d.join("link")).map_err(at(&d, "symlink"))?;
        remove_tree(&d.join("link"))?;
        assert!(decoy.join("keep/f").exists() && !d.join("link").exists());
        remove_tree(&d.join("absent"))?;
        std::fs::remove_dir_all(&d).map_err(at(&d, "cleanup"))
    }

    #[test]
    fn small_files_are_read_only_as_regular_files_beneath() -> Result<(), PathError> {
        let d = scratch("read")?;
        let fd = rustix::fs::open(&d, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).map_err(at(&d, "open"))?;
        replace(fd.as_fd(), "f", b"hello", true).map_err(at(&d, "replace"))?;
        assert_eq!(read_small(fd.as_fd(), Path::new("f"), 5).map_err(at(&d, "read"))?, b"hello");
        assert!(read_small(fd.as_fd(), Path::new("f"), 4).is_err(), "a limit is a refusal, not a cut");
        std::os::unix::fs::symlink(d.join("f"), d.join("l")).map_err(at(&d, "symlink"))?;
        assert!(read_small(fd.as_fd(), Path::new("l"), 64).is_err(), "followed a symlink");
        rustix::fs::mknodat(&fd, "fifo", rustix::fs::FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            .map_err(at(&d, "mkfifo"))?;
        assert!(read_small(fd.as_fd(), Path::new("fifo"), 64).is_err(), "read a FIFO");
        assert!(read_small(fd.as_fd(), Path::new("../etc/hostname"), 64).is_err(), "left the directory");
        overwrite(fd.as_fd(), "f", b"hi").map_err(at(&d, "overwrite"))?;
        assert_eq!(read_small(fd.as_fd(), Path::new("f"), 64).map_err(at(&d, "read"))?, b"hi");
        std::fs::remove_dir_all(&d).map_err(at(&d, "cleanup"))
    }
}
