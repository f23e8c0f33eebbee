//! One notified call: read what it points to, decide, and perform it on the command's behalf.
//!
//! The supervisor never lets the kernel carry on with the command's own call
//! (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`): the kernel would read the address and the descriptor
//! again, and another thread of the command could have changed either since the check. It
//! takes its own copy of the descriptor, reads the address once, resolves a pathname to the
//! socket's inode (as the command would) and connects or sends to *that inode*, through
//! `/proc/self/fd/N`.
//!
//! Owns the decision on one call and its performance; may not read the command's memory or
//! descriptors except through [`super::remote`].

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::io::Errno;

use super::abi::{self, Anchor, UnixAddr};
use super::remote::{openat2_path, Answer, Failure, Remote};
use super::Shared;

/// The most data copied for one send; a stream socket sends this much (a short write), a
/// message socket refuses more (`EMSGSIZE`, as it would beyond its buffer).
pub const DATA_CAP: usize = 1 << 20;
/// The most control data copied for one message (the kernel's own limit, `optmem_max`, is
/// ~20 KiB by default).
const CONTROL_CAP: usize = 64 << 10;

use rustix::fs::ResolveFlags;

/// Where a call sends or connects.
pub enum Dest {
    /// No address (a send on a connected socket).
    None,
    /// The command's own bytes: not a pathname (another family, abstract, malformed).
    Verbatim(Vec<u8>),
    /// A pathname socket, resolved and checked: the address names this inode through the
    /// supervisor's `/proc/self/fd`, and the descriptor stays open while it is used.
    Pinned { addr: Vec<u8>, _inode: OwnedFd },
}

impl Dest {
    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Dest::None => None,
            Dest::Verbatim(b) | Dest::Pinned { addr: b, .. } => Some(b),
        }
    }
}

pub struct Msg {
    pub data: Vec<u8>,
    pub dest: Dest,
    /// Control messages, with the command's descriptor numbers replaced by ours.
    pub control: Vec<u8>,
    pub _rights: Vec<OwnedFd>,
}

pub enum Op {
    Connect {
        dest: Dest,
    },
    /// `sendto`, `sendmsg` (one message) or `sendmmsg` (`results`: where each message's
    /// `msg_len` goes in the command's memory).
    Send {
        msgs: Vec<Msg>,
        flags: i32,
        results: Option<u64>,
        stream: bool,
    },
}

/// A call read, checked and ready to perform.
pub struct Prepared {
    pub remote: Remote,
    pub sock: OwnedFd,
    pub op: Op,
    /// The command's effective capabilities: the call is performed with no more.
    pub caps: [u32; 2],
    /// The command may wait (a blocking socket, no `MSG_DONTWAIT`).
    pub may_block: bool,
}

fn sockopt(fd: BorrowedFd<'_>, opt: i32) -> Result<i32, Errno> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`.
    let r = unsafe { libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, opt, (&mut v as *mut i32).cast(), &mut len) };
    if r != 0 {
        return Err(Errno::from_raw_os_error(crate::stage2::errno()));
    }
    Ok(v)
}

fn nonblocking(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fcntl_getfl(fd).is_ok_and(|f| f.contains(rustix::fs::OFlags::NONBLOCK))
}

/// Read and check the call of notification `n`.
pub fn prepare(shared: &Arc<Shared>, n: &libc::seccomp_notif) -> Answer<Prepared> {
    let remote = Remote::open(shared, n.pid, n.id)?;
    let args = n.data.args;
    let sock = remote.fd(args[0])?;
    let unix = sockopt(sock.as_fd(), libc::SO_DOMAIN)? == libc::AF_UNIX;
    let mut may_block = !nonblocking(sock.as_fd());
    let op = match i64::from(n.data.nr) {
        libc::SYS_connect => {
            if args[1] == 0 && args[2] as u32 != 0 {
                return Err(Failure::Errno(Errno::FAULT));
            }
            let addr = read_addr(&remote, args[1], args[2])?;
            Op::Connect { dest: destination(shared, &remote, unix, addr)? }
        }
        libc::SYS_sendto => {
            let stream = sockopt(sock.as_fd(), libc::SO_TYPE)? == libc::SOCK_STREAM;
            let data = read_data(&remote, &[(args[1], args[2])], stream)?;
            let addr = read_addr(&remote, args[4], args[5])?;
            let flags = args[3] as i32;
            may_block &= flags & libc::MSG_DONTWAIT == 0;
            let msg =
                Msg { data, dest: destination(shared, &remote, unix, addr)?, control: Vec::new(), _rights: vec![] };
            Op::Send { msgs: vec![msg], flags, results: None, stream }
        }
        libc::SYS_sendmsg => {
            let stream = sockopt(sock.as_fd(), libc::SO_TYPE)? == libc::SOCK_STREAM;
            let flags = args[2] as i32;
            may_block &= flags & libc::MSG_DONTWAIT == 0;
            let msg = read_msg(shared, &remote, args[1], unix, stream)?;
            Op::Send { msgs: vec![msg], flags, results: None, stream }
        }
        libc::SYS_sendmmsg => {
            let stream = sockopt(sock.as_fd(), libc::SO_TYPE)? == libc::SOCK_STREAM;
            let flags = args[3] as i32;
            may_block &= flags & libc::MSG_DONTWAIT == 0;
            // The kernel takes at most UIO_MAXIOV messages and ignores the rest.
            let count = (args[2] as u32 as usize).min(abi::UIO_MAXIOV);
            let mut msgs = Vec::with_capacity(count.min(64));
            for i in 0..count {
                let at = args[1].wrapping_add((i * abi::MMSGHDR_LEN) as u64);
                match read_msg(shared, &remote, at, unix, stream) {
                    Ok(m) => msgs.push(m),
                    // As the kernel: an error after the first message ends the batch there.
                    Err(Failure::Errno(_)) if i > 0 => break,
                    Err(e) => return Err(e),
                }
            }
            Op::Send { msgs, flags, results: Some(args[1]), stream }
        }
        _ => return Err(Failure::Errno(Errno::NOSYS)),
    };
    // Everything read from the command belongs to the thread that is still waiting.
    remote.still_valid()?;
    let caps = remote.effective_caps()?;
    Ok(Prepared { remote, sock, op, caps, may_block })
}

/// A socket address argument: `len` bytes at `ptr` (none for a NULL pointer).
fn read_addr(remote: &Remote, ptr: u64, len: u64) -> Answer<Option<Vec<u8>>> {
    if ptr == 0 {
        return Ok(None);
    }
    // socklen_t is 32 bits; the kernel refuses more than a sockaddr_storage.
    let len = len as u32 as usize;
    if len > abi::SOCKADDR_MAX {
        return Err(Failure::Errno(Errno::INVAL));
    }
    remote.read(ptr, len).map(Some)
}

/// The data of `iov` (base, len pairs), at most [`DATA_CAP`] bytes: a stream sends a prefix,
/// a message that does not fit is refused.
fn read_data(remote: &Remote, iov: &[(u64, u64)], stream: bool) -> Answer<Vec<u8>> {
    let total = iov.iter().try_fold(0u64, |t, (_, l)| t.checked_add(*l)).ok_or(Failure::Errno(Errno::INVAL))?;
    if total > isize::MAX as u64 {
        return Err(Failure::Errno(Errno::INVAL));
    }
    if !stream && total > DATA_CAP as u64 {
        return Err(Failure::Errno(Errno::MSGSIZE));
    }
    let mut data = Vec::with_capacity((total as usize).min(DATA_CAP));
    for &(base, len) in iov {
        let room = DATA_CAP - data.len();
        if room == 0 {
            break;
        }
        data.extend(remote.read(base, (len as usize).min(room))?);
    }
    Ok(data)
}

fn read_msg(shared: &Arc<Shared>, remote: &Remote, ptr: u64, unix: bool, stream: bool) -> Answer<Msg> {
    let raw = remote.read(ptr, abi::MSGHDR_LEN)?;
    let mut h = [0u8; abi::MSGHDR_LEN];
    h.copy_from_slice(&raw);
    let hdr = abi::parse_msghdr(&h);
    let addr = if hdr.namelen == 0 { None } else { read_addr(remote, hdr.name, u64::from(hdr.namelen))? };
    if hdr.iovlen > abi::UIO_MAXIOV as u64 {
        return Err(Failure::Errno(Errno::MSGSIZE));
    }
    let iov =
        if hdr.iovlen == 0 { Vec::new() } else { abi::parse_iovecs(&remote.read(hdr.iov, 16 * hdr.iovlen as usize)?) };
    let data = read_data(remote, &iov, stream)?;
    let (control, rights) = read_control(remote, hdr.control, hdr.controllen, unix)?;
    Ok(Msg { data, dest: destination(shared, remote, unix, addr)?, control, _rights: rights })
}

/// The control buffer, with each descriptor passed (`SCM_RIGHTS`) replaced by our own copy.
fn read_control(remote: &Remote, ptr: u64, len: u64, unix: bool) -> Answer<(Vec<u8>, Vec<OwnedFd>)> {
    if len == 0 || ptr == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    if len > CONTROL_CAP as u64 {
        return Err(Failure::Errno(Errno::NOBUFS));
    }
    let mut buf = remote.read(ptr, len as usize)?;
    let offsets = abi::rights_offsets(&buf, unix).map_err(|e| Failure::Errno(Errno::from_raw_os_error(e)))?;
    let mut rights = Vec::with_capacity(offsets.len());
    for at in offsets {
        let theirs = i32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
        let ours = remote.fd(theirs as u32 as u64)?;
        buf[at..at + 4].copy_from_slice(&ours.as_raw_fd().to_ne_bytes());
        rights.push(ours);
    }
    Ok((buf, rights))
}

/// Where the call goes. Only a pathname address on a unix socket reaches something by the
/// filesystem; it is resolved as the command would and must be a socket this sandbox made.
fn destination(shared: &Shared, remote: &Remote, unix: bool, addr: Option<Vec<u8>>) -> Answer<Dest> {
    let Some(addr) = addr else { return Ok(Dest::None) };
    if !unix {
        return Ok(Dest::Verbatim(addr));
    }
    match abi::classify_unix(&addr) {
        UnixAddr::Inert => Ok(Dest::Verbatim(addr)),
        // Abstract names live in the socket's network namespace: the sandbox's own, unless it
        // shares the host's, where the host's daemons listen (D-Bus, X11).
        UnixAddr::Abstract if shared.host_network => Err(Failure::Errno(Errno::ACCESS)),
        UnixAddr::Abstract => Ok(Dest::Verbatim(addr)),
        UnixAddr::Path(path) => {
            let inode = resolve(remote, path)?;
            shared.places.check(inode.as_fd())?;
            let name = format!("self/fd/{}", inode.as_raw_fd());
            let addr = abi::unix_addr(name.as_bytes()).ok_or(Failure::Errno(Errno::NAMETOOLONG))?;
            Ok(Dest::Pinned { addr, _inode: inode })
        }
    }
}

/// The inode `path` names for the command: from its root (absolute), its working directory
/// (relative), or its own `/proc/self/…` anchors; never through another magic link.
fn resolve(remote: &Remote, path: &[u8]) -> Answer<OwnedFd> {
    let (anchor, rest, in_root) = match abi::proc_self(path) {
        Some((a, rest)) => (a, rest, a == Anchor::Root),
        None if path.first() == Some(&b'/') => (Anchor::Root, path.to_vec(), true),
        None => (Anchor::Cwd, path.to_vec(), false),
    };
    let base = remote.anchor(anchor)?;
    if rest.is_empty() {
        return Ok(base);
    }
    let flags = ResolveFlags::NO_MAGICLINKS | if in_root { ResolveFlags::IN_ROOT } else { ResolveFlags::empty() };
    Ok(openat2_path(base.as_fd(), &rest, flags)?)
}

/// How an attempt ended.
pub enum Attempt {
    Done(Result<i64, Errno>),
    /// It would have waited; `Op` is what is left to do.
    WouldBlock(Op, Progress),
}

/// What a send already did before it would have waited.
#[derive(Default, Clone, Copy)]
pub struct Progress {
    /// Messages sent whole.
    pub sent: usize,
    /// Bytes of the next message sent (stream sockets).
    pub partial: usize,
}

impl Op {
    /// Perform without waiting: connect on a non-blocking socket, or send with
    /// `MSG_DONTWAIT`. A blocking call that would wait comes back as `WouldBlock`.
    pub fn attempt(self, remote: &Remote, sock: BorrowedFd<'_>, may_block: bool) -> Attempt {
        match self {
            Op::Connect { dest } => {
                if may_block {
                    return Attempt::WouldBlock(Op::Connect { dest }, Progress::default());
                }
                Attempt::Done(connect(sock, &dest))
            }
            Op::Send { msgs, flags, results, stream } => {
                let mut p = Progress::default();
                let r = send_from(remote, sock, &msgs, flags | libc::MSG_DONTWAIT, results, stream, &mut p);
                match r {
                    Err(Errno::AGAIN) if may_block => Attempt::WouldBlock(Op::Send { msgs, flags, results, stream }, p),
                    r => Attempt::Done(finish_send(remote, r, flags, &p, results.is_some())),
                }
            }
        }
    }

    /// Perform, waiting as long as the command's own call would. Returns None when the
    /// command's thread went away meanwhile (then nobody is answered).
    pub fn wait(self, remote: &Remote, sock: BorrowedFd<'_>, mut p: Progress) -> Option<Result<i64, Errno>> {
        loop {
            let r = match &self {
                Op::Connect { dest } => connect(sock, dest),
                Op::Send { msgs, flags, results, stream } => {
                    let r = send_from(remote, sock, msgs, *flags, *results, *stream, &mut p);
                    if r == Err(Errno::INTR) && remote.valid() {
                        continue;
                    }
                    finish_send(remote, r, *flags, &p, results.is_some())
                }
            };
            if r == Err(Errno::INTR) {
                if !remote.valid() {
                    return None;
                }
                // A connect interrupted goes on in the background, as the kernel's does; ask
                // again for its outcome.
                if matches!(self, Op::Connect { .. }) {
                    continue;
                }
            }
            return Some(r);
        }
    }
}

fn connect(sock: BorrowedFd<'_>, dest: &Dest) -> Result<i64, Errno> {
    let addr = dest.bytes().unwrap_or_default();
    // SAFETY: connect reads `addr.len()` bytes of a buffer we own.
    let r = unsafe { libc::connect(sock.as_raw_fd(), addr.as_ptr().cast(), addr.len() as libc::socklen_t) };
    if r == 0 {
        Ok(0)
    } else {
        Err(Errno::from_raw_os_error(crate::stage2::errno()))
    }
}

/// Send `msgs` from `p` on; `p` records what went. Ok: the call's return value so far.
fn send_from(
    remote: &Remote,
    sock: BorrowedFd<'_>,
    msgs: &[Msg],
    flags: i32,
    results: Option<u64>,
    stream: bool,
    p: &mut Progress,
) -> Result<i64, Errno> {
    while p.sent < msgs.len() {
        let m = &msgs[p.sent];
        let n = send_one(sock, m, p.partial, flags)?;
        p.partial += n;
        if stream && p.partial < m.data.len() {
            // Part of it went; the rest waits for room (or is a short write, if the command
            // did not want to wait).
            if flags & libc::MSG_DONTWAIT != 0 {
                return Err(Errno::AGAIN);
            }
            continue;
        }
        if let Some(vec) = results {
            // msg_len of this mmsghdr.
            let at = vec.wrapping_add((p.sent * abi::MMSGHDR_LEN + abi::MMSG_LEN_OFFSET) as u64);
            let _ = remote.write(at, &(p.partial as u32).to_ne_bytes());
        }
        p.sent += 1;
        p.partial = 0;
        if results.is_none() {
            return Ok(m.data.len() as i64);
        }
    }
    Ok(p.sent as i64)
}

/// A send's answer: what went counts even if a later part failed, as with the kernel's own.
fn finish_send(remote: &Remote, r: Result<i64, Errno>, flags: i32, p: &Progress, many: bool) -> Result<i64, Errno> {
    match r {
        Ok(n) => Ok(n),
        Err(_) if many && p.sent > 0 => Ok(p.sent as i64),
        Err(_) if !many && p.partial > 0 => Ok(p.partial as i64),
        Err(e) => {
            if e == Errno::PIPE && flags & libc::MSG_NOSIGNAL == 0 {
                // The kernel's own send raises SIGPIPE in the sending thread; ours cannot.
                remote.signal(libc::SIGPIPE);
            }
            Err(e)
        }
    }
}

/// One `sendmsg` of `m` from byte `offset` (its control messages go with the first byte).
fn send_one(sock: BorrowedFd<'_>, m: &Msg, offset: usize, flags: i32) -> Result<usize, Errno> {
    let data = &m.data[offset.min(m.data.len())..];
    let mut iov = libc::iovec { iov_base: data.as_ptr().cast_mut().cast(), iov_len: data.len() };
    // SAFETY: an all-zero msghdr is a valid empty one; the fields set below point into
    // buffers that outlive the call.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    if let Some(a) = m.dest.bytes() {
        hdr.msg_name = a.as_ptr().cast_mut().cast();
        hdr.msg_namelen = a.len() as libc::socklen_t;
    }
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if offset == 0 && !m.control.is_empty() {
        hdr.msg_control = m.control.as_ptr().cast_mut().cast();
        hdr.msg_controllen = m.control.len();
    }
    // SAFETY: sendmsg reads the header and the buffers it points to.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &hdr, flags | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(Errno::from_raw_os_error(crate::stage2::errno()));
    }
    Ok(n as usize)
}
