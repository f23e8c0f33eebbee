//! The seam between the sandbox's setup order and the kernel (youki's way): [`Kernel`] names
//! each operation stage 2 or a warm server performs, in the words of the step, and their
//! ordered functions (`stage2::start`, `run`, `enter_namespaces`, `init`, `confine`; the warm
//! server's `build`, `fork_init`, `seal_init`, `mount_run`, `reset`, `prepare_child`) are
//! generic over it.
//!
//! - [`Linux`]: the real thing, a zero-sized type whose methods call the syscalls (static
//!   dispatch: the seam costs nothing on the hot path);
//! - `recorder::Recorder` (tests): writes down each operation instead, so the order of the
//!   sandbox's setup, and what depends on it for security, is unit-tested without root.
//!
//! Owns the list of operations; may not decide their order (that is `stage2`'s and
//! `warm::server`'s) nor hold state of its own beyond what the real calls return.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use rustix::process::Resource;
use rustix::thread::UnshareFlags;

use crate::spec::{MountOp, SandboxSpec};
use crate::stage2::{Pins, Status};
use crate::step::{at, at_path, StepError};
use crate::supervisor::{Guard, Handoff, Sandbox};

/// Which side of a fork this process is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fork {
    Child,
    Parent(i32),
}

/// The socket supervisor and init's end of its handoff, when the kernel needs a supervisor.
pub(crate) type Supervised<S, H> = Option<(S, H)>;

/// The kernel operations of stage 2, in the order a cold sandbox first needs them.
pub(crate) trait Kernel {
    /// The socket supervisor's process, and init's end of the listener's handoff.
    type Supervisor;
    type Handoff;
    /// The command's terminal (its slave), while it is handed on.
    type Terminal;

    /// Close every descriptor above 2 but `keep`; the report descriptor closes at exec.
    fn close_inherited(&mut self, keep: &[u32]);
    /// SIGKILL this process when its parent dies.
    fn die_with_parent(&mut self);
    /// Wait for the launcher's go (it has put stage 2 into its cgroups), and close the pipe.
    fn wait_for_go(&mut self);
    /// Start the socket supervisor when the kernel needs one (no Landlock unix scoping).
    fn start_supervisor(
        &mut self,
        spec: &SandboxSpec,
    ) -> Result<Supervised<Self::Supervisor, Self::Handoff>, StepError>;
    fn unshare(&mut self, flags: UnshareFlags) -> Result<(), StepError>;
    /// Write `/proc/self/{setgroups,uid_map,gid_map}`.
    fn write_proc(&mut self, path: &'static str, text: &str) -> Result<(), StepError>;
    fn set_hostname(&mut self);
    fn loopback_up(&mut self) -> Result<(), StepError>;
    /// The counters of packets the new network namespace had no route for (`crate::net`).
    fn net_attempts(&mut self, spec: &SandboxSpec) -> Option<crate::net::Attempts>;
    /// With network by allowlist: listen in the new namespace, hand the listener to the proxy,
    /// set the proxy variables.
    fn hand_over_proxy(&mut self, spec: &SandboxSpec) -> Result<(), StepError>;
    /// Open a host object a later mount may cover.
    fn pin(&mut self, pins: &mut Pins, path: &Path) -> Result<(), StepError>;
    fn mount(&mut self, op: &MountOp, pins: &Pins) -> Result<(), StepError>;
    fn open_terminal(&mut self) -> Result<Self::Terminal, StepError>;
    fn fork(&mut self, step: &'static str) -> Result<Fork, StepError>;
    fn watch_supervisor(&mut self, supervisor: &Self::Supervisor, init: i32);
    fn wait(&mut self, pid: i32) -> Status;
    fn wait_supervisor(&mut self, supervisor: Self::Supervisor);
    /// Lazily unmount the workspace view.
    fn detach(&mut self, path: &Path);
    /// Install the filter that hands `connect` and sends by address to the supervisor, and
    /// give the supervisor its listener.
    fn guard_sockets(&mut self, handoff: Self::Handoff) -> Result<(), StepError>;
    /// No process may read this one's memory or descriptors through /proc.
    fn not_dumpable(&mut self);
    /// In the command's process: a session of its own, the terminal controlling.
    fn take_terminal(&mut self, terminal: Option<&Self::Terminal>) -> Result<(), StepError>;
    /// In a warm server's command process: a process group of its own, in init's session
    /// (which has no terminal: the server left its spawner's session).
    fn own_process_group(&mut self) -> Result<(), StepError>;
    /// In init, once the command has the terminal: init's copy closes.
    fn close_terminal(&mut self, terminal: &Self::Terminal);
    fn set_rlimit(&mut self, resource: Resource, value: u64) -> Result<(), StepError>;
    fn rlimit_max(&mut self, resource: Resource) -> Option<u64>;
    fn oom_score_adj(&mut self);
    /// Remove `cap` from the bounding set.
    fn drop_capability(&mut self, cap: u32) -> Result<(), StepError>;
    fn no_new_privs(&mut self) -> Result<(), StepError>;
    fn landlock(&mut self, spec: &SandboxSpec) -> Result<(), StepError>;
    /// Enforce a ruleset made beforehand (a warm server's, for the view it premounted).
    fn landlock_prepared(&mut self, ruleset: &crate::landlock::Prepared) -> Result<(), StepError>;
    /// The command's seccomp filter (built here when `program` is `None`).
    fn seccomp(&mut self, program: Option<&seccompiler::BpfProgram>) -> Result<(), StepError>;
    /// Default signals, empty mask, enter `cwd`, every descriptor above 2 close-on-exec.
    fn reset_for_exec(&mut self, cwd: &CStr);
    /// Exec the command (never returns on a real kernel; a recorder returns 0).
    fn exec(&mut self, argv: &[CString]) -> i32;
    /// Reap every child until `pid` has ended; its raw status (None: no child left).
    fn reap_until(&mut self, pid: i32) -> Option<i32>;
    /// Write a line on the report pipe.
    fn report(&mut self, line: &str);
    /// Leave at once (never returns on a real kernel).
    fn exit(&mut self, code: i32) -> i32;

    // What only a warm server does (`warm::server`): it keeps handles from before its
    // namespaces, and gives each run the caller's stdio, umask and limits.
    /// A handle on the host's procfs (who a client is), before init's covers it.
    fn host_proc(&mut self) -> Result<OwnedFd, StepError>;
    /// A detached clone of the tree at `path` (`open_tree(OPEN_TREE_CLONE)`).
    fn clone_tree(&mut self, path: &Path) -> Result<OwnedFd, StepError>;
    /// Make `stdio` (open descriptors of this process) its stdin, stdout and stderr.
    fn install_stdio(&mut self, stdio: &[i32]) -> Result<(), StepError>;
    fn umask(&mut self, mask: u32);
    /// The caller's own limit on `resource`, best effort (`None`: unlimited).
    fn caller_rlimit(&mut self, resource: Resource, soft: Option<u64>, hard: Option<u64>);
    /// Join the hostname namespace `ns` (a warm server's init, back in its own before it
    /// makes the next command's).
    fn enter_uts(&mut self, ns: std::os::fd::BorrowedFd<'_>) -> Result<(), StepError>;
}

/// The real kernel.
pub(crate) struct Linux;

impl Kernel for Linux {
    type Supervisor = crate::supervisor::Process;
    type Handoff = Handoff;
    type Terminal = OwnedFd;

    fn close_inherited(&mut self, keep: &[u32]) {
        crate::fds::close_from_except(3, keep);
        let _ = rustix::io::fcntl_setfd(
            // SAFETY: REPORT_FD was installed by the launcher; borrowed only for this call.
            unsafe { rustix::fd::BorrowedFd::borrow_raw(crate::stage2::REPORT_FD) },
            rustix::io::FdFlags::CLOEXEC,
        );
    }

    fn die_with_parent(&mut self) {
        let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    }

    fn wait_for_go(&mut self) {
        let mut b = [0u8; 1];
        // SAFETY: SYNC_FD was installed by the launcher; borrowed only for this read.
        let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(crate::stage2::SYNC_FD) };
        let _ = rustix::io::read(fd, &mut b);
        // SAFETY: closing our own copy of the sync fd; nothing else refers to it.
        unsafe { libc::close(crate::stage2::SYNC_FD) };
    }

    fn start_supervisor(&mut self, spec: &SandboxSpec) -> Result<Option<(Self::Supervisor, Handoff)>, StepError> {
        match Guard::for_kernel() {
            Guard::Supervisor => Ok(Some(crate::supervisor::Process::start(Sandbox {
                workspace: spec.workspace.clone(),
                host_network: spec.host_network,
                userns: spec.userns,
            })?)),
            Guard::Landlock => Ok(None),
        }
    }

    fn unshare(&mut self, flags: UnshareFlags) -> Result<(), StepError> {
        // SAFETY: stage 2 unshares no flag (no CLONE_FILES, CLONE_FS, CLONE_SYSVSEM) that
        // changes state Rust's standard library caches in this single-threaded process.
        unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(at("unshare"))
    }

    fn write_proc(&mut self, path: &'static str, text: &str) -> Result<(), StepError> {
        crate::stage2::write_proc(path, text)
    }

    fn set_hostname(&mut self) {
        let _ = rustix::system::sethostname(b"txbox");
    }

    fn loopback_up(&mut self) -> Result<(), StepError> {
        crate::stage2::loopback_up()
    }

    fn net_attempts(&mut self, spec: &SandboxSpec) -> Option<crate::net::Attempts> {
        crate::net::Attempts::open(spec)
    }

    fn hand_over_proxy(&mut self, spec: &SandboxSpec) -> Result<(), StepError> {
        crate::net::hand_over_listener(spec)?;
        crate::net::apply_env(spec);
        Ok(())
    }

    fn pin(&mut self, pins: &mut Pins, path: &Path) -> Result<(), StepError> {
        pins.open(path)
    }

    fn mount(&mut self, op: &MountOp, pins: &Pins) -> Result<(), StepError> {
        crate::stage2::mount(op, pins)
    }

    fn open_terminal(&mut self) -> Result<OwnedFd, StepError> {
        crate::terminal::open_for_launcher(crate::stage2::PTY_FD)
    }

    fn fork(&mut self, step: &'static str) -> Result<Fork, StepError> {
        // SAFETY: stage 2 and its init are single-threaded (a fresh exec, or a fork of a
        // single-threaded launcher, that started no threads), so the child may run any code.
        match unsafe { libc::fork() } {
            p if p < 0 => Err(StepError::last(step)),
            0 => Ok(Fork::Child),
            p => Ok(Fork::Parent(p)),
        }
    }

    fn watch_supervisor(&mut self, supervisor: &Self::Supervisor, init: i32) {
        supervisor.watch(init);
    }

    fn wait(&mut self, pid: i32) -> Status {
        crate::stage2::wait_for(pid)
    }

    fn wait_supervisor(&mut self, supervisor: Self::Supervisor) {
        supervisor.wait();
    }

    fn detach(&mut self, path: &Path) {
        let _ = rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH);
    }

    fn guard_sockets(&mut self, handoff: Handoff) -> Result<(), StepError> {
        crate::stage2::guard_sockets(handoff)
    }

    fn not_dumpable(&mut self) {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    }

    fn own_process_group(&mut self) -> Result<(), StepError> {
        rustix::process::setpgid(None, None).map_err(at("setpgid"))
    }

    fn take_terminal(&mut self, terminal: Option<&OwnedFd>) -> Result<(), StepError> {
        crate::terminal::take(terminal.map(AsRawFd::as_raw_fd))
    }

    fn close_terminal(&mut self, terminal: &OwnedFd) {
        // SAFETY: closing init's copy of the slave (the OwnedFd in stage 2 is another
        // process's descriptor table entry; this one is init's own, inherited by fork).
        unsafe { libc::close(terminal.as_raw_fd()) };
    }

    fn set_rlimit(&mut self, resource: Resource, value: u64) -> Result<(), StepError> {
        rustix::process::setrlimit(resource, rustix::process::Rlimit { current: Some(value), maximum: Some(value) })
            .map_err(|e| StepError::new(format!("setrlimit {resource:?}"), e))
    }

    fn rlimit_max(&mut self, resource: Resource) -> Option<u64> {
        rustix::process::getrlimit(resource).maximum
    }

    fn oom_score_adj(&mut self) {
        let open_oom = || {
            rustix::fs::open(
                "/proc/self/oom_score_adj",
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
        };
        // This process inherited "not dumpable" from the sandbox's init or the warm server, which
        // gives its /proc files to the namespace's root: a command running as another uid cannot
        // open its own oom_score_adj. Dumpable again only for the write, and only in this process,
        // which holds nothing of the init's and is about to exec (which sets it dumpable anyway).
        let fd = open_oom().or_else(|_| {
            // SAFETY: prctl with integer arguments only.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
            let fd = open_oom();
            // SAFETY: as above.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
            fd
        });
        if let Ok(fd) = fd {
            let _ = rustix::io::write(&fd, b"1000");
        }
    }

    fn drop_capability(&mut self, cap: u32) -> Result<(), StepError> {
        // SAFETY: PR_CAPBSET_DROP with a capability number; no pointers involved.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        let e = crate::stage2::errno();
        if r != 0 && e != libc::EINVAL {
            return Err(StepError::new(format!("drop capability {cap}"), rustix::io::Errno::from_raw_os_error(e)));
        }
        Ok(())
    }

    fn no_new_privs(&mut self) -> Result<(), StepError> {
        // SAFETY: prctl with integer arguments only; sets a flag on the calling thread.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(StepError::last("no_new_privs"));
        }
        Ok(())
    }

    fn landlock(&mut self, spec: &SandboxSpec) -> Result<(), StepError> {
        crate::landlock::apply(&crate::landlock::LandlockPlan::for_spec(spec))
            .map(|_| ())
            .map_err(|e| StepError::new(format!("landlock: {e}"), rustix::io::Errno::PERM))
    }

    fn landlock_prepared(&mut self, ruleset: &crate::landlock::Prepared) -> Result<(), StepError> {
        ruleset.enforce().map_err(at("landlock: enforce the prepared ruleset"))
    }

    fn seccomp(&mut self, program: Option<&seccompiler::BpfProgram>) -> Result<(), StepError> {
        match program {
            Some(program) => crate::seccomp::install(program),
            None => crate::seccomp::apply(),
        }
        .map_err(|e| StepError::new(format!("seccomp: {e}"), rustix::io::Errno::PERM))
    }

    fn reset_for_exec(&mut self, cwd: &CStr) {
        crate::stage2::reset_for_exec(cwd);
    }

    fn exec(&mut self, argv: &[CString]) -> i32 {
        crate::stage2::execute(&crate::stage2::nul_terminated(argv), None)
    }

    fn reap_until(&mut self, pid: i32) -> Option<i32> {
        crate::reap::reap_until(pid)
    }

    fn report(&mut self, line: &str) {
        crate::stage2::report(line);
    }

    fn exit(&mut self, code: i32) -> i32 {
        crate::stage2::exit(code)
    }

    fn host_proc(&mut self) -> Result<OwnedFd, StepError> {
        use rustix::fs::{Mode, OFlags};
        rustix::fs::open("/proc", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(at("open the host's /proc"))
    }

    fn clone_tree(&mut self, path: &Path) -> Result<OwnedFd, StepError> {
        use rustix::mount::OpenTreeFlags;
        rustix::mount::open_tree(
            rustix::fs::CWD,
            path,
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .map_err(at_path("clone", path))
    }

    fn install_stdio(&mut self, stdio: &[i32]) -> Result<(), StepError> {
        // SAFETY: called in the warm server's freshly cloned command process (its own fd
        // table), with descriptors the server holds open for the run.
        if !unsafe { crate::launch::install_fds(&[(stdio[0], 0), (stdio[1], 1), (stdio[2], 2)]) } {
            return Err(StepError::last("install stdio"));
        }
        Ok(())
    }

    fn umask(&mut self, mask: u32) {
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(mask));
    }

    fn caller_rlimit(&mut self, resource: Resource, soft: Option<u64>, hard: Option<u64>) {
        let _ = rustix::process::setrlimit(resource, rustix::process::Rlimit { current: soft, maximum: hard });
    }

    fn enter_uts(&mut self, ns: std::os::fd::BorrowedFd<'_>) -> Result<(), StepError> {
        rustix::thread::move_into_link_name_space(ns, Some(rustix::thread::LinkNameSpaceType::HostNameAndNISDomainName))
            .map_err(at("setns UTS"))
    }
}

/// A kernel that writes down what it is asked, for the order tests of stage 2 and the warm
/// server.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod recorder {
    use std::collections::VecDeque;

    use super::*;

    /// A kernel that writes down what stage 2 asks of it. Forks follow the side `forks` says
    /// (the child when it runs out), so one run walks one process's whole path; a step named
    /// in `fail` fails with EPERM.
    #[derive(Default)]
    pub(crate) struct Recorder {
        pub(crate) ops: Vec<String>,
        pub(crate) forks: VecDeque<Fork>,
        pub(crate) supervisor: bool,
        pub(crate) fail: Option<&'static str>,
    }

    impl Recorder {
        fn note(&mut self, op: impl Into<String>) -> Result<(), StepError> {
            let op = op.into();
            let failed = self.fail.is_some_and(|f| op.starts_with(f));
            self.ops.push(op);
            if failed {
                return Err(StepError::new("recorded failure", rustix::io::Errno::PERM));
            }
            Ok(())
        }
        fn ok(&mut self, op: impl Into<String>) {
            let _ = self.note(op);
        }
    }

    impl Kernel for Recorder {
        type Supervisor = ();
        type Handoff = ();
        type Terminal = ();

        fn close_inherited(&mut self, keep: &[u32]) {
            self.ok(format!("close_inherited {keep:?}"));
        }
        fn die_with_parent(&mut self) {
            self.ok("die_with_parent");
        }
        fn wait_for_go(&mut self) {
            self.ok("wait_for_go");
        }
        fn start_supervisor(&mut self, _: &SandboxSpec) -> Result<Option<((), ())>, StepError> {
            self.note("start_supervisor")?;
            Ok(self.supervisor.then_some(((), ())))
        }
        fn unshare(&mut self, flags: UnshareFlags) -> Result<(), StepError> {
            self.note(format!("unshare {flags:?}"))
        }
        fn write_proc(&mut self, path: &'static str, text: &str) -> Result<(), StepError> {
            self.note(format!("write {path} {text}"))
        }
        fn set_hostname(&mut self) {
            self.ok("hostname");
        }
        fn loopback_up(&mut self) -> Result<(), StepError> {
            self.note("loopback")
        }
        fn net_attempts(&mut self, _: &SandboxSpec) -> Option<crate::net::Attempts> {
            self.ok("net_attempts");
            None
        }
        fn hand_over_proxy(&mut self, spec: &SandboxSpec) -> Result<(), StepError> {
            self.note(format!("hand_over_proxy {:?}", spec.proxy_port))
        }
        fn pin(&mut self, _: &mut Pins, path: &Path) -> Result<(), StepError> {
            self.note(format!("pin {}", path.display()))
        }
        fn mount(&mut self, op: &MountOp, _: &Pins) -> Result<(), StepError> {
            self.note(format!("mount {op:?}"))
        }
        fn open_terminal(&mut self) -> Result<(), StepError> {
            self.note("open_terminal")
        }
        fn fork(&mut self, step: &'static str) -> Result<Fork, StepError> {
            self.note(step)?;
            Ok(self.forks.pop_front().unwrap_or(Fork::Child))
        }
        fn watch_supervisor(&mut self, _: &(), init: i32) {
            self.ok(format!("watch_supervisor {init}"));
        }
        fn wait(&mut self, pid: i32) -> Status {
            self.ok(format!("wait {pid}"));
            Status::Exited(0)
        }
        fn wait_supervisor(&mut self, _: ()) {
            self.ok("wait_supervisor");
        }
        fn detach(&mut self, path: &Path) {
            self.ok(format!("detach {}", path.display()));
        }
        fn guard_sockets(&mut self, _: ()) -> Result<(), StepError> {
            self.note("guard_sockets")
        }
        fn not_dumpable(&mut self) {
            self.ok("not_dumpable");
        }
        fn own_process_group(&mut self) -> Result<(), StepError> {
            self.note("own_process_group")
        }
        fn take_terminal(&mut self, t: Option<&()>) -> Result<(), StepError> {
            self.note(format!("take_terminal {}", t.is_some()))
        }
        fn close_terminal(&mut self, _: &()) {
            self.ok("close_terminal");
        }
        fn set_rlimit(&mut self, resource: Resource, value: u64) -> Result<(), StepError> {
            self.note(format!("setrlimit {resource:?} {value}"))
        }
        fn rlimit_max(&mut self, _: Resource) -> Option<u64> {
            None
        }
        fn oom_score_adj(&mut self) {
            self.ok("oom_score_adj");
        }
        fn drop_capability(&mut self, cap: u32) -> Result<(), StepError> {
            self.note(format!("drop_capability {cap}"))
        }
        fn no_new_privs(&mut self) -> Result<(), StepError> {
            self.note("no_new_privs")
        }
        fn landlock(&mut self, _: &SandboxSpec) -> Result<(), StepError> {
            self.note("landlock")
        }
        fn landlock_prepared(&mut self, _: &crate::landlock::Prepared) -> Result<(), StepError> {
            self.note("landlock prepared")
        }
        fn seccomp(&mut self, _: Option<&seccompiler::BpfProgram>) -> Result<(), StepError> {
            self.note("seccomp")
        }
        fn reset_for_exec(&mut self, cwd: &CStr) {
            self.ok(format!("reset_for_exec {}", cwd.to_string_lossy()));
        }
        fn exec(&mut self, argv: &[CString]) -> i32 {
            self.ok(format!("exec {argv:?}"));
            0
        }
        fn reap_until(&mut self, pid: i32) -> Option<i32> {
            self.ok(format!("reap_until {pid}"));
            Some(0)
        }
        fn report(&mut self, line: &str) {
            self.ok(format!("report {}", line.trim_end()));
        }
        fn exit(&mut self, code: i32) -> i32 {
            self.ok(format!("exit {code}"));
            code
        }
        fn host_proc(&mut self) -> Result<OwnedFd, StepError> {
            self.note("host_proc")?;
            Ok(harmless())
        }
        fn clone_tree(&mut self, path: &Path) -> Result<OwnedFd, StepError> {
            self.note(format!("clone {}", path.display()))?;
            Ok(harmless())
        }
        fn install_stdio(&mut self, stdio: &[i32]) -> Result<(), StepError> {
            self.note(format!("install_stdio {stdio:?}"))
        }
        fn umask(&mut self, mask: u32) {
            self.ok(format!("umask {mask:o}"));
        }
        fn caller_rlimit(&mut self, resource: Resource, soft: Option<u64>, hard: Option<u64>) {
            self.ok(format!("caller_rlimit {resource:?} {soft:?} {hard:?}"));
        }
        fn enter_uts(&mut self, _: std::os::fd::BorrowedFd<'_>) -> Result<(), StepError> {
            self.note("enter_uts")
        }
    }

    /// A descriptor to stand for one the real kernel would open (`/`, as a path only).
    fn harmless() -> OwnedFd {
        rustix::fs::open("/", rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .unwrap()
    }

    /// What a recorder wrote down (on one path through stage 2, with `of`), and lookups into it.
    pub(crate) struct Trace(pub(crate) Vec<String>);

    impl Trace {
        pub(crate) fn of(mut k: Recorder, spec: &SandboxSpec) -> (Trace, i32) {
            let code = crate::stage2::start(&mut k, spec);
            (Trace(k.ops), code)
        }
        /// Index of the first op starting with `p`.
        pub(crate) fn first(&self, p: &str) -> usize {
            self.0.iter().position(|o| o.starts_with(p)).unwrap_or_else(|| panic!("no {p:?} in {:#?}", self.0))
        }
        pub(crate) fn last(&self, p: &str) -> usize {
            self.0.iter().rposition(|o| o.starts_with(p)).unwrap_or_else(|| panic!("no {p:?} in {:#?}", self.0))
        }
        pub(crate) fn has(&self, p: &str) -> bool {
            self.0.iter().any(|o| o.starts_with(p))
        }
        /// Every op starting with `a` comes before every op starting with `b`.
        pub(crate) fn before(&self, a: &str, b: &str) {
            assert!(self.last(a) < self.first(b), "{a:?} must come before {b:?}: {:#?}", self.0);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::ffi::OsString;
    use std::path::PathBuf;

    use super::recorder::{Recorder, Trace};
    use super::*;

    /// A root run (no user namespace) with everything on: limits, a terminal, the supervisor,
    /// a secret hidden inside the workspace and one outside.
    fn spec() -> SandboxSpec {
        let mut s = SandboxSpec::new(
            PathBuf::from("/work/repo"),
            PathBuf::from("/state/tx/upper"),
            PathBuf::from("/state/tx/work"),
            vec![OsString::from("make"), OsString::from("test")],
        );
        s.userns = false;
        s.sync = true;
        s.terminal = true;
        s.cpu_seconds = Some(10);
        s.max_procs = Some(100);
        s.hide = vec![PathBuf::from("/work/repo/.env"), PathBuf::from("/root/.ssh")];
        s
    }

    /// The command's path: stage 2, then (child) init, then (child) the command.
    fn command_path(spec: &SandboxSpec) -> Trace {
        let (t, code) = Trace::of(Recorder { supervisor: true, ..Recorder::default() }, spec);
        assert_eq!(code, 0);
        t
    }

    #[test]
    fn nothing_inherited_survives_and_the_launcher_attaches_limits_first() {
        let t = command_path(&spec());
        assert_eq!(t.0[0], "close_inherited [3, 4, 5]");
        t.before("close_inherited", "die_with_parent");
        // Stage 2 waits to be in its cgroups before it forks anything (supervisor, init).
        t.before("wait_for_go", "start_supervisor");
        t.before("wait_for_go", "fork init");
    }

    #[test]
    fn the_supervisor_starts_in_the_hosts_namespaces() {
        let t = command_path(&spec());
        t.before("start_supervisor", "unshare");
    }

    #[test]
    fn namespaces_then_ids_then_the_mount_plan() {
        let mut s = spec();
        s.userns = true;
        s.uid = 1000;
        s.gid = 1000;
        let t = command_path(&s);
        t.before("unshare", "write /proc/self/setgroups");
        // setgroups must be denied before an unprivileged process may write gid_map.
        t.before("write /proc/self/setgroups", "write /proc/self/gid_map");
        t.before("write /proc/self/uid_map", "write /proc/self/gid_map");
        t.before("write /proc/self/gid_map", "mount");
        t.before("loopback", "mount");
        // Every host object a mount may cover is opened before the first mount.
        t.before("pin", "mount");
        // The user namespace's owner keeps its capabilities: nothing to drop.
        assert!(!t.has("drop_capability"));
    }

    #[test]
    fn the_proxy_listens_in_the_new_namespace_before_the_view_is_built() {
        let mut s = spec();
        s.proxy_port = Some(3128);
        let t = command_path(&s);
        assert_eq!(t.0[0], format!("close_inherited [3, 4, 5, {}]", crate::net::NET_FD));
        t.before("unshare", "net_attempts");
        t.before("unshare", "hand_over_proxy Some(3128)");
        t.before("hand_over_proxy", "mount");
    }

    #[test]
    fn secrets_hidden_and_host_read_only_before_anything_runs_in_the_view() {
        let s = spec();
        let t = command_path(&s);
        for h in &s.hide {
            let hide = t.first(&format!("mount Hide {{ target: {h:?} }}"));
            assert!(hide < t.first("open_terminal") && hide < t.first("fork init"), "{:#?}", t.0);
            // A secret inside the workspace is covered after the workspace's overlay.
            assert!(t.first("mount Overlay") < hide);
        }
        t.before("mount ReadOnlyRoot", "fork init");
        t.before("mount ReadOnlyRoot", "mount Hide");
        // Init's own mounts (/proc and its read-only knobs) come before the command forks.
        t.before("mount Proc", "fork command");
        t.before("mount ReadOnlyBind", "fork command");
    }

    #[test]
    fn the_socket_filter_is_in_place_before_the_command_and_init_is_sealed() {
        let t = command_path(&spec());
        // Inherited by the command: installed (and the listener handed over) before its fork.
        t.before("guard_sockets", "fork command");
        // Init becomes undumpable only after the supervisor took the listener from it.
        t.before("guard_sockets", "not_dumpable");
        t.before("not_dumpable", "fork command");
    }

    #[test]
    fn confinement_order_in_the_command() {
        let t = command_path(&spec());
        t.before("fork command", "take_terminal");
        t.before("take_terminal", "setrlimit");
        t.before("setrlimit", "landlock");
        t.before("oom_score_adj", "drop_capability");
        // Capabilities go before the filters that would refuse prctl, and with 26 of them.
        assert_eq!(t.0.iter().filter(|o| o.starts_with("drop_capability")).count(), 26);
        t.before("drop_capability", "no_new_privs");
        t.before("no_new_privs", "landlock");
        t.before("no_new_privs", "seccomp");
        t.before("landlock", "seccomp");
        // seccomp refuses mount and friends: every mount is done when it goes in.
        t.before("mount", "seccomp");
    }

    #[test]
    fn seccomp_is_last_and_descriptors_close_before_exec() {
        let t = command_path(&spec());
        let exec = t.first("exec");
        assert_eq!(t.0[exec], "exec [\"make\", \"test\"]");
        assert_eq!(t.0[exec - 1], "reset_for_exec /work/repo");
        assert_eq!(t.0[exec - 2], "seccomp", "seccomp is the last step before exec: {:#?}", t.0);
        // After exec only the recorder's returns remain (a real exec does not return).
        assert!(t.0[exec + 1..].iter().all(|o| o.starts_with("exit")), "{:#?}", t.0);
    }

    #[test]
    fn limits_are_set_and_nproc_only_lowered() {
        let t = command_path(&spec());
        for l in ["setrlimit Cpu 10", "setrlimit Core 0", "setrlimit Nproc 100"] {
            assert!(t.has(l), "{l}: {:#?}", t.0);
        }
        assert!(!t.has("setrlimit Fsize"));
    }

    #[test]
    fn stage2_waits_for_init_and_the_supervisor_then_detaches_the_view() {
        let k = Recorder { supervisor: true, forks: [Fork::Parent(42)].into(), ..Recorder::default() };
        let (t, code) = Trace::of(k, &spec());
        assert_eq!(code, 0);
        let tail: Vec<&str> = t.0[t.first("fork init") + 1..].iter().map(String::as_str).collect();
        assert_eq!(tail, ["watch_supervisor 42", "wait 42", "wait_supervisor", "detach /work/repo"]);
    }

    #[test]
    fn init_hands_the_terminal_on_reaps_and_reports() {
        let k = Recorder { forks: [Fork::Child, Fork::Parent(7)].into(), ..Recorder::default() };
        let (t, _) = Trace::of(k, &spec());
        let tail: Vec<&str> = t.0[t.first("fork command") + 1..].iter().map(String::as_str).collect();
        assert_eq!(tail, ["close_terminal", "reap_until 7", "report exit 0", "exit 0"]);
    }

    #[test]
    fn a_failed_step_stops_the_setup_and_is_reported() {
        let k = Recorder { fail: Some("landlock"), ..Recorder::default() };
        let (t, _) = Trace::of(k, &spec());
        assert!(!t.has("seccomp") && !t.has("exec"), "{:#?}", t.0);
        let report = t.first("report error sandbox setup failed at `recorded failure`");
        assert_eq!(t.0[report + 1], "exit 125", "{:#?}", t.0);
        // Before any fork: stage 2 itself reports and gives 125.
        let (t, code) = Trace::of(Recorder { fail: Some("unshare"), ..Recorder::default() }, &spec());
        assert_eq!(code, 125);
        assert!(!t.has("mount") && !t.has("fork"), "{:#?}", t.0);
    }
}
