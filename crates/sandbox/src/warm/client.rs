//! The caller's side: claim a warm server for one command, or say why not (then the launcher
//! builds a sandbox of its own), and start a server for next time.
//!
//! May not build a sandbox: the launcher or the server does.

use std::ffi::OsString;
use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::net::{
    AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use super::wire::{with_suffix, Answer, Request, ServerArgs, FIXED_FDS, MAX_LAYERS, RESOURCES};
use crate::SandboxSpec;

/// How long a server may take to say whether it runs a command (it mounts the overlay first).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a command did not run in a warm server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotWarm {
    /// Warm servers are off for this run.
    Off,
    /// The run needs what only a sandbox of its own gives: a terminal (job control, the
    /// controlling tty), cgroup limits set up before the command starts, many layers.
    Unsuitable,
    /// No server listens on the socket: start one for next time.
    Absent,
    /// The server is serving another transaction.
    Busy,
    /// The server answered but did not take the command (its reason).
    Refused(String),
    /// The server took the request but gave no answer, and still holds the run's work
    /// directory after it was stopped: no sandbox may be built on the run's directories.
    Abandoned(String),
}

/// A claimed server: the connection on which it reports, and the busy lock held while it works.
pub struct Conn {
    pub(crate) stream: OwnedFd,
    /// The command runs in the view the server had mounted before the request came.
    pub premounted: bool,
    _busy: OwnedFd,
}

impl Conn {
    /// Ask the server to kill the command (it reports `signal 9` and closes).
    pub fn stop(&self) {
        let _ = rustix::net::shutdown(&self.stream, rustix::net::Shutdown::Write);
    }
}

/// Hand `spec`'s command to the server on `socket`, with `stdio` as its stdin, stdout, stderr.
/// `env`: the command's environment (`KEY=VALUE`); `None`: this process's.
pub fn claim(
    socket: &Path,
    spec: &SandboxSpec,
    stdio: [BorrowedFd<'_>; 3],
    env: Option<&[OsString]>,
) -> Result<Conn, NotWarm> {
    if spec.layers.len() > MAX_LAYERS {
        return Err(NotWarm::Unsuitable);
    }
    // A slot whose name does not fit a socket address never has a server (one more slot's
    // name is two bytes longer than the first's): not worth a server started for it.
    let addr = SocketAddrUnix::new(socket).map_err(|_| NotWarm::Unsuitable)?;
    // Only one client at a time; the others build their own sandboxes rather than wait.
    let busy = open_busy(socket)?;
    if rustix::fs::flock(&busy, FlockOperation::NonBlockingLockExclusive).is_err() {
        return Err(NotWarm::Busy);
    }
    let stream = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(|_| NotWarm::Absent)?;
    if rustix::net::connect(&stream, &addr).is_err() {
        return Err(NotWarm::Absent);
    }
    // The server must be our own user's (the state directory is, but be sure).
    match super::peer_uid(stream.as_fd()) {
        Ok(uid) if uid == rustix::process::geteuid().as_raw() => {}
        _ => return Err(NotWarm::Refused("the server belongs to another user".into())),
    }
    let refused = |what: &str, e: rustix::io::Errno| NotWarm::Refused(format!("{what}: {e}"));
    let open_dir = |p: &Path| rustix::fs::open(p, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty());
    let mut dirs: Vec<OwnedFd> = Vec::with_capacity(3 + spec.layers.len());
    for p in [&spec.workspace, &spec.upper, &spec.work].into_iter().chain(spec.layers.iter()) {
        dirs.push(open_dir(p).map_err(|e| refused(&format!("open {}", p.display()), e))?);
    }
    let env = env.map_or_else(environment, <[OsString]>::to_vec);
    let req = Request { binary: super::binary_id(), spec: spec.clone(), env, umask: umask(), rlimits: rlimits() };
    let frame = req.encode();
    let mut fds: Vec<BorrowedFd<'_>> = stdio.to_vec();
    fds.extend(dirs.iter().map(|d| d.as_fd()));
    debug_assert_eq!(fds.len(), FIXED_FDS + spec.layers.len());
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(NotWarm::Unsuitable);
    }
    let sent = rustix::net::sendmsg(&stream, &[IoSlice::new(&frame)], &mut control, SendFlags::NOSIGNAL)
        .and_then(|sent| write_all(&stream, &frame[sent..]));
    if let Err(e) = sent {
        // A server that refuses who is asking says so before it reads the request.
        return Err(match read_line(&stream).ok().as_deref().and_then(Answer::parse) {
            Some(Answer::Refuse(why)) => NotWarm::Refused(why),
            _ => refused("sending the request", e),
        });
    }
    drop(dirs);
    let _ =
        rustix::net::sockopt::set_socket_timeout(&stream, rustix::net::sockopt::Timeout::Recv, Some(ANSWER_TIMEOUT));
    let line = match read_line(&stream) {
        Ok(line) => line,
        Err(e) => return Err(abandon(stream, &spec.work, format!("reading the answer: {e}"))),
    };
    let _ = rustix::net::sockopt::set_socket_timeout(&stream, rustix::net::sockopt::Timeout::Recv, None);
    match Answer::parse(&line) {
        Some(Answer::Ok { premounted }) => Ok(Conn { stream, premounted, _busy: busy }),
        Some(Answer::Refuse(why)) => Err(NotWarm::Refused(why)),
        None => Err(abandon(stream, &spec.work, format!("unexpected answer {line:?}"))),
    }
}

/// How long a client waits, after stopping a server that gave no answer, for the run's work
/// directory to be let go.
const LET_GO_TIMEOUT: Duration = Duration::from_secs(60);

/// The server took the request but gave no answer: it stalled (the answer timed out), or it
/// died. One that stalled may still act on the run's directories (exchange them for its
/// premount, mount a view on them), and a sandbox the client builds on them now would share
/// them with that view. So the server is stopped (it is this user's; `SO_PEERPIDFD` names it
/// without a race: the process that listens, whose death takes its namespaces and views with
/// it), and the run's work directory waited for until no view holds its share lock. Then the
/// client may build its own sandbox (`Refused`); if the lock stays held, it may not
/// (`Abandoned`).
fn abandon(stream: OwnedFd, work: &Path, why: String) -> NotWarm {
    if let Ok(pidfd) = super::peer_pidfd(stream.as_fd()) {
        let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
    }
    drop(stream);
    let free = || {
        let Ok(fd) = rustix::fs::open(work, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) else {
            return true; // nothing there to share
        };
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok()
    };
    let deadline = std::time::Instant::now() + LET_GO_TIMEOUT;
    while !free() {
        if std::time::Instant::now() >= deadline {
            return NotWarm::Abandoned(format!("{why}; the server still holds {}", work.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    NotWarm::Refused(why)
}

/// The busy lock of the server on `socket`, made on first use only where a server has listened:
/// a run looks at every slot (`crate::warm::SLOTS`), and one never served must not leave a file
/// behind for each. Never removed (a client holding the old one and another making a new one
/// would both get in).
fn open_busy(socket: &Path) -> Result<OwnedFd, NotWarm> {
    let path = with_suffix(socket, ".busy");
    let open =
        |flags: OFlags| rustix::fs::open(&path, flags | OFlags::RDWR | OFlags::CLOEXEC, Mode::from_raw_mode(0o600));
    match open(OFlags::empty()) {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::NOENT) if rustix::fs::lstat(socket).is_ok() => {
            open(OFlags::CREATE).map_err(|_| NotWarm::Absent)
        }
        Err(_) => Err(NotWarm::Absent),
    }
}

fn write_all(fd: &OwnedFd, mut rest: &[u8]) -> Result<(), rustix::io::Errno> {
    while !rest.is_empty() {
        match rustix::net::send(fd, rest, SendFlags::NOSIGNAL) {
            Ok(n) => rest = &rest[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One line, and nothing after it (the report follows on the same stream): what has arrived
/// is looked at first (`MSG_PEEK`, which blocks until something has), and exactly the line is
/// read when it is all there; else one byte at a time, as it comes.
fn read_line(fd: &OwnedFd) -> Result<String, rustix::io::Errno> {
    const MAX: usize = 4096;
    let mut peek = [0u8; 256];
    let seen = loop {
        match rustix::net::recv(fd, &mut peek, rustix::net::RecvFlags::PEEK) {
            Err(rustix::io::Errno::INTR) => {}
            r => break r?.0,
        }
    };
    if let Some(end) = peek[..seen].iter().position(|b| *b == b'\n') {
        let mut line = vec![0u8; end + 1];
        let mut got = 0;
        while got < line.len() {
            match rustix::io::read(fd, &mut line[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e),
            }
        }
        line.truncate(got);
        return Ok(String::from_utf8_lossy(&line).into_owned());
    }
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < MAX {
        match rustix::io::read(fd, &mut b) {
            Ok(0) => break,
            Ok(_) => {
                line.push(b[0]);
                if b[0] == b'\n' {
                    break;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn environment() -> Vec<OsString> {
    std::env::vars_os()
        .map(|(k, v)| {
            let mut e = k.into_vec();
            e.push(b'=');
            e.extend(v.into_vec());
            OsString::from_vec(e)
        })
        .collect()
}

/// The process's umask, read without changing it (another thread may be creating files), or
/// as it was pinned ([`pin_umask`]).
fn umask() -> u32 {
    PINNED_UMASK.get().copied().unwrap_or_else(umask_now)
}

fn umask_now() -> u32 {
    status_head().and_then(|s| umask_in(&s)).unwrap_or(0o022)
}

static PINNED_UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Read the umask once for every later request of this process: for a server that never
/// changes its own (nothing in txbox calls `umask(2)` but a test, and no other process can
/// change this one's), where reading `/proc/self/status` for each run is a procfs open and
/// the whole status text made. A process that changes its umask must not call this.
pub fn pin_umask() {
    PINNED_UMASK.get_or_init(umask_now);
}

/// The start of `/proc/self/status`, where `Umask:` is (its second line): one read, not the
/// dozen a whole-file read of a procfs file (size 0, read in growing pieces) takes.
fn status_head() -> Option<String> {
    let fd = rustix::fs::open("/proc/self/status", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut buf = [0u8; 512];
    let n = loop {
        match rustix::io::read(&fd, &mut buf) {
            Err(rustix::io::Errno::INTR) => {}
            r => break r.ok()?,
        }
    };
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The `Umask:` line's value in a status text; None without a complete one.
fn umask_in(status: &str) -> Option<u32> {
    status.split_inclusive('\n').find_map(|l| {
        let v = l.strip_prefix("Umask:")?.strip_suffix('\n')?;
        u32::from_str_radix(v.trim(), 8).ok()
    })
}

fn rlimits() -> Vec<(u32, Option<u64>, Option<u64>)> {
    RESOURCES
        .iter()
        .map(|r| {
            let l = rustix::process::getrlimit(*r);
            (*r as u32, l.current, l.maximum)
        })
        .collect()
}

/// A server that failed to start here is not tried again for this long.
const FAILED_BACKOFF: Duration = Duration::from_secs(600);

/// Start a server on `socket` for sandboxes like `spec`'s, to serve the next runs. Returns
/// once it is on its way (the server detaches itself); failing to start one is not an error
/// of the run, only a missed speed-up.
pub fn spawn(exe: &Path, socket: &Path, state: &Path, idle: Duration, spec: &SandboxSpec) -> std::io::Result<()> {
    // The last server for this socket could not start (its reason is in SOCKET.failed):
    // starting one per run would cost every run a process for nothing.
    let failed = std::fs::metadata(with_suffix(socket, ".failed")).and_then(|m| m.modified());
    if failed.is_ok_and(|t| t.elapsed().is_ok_and(|age| age < FAILED_BACKOFF)) {
        return Err(std::io::Error::other(
            "the last warm server failed to start; see the .failed file beside its socket",
        ));
    }
    if let Some(dir) = socket.parent() {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700).create(dir)?;
    }
    // Only what the sandbox is built from: the run's command must not linger in `ps`.
    let args = ServerArgs { socket: socket.to_path_buf(), state: state.to_path_buf(), idle, spec: spec.sandbox_only() };
    let mut cmd = std::process::Command::new(exe);
    cmd.arg0("txbox-warm")
        .arg("__warm")
        .args(args.to_args())
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: between fork and exec, one async-signal-safe syscall. Nothing the caller left
    // open lives on in the server (a pipe it holds would never see its end).
    unsafe {
        cmd.pre_exec(|| {
            crate::fds::cloexec_from(3);
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    // The first process forks the server and leaves at once.
    child.wait()?;
    Ok(())
}

/// Whether `socket` fits a unix socket address (108 bytes with its NUL).
pub fn fits(socket: &Path) -> bool {
    SocketAddrUnix::new(socket).is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The answer is read to its newline and no further, whether the report behind it has
    /// arrived too or the line comes in pieces: what follows is the report's.
    #[test]
    fn an_answer_is_read_to_its_end_and_no_further() {
        use std::io::{Read, Write};
        let (mut server, client) = std::os::unix::net::UnixStream::pair().unwrap();
        let client = OwnedFd::from(client);
        server.write_all(b"ok premounted\nnet 0\nexit 0\n").unwrap();
        assert_eq!(read_line(&client).unwrap(), "ok premounted\n");
        assert_eq!(read_line(&client).unwrap(), "net 0\n");
        let writer = std::thread::spawn(move || {
            for piece in [&b"refuse so"[..], b"me reason\n", b"exit 3\n"] {
                std::thread::sleep(std::time::Duration::from_millis(20));
                server.write_all(piece).unwrap();
            }
        });
        assert_eq!(read_line(&client).unwrap(), "exit 0\n");
        assert_eq!(read_line(&client).unwrap(), "refuse some reason\n");
        writer.join().unwrap();
        let mut rest = String::new();
        std::fs::File::from(client).read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "exit 3\n");
    }

    #[test]
    fn the_umask_is_read_from_the_head_of_the_status_file() {
        assert_eq!(umask_in("Name:\tx\nUmask:\t0027\nState:\tR\n"), Some(0o027));
        // Cut off within the line (a short read): not taken.
        assert_eq!(umask_in("Name:\tx\nUmask:\t00"), None);
        assert_eq!(umask_in("Name:\tx\n"), None);
        // This process's, as the kernel says it.
        let old = rustix::process::umask(Mode::from_raw_mode(0o027));
        let now = umask();
        rustix::process::umask(old);
        assert_eq!(now, 0o027);
    }

    /// A slot no server ever listened on is absent without a trace; one whose socket is there
    /// (a server that died without removing it) gets its busy lock made.
    #[test]
    fn a_slot_without_a_server_leaves_no_busy_file() {
        let dir = std::env::temp_dir().join(format!("txbox-warm-busy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("0123456789abcdef-1.sock");
        let spec = SandboxSpec::new("/w".into(), "/u".into(), "/k".into(), vec!["true".into()]);
        let null = std::fs::File::open("/dev/null").unwrap();
        let stdio = || [null.as_fd(), null.as_fd(), null.as_fd()];
        assert!(matches!(claim(&socket, &spec, stdio(), Some(&[])), Err(NotWarm::Absent)));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "a file was left for a slot without a server");
        // A socket left behind by a server that died: nobody listens there.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        assert!(matches!(claim(&socket, &spec, stdio(), Some(&[])), Err(NotWarm::Absent)));
        assert!(with_suffix(&socket, ".busy").exists());
        // A slot whose name is too long for a socket address is no place for a server.
        let long = dir.join("d".repeat(100));
        std::fs::create_dir(&long).unwrap();
        let socket = long.join("0123456789abcdef-1.sock");
        assert!(matches!(claim(&socket, &spec, stdio(), Some(&[])), Err(NotWarm::Unsuitable)));
        assert_eq!(std::fs::read_dir(&long).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_server_that_failed_here_is_not_started_again_for_a_while() {
        let dir = std::env::temp_dir().join(format!("txbox-warm-spawn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let socket = dir.join("warm/0123456789abcdef.sock");
        let spec = SandboxSpec::new("/w".into(), "/u".into(), "/k".into(), vec!["true".into()]);
        // `true` stands in for the txbox binary: spawning it succeeds and starts nothing.
        spawn(Path::new("/bin/true"), &socket, &dir, Duration::from_secs(1), &spec).unwrap();
        std::fs::write(with_suffix(&socket, ".failed"), "unshare: EPERM\n").unwrap();
        let e = spawn(Path::new("/bin/true"), &socket, &dir, Duration::from_secs(1), &spec).unwrap_err();
        assert!(e.to_string().contains(".failed"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
