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
//!
//! Owns the order of the sandbox's setup: `start`, `run`, `enter_namespaces`, `init` and
//! `confine` are generic over `crate::kernel::Kernel` and may reach the kernel only through it
//! (so `kernel`'s tests pin the order). The syscall helpers below them (mounts, loopback, exec) are
//! what the real kernel calls.

use std::ffi::{CStr, CString, OsString};
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;

use rustix::io::Errno;
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::process::Resource;
use rustix::thread::UnshareFlags;

use crate::kernel::{Fork, Kernel, Linux};
use crate::spec::{overlay_options, MountOp, MountPlan, SandboxSpec, EMPTY_FILE};
use crate::supervisor::Handoff;
use crate::warm::wire::Report;

pub(crate) use crate::step::{at, at_path, StepError};

/// The fd on which stage 2 reports to its parent (set up by the launcher).
pub const REPORT_FD: i32 = 3;
/// The fd on which stage 2 waits for the launcher's go (when `spec.sync`).
pub const SYNC_FD: i32 = 4;
/// The fd on which stage 2 sends the launcher the master of the command's terminal (when
/// `spec.terminal`).
pub const PTY_FD: i32 = 5;

pub(crate) fn report(line: &str) {
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
    let code = start(&mut Linux, spec);
    exit(code)
}

/// Stage 2 from its first step to its exit code (a failed step is reported, and 125).
pub(crate) fn start<K: Kernel>(k: &mut K, spec: &SandboxSpec) -> i32 {
    // Nothing the caller left open stays here (and so reaches init or the command): only the
    // descriptors the launcher installed, and the report fd closes at exec.
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
    k.close_inherited(&keep);
    // If txbox dies, so do we (and with us, through pid 1, the whole sandbox).
    k.die_with_parent();
    match run(k, spec) {
        Ok(code) => code,
        Err(e) => {
            k.report(&Report::Error(setup_failed(&e)).line());
            125
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
    e.to_string()
}

/// Build the sandbox and run the command in it. Returns stage 2's own exit code (or, in the
/// forked init and command on a recording kernel, theirs).
/// The order of these steps is the documentation; `kernel`'s tests pin it.
fn run<K: Kernel>(k: &mut K, spec: &SandboxSpec) -> Result<i32, StepError> {
    let plan = MountPlan::for_spec(spec);
    // 0. Wait until the launcher has put us into our cgroups, so no child escapes the limits.
    if spec.sync {
        k.wait_for_go();
    }
    // 1. What keeps host unix sockets out of reach (crate::supervisor): with the supervisor,
    //    its process, started before the namespaces so that it stays in the host's.
    let supervisor = k.start_supervisor(spec)?;
    // 1-2. New namespaces, the caller's ids mapped to themselves, loopback up; the proxy's
    //      listener handed out, the proxy variables set (network by allowlist, `crate::net`).
    enter_namespaces(k, spec)?;
    let mut attempts = k.net_attempts(spec);
    k.hand_over_proxy(spec)?;
    // 3. Open every host object a later mount may cover (a workspace below /tmp, /dev/null),
    //    then run the mount plan.
    let mut pins = Pins::default();
    for p in plan.sources() {
        k.pin(&mut pins, &p)?;
    }
    for op in &plan.namespace {
        k.mount(op, &pins)?;
    }
    drop(pins);
    // 3b. The command's own terminal, in the sandbox's devpts, its master for the launcher to
    //     relay (when the caller has a terminal: the command never gets the caller's).
    let terminal = if spec.terminal { Some(k.open_terminal()?) } else { None };
    // 4. The pid namespace's init.
    let fork = k.fork("fork init")?;
    let (supervisor, handoff) = supervisor.map_or((None, None), |(p, h)| (Some(p), Some(h)));
    let pid = match fork {
        Fork::Child => {
            let code = match init(k, spec, &plan, terminal.as_ref(), handoff) {
                Ok(c) => c,
                Err(e) => {
                    k.report(&Report::Error(setup_failed(&e)).line());
                    125
                }
            };
            return Ok(k.exit(code));
        }
        Fork::Parent(pid) => pid,
    };
    drop((terminal, handoff));
    // 5. Wait for init; its exit means the whole pid namespace is gone. The supervisor serves
    //    init's filter meanwhile, and leaves with it. Then say whether the command tried to
    //    reach the network it does not have.
    if let Some(s) = &supervisor {
        k.watch_supervisor(s, pid);
    }
    let status = k.wait(pid);
    if let Some(s) = supervisor {
        k.wait_supervisor(s);
    }
    if let Some(a) = attempts.as_mut() {
        k.report(&a.since_last());
    }
    // 6. Unmount the workspace view now rather than when the namespace is torn down, so the
    //    upper layer is quiescent before txbox classifies it.
    k.detach(&spec.workspace);
    Ok(match status {
        Status::Exited(c) => c,
        Status::Signaled => 125,
    })
}

/// Steps 1 and 2 of every sandbox (cold or warm): new namespaces, ids, hostname, loopback.
pub(crate) fn enter_namespaces<K: Kernel>(k: &mut K, spec: &SandboxSpec) -> Result<(), StepError> {
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
    k.unshare(flags)?;
    // 2. Map the invoking user and group to themselves: files the command creates belong to
    //    the caller, and the command sees its own uid.
    if spec.userns {
        k.write_proc("/proc/self/setgroups", "deny")?;
        k.write_proc("/proc/self/uid_map", &format!("{0} {0} 1", spec.uid))?;
        k.write_proc("/proc/self/gid_map", &format!("{0} {0} 1", spec.gid))?;
    }
    k.set_hostname();
    if !spec.host_network {
        k.loopback_up()?;
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
            Err(e) => Err(StepError::at_path("open", p, e)),
        }
    }

    /// The `/proc/self/fd/N` name of a pinned object (None: not available on this host).
    fn name(&self, p: &std::path::Path) -> Option<std::path::PathBuf> {
        use std::os::fd::AsRawFd;
        self.0.get(p).map(|fd| std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())))
    }
}

/// `ifconfig lo up` in the new network namespace: loopback works, nothing else exists.
pub(crate) fn loopback_up() -> Result<(), StepError> {
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq whose name we fill in; the fd is
    // closed before returning.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(StepError::last("socket for loopback"));
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
            return Err(StepError::new("bring loopback up", rustix::io::Errno::from_raw_os_error(e)));
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
        .map_err(|_| StepError::at_path("mount_setattr", target, rustix::io::Errno::INVAL))?;
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
        return Err(StepError::at_path("mount_setattr", target, rustix::io::Errno::from_raw_os_error(errno())));
    }
    Ok(())
}

pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub(crate) fn write_proc(path: &'static str, text: &str) -> Result<(), StepError> {
    std::fs::write(path, text).map_err(|e| StepError::io("write", std::path::Path::new(path), &e))
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
                .map_err(|_| StepError::new("tmpfs options", rustix::io::Errno::INVAL))?;
            mnt("tmpfs", target.as_path(), "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, Some(data.as_c_str()))
                .map_err(at_path("mount tmpfs on", target))
        }
        MountOp::Overlay { target, lowers, upper, work } => {
            let via = |p: &std::path::PathBuf| pins.name(p).unwrap_or_else(|| p.clone());
            let lowers: Vec<std::path::PathBuf> = lowers.iter().map(via).collect();
            let opts = overlay_options(&lowers, via(upper).as_os_str(), via(work).as_os_str());
            let opts = CString::new(opts.as_bytes())
                .map_err(|_| StepError::new("overlay options", rustix::io::Errno::INVAL))?;
            mkdir_p(target);
            // nosuid, nodev: a command running as root must not make a device node or a
            // setuid binary in the workspace and use it.
            mnt("overlay", target.as_path(), "overlay", MountFlags::NOSUID | MountFlags::NODEV, Some(opts.as_c_str()))
                .map_err(at_path("mount overlay on", target))
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
            mnt(src.as_path(), target.as_path(), "", MountFlags::BIND, None).map_err(at_path("bind", target))
        }
        MountOp::BindDir { source, target } => {
            let Some(src) = pins.name(source) else { return Ok(()) };
            // The target must be a directory already (made by the launcher, never here: this
            // mount namespace shares the host's filesystems).
            if !std::fs::symlink_metadata(target).is_ok_and(|m| m.is_dir()) {
                return Ok(());
            }
            mnt(src.as_path(), target.as_path(), "", MountFlags::BIND, None).map_err(at_path("bind cache", target))?;
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
            .map_err(at_path("mount devpts on", target))
        }
        MountOp::Symlink { target, points_to } => match std::os::unix::fs::symlink(points_to, target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(StepError::io("symlink", target, &e)),
        },
        MountOp::Hide { target } => hide(target),
        MountOp::Sysfs { target } => mnt(
            "sysfs",
            target.as_path(),
            "sysfs",
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            None,
        )
        .map_err(at_path("mount sysfs on", target)),
        MountOp::ReadOnlyBind { target } => {
            if std::fs::symlink_metadata(target).is_err() {
                return Ok(());
            }
            mnt(target.as_path(), target.as_path(), "", MountFlags::BIND | MountFlags::REC, None)
                .map_err(at_path("bind", target))?;
            mount_setattr(target, true, MOUNT_ATTR_RDONLY, 0)
        }
        MountOp::EmptyFile { target } => {
            std::fs::write(target, b"").map_err(|e| StepError::io("create", target, &e))?;
            // A read-only mount of its own: every bind of it (`hide`) is read-only from the start.
            mnt(target.as_path(), target.as_path(), "", MountFlags::BIND, None).map_err(at_path("bind", target))?;
            mount_setattr(target, false, MOUNT_ATTR_RDONLY, 0)
        }
        MountOp::Detach { target } => match rustix::mount::unmount(target.as_path(), UnmountFlags::DETACH) {
            Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(StepError::at_path("detach", target, e)),
        },
        MountOp::Proc { target } => {
            mnt("proc", target.as_path(), "proc", MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC, None)
                .map_err(at_path("mount proc on", target))
        }
    }
}

/// Cover `target` (`MountOp::Hide`) exactly where it is named, never where a symlink on the way
/// points: the plan names each secret's real place as well (`crate::secrets`), and a link
/// followed now could lead anywhere (the workspace's, a writable path's). A path that is missing,
/// out of reach, or named through a symlink is left as it is.
fn hide(target: &std::path::Path) -> Result<(), StepError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
    use std::os::fd::AsRawFd;
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let opened = match rustix::fs::openat2(CWD, target, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS) {
        // Before Linux 5.6: the last component is still not followed.
        Err(Errno::NOSYS) => rustix::fs::openat(CWD, target, flags, Mode::empty()),
        r => r,
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::ACCESS) => return Ok(()),
        Err(e) => return Err(StepError::at_path("open to hide", target, e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(at_path("stat to hide", target))?;
    // The mount lands on what the descriptor holds, whatever the name means by now.
    let at = std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::Symlink => Ok(()),
        rustix::fs::FileType::Directory => rustix::mount::mount(
            "tmpfs",
            at.as_path(),
            "tmpfs",
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            Some(c"mode=000,size=4k"),
        )
        .map_err(at_path("hide", target)),
        // A file: the empty file over it, read-only as its own mount is. (Not /dev/null: a
        // device node on a read-only mount still accepts writes, which would look like success.)
        _ => rustix::mount::mount(std::path::Path::new(EMPTY_FILE), at.as_path(), "", MountFlags::BIND, None)
            .map_err(at_path("hide", target)),
    }
}

pub(crate) enum Status {
    Exited(i32),
    Signaled,
}

pub(crate) fn wait_for(pid: i32) -> Status {
    match crate::reap::wait(pid) {
        Ok(st) if libc::WIFEXITED(st) => Status::Exited(libc::WEXITSTATUS(st)),
        Ok(_) => Status::Signaled,
        Err(_) => Status::Exited(125),
    }
}

/// pid 1 of the sandbox: mount /proc, install the socket filter, start the command, reap
/// everything, report.
fn init<K: Kernel>(
    k: &mut K,
    spec: &SandboxSpec,
    plan: &MountPlan,
    terminal: Option<&K::Terminal>,
    handoff: Option<K::Handoff>,
) -> Result<i32, StepError> {
    k.die_with_parent();
    for op in &plan.init {
        k.mount(op, &Pins::default())?;
    }
    if let Some(handoff) = handoff {
        k.guard_sockets(handoff)?;
    }
    // Not dumpable: no process of the command may read or write this one's memory, or use
    // its descriptors through /proc/1/fd (ptrace is allowed inside, for debuggers). Only
    // now: the supervisor took the listener from us with the rights of a debugger.
    k.not_dumpable();
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| StepError::new("argument with a NUL byte", Errno::INVAL)))
        .collect::<Result<_, _>>()?;
    let cwd =
        CString::new(spec.cwd.as_os_str().as_bytes()).map_err(|_| StepError::new("working directory", Errno::INVAL))?;
    let child = match k.fork("fork command")? {
        Fork::Child => {
            if let Err(e) = k.take_terminal(terminal).and_then(|()| confine(k, spec, Inherited::Nothing, None, None)) {
                k.report(&Report::Error(setup_failed(&e)).line());
                return Ok(k.exit(125));
            }
            k.reset_for_exec(&cwd);
            return Ok(k.exec(&argv));
        }
        Fork::Parent(child) => child,
    };
    // The terminal is the command's now; ours would keep it open after the command exits.
    if let Some(t) = terminal {
        k.close_terminal(t);
    }
    // Reap every process until the command itself is gone; orphans reparent to us.
    let status = k.reap_until(child).unwrap_or(0);
    k.report(&Report::of_wait_status(status).line());
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
pub(crate) const DROPPED_CAPS: [u32; 26] =
    [9, 12, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 30, 32, 33, 34, 35, 36, 37, 38, 39, 40];

/// What a command's process inherits and keeps through exec, made once where it can be (a warm
/// server's init, for every command it starts), else in the command's process (`confine`):
/// its OOM score and, for root without a user namespace, the bounding set. Neither changes what
/// the process that makes it may do (its own capabilities stay until it execs, and a warm
/// server's init never does).
pub(crate) fn confine_inherited<K: Kernel>(k: &mut K, spec: &SandboxSpec) -> Result<(), StepError> {
    // When the host runs out of memory, the command is the first thing the kernel kills, not
    // the host's processes (txbox's default memory protection; a hard cap is `--memory`).
    // Best effort: a run is never refused for it. The command cannot lower it again: as root
    // it loses CAP_SYS_RESOURCE at exec (and the minimum is set with it now), and Landlock
    // refuses writes under /proc.
    k.oom_score_adj();
    // Root without a user namespace keeps only the everyday capabilities (file ownership,
    // setuid to drop privileges, binding low ports): nothing that reaches the kernel, devices,
    // time, modules or other processes. The bounding set is what root gets back after exec.
    if !spec.userns {
        for cap in DROPPED_CAPS {
            k.drop_capability(cap)?;
        }
    }
    Ok(())
}

/// What the command's process got from whoever started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inherited {
    /// Nothing: it makes its whole confinement itself.
    Nothing,
    /// [`confine_inherited`], made once by a warm server's init.
    Confinement,
}

/// In the command's process, last steps before exec: resource limits, then the kernel
/// confinement that must come after every mount. `seccomp` is the filter if already built
/// (a warm server builds it once), else it is built here; `ruleset`, Landlock's if made ahead
/// for this command's mounts.
pub(crate) fn confine<K: Kernel>(
    k: &mut K,
    spec: &SandboxSpec,
    inherited: Inherited,
    seccomp: Option<&seccompiler::BpfProgram>,
    ruleset: Option<&crate::landlock::Prepared>,
) -> Result<(), StepError> {
    let limits = [(Resource::Cpu, spec.cpu_seconds), (Resource::Fsize, spec.max_file_size), (Resource::Core, Some(0))];
    for (res, v) in limits {
        if let Some(v) = v {
            k.set_rlimit(res, v)?;
        }
    }
    // A default process limit is only ever lowered here: one the caller already set lower stays.
    if let Some(n) = spec.max_procs {
        if k.rlimit_max(Resource::Nproc).is_none_or(|m| m > n) {
            k.set_rlimit(Resource::Nproc, n)?;
        }
    }
    if inherited == Inherited::Nothing {
        confine_inherited(k, spec)?;
    }
    // No exec from here on may gain privileges (setuid, file capabilities): what Landlock and
    // seccomp need to be installed without CAP_SYS_ADMIN, and what keeps them from being shed.
    k.no_new_privs()?;
    // Landlock: writes only beneath the workspace view, /tmp, /dev and configured extras —
    // a second wall behind the read-only mounts, best effort by kernel ABI. A warm server may
    // have made the ruleset while it waited, for the very mounts this command sees.
    match ruleset {
        Some(r) => k.landlock_prepared(r)?,
        None => k.landlock(spec)?,
    }
    // seccomp last: it refuses mount and friends, which everything above needed.
    k.seccomp(seccomp)
}

/// The NULL-terminated pointer array of `strings`, for execve (valid while `strings` is).
pub(crate) fn nul_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

/// Exec with the pointer arrays built beforehand: nothing is allocated before
/// execve, as a process sharing its parent's memory (the warm server's `CLONE_VM` child) must
/// not: what it allocated would stay behind in the parent's heap. `argp` and `envp` end in NULL.
pub(crate) fn exec_prepared(argp: &[*const libc::c_char], cwd: &CStr, envp: Option<&[*const libc::c_char]>) -> ! {
    reset_for_exec(cwd);
    execute(argp, envp)
}

/// Default signal dispositions and an empty mask, `cwd` (else `/`), and every descriptor above
/// 2 close-on-exec. Async-signal-safe; allocates nothing.
pub(crate) fn reset_for_exec(cwd: &CStr) {
    // SAFETY: async-signal-safe calls on a valid, NUL-terminated buffer that outlives them.
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
    }
    // Only stdin, stdout and stderr go on: whatever else is open (txbox's own descriptors,
    // anything its caller left open) closes at exec.
    crate::fds::cloexec_from(3);
}

/// execvp(e) `argp`; on failure, say why on stderr and leave with 127 (not found) or 126.
pub(crate) fn execute(argp: &[*const libc::c_char], envp: Option<&[*const libc::c_char]>) -> ! {
    // SAFETY: argp and envp are NULL-terminated arrays of NUL-terminated strings that outlive
    // the call (see `exec_prepared`).
    unsafe {
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
