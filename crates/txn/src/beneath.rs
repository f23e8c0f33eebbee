//! Directory handles resolved beneath a root without ever following a symlink.
//!
//! Every path a commit writes is opened with [`crate::fsx::open_beneath`] (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`) relative
//! to the root's fd, so an agent that swapped a directory for a symlink (to `/etc`, to `..`)
//! makes the commit fail instead of redirecting it.
//!
//! Handles are cached, but only a few: a commit touches its paths in sorted order, so siblings
//! follow each other and the last directories used are the ones asked for again. A cache that
//! kept one handle per directory ran a commit of one file in each of 300 directories out of
//! descriptors (`ulimit -n 1024`) after its commit point (#14.1); this one holds at most
//! [`CACHED`] whatever the number of directories.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// Directory handles a [`Beneath`] keeps open at most (besides its root).
pub const CACHED: usize = 4;

pub struct Beneath {
    root: OwnedFd,
    /// Most recently used first.
    cache: Vec<(PathBuf, OwnedFd)>,
}

impl Beneath {
    pub fn open(root: &Path) -> io::Result<Beneath> {
        let root = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Beneath { root, cache: Vec::with_capacity(CACHED) })
    }

    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// An O_PATH handle on the directory `rel` (empty = the root), cached.
    pub fn dir(&mut self, rel: &Path) -> io::Result<BorrowedFd<'_>> {
        if rel.as_os_str().is_empty() {
            return Ok(self.root.as_fd());
        }
        match self.cache.iter().position(|(p, _)| p == rel) {
            Some(0) => {}
            Some(i) => {
                let hit = self.cache.remove(i);
                self.cache.insert(0, hit);
            }
            None => {
                // Close the least recently used handle before opening another.
                if self.cache.len() >= CACHED {
                    self.cache.pop();
                }
                let fd =
                    crate::fsx::open_beneath(self.root.as_fd(), rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
                self.cache.insert(0, (rel.to_path_buf(), fd));
            }
        }
        match self.cache.first() {
            Some((_, fd)) => Ok(fd.as_fd()),
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
        self.cache.retain(|(k, _)| !k.starts_with(rel));
    }

    /// How many handles are open (the root included): never more than `CACHED + 1`.
    pub fn open_handles(&self) -> usize {
        1 + self.cache.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_stay_bounded_whatever_the_number_of_directories() -> io::Result<()> {
        let d = std::env::temp_dir().join(format!("txbox-beneath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for i in 0..50 {
            std::fs::create_dir_all(d.join(format!("d{i}/sub")))?;
        }
        let mut b = Beneath::open(&d)?;
        for i in 0..50 {
            b.parent(Path::new(&format!("d{i}/sub/f")))?;
            b.parent(Path::new(&format!("d{i}/f")))?;
            assert!(b.open_handles() <= CACHED + 1);
        }
        // The most recent is still cached and valid; a moved directory is forgotten.
        let fd = b.dir(Path::new("d49"))?;
        assert!(rustix::fs::fstat(fd).is_ok());
        b.forget(Path::new("d49"));
        assert!(b.cache.iter().all(|(p, _)| !p.starts_with("d49")));
        std::fs::remove_dir_all(&d)?;
        Ok(())
    }
}
