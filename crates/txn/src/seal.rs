//! Authenticating what txbox reads back from its state directory.
//!
//! A per-user secret [`Key`] (32 random bytes, `BASE/key`, see [`crate::layout::base_dir`])
//! keys an HMAC-SHA256 over every file that names a path or decides what happens to one: the
//! state directory's marker, `meta`, `status`, `fingerprints`, commit records. A [`Seal`] is
//! the key bound to one state directory's identity (its inode and birth time), and every MAC
//! also binds the kind of file and the transaction id, so a file copied from another state
//! directory, another transaction or another kind of file does not verify.
//!
//! Owns: the key file's creation and the checks of its owner, mode and type; the MAC. May not
//! touch: anything else in the base directory or a state directory.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use sha2::{Digest, Sha256};

use crate::fsx::{self, PathError};
use crate::hex::{hex, unhex};
use crate::layout;

/// Why the key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "neither XDG_STATE_HOME nor HOME is set: txbox keeps its per-user key in \
         ${{XDG_STATE_HOME:-$HOME/.local/state}}/txbox; set one of them"
    )]
    NoHome,
    #[error("{path} {why}: txbox keeps its secret key there and will not use it ({fix})")]
    Unsafe { path: PathBuf, why: String, fix: &'static str },
    #[error(transparent)]
    Io(#[from] PathError),
}

/// The per-user secret that authenticates on-disk state.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(…)")
    }
}

impl Key {
    /// A key with these bytes (tests; a real key comes from [`Key::load_or_create`]).
    pub fn from_bytes(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    /// The key in the base directory `base`, created (with `base` itself) on first use.
    ///
    /// `base` must be a directory, not a symlink, owned by this user and closed to everyone
    /// else (0700); the key a regular file with one link, owned by this user, mode 0600.
    /// Anything else is refused: a key someone else could have read or planted authenticates
    /// nothing.
    pub fn load_or_create(base: &Path) -> Result<Key, KeyError> {
        let dir = layout::private_dir(base, true)?;
        match read_key(dir.as_fd(), base) {
            Ok(k) => return Ok(k),
            Err(KeyError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        create_key(dir.as_fd(), base)?;
        read_key(dir.as_fd(), base)
    }
}

fn key_path(base: &Path) -> PathBuf {
    base.join(layout::KEY)
}

fn read_key(dir: BorrowedFd<'_>, base: &Path) -> Result<Key, KeyError> {
    let path = key_path(base);
    let fd = fsx::open_beneath(dir, Path::new(layout::KEY), OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()).map_err(
        |e| match e.raw_os_error() {
            Some(libc::ELOOP) => KeyError::Unsafe {
                path: path.clone(),
                why: "is a symlink".into(),
                fix: "remove it; txbox makes a new key",
            },
            _ => KeyError::Io(PathError::new(&path, "open key", e)),
        },
    )?;
    let st = rustix::fs::fstat(&fd).map_err(fsx::at(&path, "stat key"))?;
    let unsafe_key =
        |why: String| KeyError::Unsafe { path: path.clone(), why, fix: "remove it; txbox makes a new key" };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(unsafe_key("is not a regular file".into()));
    }
    if st.st_uid != rustix::process::geteuid().as_raw() {
        return Err(unsafe_key(format!("belongs to uid {}", st.st_uid)));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(unsafe_key(format!("has mode {:o} (others may have read it)", st.st_mode & 0o7777)));
    }
    if st.st_nlink != 1 {
        return Err(unsafe_key(format!("has {} hard links", st.st_nlink)));
    }
    let mut buf = [0u8; 33];
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::read(&fd, &mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(PathError::new(&path, "read key", e.into()).into()),
        }
    }
    if n != 32 {
        return Err(unsafe_key(format!("holds {n} bytes, not 32")));
    }
    let mut k = [0u8; 32];
    k.copy_from_slice(&buf[..32]);
    Ok(Key(k))
}

/// Make a new key: written whole under a temporary name, then linked into place, so a
/// concurrent first use never reads half a key and exactly one key wins.
fn create_key(dir: BorrowedFd<'_>, base: &Path) -> Result<(), KeyError> {
    let path = key_path(base);
    let mut k = [0u8; 32];
    random(&mut k);
    let mut suffix = [0u8; 8];
    random(&mut suffix);
    let tmp = format!("{}.{}.tmp", layout::KEY, hex(&suffix));
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, tmp.as_str(), flags, Mode::from_raw_mode(0o600))
        .map_err(fsx::at(&path, "create key"))?;
    let written = fsx::write_all(&fd, &k).and_then(|()| rustix::fs::fsync(&fd).map_err(Into::into));
    drop(fd);
    let linked = written.and_then(|()| {
        match rustix::fs::linkat(dir, tmp.as_str(), dir, layout::KEY, rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
            Err(e) => Err(e.into()),
        }
    });
    let _ = rustix::fs::unlinkat(dir, tmp.as_str(), rustix::fs::AtFlags::empty());
    linked.map_err(|e| PathError::new(&path, "create key", e))?;
    fsx::sync_dir(dir).map_err(fsx::at(base, "sync"))?;
    Ok(())
}

/// Fill `buf` from the kernel's random pool (`getrandom`, which blocks only until the pool is
/// first initialised at boot).
pub fn random(buf: &mut [u8]) {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            // getrandom cannot fail on Linux >= 3.17 with these flags; should it, /dev/urandom
            // is the same pool.
            Err(_) => {
                if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
                    if io::Read::read_exact(&mut f, &mut buf[filled..]).is_ok() {
                        return;
                    }
                }
                // Nothing random is left to be had: refuse to go on with predictable bytes.
                std::process::abort();
            }
        }
    }
}

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts`.
pub fn hmac(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for (i, b) in key.iter().enumerate() {
        ipad[i] ^= b;
        opad[i] ^= b;
    }
    let mut inner = Sha256::new();
    inner.update(ipad);
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(opad);
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// What a MAC is over: each kind of file has its own, so one cannot stand in for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    Marker,
    Meta,
    Status,
    Fingerprints,
    Record,
    Registry,
    Hold,
    AuditHead,
    AllowHosts,
}

impl Domain {
    fn tag(self) -> &'static [u8] {
        match self {
            Domain::Marker => b"txbox marker v1",
            Domain::Meta => b"txbox meta v1",
            Domain::Status => b"txbox status v1",
            Domain::Fingerprints => b"txbox fingerprints v1",
            Domain::Record => b"txbox commit record v2",
            Domain::Registry => b"txbox registry v1",
            Domain::Hold => b"txbox hold v1",
            Domain::AuditHead => b"txbox audit head v1",
            Domain::AllowHosts => b"txbox allow-hosts v1",
        }
    }
}

/// The key bound to one state directory.
#[derive(Clone, Debug)]
pub struct Seal {
    key: Key,
    /// The state directory's identity (see `StateDir::open`); all zeros for the key alone.
    state: [u8; 32],
}

impl Seal {
    pub fn new(key: Key, state_identity: &[u8]) -> Seal {
        Seal { key, state: Sha256::digest(state_identity).into() }
    }

    /// The key alone, bound to no state directory (what the base directory's own files use).
    pub fn unbound(key: Key) -> Seal {
        Seal { key, state: [0; 32] }
    }

    /// The MAC of `body`, a file of kind `domain` belonging to `id` (a transaction id, or
    /// empty for files of the state directory itself).
    pub fn mac(&self, domain: Domain, id: &str, body: &[u8]) -> [u8; 32] {
        let len = (body.len() as u64).to_le_bytes();
        hmac(&self.key.0, &[domain.tag(), &[0], &self.state, id.as_bytes(), &[0], &len, body])
    }

    /// Whether `mac_hex` is the MAC of `body` (compared in constant time).
    pub fn verify(&self, domain: Domain, id: &str, body: &[u8], mac_hex: &str) -> bool {
        let Some(given) = unhex(mac_hex) else { return false };
        let want = self.mac(domain, id, body);
        given.len() == want.len() && given.iter().zip(want.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// `body` with its MAC as a last line: the format of every sealed text file.
    pub fn seal(&self, domain: Domain, id: &str, body: &str) -> String {
        format!("{body}mac {}\n", hex(&self.mac(domain, id, body.as_bytes())))
    }

    /// The body of a sealed text file, if its MAC verifies; None for a forged, damaged,
    /// truncated or foreign one.
    pub fn open<'a>(&self, domain: Domain, id: &str, text: &'a [u8]) -> Option<&'a str> {
        let text = std::str::from_utf8(text).ok()?;
        let stripped = text.strip_suffix('\n')?;
        let cut = stripped.rfind('\n').map_or(0, |i| i + 1);
        let (body, last) = text.split_at(cut);
        let mac = last.strip_prefix("mac ")?.strip_suffix('\n')?;
        self.verify(domain, id, body.as_bytes(), mac).then_some(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc4231() {
        // RFC 4231 test case 2 uses a 4-byte key; HMAC pads keys with zeros to the block size,
        // which is what a 32-byte key with trailing zeros is.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex(&hmac(&key, &[b"what do ya want ", b"for nothing?"])),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_seal_opens_only_what_it_sealed_for_the_same_file_and_state() {
        let a = Seal::new(Key::from_bytes([7; 32]), b"state a");
        let text = a.seal(Domain::Meta, "0123456789abcdef", "workspace 2f77\nkind run\n");
        assert_eq!(a.open(Domain::Meta, "0123456789abcdef", text.as_bytes()), Some("workspace 2f77\nkind run\n"));
        // Another transaction, kind of file, state directory or key: refused.
        assert_eq!(a.open(Domain::Meta, "0123456789abcdee", text.as_bytes()), None);
        assert_eq!(a.open(Domain::Status, "0123456789abcdef", text.as_bytes()), None);
        assert_eq!(
            Seal::new(Key::from_bytes([7; 32]), b"state b").open(Domain::Meta, "0123456789abcdef", text.as_bytes()),
            None
        );
        assert_eq!(
            Seal::new(Key::from_bytes([8; 32]), b"state a").open(Domain::Meta, "0123456789abcdef", text.as_bytes()),
            None
        );
        // Every flipped bit, every truncation.
        for i in 0..text.len() {
            for bit in [1u8, 0x20, 0x80] {
                let mut b = text.clone().into_bytes();
                b[i] ^= bit;
                assert_eq!(a.open(Domain::Meta, "0123456789abcdef", &b), None, "flip at {i}");
            }
            assert_eq!(a.open(Domain::Meta, "0123456789abcdef", &text.as_bytes()[..i]), None, "cut at {i}");
        }
    }
}
