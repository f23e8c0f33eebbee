//! The command never shares the caller's controlling terminal.
//!
//! A process that shares a terminal with the caller's shell can push input into it
//! (`TIOCSTI`), which that shell then runs after txbox returns. So the command always starts a
//! session of its own, and the seccomp filter refuses `TIOCSTI` and `TIOCLINUX` besides. When
//! the caller has a terminal (a person at a shell), the command gets one too, but its own: a
//! pseudo-terminal of the sandbox's devpts, whose master the launcher relays to and from the
//! caller's terminal (in raw mode, restored on every way out), with the caller's modes and
//! window size, window changes forwarded, and interrupts from the keyboard arriving as the
//! terminal's own (job control inside works: the command has a controlling terminal).
//!
//! ```text
//! caller's tty ⇄ launcher (raw) ⇄ master ─ devpts ─ slave = the command's stdio and ctty
//! ```
//!
//! Owns the command's pty and its relay; may not hand the command any descriptor of the caller's
//! terminal.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage};

use crate::stage2::{at, errno, StepError};

fn last() -> Errno {
    Errno::from_raw_os_error(errno())
}

fn is_tty(fd: RawFd) -> bool {
    // SAFETY: isatty only queries a descriptor number.
    unsafe { libc::isatty(fd) == 1 }
}

/// The first of the stdio descriptors that is a terminal.
fn caller_tty() -> Option<RawFd> {
    (0..3).find(|&fd| is_tty(fd))
}

/// In stage 2, after the mount plan: a pseudo-terminal of the sandbox's devpts, set up like
/// the caller's terminal. Its master goes to the launcher over `sock` (then closed); the slave
/// is returned, for the command.
pub(crate) fn open_for_launcher(sock: RawFd) -> Result<OwnedFd, StepError> {
    let master = rustix::fs::open("/dev/ptmx", OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())
        .map_err(at("open /dev/ptmx"))?;
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int; TIOCGPTPEER opens the slave and returns a descriptor.
    let slave = unsafe {
        if libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) != 0 {
            return Err(StepError::new("unlock the terminal", last()));
        }
        libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC)
    };
    if slave < 0 {
        return Err(StepError::new("open the terminal's slave", last()));
    }
    // SAFETY: a new descriptor from TIOCGPTPEER.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    if let Some(tty) = caller_tty() {
        // SAFETY: termios and winsize are plain structs the ioctls fill and read.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(tty, &mut t) == 0 {
                libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t);
            }
            copy_size(tty, slave.as_raw_fd());
        }
    }
    // SAFETY: `sock` was installed by the launcher; borrowed for this send, closed after.
    let s = unsafe { BorrowedFd::borrow_raw(sock) };
    let fds = [master.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(s, &[IoSlice::new(b"t")], &mut control, rustix::net::SendFlags::NOSIGNAL)
        .map_err(at("hand the terminal to the launcher"))?;
    // SAFETY: closing our copy of the launcher's socket; nothing else uses it.
    unsafe { libc::close(sock) };
    Ok(slave)
}

/// Copy the window size of terminal `from` to `to`.
fn copy_size(from: RawFd, to: RawFd) {
    // SAFETY: TIOCGWINSZ fills a winsize; TIOCSWINSZ reads one.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(from, libc::TIOCGWINSZ, &mut ws) == 0 {
            libc::ioctl(to, libc::TIOCSWINSZ, &ws);
        }
    }
}

/// In the command's process before exec: a session of its own and, with `slave`, that
/// terminal as its controlling one, in place of every stdio descriptor that is the caller's
/// terminal. Async-signal-safe (also used by the warm server's `CLONE_VM` child).
pub(crate) fn take(slave: Option<RawFd>) -> Result<(), StepError> {
    // SAFETY: setsid, ioctl and dup2 on descriptors of this process.
    unsafe {
        if libc::setsid() < 0 {
            return Err(StepError::new("setsid", last()));
        }
        let Some(slave) = slave else { return Ok(()) };
        if libc::ioctl(slave, libc::TIOCSCTTY, 0) != 0 {
            return Err(StepError::new("make the terminal controlling", last()));
        }
        for fd in 0..3 {
            if is_tty(fd) && libc::dup2(slave, fd) < 0 {
                return Err(StepError::new("install the terminal", last()));
            }
        }
    }
    Ok(())
}

/// In the launcher: receive the master stage 2 sends on `sock` (None if it sent none: the
/// sandbox failed before, and its report says why).
pub fn receive_master(sock: &OwnedFd) -> Option<OwnedFd> {
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut b = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut b)];
    loop {
        match rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(_) => break,
            Err(Errno::INTR) => continue,
            Err(_) => return None,
        }
    }
    control.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    })
}

/// Whether the launcher should give the command a terminal: one of the descriptors the command
/// would get from the caller is a terminal.
pub fn wanted(null_stdin: bool, capture: bool) -> bool {
    (!null_stdin && is_tty(0)) || (!capture && (is_tty(1) || is_tty(2)))
}

/// The signal numbers the relay's handler has seen, for its loop to act on.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = [sig as u8];
        // SAFETY: write is async-signal-safe; the pipe is non-blocking (a full pipe drops it).
        unsafe { libc::write(fd, b.as_ptr().cast(), 1) };
    }
}

/// The signals the relay handles while it runs.
const RELAYED: [i32; 5] = [libc::SIGWINCH, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP];

/// The launcher's side of the command's terminal.
pub struct Relay {
    pub master: Option<OwnedFd>,
    /// The caller's terminal to read keys from (stdin), when it is one.
    pub input: bool,
    /// Where what the command writes to its terminal goes.
    out: Option<OwnedFd>,
    /// Keys read but not yet taken by the master.
    pending: Vec<u8>,
    signals: OwnedFd,
    signals_w: OwnedFd,
    saved_mode: Option<libc::termios>,
    saved_handlers: Vec<(i32, libc::sigaction)>,
}

/// What the relay asks of the launcher.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    Nothing,
    /// The caller was told to stop (SIGTERM, SIGHUP): end the command.
    Stop,
}

impl Relay {
    /// Start relaying `master`: the caller's terminal in raw mode when it is stdin (keys go
    /// to the command's terminal, whose line discipline makes ^C an interrupt), and signal
    /// handlers for the rest.
    pub fn start(master: OwnedFd, null_stdin: bool, capture: bool) -> Result<Relay, Errno> {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)?;
        let _ = rustix::io::ioctl_fionbio(&master, true);
        let input = !null_stdin && is_tty(0);
        let out = [(!capture).then_some(1), Some(2)]
            .into_iter()
            .flatten()
            .find(|&fd| is_tty(fd))
            .and_then(|fd| {
                rustix::io::fcntl_dupfd_cloexec(
                    // SAFETY: borrowing one of this process's stdio descriptors for the dup.
                    unsafe { BorrowedFd::borrow_raw(fd) },
                    3,
                )
                .ok()
            })
            .or_else(|| {
                rustix::fs::open("/dev/tty", OFlags::WRONLY | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty()).ok()
            });
        let mut relay = Relay {
            master: Some(master),
            input,
            out,
            pending: Vec::new(),
            signals: r,
            signals_w: w,
            saved_mode: None,
            saved_handlers: Vec::new(),
        };
        SIGNAL_PIPE.store(relay.signals_w.as_raw_fd(), Ordering::Relaxed);
        for sig in RELAYED {
            // SAFETY: installing a handler that only writes to a pipe; the old one is kept
            // to be restored.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as *const () as usize;
                sa.sa_flags = libc::SA_RESTART;
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &sa, &mut old) == 0 {
                    relay.saved_handlers.push((sig, old));
                }
            }
        }
        if relay.input {
            // SAFETY: tcgetattr/tcsetattr on stdin with termios structs we own. Setting the
            // mode from the background stops us (SIGTTOU) until the shell brings us back, as
            // any interactive program.
            unsafe {
                let mut t: libc::termios = std::mem::zeroed();
                if libc::tcgetattr(0, &mut t) == 0 {
                    relay.saved_mode = Some(t);
                    let mut raw = t;
                    libc::cfmakeraw(&mut raw);
                    libc::tcsetattr(0, libc::TCSANOW, &raw);
                }
            }
        }
        Ok(relay)
    }

    /// The descriptors to wait on, with what to wait for.
    pub fn poll_fds(&self) -> Vec<(BorrowedFd<'_>, rustix::event::PollFlags, u8)> {
        use rustix::event::PollFlags;
        let mut v = vec![(self.signals.as_fd(), PollFlags::IN, 0)];
        if let Some(m) = &self.master {
            let mut f = PollFlags::IN;
            if !self.pending.is_empty() {
                f |= PollFlags::OUT;
            }
            v.push((m.as_fd(), f, 1));
        }
        if self.input && self.pending.len() < 64 << 10 {
            // SAFETY: stdin stays open for this process's life.
            v.push((unsafe { BorrowedFd::borrow_raw(0) }, PollFlags::IN, 2));
        }
        v
    }

    /// Act on descriptor `which` (from `poll_fds`) being ready.
    pub fn ready(&mut self, which: u8) -> Request {
        match which {
            0 => return self.signals(),
            1 => {
                self.drain_master();
                self.feed_master();
            }
            _ => self.read_keys(),
        }
        Request::Nothing
    }

    fn signals(&mut self) -> Request {
        let mut b = [0u8; 16];
        let mut req = Request::Nothing;
        while let Ok(n) = rustix::io::read(&self.signals, &mut b) {
            if n == 0 {
                break;
            }
            for &sig in &b[..n] {
                match i32::from(sig) {
                    libc::SIGWINCH => {
                        if let (Some(tty), Some(m)) = (caller_tty(), &self.master) {
                            copy_size(tty, m.as_raw_fd());
                        }
                    }
                    // What the keyboard would have sent: the command's terminal turns it into
                    // the signal for its foreground process group.
                    libc::SIGINT => self.key(libc::VINTR),
                    libc::SIGQUIT => self.key(libc::VQUIT),
                    _ => req = Request::Stop,
                }
            }
        }
        req
    }

    fn key(&mut self, which: usize) {
        let Some(m) = &self.master else { return };
        // SAFETY: an all-zero termios is a valid value for tcgetattr to fill.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr on the master fills a termios we own.
        if unsafe { libc::tcgetattr(m.as_raw_fd(), &mut t) } == 0 {
            self.pending.push(t.c_cc[which]);
            self.feed_master();
        }
    }

    fn drain_master(&mut self) {
        let Some(m) = &self.master else { return };
        let mut buf = [0u8; 16 << 10];
        loop {
            match rustix::io::read(m, &mut buf) {
                Ok(0) | Err(Errno::IO) => {
                    // Every holder of the slave is gone: nothing more will come.
                    self.master = None;
                    return;
                }
                Ok(n) => {
                    if let Some(out) = &self.out {
                        let _ = write_all(out.as_fd(), &buf[..n]);
                    }
                }
                Err(Errno::INTR) => continue,
                Err(_) => return, // EAGAIN: all read
            }
        }
    }

    fn feed_master(&mut self) {
        let Some(m) = &self.master else { return };
        while !self.pending.is_empty() {
            match rustix::io::write(m, &self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(Errno::INTR) => continue,
                Err(_) => return,
            }
        }
    }

    fn read_keys(&mut self) {
        let mut buf = [0u8; 16 << 10];
        // SAFETY: stdin stays open for this process's life.
        let stdin = unsafe { BorrowedFd::borrow_raw(0) };
        match rustix::io::read(stdin, &mut buf) {
            Ok(0) => self.input = false,
            Ok(n) => {
                self.pending.extend_from_slice(&buf[..n]);
                self.feed_master();
            }
            Err(Errno::INTR | Errno::AGAIN) => {}
            Err(_) => self.input = false,
        }
    }
}

fn write_all(fd: BorrowedFd<'_>, mut rest: &[u8]) -> Result<(), Errno> {
    while !rest.is_empty() {
        match rustix::io::write(fd, rest) {
            Ok(n) => rest = &rest[n..],
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(t) = &self.saved_mode {
            // SAFETY: restoring the mode saved in `start`.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, t) };
        }
        SIGNAL_PIPE.store(-1, Ordering::Relaxed);
        for (sig, old) in &self.saved_handlers {
            // SAFETY: restoring the handler saved in `start`.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
    }
}
