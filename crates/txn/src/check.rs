//! What must hold before a commit passes its commit point, checked while nothing has changed
//! yet (#14.1): that every step is permitted, and that there is room to apply them all.
//!
//! After the commit point a step that fails cannot be taken back, only finished later by
//! recovery; so whatever can be known to fail is asked first. Permission: each rename needs a
//! writable parent, may not take an object out of a sticky directory that neither we nor the
//! object's owner own, nor move an immutable or append-only object, and a directory that moves
//! to another parent must itself be writable (its `..` is rewritten); a directory's attributes
//! are changed only where we may change them. Room: a few descriptors and the space the record
//! and the workspace's growing directories take.
//!
//! The kernel is asked (`faccessat2(AT_EACCESS)`, `statx`) rather than modes interpreted here,
//! so capabilities, ACLs, read-only mounts and immutable flags all count. What is checked here
//! can still change before it is used (another process, an administrator): then applying fails
//! after all, and recovery finishes the commit once the cause is gone.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rustix::fs::{Access, AtFlags, StatxAttributes, StatxFlags};

use crate::beneath::Beneath;
use crate::journal::JournalStep;
use crate::meta::{self, Kind};
use crate::plan::Step;

/// Why a step would be refused by the kernel: said before the commit point, nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied(pub String);

/// What this process may do beyond its own files: `CAP_CHOWN` (give files away) and
/// `CAP_FOWNER` (change attributes of files it does not own, ignore sticky directories).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Privileges {
    pub euid: u32,
    pub egid: u32,
    pub chown: bool,
    pub fowner: bool,
}

impl Privileges {
    /// Whether this process may act as the owner of an object owned by `uid` (change its mode,
    /// times and names): it is the owner, or has `CAP_FOWNER`.
    pub fn owns(&self, uid: u32) -> bool {
        uid == self.euid || self.fowner
    }

    /// This process's (read once: txbox never changes its credentials).
    pub fn current() -> Privileges {
        static P: OnceLock<Privileges> = OnceLock::new();
        *P.get_or_init(|| {
            use rustix::thread::CapabilitySet;
            let caps = rustix::thread::capabilities(None).map(|c| c.effective).unwrap_or(CapabilitySet::empty());
            Privileges {
                euid: rustix::process::geteuid().as_raw(),
                egid: rustix::process::getegid().as_raw(),
                chown: caps.contains(CapabilitySet::CHOWN),
                fowner: caps.contains(CapabilitySet::FOWNER),
            }
        })
    }
}

/// Owner and mode of a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attrs {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// The groups this process is in: its effective group and its supplementary groups (read once,
/// like [`Privileges::current`]).
pub fn member_groups() -> &'static [u32] {
    static G: OnceLock<Vec<u32>> = OnceLock::new();
    G.get_or_init(|| {
        let mut g: Vec<u32> = rustix::process::getgroups().unwrap_or_default().iter().map(|g| g.as_raw()).collect();
        g.push(rustix::process::getegid().as_raw());
        g
    })
}

/// Whether the upper root's owner and group `up` differ from the workspace root's `ws` by the
/// command's doing. Pure.
///
/// `begin` gives the upper root the workspace root's owner and group where it can
/// (`session::mirror_root`): both with `CAP_CHOWN`; without it, the group when this process is
/// a member of it (`member`), and the owner stays ours. What it could not give is not a
/// change: otherwise every run in a workspace whose root belongs to another user or group
/// commits the root's attributes. It would hold its own durable commit and an undo entry, even
/// for `true`, and `txbox undo` would undo that commit instead of the last real change.
pub fn root_owner_changed(up: (u32, u32), ws: (u32, u32), p: &Privileges, member: impl Fn(u32) -> bool) -> bool {
    if p.chown {
        return up != ws;
    }
    // Without CAP_CHOWN the upper root is ours from the start, and a command cannot give it away.
    let uid_changed = up.0 != ws.0 && up.0 != p.euid;
    // `begin` set the workspace's group if it could; otherwise the upper root kept ours.
    let gid_changed = if member(ws.1) { up.1 != ws.1 } else { up.1 != p.egid };
    uid_changed || gid_changed
}

/// What a `dirmeta` step changes on a workspace directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirMetaPlan {
    pub chown: Option<(u32, u32)>,
    pub chmod: Option<u32>,
    /// Set mode-independent attributes only an owner may set: times and extended attributes.
    pub times: bool,
    pub xattrs: bool,
}

/// Decide what giving a workspace directory (now `cur`) the attributes of its upper copy
/// (`want`) takes, or why it cannot be done. Pure; `xattrs_same` is asked only when it matters.
///
/// - Owner: changed only with `CAP_CHOWN`. Without it, an upper directory of our own where the
///   workspace's belongs to someone else is not the command's doing (an unprivileged command
///   cannot give a directory away, and the upper root of a workspace owned by another user is
///   ours because we could not chown it): the owner stays.
/// - Mode, times, extended attributes: only the owner (or `CAP_FOWNER`) may set them. For a
///   directory of someone else's (a shared, group-writable or sticky workspace root), the
///   times are left to the kernel (each rename into it moved its mtime), and a change of the
///   permission bits or of the extended attributes is refused: it cannot be made.
pub fn dir_meta_plan(
    cur: Attrs,
    want: Attrs,
    p: &Privileges,
    xattrs_same: impl FnOnce() -> io::Result<bool>,
) -> Result<DirMetaPlan, Denied> {
    let mut plan = DirMetaPlan::default();
    if (cur.uid, cur.gid) != (want.uid, want.gid) {
        if p.chown {
            plan.chown = Some((want.uid, want.gid));
        } else if (want.uid, want.gid) != (p.euid, p.egid) {
            return Err(Denied(format!(
                "its owner would become {}:{}, which takes a privileged user (CAP_CHOWN)",
                want.uid, want.gid
            )));
        }
    }
    let owner = p.owns(cur.uid);
    let want_mode = want.mode & meta::COMMIT_MODE_MASK;
    if owner {
        // Also strips setuid, setgid and sticky bits the directory had (docs/DESIGN.md §5.2).
        if cur.mode & 0o7777 != want_mode {
            plan.chmod = Some(want_mode);
        }
        plan.times = true;
        plan.xattrs = true;
        return Ok(plan);
    }
    if cur.mode & meta::COMMIT_MODE_MASK != want_mode {
        return Err(Denied(format!(
            "its mode would change from {:o} to {want_mode:o}, but it belongs to uid {}",
            cur.mode & meta::COMMIT_MODE_MASK,
            cur.uid
        )));
    }
    match xattrs_same() {
        Ok(true) => Ok(plan),
        Ok(false) => Err(Denied(format!("its extended attributes would change, but it belongs to uid {}", cur.uid))),
        Err(e) => Err(Denied(format!("its extended attributes cannot be read ({e})"))),
    }
}

/// Whether setting `want` (and removing the allowlisted attributes not in it) would change nothing
/// on the directory `fd`: what `commit` does to a directory's extended attributes.
pub fn xattrs_already(fd: BorrowedFd<'_>, want: &[(OsString, Vec<u8>)]) -> io::Result<bool> {
    let have = fd_xattr_names(fd)?;
    for name in &have {
        if crate::meta::is_committed_name(name) && !want.iter().any(|(w, _)| w == name) {
            return Ok(false);
        }
    }
    for (name, value) in want {
        if !have.contains(name) {
            return Ok(false);
        }
        let mut buf = vec![0u8; value.len() + 1];
        match rustix::fs::fgetxattr(fd, name.as_os_str(), &mut buf) {
            Ok(n) if buf[..n] == value[..] => {}
            Ok(_) | Err(rustix::io::Errno::RANGE) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

fn fd_xattr_names(fd: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut buf = vec![0u8; 1024];
    loop {
        match rustix::fs::flistxattr(fd, &mut buf) {
            Ok(n) => {
                return Ok(buf[..n]
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| std::ffi::OsStr::from_bytes(s).to_os_string())
                    .collect())
            }
            Err(rustix::io::Errno::RANGE) => buf.resize(buf.len() * 4, 0),
            Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// What the rename checks need to know of a directory an object leaves or enters.
#[derive(Debug, Clone, Copy)]
struct DirInfo {
    uid: u32,
    sticky: bool,
    append_only: bool,
}

/// The object a rename moves.
struct Object {
    uid: u32,
    pinned: bool,
}

/// The permission checks of one commit; parents checked once each.
pub struct Permissions {
    privs: Privileges,
    ws_dirs: HashMap<PathBuf, DirInfo>,
    up_dirs: HashMap<PathBuf, DirInfo>,
}

impl Default for Permissions {
    fn default() -> Permissions {
        Permissions::new(Privileges::current())
    }
}

impl Permissions {
    pub fn new(privs: Privileges) -> Permissions {
        Permissions { privs, ws_dirs: HashMap::new(), up_dirs: HashMap::new() }
    }

    pub fn privileges(&self) -> &Privileges {
        &self.privs
    }

    /// Check that the renames of `js` will be permitted. `Ok(Err(denied))`: they would not be;
    /// `Err`: the check itself failed (an I/O error).
    pub fn check_rename(
        &mut self,
        ws: &mut Beneath,
        up: &mut Beneath,
        js: &JournalStep,
    ) -> io::Result<Result<(), Denied>> {
        let path = js.step.path();
        let name = path.file_name().unwrap_or_default();
        let parent = path.parent().unwrap_or(Path::new(""));
        let (leaves_ws, leaves_up, ws_dir_moves, up_dir_moves) = match &js.step {
            Step::Remove { kind, .. } => (true, false, *kind == Kind::Dir, false),
            Step::Create { kind, .. } => (false, true, false, *kind == Kind::Dir),
            Step::Replace { new, old, .. } => (true, true, *old == Kind::Dir, *new == Kind::Dir),
            Step::DirMeta { .. } => return Ok(Ok(())),
        };
        let privs = self.privs;
        let ws_info = match dir_info(&mut self.ws_dirs, ws, parent, "workspace directory")? {
            Ok(i) => i,
            Err(d) => return Ok(Err(d)),
        };
        if leaves_ws {
            let dir = ws.dir(parent)?;
            if let Err(d) = may_take_out(dir, name, &ws_info, &privs, ws_dir_moves, "the workspace's")? {
                return Ok(Err(d));
            }
        }
        if leaves_up {
            let up_info = match dir_info(&mut self.up_dirs, up, parent, "upper-layer directory")? {
                Ok(i) => i,
                Err(d) => return Ok(Err(d)),
            };
            let dir = up.dir(parent)?;
            if let Err(d) = may_take_out(dir, name, &up_info, &privs, up_dir_moves, "the new")? {
                return Ok(Err(d));
            }
        }
        Ok(Ok(()))
    }
}

/// The writability and kind of the directory `rel` beneath `b`, checked once.
fn dir_info(
    cache: &mut HashMap<PathBuf, DirInfo>,
    b: &mut Beneath,
    rel: &Path,
    what: &str,
) -> io::Result<Result<DirInfo, Denied>> {
    if let Some(i) = cache.get(rel) {
        return Ok(Ok(*i));
    }
    let dir = b.dir(rel)?;
    if let Err(e) = rustix::fs::accessat(dir, ".", Access::WRITE_OK | Access::EXEC_OK, AtFlags::EACCESS) {
        let shown = meta::display_rel(rel);
        return Ok(Err(Denied(format!(
            "the {what} `{}` cannot be written by this user ({})",
            if shown.is_empty() { ".".to_string() } else { shown },
            io::Error::from(e)
        ))));
    }
    let st = rustix::fs::statx(dir, "", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS)?;
    let info = DirInfo {
        uid: st.stx_uid,
        sticky: u32::from(st.stx_mode) & libc::S_ISVTX != 0,
        append_only: attr(&st, StatxAttributes::APPEND),
    };
    cache.insert(rel.to_path_buf(), info);
    Ok(Ok(info))
}

fn attr(st: &rustix::fs::Statx, a: StatxAttributes) -> bool {
    st.stx_attributes_mask.contains(a) && st.stx_attributes.contains(a)
}

fn object(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> io::Result<Object> {
    let st = rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BASIC_STATS)?;
    Ok(Object { uid: st.stx_uid, pinned: attr(&st, StatxAttributes::IMMUTABLE) || attr(&st, StatxAttributes::APPEND) })
}

/// Whether `name` may be renamed out of `dir` (the kernel's `may_delete`), and, for a directory
/// moving to another parent, whether it is writable itself.
fn may_take_out(
    dir: BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    info: &DirInfo,
    p: &Privileges,
    moving_dir: bool,
    whose: &str,
) -> io::Result<Result<(), Denied>> {
    // Rendered only for a refusal: every step of a commit comes through here.
    let shown = || String::from_utf8_lossy(name.as_bytes()).into_owned();
    if info.append_only {
        return Ok(Err(Denied(format!("{whose} `{}` is in an append-only directory", shown()))));
    }
    let obj = object(dir, name)?;
    if obj.pinned {
        return Ok(Err(Denied(format!("{whose} `{}` is immutable or append-only (chattr)", shown()))));
    }
    if info.sticky && !p.fowner && p.euid != info.uid && p.euid != obj.uid {
        return Ok(Err(Denied(format!(
            "{whose} `{}` belongs to uid {} in a sticky directory of uid {}: only they may move it",
            shown(),
            obj.uid,
            info.uid
        ))));
    }
    if moving_dir {
        if let Err(e) = rustix::fs::accessat(dir, name, Access::WRITE_OK, AtFlags::EACCESS | AtFlags::SYMLINK_NOFOLLOW)
        {
            return Ok(Err(Denied(format!(
                "{whose} directory `{}` cannot be moved: moving a directory rewrites its `..`, which \
                 needs write permission on it ({})",
                shown(),
                io::Error::from(e)
            ))));
        }
    }
    Ok(Ok(()))
}

/// Descriptors a commit needs after its commit point (the three trees' handles and their
/// caches, a directory being changed, the syncs): held before it, released to apply.
pub const FD_BUDGET: usize = 3 + 2 * crate::beneath::CACHED + 6;

/// Descriptors held until applying starts, so that applying does not run out of them.
pub struct FdReserve(#[allow(dead_code)] Vec<OwnedFd>);

/// Take [`FD_BUDGET`] descriptors (duplicates of `fd`), or say how many are missing.
pub fn reserve_fds(fd: BorrowedFd<'_>) -> Result<FdReserve, String> {
    let mut held = Vec::with_capacity(FD_BUDGET);
    for _ in 0..FD_BUDGET {
        match rustix::io::fcntl_dupfd_cloexec(fd.as_fd(), 0) {
            Ok(d) => held.push(d),
            Err(e) => {
                let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
                return Err(format!(
                    "too few file descriptors left to apply the commit ({}; it needs {FD_BUDGET} free, \
                     the limit is {}): raise `ulimit -n`",
                    io::Error::from(e),
                    limit.map_or("unlimited".to_string(), |l| l.to_string())
                ));
            }
        }
    }
    Ok(FdReserve(held))
}

/// Space a commit's record and the workspace's directories may take while it is applied: the
/// record, an entry (and in the worst case a new block) for every object moved into a
/// directory, and slack for the trash, the logs and the directories' index blocks.
pub fn space_needed(record_bytes: usize, steps: &[JournalStep]) -> u64 {
    let moved = steps.iter().filter(|s| matches!(s.step, Step::Remove { .. } | Step::Create { .. })).count() as u64;
    let names: u64 = steps.iter().map(|s| s.step.path().as_os_str().len() as u64).sum();
    record_bytes as u64 + moved * 16 + names + 64 * 1024
}

/// Bytes this user may still allocate on the filesystem of `fd`.
pub fn available(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let st = rustix::fs::fstatvfs(fd)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> Privileges {
        Privileges { euid: 1000, egid: 1000, chown: false, fowner: false }
    }

    fn root() -> Privileges {
        Privileges { euid: 0, egid: 0, chown: true, fowner: true }
    }

    fn a(uid: u32, gid: u32, mode: u32) -> Attrs {
        Attrs { uid, gid, mode }
    }

    #[test]
    fn a_root_owner_begin_could_not_mirror_is_not_a_change() {
        let member = |g: u32| g == 1000 || g == 50;
        let changed = |up, ws, p: &Privileges| root_owner_changed(up, ws, p, member);
        // Mirrored, or the same owner: nothing changed.
        assert!(!changed((1000, 1000), (1000, 1000), &user()));
        assert!(!changed((1000, 50), (1000, 50), &user()));
        // Another owner, or a group we are not in: begin could not give them; the upper root
        // kept ours.
        assert!(!changed((1000, 1000), (1000, 0), &user()));
        assert!(!changed((1000, 1000), (7, 7), &user()));
        // A group we are in was mirrored: the command moved it back to ours.
        assert!(changed((1000, 1000), (1000, 50), &user()));
        // The command gave the root another of our groups.
        assert!(changed((1000, 50), (1000, 0), &user()));
        assert!(changed((1000, 50), (1000, 1000), &user()));
        // An owner that is neither ours nor the workspace's.
        assert!(changed((9, 1000), (7, 1000), &user()));
        // With CAP_CHOWN begin mirrors both: any difference is the command's.
        assert!(changed((0, 0), (1000, 1000), &root()));
        assert!(changed((1000, 0), (1000, 1000), &root()));
        assert!(!changed((1000, 1000), (1000, 1000), &root()));
    }

    #[test]
    fn an_owner_sets_everything_a_privileged_user_chowns_too() {
        let plan = dir_meta_plan(a(1000, 1000, 0o755), a(1000, 1000, 0o700), &user(), || Ok(false));
        assert_eq!(plan, Ok(DirMetaPlan { chown: None, chmod: Some(0o700), times: true, xattrs: true }));
        let plan = dir_meta_plan(a(5, 5, 0o1777), a(7, 7, 0o1777), &root(), || Ok(false));
        assert_eq!(plan, Ok(DirMetaPlan { chown: Some((7, 7)), chmod: Some(0o777), times: true, xattrs: true }));
    }

    #[test]
    fn a_shared_workspace_root_keeps_its_owner_and_times() {
        // Root-owned, group-writable or sticky: our upper root is ours (we could not chown it).
        for mode in [0o775, 0o1777, 0o2775] {
            let plan = dir_meta_plan(a(0, 1000, mode), a(1000, 1000, mode), &user(), || Ok(true));
            assert_eq!(plan, Ok(DirMetaPlan::default()), "{mode:o}");
        }
    }

    #[test]
    fn what_cannot_be_done_is_refused_with_a_reason() {
        let p = user();
        assert!(dir_meta_plan(a(0, 0, 0o777), a(0, 0, 0o700), &p, || Ok(true)).is_err(), "chmod of root's");
        assert!(dir_meta_plan(a(0, 0, 0o777), a(0, 0, 0o777), &p, || Ok(false)).is_err(), "xattrs of root's");
        assert!(dir_meta_plan(a(1000, 1000, 0o777), a(4, 4, 0o777), &p, || Ok(true)).is_err(), "giving away");
        let why = dir_meta_plan(a(0, 0, 0o777), a(0, 0, 0o700), &p, || Ok(true)).err();
        assert!(why.is_some_and(|Denied(w)| w.contains("belongs to uid 0")));
    }

    #[test]
    fn space_grows_with_the_record_and_the_moves() {
        let js = |step| JournalStep { step, ino: 1, old_ino: 0 };
        let one = vec![js(Step::Create { path: "a".into(), kind: Kind::File })];
        let many: Vec<_> =
            (0..1000).map(|i| js(Step::Create { path: format!("f{i}").into(), kind: Kind::File })).collect();
        assert!(space_needed(100, &many) > space_needed(100, &one));
        assert!(space_needed(1 << 20, &one) > 1 << 20);
    }
}
