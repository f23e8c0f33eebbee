//! The host side: start the stage-2 helper, stream or capture the command's output, enforce the
//! wall-clock timeout, and collect the command's fate from the report pipe.
//!
//! Owns the host side of one run: the helper process, its pipes, the timeout, the report's
//! decoding. May not build the sandbox (stage 2's), nor know about transactions; limits reach it
//! only through [`Watch`].

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use crate::net::NET_FD;
use crate::stage2::{PTY_FD, REPORT_FD, SYNC_FD};
use crate::terminal::Relay;
use crate::warm::wire::Report;
use crate::warm::{Conn, NotWarm};

/// How often limits that need watching are checked.
const CHECK_EVERY: Duration = Duration::from_millis(100);
use crate::SandboxSpec;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("starting the sandbox helper {exe}: {source}")]
    Spawn { exe: String, source: std::io::Error },
    /// Stage 2 or the warm server could not build the sandbox: the failed step it reported
    /// (worded by [`crate::step::StepError`]), or the spec it could not read.
    #[error("{0}")]
    Reported(String),
    /// The caller's [`Watch::started`] could not attach the sandbox to its cgroup.
    #[error("{0}")]
    Attach(#[source] crate::cgroup::CgroupError),
    /// Limits that need a cgroup were asked for, and none can be made on this host.
    #[error("--memory/--pids need a cgroup, and none can be made here: {0} (see `txbox doctor`)")]
    NoCgroup(#[source] crate::cgroup::CgroupError),
    #[error("relaying the terminal: {0}")]
    Terminal(#[source] rustix::io::Errno),
    /// The network proxy the run's allowlist needs could not start (the caller's own words:
    /// txbox's `network::Session`).
    #[error("{0}")]
    Proxy(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("waiting for the sandbox: {0}")]
    Wait(std::io::Error),
    #[error("the sandbox helper exited with status {0} without reporting the command's fate")]
    NoReport(i32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

#[derive(Debug, Clone, Default)]
pub struct LaunchOptions {
    /// Capture stdout/stderr (up to this many bytes each) instead of passing them through.
    pub capture: Option<usize>,
    /// Exceeding the capture size kills the command (`--max-output`) instead of truncating.
    pub output_limit_kills: bool,
    /// The command reads `/dev/null`, not this process's stdin.
    pub null_stdin: bool,
    pub timeout: Option<Duration>,
    /// The socket of a warm server to try first ([`crate::warm`]); without one, or when it
    /// cannot take the command, the launcher builds a sandbox of its own.
    pub warm: Option<std::path::PathBuf>,
    /// Network by allowlist: the socket on which stage 2 sends the proxy listener it makes in
    /// the sandbox ([`crate::net`]); the caller keeps it open while `launch` runs.
    pub net_handoff: Option<std::os::fd::RawFd>,
    /// The command's whole environment (`KEY=VALUE` entries), cold and warm alike; `None`:
    /// this process's. The caller decides what is in it (txbox withholds credentials).
    pub env: Option<Vec<OsString>>,
}

/// Where the command ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmUse {
    /// In a warm server's sandbox; `premounted`: in the view it had mounted ahead.
    Served { premounted: bool },
    /// In a sandbox built for it, and why.
    Cold(NotWarm),
}

impl WarmUse {
    /// Whether a warm server ran the command.
    pub fn served(&self) -> bool {
        matches!(self, WarmUse::Served { .. })
    }
}

/// Hooks the launcher calls while the sandbox runs: put it into its cgroups before it starts
/// the command, and check limits the kernel does not enforce by itself (bytes written).
pub trait Watch {
    /// Stage 2 exists (pid on the host) and waits; attach it to whatever limits it.
    fn started(&mut self, _pid: u32) -> Result<(), crate::cgroup::CgroupError> {
        Ok(())
    }
    /// Called a few times a second; a limit name kills the sandbox.
    fn check(&mut self) -> Option<&'static str> {
        None
    }
}

#[derive(Debug, Clone)]
pub struct Finished {
    pub exit: Exit,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The limit that made txbox kill the command, if any (`output`, or one from `Watch`).
    pub limit: Option<&'static str>,
    pub warm: WarmUse,
    /// The socket of a warm-server slot found without a server: start one there for the next
    /// runs ([`crate::warm::spawn`]).
    pub start_warm: Option<PathBuf>,
    /// How often the command tried to reach a network it does not have ([`crate::net`]).
    pub net_attempts: u64,
}

struct Sink {
    fd: Option<OwnedFd>,
    buf: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Sink {
    fn new(fd: Option<OwnedFd>, cap: usize) -> Sink {
        Sink { fd, buf: Vec::new(), cap, truncated: false }
    }

    /// Read what is available; false at end of file.
    fn pump(&mut self) -> bool {
        let Some(fd) = &self.fd else { return false };
        let mut chunk = [0u8; 64 * 1024];
        match rustix::io::read(fd, &mut chunk) {
            Ok(0) => {
                self.fd = None;
                false
            }
            Ok(n) => {
                let room = self.cap.saturating_sub(self.buf.len());
                self.buf.extend_from_slice(&chunk[..n.min(room)]);
                if n > room {
                    self.truncated = true;
                }
                true
            }
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => true,
            Err(_) => {
                self.fd = None;
                false
            }
        }
    }
}

/// The most `(fd, target)` pairs [`install_fds`] moves.
const MAX_INSTALL: usize = 8;

/// Move each `(fd, target)` to its target number without clobbering a source that sits on
/// another pair's target, and clear close-on-exec on the targets. A negative fd is skipped.
/// Async-signal-safe (no allocation); false if more than [`MAX_INSTALL`] pairs are given.
///
/// # Safety
/// To be called in a freshly forked child, with fds that are open.
pub(crate) unsafe fn install_fds(pairs: &[(i32, i32)]) -> bool {
    if pairs.len() > MAX_INSTALL {
        return false;
    }
    let mut moved = [-1i32; MAX_INSTALL];
    for (i, (fd, _)) in pairs.iter().enumerate() {
        if *fd >= 0 {
            // SAFETY: duplicating an open fd to a free number ≥ 10.
            moved[i] = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10) };
            if moved[i] < 0 {
                return false;
            }
        }
    }
    for (i, (_, want)) in pairs.iter().enumerate() {
        // SAFETY: dup2 onto a target number; dup2 clears close-on-exec on the new fd.
        if moved[i] >= 0 && unsafe { libc::dup2(moved[i], *want) } < 0 {
            return false;
        }
    }
    true
}

/// `KEY=VALUE` → (KEY, VALUE); an entry without `=` or with an empty key is skipped.
fn split_entry(e: &OsString) -> Option<(OsString, OsString)> {
    use std::os::unix::ffi::OsStrExt;
    let b = e.as_bytes();
    let eq = b.iter().position(|&c| c == b'=').filter(|&i| i > 0)?;
    Some((
        OsString::from(std::ffi::OsStr::from_bytes(&b[..eq])),
        OsString::from(std::ffi::OsStr::from_bytes(&b[eq + 1..])),
    ))
}

/// Make this process's environment exactly `env` (in a forked, single-threaded child only).
fn replace_environment(env: &[OsString]) {
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    for (k, v) in env.iter().filter_map(split_entry) {
        std::env::set_var(k, v);
    }
}

/// Whether this process has a single thread, which makes `fork` without `exec` safe.
fn single_threaded() -> bool {
    // Field 20 of /proc/self/stat, counted after the `(comm)` field that may hold spaces.
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().nth(17).map(str::to_string)))
        .flatten()
        .is_some_and(|n| n == "1")
}

/// The stage-2 process: forked (the fast path, for single-threaded callers like the CLI) or
/// re-executed (`txbox __stage2 ARGS`, safe from any process, e.g. a threaded server).
enum Helper {
    Forked(libc::pid_t),
    Spawned(std::process::Child),
    /// A warm server runs the command; it reports on the connection.
    Warm(Conn),
}

impl Helper {
    fn id(&self) -> u32 {
        match self {
            Helper::Forked(p) => *p as u32,
            Helper::Spawned(c) => c.id(),
            Helper::Warm(_) => 0,
        }
    }

    fn kill(&mut self) {
        match self {
            // SAFETY: signalling our own child, which we have not reaped yet.
            Helper::Forked(p) => unsafe {
                libc::kill(*p, libc::SIGKILL);
            },
            Helper::Spawned(c) => {
                let _ = c.kill();
            }
            // The server kills every process of the command, reports, and closes.
            Helper::Warm(conn) => conn.stop(),
        }
    }

    /// Reap it; returns a shell-style status (code, or 128 + signal).
    fn wait(&mut self) -> Result<i32, SandboxError> {
        match self {
            Helper::Forked(p) => loop {
                let mut st = 0;
                // SAFETY: waitpid on our own child with a valid out-pointer.
                let r = unsafe { libc::waitpid(*p, &mut st, 0) };
                if r == *p {
                    return Ok(if libc::WIFSIGNALED(st) { 128 + libc::WTERMSIG(st) } else { libc::WEXITSTATUS(st) });
                }
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(SandboxError::Wait(e));
                }
            },
            Helper::Spawned(c) => {
                use std::os::unix::process::ExitStatusExt;
                let st = c.wait().map_err(SandboxError::Wait)?;
                Ok(st.code().or(st.signal().map(|s| 128 + s)).unwrap_or(-1))
            }
            // Nothing to reap: the server's init reaped everything before it reported.
            Helper::Warm(_) => Ok(0),
        }
    }
}

/// `/dev/null` for the command's stdin, when the options ask for it.
fn null_stdin(opts: &LaunchOptions) -> rustix::io::Result<Option<OwnedFd>> {
    if !opts.null_stdin {
        return Ok(None);
    }
    rustix::fs::open("/dev/null", rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map(Some)
}

/// Hand the command to the warm server on `socket`, with this process's stdin and either its
/// stdout/stderr or capture pipes. Returns the connection and the pipes' read ends.
fn try_warm(
    socket: &Path,
    spec: &SandboxSpec,
    opts: &LaunchOptions,
) -> Result<(Conn, Option<OwnedFd>, Option<OwnedFd>), NotWarm> {
    // A terminal of its own (crate::terminal) is made by a sandbox built for the run; cgroup
    // limits need stage 2 stopped before it starts; a proxy's listener is made in a network
    // namespace of the run's own (`crate::net`).
    if spec.terminal || spec.sync || spec.proxy_port.is_some() {
        return Err(NotWarm::Unsuitable);
    }
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|_| NotWarm::Unsuitable);
    let (out, err) = match opts.capture {
        Some(_) => (Some(pipe()?), Some(pipe()?)),
        None => (None, None),
    };
    let null = null_stdin(opts).map_err(|_| NotWarm::Unsuitable)?;
    let stdio = [
        null.as_ref().map_or(rustix::stdio::stdin(), |n| n.as_fd()),
        out.as_ref().map_or(rustix::stdio::stdout(), |p| p.1.as_fd()),
        err.as_ref().map_or(rustix::stdio::stderr(), |p| p.1.as_fd()),
    ];
    let conn = crate::warm::claim(socket, spec, stdio, opts.env.as_deref())?;
    // The write ends now belong to the command; ours would hold its output open.
    Ok((conn, out.map(|(r, _)| r), err.map(|(r, _)| r)))
}

/// Run `spec` in a sandbox through the stage-2 helper at `exe` (normally `/proc/self/exe`).
pub fn launch(
    exe: &Path,
    spec: &SandboxSpec,
    opts: &LaunchOptions,
    watch: &mut dyn Watch,
) -> Result<Finished, SandboxError> {
    let spawn_err = |source| SandboxError::Spawn { exe: exe.display().to_string(), source };
    let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| spawn_err(e.into()));
    // The command's terminal interrupts reach it through its own terminal (crate::terminal);
    // txbox stays to roll back.
    let _guard = IgnoreInterrupts::new();
    let mut with_tty;
    let spec = if crate::terminal::wanted(opts.null_stdin, opts.capture.is_some()) {
        with_tty = spec.clone();
        with_tty.terminal = true;
        &with_tty
    } else {
        spec
    };
    // The first slot whose server is free takes the run. Without one, the run is built cold,
    // and the first slot found without a server gets one for the next runs; a server that
    // refuses ends the search.
    let mut start_warm = None;
    let why_cold = match opts.warm.as_deref() {
        None => NotWarm::Off,
        Some(base) => {
            let mut why = NotWarm::Busy;
            for socket in (0..crate::warm::SLOTS).map(|i| crate::warm::slot(base, i)) {
                match try_warm(&socket, spec, opts) {
                    Ok((conn, out_r, err_r)) => {
                        let report = conn.stream.try_clone().map_err(&spawn_err)?;
                        let used = WarmUse::Served { premounted: conn.premounted };
                        return supervise(Helper::Warm(conn), report, out_r, err_r, None, opts, watch, used);
                    }
                    Err(NotWarm::Busy) => {}
                    Err(NotWarm::Abandoned(why)) => {
                        return Err(SandboxError::Reported(format!("the warm server gave no answer: {why}")));
                    }
                    Err(NotWarm::Absent) => {
                        if start_warm.is_none() {
                            start_warm = Some(socket);
                            why = NotWarm::Absent;
                        }
                    }
                    Err(other) => {
                        why = other;
                        break;
                    }
                }
            }
            why
        }
    };
    let (report_r, report_w) = pipe()?;
    let (sync_r, sync_w) = pipe()?;
    let sr = if spec.sync { sync_r.as_raw_fd() } else { -1 };
    let net = opts.net_handoff.unwrap_or(-1);
    let w = report_w.as_raw_fd();
    let pty = match spec.terminal {
        true => Some(
            rustix::net::socketpair(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::STREAM,
                rustix::net::SocketFlags::CLOEXEC,
                None,
            )
            .map_err(|e| spawn_err(e.into()))?,
        ),
        false => None,
    };
    let pt = pty.as_ref().map_or(-1, |(_, child)| child.as_raw_fd());
    let (mut child, out_r, err_r) = if single_threaded() && std::env::var_os("TXBOX_REEXEC").is_none() {
        let (out, err) = match opts.capture {
            Some(_) => (Some(pipe()?), Some(pipe()?)),
            None => (None, None),
        };
        let out_w = out.as_ref().map_or(-1, |p| p.1.as_raw_fd());
        let err_w = err.as_ref().map_or(-1, |p| p.1.as_raw_fd());
        let null = null_stdin(opts).map_err(|e| spawn_err(e.into()))?;
        let in_r = null.as_ref().map_or(-1, |n| n.as_raw_fd());
        // SAFETY: this process is single-threaded (checked above), so the child may run
        // ordinary Rust code; it never returns from `run_spec`.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(spawn_err(std::io::Error::last_os_error()));
        }
        if pid == 0 {
            // Stage 2 execs the command with its own environment: make it the one asked for.
            // This child is single-threaded (a fork of a single-threaded process), so nothing
            // reads the environment while it changes.
            if let Some(env) = &opts.env {
                replace_environment(env);
            }
            // SAFETY: in the forked child, with fds inherited from the parent.
            if !unsafe {
                install_fds(&[
                    (in_r, 0),
                    (out_w, 1),
                    (err_w, 2),
                    (w, REPORT_FD),
                    (sr, SYNC_FD),
                    (pt, PTY_FD),
                    (net, NET_FD),
                ])
            } {
                // SAFETY: leaving the forked child without touching the parent's state.
                unsafe { libc::_exit(125) };
            }
            crate::stage2::run_spec(spec);
        }
        (Helper::Forked(pid), out.map(|(r, _)| r), err.map(|(r, _)| r))
    } else {
        let mut cmd = Command::new(exe);
        cmd.arg0("txbox-sandbox").arg("__stage2").args(spec.to_args());
        if let Some(env) = &opts.env {
            cmd.env_clear().envs(env.iter().filter_map(split_entry));
        }
        if opts.capture.is_some() {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        if opts.null_stdin {
            cmd.stdin(Stdio::null());
        }
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
        // syscalls (fcntl, dup2) on fds that exist in the child.
        unsafe {
            cmd.pre_exec(move || {
                // Nothing this process's caller left open goes on (crate::fds).
                crate::fds::cloexec_from(3);
                if install_fds(&[(w, REPORT_FD), (sr, SYNC_FD), (pt, PTY_FD), (net, NET_FD)]) {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let mut c = cmd.spawn().map_err(spawn_err)?;
        let (o, e) = (c.stdout.take().map(OwnedFd::from), c.stderr.take().map(OwnedFd::from));
        (Helper::Spawned(c), o, e)
    };
    drop(report_w);
    drop(sync_r);
    let pty = pty.map(|(ours, _)| ours);
    if spec.sync {
        if let Err(e) = watch.started(child.id()) {
            child.kill();
            let _ = child.wait();
            return Err(SandboxError::Attach(e));
        }
        let _ = rustix::io::write(&sync_w, b"g");
    }
    drop(sync_w);
    let relay = match pty.as_ref().and_then(crate::terminal::receive_master) {
        None => None,
        Some(master) => match Relay::start(master, opts.null_stdin, opts.capture.is_some()) {
            Ok(r) => Some(r),
            Err(e) => {
                child.kill();
                let _ = child.wait();
                return Err(SandboxError::Terminal(e));
            }
        },
    };
    let mut finished = supervise(child, report_r, out_r, err_r, relay, opts, watch, WarmUse::Cold(why_cold))?;
    finished.start_warm = start_warm;
    Ok(finished)
}

/// Stream or capture the command's output, relay its terminal, enforce the timeout and the
/// watched limits, and read its fate from `report`.
#[allow(clippy::too_many_arguments)]
fn supervise(
    mut child: Helper,
    report_r: OwnedFd,
    out_r: Option<OwnedFd>,
    err_r: Option<OwnedFd>,
    mut relay: Option<Relay>,
    opts: &LaunchOptions,
    watch: &mut dyn Watch,
    warm: WarmUse,
) -> Result<Finished, SandboxError> {
    let mut limit: Option<&'static str> = None;
    let mut next_check = Instant::now();
    let cap = opts.capture.unwrap_or(0);
    let mut out = Sink::new(out_r, cap);
    let mut err = Sink::new(err_r, cap);
    let mut report = Sink::new(Some(report_r), 64 * 1024);
    let deadline = opts.timeout.map(|t| Instant::now() + t);
    let mut timed_out = false;
    let killed = |child: &mut Helper| {
        // Killing stage 2 kills init through its parent-death signal, and with init the whole
        // pid namespace.
        child.kill();
    };
    let mut stopped = false;
    let relaying = |r: &Option<Relay>| r.as_ref().is_some_and(|r| r.master.is_some());
    while out.fd.is_some() || err.fd.is_some() || report.fd.is_some() || relaying(&relay) {
        let stopping = timed_out || limit.is_some() || stopped;
        if !stopping {
            if opts.output_limit_kills && (out.truncated || err.truncated) {
                limit = Some("output");
                killed(&mut child);
                continue;
            }
            if Instant::now() >= next_check {
                next_check = Instant::now() + CHECK_EVERY;
                if let Some(l) = watch.check() {
                    limit = Some(l);
                    killed(&mut child);
                    continue;
                }
            }
        }
        let mut wait = if stopping { None } else { Some(CHECK_EVERY) };
        if let (Some(d), false) = (deadline, stopping) {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                killed(&mut child);
                timed_out = true;
                continue;
            }
            wait = Some(wait.map_or(left, |w| w.min(left)));
        }
        let timeout = wait
            .map(|w| rustix::event::Timespec::try_from(w).unwrap_or(rustix::event::Timespec { tv_sec: 1, tv_nsec: 0 }));
        let mut fds = Vec::with_capacity(6);
        let mut which = Vec::with_capacity(6);
        for (i, s) in [&out, &err, &report].into_iter().enumerate() {
            if let Some(fd) = &s.fd {
                fds.push(PollFd::new(fd, PollFlags::IN));
                which.push(i);
            }
        }
        let relay_fds = relay.as_ref().map(|r| r.poll_fds()).unwrap_or_default();
        for (fd, flags, tag) in &relay_fds {
            fds.push(PollFd::from_borrowed_fd(*fd, *flags));
            which.push(3 + usize::from(*tag));
        }
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(SandboxError::Wait(e.into())),
        }
        let ready: Vec<usize> =
            fds.iter().zip(&which).filter(|(p, _)| !p.revents().is_empty()).map(|(_, i)| *i).collect();
        drop(fds);
        drop(relay_fds);
        for i in ready {
            match i {
                0 => {
                    out.pump();
                }
                1 => {
                    err.pump();
                }
                2 => {
                    report.pump();
                }
                tag => {
                    let asked = relay.as_mut().map(|r| r.ready((tag - 3) as u8));
                    if asked == Some(crate::terminal::Request::Stop) && !stopped {
                        // The caller was told to stop: so is the command (and rolled back).
                        stopped = true;
                        killed(&mut child);
                    }
                }
            }
        }
    }
    // The caller's terminal mode is back before anything is printed.
    drop(relay);
    let status = child.wait()?;
    let text = String::from_utf8_lossy(&report.buf);
    let net_attempts = text.lines().filter_map(crate::net::parse_report_line).sum();
    let exit = match Report::of_stream(&text) {
        Some(Report::Error(why)) => return Err(SandboxError::Reported(why)),
        Some(Report::Exit(c)) => Some(Exit::Code(c)),
        Some(Report::Signal(s)) => Some(Exit::Signal(s)),
        None => None,
    };
    let exit = match (exit, timed_out || limit.is_some()) {
        (Some(e), _) => e,
        (None, true) => Exit::Signal(libc::SIGKILL),
        (None, false) => return Err(SandboxError::NoReport(status)),
    };
    Ok(Finished {
        exit,
        timed_out,
        stdout: out.buf,
        stderr: err.buf,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        limit,
        warm,
        start_warm: None,
        net_attempts,
    })
}

/// Ignore SIGINT and SIGQUIT while the sandbox runs; restore on drop.
struct IgnoreInterrupts {
    old: [libc::sighandler_t; 2],
}

impl IgnoreInterrupts {
    fn new() -> IgnoreInterrupts {
        // SAFETY: installing SIG_IGN is async-signal-safe and has no handler to race with.
        let old = unsafe { [libc::signal(libc::SIGINT, libc::SIG_IGN), libc::signal(libc::SIGQUIT, libc::SIG_IGN)] };
        IgnoreInterrupts { old }
    }
}

impl Drop for IgnoreInterrupts {
    fn drop(&mut self) {
        // SAFETY: restores the dispositions saved in `new`.
        unsafe {
            libc::signal(libc::SIGINT, self.old[0]);
            libc::signal(libc::SIGQUIT, self.old[1]);
        }
    }
}

/// Lossless argv for the string form: `bash -c STRING` (or `sh` where bash is missing).
pub fn shell_argv(script: &str) -> Vec<OsString> {
    let shell = if Path::new("/bin/bash").exists() { "/bin/bash" } else { "/bin/sh" };
    vec![OsString::from(shell), OsString::from("-c"), OsString::from(script)]
}
