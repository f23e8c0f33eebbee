//! The next run's view, mounted while the server waits (#18).
//!
//! A run's overlay mount is the largest piece of a warm run's setup (0.35-0.7 ms of the
//! server's time on the run's path: overlayfs cleans and probes its work directory on every
//! mount). So after each transaction the server mounts the next run's view ahead, on a pair of
//! empty directories of its own (`SOCKET.next/{upper,work}`, in the state directory beside its
//! socket), and hands it to the run that comes by exchanging those directories with the run's
//! own (`renameat2(RENAME_EXCHANGE)`, on the same filesystem): the run's `tx/ID/upper` and
//! `work` are then the premounted ones, and the run's own, empty, wait in `SOCKET.next` for
//! the next premount. Nothing else changes for the client, which names its directories by path.
//!
//! Why a view mounted before the run is the run's view:
//! - Nothing looks into it before the run: no process lives in the server's namespaces
//!   between transactions, and an overlay mount holds nothing of its lower layer but the root
//!   (names are looked up when first asked for), so what the previous run's commit changes in
//!   the workspace meanwhile shows, as in a view mounted later.
//! - Overlayfs takes the merged root's mode and owner from the upper root when it mounts:
//!   the server gives the upper root the workspace root's, and hands the view only to a run
//!   whose own upper root (mirrored from the workspace root at `begin`) has the same. The
//!   run's times are carried over (overlayfs reads those from the upper root when asked).
//! - Its directories are empty and clean when mounted, and no view lives on them (their work
//!   directory is not locked: a premount set aside may still be kept), checked here; its work
//!   directory is share-locked from then on, as every view's is (`server::serve_one`).
//! - Only a view of one upper over the workspace is premounted: a run's, or a session's first
//!   step's (whose view, a step's, goes at once after it, and whose lock the next step waits
//!   for). Any other request (a later step, over its earlier steps' uppers; a root that
//!   differs) gets its own view, as without a premount, and the premount is set aside:
//!   detached, and let go when the server is idle, as a finished run's.
//!
//! Owns `SOCKET.next` and the premounted view's life; may not decide whether a request is
//! served (the server's) nor mount anything but the view of `per_run`'s overlay.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, RenameFlags, ResolveFlags};

use crate::kernel::Kernel;
use crate::spec::{MountOp, SandboxSpec, WarmPlan};
use crate::stage2::{at, at_path, Pins, StepError};

const UPPER: &str = "upper";
const WORK: &str = "work";

/// A view mounted on the workspace's path in the server's namespace, ready for the next run.
pub(super) struct Premount {
    /// `SOCKET.next`, whose `upper` and `work` the view was mounted on (until handed over).
    dir: OwnedFd,
    upper: OwnedFd,
    /// Open for reading and share-locked: a view lives on it.
    work: OwnedFd,
    upper_id: (u64, u64),
    work_id: (u64, u64),
    /// The upper root's mode (permission bits), owner and group when the view was mounted.
    root: (u32, u32, u32),
    /// Where the view is mounted (the workspace's path).
    target: PathBuf,
}

/// The view, handed to a run: its directories now carry the run's names.
pub(super) struct Handed {
    /// The share lock on the view's work directory (now the run's `work`).
    pub lock: OwnedFd,
}

/// Why a premount was not handed to a request.
pub(super) enum NotHanded {
    /// It does not fit the request; nothing was renamed. It may be set aside.
    Unfit(Box<Premount>),
    /// An exchange failed half-way and could not be undone: the request's names no longer
    /// lead where the client opened them. The view must go at once (`release`), before the
    /// request is refused: the client then builds its own view on those directories.
    Broken(Box<Premount>, StepError),
}

/// Where the premount of the server on `socket` lives, relative to the state directory
/// `state`; None if the socket is not in it.
pub(super) fn location(socket: &Path, state: &Path) -> Option<PathBuf> {
    let rel = socket.strip_prefix(state).ok()?;
    let mut name = rel.file_name()?.to_os_string();
    name.push(".next");
    Some(rel.with_file_name(name))
}

/// Mount the next run's view for the server whose plan is `plan` on `SOCKET.next` (`rel`,
/// beneath the server's clone `state` of the state directory at `state_path`), over
/// `workspace` (the server's clone of it).
pub(super) fn mount<K: Kernel>(
    k: &mut K,
    plan: &WarmPlan,
    state: &OwnedFd,
    state_path: &Path,
    rel: &Path,
    workspace: &OwnedFd,
) -> Result<Premount, StepError> {
    let dir = open_or_make(state, rel, 0o700).map_err(at_path("open", rel))?;
    let upper = open_or_make(&dir, Path::new(UPPER), 0o755).map_err(at_path("open", &rel.join(UPPER)))?;
    let work = open_or_make(&dir, Path::new(WORK), 0o700).map_err(at_path("open", &rel.join(WORK)))?;
    // A view still lives on these directories (a premount set aside, kept until the server is
    // idle): another overlay on them would share its upper and work.
    if rustix::fs::flock(&work, FlockOperation::NonBlockingLockExclusive) == Err(rustix::io::Errno::WOULDBLOCK) {
        return Err(StepError::at_path("find unused", rel, rustix::io::Errno::BUSY));
    }
    if !clean(&upper, &work) {
        return Err(StepError::at_path("find clean", rel, rustix::io::Errno::NOTEMPTY));
    }
    rustix::fs::flock(&work, FlockOperation::LockShared).map_err(at("lock the premount's work"))?;
    mirror_root(&upper, workspace)?;
    // The run's own overlay, the operation the server's plan holds, on these directories.
    let (upper_path, work_path) = (state_path.join(rel).join(UPPER), state_path.join(rel).join(WORK));
    let Some(MountOp::Overlay { target, lowers, .. }) =
        plan.per_run.iter().find(|op| matches!(op, MountOp::Overlay { .. }))
    else {
        return Err(StepError::new("premount: no overlay in the plan", rustix::io::Errno::INVAL));
    };
    let op = MountOp::Overlay {
        target: target.clone(),
        lowers: lowers.clone(),
        upper: upper_path.clone(),
        work: work_path.clone(),
    };
    let mut pins = Pins::default();
    let dup = |fd: &OwnedFd| rustix::io::fcntl_dupfd_cloexec(fd, 3).map_err(at("dup"));
    // The server's plan has no layers of a transaction: its one lower is the workspace.
    for lower in lowers {
        pins.insert(lower.clone(), dup(workspace)?);
    }
    pins.insert(upper_path, dup(&upper)?);
    pins.insert(work_path, dup(&work)?);
    k.mount(&op, &pins)?;
    let (u, w) = (rustix::fs::fstat(&upper).map_err(at("stat"))?, rustix::fs::fstat(&work).map_err(at("stat"))?);
    Ok(Premount {
        dir,
        upper,
        work,
        upper_id: (u.st_dev, u.st_ino),
        work_id: (w.st_dev, w.st_ino),
        root: (u.st_mode & 0o7777, u.st_uid, u.st_gid),
        target: target.clone(),
    })
}

impl Premount {
    /// Hand the view to a run of `spec`, whose upper and work the client opened as `upper` and
    /// `work` (checked to be the directories `spec` names): exchange the directories, so that
    /// the run's names lead to the view's. `state` is the server's clone of the state directory
    /// at `state_path`.
    pub(super) fn hand_over(
        self,
        spec: &SandboxSpec,
        state: &OwnedFd,
        state_path: &Path,
        upper: &OwnedFd,
        work: &OwnedFd,
    ) -> Result<Handed, NotHanded> {
        let theirs = match (rustix::fs::fstat(upper), rustix::fs::fstat(work)) {
            (Ok(u), Ok(_)) => u,
            _ => return Err(NotHanded::Unfit(Box::new(self))),
        };
        let names = (spec.upper.parent(), spec.upper.file_name(), spec.work.parent(), spec.work.file_name());
        let (Some(up_dir), Some(up_name), Some(work_dir), Some(work_name)) = names else {
            return Err(NotHanded::Unfit(Box::new(self)));
        };
        // A run whose root carries extended attributes (`begin` mirrors the workspace root's)
        // mounts its own upper: the premounted one has none.
        let fits = spec.layers.is_empty()
            && up_dir == work_dir
            && self.root == (theirs.st_mode & 0o7777, theirs.st_uid, theirs.st_gid)
            && only_uuid(upper);
        let tx = up_dir.strip_prefix(state_path).ok().and_then(|rel| open_beneath(state, rel).ok());
        let Some(tx) = tx.filter(|_| fits) else { return Err(NotHanded::Unfit(Box::new(self))) };
        // The times `begin` gave the run's upper root (the workspace root's), or the root would
        // look changed; set before the exchange, which keeps them.
        let times = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec { tv_sec: theirs.st_atime as _, tv_nsec: theirs.st_atime_nsec as _ },
            last_modification: rustix::fs::Timespec {
                tv_sec: theirs.st_mtime as _,
                tv_nsec: theirs.st_mtime_nsec as _,
            },
        };
        if rustix::fs::futimens(&self.upper, &times).is_err() {
            return Err(NotHanded::Unfit(Box::new(self)));
        }
        let exchange =
            |a: &std::ffi::OsStr, b: &str| rustix::fs::renameat_with(&tx, a, &self.dir, b, RenameFlags::EXCHANGE);
        if exchange(work_name, WORK).is_err() {
            return Err(NotHanded::Unfit(Box::new(self)));
        }
        if let Err(e) = exchange(up_name, UPPER) {
            if exchange(work_name, WORK).is_err() {
                return Err(NotHanded::Broken(
                    Box::new(self),
                    StepError::at_path("exchange with the premount", &spec.upper, e),
                ));
            }
            return Err(NotHanded::Unfit(Box::new(self)));
        }
        let id = |name| rustix::fs::statat(&tx, name, AtFlags::SYMLINK_NOFOLLOW).ok().map(|st| (st.st_dev, st.st_ino));
        if id(up_name) != Some(self.upper_id) || id(work_name) != Some(self.work_id) {
            let e = StepError::at_path("exchange with the premount", &spec.upper, rustix::io::Errno::STALE);
            return Err(NotHanded::Broken(Box::new(self), e));
        }
        Ok(Handed { lock: self.work })
    }

    /// Take the view out of the tree, keeping it alive through the returned reference (its
    /// last reference syncs the upper filesystem: let it go when idle), with the lock on its
    /// work directory. The fields of the pair drop in order: the view, then the lock.
    pub(super) fn set_aside<K: Kernel>(self, k: &mut K) -> Option<(OwnedFd, OwnedFd)> {
        let view =
            rustix::fs::open(&self.target, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok();
        let detached = k.mount(&MountOp::Detach { target: self.target.clone() }, &Pins::default());
        match (view, detached) {
            (Some(view), Ok(())) => Some((view, self.work)),
            // Not detached: nothing may run on it; without the reference it ends now.
            _ => {
                self.release(k);
                None
            }
        }
    }

    /// The view goes now (its last reference syncs the upper filesystem), then its lock.
    pub(super) fn release<K: Kernel>(self, k: &mut K) {
        let _ = k.mount(&MountOp::Detach { target: self.target.clone() }, &Pins::default());
        drop(self.work);
    }

    /// Release the view and remove its directories (the server is leaving: a server of another
    /// binary names its own), if they are empty.
    pub(super) fn remove<K: Kernel>(self, k: &mut K, state: &OwnedFd, rel: &Path) {
        let dir = rustix::io::fcntl_dupfd_cloexec(&self.dir, 3);
        self.release(k);
        if let Ok(dir) = dir {
            let rmdir = |d: &OwnedFd, name: &str| rustix::fs::unlinkat(d, name, AtFlags::REMOVEDIR);
            if let Ok(work) = rustix::fs::openat(&dir, WORK, dir_flags(), Mode::empty()) {
                let _ = rmdir(&work, WORK);
            }
            let _ = rmdir(&dir, WORK);
            let _ = rmdir(&dir, UPPER);
        }
        let _ = rustix::fs::unlinkat(state, rel, AtFlags::REMOVEDIR);
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// `rel` beneath `dir`, through no symlink and on no other filesystem, opened for reading.
fn open_beneath(dir: &OwnedFd, rel: &Path) -> Result<OwnedFd, rustix::io::Errno> {
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV;
    rustix::fs::openat2(dir, rel, dir_flags(), Mode::empty(), how)
}

/// [`open_beneath`], making the directory (`mode`) if it is not there.
fn open_or_make(dir: &OwnedFd, rel: &Path, mode: u32) -> Result<OwnedFd, rustix::io::Errno> {
    match open_beneath(dir, rel) {
        Err(rustix::io::Errno::NOENT) => {
            match rustix::fs::mkdirat(dir, rel, Mode::from_raw_mode(mode)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e),
            }
            open_beneath(dir, rel)
        }
        other => other,
    }
}

/// An upper with nothing in it and no overlay attribute but the instance's uuid (which says
/// nothing about the view), and a work directory that is empty or holds only overlayfs's own
/// empty `work`: a view mounted on them shows the workspace as it is.
fn clean(upper: &OwnedFd, work: &OwnedFd) -> bool {
    let names = super::gc::entries;
    let empty_upper = names(upper).is_some_and(|n| n.is_empty()) && only_uuid(upper);
    let clean_work = match names(work) {
        Some(n) if n.is_empty() => true,
        Some(n) if n == [WORK] => rustix::fs::openat(work, WORK, dir_flags(), Mode::empty())
            .ok()
            .is_some_and(|w| names(&w).is_some_and(|n| n.is_empty())),
        _ => false,
    };
    empty_upper && clean_work
}

/// Whether the directory's extended attributes are at most overlayfs's uuid of an instance.
/// `dir` may be an `O_PATH` handle (a client's), which cannot list them: it is opened anew.
fn only_uuid(dir: &OwnedFd) -> bool {
    let Ok(dir) = rustix::fs::openat(dir, ".", dir_flags(), Mode::empty()) else { return false };
    let mut buf = vec![0u8; 4096];
    let Ok(n) = rustix::fs::flistxattr(&dir, &mut buf) else { return false };
    buf[..n]
        .split(|b| *b == 0)
        .filter(|name| !name.is_empty())
        .all(|name| name == b"user.overlay.uuid" || name == b"trusted.overlay.uuid")
}

/// Give the upper root the workspace root's permission bits, owner and group: overlayfs shows
/// them as the merged root's, taken when it mounts.
fn mirror_root(upper: &OwnedFd, workspace: &OwnedFd) -> Result<(), StepError> {
    let ws = rustix::fs::fstat(workspace).map_err(at("stat the workspace"))?;
    let up = rustix::fs::fstat(upper).map_err(at("stat the premount's upper"))?;
    if up.st_mode & 0o7777 != ws.st_mode & 0o7777 {
        rustix::fs::fchmod(upper.as_fd(), Mode::from_raw_mode(ws.st_mode & 0o7777))
            .map_err(at("mirror the workspace root's mode"))?;
    }
    if (up.st_uid, up.st_gid) != (ws.st_uid, ws.st_gid) {
        // Only root may give it away; without root the group alone, if we are in it (as `begin`
        // does for the run's own root, txn's `session::mirror_root`). Where the two still
        // differ, the view is not handed over.
        let give = |uid: Option<u32>| {
            rustix::fs::fchown(upper, uid.map(rustix::fs::Uid::from_raw), Some(rustix::fs::Gid::from_raw(ws.st_gid)))
        };
        if give(Some(ws.st_uid)).is_err() && up.st_gid != ws.st_gid {
            let _ = give(None);
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::ffi::OsString;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;
    use crate::kernel::recorder::Recorder;
    use crate::spec::MountPlan;

    #[test]
    fn the_premount_lives_beside_the_socket() {
        let at = |s: &str| location(Path::new(s), Path::new("/s"));
        assert_eq!(at("/s/warm/0123.sock"), Some(PathBuf::from("warm/0123.sock.next")));
        assert_eq!(at("/s/warm/0123-2.sock"), Some(PathBuf::from("warm/0123-2.sock.next")));
        assert_eq!(at("/elsewhere/warm/0123.sock"), None);
    }

    /// A state directory with a run's directories (`tx/a`, as `begin` leaves them: the upper
    /// root mirrors the workspace root) and a workspace beside it.
    struct Dirs {
        root: PathBuf,
        state: PathBuf,
        ws: PathBuf,
    }

    impl Dirs {
        fn new(name: &str) -> Dirs {
            let root = std::env::temp_dir().join(format!("txbox-premount-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            let (state, ws) = (root.join("state"), root.join("ws"));
            for d in [state.join("warm"), state.join("tx/a/upper"), state.join("tx/a/work"), ws.clone()] {
                std::fs::create_dir_all(&d).unwrap();
            }
            std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o750)).unwrap();
            std::fs::set_permissions(state.join("tx/a/upper"), std::fs::Permissions::from_mode(0o750)).unwrap();
            Dirs { root, state, ws }
        }

        fn open(p: &Path) -> OwnedFd {
            rustix::fs::open(p, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap()
        }

        /// A run's spec (`layers`: a session step's, beneath it) and the client's fds.
        fn run(&self, layers: &[&str]) -> (SandboxSpec, OwnedFd, OwnedFd) {
            let (upper, work) = (self.state.join("tx/a/upper"), self.state.join("tx/a/work"));
            let mut spec = SandboxSpec::new(self.ws.clone(), upper.clone(), work.clone(), vec![OsString::from("true")]);
            spec.layers = layers.iter().map(|l| self.state.join(l)).collect();
            (spec, Self::open(&upper), Self::open(&work))
        }

        fn mount(&self, k: &mut Recorder) -> Result<Premount, StepError> {
            let base = SandboxSpec::new(self.ws.clone(), self.ws.clone(), self.ws.clone(), vec![OsString::from("-")]);
            let state = Self::open(&self.state);
            let plan = MountPlan::for_warm(&base);
            mount(k, &plan, &state, &self.state, Path::new("warm/k.sock.next"), &Self::open(&self.ws))
        }

        fn ino(&self, rel: &str) -> u64 {
            std::fs::metadata(self.state.join(rel)).unwrap().ino()
        }
    }

    impl Drop for Dirs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    /// The premount is the run's own overlay (the operation its plan holds), on the server's
    /// directories, whose root mirrors the workspace root's; handed over, the run's names lead
    /// to those directories, and the run's own wait for the next premount.
    #[test]
    fn the_premount_is_the_runs_own_overlay_and_handing_it_over_exchanges_the_directories() {
        let d = Dirs::new("hand");
        let mut k = Recorder::default();
        let p = d.mount(&mut k).unwrap();
        let next = d.state.join("warm/k.sock.next");
        let mut ours = d.run(&[]).0;
        ours.upper = next.join(UPPER);
        ours.work = next.join(WORK);
        // The very operation a run on these directories would mount itself.
        let run_overlay =
            MountPlan::for_warm(&ours).per_run.into_iter().find(|op| matches!(op, MountOp::Overlay { .. }));
        assert_eq!(k.ops, [format!("mount {:?}", run_overlay.unwrap())]);
        assert_eq!(std::fs::metadata(next.join(UPPER)).unwrap().mode() & 0o7777, 0o750, "the root is mirrored");

        let (pre_upper, pre_work) = (d.ino("warm/k.sock.next/upper"), d.ino("warm/k.sock.next/work"));
        let (run_upper, run_work) = (d.ino("tx/a/upper"), d.ino("tx/a/work"));
        // `begin` gave the run's upper root the workspace root's times: an old one here.
        let old = rustix::fs::Timespec { tv_sec: 1_000_000_000, tv_nsec: 7 };
        let times = rustix::fs::Timestamps { last_access: old, last_modification: old };
        rustix::fs::utimensat(rustix::fs::CWD, d.state.join("tx/a/upper"), &times, AtFlags::empty()).unwrap();
        let (spec, upper, work) = d.run(&[]);
        let state = Dirs::open(&d.state);
        let handed = p.hand_over(&spec, &state, &d.state, &upper, &work);
        assert!(handed.is_ok());
        assert_eq!((d.ino("tx/a/upper"), d.ino("tx/a/work")), (pre_upper, pre_work));
        assert_eq!((d.ino("warm/k.sock.next/upper"), d.ino("warm/k.sock.next/work")), (run_upper, run_work));
        let md = std::fs::metadata(d.state.join("tx/a/upper")).unwrap();
        assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 7), "the run's times");
        // The view's work directory stays share-locked, now under the run's name.
        let probe = std::fs::File::open(d.state.join("tx/a/work")).unwrap();
        assert_eq!(
            rustix::fs::flock(&probe, FlockOperation::NonBlockingLockExclusive),
            Err(rustix::io::Errno::WOULDBLOCK)
        );
        drop(handed);
        // The run's own directories serve the next premount.
        assert!(d.mount(&mut Recorder::default()).is_ok());
    }

    /// A session's first step is a view of one upper over the workspace, as a run's: it is
    /// handed the premount (its view goes at once after the step; the next step waits for the
    /// lock on its work directory, which the handed lock is).
    #[test]
    fn a_sessions_first_step_is_handed_the_premount() {
        let d = Dirs::new("step");
        let step = d.state.join("tx/a/steps/1");
        std::fs::create_dir_all(step.join(UPPER)).unwrap();
        std::fs::create_dir_all(step.join(WORK)).unwrap();
        std::fs::set_permissions(step.join(UPPER), std::fs::Permissions::from_mode(0o750)).unwrap();
        let mut spec = d.run(&[]).0;
        (spec.upper, spec.work) = (step.join(UPPER), step.join(WORK));
        let p = d.mount(&mut Recorder::default()).unwrap();
        let pre_upper = d.ino("warm/k.sock.next/upper");
        let (upper, work) = (Dirs::open(&spec.upper), Dirs::open(&spec.work));
        let handed = p.hand_over(&spec, &Dirs::open(&d.state), &d.state, &upper, &work);
        assert!(handed.is_ok());
        assert_eq!(d.ino("tx/a/steps/1/upper"), pre_upper);
    }

    /// A session's step (layers beneath its upper) or a run whose upper root differs from the
    /// premount's (mode, extended attributes) gets a view of its own: nothing is renamed.
    #[test]
    fn a_request_the_premount_does_not_fit_keeps_its_own_directories() {
        let d = Dirs::new("unfit");
        let state = Dirs::open(&d.state);
        let (run_upper, run_work) = (d.ino("tx/a/upper"), d.ino("tx/a/work"));
        std::fs::create_dir_all(d.state.join("tx/a/steps/1/upper")).unwrap();
        let (spec, upper, work) = d.run(&["tx/a/steps/1/upper"]);
        let p = d.mount(&mut Recorder::default()).unwrap();
        assert!(matches!(p.hand_over(&spec, &state, &d.state, &upper, &work), Err(NotHanded::Unfit(_))));
        assert_eq!((d.ino("tx/a/upper"), d.ino("tx/a/work")), (run_upper, run_work));

        std::fs::set_permissions(d.state.join("tx/a/upper"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let (spec, upper, work) = d.run(&[]);
        let p = d.mount(&mut Recorder::default()).unwrap();
        assert!(matches!(p.hand_over(&spec, &state, &d.state, &upper, &work), Err(NotHanded::Unfit(_))));
        assert_eq!((d.ino("tx/a/upper"), d.ino("tx/a/work")), (run_upper, run_work));

        // An upper root that mirrors the workspace root's extended attributes: the premount's
        // has none, and the view would show the root without them.
        std::fs::set_permissions(d.state.join("tx/a/upper"), std::fs::Permissions::from_mode(0o750)).unwrap();
        let flags = rustix::fs::XattrFlags::empty();
        rustix::fs::setxattr(d.state.join("tx/a/upper").as_path(), "user.project", b"kept", flags).unwrap();
        let (spec, upper, work) = d.run(&[]);
        let p = d.mount(&mut Recorder::default()).unwrap();
        assert!(matches!(p.hand_over(&spec, &state, &d.state, &upper, &work), Err(NotHanded::Unfit(_))));
        assert_eq!((d.ino("tx/a/upper"), d.ino("tx/a/work")), (run_upper, run_work));
    }

    /// A premount set aside lives on until the server is idle, its work directory locked: no
    /// other view may be laid on its directories (two overlays would share upper and work).
    #[test]
    fn no_view_is_premounted_on_directories_a_view_still_lives_on() {
        let d = Dirs::new("busy");
        let set_aside = d.mount(&mut Recorder::default()).unwrap();
        let mut k = Recorder::default();
        let e = d.mount(&mut k).err().map(|e| e.errno);
        assert_eq!(e, Some(rustix::io::Errno::BUSY));
        assert!(k.ops.is_empty(), "{:?}", k.ops);
        drop(set_aside);
        assert!(d.mount(&mut Recorder::default()).is_ok());
    }

    /// Nothing is mounted on directories that are not clean: a file in the upper would show in
    /// the run's view and be committed with it; an overlay attribute on its root would change
    /// what the view shows of the workspace.
    #[test]
    fn no_view_is_premounted_on_directories_that_are_not_clean() {
        let d = Dirs::new("clean");
        let next = d.state.join("warm/k.sock.next");
        type Spoil = (&'static str, fn(&Path));
        let spoil: [Spoil; 4] = [
            ("a file in the upper", |n| std::fs::write(n.join("upper/planted"), "x").unwrap()),
            ("a file in work", |n| std::fs::write(n.join("work/left"), "x").unwrap()),
            ("a file in work/work", |n| {
                std::fs::create_dir_all(n.join("work/work")).unwrap();
                std::fs::write(n.join("work/work/#1"), "x").unwrap();
            }),
            ("an attribute on the upper root", |n| {
                let upper = std::ffi::CString::new(n.join("upper").into_os_string().into_encoded_bytes()).unwrap();
                // SAFETY: NUL-terminated strings and a one-byte value that outlive the call.
                let r = unsafe {
                    libc::setxattr(upper.as_ptr(), c"user.overlay.opaque".as_ptr(), c"y".as_ptr().cast(), 1, 0)
                };
                assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
            }),
        ];
        for (what, spoil) in spoil {
            let _ = std::fs::remove_dir_all(&next);
            std::fs::create_dir_all(next.join(UPPER)).unwrap();
            std::fs::create_dir_all(next.join(WORK)).unwrap();
            spoil(&next);
            let mut k = Recorder::default();
            let e = d.mount(&mut k).err().map(|e| e.errno);
            assert_eq!(e, Some(rustix::io::Errno::NOTEMPTY), "{what}");
            assert!(k.ops.is_empty(), "{what}: {:?}", k.ops);
        }
        // Overlayfs's own empty work directory is clean.
        let _ = std::fs::remove_dir_all(&next);
        std::fs::create_dir_all(next.join("work/work")).unwrap();
        std::fs::create_dir_all(next.join(UPPER)).unwrap();
        assert!(d.mount(&mut Recorder::default()).is_ok());
    }
}
