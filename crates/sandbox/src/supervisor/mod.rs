//! No host unix socket is reachable from inside: the guard on `connect` and on sends by
//! address.
//!
//! A pathname unix socket is found through the filesystem, and the sandbox shows the host's
//! (read-only, but a socket is connected, not written): a daemon's control socket, a
//! container engine's, D-Bus, an agent holding keys, another workspace's warm server.
//! Abstract sockets are cut off by the network namespace (unless the host's is shared).
//!
//! Two mechanisms, chosen by [`Guard::for_kernel`]:
//!
//! - **Landlock** from ABI 9 (`LANDLOCK_ACCESS_FS_RESOLVE_UNIX`): the command's ruleset
//!   handles the right and grants it nowhere, so only sockets created inside the command's
//!   own Landlock domain can be reached; the kernel answers `EACCES` otherwise.
//! - **The supervisor** elsewhere: a seccomp filter ([`filter`]) installed on the sandbox's
//!   init notifies `connect`, `sendmsg`, `sendmmsg` and `sendto` with an address to the
//!   process that built the sandbox (stage 2, or the warm server), which lives outside the
//!   sandbox's pid namespace (invisible to the command: no signal, ptrace or `/proc/PID`
//!   reaches it) and performs each call itself ([`call`]). A pathname is resolved as the
//!   command would resolve it, and the call goes to the inode found only if it lies on one of
//!   the sandbox's own writable mounts ([`Places`]): its `/tmp`, its `/dev/shm`, or the
//!   workspace view. The view is an overlay, whose inodes are its own: a socket bound on the
//!   host in the workspace is not reachable through it (the kernel answers `ECONNREFUSED`), so
//!   only sockets bound inside through this view are. Everything else is refused with
//!   `EACCES`, as Landlock does, so a program (or an agent reading its error) sees the same
//!   refusal on every kernel: a permission denied, not a server that is down.
//!
//! Costs: the filter is a dozen BPF instructions per syscall; each notified call costs a
//! round trip to the supervisor and a few syscalls there (docs/SECURITY.md has numbers).
//!
//! Owns the supervisor process and init's handoff of the listener; may not let the kernel carry on
//! with a notified call, nor join the sandbox's pid namespace.

pub mod abi;
pub mod call;
pub mod filter;
pub mod remote;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags};
use rustix::io::Errno;

use crate::stage2::{at, StepError};
use remote::Failure;

/// Which mechanism keeps host unix sockets out of reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Landlock ABI ≥ 9 scopes pathname sockets to the command's own domain.
    Landlock,
    /// The seccomp user-notification supervisor.
    Supervisor,
}

/// The Landlock ABI that can scope pathname unix sockets (`LANDLOCK_ACCESS_FS_RESOLVE_UNIX`).
pub const LANDLOCK_UNIX_ABI: u32 = 9;

impl Guard {
    /// Landlock where the kernel can, else the supervisor. `TXBOX_UNIX_GUARD=supervisor`
    /// chooses the supervisor anyway (to test it on a newer kernel); nothing chooses Landlock
    /// where the kernel lacks it.
    pub fn for_kernel() -> Guard {
        let forced = std::env::var_os("TXBOX_UNIX_GUARD").is_some_and(|v| v == "supervisor");
        if !forced && crate::landlock::kernel_abi() >= LANDLOCK_UNIX_ABI {
            Guard::Landlock
        } else {
            Guard::Supervisor
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Guard::Landlock => "Landlock (pathname unix sockets scoped to the command's domain)",
            Guard::Supervisor => "seccomp supervisor (connect and sends by address performed after a check)",
        }
    }
}

/// What this kernel offers the sandbox's edge, for `txbox doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Support {
    pub guard: Guard,
    pub landlock_abi: u32,
    /// seccomp can hand calls to a supervisor (`user_notif` in `actions_avail`).
    pub user_notif: bool,
    /// A unix socket names its peer by pidfd (`SO_PEERPIDFD`, Linux 6.5): the warm server's
    /// check of its clients' pid namespace.
    pub peer_pidfd: bool,
    /// `dev.tty.legacy_tiocsti` (Linux 6.2): Some(true) when TIOCSTI still works for everyone.
    pub legacy_tiocsti: Option<bool>,
}

impl Support {
    pub fn probe() -> Support {
        let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
        let user_notif = read("/proc/sys/kernel/seccomp/actions_avail").is_some_and(|a| a.contains("user_notif"));
        let peer_pidfd = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .is_ok_and(|(a, _b)| crate::warm::peer_pidfd(a.as_fd()).is_ok());
        Support {
            guard: Guard::for_kernel(),
            landlock_abi: crate::landlock::kernel_abi(),
            user_notif,
            peer_pidfd,
            legacy_tiocsti: read("/proc/sys/dev/tty/legacy_tiocsti").map(|v| v == "1"),
        }
    }
}

/// The mounts a socket may lie on for the command to reach it: the sandbox's own writable
/// ones (the supervisor lives in the sandbox's mount namespace). Looked up at each check (a
/// warm sandbox mounts new ones for every transaction).
pub struct Places {
    pub workspace: PathBuf,
}

/// Ask for the unique mount id (Linux 6.8) and the reused one; the kernel fills in the first
/// it knows, the same for every call.
const MNT_IDS: u32 = libc::STATX_MNT_ID_UNIQUE | libc::STATX_MNT_ID;

fn mount_of(fd: BorrowedFd<'_>) -> Result<(u64, u16), Errno> {
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::TYPE | StatxFlags::from_bits_retain(MNT_IDS))?;
    Ok((st.stx_mnt_id, st.stx_mode))
}

impl Places {
    pub fn check(&self, inode: BorrowedFd<'_>) -> remote::Answer<()> {
        let (mnt, mode) = mount_of(inode)?;
        if u32::from(mode) & libc::S_IFMT != libc::S_IFSOCK {
            // What the kernel says for a path that is not a socket.
            return Err(Failure::Errno(Errno::CONNREFUSED));
        }
        let ours = [Path::new("/tmp"), Path::new("/dev/shm"), self.workspace.as_path()];
        for p in ours {
            let Ok(fd) = rustix::fs::open(p, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) else { continue };
            if mount_of(fd.as_fd()).is_ok_and(|(m, _)| m == mnt) {
                return Ok(());
            }
        }
        Err(Failure::Errno(Errno::ACCESS))
    }
}

/// What every thread of the supervisor shares.
pub struct Shared {
    pub listener: OwnedFd,
    /// The host's procfs (where the supervisor's own pid namespace is), pinned before the
    /// sandbox's /proc covered it.
    pub proc: OwnedFd,
    pub places: Places,
    pub host_network: bool,
    /// Threads performing a call that waits, by notification id: interrupted when their
    /// command's thread goes away.
    waiting: Mutex<Vec<(u64, libc::pthread_t)>>,
    pool: Arc<Pool>,
}

/// The sandbox a supervisor guards.
pub struct Sandbox {
    pub workspace: PathBuf,
    pub host_network: bool,
    /// It has a user namespace of its own (the caller is not root).
    pub userns: bool,
}

/// Threads performing waiting calls at once; a call beyond that is answered `EAGAIN`.
const MAX_WAITING: usize = 256;
/// How often calls left waiting for commands that are gone are looked for.
const TICK: Duration = Duration::from_secs(1);
/// Interrupts a waiting call whose command is gone (no `SA_RESTART`: the call returns EINTR).
const CANCEL: i32 = libc::SIGUSR2;

/// Serve notifications until `until` (a pidfd of the sandbox's init) says it exited. `proc`:
/// the procfs of the supervisor's pid namespace.
fn supervise(listener: OwnedFd, proc: OwnedFd, sandbox: Sandbox, until: BorrowedFd<'_>) {
    extern "C" fn cancelled(_: libc::c_int) {}
    // SAFETY: installing a handler that does nothing, and ignoring SIGPIPE (our sends pass
    // MSG_NOSIGNAL too); this process runs no other signal handling.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = cancelled as *const () as usize;
        libc::sigaction(CANCEL, &sa, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // Addresses of checked sockets are `self/fd/N`, relative to the working directory.
    let _ = rustix::process::fchdir(&proc);
    let shared = Arc::new(Shared {
        listener,
        proc,
        places: Places { workspace: sandbox.workspace },
        host_network: sandbox.host_network,
        waiting: Mutex::new(Vec::new()),
        pool: Arc::default(),
    });
    loop {
        let mut fds = [PollFd::new(&until, PollFlags::IN), PollFd::new(&shared.listener, PollFlags::IN)];
        let timeout = rustix::event::Timespec { tv_sec: TICK.as_secs() as i64, tv_nsec: 0 };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => {
                cancel_orphans(&shared);
                continue;
            }
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(_) => return,
        }
        if !fds[0].revents().is_empty() {
            return;
        }
        let ready = fds[1].revents().contains(PollFlags::IN);
        if !ready {
            // No process uses the filter any more (POLLHUP); wait for init alone.
            let mut fds = [PollFd::new(&until, PollFlags::IN)];
            let _ = rustix::event::poll(&mut fds, None);
            return;
        }
        if let Some(n) = receive(shared.listener.as_fd()) {
            handle(&shared, &n);
        }
    }
}

fn receive(listener: BorrowedFd<'_>) -> Option<libc::seccomp_notif> {
    // SAFETY: the kernel wants a zeroed seccomp_notif to fill.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes one seccomp_notif into `n`.
    let r = unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_RECV, &mut n as *mut _) };
    // ENOENT: the caller went away between poll and receive.
    (r == 0).then_some(n)
}

fn respond(listener: BorrowedFd<'_>, id: u64, r: Result<i64, Errno>) {
    let (val, error) = match r {
        Ok(v) => (v, 0),
        Err(e) => (0, -e.raw_os_error()),
    };
    let resp = libc::seccomp_notif_resp { id, val, error, flags: 0 };
    // SAFETY: the ioctl reads the response; ENOENT (the caller went away) needs nothing.
    unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &resp as *const _) };
}

fn handle(shared: &Arc<Shared>, n: &libc::seccomp_notif) {
    let listener = shared.listener.as_fd();
    let p = match call::prepare(shared, n) {
        Ok(p) => p,
        Err(Failure::Errno(e)) => return respond(listener, n.id, Err(e)),
        // Gone, or we could not look at it: never leave a live caller waiting.
        Err(Failure::Gone) => {
            if remote::valid(listener, n.id) {
                respond(listener, n.id, Err(Errno::ACCESS));
            }
            return;
        }
    };
    let call::Prepared { remote, sock, op, caps, may_block } = p;
    let attempt = {
        let Some(_as) = remote::AsCommand::enter(caps) else {
            return respond(listener, n.id, Err(Errno::ACCESS));
        };
        op.attempt(&remote, sock.as_fd(), may_block)
    };
    match attempt {
        call::Attempt::Done(r) => respond(listener, n.id, r),
        call::Attempt::WouldBlock(op, progress) => wait_in_thread(shared, remote, sock, op, progress, caps),
    }
}

/// Perform a call that waits on a thread of the pool, so the supervisor goes on serving the
/// command's other threads meanwhile.
fn wait_in_thread(
    shared: &Arc<Shared>,
    remote: remote::Remote,
    sock: OwnedFd,
    op: call::Op,
    progress: call::Progress,
    caps: [u32; 2],
) {
    let id = remote.id;
    let worker = Arc::clone(shared);
    let job: Job = Box::new(move || {
        register(&worker, id, true);
        let r = {
            let _as = remote::AsCommand::enter(caps);
            op.wait(&remote, sock.as_fd(), progress)
        };
        register(&worker, id, false);
        if let Some(r) = r {
            respond(worker.listener.as_fd(), id, r);
        }
    });
    if !shared.pool.submit(job) {
        respond(shared.listener.as_fd(), id, Err(Errno::AGAIN));
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Threads for calls that wait, kept once made (making one costs more than the call).
#[derive(Default)]
struct Pool {
    state: Mutex<PoolState>,
    ready: Condvar,
}

#[derive(Default)]
struct PoolState {
    queue: std::collections::VecDeque<Job>,
    idle: usize,
    threads: usize,
}

impl Pool {
    /// Queue `job`, making a thread if none is free; false if it can make no more.
    fn submit(self: &Arc<Pool>, job: Job) -> bool {
        let Ok(mut st) = self.state.lock() else { return false };
        if st.idle <= st.queue.len() {
            if st.threads >= MAX_WAITING {
                return false;
            }
            let pool = Arc::clone(self);
            let made = std::thread::Builder::new()
                .name("txbox-waitcall".into())
                .stack_size(128 << 10)
                .spawn(move || pool.work());
            if made.is_err() {
                return false;
            }
            st.threads += 1;
        }
        st.queue.push_back(job);
        self.ready.notify_one();
        true
    }

    fn work(&self) {
        loop {
            let job = {
                let Ok(mut st) = self.state.lock() else { return };
                st.idle += 1;
                while st.queue.is_empty() {
                    st = match self.ready.wait(st) {
                        Ok(st) => st,
                        Err(_) => return,
                    };
                }
                st.idle -= 1;
                st.queue.pop_front()
            };
            if let Some(job) = job {
                job();
            }
        }
    }
}

fn register(shared: &Shared, id: u64, on: bool) {
    if let Ok(mut w) = shared.waiting.lock() {
        if on {
            // SAFETY: pthread_self has no preconditions.
            w.push((id, unsafe { libc::pthread_self() }));
        } else {
            w.retain(|(i, _)| *i != id);
        }
    }
}

/// Interrupt waiting calls whose command's thread is gone (killed, or the transaction ended).
/// Under the lock: a registered thread has not finished, so its id names a live thread.
fn cancel_orphans(shared: &Shared) {
    if let Ok(w) = shared.waiting.lock() {
        for (id, thread) in w.iter() {
            if !remote::valid(shared.listener.as_fd(), *id) {
                // SAFETY: signalling a live thread of this process (see above).
                unsafe { libc::pthread_kill(*thread, CANCEL) };
            }
        }
    }
}

/// The supervisor's process. Started by stage 2 (or the warm server) before it enters the
/// sandbox's namespaces, so it stays in the host's: it can run threads (a process that
/// unshared a pid namespace cannot), the sandbox's pid namespace cannot see it (no signal,
/// ptrace or `/proc/PID` from the command reaches it), and it keeps the rights over the
/// sandbox's processes that it needs to act for them (it owns their user namespace, or is
/// root). It learns init's pid from its parent, takes init's listener, and serves until
/// init exits.
pub(crate) struct Process {
    pid: i32,
    /// Where the parent writes init's pid (in the host's pid namespace).
    init_w: OwnedFd,
}

/// Init's ends of the way it hands its listener to the supervisor: init writes the
/// descriptor's number and waits; the supervisor takes it with `pidfd_getfd` and answers.
pub(crate) struct Handoff {
    number_w: OwnedFd,
    ack_r: OwnedFd,
}

fn pipe() -> Result<(OwnedFd, OwnedFd), StepError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(at("pipe for the socket supervisor"))
}

fn read_u32(fd: &OwnedFd) -> Option<u32> {
    let mut b = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match rustix::io::read(fd, &mut b[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(Errno::INTR) => {}
            Err(_) => return None,
        }
    }
    Some(u32::from_ne_bytes(b))
}

impl Process {
    /// Fork the supervisor. The caller must be single-threaded.
    pub(crate) fn start(sandbox: Sandbox) -> Result<(Process, Handoff), StepError> {
        let (init_r, init_w) = pipe()?;
        let (number_r, number_w) = pipe()?;
        let (ack_r, ack_w) = pipe()?;
        // SAFETY: the caller is single-threaded, so the child may run ordinary code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(StepError::last("fork the socket supervisor"));
        }
        if pid == 0 {
            drop((init_w, number_w, ack_r));
            guard_main(init_r, number_r, ack_w, sandbox);
        }
        Ok((Process { pid, init_w }, Handoff { number_w, ack_r }))
    }

    /// Tell the supervisor which process is the sandbox's init.
    pub(crate) fn watch(&self, init: i32) {
        let _ = rustix::io::write(&self.init_w, &init.to_ne_bytes());
    }

    /// Reap the supervisor (it exits when init has).
    pub(crate) fn wait(self) {
        drop(self.init_w);
        let _ = crate::reap::wait(self.pid);
    }
}

/// The supervisor's process: never returns.
fn guard_main(init_r: OwnedFd, number_r: OwnedFd, ack_w: OwnedFd, sandbox: Sandbox) -> ! {
    // Only our pipes stay open (none of the caller's, nor stage 2's report pipe), and stdio
    // is /dev/null.
    let keep = [init_r.as_raw_fd() as u32, number_r.as_raw_fd() as u32, ack_w.as_raw_fd() as u32];
    let mut sorted = keep;
    sorted.sort_unstable();
    crate::fds::close_from_except(0, &sorted);
    if let Ok(null) = rustix::fs::open("/dev/null", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()) {
        for fd in 0..3 {
            // SAFETY: dup2 onto the stdio numbers, which are closed.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let _ = rustix::thread::set_name(c"txbox-sockets");
    let Some(init) = read_u32(&init_r) else { crate::stage2::exit(0) };
    let Ok(until) = pidfd(init as i32) else { crate::stage2::exit(1) };
    // The host's procfs (for the pids notifications carry), then the sandbox's user and mount
    // namespaces: paths resolve as the command's do (an absolute symlink in the workspace
    // names the sandbox's /tmp, not the host's), and our capabilities are the user namespace
    // owner's, which `AsCommand` can lower to the command's. Still single-threaded here, as
    // `setns` into a user namespace wants; the pid namespace stays the host's, so threads can
    // be made and the sandbox cannot see us.
    let proc = rustix::fs::open("/proc", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty());
    let mut joined = join_namespaces(until.as_fd(), sandbox.userns);
    let listener = read_u32(&number_r).and_then(|n| {
        // SAFETY: pidfd_getfd takes integers and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, until.as_raw_fd(), n as i32, 0) };
        // SAFETY: a new descriptor from pidfd_getfd.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
    });
    joined &= listener.is_some();
    let _ = rustix::io::write(&ack_w, if joined { b"y" } else { b"n" });
    drop((number_r, ack_w));
    if let (true, Some(listener), Ok(proc)) = (joined, listener, proc) {
        supervise(listener, proc, sandbox, until.as_fd());
    }
    crate::stage2::exit(0)
}

impl Handoff {
    /// In init: give `listener` to the supervisor and wait until it has it.
    pub(crate) fn give(self, listener: &OwnedFd) -> Result<(), StepError> {
        let n = (listener.as_raw_fd() as u32).to_ne_bytes();
        rustix::io::write(&self.number_w, &n).map_err(at("hand the listener over"))?;
        let mut b = [0u8; 1];
        match rustix::io::read(&self.ack_r, &mut b) {
            Ok(1) if b[0] == b'y' => Ok(()),
            _ => Err(StepError::new("the socket supervisor could not take over", Errno::PERM)),
        }
    }
}

/// Enter the user (when `userns`) and mount namespaces of the process behind `pidfd`.
fn join_namespaces(pidfd: BorrowedFd<'_>, userns: bool) -> bool {
    let flags = libc::CLONE_NEWNS | if userns { libc::CLONE_NEWUSER } else { 0 };
    // SAFETY: setns with a pidfd and namespace flags; this process is single-threaded.
    unsafe { libc::setns(pidfd.as_raw_fd(), flags) == 0 }
}

/// A pidfd for `pid`.
fn pidfd(pid: i32) -> Result<OwnedFd, Errno> {
    let pid = rustix::process::Pid::from_raw(pid).ok_or(Errno::SRCH)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
}
