//! The stage-2 helper: runs in a freshly exec'd `txbox __stage2`, builds the sandbox, runs the
//! command, and reports on fd 3. Single-threaded by construction, so `fork` here is safe.
//!
//! Process tree:
//! ```text
//! txbox (host)  ── stage-2 S: unshare, maps, mounts ── init I (pid 1): /proc, reaps
//!                                                       └─ command C (pid 2): exec
//! ```
//! I reports C's wait status on the report pipe and exits; the kernel then kills whatever C
//! left behind in the pid namespace, so no process of the command survives it.

use std::ffi::{CString, OsString};
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::thread::UnshareFlags;

use crate::spec::{overlay_options, MountOp, MountPlan, SandboxSpec};

/// The fd on which stage 2 reports to its parent (set up by the launcher).
pub const REPORT_FD: i32 = 3;

#[derive(Debug)]
struct StepError {
    step: String,
    errno: rustix::io::Errno,
}

fn at(step: impl Into<String>) -> impl FnOnce(rustix::io::Errno) -> StepError {
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
    // The report fd must not leak into the command.
    let _ = rustix::io::fcntl_setfd(
        // SAFETY: see `report`; borrowed only for this call.
        unsafe { rustix::fd::BorrowedFd::borrow_raw(REPORT_FD) },
        rustix::io::FdFlags::CLOEXEC,
    );
    // If txbox dies, so do we (and with us, through pid 1, the whole sandbox).
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let spec = match SandboxSpec::from_args(args) {
        Ok(s) => s,
        Err(e) => {
            report(&format!("error {e}\n"));
            std::process::exit(125);
        }
    };
    match run(&spec) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            report(&format!("error sandbox setup failed at `{}`: {}\n", e.step, hint(&e)));
            std::process::exit(125);
        }
    }
}

fn hint(e: &StepError) -> String {
    let base = format!("{} (errno {})", e.errno, e.errno.raw_os_error());
    if e.step.starts_with("unshare") && matches!(e.errno, rustix::io::Errno::PERM | rustix::io::Errno::NOSPC) {
        return format!(
            "{base}; unprivileged user namespaces look disabled: enable them with \
             `sysctl -w kernel.unprivileged_userns_clone=1` / `user.max_user_namespaces=15000`, or on \
             Ubuntu `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (see `txbox doctor`)"
        );
    }
    if e.step.starts_with("mount overlay") {
        return format!("{base}; overlayfs in a user namespace needs Linux ≥ 5.11 and an upper filesystem with user xattrs");
    }
    base
}

/// Build the sandbox and run the command in it. Returns stage 2's own exit code.
/// The order of these steps is the documentation.
fn run(spec: &SandboxSpec) -> Result<i32, StepError> {
    let plan = MountPlan::for_spec(spec);
    // 1. New namespaces. Without root, a user namespace gives us the right to mount.
    let mut flags = UnshareFlags::NEWNS | UnshareFlags::NEWPID;
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
    // 3. Mounts that need no pid namespace: private root, workspace overlay, hidden paths.
    for op in &plan.namespace {
        mount(op)?;
    }
    // 4. The pid namespace's init.
    // SAFETY: this process is single-threaded (a fresh exec that started no threads), so the
    // child may run arbitrary code after fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(StepError { step: "fork init".into(), errno: rustix::io::Errno::from_raw_os_error(errno()) });
    }
    if pid == 0 {
        let code = match init(spec, &plan) {
            Ok(c) => c,
            Err(e) => {
                report(&format!("error sandbox setup failed at `{}`: {}\n", e.step, hint(&e)));
                125
            }
        };
        std::process::exit(code);
    }
    // 5. Wait for init; its exit means the whole pid namespace is gone.
    let status = wait_for(pid);
    // 6. Unmount the workspace view now rather than when the namespace is torn down, so the
    //    upper layer is quiescent before txbox classifies it.
    let _ = rustix::mount::unmount(spec.workspace.as_path(), UnmountFlags::DETACH);
    Ok(match status {
        Status::Exited(c) => c,
        Status::Signaled => 125,
    })
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn write_proc(path: &str, text: &str) -> Result<(), StepError> {
    std::fs::write(path, text).map_err(|e| StepError {
        step: format!("write {path}"),
        errno: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
    })
}

fn mount(op: &MountOp) -> Result<(), StepError> {
    match op {
        MountOp::PrivateRoot => {
            rustix::mount::mount_change("/", MountPropagationFlags::PRIVATE | MountPropagationFlags::REC)
                .map_err(at("make / private"))
        }
        MountOp::Overlay { target, lowers, upper, work } => {
            let opts = overlay_options(lowers, upper.as_os_str(), work.as_os_str());
            let opts = CString::new(opts.as_bytes()).map_err(|_| StepError { step: "overlay options".into(), errno: rustix::io::Errno::INVAL })?;
            rustix::mount::mount("overlay", target.as_path(), "overlay", MountFlags::empty(), Some(opts.as_c_str()))
                .map_err(at(format!("mount overlay on {}", target.display())))
        }
        MountOp::Hide { target } => {
            if std::fs::symlink_metadata(target).is_err() {
                return Ok(());
            }
            rustix::mount::mount(
                "tmpfs",
                target.as_path(),
                "tmpfs",
                MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                Some(c"mode=000,size=4k"),
            )
            .map_err(at(format!("hide {}", target.display())))
        }
        MountOp::Proc { target } => rustix::mount::mount(
            "proc",
            target.as_path(),
            "proc",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            None,
        )
        .map_err(at(format!("mount proc on {}", target.display()))),
    }
}

enum Status {
    Exited(i32),
    Signaled,
}

fn wait_for(pid: i32) -> Status {
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

/// pid 1 of the sandbox: mount /proc, start the command, reap everything, report.
fn init(spec: &SandboxSpec, plan: &MountPlan) -> Result<i32, StepError> {
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    for op in &plan.init {
        mount(op)?;
    }
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| StepError { step: "argument with a NUL byte".into(), errno: rustix::io::Errno::INVAL }))
        .collect::<Result<_, _>>()?;
    let cwd = CString::new(spec.cwd.as_os_str().as_bytes())
        .map_err(|_| StepError { step: "working directory".into(), errno: rustix::io::Errno::INVAL })?;
    // SAFETY: still single-threaded; the child only calls async-signal-safe functions and exec.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(StepError { step: "fork command".into(), errno: rustix::io::Errno::from_raw_os_error(errno()) });
    }
    if child == 0 {
        exec_command(&argv, &cwd);
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
    if libc::WIFSIGNALED(status) {
        report(&format!("signal {}\n", libc::WTERMSIG(status)));
    } else {
        report(&format!("exit {}\n", libc::WEXITSTATUS(status)));
    }
    Ok(0)
}

/// In the command's process: reset what txbox changed, enter the working directory, exec.
fn exec_command(argv: &[CString], cwd: &CString) -> ! {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
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
        libc::execvp(ptrs[0], ptrs.as_ptr());
    }
    let e = errno();
    let code = if e == libc::ENOENT { 127 } else { 126 };
    let name = argv.first().map(|a| String::from_utf8_lossy(a.as_bytes()).into_owned()).unwrap_or_default();
    let _ = writeln!(std::io::stderr(), "txbox: {name}: {}", std::io::Error::from_raw_os_error(e));
    // SAFETY: _exit skips atexit handlers and stdio flushing that belong to the parent image.
    unsafe { libc::_exit(code) }
}
