//! The kernel structures a notified call points to, read from the command's memory as bytes
//! and parsed here. Pure: every byte is the command's and hostile; nothing here trusts a
//! length or a pointer beyond what the kernel itself would accept.
//!
//! May not make a syscall.

/// `offsetof(struct sockaddr_un, sun_path)`.
const SUN_PATH: usize = 2;
/// `sizeof(struct sockaddr_un)`.
pub const SOCKADDR_UN_LEN: usize = 110;
/// `sizeof(struct sockaddr_storage)`: the most any socket call copies in (more is EINVAL).
pub const SOCKADDR_MAX: usize = 128;

/// What a socket address given to a unix socket makes the kernel look up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnixAddr<'a> {
    /// A pathname socket: the kernel resolves this path (not NUL-terminated here).
    Path(&'a [u8]),
    /// An abstract socket: a name in the socket's network namespace.
    Abstract,
    /// Anything the kernel refuses before any lookup (wrong family or length), or
    /// `AF_UNSPEC` (a datagram socket's disconnect): harmless to pass on unchanged.
    Inert,
}

/// Classify `addr` (exactly the `addrlen` bytes the command passed) as `unix_validate_addr`
/// and `unix_mkname_bsd` would.
pub fn classify_unix(addr: &[u8]) -> UnixAddr<'_> {
    if addr.len() <= SUN_PATH || addr.len() > SOCKADDR_UN_LEN {
        return UnixAddr::Inert;
    }
    if u16::from_ne_bytes([addr[0], addr[1]]) != libc::AF_UNIX as u16 {
        return UnixAddr::Inert;
    }
    let path = &addr[SUN_PATH..];
    if path[0] == 0 {
        return UnixAddr::Abstract;
    }
    // The kernel terminates the path at addrlen; a NUL before that ends it sooner.
    let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
    UnixAddr::Path(&path[..end])
}

/// `sockaddr_un` for `path` (a name relative to the supervisor's working directory, which is
/// the host's procfs: `self/fd/N`). None if it does not fit.
pub fn unix_addr(path: &[u8]) -> Option<Vec<u8>> {
    if path.is_empty() || path.len() >= SOCKADDR_UN_LEN - SUN_PATH || path.contains(&0) {
        return None;
    }
    let mut a = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
    a.extend_from_slice(path);
    a.push(0);
    Some(a)
}

/// Where a `/proc/self/…` or `/proc/thread-self/…` path starts: the command's own working
/// directory, root or open file, which the supervisor must take from the command rather than
/// from itself (its `self` is another process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    Cwd,
    Root,
    Fd(u32),
}

/// Split `/proc/self/{cwd,root,fd/N}/REST` into its anchor and REST (relative, maybe empty).
/// Only this plain spelling is recognized; any other way to reach a magic link is refused by
/// the resolution itself (`RESOLVE_NO_MAGICLINKS`).
pub fn proc_self(path: &[u8]) -> Option<(Anchor, Vec<u8>)> {
    if path.first() != Some(&b'/') {
        return None;
    }
    let parts: Vec<&[u8]> = path.split(|&b| b == b'/').filter(|p| !p.is_empty()).collect();
    let (head, rest) = match parts.as_slice() {
        [b"proc", b"self" | b"thread-self", b"cwd", rest @ ..] => (Anchor::Cwd, rest),
        [b"proc", b"self" | b"thread-self", b"root", rest @ ..] => (Anchor::Root, rest),
        [b"proc", b"self" | b"thread-self", b"fd", n, rest @ ..] => {
            let n = std::str::from_utf8(n).ok().filter(|s| s.bytes().all(|b| b.is_ascii_digit()))?.parse().ok()?;
            (Anchor::Fd(n), rest)
        }
        _ => return None,
    };
    Some((head, rest.join(&b'/')))
}

/// `struct msghdr` on a 64-bit architecture.
pub const MSGHDR_LEN: usize = 56;
/// `struct mmsghdr`: a msghdr, `msg_len` (u32) and padding.
pub const MMSGHDR_LEN: usize = 64;
/// Where `msg_len` sits in a `struct mmsghdr`.
pub const MMSG_LEN_OFFSET: usize = 56;
/// `UIO_MAXIOV`: the most iovecs (and `sendmmsg` messages) the kernel takes.
pub const UIO_MAXIOV: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgHdr {
    pub name: u64,
    pub namelen: u32,
    pub iov: u64,
    pub iovlen: u64,
    pub control: u64,
    pub controllen: u64,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(w)
}

pub fn parse_msghdr(b: &[u8; MSGHDR_LEN]) -> MsgHdr {
    MsgHdr {
        name: u64_at(b, 0),
        namelen: u32_at(b, 8),
        iov: u64_at(b, 16),
        iovlen: u64_at(b, 24),
        control: u64_at(b, 32),
        controllen: u64_at(b, 40),
    }
}

/// `struct iovec`s: (base, len) each.
pub fn parse_iovecs(b: &[u8]) -> Vec<(u64, u64)> {
    b.chunks_exact(16).map(|c| (u64_at(c, 0), u64_at(c, 8))).collect()
}

const CMSG_HDR: usize = 16;
const SOL_SOCKET: i32 = libc::SOL_SOCKET;

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// Where the descriptor numbers of `SCM_RIGHTS` messages sit in a control buffer (byte offsets
/// of each `int`), for the supervisor to put its own copies of those descriptors there.
/// Refuses (with the errno the caller sees) what it cannot pass on faithfully: a malformed
/// buffer (`EINVAL`, as the kernel), descriptors on a socket that is not a unix one
/// (`EINVAL`, as the kernel), and credentials (`SCM_CREDENTIALS`: `EPERM`; the supervisor
/// may only claim its own, which are not the command's).
pub fn rights_offsets(control: &[u8], unix: bool) -> Result<Vec<usize>, i32> {
    let mut out = Vec::new();
    let mut at = 0;
    while control.len() - at >= CMSG_HDR {
        let len = u64_at(control, at) as usize;
        if len < CMSG_HDR || len > control.len() - at {
            return Err(libc::EINVAL);
        }
        let level = u32_at(control, at + 8) as i32;
        let kind = u32_at(control, at + 12) as i32;
        if level == SOL_SOCKET && kind == libc::SCM_RIGHTS {
            if !unix {
                return Err(libc::EINVAL);
            }
            let n = (len - CMSG_HDR) / 4;
            out.extend((0..n).map(|i| at + CMSG_HDR + 4 * i));
        }
        if level == SOL_SOCKET && kind == libc::SCM_CREDENTIALS {
            return Err(if unix { libc::EPERM } else { libc::EINVAL });
        }
        at += align8(len);
        if at > control.len() {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sun(path: &[u8]) -> Vec<u8> {
        let mut a = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
        a.extend_from_slice(path);
        a
    }

    #[test]
    fn unix_addresses_are_classified_as_the_kernel_reads_them() {
        assert_eq!(classify_unix(&sun(b"/run/x.sock\0")), UnixAddr::Path(b"/run/x.sock"));
        // Not terminated: the length ends it.
        assert_eq!(classify_unix(&sun(b"rel/x")), UnixAddr::Path(b"rel/x"));
        // A NUL inside ends it sooner: what follows is not part of the name.
        assert_eq!(classify_unix(&sun(b"/a\0/b")), UnixAddr::Path(b"/a"));
        assert_eq!(classify_unix(&sun(b"\0name")), UnixAddr::Abstract);
        assert_eq!(classify_unix(&sun(b"")), UnixAddr::Inert, "autobind/unnamed: EINVAL for connect");
        let mut inet = sun(b"/run/x.sock");
        inet[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        assert_eq!(classify_unix(&inet), UnixAddr::Inert);
        let mut unspec = sun(b"/run/x.sock");
        unspec[0..2].copy_from_slice(&0u16.to_ne_bytes());
        assert_eq!(classify_unix(&unspec), UnixAddr::Inert);
        assert_eq!(classify_unix(&sun(&[b'a'; 109])), UnixAddr::Inert, "longer than sockaddr_un");
        assert_eq!(classify_unix(&sun(&[b'a'; 108])), UnixAddr::Path(&[b'a'; 108][..]));
    }

    #[test]
    fn the_supervisors_address_is_a_terminated_relative_name() {
        assert_eq!(unix_addr(b"self/fd/12").unwrap(), sun(b"self/fd/12\0"));
        assert_eq!(unix_addr(b""), None);
        assert_eq!(unix_addr(&[b'a'; 108]), None);
    }

    #[test]
    fn proc_self_paths_are_anchored_at_the_command() {
        assert_eq!(proc_self(b"/proc/self/cwd/s.sock"), Some((Anchor::Cwd, b"s.sock".to_vec())));
        assert_eq!(proc_self(b"/proc/thread-self/root/var//tmp/x"), Some((Anchor::Root, b"var/tmp/x".to_vec())));
        assert_eq!(proc_self(b"//proc/self/fd/7"), Some((Anchor::Fd(7), Vec::new())));
        assert_eq!(proc_self(b"/proc/self/fd/7/a/b"), Some((Anchor::Fd(7), b"a/b".to_vec())));
        for other in [&b"/proc/1/root/x"[..], b"proc/self/cwd/x", b"/proc/self/exe", b"/proc/self/fd/x1/y", b"/tmp/s"] {
            assert_eq!(proc_self(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    fn cmsg(level: i32, kind: i32, data: &[u8]) -> Vec<u8> {
        let mut c = ((CMSG_HDR + data.len()) as u64).to_ne_bytes().to_vec();
        c.extend_from_slice(&level.to_ne_bytes());
        c.extend_from_slice(&kind.to_ne_bytes());
        c.extend_from_slice(data);
        c.resize(align8(c.len()), 0);
        c
    }

    #[test]
    fn descriptors_in_control_messages_are_found_and_credentials_refused() {
        let fds: Vec<u8> = [4i32, 9, 11].iter().flat_map(|f| f.to_ne_bytes()).collect();
        let mut buf = cmsg(libc::SOL_IP, libc::IP_TOS, &1i32.to_ne_bytes());
        let start = buf.len();
        buf.extend(cmsg(SOL_SOCKET, libc::SCM_RIGHTS, &fds));
        let offs = rights_offsets(&buf, true).unwrap();
        assert_eq!(offs, [start + 16, start + 20, start + 24]);
        assert_eq!(rights_offsets(&buf, false), Err(libc::EINVAL), "descriptors only travel on unix sockets");
        let creds = cmsg(SOL_SOCKET, libc::SCM_CREDENTIALS, &[0u8; 12]);
        assert_eq!(rights_offsets(&creds, true), Err(libc::EPERM));
        // A header claiming more than the buffer holds, or less than itself.
        let mut bad = cmsg(SOL_SOCKET, libc::SCM_RIGHTS, &fds);
        bad[0..8].copy_from_slice(&1000u64.to_ne_bytes());
        assert_eq!(rights_offsets(&bad, true), Err(libc::EINVAL));
        bad[0..8].copy_from_slice(&3u64.to_ne_bytes());
        assert_eq!(rights_offsets(&bad, true), Err(libc::EINVAL));
        assert_eq!(rights_offsets(&[0u8; 7], true), Ok(Vec::new()), "too short for a header: nothing");
    }

    #[test]
    fn message_headers_parse_field_by_field() {
        let mut b = [0u8; MSGHDR_LEN];
        b[0..8].copy_from_slice(&0x1000u64.to_ne_bytes());
        b[8..12].copy_from_slice(&110u32.to_ne_bytes());
        b[16..24].copy_from_slice(&0x2000u64.to_ne_bytes());
        b[24..32].copy_from_slice(&2u64.to_ne_bytes());
        b[32..40].copy_from_slice(&0x3000u64.to_ne_bytes());
        b[40..48].copy_from_slice(&24u64.to_ne_bytes());
        assert_eq!(
            parse_msghdr(&b),
            MsgHdr { name: 0x1000, namelen: 110, iov: 0x2000, iovlen: 2, control: 0x3000, controllen: 24 }
        );
        let mut iov = Vec::new();
        for (p, l) in [(0x10u64, 3u64), (0x20, 4)] {
            iov.extend(p.to_ne_bytes());
            iov.extend(l.to_ne_bytes());
        }
        assert_eq!(parse_iovecs(&iov), [(0x10, 3), (0x20, 4)]);
    }
}
