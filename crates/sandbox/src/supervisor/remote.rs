//! The notifying thread, seen from the supervisor: its memory, its descriptors, its working
//! directory and root, its capabilities. Every read is followed, before it is used, by a
//! check that the notification is still pending ([`Remote::valid`]): the thread number could
//! have been reused by another process between the notification and the read.
//!
//! Owns reading the notifying thread's state; may not decide, nor use a read before it was
//! validated.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::abi::Anchor;
use super::Shared;

/// A value, or why there is none: an errno to answer the call with, or nobody to answer.
pub type Answer<T> = Result<T, Failure>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Answer the call with this error.
    Errno(Errno),
    /// The thread is gone, or its call was interrupted (or we cannot tell it from one that
    /// was): the caller checks whether the notification is still pending before giving up.
    Gone,
}

impl From<Errno> for Failure {
    fn from(e: Errno) -> Failure {
        Failure::Errno(e)
    }
}

fn last_errno() -> Errno {
    Errno::from_raw_os_error(crate::stage2::errno())
}

/// `PIDFD_THREAD` (Linux 6.9): a pidfd for one thread, not only a thread-group leader.
const PIDFD_THREAD: u32 = libc::O_EXCL as u32;

pub struct Remote {
    pub tid: i32,
    pub id: u64,
    pub shared: Arc<Shared>,
    pidfd: OwnedFd,
}

impl Remote {
    /// The thread behind notification `id`, pinned by a pidfd (checked to be that thread).
    pub fn open(shared: &Arc<Shared>, tid: u32, id: u64) -> Answer<Remote> {
        let tid = i32::try_from(tid).map_err(|_| Failure::Gone)?;
        let mut pidfd = -1;
        for flags in [PIDFD_THREAD, 0] {
            // SAFETY: pidfd_open takes integers and returns a new descriptor or -1.
            pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, flags) } as i32;
            if pidfd >= 0 || last_errno() != Errno::INVAL {
                break;
            }
        }
        if pidfd < 0 {
            return Err(Failure::Gone);
        }
        // SAFETY: a new descriptor from pidfd_open.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let r = Remote { tid, id, shared: Arc::clone(shared), pidfd };
        r.still_valid()?;
        Ok(r)
    }

    /// Whether the notification is still pending (its thread alive and still in the call).
    pub fn valid(&self) -> bool {
        valid(self.shared.listener.as_fd(), self.id)
    }

    pub fn still_valid(&self) -> Answer<()> {
        if self.valid() {
            Ok(())
        } else {
            Err(Failure::Gone)
        }
    }

    /// `len` bytes of the thread's memory at `addr` (EFAULT, as the kernel, if they cannot all
    /// be read).
    pub fn read(&self, addr: u64, len: usize) -> Answer<Vec<u8>> {
        let mut buf = vec![0u8; len];
        if len == 0 {
            return Ok(buf);
        }
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
        // SAFETY: process_vm_readv writes at most `len` bytes into `buf`, which we own.
        let n = unsafe { libc::process_vm_readv(self.tid, &local, 1, &remote, 1, 0) };
        if n < 0 || n as usize != len {
            return Err(Failure::Errno(Errno::FAULT));
        }
        Ok(buf)
    }

    /// Write `bytes` into the thread's memory at `addr` (a result field the call fills in).
    pub fn write(&self, addr: u64, bytes: &[u8]) -> Answer<()> {
        let local = libc::iovec { iov_base: bytes.as_ptr().cast_mut().cast(), iov_len: bytes.len() };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: bytes.len() };
        // SAFETY: process_vm_writev reads `bytes` and writes the other process's memory only.
        let n = unsafe { libc::process_vm_writev(self.tid, &local, 1, &remote, 1, 0) };
        if n < 0 || n as usize != bytes.len() {
            return Err(Failure::Errno(Errno::FAULT));
        }
        Ok(())
    }

    /// Our own copy of the thread's descriptor `fd` (the same open file).
    pub fn fd(&self, fd: u64) -> Answer<OwnedFd> {
        let fd = i32::try_from(fd).map_err(|_| Failure::Errno(Errno::BADF))?;
        // SAFETY: pidfd_getfd takes integers and returns a new descriptor (close-on-exec) or -1.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.pidfd.as_raw_fd(), fd, 0) };
        if r < 0 {
            let e = last_errno();
            return Err(match e {
                Errno::BADF => Failure::Errno(Errno::BADF),
                _ => Failure::Gone,
            });
        }
        // SAFETY: a new descriptor from pidfd_getfd.
        Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
    }

    /// The thread's working directory, root, or an open file of its own, as `O_PATH`.
    pub fn anchor(&self, anchor: Anchor) -> Answer<OwnedFd> {
        let rel = match anchor {
            Anchor::Cwd => format!("{}/cwd", self.tid),
            Anchor::Root => format!("{}/root", self.tid),
            Anchor::Fd(n) => format!("{}/fd/{n}", self.tid),
        };
        rustix::fs::openat(&self.shared.proc, rel.as_str(), OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).map_err(
            |e| match e {
                Errno::NOENT if matches!(anchor, Anchor::Fd(_)) => Failure::Errno(Errno::NOENT),
                Errno::NOENT | Errno::SRCH => Failure::Gone,
                e => Failure::Errno(e),
            },
        )
    }

    /// Send the thread a signal the call itself would have raised (`SIGPIPE`).
    pub fn signal(&self, sig: i32) {
        // SAFETY: pidfd_send_signal with a null siginfo: the kernel fills in our identity.
        unsafe {
            libc::syscall(libc::SYS_pidfd_send_signal, self.pidfd.as_raw_fd(), sig, std::ptr::null::<u8>(), 0);
        }
    }

    /// The thread's effective capabilities (two 32-bit words, as `capget` gives them).
    pub fn effective_caps(&self) -> Answer<[u32; 2]> {
        let mut hdr = CapHeader { version: CAP_V3, pid: self.tid };
        let mut data = [CapData::default(); 2];
        // SAFETY: capget fills `data` (two entries for version 3) for the given thread.
        if unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) } != 0 {
            return Err(Failure::Gone);
        }
        Ok([data[0].effective, data[1].effective])
    }
}

/// `SECCOMP_IOCTL_NOTIF_ID_VALID`.
pub fn valid(listener: BorrowedFd<'_>, id: u64) -> bool {
    // SAFETY: the ioctl reads the u64 we pass.
    unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &id as *const u64) == 0 }
}

const CAP_V3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// This thread's capabilities lowered to `effective` (within what it has) while a value of
/// this type lives; restored when it drops. Capabilities are per thread: the supervisor's
/// other threads keep theirs. So a call made on the command's behalf is checked against the
/// command's privileges, not the supervisor's (which, as the sandbox's creator, holds every
/// capability in its user namespace, or on the host for root).
pub struct AsCommand {
    saved: [CapData; 2],
}

impl AsCommand {
    pub fn enter(effective: [u32; 2]) -> Option<AsCommand> {
        let mut hdr = CapHeader { version: CAP_V3, pid: 0 };
        let mut saved = [CapData::default(); 2];
        // SAFETY: capget fills `saved` for this thread.
        if unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, saved.as_mut_ptr()) } != 0 {
            return None;
        }
        let mut lowered = saved;
        for (d, e) in lowered.iter_mut().zip(effective) {
            d.effective &= e;
        }
        set_caps(&lowered).then_some(AsCommand { saved })
    }
}

impl Drop for AsCommand {
    fn drop(&mut self) {
        set_caps(&self.saved);
    }
}

fn set_caps(data: &[CapData; 2]) -> bool {
    let mut hdr = CapHeader { version: CAP_V3, pid: 0 };
    // SAFETY: capset reads the header and two data entries; it changes this thread only.
    unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) == 0 }
}

/// `openat2(dir, path, O_PATH, resolve)`, again while a rename races it (`EAGAIN`, which
/// `RESOLVE_IN_ROOT` answers rather than risk a wrong result).
pub fn openat2_path(dir: BorrowedFd<'_>, path: &[u8], resolve: rustix::fs::ResolveFlags) -> Result<OwnedFd, Errno> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::OsStr::from_bytes(path);
    let mut last = Errno::AGAIN;
    for _ in 0..8 {
        match rustix::fs::openat2(dir, path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), resolve) {
            Ok(fd) => return Ok(fd),
            Err(Errno::AGAIN) => last = Errno::AGAIN,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}
