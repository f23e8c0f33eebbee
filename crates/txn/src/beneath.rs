//! Directory handles resolved beneath a root without ever following a symlink.
//!
//! Every path a commit writes is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` relative to the root's fd, so an agent that swapped a directory for a
//! symlink (to `/etc`, to `..`) makes the commit fail instead of redirecting it.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

pub struct Beneath {
    root: OwnedFd,
    cache: HashMap<PathBuf, OwnedFd>,
}

/// Open `rel` beneath `dirfd` with the safe resolution flags (retrying the EAGAIN that
/// RESOLVE_BENEATH returns when a concurrent rename raced the lookup).
pub fn open_beneath(dirfd: BorrowedFd<'_>, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    let rel: &Path = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    loop {
        match rustix::fs::openat2(dirfd, rel, flags | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty(), RESOLVE) {
            Err(rustix::io::Errno::AGAIN) => continue,
            r => return r.map_err(Into::into),
        }
    }
}

impl Beneath {
    pub fn open(root: &Path) -> io::Result<Beneath> {
        let root = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Beneath { root, cache: HashMap::new() })
    }

    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// An O_PATH handle on the directory `rel` (empty = the root), cached.
    pub fn dir(&mut self, rel: &Path) -> io::Result<BorrowedFd<'_>> {
        if !self.cache.contains_key(rel) {
            let fd = open_beneath(self.root.as_fd(), rel, OFlags::PATH | OFlags::DIRECTORY)?;
            self.cache.insert(rel.to_path_buf(), fd);
        }
        match self.cache.get(rel) {
            Some(fd) => Ok(fd.as_fd()),
            None => Err(io::Error::other("directory handle cache lost an entry")),
        }
    }

    /// The parent directory handle and final name of `rel`.
    pub fn parent<'a>(&mut self, rel: &'a Path) -> io::Result<(BorrowedFd<'_>, &'a std::ffi::OsStr)> {
        let name = rel.file_name().ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        Ok((self.dir(parent)?, name))
    }

    /// Forget cached handles at or below `rel`: that directory was just moved.
    pub fn forget(&mut self, rel: &Path) {
        self.cache.retain(|k, _| !k.starts_with(rel));
    }
}
