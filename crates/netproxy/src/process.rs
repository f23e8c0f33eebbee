//! The proxy's processes, and the handle the engine holds while a command runs.
//!
//! ```text
//! txbox (engine) ── exec `txbox __netproxy` ─ B: broker (unconfined): resolves, connects
//!     │  fd 0: the config (JSON)                 └─ fork ─ P: proxy (confined, see `confine`)
//!     │  fd 3: the hand-off socket ◄── stage 2 sends the listener it made in the sandbox's
//!     │                                network namespace; P accepts the command's connections
//!     │  fd 4: stop (EOF: the command is done)
//!     └─ fd 5: the report (JSON), written by P when it stops
//! ```
//!
//! B is exec'd, not forked from the engine, because the engine may be multi-threaded (`serve`);
//! B forks P while it is still single-threaded. Both die with the engine (parent-death signal).

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketFlags, SocketType};

use crate::allow::Allowlist;
use crate::broker::{self, Rules};
use crate::fd;
use crate::proxy::{self, Limits, Shared};
use crate::report::Report;
use crate::upstream::Upstream;

/// The hidden subcommand that runs the broker and the proxy.
pub const SUBCOMMAND: &str = "__netproxy";

const HANDOFF_FD: i32 = 3;
const STOP_FD: i32 = 4;
const REPORT_FD: i32 = 5;
/// The largest report read back.
const MAX_REPORT: usize = 16 << 20;
/// The largest config read.
const MAX_CONFIG: u64 = 16 << 20;

/// What the proxy enforces for one command.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Config {
    pub allow: Allowlist,
    #[serde(default)]
    pub upstream: Upstream,
    #[serde(default)]
    pub limits: Limits,
}

/// The running proxy of one command.
pub struct Running {
    child: Child,
    /// Given to stage 2 (the sandbox), which sends the listener on it.
    sandbox_end: Option<OwnedFd>,
    stop: Option<OwnedFd>,
    report: OwnedFd,
}

fn io_err(e: rustix::io::Errno) -> std::io::Error {
    e.into()
}

/// Start the proxy for `config`: `exe __netproxy` (normally `/proc/self/exe`).
pub fn start(exe: &Path, config: &Config) -> std::io::Result<Running> {
    let (proxy_end, sandbox_end) =
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(io_err)?;
    let (stop_r, stop_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io_err)?;
    let (report_r, report_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io_err)?;
    let json = serde_json::to_vec(config).map_err(std::io::Error::other)?;
    let pairs = [(proxy_end.as_raw_fd(), HANDOFF_FD), (stop_r.as_raw_fd(), STOP_FD), (report_w.as_raw_fd(), REPORT_FD)];
    let mut cmd = Command::new(exe);
    cmd.arg0("txbox-netproxy")
        .arg(SUBCOMMAND)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure runs between fork and exec and makes only async-signal-safe calls
    // (fcntl, dup2) on descriptors open in the child.
    unsafe {
        cmd.pre_exec(move || if install(&pairs) { Ok(()) } else { Err(std::io::Error::last_os_error()) });
    }
    let mut child = cmd.spawn()?;
    drop((proxy_end, stop_r, report_w));
    if let Some(mut stdin) = child.stdin.take() {
        // The child reads its config before anything else, so this cannot deadlock.
        std::io::Write::write_all(&mut stdin, &json)?;
    }
    Ok(Running { child, sandbox_end: Some(sandbox_end), stop: Some(stop_w), report: report_r })
}

/// dup each `(fd, target)` pair into place (via numbers ≥ 10 first, so no source is clobbered)
/// without close-on-exec. Async-signal-safe.
fn install(pairs: &[(i32, i32); 3]) -> bool {
    let mut moved = [-1i32; 3];
    for (i, (fd, _)) in pairs.iter().enumerate() {
        // SAFETY: duplicating an fd open in this (forked) process.
        moved[i] = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10) };
        if moved[i] < 0 {
            return false;
        }
    }
    for (i, (_, target)) in pairs.iter().enumerate() {
        // SAFETY: dup2 onto a fixed number; it clears close-on-exec on the target.
        if unsafe { libc::dup2(moved[i], *target) } < 0 {
            return false;
        }
    }
    true
}

impl Running {
    /// The socket stage 2 sends the sandbox's listener on (stays open until [`finish`](Self::finish)
    /// or [`sandbox_started`](Self::sandbox_started)).
    pub fn sandbox_end(&self) -> Option<BorrowedFd<'_>> {
        self.sandbox_end.as_ref().map(|f| f.as_fd())
    }

    /// The sandbox has its copy of the hand-off socket: close ours, so that the proxy sees the
    /// end of it if the sandbox never sends a listener.
    pub fn sandbox_started(&mut self) {
        self.sandbox_end = None;
    }

    /// The command is over: stop the proxy and take its report.
    pub fn finish(mut self) -> Report {
        self.sandbox_end = None;
        self.stop = None;
        let text = fd::read_to_end(self.report.as_fd(), MAX_REPORT, Instant::now() + Duration::from_secs(5));
        let _ = self.child.kill();
        let _ = self.child.wait();
        match text {
            Ok(t) if t.is_empty() => {
                Report { error: Some("the proxy exited without a report".into()), ..Report::default() }
            }
            Ok(t) => serde_json::from_slice(&t)
                .unwrap_or_else(|e| Report { error: Some(format!("the proxy's report: {e}")), ..Report::default() }),
            Err(e) => Report { error: Some(format!("reading the proxy's report: {e}")), ..Report::default() },
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `txbox __netproxy`: B, which forks P. Never returns.
pub fn main() -> ! {
    // Only what `start` installed stays open: a descriptor txbox's caller left open (a host
    // file, a directory) must not reach P, which parses what the sandbox sends.
    close_from(REPORT_FD + 1);
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    // A session of its own: the terminal's signals are not for it (it dies with txbox), and
    // with the scheduler's autogroups it gets a share of the CPU of its own rather than one
    // taken from the command it serves, which on a busy machine delayed every relayed packet.
    let _ = rustix::process::setsid();
    let mut text = Vec::new();
    let config: Config = match std::io::stdin().lock().take(MAX_CONFIG).read_to_end(&mut text) {
        Ok(_) => match serde_json::from_slice(&text) {
            Ok(c) => c,
            Err(e) => fail(&format!("the proxy's config: {e}")),
        },
        Err(e) => fail(&format!("reading the proxy's config: {e}")),
    };
    let (broker_end, proxy_end) =
        match rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None) {
            Ok(p) => p,
            Err(e) => fail(&format!("the broker's channel: {e}")),
        };
    // SAFETY: a fresh exec that started no threads, so the child may run ordinary code.
    match unsafe { libc::fork() } {
        0 => {
            drop(broker_end);
            proxy_main(config, proxy_end)
        }
        p if p > 0 => {
            drop(proxy_end);
            // SAFETY: closing the descriptors only P uses; B keeps none of them.
            unsafe {
                libc::close(HANDOFF_FD);
                libc::close(STOP_FD);
                libc::close(REPORT_FD);
            }
            broker::serve(broker_end, Rules { allow: config.allow, upstream: config.upstream });
            exit(0)
        }
        _ => fail(&format!("fork: {}", std::io::Error::last_os_error())),
    }
}

/// Close every descriptor from `first` on (`close_range`, else one by one up to the limit).
fn close_from(first: i32) {
    // SAFETY: close_range takes integers only; the descriptors closed are this process's own,
    // and nothing in it uses them (it has just been exec'd).
    if unsafe { libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32) } == 0 {
        return;
    }
    let max = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(1024).min(1 << 20);
    for fd in first..max as i32 {
        // SAFETY: as above; EBADF for numbers that are not open.
        unsafe { libc::close(fd) };
    }
}

fn exit(code: i32) -> ! {
    // SAFETY: ends the process without running handlers that belong to nothing here.
    unsafe { libc::_exit(code) }
}

/// Report `why` (the command then has no network) and leave.
fn fail(why: &str) -> ! {
    write_report(&Report { error: Some(why.to_string()), ..Report::default() });
    exit(1)
}

fn write_report(r: &Report) {
    // SAFETY: REPORT_FD was installed by `start`; borrowed for this write only.
    let fd = unsafe { BorrowedFd::borrow_raw(REPORT_FD) };
    let text = serde_json::to_vec(r).unwrap_or_default();
    let _ = fd::write_all(fd, &text);
}

/// P: confine, take the listener from the sandbox, serve until told to stop, report.
fn proxy_main(config: Config, broker_end: OwnedFd) -> ! {
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    // SAFETY: closing our copy of the config pipe; nothing else refers to it.
    unsafe { libc::close(0) };
    let confinement = match crate::confine::confine() {
        Ok(how) => how,
        Err(e) => fail(&format!("confining the proxy: {e}")),
    };
    // SAFETY: both were installed by `start` and are owned by this process from here on.
    let (handoff, stop) = unsafe { (OwnedFd::from_raw_fd(HANDOFF_FD), OwnedFd::from_raw_fd(STOP_FD)) };
    let Some(listener) = receive_listener(&handoff, &stop) else {
        write_report(&Report { confinement, ..Report::default() });
        exit(0)
    };
    drop(handoff);
    let shared: Arc<Shared> = Shared::new(config.allow, broker::Client::new(broker_end), config.limits);
    let mut report = proxy::serve(&listener, stop.as_fd(), &shared);
    report.confinement = confinement;
    write_report(&report);
    exit(0)
}

/// Wait for the sandbox's listener, or for the end of the hand-off socket or a stop.
fn receive_listener(handoff: &OwnedFd, stop: &OwnedFd) -> Option<OwnedFd> {
    loop {
        let mut fds = [
            rustix::event::PollFd::new(handoff, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(stop, rustix::event::PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return None,
        }
        if !fds[0].revents().is_empty() {
            let mut buf = [0u8; 16];
            return match fd::recv(handoff.as_fd(), &mut buf) {
                Ok((_, Some(listener))) => Some(listener),
                _ => None,
            };
        }
        if !fds[1].revents().is_empty() {
            return None;
        }
    }
}
