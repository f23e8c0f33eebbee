//! The stage-2 helper: runs in a freshly exec'd `txbox __stage2`, builds the sandbox, runs the
//! command, and reports on fd 3. Single-threaded by construction, so `fork` here is safe.
//!
//! Process tree:
//! ```text
//! txbox (host)  ── stage-2 S: unshare, maps, mounts ── init I (pid 1): /proc, reaps
//!                  then supervises sockets              └─ command C (pid 2): exec
//! ```
//! I reports C's wait status on the report pipe and exits; the kernel then kills whatever C
//! left behind in the pid namespace, so no process of the command survives it. I installs
//! the socket filter that every process of the sandbox inherits; S, outside the sandbox's pid
//! namespace, performs the calls it notifies (`crate::supervisor`) until I exits.

use std::ffi::{CStr, CString, OsString};
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::thread::UnshareFlags;

use crate::spec::{overlay_options, MountOp, MountPlan, SandboxSpec, EMPTY_FILE};
use crate::supervisor::{Guard, Handoff, Sandbox};
use crate::warm::wire::Report;

/// The fd on which stage 2 reports to its parent (set up by the launcher).
pub const REPORT_FD: i32 = 3;
/// The fd on which stage 2 waits for the launcher's go (when `spec.sync`).
pub const SYNC_FD: i32 = 4;
/// The fd on which stage 2 sends the launcher the master of the command's terminal (when
/// `spec.terminal`).
pub const PTY_FD: i32 = 5;

/// A step of building the sandbox failed: which step, and the errno it got.
#[derive(Debug)]
pub(crate) struct StepError {
    pub(crate) step: String,
    pub(crate) errno: rustix::io::Errno,
}

pub(crate) fn at(step: impl Into<String>) -> impl FnOnce(rustix::io::Errno) -> StepError {
    let step = step.into();
    move |errno| StepError { step, errno }
}

fn report(line: &str) {
    // SAFETY: REPORT_FD was installed by the launcher and stays open for this process's life;
    // ManuallyDrop keeps us from closing it.
    let mut f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(REPORT_FD) });
    let _ = f.write_all(line.as_bytes());
}

/// Entry point of `txbox __stage2 ARGS`. Never returns.
pub fn main(args: &[OsString]) -> ! {
    match SandboxSpec::from_args(args) {
        Ok(spec) => run_spec(&spec),
        Err(e) => {
            report(&Report::Error(e.to_string()).line());
            exit(125)
        }
    }
}

/// Build the sandbox for `spec` and run its command; the process exits with stage 2's code.
/// Reached either through `main` (re-exec) or straight after the launcher's fork.
pub fn run_spec(spec: &SandboxSpec) -> ! {
    // Nothing the caller left open stays here (and so reaches init or the command): only the
    // descriptors the launcher installed.
    let mut keep = vec![REPORT_FD as u32];
    if spec.sync {
        keep.push(SYNC_FD as u32);
    }
    if spec.terminal {
        keep.push(PTY_FD as u32);
    }
    if spec.proxy_port.is_some() {
        keep.push(crate::net::NET_FD as u32);
    }
    crate::fds::close_from_except(3, &keep);
    // The report fd must not leak into the command.
    let _ = rustix::io::fcntl_setfd(
        // SAFETY: REPORT_FD was installed by the launcher; borrowed only for this call.
        unsafe { rustix::fd::BorrowedFd::borrow_raw(REPORT_FD) },
        rustix::io::FdFlags::CLOEXEC,
    );
    // If txbox dies, so do we (and with us, through pid 1, the whole sandbox).
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    match run(spec) {
        Ok(code) => exit(code),
        Err(e) => {
            report(&Report::Error(setup_failed(&e)).line());
            exit(125)
        }
    }
}

/// Leave without running exit handlers or flushing stdio buffers: after the launcher's fork
/// those buffers are the parent's, and flushing them here would print its output twice.
pub(crate) fn exit(code: i32) -> ! {
    // SAFETY: _exit ends the process at once; nothing of ours needs unwinding.
    unsafe { libc::_exit(code) }
}

/// What a failed step says: `sandbox setup failed at `STEP`: ERRNO (HINT)`. The report line of
/// a failed sandbox is `error ` + this; a warm server refusing a run says it as its reason.
pub(crate) fn setup_failed(e: &StepError) -> String {
    format!("sandbox setup failed at `{}`: {}", e.step, hint(e))
}

/// The error number of a failed step, with what to do about it when that is known.
pub(crate) fn hint(e: &StepError) -> String {
    let base = format!("{} (errno {})", e.errno, e.errno.raw_os_error());
    if e.step.starts_with("unshare") && matches!(e.errno, rustix::io::Errno::PERM | rustix::io::Errno::NOSPC) {
        return format!(
            "{base}; unprivileged user namespaces look disabled: enable them with \
             `sysctl -w kernel.unprivileged_userns_clone=1` / `user.max_user_namespaces=15000`, or on \
             Ubuntu `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (see `txbox doctor`)"
        );
    }
    if e.step.starts_with("mount overlay") {
        return format!(
            "{base}; overlayfs in a user namespace needs Linux ≥ 5.11 and an upper filesystem with user xattrs"
        );
    }
    base
}

/// Build the sandbox and run the command in it. Returns stage 2's own exit code.
/// The order of these steps is the documentation.
fn run(spec: &SandboxSpec) -> Result<i32, StepError> {
    let plan = MountPlan::for_spec(spec);
    // 0. Wait until the launcher has put us into our cgroups, so no child escapes the limits.
    if spec.sync {
        let mut b = [0u8; 1];
        // SAFETY: SYNC_FD was installed by the launcher; borrowed only for this read.
        let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(SYNC_FD) };
        let _ = rustix::io::read(fd, &mut b);
        // SAFETY: closing our own copy of the sync fd; nothing else refers to it.
        unsafe { libc::close(SYNC_FD) };
    }
    // 1. What keeps host unix sockets out of reach (crate::supervisor): with the supervisor,
    //    its process, started before the namespaces so that it stays in the host's.
    let supervisor = match Guard::for_kernel() {
        Guard::Supervisor => Some(crate::supervisor::Process::start(Sandbox {
            workspace: spec.workspace.clone(),
            host_network: spec.host_network,
            userns: spec.userns,
        })?),
        Guard::Landlock => None,
    };
    // 1-2. New namespaces, the caller's ids mapped to themselves, loopback up; the proxy's
    //      listener handed out, the proxy variables set (network by allowlist, `crate::net`).
    enter_namespaces(spec)?;
    let mut attempts = crate::net::Attempts::open(spec);
    crate::net::hand_over_listener(spec)?;
    crate::net::apply_env(spec);
    // 3. Open every host object a later mount may cover (a workspace below /tmp, /dev/null),
    //    then run the mount plan.
    let mut pins = Pins::default();
    for p in plan.sources() {
        pins.open(&p)?;
    }
    for op in &plan.namespace {
        mount(op, &pins)?;
    }
    drop(pins);
    // 3b. The command's own terminal, in the sandbox's devpts, its master for the launcher to
    //     relay (when the caller has a terminal: the command never gets the caller's).
    let terminal = if spec.terminal { Some(crate::terminal::open_for_launcher(PTY_FD)?) } else { None };
    // 4. The pid namespace's init.
    // SAFETY: this process is single-threaded (a fresh exec, or a fork of a single-threaded
    // launcher, that started no threads), so the child may run arbitrary code after fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(StepError { step: "fork init".into(), errno: rustix::io::Errno::from_raw_os_error(errno()) });
    }
    let (supervisor, handoff) = supervisor.map_or((None, None), |(p, h)| (Some(p), Some(h)));
    if pid == 0 {
        let code = match init(spec, &plan, terminal.as_ref(), handoff) {
            Ok(c) => c,
            Err(e) => {
                report(&Report::Error(setup_failed(&e)).line());
                125
            }
        };
        exit(code);
    }
    drop((terminal, handoff));
    // 5. Wait for init; its exit means the whole pid namespace is gone. The supervisor serves
    //    init's filter meanwhile, and leaves with it. Then say whether the command tried to
    //    reach the network it does not have.
    if let Some(s) = &supervisor {
        s.watch(pid);
    }
    let status = wait_for(pid);
    if let Some(s) = supervisor {
        s.wait();
    }
    if let Some(a) = attempts.as_mut() {
        report(&a.since_last());
    }
    // 6. Unmount the workspace view now rather than when the namespace is torn down, so the
    //    upper layer is quiescent before txbox classifies it.
    let _ = rustix::mount::unmount(spec.workspace.as_path(), UnmountFlags::DETACH);
    Ok(match status {
        Status::Exited(c) => c,
        Status::Signaled => 125,
    })
}

/// Steps 1 and 2 of every sandbox (cold or warm): new namespaces, ids, hostname, loopback.
pub(crate) fn enter_namespaces(spec: &SandboxSpec) -> Result<(), StepError> {
    // 1. New namespaces: mounts, pids, network (loopback only), IPC, hostname, cgroup view.
    //    Without root, a user namespace gives us the right to do the rest.
    let mut flags = UnshareFlags::NEWNS
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWIPC
        | UnshareFlags::NEWUTS
        | UnshareFlags::NEWCGROUP;
    if !spec.host_network {
        flags |= UnshareFlags::NEWNET;
    }
    if spec.userns {
        flags |= UnshareFlags::NEWUSER;
    }
    // SAFETY: none of these flags (no CLONE_FILES, CLONE_FS, CLONE_SYSVSEM) changes state that
    // Rust's standard library caches in this single-threaded process.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(at("unshare"))?;
    // 2. Map the invoking user and group to themselves: files the command creates belong to
    //    the caller, and the command sees its own uid.
    if spec.userns {
        write_proc("/proc/self/setgroups", "deny")?;
        write_proc("/proc/self/uid_map", &format!("{0} {0} 1", spec.uid))?;
        write_proc("/proc/self/gid_map", &format!("{0} {0} 1", spec.gid))?;
    }
    let _ = rustix::system::sethostname(b"txbox");
    if !spec.host_network {
        loopback_up()?;
    }
    Ok(())
}

/// Host objects opened before the first mount, named through `/proc/self/fd` afterwards.
#[derive(Default)]
pub(crate) struct Pins(std::collections::HashMap<std::path::PathBuf, rustix::fd::OwnedFd>);

impl Pins {
    /// An object opened elsewhere (a warm server gets the layers from its client).
    pub(crate) fn insert(&mut self, p: std::path::PathBuf, fd: rustix::fd::OwnedFd) {
        self.0.insert(p, fd);
    }

    pub(crate) fn open(&mut self, p: &std::path::Path) -> Result<(), StepError> {
        if self.0.contains_key(p) {
            return Ok(());
        }
        match rustix::fs::open(p, rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty()) {
            Ok(fd) => {
                self.0.insert(p.to_path_buf(), fd);
                Ok(())
            }
            // A device the host lacks (no /dev/tty in some containers) is simply not offered.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NXIO) if p.starts_with("/dev") => Ok(()),
            Err(e) => Err(at(format!("open {}", p.display()))(e)),
        }
    }

    /// The `/proc/self/fd/N` name of a pinned object (None: not available on this host).
    fn name(&self, p: &std::path::Path) -> Option<std::path::PathBuf> {
        use std::os::fd::AsRawFd;
        self.0.get(p).map(|fd| std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())))
    }
}

/// `ifconfig lo up` in the new network namespace: loopback works, nothing else exists.
fn loopback_up() -> Result<(), StepError> {
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq whose name we fill in; the fd is
    // closed before returning.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(StepError {
                step: "socket for loopback".into(),
                errno: rustix::io::Errno::from_raw_os_error(errno()),
            });
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        let r = libc::ioctl(sock, libc::SIOCSIFFLAGS, &ifr);
        let e = errno();
        libc::close(sock);
        if r < 0 {
            return Err(StepError { step: "bring loopback up".into(), errno: rustix::io::Errno::from_raw_os_error(e) });
        }
    }
    Ok(())
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

fn mount_setattr(target: &std::path::Path, recursive: bool, set: u64, clr: u64) -> Result<(), StepError> {
    let c = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| StepError { step: "mount_setattr path".into(), errno: rustix::io::Errno::INVAL })?;
    let attr = MountAttr { attr_set: set, attr_clr: clr, propagation: 0, userns_fd: 0 };
    let flags = if recursive { libc::AT_RECURSIVE as libc::c_uint } else { 0 };
    // SAFETY: valid NUL-terminated path and a properly sized, initialised mount_attr.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(StepError {
            step: format!("mount_setattr {}", target.display()),
            errno: rustix::io::Errno::from_raw_os_error(errno()),
        });
    }
    Ok(())
}

pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn write_proc(path: &str, text: &str) -> Result<(), StepError> {
    std::fs::write(path, text).map_err(|e| StepError {
        step: format!("write {path}"),
        errno: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
    })
}

fn mkdir_p(p: &std::path::Path) {
    let _ = std::fs::create_dir_all(p);
}

pub(crate) fn mount(op: &MountOp, pins: &Pins) -> Result<(), StepError> {
    use rustix::mount::mount as mnt;
    match op {
        MountOp::PrivateRoot => {
            rustix::mount::mount_change("/", MountPropagationFlags::PRIVATE | MountPropagationFlags::REC)
                .map_err(at("make / private"))
        }
        MountOp::Tmpfs { target, mode } => {
            mkdir_p(target);
            let data = CString::new(format!("mode={mode:o}"))
                .map_err(|_| StepError { step: "tmpfs options".into(), errno: rustix::io::Errno::INVAL })?;
            mnt("tmpfs", target.as_path(), "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, Some(data.as_c_str()))
                .map_err(at(format!("mount tmpfs on {}", target.display())))
        }
        MountOp::Overlay { target, lowers, upper, work } => {
            let via = |p: &std::path::PathBuf| pins.name(p).unwrap_or_else(|| p.clone());
            let lowers: Vec<std::path::PathBuf> = lowers.iter().map(via).collect();
            let opts = overlay_options(&lowers, via(upper).as_os_str(), via(work).as_os_str());
            let opts = CString::new(opts.as_bytes())
                .map_err(|_| StepError { step: "overlay options".into(), errno: rustix::io::Errno::INVAL })?;
            mkdir_p(target);
            // nosuid, nodev: a command running as root must not make a device node or a
            // setuid binary in the workspace and use it.
            mnt("overlay", target.as_path(), "overlay", MountFlags::NOSUID | MountFlags::NODEV, Some(opts.as_c_str()))
                .map_err(at(format!("mount overlay on {}", target.display())))
        }
        MountOp::ReadOnlyRoot => mount_setattr(std::path::Path::new("/"), true, MOUNT_ATTR_RDONLY, 0),
        MountOp::Writable { target } => {
            if std::fs::symlink_metadata(target).is_err() {
                return Ok(());
            }
            mount_setattr(target, false, 0, MOUNT_ATTR_RDONLY)
        }
        MountOp::ReadOnly { target } => mount_setattr(target, false, MOUNT_ATTR_RDONLY, 0),
        MountOp::Bind { source, target } => {
            let Some(src) = pins.name(source) else { return Ok(()) };
            let _ = std::fs::File::create(target);
            mnt(src.as_path(), target.as_path(), "", MountFlags::BIND, None)
                .map_err(at(format!("bind {}", target.display())))
        }
        MountOp::BindDir { source, target } => {
            let Some(src) = pins.name(source) else { return Ok(()) };
            // The target must be a directory already (made by the launcher, never here: this
            // mount namespace shares the host's filesystems).
            if !std::fs::symlink_metadata(target).is_ok_and(|m| m.is_dir()) {
                return Ok(());
            }
            mnt(src.as_path(), target.as_path(), "", MountFlags::BIND, None)
                .map_err(at(format!("bind cache {}", target.display())))?;
            mount_setattr(target, false, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0)
        }
        MountOp::Devpts { target } => {
            mkdir_p(target);
            mnt(
                "devpts",
                target.as_path(),
                "devpts",
                MountFlags::NOSUID | MountFlags::NOEXEC,
                Some(c"newinstance,ptmxmode=0666,mode=620"),
            )
            .map_err(at(format!("mount devpts on {}", target.display())))
        }
        MountOp::Symlink { target, points_to } => match std::os::unix::fs::symlink(points_to, target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(StepError {
                step: format!("symlink {}", target.display()),
                errno: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
            }),
        },
        MountOp::Hide { target } => {
            // Where a symlink points: the mount lands there, and must be of its kind.
            let Ok(md) = std::fs::metadata(target) else { return Ok(()) };
            if md.is_dir() {
                mnt(
                    "tmpfs",
                    target.as_path(),
                    "tmpfs",
                    MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                    Some(c"mode=000,size=4k"),
                )
                .map_err(at(format!("hide {}", target.display())))
            } else {
                // A file: an empty file over it, read-only. (Not /dev/null: a device node on a
                // read-only mount still accepts writes, which would look like success.)
                let empty = std::path::Path::new(EMPTY_FILE);
                mnt(empty, target.as_path(), "", MountFlags::BIND, None)
                    .map_err(at(format!("hide {}", target.display())))?;
                mount_setattr(target, false, MOUNT_ATTR_RDONLY, 0)
            }
        }
        MountOp::Sysfs { target } => mnt(
            "sysfs",
            target.as_path(),
            "sysfs",
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            None,
        )
        .map_err(at(format!("mount sysfs on {}", target.display()))),
        MountOp::ReadOnlyBind { target } => {
            if std::fs::symlink_metadata(target).is_err() {
                return Ok(());
            }
            mnt(target.as_path(), target.as_path(), "", MountFlags::BIND | MountFlags::REC, None)
                .map_err(at(format!("bind {}", target.display())))?;
            mount_setattr(target, true, MOUNT_ATTR_RDONLY, 0)
        }
        MountOp::EmptyFile { target } => std::fs::write(target, b"").map_err(|e| StepError {
            step: format!("create {}", target.display()),
            errno: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
        }),
        MountOp::Detach { target } => match rustix::mount::unmount(target.as_path(), UnmountFlags::DETACH) {
            Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(at(format!("detach {}", target.display()))(e)),
        },
        MountOp::Proc { target } => {
            mnt("proc", target.as_path(), "proc", MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC, None)
                .map_err(at(format!("mount proc on {}", target.display())))
        }
    }
}

pub(crate) enum Status {
    Exited(i32),
    Signaled,
}

pub(crate) fn wait_for(pid: i32) -> Status {
    loop {
        let mut st = 0;
        // SAFETY: plain waitpid on our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            if libc::WIFEXITED(st) {
                return Status::Exited(libc::WEXITSTATUS(st));
            }
            if libc::WIFSIGNALED(st) {
                return Status::Signaled;
            }
        } else if r < 0 && errno() != libc::EINTR {
            return Status::Exited(125);
        }
    }
}

/// pid 1 of the sandbox: mount /proc, install the socket filter, start the command, reap
/// everything, report.
fn init(
    spec: &SandboxSpec,
    plan: &MountPlan,
    terminal: Option<&rustix::fd::OwnedFd>,
    handoff: Option<Handoff>,
) -> Result<i32, StepError> {
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    for op in &plan.init {
        mount(op, &Pins::default())?;
    }
    if let Some(handoff) = handoff {
        guard_sockets(handoff)?;
    }
    // Not dumpable: no process of the command may read or write this one's memory, or use
    // its descriptors through /proc/1/fd (ptrace is allowed inside, for debuggers). Only
    // now: the supervisor took the listener from us with the rights of a debugger.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let slave = terminal.map(std::os::fd::AsRawFd::as_raw_fd);
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| {
            CString::new(a.as_bytes())
                .map_err(|_| StepError { step: "argument with a NUL byte".into(), errno: rustix::io::Errno::INVAL })
        })
        .collect::<Result<_, _>>()?;
    let cwd = CString::new(spec.cwd.as_os_str().as_bytes())
        .map_err(|_| StepError { step: "working directory".into(), errno: rustix::io::Errno::INVAL })?;
    // SAFETY: still single-threaded; the child only calls async-signal-safe functions and exec.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(StepError { step: "fork command".into(), errno: rustix::io::Errno::from_raw_os_error(errno()) });
    }
    if child == 0 {
        if let Err(e) = crate::terminal::take(slave).and_then(|()| confine(spec, None)) {
            report(&Report::Error(setup_failed(&e)).line());
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(125) };
        }
        exec_command(&argv, &cwd, None);
    }
    // The terminal is the command's now; ours would keep it open after the command exits.
    if let Some(fd) = slave {
        // SAFETY: closing init's copy of the slave (the caller's OwnedFd in stage 2 is another
        // process's descriptor table entry; this one is init's own, inherited by fork).
        unsafe { libc::close(fd) };
    }
    // Reap every process until the command itself is gone; orphans reparent to us.
    let status = loop {
        let mut st = 0;
        // SAFETY: waitpid on any child with a valid out-pointer.
        let r = unsafe { libc::waitpid(-1, &mut st, 0) };
        if r == child {
            break st;
        }
        if r < 0 && errno() == libc::ECHILD {
            break 0;
        }
    };
    report(&Report::of_wait_status(status).line());
    Ok(0)
}

/// In the sandbox's init (cold or warm), before any command: install the filter that hands
/// every `connect` and send by address to the supervisor, and give it the listener. The
/// listener does not stay here (nor reach the command).
pub(crate) fn guard_sockets(handoff: Handoff) -> Result<(), StepError> {
    let listener = crate::supervisor::filter::install().map_err(at("install the socket filter"))?;
    handoff.give(&listener)
}

/// Capabilities root loses in the sandbox: LINUX_IMMUTABLE, NET_ADMIN, IPC_LOCK, IPC_OWNER,
/// SYS_MODULE, SYS_RAWIO, SYS_PTRACE, SYS_PACCT, SYS_ADMIN, SYS_BOOT, SYS_NICE, SYS_RESOURCE,
/// SYS_TIME, SYS_TTY_CONFIG, MKNOD, LEASE, AUDIT_CONTROL, MAC_OVERRIDE, MAC_ADMIN, SYSLOG,
/// WAKE_ALARM, BLOCK_SUSPEND, AUDIT_READ, PERFMON, BPF, CHECKPOINT_RESTORE.
const DROPPED_CAPS: [u32; 26] =
    [9, 12, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 30, 32, 33, 34, 35, 36, 37, 38, 39, 40];

/// In the command's process, last steps before exec: resource limits, then the kernel
/// confinement that must come after every mount. `seccomp` is the filter if already built
/// (a warm server builds it once), else it is built here.
pub(crate) fn confine(spec: &SandboxSpec, seccomp: Option<&seccompiler::BpfProgram>) -> Result<(), StepError> {
    let set = |res: rustix::process::Resource, v: Option<u64>| -> Result<(), StepError> {
        if let Some(v) = v {
            rustix::process::setrlimit(res, rustix::process::Rlimit { current: Some(v), maximum: Some(v) })
                .map_err(at(format!("setrlimit {res:?}")))?;
        }
        Ok(())
    };
    set(rustix::process::Resource::Cpu, spec.cpu_seconds)?;
    set(rustix::process::Resource::Fsize, spec.max_file_size)?;
    set(rustix::process::Resource::Core, Some(0))?;
    // A default process limit is only ever lowered here: one the caller already set lower stays.
    if let Some(n) = spec.max_procs {
        let cur = rustix::process::getrlimit(rustix::process::Resource::Nproc);
        if cur.maximum.is_none_or(|m| m > n) {
            set(rustix::process::Resource::Nproc, Some(n))?;
        }
    }
    // When the host runs out of memory, the command is the first thing the kernel kills, not
    // the host's processes (txbox's default memory protection; a hard cap is `--memory`).
    // Best effort: a run is never refused for it. The command cannot lower it again: as root
    // it loses CAP_SYS_RESOURCE at exec (and the minimum is set with it now), and Landlock
    // refuses writes under /proc.
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
    // Root without a user namespace keeps only the everyday capabilities (file ownership,
    // setuid to drop privileges, binding low ports): nothing that reaches the kernel, devices,
    // time, modules or other processes. The bounding set is what root gets back after exec.
    if !spec.userns {
        for cap in DROPPED_CAPS {
            // SAFETY: PR_CAPBSET_DROP with a capability number; no pointers involved.
            let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            if r != 0 && errno() != libc::EINVAL {
                return Err(StepError {
                    step: format!("drop capability {cap}"),
                    errno: rustix::io::Errno::from_raw_os_error(errno()),
                });
            }
        }
    }
    // Landlock: writes only beneath the workspace view, /tmp, /dev and configured extras —
    // a second wall behind the read-only mounts, best effort by kernel ABI.
    let mut writable = spec.writable.clone();
    writable.extend(spec.caches.iter().map(|(_, t)| t.clone()));
    let plan = crate::landlock::LandlockPlan::new(&spec.workspace, &writable);
    crate::landlock::apply(&plan)
        .map_err(|e| StepError { step: format!("landlock: {e}"), errno: rustix::io::Errno::PERM })?;
    // seccomp last: it refuses mount and friends, which everything above needed.
    let seccomp_failed = |e| StepError { step: format!("seccomp: {e}"), errno: rustix::io::Errno::PERM };
    match seccomp {
        Some(program) => crate::seccomp::install(program).map_err(seccomp_failed)?,
        None => crate::seccomp::apply().map_err(seccomp_failed)?,
    }
    Ok(())
}

/// In the command's process: reset what txbox changed, enter the working directory, exec
/// with this process's environment or `env`.
pub(crate) fn exec_command(argv: &[CString], cwd: &CString, env: Option<&[CString]>) -> ! {
    let envp = env.map(nul_terminated);
    exec_prepared(&nul_terminated(argv), cwd, envp.as_deref())
}

/// The NULL-terminated pointer array of `strings`, for execve (valid while `strings` is).
pub(crate) fn nul_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

/// [`exec_command`] with its pointer arrays built beforehand: nothing is allocated before
/// execve, as a process sharing its parent's memory (the warm server's `CLONE_VM` child) must
/// not: what it allocated would stay behind in the parent's heap. `argp` and `envp` end in NULL.
pub(crate) fn exec_prepared(argp: &[*const libc::c_char], cwd: &CStr, envp: Option<&[*const libc::c_char]>) -> ! {
    // SAFETY: async-signal-safe calls on valid, NUL-terminated buffers that outlive them.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGQUIT, libc::SIG_DFL);
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        if libc::chdir(cwd.as_ptr()) != 0 {
            libc::chdir(c"/".as_ptr());
        }
        // Only stdin, stdout and stderr go on: whatever else is open (txbox's own descriptors,
        // anything its caller left open) closes at exec.
        crate::fds::cloexec_from(3);
        if let Some(&first) = argp.first().filter(|p| !p.is_null()) {
            match envp {
                Some(envp) => libc::execvpe(first, argp.as_ptr(), envp.as_ptr()),
                None => libc::execvp(first, argp.as_ptr()),
            };
        }
    }
    let e = if argp.first().is_some_and(|p| !p.is_null()) { errno() } else { libc::EINVAL };
    let code = if e == libc::ENOENT { 127 } else { 126 };
    let name = match argp.first().filter(|p| !p.is_null()) {
        // SAFETY: a non-null entry of argp points at a NUL-terminated string (see above).
        Some(&p) => unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned(),
        None => String::new(),
    };
    let _ = writeln!(std::io::stderr(), "txbox: {name}: {}", std::io::Error::from_raw_os_error(e));
    // SAFETY: _exit skips atexit handlers and stdio flushing that belong to the parent image.
    unsafe { libc::_exit(code) }
}
