//! Warm sandboxes: the namespaces and every mount that does not depend on the transaction,
//! built ahead of time by a server process and reused, one transaction at a time.
//!
//! Building a sandbox costs milliseconds of kernel work (new namespaces, ~35 mounts, and the
//! teardown of all of it); a command like `git status` costs less. A warm server pays that once:
//! per transaction it only mounts the overlay (with the layers the client passes as fds),
//! forks the command into fresh IPC and UTS namespaces with the same confinement as a cold
//! sandbox (rlimits, capabilities, Landlock, seccomp), and afterwards kills every process the
//! command left, detaches the view and replaces `/tmp` and `/dev/shm`.
//!
//! - [`wire`]: the request and answers, as bytes (pure);
//! - [`server`]: `txbox __warm`, the server and its pid-1 loop;
//! - [`client`]: claim a server for one command, or start one for next time;
//! - [`gc`]: deleting retired transaction directories while the server is idle.
//!
//! A server is keyed by [`SandboxSpec::sandbox_key`](crate::SandboxSpec::sandbox_key) and
//! lives in the state directory (hidden from every sandbox); it exits when idle. Runs that need
//! a terminal or cgroup limits, and runs while the server is busy, build their own sandbox.

pub mod client;
pub mod gc;
pub mod server;
pub mod wire;

pub use client::{claim, fits, spawn, Conn, NotWarm};

/// The uid of the process at the other end of a unix socket, as seen from this process's
/// user namespace. (`SO_PEERCRED` through libc: rustix 1.1 reports a spurious error for it.)
pub(crate) fn peer_uid(fd: std::os::fd::BorrowedFd<'_>) -> Result<u32, rustix::io::Errno> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a properly sized ucred.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO),
        ));
    }
    Ok(cred.uid)
}
