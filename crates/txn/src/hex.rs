//! Hex encoding of bytes and paths: how the state directory's text files store names that may
//! hold any byte (newlines, non-UTF-8). Pure; depends on nothing else in the crate.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// Bytes back from [`hex`]; None for anything that is not an even run of lowercase hex digits
/// (one spelling per value: no signs, no uppercase).
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks_exact(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

/// A path as hex.
pub fn path_to_hex(p: &Path) -> String {
    hex(p.as_os_str().as_bytes())
}

/// A path stored as hex.
pub fn path_from_hex(s: &str) -> Option<PathBuf> {
    unhex(s).map(|b| PathBuf::from(OsString::from_vec(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&all)), Some(all));
        assert_eq!(hex(b"\x00\xff"), "00ff");
        for bad in ["0", "zz", "0g", "+1", "AB", "-1"] {
            assert_eq!(unhex(bad), None, "{bad}");
        }
    }
}
