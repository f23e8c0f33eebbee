//! What warm servers that are gone left beside their sockets: the socket, its `.lock`, `.busy`
//! and `.failed` files and the premount's `.next` directories. A server removes its own when it
//! leaves, but one that was killed does not, and every build of txbox names its servers anew
//! (`warm::socket_name` hashes the binary), so without this they pile up in `STATE/warm`.
//! `txbox gc` calls [`remove`].
//!
//! A server holds its `.lock` for its whole life, from before it makes anything else: a family
//! whose `.lock` can be locked has no server. Families modified in the last [`QUIET`] are left
//! (a server may be starting: it makes its `.lock`; a `.failed` still holds clients back for
//! that long).
//!
//! May not remove anything in the warm directory but such families.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags};

/// How long a family must have been left alone before it is removed.
pub const QUIET: Duration = Duration::from_secs(600);

/// What stands beside a socket, by suffix.
const BESIDE: [&str; 4] = [".lock", ".busy", ".failed", ".next"];

/// Remove the families of servers that are gone from the warm directory `warm`; returns how
/// many were removed.
pub fn remove(warm: &Path) -> usize {
    remove_at(warm, SystemTime::now())
}

/// [`remove`], with `now` as the time to measure quiet from.
fn remove_at(warm: &Path, now: SystemTime) -> usize {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Ok(dir) = rustix::fs::open(warm, flags, Mode::empty()) else { return 0 };
    let Some(names) = super::gc::entries(&dir) else { return 0 };
    sockets(&names).into_iter().filter(|base| remove_family(&dir, base, &names, now)).count()
}

/// The sockets the names belong to (`KEY.sock`, `KEY-1.sock`, …), from the names themselves
/// and from what stands beside them.
fn sockets(names: &[OsString]) -> BTreeSet<OsString> {
    names
        .iter()
        .filter_map(|n| {
            let b = n.as_bytes();
            let base = BESIDE.iter().find_map(|s| b.strip_suffix(s.as_bytes())).unwrap_or(b);
            base.ends_with(b".sock").then(|| OsStr::from_bytes(base).to_os_string())
        })
        .collect()
}

fn with(base: &OsStr, suffix: &str) -> OsString {
    let mut n = base.to_os_string();
    n.push(suffix);
    n
}

/// Remove the family of socket `base` if no server holds it and it has been quiet; its `.lock`
/// goes last, while this process holds it.
fn remove_family(dir: &OwnedFd, base: &OsStr, names: &[OsString], now: SystemTime) -> bool {
    let family: Vec<OsString> =
        std::iter::once(base.to_os_string()).chain(BESIDE.iter().map(|s| with(base, s))).collect();
    let present: Vec<&OsString> = family.iter().filter(|n| names.contains(n)).collect();
    let recent = present.iter().any(|n| {
        rustix::fs::statat(dir, n.as_os_str(), AtFlags::SYMLINK_NOFOLLOW).map_or(true, |st| {
            let changed = SystemTime::UNIX_EPOCH + Duration::from_secs(st.st_mtime.max(0) as u64);
            now.duration_since(changed).map_or(true, |age| age < QUIET)
        })
    });
    if recent {
        return false;
    }
    let lock_name = with(base, ".lock");
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let lock = match rustix::fs::openat(dir, lock_name.as_os_str(), flags, Mode::empty()) {
        Ok(fd) => match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Some(fd),
            Err(_) => return false, // a server holds it
        },
        Err(rustix::io::Errno::NOENT) => None,
        Err(_) => return false,
    };
    for name in present.iter().filter(|n| ***n != lock_name) {
        if !super::gc::remove(dir, name, &mut || false) {
            return false;
        }
    }
    let removed = lock.is_none() || rustix::fs::unlinkat(dir, lock_name.as_os_str(), AtFlags::empty()).is_ok();
    drop(lock);
    removed
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn families_are_grouped_by_their_socket() {
        let names: Vec<OsString> = ["a.sock", "a.sock.lock", "a-1.sock.busy", "b.sock.next", "README", "x.lock"]
            .iter()
            .map(OsString::from)
            .collect();
        let got: Vec<OsString> = sockets(&names).into_iter().collect();
        assert_eq!(got, ["a-1.sock", "a.sock", "b.sock"].map(OsString::from));
    }

    /// A server's family (its `.lock` held) stays, however old; a gone server's goes whole,
    /// `.next` directories included; one touched within `QUIET` stays; nothing else is touched.
    #[test]
    fn only_what_gone_servers_left_is_removed() {
        let warm = std::env::temp_dir().join(format!("txbox-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&warm);
        std::fs::create_dir_all(warm.join("gone.sock.next/work/work")).unwrap();
        std::fs::create_dir_all(warm.join("gone.sock.next/upper")).unwrap();
        std::fs::create_dir_all(warm.join("live.sock.next/upper")).unwrap();
        for f in [
            "gone.sock.lock",
            "gone.sock.busy",
            "gone.sock.failed",
            "live.sock.lock",
            "live.sock.busy",
            "orphan-1.sock.busy",
            "README",
        ] {
            std::fs::write(warm.join(f), "").unwrap();
        }
        drop(std::os::unix::net::UnixListener::bind(warm.join("gone.sock")).unwrap());
        let _live = std::os::unix::net::UnixListener::bind(warm.join("live.sock")).unwrap();
        let held = std::fs::File::options().write(true).open(warm.join("live.sock.lock")).unwrap();
        rustix::fs::flock(&held, FlockOperation::LockExclusive).unwrap();

        // Just made: nothing has been quiet for QUIET, nothing goes.
        assert_eq!(remove_at(&warm, SystemTime::now()), 0);
        assert_eq!(std::fs::read_dir(&warm).unwrap().count(), 11);

        let later = SystemTime::now() + QUIET + Duration::from_secs(1);
        assert_eq!(remove_at(&warm, later), 2, "the gone server's family and the orphaned busy file");
        let mut left: Vec<String> =
            std::fs::read_dir(&warm).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["README", "live.sock", "live.sock.busy", "live.sock.lock", "live.sock.next"]);
        // Once its server is gone, the live one's goes too.
        drop(held);
        assert_eq!(remove_at(&warm, later), 1);
        assert_eq!(std::fs::read_dir(&warm).unwrap().count(), 1);
        std::fs::remove_dir_all(&warm).unwrap();
    }
}
