//! Messages with one file descriptor attached (`SCM_RIGHTS`), and waiting on a descriptor with a
//! deadline: the few socket operations the proxy, the broker and the sandbox hand-off share.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Send `bytes` (one message on a `SOCK_SEQPACKET` socket) with `fd` attached, if any.
pub fn send(sock: BorrowedFd<'_>, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> Result<(), Errno> {
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(Errno::NOBUFS);
        }
    }
    loop {
        match rustix::net::sendmsg(sock, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(_) => return Err(Errno::MSGSIZE),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Receive one message into `buf`: its length (0 at end of stream) and the fd that came with it.
/// Extra fds a hostile sender attached are closed.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<(usize, Option<OwnedFd>), Errno> {
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    loop {
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let n = {
            let mut iov = [IoSliceMut::new(buf)];
            match rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
                Ok(r) => r.bytes,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e),
            }
        };
        let mut first = None;
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for fd in fds {
                    if first.is_none() {
                        first = Some(fd);
                    }
                }
            }
        }
        return Ok((n, first));
    }
}

/// Wait until `fd` is readable (or hung up), or `deadline` passes (false).
pub fn wait_readable(fd: BorrowedFd<'_>, deadline: Option<Instant>) -> Result<bool, Errno> {
    loop {
        let timeout = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                Some(timespec(left))
            }
            None => None,
        };
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(0) => continue,
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn timespec(d: Duration) -> rustix::event::Timespec {
    rustix::event::Timespec { tv_sec: d.as_secs().min(i64::MAX as u64) as i64, tv_nsec: i64::from(d.subsec_nanos()) }
}

/// Write all of `bytes` to a blocking descriptor.
pub fn write_all(fd: impl AsFd, mut bytes: &[u8]) -> Result<(), Errno> {
    while !bytes.is_empty() {
        match rustix::io::write(&fd, bytes) {
            Ok(0) => return Err(Errno::PIPE),
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read until end of file, at most `limit` bytes (more is an error), waiting at most until
/// `deadline`.
pub fn read_to_end(fd: BorrowedFd<'_>, limit: usize, deadline: Instant) -> Result<Vec<u8>, Errno> {
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if !wait_readable(fd, Some(deadline))? {
            return Err(Errno::TIMEDOUT);
        }
        match rustix::io::read(fd, &mut chunk) {
            Ok(0) => return Ok(out),
            Ok(n) => {
                if out.len() + n > limit {
                    return Err(Errno::FBIG);
                }
                out.extend_from_slice(&chunk[..n]);
            }
            Err(Errno::INTR | Errno::AGAIN) => {}
            Err(e) => return Err(e),
        }
    }
}
