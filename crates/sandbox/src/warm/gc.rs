//! Deleting retired transaction directories while the server is idle.
//!
//! A run served warm only renames its directory aside (one `rename`, into the directory the
//! server was told about at start); deleting it, which on a filesystem mounted with `discard`
//! costs ~0.1 ms per freed block, happens here, off every caller's path. The server stops as
//! soon as a client waits: what is left is deleted at the next idle moment, or by the state
//! directory's own collector (`txbox_txn::StateDir::collect_retired`) when too many wait.
//!
//! May not delete outside the retired directory the server was told about.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, Mode, OFlags};

/// Delete everything in `retired` (a directory fd: it holds retired directories only),
/// stopping early when `stop` says so. Returns whether everything retired is gone. Never
/// follows a symlink. A directory whose `work` is locked is left: another warm server (a
/// second slot, another configuration on the same state directory) still holds a view of it,
/// as `txbox_txn::StateDir::collect_retired` leaves it too.
pub fn collect(retired: &OwnedFd, stop: &mut dyn FnMut() -> bool) -> bool {
    let Some(names) = entries(retired) else { return false };
    let mut all = true;
    for name in names {
        if in_use(retired, &name) {
            all = false;
            continue;
        }
        if !remove(retired, &name, stop) {
            return false;
        }
    }
    all
}

/// Whether `name/work` is locked (a server's view of it lives on). Opened without following
/// a symlink at either step.
fn in_use(parent: &OwnedFd, name: &OsStr) -> bool {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Ok(dir) = rustix::fs::openat(parent, name, flags, Mode::empty()) else { return false };
    let Ok(work) = rustix::fs::openat(&dir, "work", flags, Mode::empty()) else { return false };
    matches!(
        rustix::fs::flock(&work, rustix::fs::FlockOperation::NonBlockingLockExclusive),
        Err(rustix::io::Errno::WOULDBLOCK)
    )
}

pub(super) fn entries(dir: &OwnedFd) -> Option<Vec<OsString>> {
    let fd = rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut d = rustix::fs::Dir::read_from(&fd).ok()?;
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let e = e.ok()?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_os_string());
        }
    }
    Some(out)
}

/// Remove `name` in `parent` and everything below it; false if stopped or something stayed.
pub(super) fn remove(parent: &OwnedFd, name: &OsStr, stop: &mut dyn FnMut() -> bool) -> bool {
    if stop() {
        return false;
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut opened = rustix::fs::openat(parent, name, flags, Mode::empty());
    if matches!(opened, Err(rustix::io::Errno::ACCESS)) {
        // A directory the command left without owner permissions (a symlink would have given
        // ELOOP): give them back so its entries can go.
        let _ = rustix::fs::chmodat(parent, name, Mode::from_raw_mode(0o700), AtFlags::empty());
        opened = rustix::fs::openat(parent, name, flags, Mode::empty());
    }
    match opened {
        Ok(dir) => {
            let Some(children) = entries(&dir) else { return false };
            for c in children {
                if !remove(&dir, &c, stop) {
                    return false;
                }
            }
            rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR).is_ok()
        }
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            rustix::fs::unlinkat(parent, name, AtFlags::empty()).is_ok()
        }
        Err(rustix::io::Errno::NOENT) => true,
        Err(_) => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("txbox-gc-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn open(p: &std::path::Path) -> OwnedFd {
        rustix::fs::open(p, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap()
    }

    #[test]
    fn retired_trees_go_and_nothing_outside() {
        let tx = scratch("retired");
        let gone = tx.join("0123");
        std::fs::create_dir_all(gone.join("upper/a/b")).unwrap();
        std::fs::write(gone.join("upper/a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", gone.join("upper/link-to-etc")).unwrap();
        std::fs::create_dir(gone.join("upper/locked")).unwrap();
        std::fs::write(gone.join("upper/locked/f"), "x").unwrap();
        std::fs::set_permissions(gone.join("upper/locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
        assert!(collect(&open(&tx), &mut || false));
        assert!(!gone.exists());
        assert!(std::path::Path::new("/etc/hostname").exists() || std::path::Path::new("/etc").is_dir());
        std::fs::remove_dir_all(&tx).unwrap();
    }

    #[test]
    fn a_directory_another_server_still_holds_is_left() {
        let tx = scratch("held");
        std::fs::create_dir_all(tx.join("held/work/work")).unwrap();
        std::fs::create_dir_all(tx.join("free/work")).unwrap();
        let work = std::fs::File::open(tx.join("held/work")).unwrap();
        // Shared, as a server holds the work directory of a view it keeps.
        rustix::fs::flock(&work, rustix::fs::FlockOperation::LockShared).unwrap();
        assert!(!collect(&open(&tx), &mut || false), "not everything is gone");
        assert!(tx.join("held/work/work").is_dir());
        assert!(!tx.join("free").exists());
        drop(work);
        assert!(collect(&open(&tx), &mut || false));
        assert_eq!(std::fs::read_dir(&tx).unwrap().count(), 0);
        std::fs::remove_dir_all(&tx).unwrap();
    }

    #[test]
    fn collecting_stops_when_asked_and_resumes_later() {
        let tx = scratch("stop");
        for i in 0..3 {
            std::fs::create_dir_all(tx.join(format!("{i}/upper"))).unwrap();
        }
        let mut budget = 2;
        assert!(!collect(&open(&tx), &mut || {
            budget -= 1;
            budget < 0
        }));
        assert!(collect(&open(&tx), &mut || false));
        assert_eq!(std::fs::read_dir(&tx).unwrap().count(), 0);
        std::fs::remove_dir_all(&tx).unwrap();
    }
}
