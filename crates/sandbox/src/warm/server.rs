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
//! command also gets its own IPC and UTS namespaces (made by init before it asks). The server exits after `--idle` seconds
//! without a request, when its socket is removed or replaced (the state directory was deleted),
//! or when a secret it did not hide at start appears.
//!
//! The order of the setup (`build`, `fork_init`, `seal_init`, `mount_run`, `reset`,
//! `prepare_child`) is generic over `crate::kernel::Kernel`, as stage 2's is, and may reach the
//! kernel only through it; `tests` pin it without root. What stays outside the seam is the
//! server's own bookkeeping (its lock and socket before any namespace, the request loop).
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

use super::premount::{self, NotHanded, Premount};
use super::refusal::Refusal;
use super::wire::{resource, with_suffix, Answer, Report, Request, ServerArgs, FIXED_FDS, MAX_LAYERS, MAX_REQUEST};
use super::{LayerName, StateLayout};
use crate::kernel::{Fork, Kernel, Linux, Supervised};
use crate::spec::{MountOp, MountPlan, SandboxSpec, WarmPlan};
use crate::stage2::{self, at, at_path, Pins, StepError};
use crate::supervisor::Handoff;

/// How often an idle server checks that it is still wanted.
const TICK: Duration = Duration::from_secs(1);
/// How long the server waits, after a run, for nothing to do before it lets the run's view go
/// (`Kept`): the last reference to an overlay syncs its upper filesystem, the workspace's
/// whole filesystem (`ovl_sync_fs`, 0.3-2.5 ms here), which the next run need not wait for.
const LET_GO_WHEN_IDLE: Duration = Duration::from_millis(5);
/// At most this many finished runs' views are kept; beyond, the oldest is let go at once.
const KEPT_VIEWS: usize = 2;
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
    // A session without a terminal, for good: its leader (this process) never opens one, and
    // every command of this server runs in it, each in a process group of its own.
    if rustix::process::setsid().is_err() {
        stage2::exit(1);
    }
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
    let binary = super::binary_id();
    // 3. The sandbox, but for what each transaction brings (`build`).
    let k = &mut Linux;
    let Built { supervisor, host_proc, roots, plan } = match build(k, args, layout.retired) {
        Ok(built) => built,
        Err(e) => {
            leave(&listener, &bound, &format!("it could not start: {}", e.what()));
            return Err(e);
        }
    };
    let me = Me { binary, host_proc, layer: layout.layer };
    // 4. What each secret outside the workspace looks like from inside, now that it is hidden.
    let hidden = Hidden::now(spec, &plan.scratch());

    // It works here after all: forget an earlier failure.
    let mut failed = name.clone();
    failed.push(".failed");
    let _ = rustix::fs::unlinkat(dir_fd, failed.as_os_str(), rustix::fs::AtFlags::empty());
    // 5. The pid namespace's init serves (`fork_init`); the listener is its alone.
    let (plan, roots, bound, hidden, me) = (&plan, &roots, &bound, &hidden, &me);
    fork_init(k, supervisor, move |k, handoff| {
        let (code, why) = match init(k, spec, plan, roots, &listener, bound, hidden, me, args.idle, handoff) {
            Ok(()) => (0, "it is done".to_string()),
            Err(e) => {
                record_failure(&bound.dir, &bound.name, &e);
                (1, format!("it failed: {}", e.what()))
            }
        };
        leave(&listener, bound, &why);
        code
    })
}

/// What `build` made: the socket supervisor (and init's end of its handoff), a handle on the
/// host's procfs, the clones the layers are found in, and the plan the rest follows.
struct Built<K: Kernel> {
    supervisor: Supervised<K::Supervisor, K::Handoff>,
    host_proc: OwnedFd,
    roots: Roots,
    plan: WarmPlan,
}

/// Step 3 of `serve`: what keeps host unix sockets out of reach (crate::supervisor), as in a
/// cold sandbox, started in the host's namespaces; the namespaces; private copies of the two
/// trees every transaction's layers come from (before anything is made read-only); and every
/// mount that does not depend on the transaction. The order is the documentation; `tests`
/// pin it.
fn build<K: Kernel>(k: &mut K, args: &ServerArgs, retired: &Path) -> Result<Built<K>, StepError> {
    let spec = &args.spec;
    let supervisor = k.start_supervisor(spec)?;
    // Who a client is: its pid namespace, counted in the host's procfs, which the sandbox's
    // covers once init mounts it.
    let host_proc = k.host_proc()?;
    stage2::enter_namespaces(k, spec)?;
    crate::net::warm_keep(k.net_attempts(spec));
    let roots = Roots {
        state_path: args.state.clone(),
        state: k.clone_tree(&args.state)?,
        workspace: k.clone_tree(&spec.workspace)?,
        retired: retired.to_path_buf(),
        premount: premount::location(&args.socket, &args.state),
    };
    let plan = MountPlan::for_warm(spec);
    let mut pins = Pins::default();
    for p in plan.base.sources() {
        k.pin(&mut pins, &p)?;
    }
    for op in &plan.base.namespace {
        k.mount(op, &pins)?;
    }
    drop(pins);
    Ok(Built { supervisor, host_proc, roots, plan })
}

/// Step 5 of `serve`: fork the pid namespace's init, which runs `serve` and leaves with its
/// code; this process waits for it, so that killing it (the spawner's session is gone, but an
/// administrator may) ends the server. The supervisor serves init's filter for every
/// transaction, and leaves with init.
fn fork_init<K: Kernel, F: FnOnce(&mut K, Option<K::Handoff>) -> i32>(
    k: &mut K,
    supervisor: Supervised<K::Supervisor, K::Handoff>,
    serve: F,
) -> Result<(), StepError> {
    let fork = k.fork("fork init")?;
    let (supervisor, handoff) = supervisor.map_or((None, None), |(p, h)| (Some(p), Some(h)));
    let pid = match fork {
        Fork::Child => {
            let code = serve(k, handoff);
            k.exit(code);
            return Ok(());
        }
        Fork::Parent(pid) => pid,
    };
    // What `serve` holds (the listener) and init's end of the handoff are init's alone.
    drop((serve, handoff));
    if let Some(s) = &supervisor {
        k.watch_supervisor(s, pid);
    }
    let _ = k.wait(pid);
    if let Some(s) = supervisor {
        k.wait_supervisor(s);
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
    /// Where the next run's view is premounted, relative to `state` (`premount::location`).
    premount: Option<PathBuf>,
}

impl Roots {
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

    /// Mount the next run's view for sandboxes like `base` (`premount`). Directories a view
    /// cannot be laid on as they are (not clean, a view set aside still on them, not a
    /// directory) are retired (deleted when the server is idle and no view holds them) and the
    /// view is mounted on new ones: otherwise premounting would stop for good.
    fn premount<K: Kernel>(&self, k: &mut K, plan: &WarmPlan) -> Option<Premount> {
        use rustix::io::Errno;
        let rel = self.premount.as_deref()?;
        for _ in 0..2 {
            match premount::mount(k, plan, &self.state, &self.state_path, rel, &self.workspace) {
                Ok(p) => return Some(p),
                Err(e) if matches!(e.errno, Errno::NOTEMPTY | Errno::BUSY | Errno::LOOP | Errno::NOTDIR) => {
                    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let name = rel.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                    let to = self.retired.join(format!("{name}.{}.{n}", now.as_nanos()));
                    let noreplace = rustix::fs::RenameFlags::NOREPLACE;
                    if rustix::fs::renameat_with(&self.state, rel, &self.state, &to, noreplace).is_err() {
                        return None;
                    }
                }
                Err(_) => return None,
            }
        }
        None
    }

    /// The server leaves: its premount goes, with its directories.
    fn remove_premount(&self, k: &mut Linux, p: Option<Premount>) {
        if let (Some(p), Some(rel)) = (p, self.premount.as_deref()) {
            p.remove(k, &self.state, rel);
        }
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
/// the secret as it is now). The same holds for the package caches' mounts (`SandboxSpec::caches`).
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
    fn now(spec: &SandboxSpec, scratch: &[PathBuf]) -> Hidden {
        let paths = Self::watched(spec, scratch);
        // Watching first: whatever moves while the identities are taken is seen.
        let watch = Watch::of(&paths);
        let paths = paths.into_iter().map(|h| {
            let id = Self::identity(&h);
            (h, id)
        });
        Hidden { paths: paths.collect(), watch: std::cell::RefCell::new(watch) }
    }

    /// The paths whose identity from inside matters: the hidden paths outside the workspace
    /// (those inside are covered per run) and the package caches' mount points (one the host
    /// deletes, a user's `rm -rf ~/.npm` made anew by the next run, takes the cache's mount with
    /// it here). Not those below a scratch filesystem (`/tmp`, `/dev/shm`): they show nothing of
    /// the host, and since each reset unmounts them, a watch on one would be lost after every
    /// transaction and every secret looked at again for the next (a state directory in `/tmp`).
    fn watched(spec: &SandboxSpec, scratch: &[PathBuf]) -> Vec<PathBuf> {
        let caches = spec.caches.iter().map(|(_, at)| at.clone());
        let hidden = spec.hide.iter().filter(|h| !h.starts_with(&spec.workspace)).cloned();
        hidden.chain(caches).filter(|p| !scratch.iter().any(|s| p.starts_with(s))).collect()
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

/// Leave without resetting anyone. A client that connected while the server was deciding to
/// go (idle, replaced, failed) sits in the listener's queue, its request sent; closing the
/// listener would answer it with a reset, which the client must read as a server that took the
/// request and died (`client::abandon`: stop it, wait for the run's directories). Instead the
/// name goes first (new clients find no server and start one), then the listener stops taking
/// connections (`shutdown`: a connect through a name resolved earlier is refused), and each
/// client already queued is told why, so it builds its own sandbox at once.
fn leave(listener: &OwnedFd, bound: &Bound, why: &str) {
    bound.remove_if_ours();
    let _ = rustix::net::shutdown(listener, rustix::net::Shutdown::Read);
    if rustix::io::ioctl_fionbio(listener, true).is_err() {
        return; // a blocking accept could wait forever
    }
    let line = Answer::Refuse(format!("the warm server is leaving: {why}")).line();
    loop {
        match rustix::net::accept_with(listener, SocketFlags::CLOEXEC) {
            Ok(conn) => say(&conn, &line),
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return, // EAGAIN: no one else is queued
        }
    }
}

fn inode(p: &Path) -> Option<u64> {
    rustix::fs::lstat(p).ok().map(|s| s.st_ino)
}

/// pid 1 of the warm sandbox: seal itself (`seal_init`), then serve requests one at a time.
#[allow(clippy::too_many_arguments)]
fn init(
    k: &mut Linux,
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
    seal_init(k, spec, plan, handoff)?;
    // Commands share init's session (each in a group of its own): it must have no terminal.
    if let Some(tty) = controlling_terminal() {
        return Err(StepError::new(format!("init has a controlling terminal ({tty:#x})"), rustix::io::Errno::NOTSUP));
    }
    // The hostname namespace every command's is copied from; the first command's namespaces.
    let uts = rustix::fs::open("/proc/self/ns/uts", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(at("open /proc/self/ns/uts"))?;
    fresh_namespaces(k, uts.as_fd())?;
    let seccomp =
        crate::seccomp::build().map_err(|e| StepError::new(format!("seccomp: {e}"), rustix::io::Errno::PERM))?;
    let stack = ChildStack::new()?;
    let ready = Ready { base: spec, plan, roots, seccomp: &seccomp, stack: &stack, hidden, me };
    let mut last_used = Instant::now();
    let mut garbage = true;
    let mut kept: Vec<Kept> = Vec::new();
    // The next run's view, ready before it asks (`premount`), and the Landlock ruleset of a
    // command that runs in it.
    let mut next = roots.premount(k, plan);
    let mut ruleset = ruleset_for(spec, next.as_ref());
    loop {
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        let wait = if kept.is_empty() { TICK } else { LET_GO_WHEN_IDLE };
        let timeout =
            rustix::event::Timespec { tv_sec: wait.as_secs() as i64, tv_nsec: i64::from(wait.subsec_nanos()) };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) if !kept.is_empty() => {
                // Nothing to do: now the views may go, and their filesystem be synced.
                kept.clear();
                continue;
            }
            Ok(0) => {
                if last_used.elapsed() >= idle || !bound.still_ours() {
                    roots.remove_premount(k, next.take());
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
        let go_on = serve_one(
            &ready,
            &conn,
            &mut in_use,
            &mut Views { next: &mut next, kept: &mut kept, ruleset: ruleset.take() },
        );
        drop(conn);
        // Make the sandbox as new for the next transaction; one that cannot be reset is done.
        // A run's view, detached, lives on in `kept` until the server is idle, and so does the
        // lock on its work directory: its directories serve another transaction only then. A
        // session step's goes at once: the next step waits for it to use its layers.
        let views = match &in_use {
            Some(u) if u.run => pin_views(plan),
            _ => Vec::new(),
        };
        // A premount still there was neither used nor set aside: the request never got as far
        // as a view, and the premount is the one on the workspace's path. It stays.
        match next {
            Some(_) => reset_scratch(k, plan, uts.as_fd())?,
            None => reset(k, plan, uts.as_fd())?,
        }
        match in_use {
            Some(u) if !views.is_empty() => kept.push(Kept { _views: views, _work: u.lock }),
            other => drop(other),
        }
        // A premount set aside for a request is kept the same way.
        while kept.len() > KEPT_VIEWS {
            kept.remove(0);
        }
        if !go_on {
            return Ok(());
        }
        last_used = Instant::now();
        garbage = true;
        if next.is_none() {
            next = roots.premount(k, plan);
        }
        // Made anew after every request: /tmp is a new filesystem (and the view may be).
        ruleset = ruleset_for(spec, next.as_ref());
    }
}

/// The Landlock ruleset of a command that will run in the premounted view `next`, made while
/// the server waits: its rules bind to the view and to this `/tmp`, so it serves only a request
/// handed that view, before the next reset. None without a premount, when a rule's path lies
/// inside the view (`LandlockPlan::ahead_of_view`), or when it cannot be made: the command's
/// process then makes its own, as a cold one does.
fn ruleset_for(spec: &SandboxSpec, next: Option<&Premount>) -> Option<crate::landlock::Prepared> {
    next?;
    let plan = crate::landlock::LandlockPlan::for_spec(spec);
    if !plan.ahead_of_view(&spec.workspace) {
        return None;
    }
    crate::landlock::prepare(&plan).ok()
}

/// The controlling terminal of this process (`tty_nr` of `/proc/self/stat`), if it has one.
fn controlling_terminal() -> Option<u64> {
    tty_nr(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// `tty_nr` (the 7th field) of a `/proc/PID/stat` line, when not 0. The command name (2nd
/// field) is in parentheses and may hold spaces and parentheses itself: fields are counted from
/// the last `)`.
fn tty_nr(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // state, ppid, pgrp, session, tty_nr
    rest.split_whitespace().nth(4)?.parse::<i64>().ok().filter(|t| *t != 0).map(|t| t as u64)
}

/// The views of transactions the server holds between requests: the premounted one for the
/// next run, and finished ones kept until the server is idle.
struct Views<'a> {
    next: &'a mut Option<Premount>,
    kept: &'a mut Vec<Kept>,
    /// The ruleset made for `next` (`ruleset_for`): for a command handed that view only.
    ruleset: Option<crate::landlock::Prepared>,
}

/// pid 1's own setup, before it serves anyone: it dies with the server, mounts its /proc (and
/// makes the kernel's knobs in it read-only), takes the OOM score and bounding set every
/// command inherits (`stage2::confine_inherited`: made once here, not in each command's
/// process), installs the socket filter every command inherits, and becomes not dumpable: no
/// process of a command may read this one's memory or open its fds (`/proc/1/fd`), which
/// include the listening socket and, during a run, the layers. Only then: the supervisor takes
/// the listener from it with the rights of a debugger.
fn seal_init<K: Kernel>(
    k: &mut K,
    spec: &SandboxSpec,
    plan: &WarmPlan,
    handoff: Option<K::Handoff>,
) -> Result<(), StepError> {
    k.die_with_parent();
    for op in &plan.base.init {
        k.mount(op, &Pins::default())?;
    }
    stage2::confine_inherited(k, spec)?;
    if let Some(handoff) = handoff {
        k.guard_sockets(handoff)?;
    }
    k.not_dumpable();
    Ok(())
}

/// A finished run's view, detached but kept alive (`LET_GO_WHEN_IDLE`), and the lock on its
/// work directory. The fields drop in order: the view goes before the lock is let go.
struct Kept {
    _views: Vec<OwnedFd>,
    _work: OwnedFd,
}

/// The work directory a transaction's view is mounted on, share-locked while the view lives.
struct InUse {
    lock: OwnedFd,
    /// It is a run's (not a session step's, whose layers the next step waits for).
    run: bool,
}

/// A reference to each view `plan.release` detaches, taken before it does: the detach then
/// only takes the view out of the tree, and the view ends when the reference is closed.
fn pin_views(plan: &WarmPlan) -> Vec<OwnedFd> {
    plan.release
        .iter()
        .filter_map(|op| match op {
            MountOp::Detach { target } => {
                rustix::fs::open(target, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok()
            }
            _ => None,
        })
        .collect()
}

/// After a transaction, when no process of it is left: detach its view (`release`), then give
/// the next one a new `/tmp` and `/dev/shm` (`reset`) and new IPC and UTS namespaces.
fn reset<K: Kernel>(k: &mut K, plan: &WarmPlan, uts: BorrowedFd<'_>) -> Result<(), StepError> {
    for op in &plan.release {
        k.mount(op, &Pins::default())?;
    }
    reset_scratch(k, plan, uts)
}

/// A new `/tmp`, `/dev/shm`, IPC and UTS namespaces; the workspace's view left as it is.
fn reset_scratch<K: Kernel>(k: &mut K, plan: &WarmPlan, uts: BorrowedFd<'_>) -> Result<(), StepError> {
    for op in &plan.reset {
        k.mount(op, &Pins::default())?;
    }
    fresh_namespaces(k, uts)
}

/// The next command's IPC and UTS namespaces, made by init while it waits (not in the
/// command's process, on its path: ~60 µs): init joins them, and the command, started from it,
/// shares them; after the command, init makes new ones. The UTS namespace is copied from
/// init's first (`uts`), never from one a command had (none may change it: it has no
/// CAP_SYS_ADMIN, but this holds without that); a new IPC namespace is empty, so nothing of one
/// transaction's (System V objects, POSIX message queues) reaches the next.
fn fresh_namespaces<K: Kernel>(k: &mut K, uts: BorrowedFd<'_>) -> Result<(), StepError> {
    k.enter_uts(uts)?;
    k.unshare(rustix::thread::UnshareFlags::NEWIPC | rustix::thread::UnshareFlags::NEWUTS)
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
/// mounted on it; the caller closes it only once the overlay is gone. The client reuses a
/// directory its run left empty for a later transaction (`TxDir::create` takes it as a
/// spare) only when it is not locked, and a session's next step waits for it: two overlays
/// must never share upper and work, nor a layer be one overlay's upper and another's lower.
fn serve_one(ready: &Ready<'_>, conn: &OwnedFd, in_use: &mut Option<InUse>, views: &mut Views<'_>) -> bool {
    let (req, command, stdio, premounted) = match admit(ready, conn, in_use, views) {
        Ok(admitted) => admitted,
        Err(why) => {
            say(conn, &Answer::Refuse(why.to_string()).line());
            return !why.retires();
        }
    };
    // When the command's fate is reported, no process of it is left (all killed and reaped),
    // so nothing writes to the upper layer any more and the client may classify it. The view
    // is detached afterwards, off the client's path: unmounting waits for an RCU grace period.
    // The ruleset was made for the premounted view: any other view needs its own.
    let ruleset = if premounted { views.ruleset.take() } else { None };
    let status = run_command(&req, &command, stdio, ready.seccomp, ruleset.as_ref(), conn, ready.stack, premounted);
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
    in_use: &mut Option<InUse>,
    views: &mut Views<'_>,
) -> Result<(Request, Command, Vec<OwnedFd>, bool), Refusal> {
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
    let upper = roots.resolve(&spec.upper, &client_layers[1])?;
    let work = roots.resolve(&spec.work, &client_layers[2])?;
    for (p, client) in spec.layers.iter().zip(&client_layers[3..]) {
        pins.insert(p.clone(), roots.resolve(p, client)?);
    }
    drop(client_layers);
    let run = spec.work.strip_prefix(&roots.state_path).ok().and_then(me.layer).is_some_and(|l| l.step.is_none());
    let per_run = MountPlan::for_warm(spec).per_run;
    // A client that stopped waiting for the answer (this server stalled) builds its own view on
    // these very directories: nothing may be exchanged or mounted on them any more.
    if hung_up(conn) {
        return Err(Refusal::ClientGone);
    }
    // The view premounted for the next run, if it is this one's; else it is set aside.
    let handed = match views.next.take().map(|p| p.hand_over(spec, &roots.state, &roots.state_path, &upper, &work)) {
        None => None,
        Some(Ok(handed)) => Some(handed),
        Some(Err(NotHanded::Unfit(p))) => {
            if let Some((view, lock)) = p.set_aside(&mut Linux) {
                views.kept.push(Kept { _views: vec![view], _work: lock });
            }
            None
        }
        Some(Err(NotHanded::Broken(p, e))) => {
            // Gone before the client hears of it: it builds its own view on these directories.
            p.release(&mut Linux);
            return Err(Refusal::Setup(e));
        }
    };
    let premounted = handed.is_some();
    let per_run: Vec<MountOp> = match handed {
        Some(h) => {
            *in_use = Some(InUse { lock: h.lock, run });
            per_run.into_iter().filter(|op| !matches!(op, MountOp::Overlay { .. })).collect()
        }
        None => {
            let lock = lock_shared(&work).map_err(|errno| Refusal::Lock { path: spec.work.clone(), errno })?;
            *in_use = Some(InUse { lock, run });
            pins.insert(spec.upper.clone(), upper);
            pins.insert(spec.work.clone(), work);
            per_run
        }
    };
    mount_run(&mut Linux, &per_run, &plan.release, &pins).map_err(Refusal::Setup)?;
    drop(pins);
    Ok((req, command, fds, premounted))
}

/// Whether the client closed its end of the connection (it waits for the answer otherwise).
fn hung_up(conn: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(conn, PollFlags::RDHUP)];
    let now = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
    matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(n) if n > 0)
        && fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
}

/// Mount a run's view (`per_run`: the overlay on the pinned layers, then what hides inside
/// it); when a mount fails, undo what was done (`release`) before the run is refused.
fn mount_run<K: Kernel>(k: &mut K, per_run: &[MountOp], release: &[MountOp], pins: &Pins) -> Result<(), StepError> {
    for op in per_run {
        if let Err(e) = k.mount(op, pins) {
            for op in release {
                let _ = k.mount(op, &Pins::default());
            }
            return Err(e);
        }
    }
    Ok(())
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
#[allow(clippy::too_many_arguments)]
fn run_command(
    req: &Request,
    command: &Command,
    stdio: Vec<OwnedFd>,
    seccomp: &seccompiler::BpfProgram,
    ruleset: Option<&crate::landlock::Prepared>,
    conn: &OwnedFd,
    stack: &ChildStack,
    premounted: bool,
) -> Result<String, StepError> {
    let raw: Vec<i32> = stdio.iter().map(|f| f.as_raw_fd()).collect();
    let conn_fd = conn.as_raw_fd();
    say(conn, &Answer::Ok { premounted }.line());
    let child = spawn(&Child { req, stdio: &raw, seccomp, ruleset, conn_fd, command }, stack)?;
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
    ruleset: Option<&'a crate::landlock::Prepared>,
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
        if let Err(e) = prepare_child(&mut Linux, c.req, c.stdio, c.seccomp, c.ruleset) {
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

/// In the command's process, before exec: the client's stdio, a process group of its own in
/// init's session, which has no terminal (`main`, checked by `init`: a new session per command
/// cost 6-50 µs, the kernel making a scheduling group for it), its IPC and UTS namespaces init
/// made for it (`fresh_namespaces`), the client's umask and limits,
/// then the confinement of any sandbox (whose limits, set after the client's, win). The order
/// is the documentation; `tests` pin it.
fn prepare_child<K: Kernel>(
    k: &mut K,
    req: &Request,
    stdio: &[i32],
    seccomp: &seccompiler::BpfProgram,
    ruleset: Option<&crate::landlock::Prepared>,
) -> Result<(), StepError> {
    k.install_stdio(stdio)?;
    k.own_process_group()?;
    k.umask(req.umask & 0o777);
    for &(res, soft, hard) in &req.rlimits {
        // Best effort: a limit the server cannot raise back stays at the server's.
        if let Some(r) = resource(res) {
            k.caller_rlimit(r, soft, hard);
        }
    }
    // The OOM score and the bounding set are init's, inherited (`seal_init`).
    stage2::confine(k, &req.spec, stage2::Inherited::Confinement, Some(seccomp), ruleset)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::kernel::recorder::{Recorder, Trace};

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

    /// A server that goes (idle, replaced, failed) answers every client queued on its listener
    /// with a refusal, not a reset that the client would take for a server that died holding
    /// its run; its name goes, and a connect through a name resolved before is refused.
    #[test]
    fn a_leaving_server_refuses_its_queued_clients_and_takes_no_more() {
        use std::io::{BufRead, Write};
        use std::os::unix::net::UnixStream;
        let root = PathBuf::from(format!("/var/tmp/txbox-leave-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let sock = root.join("s.sock");
        let listener =
            rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None).unwrap();
        rustix::net::bind(&listener, &SocketAddrUnix::new(sock.as_path()).unwrap()).unwrap();
        rustix::net::listen(&listener, 8).unwrap();
        let bound = Bound {
            dir: rustix::fs::open(&root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap(),
            name: "s.sock".into(),
            ino: inode(&sock),
        };
        // Another name for the same socket: what a client resolved before the name went.
        std::fs::hard_link(&sock, root.join("alias.sock")).unwrap();
        let clients: Vec<UnixStream> = (0..3)
            .map(|_| {
                let mut c = UnixStream::connect(&sock).unwrap();
                c.write_all(b"a request the server never reads").unwrap();
                c
            })
            .collect();
        leave(&listener, &bound, "idle");
        // The process goes: its listener with it.
        drop(listener);
        for c in clients {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut line = String::new();
            std::io::BufReader::new(c).read_line(&mut line).unwrap();
            assert_eq!(Answer::parse(&line), Some(Answer::Refuse("the warm server is leaving: idle".into())));
        }
        assert!(!sock.exists(), "the name stayed");
        let late = UnixStream::connect(root.join("alias.sock")).map(|_| ()).unwrap_err();
        assert_eq!(late.kind(), std::io::ErrorKind::ConnectionRefused, "{late}");
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The scratch filesystems are the reset's: what is below them is not looked at, the rest
    /// is, and a secret replaced on the host is seen as moved.
    #[test]
    fn secrets_below_the_scratch_filesystems_are_not_watched() {
        let root = PathBuf::from(format!("/var/tmp/txbox-hidden-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("home")).unwrap();
        std::fs::write(root.join("home/key"), "old").unwrap();
        let mut spec = SandboxSpec::new("/w".into(), "/s/u".into(), "/s/w".into(), vec![OsString::from("true")]);
        spec.hide = vec![root.join("home/key"), "/tmp/state".into(), "/dev/shm/x".into(), "/w/.env".into()];
        spec.caches = vec![("/s/caches/pip".into(), "/tmp/home/.cache/pip".into())];
        let scratch = MountPlan::for_warm(&spec).scratch();
        assert_eq!(scratch, [PathBuf::from("/tmp"), PathBuf::from("/dev/shm")]);
        assert_eq!(Hidden::watched(&spec, &scratch), [root.join("home/key")]);
        assert_eq!(Hidden::watched(&spec, &[]).len(), 4, "the workspace's own are covered per run");

        let hidden = Hidden::now(&spec, &scratch);
        assert_eq!(hidden.changed(), None);
        std::fs::write(root.join("home/key.new"), "new").unwrap();
        std::fs::rename(root.join("home/key.new"), root.join("home/key")).unwrap();
        assert_eq!(hidden.changed(), Some(root.join("home/key").as_path()), "a replaced secret is seen");
        std::fs::remove_dir_all(&root).unwrap();
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

    /// A server of an unprivileged user, with a secret outside the workspace and one inside.
    fn server_args() -> ServerArgs {
        let ws = PathBuf::from("/work/repo");
        let mut spec = SandboxSpec::new(ws.clone(), ws.clone(), ws, vec![OsString::from("-")]);
        spec.userns = true;
        spec.uid = 1000;
        spec.gid = 1000;
        spec.hide = vec!["/state".into(), "/home/u/.ssh".into(), "/work/repo/.env".into()];
        ServerArgs { socket: "/state/warm/x.sock".into(), state: "/state".into(), idle: Duration::from_secs(60), spec }
    }

    /// The server's setup as `k` follows it: `build`, then `fork_init`, whose init seals itself
    /// (`seal_init`) and leaves.
    fn server_path(mut k: Recorder) -> (Trace, Result<(), StepError>) {
        let args = server_args();
        let r = build(&mut k, &args, Path::new("retired")).and_then(|b| {
            let plan = b.plan;
            fork_init(&mut k, b.supervisor, |k, handoff| i32::from(seal_init(k, &args.spec, &plan, handoff).is_err()))
        });
        (Trace(k.ops), r)
    }

    #[test]
    fn the_server_enters_its_namespaces_as_stage_2_and_clones_before_it_mounts() {
        let (t, r) = server_path(Recorder { supervisor: true, ..Recorder::default() });
        assert!(r.is_ok(), "{r:?}");
        // The supervisor starts in the host's namespaces.
        t.before("start_supervisor", "unshare");
        t.before("unshare", "write /proc/self/setgroups");
        t.before("write /proc/self/setgroups", "write /proc/self/gid_map");
        t.before("write /proc/self/gid_map", "clone");
        t.before("loopback", "mount");
        // The clones are taken in the server's own mount namespace (overlayfs takes layers
        // only from there) and before `/` turns read-only (upper and work stay writable).
        t.before("unshare", "clone /state");
        t.before("clone /state", "clone /work/repo");
        t.before("clone", "mount");
        // Every host object a later mount may cover is opened before the first mount.
        t.before("pin", "mount");
        assert_eq!(t.0[t.first("mount")], "mount PrivateRoot");
        // The secret outside the workspace is hidden before init (and any command) exists;
        // nothing of a transaction is mounted yet.
        t.before("mount Hide { target: \"/home/u/.ssh\" }", "fork init");
        t.before("mount ReadOnlyRoot", "fork init");
        assert!(!t.has("mount Overlay") && !t.has("mount Hide { target: \"/work/repo/.env\" }"), "{:#?}", t.0);
        // Who a client is, from the host's procfs: taken before init covers /proc.
        t.before("host_proc", "mount Proc");
    }

    #[test]
    fn init_seals_itself_before_it_serves() {
        let (t, _) = server_path(Recorder { supervisor: true, ..Recorder::default() });
        let init: Vec<&str> = t.0[t.first("fork init") + 1..].iter().map(String::as_str).collect();
        let plan = MountPlan::for_warm(&server_args().spec);
        let mut expected = vec!["die_with_parent".to_string()];
        expected.extend(plan.base.init.iter().map(|op| format!("mount {op:?}")));
        // What every command inherits, made once: the OOM score (and the bounding set of root
        // without a user namespace: below).
        expected.push("oom_score_adj".into());
        // The socket filter before init turns undumpable: the supervisor takes the listener
        // from it with the rights of a debugger.
        expected.extend(["guard_sockets", "not_dumpable", "exit 0"].map(String::from));
        assert_eq!(init, expected);
        // Without the supervisor (Landlock keeps unix sockets in), no filter to install.
        let (t, _) = server_path(Recorder::default());
        assert!(!t.has("guard_sockets") && t.has("not_dumpable"), "{:#?}", t.0);
        // Root without a user namespace: init drops the bounding set once, for every command,
        // before anything of a command can reach it.
        let mut spec = server_args().spec;
        spec.userns = false;
        let mut k = Recorder::default();
        seal_init(&mut k, &spec, &MountPlan::for_warm(&spec), None).unwrap();
        let t = Trace(k.ops);
        assert_eq!(t.0.iter().filter(|o| o.starts_with("drop_capability")).count(), stage2::DROPPED_CAPS.len());
        t.before("oom_score_adj", "drop_capability");
        t.before("drop_capability", "not_dumpable");
    }

    #[test]
    fn the_server_waits_for_its_init_and_the_supervisor_leaves_with_it() {
        let k = Recorder { supervisor: true, forks: [Fork::Parent(42)].into(), ..Recorder::default() };
        let (t, r) = server_path(k);
        assert!(r.is_ok(), "{r:?}");
        let tail: Vec<&str> = t.0[t.first("fork init") + 1..].iter().map(String::as_str).collect();
        assert_eq!(tail, ["watch_supervisor 42", "wait 42", "wait_supervisor"]);
    }

    #[test]
    fn a_failed_step_stops_the_server_before_anything_runs() {
        for step in
            ["start_supervisor", "host_proc", "unshare", "write /proc/self/uid_map", "clone /work", "pin", "mount"]
        {
            let (t, r) = server_path(Recorder { fail: Some(step), ..Recorder::default() });
            assert!(r.is_err(), "{step}: {:#?}", t.0);
            assert_eq!(t.0.last().map(|o| o.starts_with(step)), Some(true), "{step}: {:#?}", t.0);
            assert!(!t.has("fork"), "{step}: {:#?}", t.0);
        }
        // Init that cannot mount its /proc serves nobody: it leaves before the filter.
        let (t, _) = server_path(Recorder { supervisor: true, fail: Some("mount Proc"), ..Recorder::default() });
        assert!(!t.has("guard_sockets") && !t.has("not_dumpable"), "{:#?}", t.0);
        assert_eq!(t.0.last().map(String::as_str), Some("exit 1"));
    }

    /// A transaction's run in the server of `server_args`, as root (no user namespace).
    fn request() -> Request {
        let mut spec = server_args().spec;
        spec.userns = false;
        spec.uid = 0;
        spec.gid = 0;
        spec.upper = "/state/tx/a/upper".into();
        spec.work = "/state/tx/a/work".into();
        spec.cpu_seconds = Some(10);
        spec.argv = vec![OsString::from("make")];
        // The caller's own CPU limit (0: RLIMIT_CPU) is higher than the run's, and a NOFILE (7).
        let rlimits = vec![(0, Some(100), None), (7, Some(1024), Some(4096))];
        Request { binary: "b".into(), spec, env: Vec::new(), umask: 0o22, rlimits }
    }

    #[test]
    fn a_command_is_confined_as_a_cold_one_after_the_callers_limits() {
        let mut k = Recorder::default();
        prepare_child(&mut k, &request(), &[10, 11, 12], &Vec::new(), None).unwrap();
        let t = Trace(k.ops);
        assert_eq!(t.0[0], "install_stdio [10, 11, 12]");
        // Its IPC and UTS namespaces are made by init beforehand (`fresh_namespaces`).
        assert!(!t.has("unshare"), "{:#?}", t.0);
        t.before("own_process_group", "umask");
        assert!(!t.has("take_terminal"), "no session of its own: {:#?}", t.0);
        t.before("umask 22", "setrlimit");
        // The run's limits are set after the caller's, so they win.
        t.before("caller_rlimit Cpu Some(100) None", "setrlimit Cpu 10");
        assert!(t.has("caller_rlimit Nofile Some(1024) Some(4096)"), "{:#?}", t.0);
        // Then the confinement of any sandbox, seccomp last; the OOM score and the bounding set
        // are init's (`seal_init`), inherited.
        assert!(!t.has("drop_capability") && !t.has("oom_score_adj"), "{:#?}", t.0);
        t.before("setrlimit", "no_new_privs");
        t.before("no_new_privs", "landlock");
        assert_eq!(t.0[t.0.len() - 2..], ["landlock", "seccomp"]);
        // With a ruleset made while the server waited: enforced in the same place, not made.
        let prepared = crate::landlock::prepare(&crate::landlock::LandlockPlan::default()).unwrap();
        let mut k = Recorder::default();
        prepare_child(&mut k, &request(), &[10, 11, 12], &Vec::new(), Some(&prepared)).unwrap();
        let t = Trace(k.ops);
        t.before("no_new_privs", "landlock prepared");
        assert_eq!(t.0[t.0.len() - 2..], ["landlock prepared", "seccomp"]);
        assert!(!t.0.iter().any(|o| o == "landlock"), "{:#?}", t.0);
    }

    #[test]
    fn the_controlling_terminal_is_read_past_any_command_name() {
        assert_eq!(tty_nr("1 (txbox-warm) S 0 1 1 0 -1 4194560 0"), None);
        assert_eq!(tty_nr("7 (sh) S 1 7 7 34816 7 4194560"), Some(34816));
        // A name with spaces and parentheses cannot shift the fields.
        assert_eq!(tty_nr("7 (a) S 1 2 3 0 (b)) S 1 7 7 34817 7 0"), Some(34817));
        assert_eq!(tty_nr("garbage"), None);
        assert_eq!(controlling_terminal(), controlling_terminal(), "reads this process's own");
    }

    /// A ruleset is made ahead only for rules that do not look into the premounted view.
    #[test]
    fn a_ruleset_is_made_ahead_only_outside_the_view() {
        let mut spec = request().spec;
        let plan = |spec: &SandboxSpec| crate::landlock::LandlockPlan::for_spec(spec);
        assert!(plan(&spec).ahead_of_view(&spec.workspace), "{:?}", plan(&spec));
        // A cache or writable path outside, or above, the workspace: fine.
        spec.caches = vec![("/state/caches/pip".into(), "/home/u/.cache/pip".into())];
        spec.writable = vec!["/work".into()];
        assert!(plan(&spec).ahead_of_view(&spec.workspace));
        // Inside the workspace: opening it would look into the view before its run has it.
        for (writable, cache) in [(Some("/work/repo/build"), None), (None, Some("/work/repo/.cache/pip"))] {
            let mut s = spec.clone();
            s.writable.extend(writable.map(PathBuf::from));
            s.caches.extend(cache.map(|t| (PathBuf::from("/state/caches/x"), PathBuf::from(t))));
            assert!(!plan(&s).ahead_of_view(&s.workspace), "{:?}", plan(&s));
        }
        // A sibling whose name starts like the workspace's is not inside it.
        spec.writable = vec!["/work/repo2".into()];
        assert!(plan(&spec).ahead_of_view(&spec.workspace));
    }

    #[test]
    fn a_command_whose_setup_fails_is_never_left_half_confined() {
        let mut k = Recorder { fail: Some("own_process_group"), ..Recorder::default() };
        assert!(prepare_child(&mut k, &request(), &[10, 11, 12], &Vec::new(), None).is_err());
        assert!(!k.ops.iter().any(|o| o.starts_with("umask") || o.starts_with("seccomp")), "{:#?}", k.ops);
        let mut k = Recorder { fail: Some("landlock"), ..Recorder::default() };
        assert!(prepare_child(&mut k, &request(), &[10, 11, 12], &Vec::new(), None).is_err());
        assert!(!k.ops.iter().any(|o| o.starts_with("seccomp")), "{:#?}", k.ops);
    }

    #[test]
    fn a_runs_view_is_mounted_whole_or_undone_and_replaced_after() {
        let spec = request().spec;
        let plan = MountPlan::for_warm(&spec);
        let mounts = |ops: &[MountOp]| ops.iter().map(|op| format!("mount {op:?}")).collect::<Vec<_>>();
        let mut k = Recorder::default();
        mount_run(&mut k, &plan.per_run, &plan.release, &Pins::default()).unwrap();
        assert_eq!(k.ops, mounts(&plan.per_run));
        // The secret inside the workspace fails to hide: the view goes again, and the run is
        // refused (nothing runs on a view that shows it).
        let mut k = Recorder { fail: Some("mount Hide"), ..Recorder::default() };
        assert!(mount_run(&mut k, &plan.per_run, &plan.release, &Pins::default()).is_err());
        let overlay = k.ops.iter().position(|o| o.starts_with("mount Overlay"));
        assert_eq!(overlay, Some(0), "{:#?}", k.ops);
        assert_eq!(
            k.ops[1..],
            ["mount Hide { target: \"/work/repo/.env\" }", "mount Detach { target: \"/work/repo\" }"]
        );
        // After a run, its view goes before /tmp and /dev/shm are replaced by empty ones, then
        // the next command's IPC and UTS namespaces are made, the UTS one from init's first.
        let uts = std::fs::File::open("/proc/self/ns/uts").unwrap();
        let mut k = Recorder::default();
        reset(&mut k, &plan, uts.as_fd()).unwrap();
        let mut expected = mounts(&plan.release);
        expected.extend(mounts(&plan.reset));
        expected.extend(["enter_uts".to_string(), "unshare UnshareFlags(NEWIPC | NEWUTS)".to_string()]);
        assert_eq!(k.ops, expected);
        assert_eq!(k.ops[0], "mount Detach { target: \"/work/repo\" }");
        // With the premount still in place (no request got as far as a view), the view stays.
        let mut k = Recorder::default();
        reset_scratch(&mut k, &plan, uts.as_fd()).unwrap();
        assert_eq!(k.ops[..plan.reset.len()], mounts(&plan.reset)[..]);
        assert!(!k.ops.iter().any(|o| o.contains("Detach { target: \"/work/repo\" }")), "{:#?}", k.ops);
    }

    /// The premount's directories are replaced by new ones whenever a view cannot be laid on
    /// them as they are: while a premount set aside for a request still lives on them (two
    /// overlays must never share upper and work), or when the name is not a directory.
    /// Premounting goes on; what was there waits in the retired directory.
    #[test]
    fn premounting_goes_on_with_new_directories_when_the_old_cannot_serve() {
        use std::os::unix::fs::MetadataExt;
        let root = std::env::temp_dir().join(format!("txbox-server-premount-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (state, ws) = (root.join("state"), root.join("ws"));
        for d in [state.join("warm"), state.join("retired"), ws.clone()] {
            std::fs::create_dir_all(&d).unwrap();
        }
        let open = |p: &Path| rustix::fs::open(p, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty());
        let roots = Roots {
            state_path: state.clone(),
            state: open(&state).unwrap(),
            workspace: open(&ws).unwrap(),
            retired: "retired".into(),
            premount: Some("warm/k.sock.next".into()),
        };
        let base = SandboxSpec::new(ws.clone(), ws.clone(), ws.clone(), vec![OsString::from("-")]);
        let plan = MountPlan::for_warm(&base);
        let next = state.join("warm/k.sock.next");
        let upper = || std::fs::metadata(next.join("upper")).unwrap().ino();
        let retired = || std::fs::read_dir(state.join("retired")).unwrap().count();

        let set_aside = roots.premount(&mut Recorder::default(), &plan).unwrap();
        let first = upper();
        let again = roots.premount(&mut Recorder::default(), &plan);
        assert!(again.is_some(), "premounting stopped");
        assert_ne!(upper(), first, "a second view on the directories of a live one");
        assert_eq!(retired(), 1);
        drop((set_aside, again));

        for plant in [
            |p: &Path| std::os::unix::fs::symlink("/", p).unwrap(),
            |p: &Path| std::fs::write(p, "x").unwrap(),
            |p: &Path| {
                std::fs::create_dir(p).unwrap();
                std::os::unix::fs::symlink("/", p.join("upper")).unwrap();
            },
        ] {
            let _ = std::fs::remove_dir_all(&next);
            plant(&next);
            assert!(roots.premount(&mut Recorder::default(), &plan).is_some(), "premounting stopped");
            assert!(std::fs::symlink_metadata(next.join("upper")).unwrap().is_dir());
        }
        assert_eq!(retired(), 4);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
