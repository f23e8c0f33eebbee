//! The warm server: `txbox __warm --socket PATH --idle SECS SPEC-ARGS…`.
//!
//! ```text
//! spawner ── W: fork, exit ── S: lock, listen, namespaces, base mounts ── I (pid 1): /proc, loop:
//!                                                                          accept → per-run mounts
//!                                                                          → fork command C → wait
//!                                                                          → kill the rest, reap
//!                                                                          → report
//!                                                                          → detach the view, reset
//! ```
//! One transaction at a time (the client holds `SOCKET.busy` while it is served). Between two
//! transactions no process of the first is left (pid 1 kills and reaps every other process in
//! its namespace), its workspace view is detached and `/tmp` and `/dev/shm` are new; each
//! command also gets its own IPC and UTS namespaces. The server exits after `--idle` seconds
//! without a request, when its socket is removed or replaced (the state directory was deleted),
//! or when a secret it did not hide at start appears.

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use super::client::with_suffix;
use super::wire::{Answer, Request, FIXED_FDS, MAX_LAYERS, MAX_REQUEST};
use crate::spec::{MountPlan, SandboxSpec, WarmPlan};
use crate::stage2::{self, at, errno, mount, Pins, StepError};

/// How often an idle server checks that it is still wanted.
const TICK: Duration = Duration::from_secs(1);
/// How long a client may take to send its request once connected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What `txbox __warm` was started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerArgs {
    pub socket: PathBuf,
    /// The state directory, where every transaction's upper and work directories live.
    pub state: PathBuf,
    pub idle: Duration,
    /// The spec of the run that started the server: what its sandbox is built from.
    pub spec: SandboxSpec,
}

impl ServerArgs {
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a = vec![
            OsString::from("--socket"),
            self.socket.clone().into_os_string(),
            OsString::from("--state"),
            self.state.clone().into_os_string(),
            OsString::from("--idle"),
            OsString::from(self.idle.as_secs().to_string()),
        ];
        a.extend(self.spec.to_args());
        a
    }

    pub fn from_args(args: &[OsString]) -> Result<ServerArgs, String> {
        match args {
            [s, socket, t, state, i, idle, rest @ ..] if s == "--socket" && t == "--state" && i == "--idle" => {
                let idle = idle.to_str().and_then(|t| t.parse::<u64>().ok()).ok_or("bad --idle")?;
                let spec = SandboxSpec::from_args(rest).map_err(|e| e.to_string())?;
                Ok(ServerArgs {
                    socket: PathBuf::from(socket),
                    state: PathBuf::from(state),
                    idle: Duration::from_secs(idle),
                    spec,
                })
            }
            _ => Err("usage: __warm --socket PATH --state DIR --idle SECS SPEC…".into()),
        }
    }
}

/// Entry point of `txbox __warm`. Never returns. Nobody reads its output: a server that cannot
/// start simply is not there, and its clients build their own sandboxes. `retired`: where, in
/// the state directory, finished transactions leave directories for it to delete when idle
/// (the caller knows the state directory's layout; this crate does not).
pub fn main(args: &[OsString], retired: &Path) -> ! {
    let Ok(args) = ServerArgs::from_args(args) else { stage2::exit(2) };
    // The spawner waits for this first process only; the server proper is its child, which
    // leaves the spawner's session so terminal signals do not reach it.
    // SAFETY: a fresh exec, single-threaded; the parent leaves at once with _exit.
    match unsafe { libc::fork() } {
        0 => {}
        p if p > 0 => stage2::exit(0),
        _ => stage2::exit(1),
    }
    let _ = rustix::process::setsid();
    let _ = rustix::process::chdir("/");
    // Its name in `ps`/`top` (the command line says the rest).
    let _ = rustix::thread::set_name(c"txbox-warm");
    match serve(&args, retired) {
        Ok(()) => stage2::exit(0),
        Err(_) => stage2::exit(1),
    }
}

/// Leave the reason this server could not start beside its socket (`SOCKET.failed`): clients
/// then stop starting servers that cannot work here for a while (`client::spawn`), and a
/// person finds the reason. Written through the directory's fd, which stays valid after the
/// state directory is hidden.
fn record_failure(dir: &OwnedFd, name: &OsString, e: &StepError) {
    let mut failed = name.clone();
    failed.push(".failed");
    let flags = OFlags::CREATE | OFlags::WRONLY | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if let Ok(fd) = rustix::fs::openat(dir, failed.as_os_str(), flags, Mode::from_raw_mode(0o600)) {
        let _ = rustix::io::write(&fd, format!("{}: {}\n", e.step, stage2::hint(e)).as_bytes());
    }
}

/// The host side of the server (S in the module diagram). The order of the steps is the
/// documentation.
fn serve(args: &ServerArgs, retired: &Path) -> Result<(), StepError> {
    // 1. One server per socket: the lock is held by this process and its init for their lives.
    let lock_path = with_suffix(&args.socket, ".lock");
    let lock =
        rustix::fs::open(&lock_path, OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))
            .map_err(at(format!("open {}", lock_path.display())))?;
    if rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
        return Ok(()); // another server has it
    }
    // 2. The listening socket and a handle on its directory, before any namespace: both live
    //    in the host's view of the state directory, which the sandbox hides.
    let dir = args.socket.parent().unwrap_or(Path::new("/"));
    let dir_fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(at(format!("open {}", dir.display())))?;
    let name = args.socket.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    let served = listen_build_and_serve(args, retired, &dir_fd, &name);
    if let Err(e) = &served {
        record_failure(&dir_fd, &name, e);
    }
    drop(lock);
    served
}

/// Steps 2 to 5 of `serve`: listen, build the sandbox, let its init serve until it is done.
fn listen_build_and_serve(
    args: &ServerArgs,
    retired: &Path,
    dir_fd: &OwnedFd,
    name: &OsString,
) -> Result<(), StepError> {
    let spec = &args.spec;
    let _ = rustix::fs::unlinkat(dir_fd, name.as_os_str(), rustix::fs::AtFlags::empty());
    let listener = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(at("socket"))?;
    let addr =
        SocketAddrUnix::new(args.socket.as_path()).map_err(at(format!("socket address {}", args.socket.display())))?;
    rustix::net::bind(&listener, &addr).map_err(at(format!("bind {}", args.socket.display())))?;
    rustix::fs::chmod(&args.socket, Mode::from_raw_mode(0o600)).map_err(at("chmod socket"))?;
    rustix::net::listen(&listener, 8).map_err(at("listen"))?;
    let bound = Bound {
        dir: rustix::io::fcntl_dupfd_cloexec(dir_fd, 3).map_err(at("dup"))?,
        name: name.clone(),
        ino: inode(&args.socket),
    };
    // 3. Namespaces, private copies of the two trees every transaction's layers come from,
    //    and every mount that does not depend on the transaction.
    stage2::enter_namespaces(spec)?;
    crate::net::warm_open(spec);
    let roots = Roots::clone_from(&args.state, &spec.workspace, retired)?;
    let plan = MountPlan::for_warm(spec);
    let mut pins = Pins::default();
    for p in plan.base.sources() {
        pins.open(&p)?;
    }
    for op in &plan.base.namespace {
        mount(op, &pins)?;
    }
    drop(pins);
    // 4. What each secret outside the workspace looks like from inside, now that it is hidden.
    let hidden = Hidden::now(spec);
    // It works here after all: forget an earlier failure.
    let mut failed = name.clone();
    failed.push(".failed");
    let _ = rustix::fs::unlinkat(dir_fd, failed.as_os_str(), rustix::fs::AtFlags::empty());
    // 5. The pid namespace's init serves; this process waits for it, so that killing it (the
    //    spawner's session is gone, but an administrator may) ends the server.
    // SAFETY: single-threaded (a fresh exec that started no threads).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(StepError { step: "fork init".into(), errno: rustix::io::Errno::from_raw_os_error(errno()) });
    }
    if pid == 0 {
        let code = match init(spec, &plan, &roots, &listener, &bound, &hidden, args.idle) {
            Ok(()) => 0,
            Err(e) => {
                record_failure(&bound.dir, &bound.name, &e);
                1
            }
        };
        bound.remove_if_ours();
        stage2::exit(code);
    }
    drop(listener);
    let _ = stage2::wait_for(pid);
    Ok(())
}

/// Where each transaction's layers are found, in this server's own mount namespace.
///
/// overlayfs takes its layers only from mounts of the caller's namespace (or detached ones),
/// so the fds a client opens in the host's cannot be its layers. These are detached clones
/// (`open_tree(OPEN_TREE_CLONE)`) made right after `unshare`: untouched by the read-only
/// remount of `/` (the state directory stays writable for upper and work), in no directory a
/// command can see, and live views of the same directories, not copies.
struct Roots {
    state_path: PathBuf,
    state: OwnedFd,
    workspace: OwnedFd,
    /// Where retired transaction directories wait, relative to `state`.
    retired: PathBuf,
}

impl Roots {
    fn clone_from(state: &Path, workspace: &Path, retired: &Path) -> Result<Roots, StepError> {
        use rustix::mount::OpenTreeFlags;
        let clone = |p: &Path| {
            rustix::mount::open_tree(
                rustix::fs::CWD,
                p,
                OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
            )
            .map_err(at(format!("clone {}", p.display())))
        };
        Ok(Roots {
            state_path: state.to_path_buf(),
            state: clone(state)?,
            workspace: clone(workspace)?,
            retired: retired.to_path_buf(),
        })
    }

    /// A directory of a transaction (upper, work, a layer) beneath the state directory,
    /// resolved without following symlinks, and checked to be the one the client opened.
    fn resolve(&self, p: &Path, client: &OwnedFd) -> Result<OwnedFd, String> {
        use rustix::fs::ResolveFlags;
        let rel =
            p.strip_prefix(&self.state_path).map_err(|_| format!("{} is not in the state directory", p.display()))?;
        let fd = rustix::fs::openat2(
            &self.state,
            rel,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
        )
        .map_err(|e| format!("open {}: {e}", p.display()))?;
        same_object(&fd, client).then_some(fd).ok_or_else(|| format!("{} changed under the request", p.display()))
    }

    /// Delete retired transaction directories until a client knocks on `listener`. Returns
    /// whether none is left.
    fn collect_garbage(&self, listener: &OwnedFd) -> bool {
        let Ok(retired) = rustix::fs::openat(
            &self.state,
            &self.retired,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return true;
        };
        super::gc::collect(&retired, &mut || {
            let mut fds = [PollFd::new(listener, PollFlags::IN)];
            matches!(rustix::event::poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(n) if n > 0)
        })
    }

    /// The workspace, if the client's is still the one this server cloned.
    fn workspace(&self, client: &OwnedFd) -> Option<OwnedFd> {
        if !same_object(&self.workspace, client) {
            return None;
        }
        rustix::io::fcntl_dupfd_cloexec(&self.workspace, 3).ok()
    }
}

fn same_object(a: &OwnedFd, b: &OwnedFd) -> bool {
    match (rustix::fs::fstat(a), rustix::fs::fstat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

/// The secrets outside the workspace as this sandbox sees them: the object covering each (or
/// nothing, for one that did not exist when the server started). The covers are mounted once,
/// but the kernel removes a mount whose mountpoint the host deletes or renames something over
/// (how `git credential-store`, `docker login` or `ssh-keygen` replace their files), and a
/// secret that appears later was never covered: either way the secret would show here, so a
/// difference makes the server stop serving (the run then builds its own sandbox, which hides
/// the secret as it is now).
struct Hidden(Vec<(PathBuf, Option<(u64, u64)>)>);

impl Hidden {
    fn now(spec: &SandboxSpec) -> Hidden {
        Hidden(
            spec.hide
                .iter()
                .filter(|h| !h.starts_with(&spec.workspace))
                .map(|h| (h.clone(), Self::identity(h)))
                .collect(),
        )
    }

    fn identity(p: &Path) -> Option<(u64, u64)> {
        rustix::fs::lstat(p).ok().map(|st| (st.st_dev, st.st_ino))
    }

    /// The first secret that is no longer what it was.
    fn changed(&self) -> Option<&Path> {
        self.0.iter().find(|(p, was)| Self::identity(p) != *was).map(|(p, _)| p.as_path())
    }
}

/// The socket's name, to notice when it is removed or replaced by another server's.
struct Bound {
    dir: OwnedFd,
    name: OsString,
    ino: Option<u64>,
}

impl Bound {
    fn still_ours(&self) -> bool {
        let now = rustix::fs::statat(&self.dir, self.name.as_os_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .map(|s| s.st_ino);
        now.is_some() && now == self.ino
    }

    fn remove_if_ours(&self) {
        if self.still_ours() {
            let _ = rustix::fs::unlinkat(&self.dir, self.name.as_os_str(), rustix::fs::AtFlags::empty());
        }
    }
}

fn inode(p: &Path) -> Option<u64> {
    rustix::fs::lstat(p).ok().map(|s| s.st_ino)
}

/// pid 1 of the warm sandbox: mount /proc, then serve requests one at a time.
fn init(
    spec: &SandboxSpec,
    plan: &WarmPlan,
    roots: &Roots,
    listener: &OwnedFd,
    bound: &Bound,
    hidden: &Hidden,
    idle: Duration,
) -> Result<(), StepError> {
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    // Not dumpable: no process of a command may read this one's memory or open its fds
    // (`/proc/1/fd`), which include the listening socket and, during a run, the layers.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    for op in &plan.base.init {
        mount(op, &Pins::default())?;
    }
    let seccomp = crate::seccomp::build()
        .map_err(|e| StepError { step: format!("seccomp: {e}"), errno: rustix::io::Errno::PERM })?;
    let stack = ChildStack::new()?;
    let ready = Ready { base: spec, plan, roots, seccomp: &seccomp, stack: &stack, hidden };
    let mut last_used = Instant::now();
    let mut garbage = true;
    loop {
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        let timeout = rustix::event::Timespec { tv_sec: TICK.as_secs() as i64, tv_nsec: 0 };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => {
                if last_used.elapsed() >= idle || !bound.still_ours() {
                    roots.collect_garbage(listener);
                    return Ok(());
                }
                // Idle for a tick: delete what finished transactions retired, until a client
                // knocks. Not between transactions that follow each other closely, whose
                // commits would share the disk with the deletion.
                if garbage {
                    garbage = !roots.collect_garbage(listener);
                }
                continue;
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(at("poll")(e)),
        }
        let Ok(conn) = rustix::net::accept_with(listener, SocketFlags::CLOEXEC) else { continue };
        if let Err(why) = trusted(&conn) {
            say(&conn, &Answer::Refuse(why).line());
            continue;
        }
        let mut in_use = None;
        let go_on = serve_one(&ready, &conn, &mut in_use);
        drop(conn);
        // Make the sandbox as new for the next transaction; one that cannot be reset is done.
        for op in plan.release.iter().chain(&plan.reset) {
            mount(op, &Pins::default())?;
        }
        // The overlay is detached: its directories may serve another transaction.
        drop(in_use);
        if !go_on {
            return Ok(());
        }
        last_used = Instant::now();
        garbage = true;
    }
}

/// Only the user the server runs as (as seen in its user namespace) may use it.
fn trusted(conn: &OwnedFd) -> Result<(), String> {
    let me = rustix::process::geteuid().as_raw();
    match super::peer_uid(conn.as_fd()) {
        Ok(uid) if uid == me => Ok(()),
        Ok(uid) => Err(format!("uid {uid} may not use the warm server of uid {me}")),
        Err(e) => Err(format!("who is asking: {e}")),
    }
}

fn say(conn: &OwnedFd, line: &str) {
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        match rustix::io::write(conn, rest) {
            Ok(0) | Err(_) => return,
            Ok(n) => rest = &rest[n..],
        }
    }
}

/// Read one request and the fds that came with it.
fn receive(conn: &OwnedFd) -> Result<(Request, Vec<OwnedFd>), String> {
    let _ = rustix::net::sockopt::set_socket_timeout(conn, rustix::net::sockopt::Timeout::Recv, Some(REQUEST_TIMEOUT));
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut frame: Vec<u8> = Vec::new();
    let mut want = 4usize;
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FIXED_FDS + MAX_LAYERS))];
    let mut chunk = vec![0u8; 64 * 1024];
    while frame.len() < want {
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let n = {
            let mut iov = [std::io::IoSliceMut::new(&mut chunk)];
            rustix::net::recvmsg(conn, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
                .map_err(|e| format!("reading the request: {e}"))?
                .bytes
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        if n == 0 {
            return Err("the client left before sending its whole request".into());
        }
        frame.extend_from_slice(&chunk[..n]);
        if want == 4 && frame.len() >= 4 {
            let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
            if len > MAX_REQUEST {
                return Err(format!("request of {len} bytes is too large"));
            }
            want = 4 + len;
        }
    }
    let req = Request::decode(&frame[4..want]).map_err(|e| e.to_string())?;
    if fds.len() != req.fd_count() {
        return Err(format!("{} fds came with a request that needs {}", fds.len(), req.fd_count()));
    }
    Ok((req, fds))
}

/// What the server built once and every transaction uses.
#[derive(Clone, Copy)]
struct Ready<'a> {
    base: &'a SandboxSpec,
    plan: &'a WarmPlan,
    roots: &'a Roots,
    seccomp: &'a seccompiler::BpfProgram,
    stack: &'a ChildStack,
    hidden: &'a Hidden,
}

/// Serve one transaction. Returns whether the server may go on serving. `in_use` receives
/// the transaction's work directory, opened and share-locked (`flock`) before the overlay is
/// mounted on it; the caller closes it only once the overlay is detached. The client reuses
/// a directory its run left empty for a later transaction (`TxDir::create` takes it as a
/// spare), and waits for this lock first: two overlays must never share upper and work.
fn serve_one(ready: &Ready<'_>, conn: &OwnedFd, in_use: &mut Option<OwnedFd>) -> bool {
    let Ready { base, plan, roots, seccomp, stack, hidden } = *ready;
    let (req, mut fds) = match receive(conn) {
        Ok(r) => r,
        Err(why) => {
            say(conn, &Answer::Refuse(why).line());
            return true;
        }
    };
    if !base.same_sandbox(&req.spec) {
        say(conn, &Answer::Refuse("this server was built for another sandbox".into()).line());
        return true;
    }
    if let Some(p) = hidden.changed() {
        say(
            conn,
            &Answer::Refuse(format!("{} appeared or was replaced after this server started", p.display())).line(),
        );
        return false;
    }
    let spec = &req.spec;
    let command = match Command::of(&req) {
        Ok(c) => c,
        Err(e) => {
            say(conn, &Answer::Refuse(e.step).line());
            return true;
        }
    };
    // fds: stdin, stdout, stderr, then the client's view of the workspace and the layers.
    // Ours are found beneath the roots and named by the paths of the spec, so the per-run ops
    // (the plan of this very spec) find them through `/proc/self/fd`.
    let client_layers = fds.split_off(STDIO);
    let Some(workspace) = roots.workspace(&client_layers[0]) else {
        // Deleted and made anew since the server started: this server shows the old one.
        say(conn, &Answer::Refuse("the workspace was replaced since this server started".into()).line());
        return false;
    };
    let mut pins = Pins::default();
    pins.insert(spec.workspace.clone(), workspace);
    let layers = [&spec.upper, &spec.work].into_iter().chain(spec.layers.iter());
    for (p, client) in layers.zip(&client_layers[1..]) {
        let fd = match roots.resolve(p, client) {
            Ok(fd) => fd,
            Err(why) => {
                say(conn, &Answer::Refuse(why).line());
                return true;
            }
        };
        if *p == spec.work {
            match lock_shared(&fd) {
                Ok(lock) => *in_use = Some(lock),
                Err(e) => {
                    say(conn, &Answer::Refuse(format!("locking {}: {e}", p.display())).line());
                    return true;
                }
            }
        }
        pins.insert(p.clone(), fd);
    }
    drop(client_layers);
    let per_run = MountPlan::for_warm(spec).per_run;
    for op in &per_run {
        if let Err(e) = mount(op, &pins) {
            for op in &plan.release {
                let _ = mount(op, &Pins::default());
            }
            say(conn, &Answer::Refuse(stage2::setup_failed(&e)).line());
            return true;
        }
    }
    drop(pins);
    // When the command's fate is reported, no process of it is left (all killed and reaped),
    // so nothing writes to the upper layer any more and the client may classify it. The view
    // is detached afterwards, off the client's path: unmounting waits for an RCU grace period.
    let status = run_command(&req, &command, fds, seccomp, conn, stack);
    if let Some(line) = crate::net::warm_since_last() {
        say(conn, &line);
    }
    match status {
        Ok(line) => say(conn, &line),
        Err(e) => say(conn, &format!("error {}\n", stage2::setup_failed(&e))),
    }
    true
}

/// Open the directory behind `dir` (an `O_PATH` fd) for reading and take a shared `flock` on it.
fn lock_shared(dir: &OwnedFd) -> Result<OwnedFd, rustix::io::Errno> {
    let fd = rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    rustix::fs::flock(&fd, FlockOperation::LockShared)?;
    Ok(fd)
}

/// The stdin, stdout and stderr that lead the fds of a request.
const STDIO: usize = 3;

/// What exec needs, converted before anything is mounted; the pointer arrays (into `argv` and
/// `env`, which they must not outlive) are built here so that the child allocates nothing.
struct Command {
    /// Owners of the strings `argp` and `envp` point into.
    _argv: Vec<CString>,
    _env: Vec<CString>,
    cwd: CString,
    argp: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl Command {
    fn of(req: &Request) -> Result<Command, StepError> {
        let cstr = |b: &[u8], what: &str| {
            CString::new(b).map_err(|_| StepError { step: what.to_string(), errno: rustix::io::Errno::INVAL })
        };
        let argv: Vec<CString> =
            req.spec.argv.iter().map(|a| cstr(a.as_bytes(), "argument with a NUL byte")).collect::<Result<_, _>>()?;
        let env: Vec<CString> = req
            .env
            .iter()
            .map(|e| cstr(e.as_bytes(), "environment entry with a NUL byte"))
            .collect::<Result<_, _>>()?;
        // The CStrings' buffers do not move when the vectors holding them do.
        let (argp, envp) = (stage2::nul_terminated(&argv), stage2::nul_terminated(&env));
        Ok(Command {
            _argv: argv,
            _env: env,
            cwd: cstr(req.spec.cwd.as_os_str().as_bytes(), "working directory with a NUL byte")?,
            argp,
            envp,
        })
    }
}

/// Start the command with the client's stdio, wait for it (or for the client to give up),
/// then kill and reap every other process of the namespace. Returns the report line.
fn run_command(
    req: &Request,
    command: &Command,
    stdio: Vec<OwnedFd>,
    seccomp: &seccompiler::BpfProgram,
    conn: &OwnedFd,
    stack: &ChildStack,
) -> Result<String, StepError> {
    let raw: Vec<i32> = stdio.iter().map(|f| f.as_raw_fd()).collect();
    let conn_fd = conn.as_raw_fd();
    say(conn, &Answer::Ok.line());
    let child = spawn(&Child { req, stdio: &raw, seccomp, conn_fd, command }, stack)?;
    // The command has its own copies; ours would keep the client's pipes open.
    drop(stdio);
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(child)
            .ok_or(StepError { step: "command pid".into(), errno: rustix::io::Errno::SRCH })?,
        rustix::process::PidfdFlags::empty(),
    )
    .map_err(at("pidfd_open"))?;
    let mut client_gone = false;
    loop {
        let mut fds = vec![PollFd::new(&pidfd, PollFlags::IN)];
        if !client_gone {
            fds.push(PollFd::new(conn, PollFlags::IN));
        }
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(at("poll")(e)),
        }
        let exited = !fds[0].revents().is_empty();
        let asked = fds.get(1).is_some_and(|f| !f.revents().is_empty());
        drop(fds);
        if exited {
            break;
        }
        if asked {
            // The client stopped the command (timeout, a limit) or died: kill everything.
            let mut b = [0u8; 16];
            let _ = rustix::io::read(conn, &mut b);
            client_gone = true;
            kill_all();
        }
    }
    let mut st = 0;
    // SAFETY: waitpid on our own child with a valid out-pointer.
    while unsafe { libc::waitpid(child, &mut st, 0) } < 0 && errno() == libc::EINTR {}
    // What the command left running goes with it, as when a cold sandbox's init exits.
    kill_all();
    reap_all();
    Ok(if libc::WIFSIGNALED(st) {
        format!("signal {}\n", libc::WTERMSIG(st))
    } else {
        format!("exit {}\n", libc::WEXITSTATUS(st))
    })
}

/// SIGKILL to every process of this pid namespace but its init.
fn kill_all() {
    // SAFETY: kill(-1) from the namespace's init reaches only that namespace's processes.
    unsafe { libc::kill(-1, libc::SIGKILL) };
}

/// Wait until no child is left.
fn reap_all() {
    loop {
        let mut st = 0;
        // SAFETY: waitpid on any child with a valid out-pointer.
        let r = unsafe { libc::waitpid(-1, &mut st, 0) };
        if r < 0 && errno() != libc::EINTR {
            return; // ECHILD: nobody left
        }
    }
}

/// What the command's process needs from its parent, which waits while it uses it.
struct Child<'a> {
    req: &'a Request,
    stdio: &'a [i32],
    seccomp: &'a seccompiler::BpfProgram,
    conn_fd: i32,
    command: &'a Command,
}

/// Start the command's process the way posix_spawn does: `clone(CLONE_VM | CLONE_VFORK)` on a
/// stack of its own. Sharing our memory, it copies no page tables and takes no copy-on-write
/// faults (a fork of this server did both, ~0.2 ms of every run); we are suspended until it has
/// exec'd or exited, so nothing runs on our memory concurrently. What it allocates before exec
/// is freed before exec (the pointer arrays exec needs were built by `Command::of`); only the
/// error message of a failed setup or exec (~100 bytes) stays behind in our heap.
fn spawn(child: &Child<'_>, stack: &ChildStack) -> Result<i32, StepError> {
    extern "C" fn main(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `Child` that `spawn` passed; `spawn`'s caller keeps it alive
        // and does not touch it while suspended by CLONE_VFORK, until this process execs or
        // exits.
        let c = unsafe { &*(arg as *const Child<'_>) };
        if let Err(e) = prepare_child(c.req, c.stdio, c.seccomp) {
            // SAFETY: conn_fd is open in this process (close-on-exec only).
            let conn = unsafe { BorrowedFd::borrow_raw(c.conn_fd) };
            let _ = rustix::io::write(conn, format!("error {}\n", stage2::setup_failed(&e)).as_bytes());
            stage2::exit(125);
        }
        stage2::exec_prepared(&c.command.argp, &c.command.cwd, Some(&c.command.envp))
    }
    // SAFETY: `main` never returns into our frames: it ends in execve or _exit. It runs on
    // `stack`, which nothing else uses (one child at a time, and we are suspended meanwhile),
    // with its own fd table, signal dispositions and credentials (no CLONE_FILES, CLONE_SIGHAND,
    // CLONE_THREAD); pid 1 is single-threaded and installs no signal handlers, so no lock or
    // handler of ours can be caught half-way in the shared memory.
    let pid = unsafe {
        libc::clone(
            main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            child as *const Child<'_> as *mut libc::c_void,
        )
    };
    if pid < 0 {
        return Err(StepError {
            step: "start the command (clone)".into(),
            errno: rustix::io::Errno::from_raw_os_error(errno()),
        });
    }
    Ok(pid)
}

/// The stack the command's process runs on between `clone` and exec: 1 MiB, mapped once per
/// server, with a guard page at its low end so an overflow faults instead of writing into the
/// heap.
struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

impl ChildStack {
    const LEN: usize = 1 << 20;
    const GUARD: usize = 1 << 12;

    fn new() -> Result<ChildStack, StepError> {
        // SAFETY: a fresh anonymous private mapping; no existing memory is involved.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(StepError {
                step: "map the command's stack".into(),
                errno: rustix::io::Errno::from_raw_os_error(errno()),
            });
        }
        let stack = ChildStack { base, len: Self::LEN };
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, Self::GUARD, libc::PROT_NONE) } != 0 {
            return Err(StepError {
                step: "guard the command's stack".into(),
                errno: rustix::io::Errno::from_raw_os_error(errno()),
            });
        }
        Ok(stack)
    }

    /// The initial stack pointer: the top of the mapping, 16-byte aligned (the stack grows down).
    fn top(&self) -> *mut libc::c_void {
        ((self.base as usize + self.len) & !15) as *mut libc::c_void
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used by any process (the child exec'd).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// In the command's process, before exec: the client's stdio, a session and IPC/UTS
/// namespaces of its own, the client's umask and limits, then the confinement of any sandbox.
fn prepare_child(req: &Request, stdio: &[i32], seccomp: &seccompiler::BpfProgram) -> Result<(), StepError> {
    // SAFETY: in a freshly forked child, with fds that are open.
    if !unsafe { crate::launch::install_fds(&[(stdio[0], 0), (stdio[1], 1), (stdio[2], 2)]) } {
        return Err(StepError { step: "install stdio".into(), errno: rustix::io::Errno::from_raw_os_error(errno()) });
    }
    let _ = rustix::process::setsid();
    // SAFETY: no flag here changes state the standard library caches.
    unsafe {
        rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWIPC | rustix::thread::UnshareFlags::NEWUTS)
    }
    .map_err(at("unshare IPC and UTS"))?;
    rustix::process::umask(Mode::from_raw_mode(req.umask & 0o777));
    for &(res, soft, hard) in &req.rlimits {
        // Best effort: a limit the server cannot raise back stays at the server's.
        if let Some(r) = resource(res) {
            let _ = rustix::process::setrlimit(r, rustix::process::Rlimit { current: soft, maximum: hard });
        }
    }
    stage2::confine(&req.spec, Some(seccomp))
}

/// The resource limits a client passes on, by number.
pub(crate) const RESOURCES: [rustix::process::Resource; 16] = {
    use rustix::process::Resource::*;
    [Cpu, Fsize, Data, Stack, Core, Rss, Nproc, Nofile, Memlock, As, Locks, Sigpending, Msgqueue, Nice, Rtprio, Rttime]
};

fn resource(n: u32) -> Option<rustix::process::Resource> {
    RESOURCES.iter().copied().find(|r| *r as u32 == n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_arguments_round_trip() {
        let spec = SandboxSpec::new("/w".into(), "/u".into(), "/k".into(), vec![OsString::from("true")]);
        let a =
            ServerArgs { socket: "/s/warm/0123.sock".into(), state: "/s".into(), idle: Duration::from_secs(60), spec };
        assert_eq!(ServerArgs::from_args(&a.to_args()), Ok(a));
        assert!(ServerArgs::from_args(&[OsString::from("--idle")]).is_err());
    }

    #[test]
    fn resources_are_numbered_as_the_kernel_numbers_them() {
        for (i, r) in RESOURCES.iter().enumerate() {
            assert_eq!(*r as u32, i as u32, "{r:?}");
        }
    }
}
