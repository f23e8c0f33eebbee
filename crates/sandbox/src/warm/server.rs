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
//!
//! Owns the server, its init loop and each run's mounts; may serve one transaction at a time only,
//! and no client that `trusted` refuses.

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

use super::refusal::Refusal;
use super::wire::{resource, with_suffix, Answer, Report, Request, ServerArgs, FIXED_FDS, MAX_LAYERS, MAX_REQUEST};
use super::{LayerName, StateLayout};
use crate::kernel::Linux;
use crate::spec::{MountPlan, SandboxSpec, WarmPlan};
use crate::stage2::{self, at, at_path, mount, Pins, StepError};
use crate::supervisor::{Guard, Handoff, Sandbox};

/// How often an idle server checks that it is still wanted.
const TICK: Duration = Duration::from_secs(1);
/// How long a client may take to send its request once connected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Entry point of `txbox __warm`. Never returns. Nobody reads its output: a server that cannot
/// start simply is not there, and its clients build their own sandboxes. `layout`: what the
/// caller knows of the state directory (this crate does not).
pub fn main(args: &[OsString], layout: StateLayout) -> ! {
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
    match serve(&args, layout) {
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
        let _ = rustix::io::write(&fd, format!("{}: {}\n", e.what(), e.hint()).as_bytes());
    }
}

/// The host side of the server (S in the module diagram). The order of the steps is the
/// documentation.
fn serve(args: &ServerArgs, layout: StateLayout) -> Result<(), StepError> {
    // 1. One server per socket: the lock is held by this process and its init for their lives.
    let lock_path = with_suffix(&args.socket, ".lock");
    let lock =
        rustix::fs::open(&lock_path, OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))
            .map_err(at_path("open", &lock_path))?;
    if rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
        return Ok(()); // another server has it
    }
    // 2. The listening socket and a handle on its directory, before any namespace: both live
    //    in the host's view of the state directory, which the sandbox hides.
    let dir = args.socket.parent().unwrap_or(Path::new("/"));
    let dir_fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(at_path("open", dir))?;
    let name = args.socket.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    let served = listen_build_and_serve(args, layout, &dir_fd, &name);
    if let Err(e) = &served {
        record_failure(&dir_fd, &name, e);
    }
    drop(lock);
    served
}

/// Steps 2 to 5 of `serve`: listen, build the sandbox, let its init serve until it is done.
fn listen_build_and_serve(
    args: &ServerArgs,
    layout: StateLayout,
    dir_fd: &OwnedFd,
    name: &OsString,
) -> Result<(), StepError> {
    let spec = &args.spec;
    let _ = rustix::fs::unlinkat(dir_fd, name.as_os_str(), rustix::fs::AtFlags::empty());
    let listener = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(at("socket"))?;
    let addr = SocketAddrUnix::new(args.socket.as_path()).map_err(at_path("socket address", &args.socket))?;
    rustix::net::bind(&listener, &addr).map_err(at_path("bind", &args.socket))?;
    rustix::fs::chmod(&args.socket, Mode::from_raw_mode(0o600)).map_err(at("chmod socket"))?;
    rustix::net::listen(&listener, 8).map_err(at("listen"))?;
    let bound = Bound {
        dir: rustix::io::fcntl_dupfd_cloexec(dir_fd, 3).map_err(at("dup"))?,
        name: name.clone(),
        ino: inode(&args.socket),
    };
    // 3. What keeps host unix sockets out of reach (crate::supervisor), as in a cold sandbox;
    //    namespaces, private copies of the two trees every transaction's layers come from,
    //    and every mount that does not depend on the transaction.
    let supervisor = match Guard::for_kernel() {
        Guard::Supervisor => Some(crate::supervisor::Process::start(Sandbox {
            workspace: spec.workspace.clone(),
            host_network: spec.host_network,
            userns: spec.userns,
        })?),
        Guard::Landlock => None,
    };
    // Who a client is: its pid namespace, counted in the host's procfs, which the sandbox's
    // covers once init mounts it.
    let host_proc = rustix::fs::open("/proc", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(at("open the host's /proc"))?;
    let me = Me { binary: super::binary_id(), host_proc, layer: layout.layer };
    stage2::enter_namespaces(&mut Linux, spec)?;
    crate::net::warm_open(spec);
    let roots = Roots::clone_from(&args.state, &spec.workspace, layout.retired)?;
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
        return Err(StepError::last("fork init"));
    }
    let (supervisor, handoff) = supervisor.map_or((None, None), |(p, h)| (Some(p), Some(h)));
    if pid == 0 {
        let code = match init(spec, &plan, &roots, &listener, &bound, &hidden, &me, args.idle, handoff) {
            Ok(()) => 0,
            Err(e) => {
                record_failure(&bound.dir, &bound.name, &e);
                1
            }
        };
        bound.remove_if_ours();
        stage2::exit(code);
    }
    drop((listener, handoff));
    // 6. The supervisor serves init's filter for every transaction, and leaves with init.
    if let Some(s) = &supervisor {
        s.watch(pid);
    }
    let _ = crate::reap::wait(pid);
    if let Some(s) = supervisor {
        s.wait();
    }
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
            .map_err(at_path("clone", p))
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
    fn resolve(&self, p: &Path, client: &OwnedFd) -> Result<OwnedFd, Refusal> {
        use rustix::fs::ResolveFlags;
        let rel = p.strip_prefix(&self.state_path).map_err(|_| Refusal::NotInState(p.to_path_buf()))?;
        let fd = rustix::fs::openat2(
            &self.state,
            rel,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
        )
        .map_err(|errno| Refusal::Open { path: p.to_path_buf(), errno })?;
        same_object(&fd, client).then_some(fd).ok_or_else(|| Refusal::Changed(p.to_path_buf()))
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
///
/// Looking at every secret for every request costs a `stat` each (a hundred, with the rule of
/// `crate::secrets`); so the directories where they are, or would appear, are watched
/// (inotify, for the names that matter), and the secrets are looked at only when one of those
/// names moved. Without inotify (no instance left), every request looks.
struct Hidden {
    paths: Vec<(PathBuf, Option<(u64, u64)>)>,
    watch: std::cell::RefCell<Option<Watch>>,
}

impl Hidden {
    fn now(spec: &SandboxSpec) -> Hidden {
        let paths: Vec<PathBuf> = spec.hide.iter().filter(|h| !h.starts_with(&spec.workspace)).cloned().collect();
        // Watching first: whatever moves while the identities are taken is seen.
        let watch = Watch::of(&paths);
        let paths = paths.into_iter().map(|h| {
            let id = Self::identity(&h);
            (h, id)
        });
        Hidden { paths: paths.collect(), watch: std::cell::RefCell::new(watch) }
    }

    /// What `p` is from inside: the cover over it (followed through a symlink, as the cover
    /// itself was mounted where the link points).
    fn identity(p: &Path) -> Option<(u64, u64)> {
        rustix::fs::stat(p).ok().map(|st| (st.st_dev, st.st_ino))
    }

    /// The first secret that is no longer what it was.
    fn changed(&self) -> Option<&Path> {
        let Ok(mut watch) = self.watch.try_borrow_mut() else { return self.look() };
        if watch.as_ref().is_some_and(|w| !w.stirred()) {
            return None;
        }
        // Watch anew (a directory that appeared is watched now) before looking.
        let paths: Vec<PathBuf> = self.paths.iter().map(|(p, _)| p.clone()).collect();
        *watch = Watch::of(&paths);
        self.look()
    }

    fn look(&self) -> Option<&Path> {
        self.paths.iter().find(|(p, was)| Self::identity(p) != *was).map(|(p, _)| p.as_path())
    }
}

/// inotify watches on the directories that hold the hidden paths (or the nearest one that
/// exists, for a path whose directory does not), each for the names that lead to them.
struct Watch {
    fd: OwnedFd,
    names: std::collections::HashMap<i32, Vec<OsString>>,
}

impl Watch {
    fn of(paths: &[PathBuf]) -> Option<Watch> {
        use rustix::fs::inotify;
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).ok()?;
        let flags = inotify::WatchFlags::CREATE
            | inotify::WatchFlags::DELETE
            | inotify::WatchFlags::MOVED_FROM
            | inotify::WatchFlags::MOVED_TO
            | inotify::WatchFlags::DELETE_SELF
            | inotify::WatchFlags::MOVE_SELF
            | inotify::WatchFlags::ONLYDIR;
        let mut names: std::collections::HashMap<i32, Vec<OsString>> = std::collections::HashMap::new();
        for p in paths {
            // A symlink's cover is where it points: that name matters too.
            let target = rustix::fs::lstat(p)
                .ok()
                .filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
                .and_then(|_| std::fs::canonicalize(p).ok());
            for q in std::iter::once(p.clone()).chain(target) {
                let (dir, name) = nearest_existing(&q)?;
                let wd = inotify::add_watch(&fd, &dir, flags).ok()?;
                names.entry(wd).or_default().push(name);
            }
        }
        Some(Watch { fd, names })
    }

    /// Whether one of the watched names moved since the last call (or the kernel lost track).
    fn stirred(&self) -> bool {
        use rustix::fs::inotify::{ReadFlags, Reader};
        let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
        let mut reader = Reader::new(&self.fd, &mut buf);
        let mut moved = false;
        loop {
            match reader.next() {
                Ok(ev) => {
                    let lost =
                        ReadFlags::QUEUE_OVERFLOW | ReadFlags::IGNORED | ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF;
                    let named = ev.file_name().is_some_and(|n| {
                        self.names.get(&ev.wd()).is_some_and(|v| v.iter().any(|x| x.as_bytes() == n.to_bytes()))
                    });
                    moved |= ev.events().intersects(lost) || named;
                }
                Err(rustix::io::Errno::AGAIN) => return moved,
                Err(_) => return true,
            }
        }
    }
}

/// The nearest directory above `p` that exists, and the name in it on the way to `p`.
fn nearest_existing(p: &Path) -> Option<(PathBuf, OsString)> {
    let mut child = p;
    loop {
        let parent = child.parent()?;
        if rustix::fs::stat(parent).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR) {
            return Some((parent.to_path_buf(), child.file_name()?.to_os_string()));
        }
        child = parent;
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

/// pid 1 of the warm sandbox: mount /proc, install the socket filter, then serve requests one
/// at a time.
#[allow(clippy::too_many_arguments)]
fn init(
    spec: &SandboxSpec,
    plan: &WarmPlan,
    roots: &Roots,
    listener: &OwnedFd,
    bound: &Bound,
    hidden: &Hidden,
    me: &Me,
    idle: Duration,
    handoff: Option<Handoff>,
) -> Result<(), StepError> {
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    for op in &plan.base.init {
        mount(op, &Pins::default())?;
    }
    if let Some(handoff) = handoff {
        stage2::guard_sockets(handoff)?;
    }
    // Not dumpable: no process of a command may read this one's memory or open its fds
    // (`/proc/1/fd`), which include the listening socket and, during a run, the layers. Only
    // now: the supervisor took the listener from us with the rights of a debugger.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let seccomp =
        crate::seccomp::build().map_err(|e| StepError::new(format!("seccomp: {e}"), rustix::io::Errno::PERM))?;
    let stack = ChildStack::new()?;
    let ready = Ready { base: spec, plan, roots, seccomp: &seccomp, stack: &stack, hidden, me };
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
        if let Err(why) = trusted(&conn, &me.host_proc) {
            say(&conn, &Answer::Refuse(why.to_string()).line());
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

/// What the server knows of itself and its host, for judging requests.
struct Me {
    /// This binary (`super::binary_id`), taken when the server started.
    binary: String,
    /// The procfs of the pid namespace the server was started in (the host's).
    host_proc: OwnedFd,
    /// Which layer of which transaction a path of the state directory is.
    layer: fn(&Path) -> Option<LayerName>,
}

/// Only a txbox launcher of the user the server runs as may use it: a process of that user
/// (as seen in its user namespace) outside every sandbox. A command runs in a pid namespace
/// below the host's (every sandbox has one), so its depth, counted in the host's procfs from a
/// pidfd of the peer (race-free: it names that very process), is more than one.
fn trusted(conn: &OwnedFd, host_proc: &OwnedFd) -> Result<(), Refusal> {
    let me = rustix::process::geteuid().as_raw();
    match super::peer_uid(conn.as_fd()) {
        Ok(uid) if uid == me => {}
        Ok(uid) => return Err(Refusal::OtherUser { uid, server: me }),
        Err(e) => return Err(Refusal::WhoIsAsking(e)),
    }
    let pidfd = match super::peer_pidfd(conn.as_fd()) {
        Ok(fd) => fd,
        // Before Linux 6.5 nothing says who it is beyond its user.
        Err(rustix::io::Errno::NOPROTOOPT) => return Ok(()),
        Err(e) => return Err(Refusal::WhoIsAsking(e)),
    };
    let path = format!("self/fdinfo/{}", pidfd.as_raw_fd());
    let info = rustix::fs::openat(host_proc, path.as_str(), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .ok()
        .and_then(|fd| {
            let mut buf = vec![0u8; 4096];
            rustix::io::read(&fd, &mut buf).ok().map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
        })
        .unwrap_or_default();
    match super::pid_ns_depth(&info) {
        Some(1) => Ok(()),
        Some(depth) => Err(Refusal::InsideSandbox { depth }),
        None => Err(Refusal::ClientGone),
    }
}

/// The layers of a request must be one transaction's, named as the state directory names them:
/// upper and work of one run, or of one session step above that session's earlier steps'
/// uppers, topmost first. The client cannot lay an overlay on anything else of the state
/// directory (another transaction's layer would plant files in its next commit).
fn one_transaction(state: &Path, spec: &SandboxSpec, layer: fn(&Path) -> Option<LayerName>) -> Result<(), Refusal> {
    let name = |p: &Path| p.strip_prefix(state).ok().and_then(layer).ok_or_else(|| Refusal::NotALayer(p.to_path_buf()));
    let (upper, work) = (name(&spec.upper)?, name(&spec.work)?);
    if !upper.upper || work.upper || work.tx != upper.tx || work.step != upper.step {
        return Err(Refusal::NotOneTransaction);
    }
    let mut above = upper.step;
    for l in &spec.layers {
        let n = name(l)?;
        match (above, n.step) {
            (Some(a), Some(s)) if n.tx == upper.tx && n.upper && s < a => above = Some(s),
            _ => return Err(Refusal::NotAnEarlierStep(l.clone())),
        }
    }
    Ok(())
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
fn receive(conn: &OwnedFd) -> Result<(Request, Vec<OwnedFd>), Refusal> {
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
            rustix::net::recvmsg(conn, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC).map_err(Refusal::Read)?.bytes
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        if n == 0 {
            return Err(Refusal::Incomplete);
        }
        frame.extend_from_slice(&chunk[..n]);
        if want == 4 && frame.len() >= 4 {
            let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
            if len > MAX_REQUEST {
                return Err(Refusal::TooLarge { len });
            }
            want = 4 + len;
        }
    }
    let req = Request::decode(&frame[4..want])?;
    if fds.len() != req.fd_count() {
        return Err(Refusal::FdCount { got: fds.len(), want: req.fd_count() });
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
    me: &'a Me,
}

/// Serve one transaction. Returns whether the server may go on serving. `in_use` receives
/// the transaction's work directory, opened and share-locked (`flock`) before the overlay is
/// mounted on it; the caller closes it only once the overlay is detached. The client reuses
/// a directory its run left empty for a later transaction (`TxDir::create` takes it as a
/// spare), and waits for this lock first: two overlays must never share upper and work.
fn serve_one(ready: &Ready<'_>, conn: &OwnedFd, in_use: &mut Option<OwnedFd>) -> bool {
    let (req, command, stdio) = match admit(ready, conn, in_use) {
        Ok(admitted) => admitted,
        Err(why) => {
            say(conn, &Answer::Refuse(why.to_string()).line());
            return !why.retires();
        }
    };
    // When the command's fate is reported, no process of it is left (all killed and reaped),
    // so nothing writes to the upper layer any more and the client may classify it. The view
    // is detached afterwards, off the client's path: unmounting waits for an RCU grace period.
    let status = run_command(&req, &command, stdio, ready.seccomp, conn, ready.stack);
    if let Some(line) = crate::net::warm_since_last() {
        say(conn, &line);
    }
    match status {
        Ok(line) => say(conn, &line),
        Err(e) => say(conn, &Report::Error(stage2::setup_failed(&e)).line()),
    }
    true
}

/// Read a request and judge it; if it may run here, mount its view. Returns the request, its
/// command ready for exec, and the stdio the client sent.
fn admit(
    ready: &Ready<'_>,
    conn: &OwnedFd,
    in_use: &mut Option<OwnedFd>,
) -> Result<(Request, Command, Vec<OwnedFd>), Refusal> {
    let Ready { base, plan, roots, hidden, me, .. } = *ready;
    let (req, mut fds) = receive(conn)?;
    if req.binary != me.binary {
        // Another txbox binary (rebuilt, upgraded): this server retires.
        return Err(Refusal::OtherBinary);
    }
    one_transaction(&roots.state_path, &req.spec, me.layer)?;
    if !base.same_sandbox(&req.spec) {
        return Err(Refusal::OtherSandbox);
    }
    if let Some(p) = hidden.changed() {
        return Err(Refusal::SecretMoved(p.to_path_buf()));
    }
    let spec = &req.spec;
    let command = Command::of(&req).map_err(Refusal::Command)?;
    // fds: stdin, stdout, stderr, then the client's view of the workspace and the layers.
    // Ours are found beneath the roots and named by the paths of the spec, so the per-run ops
    // (the plan of this very spec) find them through `/proc/self/fd`.
    let client_layers = fds.split_off(STDIO);
    // Deleted and made anew since the server started: this server shows the old one.
    let workspace = roots.workspace(&client_layers[0]).ok_or(Refusal::WorkspaceReplaced)?;
    let mut pins = Pins::default();
    pins.insert(spec.workspace.clone(), workspace);
    let layers = [&spec.upper, &spec.work].into_iter().chain(spec.layers.iter());
    for (p, client) in layers.zip(&client_layers[1..]) {
        let fd = roots.resolve(p, client)?;
        if *p == spec.work {
            *in_use = Some(lock_shared(&fd).map_err(|errno| Refusal::Lock { path: p.clone(), errno })?);
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
            return Err(Refusal::Setup(e));
        }
    }
    drop(pins);
    Ok((req, command, fds))
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
        let cstr =
            |b: &[u8], what: &'static str| CString::new(b).map_err(|_| StepError::new(what, rustix::io::Errno::INVAL));
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
        rustix::process::Pid::from_raw(child).ok_or(StepError::new("command pid", rustix::io::Errno::SRCH))?,
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
    let st = crate::reap::wait(child).unwrap_or(0);
    // What the command left running goes with it, as when a cold sandbox's init exits.
    kill_all();
    crate::reap::reap_all();
    Ok(Report::of_wait_status(st).line())
}

/// SIGKILL to every process of this pid namespace but its init.
fn kill_all() {
    // SAFETY: kill(-1) from the namespace's init reaches only that namespace's processes.
    unsafe { libc::kill(-1, libc::SIGKILL) };
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
            let _ = rustix::io::write(conn, Report::Error(stage2::setup_failed(&e)).line().as_bytes());
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
        return Err(StepError::last("start the command (clone)"));
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
            return Err(StepError::last("map the command's stack"));
        }
        let stack = ChildStack { base, len: Self::LEN };
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, Self::GUARD, libc::PROT_NONE) } != 0 {
            return Err(StepError::last("guard the command's stack"));
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
        return Err(StepError::last("install stdio"));
    }
    crate::terminal::take(None)?;
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
    stage2::confine(&mut Linux, &req.spec, Some(seccomp))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state directory's naming, as txbox's own (txn::layout) has it.
    fn layer(rel: &Path) -> Option<LayerName> {
        let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
        match parts.as_slice() {
            ["tx", id, p @ ("upper" | "work")] => {
                Some(LayerName { tx: id.to_string(), step: None, upper: *p == "upper" })
            }
            ["tx", id, "steps", n, p @ ("upper" | "work")] => {
                Some(LayerName { tx: id.to_string(), step: n.parse().ok(), upper: *p == "upper" })
            }
            _ => None,
        }
    }

    #[test]
    fn a_request_lays_overlays_on_one_transactions_layers_only() {
        let spec = |upper: &str, work: &str, layers: &[&str]| {
            let mut s = SandboxSpec::new("/w".into(), upper.into(), work.into(), vec![OsString::from("true")]);
            s.layers = layers.iter().map(PathBuf::from).collect();
            s
        };
        let ok = |s: &SandboxSpec| one_transaction(Path::new("/s"), s, layer);
        assert!(ok(&spec("/s/tx/a/upper", "/s/tx/a/work", &[])).is_ok());
        assert!(ok(&spec(
            "/s/tx/a/steps/3/upper",
            "/s/tx/a/steps/3/work",
            &["/s/tx/a/steps/2/upper", "/s/tx/a/steps/1/upper"]
        ))
        .is_ok());
        for bad in [
            spec("/s/journal", "/s/tx/a/work", &[]),
            spec("/s/tx/a/upper", "/s/tx/b/work", &[]),
            spec("/s/tx/a/work", "/s/tx/a/upper", &[]),
            spec("/elsewhere/tx/a/upper", "/elsewhere/tx/a/work", &[]),
            spec("/s/tx/a/upper", "/s/tx/a/work", &["/s/tx/b/steps/1/upper"]),
            spec("/s/tx/a/steps/2/upper", "/s/tx/a/steps/2/work", &["/s/tx/b/steps/1/upper"]),
            spec("/s/tx/a/steps/2/upper", "/s/tx/a/steps/2/work", &["/s/tx/a/steps/1/work"]),
            spec("/s/tx/a/steps/2/upper", "/s/tx/a/steps/2/work", &["/s/tx/a/steps/1/upper", "/s/tx/a/steps/1/upper"]),
            spec("/s/tx/a/steps/2/upper", "/s/tx/a/steps/3/work", &[]),
        ] {
            assert!(ok(&bad).is_err(), "{bad:?}");
        }
        // Each says which path and why.
        let why = |s: SandboxSpec| ok(&s).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(why(spec("/s/journal", "/s/tx/a/work", &[])), "/s/journal is not a transaction's layer");
        assert_eq!(why(spec("/s/tx/a/upper", "/s/tx/b/work", &[])), "upper and work are not one transaction's");
        assert_eq!(
            why(spec("/s/tx/a/upper", "/s/tx/a/work", &["/s/tx/b/steps/1/upper"])),
            "/s/tx/b/steps/1/upper is not an earlier step of the same session"
        );
    }
}
