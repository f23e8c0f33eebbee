//! Warm sandboxes: the namespaces and every mount that does not depend on the transaction,
//! built ahead of time by a server process and reused, one transaction at a time.
//!
//! Building a sandbox costs milliseconds of kernel work (new namespaces, ~35 mounts, and the
//! teardown of all of it); a command like `git status` costs less. A warm server pays that once:
//! per transaction it hands over the view it mounted while it waited (or mounts one, with the
//! layers the client passes as fds), starts the command with the same confinement as a cold
//! sandbox (rlimits, capabilities, Landlock, seccomp), and afterwards kills every process the
//! command left, detaches the view, replaces `/tmp` and `/dev/shm`, makes the next command's
//! IPC and UTS namespaces and mounts the next view.
//!
//! - [`wire`]: the request and answers, as bytes (pure);
//! - [`server`]: `txbox __warm`, the server and its pid-1 loop, its setup order generic over
//!   `crate::kernel::Kernel` (as stage 2's); `refusal`: why it does not take a request;
//! - [`client`]: claim a server for one command, or start one for next time;
//! - [`gc`]: deleting retired transaction directories while the server is idle;
//! - `premount`: the next run's view, mounted while the server waits;
//! - [`stale`]: what servers that are gone left beside their sockets (`txbox gc`).
//!
//! A server is keyed by [`SandboxSpec::sandbox_key`](crate::SandboxSpec::sandbox_key) and
//! lives in the state directory (hidden from every sandbox); it exits when idle. Up to [`SLOTS`]
//! servers serve sandboxes alike, for runs that overlap. Runs that need a terminal or cgroup
//! limits, and runs while every server is busy, build their own sandbox.
//!
//! Owns what client and server share (names, the binary's identity, whether a spec fits); may not
//! build a sandbox (the server's) nor claim one (the client's).

pub mod client;
pub mod gc;
mod premount;
mod refusal;
pub mod server;
pub mod stale;
pub mod wire;

pub use client::{claim, fits, spawn, Conn, NotWarm};

use std::path::Path;

/// What the caller (txbox, which knows the state directory's layout; this crate does not)
/// tells a server about the state directory.
#[derive(Clone, Copy)]
pub struct StateLayout {
    /// Where finished transactions leave directories for the server to delete when idle.
    pub retired: &'static Path,
    /// Which layer of which transaction a path relative to the state directory names (None:
    /// it is not one). The server lays overlays on nothing else.
    pub layer: fn(&Path) -> Option<LayerName>,
}

/// One overlay layer of a transaction (see [`StateLayout::layer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerName {
    pub tx: String,
    /// A session's step; None for a run.
    pub step: Option<u32>,
    /// The upper directory (else the work directory).
    pub upper: bool,
}

/// This binary, as a short name: a server started by another txbox binary is never used
/// (its socket has another name, and it refuses a client that names another binary). The
/// executable's device, inode, size and modification time: a rebuild or an upgrade changes
/// them, and taking them costs one `stat`.
pub fn binary_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(binary_id_now).clone()
}

/// [`binary_id`], looked at now: the inode `/proc/self/exe` names is this process's for its
/// whole life (a binary replaced on disk is another inode, not this one), so once is enough.
fn binary_id_now() -> String {
    let st = rustix::fs::stat("/proc/self/exe");
    // The field types differ by architecture.
    #[allow(clippy::unnecessary_cast)]
    let fields = st.map(|s| [s.st_dev, s.st_ino, s.st_size as u64, s.st_mtime as u64, s.st_mtime_nsec as u64]);
    let mut h = Fnv::new();
    for f in fields.unwrap_or_default() {
        h.write(&f.to_le_bytes());
    }
    format!("{:016x}", h.0)
}

/// How many warm servers may serve sandboxes alike at once (a server runs one transaction at a
/// time): concurrent runs of one agent on one workspace each get one, up to this many, and
/// the next is built cold. A slot's server is started only when a run found every slot below
/// it busy, and leaves when idle, so one client at a time keeps one server.
pub const SLOTS: usize = 4;

/// The socket of slot `i` for sandboxes whose slot 0 is `base` (`KEY.sock`, then `KEY-1.sock`, …).
pub fn slot(base: &std::path::Path, i: usize) -> std::path::PathBuf {
    if i == 0 {
        return base.to_path_buf();
    }
    let name = base.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = name.strip_suffix(".sock").unwrap_or(&name);
    base.with_file_name(format!("{stem}-{i}.sock"))
}

/// The socket of the warm server for sandboxes like `spec`, run by this binary:
/// `<16 hex digits>.sock` (slot 0; [`slot`] names the others).
pub fn socket_name(spec: &crate::SandboxSpec, binary: &str) -> String {
    let mut h = Fnv::new();
    h.write(spec.sandbox_key().as_bytes());
    h.write(binary.as_bytes());
    format!("{:016x}.sock", h.0)
}

/// FNV-1a: a name, not a security boundary (the server compares everything it is asked).
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// How many pid namespaces deep a process is, from a pidfd's fdinfo read through the procfs
/// of the namespace the depth is counted from: its `NSpid` line lists the pid in each.
/// None if it is gone (or the kernel does not say).
pub(crate) fn pid_ns_depth(fdinfo: &str) -> Option<usize> {
    let line = fdinfo.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Vec<&str> = line.split_whitespace().collect();
    match pids.as_slice() {
        [] | ["-1", ..] | ["0", ..] => None,
        p => Some(p.len()),
    }
}

/// A pidfd for the process at the other end of a unix socket (`SO_PEERPIDFD`, Linux 6.5).
pub fn peer_pidfd(fd: std::os::fd::BorrowedFd<'_>) -> Result<std::os::fd::OwnedFd, rustix::io::Errno> {
    use std::os::fd::{AsRawFd, FromRawFd};
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `pidfd`.
    let r = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, SO_PEERPIDFD, (&mut pidfd as *mut i32).cast(), &mut len)
    };
    if r != 0 || pidfd < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO),
        ));
    }
    // SAFETY: a new descriptor the kernel gave us (close-on-exec).
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_the_pid_namespaces_of_a_peer() {
        assert_eq!(pid_ns_depth("pos:\t0\nflags:\t02000002\nPid:\t4242\nNSpid:\t4242\n"), Some(1));
        assert_eq!(pid_ns_depth("Pid:\t4242\nNSpid:\t4242\t7\t2\n"), Some(3));
        assert_eq!(pid_ns_depth("Pid:\t-1\nNSpid:\t-1\n"), None, "gone");
        assert_eq!(pid_ns_depth("Pid:\t4242\n"), None, "not said");
    }

    #[test]
    fn the_socket_name_follows_the_sandbox_and_the_binary() {
        let spec = crate::SandboxSpec::new("/w".into(), "/u".into(), "/k".into(), vec!["true".into()]);
        let a = socket_name(&spec, "0000000000000001");
        assert_eq!(a.len(), 16 + ".sock".len());
        assert_ne!(a, socket_name(&spec, "0000000000000002"));
        let mut other = spec.clone();
        other.host_network = true;
        assert_ne!(a, socket_name(&other, "0000000000000001"));
        assert_eq!(binary_id(), binary_id());
    }

    #[test]
    fn slots_are_named_beside_the_first() {
        let base = std::path::Path::new("/s/warm/0123456789abcdef.sock");
        assert_eq!(slot(base, 0), base);
        assert_eq!(slot(base, 1), std::path::Path::new("/s/warm/0123456789abcdef-1.sock"));
        assert_eq!(slot(base, SLOTS - 1), std::path::Path::new("/s/warm/0123456789abcdef-3.sock"));
        assert!(super::client::fits(&slot(base, SLOTS - 1)));
    }
}
