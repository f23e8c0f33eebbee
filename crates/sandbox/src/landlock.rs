//! Landlock filesystem confinement for the command: read and execute anywhere, write only to the
//! workspace view and scratch.
//!
//! Why, on top of the read-only mounts: the mount plan is one layer; Landlock is enforced by the
//! kernel on the process itself and survives whatever the command does to its view of the
//! filesystem (it cannot be undone by mount tricks, and a restricted process cannot mount at
//! all). It works unprivileged and does not depend on the namespaces.
//!
//! Best effort by ABI: the ruleset asks for every filesystem right known to the `landlock` crate
//! ([`TARGET_ABI`]) and the crate drops what the running kernel does not know. [`apply`] reports
//! how much was enforced so txbox can tell the user; it never fails merely because the kernel is
//! old or lacks Landlock. The network is confined by the network namespace, and signals by the
//! pid namespace; two scopes (ABI 6) add to those: no abstract unix socket and no signal
//! outside the command's own domain (the host's abstract sockets when the network is shared;
//! the sandbox's init).
//!
//! Unix sockets by path (ABI 9, `ResolveUnix`): the right is handled and granted nowhere, so
//! the command reaches only sockets created in its own domain, never one of the host's (see
//! `crate::supervisor`, which stands in on older kernels).
//!
//! Owns the ruleset and its application to the calling thread; may not decide which paths are
//! writable (the spec does) nor when it is applied (`stage2::confine`).

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ::landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, RestrictionStatus, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetError, RulesetStatus, Scope, ABI,
};

/// The newest Landlock ABI this code asks for. With ABI 9 this includes `RESOLVE_UNIX`, which
/// keeps the command from connecting to host daemons' sockets (e.g. the Docker socket) outside
/// the writable paths. Raise it when the crate learns a new ABI and the new rights are reviewed.
pub const TARGET_ABI: ABI = ABI::V9;

/// Which paths the command may read and which it may write. Pure data; see [`LandlockPlan::new`]
/// for txbox's usual plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandlockPlan {
    /// Read, list and execute beneath these (usually just `/`).
    pub read_only: Vec<PathBuf>,
    /// Every right but reaching unix sockets by path beneath these: the workspace view,
    /// `/tmp`, `/dev`, configured extras.
    pub writable: Vec<PathBuf>,
}

impl LandlockPlan {
    /// The sandbox's plan: read-only `/`; writable workspace view, `/tmp` (a private tmpfs),
    /// `/dev` (the sandbox's own minimal `/dev`: `/dev/null`, ttys, `/dev/shm`) and `extra`.
    pub fn new(workspace: &Path, extra_writable: &[PathBuf]) -> Self {
        let mut writable = vec![workspace.to_path_buf(), PathBuf::from("/tmp"), PathBuf::from("/dev")];
        writable.extend(extra_writable.iter().cloned());
        LandlockPlan { read_only: vec![PathBuf::from("/")], writable }
    }

    /// The plan of `spec`'s command: its extra writable paths and its package caches' targets
    /// are written like the workspace.
    pub fn for_spec(spec: &crate::SandboxSpec) -> Self {
        let mut writable = spec.writable.clone();
        writable.extend(spec.caches.iter().map(|(_, t)| t.clone()));
        LandlockPlan::new(&spec.workspace, &writable)
    }

    /// Whether the ruleset can be made while `workspace`'s view is premounted and not yet
    /// handed over: no rule's path lies inside the view (opening one would look into it, and
    /// overlayfs keeps what a lookup found, before the run the view is for has its layers).
    pub fn ahead_of_view(&self, workspace: &Path) -> bool {
        self.read_only.iter().chain(&self.writable).all(|p| p == workspace || !p.starts_with(workspace))
    }
}

/// How much of the requested confinement the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// Every right of [`TARGET_ABI`] is enforced.
    FullyEnforced,
    /// Landlock is active but the kernel's ABI is older than [`TARGET_ABI`], so some rights
    /// (e.g. truncate, device ioctls, unix socket connects) are not enforced.
    PartiallyEnforced,
    /// No Landlock confinement (kernel without Landlock, or Landlock disabled at boot).
    NotEnforced,
}

impl Enforcement {
    /// Stable snake_case name for reports and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::FullyEnforced => "fully_enforced",
            Enforcement::PartiallyEnforced => "partially_enforced",
            Enforcement::NotEnforced => "not_enforced",
        }
    }
}

impl std::fmt::Display for Enforcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`apply`] reached, for txbox to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LandlockStatus {
    /// How much was enforced.
    pub enforcement: Enforcement,
    /// The Landlock ABI in effect (the lower of the kernel's and [`TARGET_ABI`]); 0 if none.
    pub abi: u32,
    /// Plan paths that did not exist and so got no rule (nothing is granted beneath them).
    pub skipped: Vec<PathBuf>,
}

/// A step of building or enforcing the ruleset failed.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock: declaring the handled access rights: {0}")]
    HandleAccess(RulesetError),
    #[error("landlock: creating the ruleset: {0}")]
    Create(RulesetError),
    #[error("landlock: opening {path} for a rule: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("landlock: adding the rule for {path}: {source}")]
    AddRule { path: PathBuf, source: RulesetError },
    #[error("landlock: restricting the process: {0}")]
    RestrictSelf(RulesetError),
}

/// Confines the calling thread (and everything it later forks or executes) to `plan`.
///
/// Called in the command's process after all mounts (rules bind to the mounts present when the
/// paths are opened) and before seccomp and `execve`. Also sets `PR_SET_NO_NEW_PRIVS`. Landlock
/// restricts only the calling thread, so the caller must be single-threaded (it is: a freshly
/// forked process). Paths that do not exist are skipped and listed in the status.
pub fn apply(plan: &LandlockPlan) -> Result<LandlockStatus, LandlockError> {
    let (ruleset, skipped) = rules(plan)?;
    let status = ruleset.restrict_self().map_err(LandlockError::RestrictSelf)?;
    Ok(LandlockStatus { enforcement: enforcement(&status), abi: effective_abi(&status), skipped })
}

/// The ruleset of `plan`, made ahead of the process it will confine: a warm server's init makes
/// it while it waits, and the command's process only enforces it ([`Prepared::enforce`]).
///
/// The rules hold the objects the paths named when this was called (Landlock binds a rule to
/// the mount and directory, not to the path): it is good only for a process that sees the very
/// same mounts at those paths.
pub fn prepare(plan: &LandlockPlan) -> Result<Prepared, LandlockError> {
    let (ruleset, _) = rules(plan)?;
    Ok(Prepared { fd: ruleset.into() })
}

/// A ruleset made by [`prepare`]. `None`: the kernel has no Landlock (best effort, as [`apply`]).
#[derive(Debug)]
pub struct Prepared {
    fd: Option<std::os::fd::OwnedFd>,
}

impl Prepared {
    /// Confine the calling thread with the ruleset; `PR_SET_NO_NEW_PRIVS` must be set already.
    /// One syscall, nothing allocated: for a process sharing its parent's memory (the warm
    /// server's `CLONE_VM` child).
    pub fn enforce(&self) -> Result<(), rustix::io::Errno> {
        use std::os::fd::AsRawFd;
        let Some(fd) = &self.fd else { return Ok(()) };
        // SAFETY: landlock_restrict_self(fd, 0) reads no memory; fd is the ruleset's, open.
        let rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) };
        if rc != 0 {
            return Err(rustix::io::Errno::from_raw_os_error(crate::stage2::errno()));
        }
        Ok(())
    }
}

/// The ruleset of `plan`, its rules added, and the plan's paths that did not exist.
fn rules(plan: &LandlockPlan) -> Result<(::landlock::RulesetCreated, Vec<PathBuf>), LandlockError> {
    let all = AccessFs::from_all(TARGET_ABI);
    let read = AccessFs::from_read(TARGET_ABI);
    // Granted nowhere: a socket is reachable by path only if created in this domain.
    let write = all & !AccessFs::ResolveUnix;

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(LandlockError::HandleAccess)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(LandlockError::HandleAccess)?
        .create()
        .map_err(LandlockError::Create)?;

    let mut skipped = Vec::new();
    for (paths, access) in [(&plan.read_only, read & !AccessFs::ResolveUnix), (&plan.writable, write)] {
        for path in paths {
            let fd = match open_path(path) {
                Ok(fd) => fd,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                    skipped.push(path.clone());
                    continue;
                }
                Err(source) => return Err(LandlockError::Open { path: path.clone(), source }),
            };
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|source| LandlockError::AddRule { path: path.clone(), source })?;
        }
    }
    Ok((ruleset, skipped))
}

/// An `O_PATH` descriptor: enough to name a hierarchy for Landlock, needs no read permission.
fn open_path(path: &Path) -> io::Result<std::fs::File> {
    OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_CLOEXEC).open(path)
}

fn enforcement(status: &RestrictionStatus) -> Enforcement {
    match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::FullyEnforced,
        RulesetStatus::PartiallyEnforced => Enforcement::PartiallyEnforced,
        RulesetStatus::NotEnforced => Enforcement::NotEnforced,
    }
}

/// The ABI number in effect. `ABI` is non-exhaustive and cannot be cast, but its `Display` is
/// the number (or "unsupported", which maps to 0).
fn effective_abi(status: &RestrictionStatus) -> u32 {
    match status.landlock {
        ::landlock::LandlockStatus::Available { effective_abi, .. } => effective_abi.to_string().parse().unwrap_or(0),
        ::landlock::LandlockStatus::NotEnabled | ::landlock::LandlockStatus::NotImplemented => 0,
    }
}

/// The kernel's Landlock ABI version, or 0 if Landlock is unavailable. For probes and reports
/// only; [`apply`] does not need it.
pub fn kernel_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI version (or -1);
    // it reads no memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(rc).unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const CHILD_ENV: &str = "TXBOX_LANDLOCK_TEST_DIR";
    const CHILD_OK: &str = "LANDLOCK-CHILD-OK";

    #[test]
    fn plan_new_is_readonly_root_plus_scratch() {
        let plan = LandlockPlan::new(Path::new("/w/ws"), &[PathBuf::from("/cache")]);
        assert_eq!(plan.read_only, vec![PathBuf::from("/")]);
        let w: Vec<&str> = plan.writable.iter().filter_map(|p| p.to_str()).collect();
        assert_eq!(w, ["/w/ws", "/tmp", "/dev", "/cache"]);
    }

    /// Runs [`child_writes_are_confined`] in a fresh process (this test binary again), because
    /// Landlock cannot be undone and the harness is multi-threaded.
    #[test]
    fn landlock_confines_writes() {
        let abi = kernel_abi();
        if abi == 0 {
            println!(
                "SKIP landlock_confines_writes: this kernel has no Landlock (not built in or not enabled at boot)"
            );
            return;
        }
        let base = std::env::temp_dir().join(format!(
            "txbox-landlock-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
        ));
        std::fs::create_dir_all(base.join("inside")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/existing"), b"readable").unwrap();

        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "landlock::tests::child_writes_are_confined"])
            .args(["--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &base)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The child wrote nothing outside; clean up before asserting.
        let left_outside = base.join("outside/new").exists();
        std::fs::remove_dir_all(&base).unwrap();
        assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
        assert!(stdout.contains(CHILD_OK), "child did not run:\n{stdout}\n{stderr}");
        assert!(!left_outside, "a write outside the writable dirs got through");
        let reached = stdout.split(CHILD_OK).nth(1).and_then(|s| s.lines().next()).unwrap_or("");
        println!("kernel Landlock ABI {abi}; child reached{reached}");
    }

    /// The child half of [`landlock_confines_writes`]; does nothing without its env var.
    #[test]
    #[ignore = "run by landlock_confines_writes in a child process"]
    fn child_writes_are_confined() {
        let Some(base) = std::env::var_os(CHILD_ENV).map(PathBuf::from) else {
            return;
        };
        let inside = base.join("inside");
        let outside = base.join("outside");
        let missing = base.join("does-not-exist");
        let plan =
            LandlockPlan { read_only: vec![PathBuf::from("/")], writable: vec![inside.clone(), missing.clone()] };
        let status = apply(&plan).unwrap();
        assert_ne!(status.enforcement, Enforcement::NotEnforced, "{status:?}");
        assert!(status.abi >= 1, "{status:?}");
        assert_eq!(status.skipped, vec![missing]);

        std::fs::write(inside.join("new"), b"ok").unwrap();
        std::fs::create_dir(inside.join("dir")).unwrap();
        std::fs::remove_file(inside.join("new")).unwrap();

        let err = std::fs::write(outside.join("new"), b"no").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
        let err = std::fs::create_dir(outside.join("dir")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
        let err = std::fs::remove_file(outside.join("existing")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
        assert_eq!(std::fs::read(outside.join("existing")).unwrap(), b"readable");

        println!("{CHILD_OK} enforcement={} abi={}", status.enforcement, status.abi);
    }
}
