//! The proxy confines itself before it reads a byte from the sandbox: no filesystem at all, no
//! network of its own (connections come from the broker), no signals outside itself, no new
//! programs, no capabilities, and a seccomp allow-list of the few system calls a relay needs.
//!
//! - Landlock (best effort by kernel ABI): a ruleset that handles every filesystem right, TCP
//!   bind and connect, and the abstract-socket and signal scopes, with no rule granting any.
//! - seccomp: [`ALLOWED`] (as data: reviewed and tested), everything else `EPERM`; `clone` only
//!   for threads, `socketpair` only for unix sockets (the broker's reply channels), `ioctl`
//!   only `FIONBIO`, `tgkill` only at itself (abort), `seccomp` only to add a filter. A second,
//!   later filter answers `clone3` with `ENOSYS` so the C library falls back to `clone`, whose
//!   flags a filter can see.
//! - Capabilities: all dropped (the proxy may run as root).

use std::collections::BTreeMap;

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, RestrictionStatus, Ruleset, RulesetAttr, RulesetStatus,
    Scope, ABI,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("seccomp: {0}")]
    Seccomp(String),
    #[error("dropping capabilities: {0}")]
    Caps(std::io::Error),
}

/// A system call the proxy may make, unless `when` narrows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    pub name: &'static str,
    pub nr: i64,
    pub when: When,
}

/// The condition on an allowed call's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    /// Argument `arg` (32 bits) equals `value`.
    Equals {
        arg: u8,
        value: u64,
    },
    /// Every bit of `mask` is set in argument `arg`.
    HasBits {
        arg: u8,
        mask: u64,
    },
    /// Argument `arg` is this process's pid (filled in at install time).
    Itself {
        arg: u8,
    },
}

/// `seccomp(2)`'s operation that installs a filter.
const SECCOMP_SET_MODE_FILTER: u64 = 1;

const fn always(name: &'static str, nr: i64) -> Allowed {
    Allowed { name, nr, when: When::Always }
}

/// What a relay needs: memory, threads, time, and I/O on descriptors it already has.
#[rustfmt::skip]
pub const ALLOWED: &[Allowed] = &[
    // Memory.
    always("brk", libc::SYS_brk),
    always("mmap", libc::SYS_mmap),
    always("munmap", libc::SYS_munmap),
    always("mprotect", libc::SYS_mprotect),
    always("madvise", libc::SYS_madvise),
    always("mremap", libc::SYS_mremap),
    // Threads (one per connection) and their bookkeeping.
    Allowed { name: "clone", nr: libc::SYS_clone, when: When::HasBits { arg: 0, mask: libc::CLONE_THREAD as u64 } },
    always("set_robust_list", libc::SYS_set_robust_list),
    always("rseq", libc::SYS_rseq),
    always("futex", libc::SYS_futex),
    always("sigaltstack", libc::SYS_sigaltstack),
    always("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    always("rt_sigreturn", libc::SYS_rt_sigreturn),
    always("sched_yield", libc::SYS_sched_yield),
    always("sched_getaffinity", libc::SYS_sched_getaffinity),
    always("gettid", libc::SYS_gettid),
    always("getpid", libc::SYS_getpid),
    always("exit", libc::SYS_exit),
    always("exit_group", libc::SYS_exit_group),
    always("restart_syscall", libc::SYS_restart_syscall),
    Allowed { name: "tgkill", nr: libc::SYS_tgkill, when: When::Itself { arg: 0 } },
    // Time.
    always("clock_gettime", libc::SYS_clock_gettime),
    always("clock_nanosleep", libc::SYS_clock_nanosleep),
    #[cfg(target_arch = "x86_64")]
    always("nanosleep", libc::SYS_nanosleep),
    always("getrandom", libc::SYS_getrandom),
    // Descriptors it holds: the listener, clients, the broker's channels, the report pipe.
    always("read", libc::SYS_read),
    always("write", libc::SYS_write),
    always("readv", libc::SYS_readv),
    always("writev", libc::SYS_writev),
    always("close", libc::SYS_close),
    always("fcntl", libc::SYS_fcntl),
    #[cfg(target_arch = "x86_64")]
    always("poll", libc::SYS_poll),
    always("ppoll", libc::SYS_ppoll),
    always("accept4", libc::SYS_accept4),
    always("recvmsg", libc::SYS_recvmsg),
    always("sendmsg", libc::SYS_sendmsg),
    always("recvfrom", libc::SYS_recvfrom),
    always("sendto", libc::SYS_sendto),
    always("shutdown", libc::SYS_shutdown),
    always("getsockopt", libc::SYS_getsockopt),
    always("setsockopt", libc::SYS_setsockopt),
    always("getsockname", libc::SYS_getsockname),
    always("getpeername", libc::SYS_getpeername),
    Allowed { name: "socketpair", nr: libc::SYS_socketpair, when: When::Equals { arg: 0, value: libc::AF_UNIX as u64 } },
    Allowed { name: "ioctl", nr: libc::SYS_ioctl, when: When::Equals { arg: 1, value: libc::FIONBIO } },
    // Installing the second filter below (more filters can only take rights away).
    Allowed { name: "seccomp", nr: libc::SYS_seccomp, when: When::Equals { arg: 0, value: SECCOMP_SET_MODE_FILTER } },
];

/// The allow-list as BPF for the running architecture, `pid` standing for "itself".
pub fn build(pid: u32) -> Result<BpfProgram, ConfineError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| ConfineError::Seccomp(format!("{e:?}")))?;
    let err = |e: seccompiler::BackendError| ConfineError::Seccomp(e.to_string());
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for a in ALLOWED {
        let cond = match a.when {
            When::Always => {
                map.insert(a.nr, Vec::new());
                continue;
            }
            When::Equals { arg, value } => SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value),
            When::HasBits { arg, mask } => {
                SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(mask), mask)
            }
            When::Itself { arg } => {
                SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, u64::from(pid))
            }
        }
        .map_err(err)?;
        map.entry(a.nr).or_default().push(SeccompRule::new(vec![cond]).map_err(err)?);
    }
    let filter =
        SeccompFilter::new(map, SeccompAction::Errno(libc::EPERM as u32), SeccompAction::Allow, arch).map_err(err)?;
    BpfProgram::try_from(filter).map_err(err)
}

/// `clone3` answered `ENOSYS`. Installed after [`build`]'s filter: for two filters that both
/// answer with an errno, the kernel keeps the answer of the one installed last.
fn clone3_enosys() -> Result<BpfProgram, ConfineError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| ConfineError::Seccomp(format!("{e:?}")))?;
    let err = |e: seccompiler::BackendError| ConfineError::Seccomp(e.to_string());
    let map = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let filter =
        SeccompFilter::new(map, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch).map_err(err)?;
    BpfProgram::try_from(filter).map_err(err)
}

/// Confine the calling process, which must still be single-threaded. Returns how Landlock was
/// enforced, for the report.
pub fn confine() -> Result<String, ConfineError> {
    let landlock = landlock()?;
    drop_capabilities()?;
    let programs = [build(std::process::id())?, clone3_enosys()?];
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes no pointers and only sets a flag.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(ConfineError::Seccomp(format!("no_new_privs: {}", std::io::Error::last_os_error())));
    }
    for p in &programs {
        install(p)?;
    }
    Ok(format!("landlock {landlock}, seccomp allow-list of {} calls, no capabilities", ALLOWED.len()))
}

/// `seccomp(SECCOMP_SET_MODE_FILTER)` for the calling thread (no-new-privs is already set).
fn install(program: &BpfProgram) -> Result<(), ConfineError> {
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| ConfineError::Seccomp("filter too long".into()))?,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `program`'s instructions, alive for the call; seccompiler's
    // `sock_filter` has the kernel's layout.
    let r =
        unsafe { libc::syscall(libc::SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0u64, &prog as *const libc::sock_fprog) };
    if r != 0 {
        return Err(ConfineError::Seccomp(format!("installing a filter: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

fn landlock() -> Result<&'static str, ConfineError> {
    let abi = ABI::V9;
    let status: RestrictionStatus = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?
        .restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "fully enforced",
        RulesetStatus::PartiallyEnforced => "partially enforced",
        RulesetStatus::NotEnforced => "not enforced (no Landlock in this kernel)",
    })
}

/// Empty the permitted, effective and inheritable sets.
fn drop_capabilities() -> Result<(), ConfineError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header { version: VERSION_3, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset with a valid v3 header and the two data structs v3 expects.
    let r = unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) };
    if r != 0 {
        return Err(ConfineError::Caps(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const CHILD: &str = "TXBOX_NETPROXY_CONFINE_CHILD";

    #[test]
    fn the_allow_list_compiles_and_has_no_dangerous_calls() {
        let p = build(1234).unwrap();
        assert!(!p.is_empty() && p.len() < 4096);
        clone3_enosys().unwrap();
        for name in [
            "open", "openat", "openat2", "execve", "execveat", "socket", "connect", "bind", "kill", "ptrace",
            "unshare", "setns", "mount",
        ] {
            assert!(ALLOWED.iter().all(|a| a.name != name), "{name} must not be allowed");
        }
    }

    /// Confinement cannot be undone and the harness is multi-threaded: the checks run in a
    /// fresh process (this test binary again, with only the child test selected).
    #[test]
    fn a_confined_process_cannot_open_files_connect_or_run_programs() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "confine::tests::confined_child", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{text}");
        assert!(text.contains("CONFINED-CHILD-OK"), "{text}");
    }

    #[test]
    #[ignore = "run by a_confined_process_cannot_open_files_connect_or_run_programs in a child process"]
    fn confined_child() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let how = confine().unwrap();
        let denied = |r: std::io::Result<()>, what: &str| {
            let e = r.expect_err(what);
            assert!(matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)), "{what}: {e}");
        };
        denied(std::fs::File::open("/etc/hostname").map(drop), "open a file");
        denied(std::fs::read_dir("/").map(drop), "list a directory");
        denied(std::fs::write("/tmp/txbox-confined", b"x"), "write a file");
        denied(std::net::TcpStream::connect(addr).map(drop), "connect");
        denied(std::net::TcpListener::bind("127.0.0.1:0").map(drop), "listen");
        denied(std::process::Command::new("/bin/true").status().map(drop), "run a program");
        // SAFETY: kill with a pid and a signal number; expected to be refused.
        assert_eq!(unsafe { libc::kill(1, 0) }, -1);
        // What the proxy does keeps working: threads, unix socket pairs, I/O on held fds.
        let t = std::thread::spawn(move || {
            let mut b = b;
            std::io::Write::write_all(&mut b, b"ping").unwrap();
        });
        t.join().unwrap();
        let mut buf = [0u8; 4];
        std::io::Read::read_exact(&mut &a, &mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        drop(listener);
        println!("CONFINED-CHILD-OK ({how})");
    }
}
