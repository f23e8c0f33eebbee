//! Package caches (#15): persistent caches owned by txbox for pip, npm, cargo (registry and
//! git) and go (modules and build cache), mounted writable at each tool's default location in
//! the sandbox, so `pip install`, `npm install`, `cargo build` with dependencies and `go build`
//! work and stay warm from one transaction to the next. Not part of transactions: what a
//! command puts there stays even when it is rolled back (docs/DEVIATIONS.md).
//!
//! Never the host's own caches: the command sees txbox's directory over the tool's default
//! location, so nothing it writes there reaches what host builds use. Where each cache lives
//! (`BASE/caches/<workspace id>/<cache>`) is decided by [`plan`], a pure function of the tool
//! list, the caller's environment (the tools' own variables and `HOME`), the state base and
//! the workspace; [`gc`] bounds their size.
//!
//! A cache must work for a user with no history: a tool that never ran on the host has no
//! directory there, and inside the sandbox its parent is read-only, so `npm install` would fail
//! on `~/.npm` and `cargo build` on `~/.cargo/registry`. So [`prepare`] makes a missing
//! location on the host, as the tool's own first run would: an empty directory per missing
//! name, mode 0700, the caller's, nothing in it (the command's writes go to txbox's directory
//! mounted over it). Only where that is what the caller's own tool could do and nobody else
//! can interfere ([`decide`]): beneath a directory the caller owns and no one else may write,
//! not directly in `/`, for a caller with a real home (`HOME` set, absolute, not `/`), never in
//! the workspace, txbox's state or a hidden path ([`clashes`]); walking with directory handles
//! that follow no symlink (`make`). Otherwise, or when anything fails, that tool gets no
//! cache (its location stays read-only) and the run goes on.
//!
//! A location reached through a symlink (`~/.cache` → `/data/cache`) is mounted over at its
//! real path, where the tool lands following the same link inside the sandbox; the checks
//! apply to the real path (a link into the workspace gets no cache).
//!
//! Shared between workspaces only where the tool verifies content on use against something
//! the command cannot write. None of these does, so every cache is per workspace (one
//! repository's command cannot poison another's builds):
//! - cargo: `.crate` files are checked against the index's checksum when downloaded, but the
//!   index is in the same writable cache, and the extracted sources (`registry/src`) and git
//!   checkouts are used as they are (a `.cargo-ok` marker, no checksum);
//! - go: downloads are checked against `go.sum`/the checksum database, but the extracted module
//!   tree is used without a check (only `go mod verify` looks), and the build cache is trusted
//!   by its key alone;
//! - pip: its HTTP and wheel cache is not checked against any lock (unless the command asks
//!   for `--require-hashes`);
//! - npm: `_cacache` checks content against its hash on read, but the index that maps a
//!   request to a hash is writable, and without a lockfile's `integrity` nothing else checks.

use std::path::{Path, PathBuf};

/// A cache txbox provides: one directory mounted at one tool's default location.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cache {
    Pip,
    Npm,
    CargoRegistry,
    CargoGit,
    GoModules,
    GoBuild,
}

impl Cache {
    pub const ALL: [Cache; 6] =
        [Cache::Pip, Cache::Npm, Cache::CargoRegistry, Cache::CargoGit, Cache::GoModules, Cache::GoBuild];

    /// The directory name under a workspace's cache directory.
    pub fn name(self) -> &'static str {
        match self {
            Cache::Pip => "pip",
            Cache::Npm => "npm",
            Cache::CargoRegistry => "cargo-registry",
            Cache::CargoGit => "cargo-git",
            Cache::GoModules => "go-mod",
            Cache::GoBuild => "go-build",
        }
    }

    /// Where the tool looks by default, from its own variables in the command's environment
    /// (`var`), else its documented default under `HOME`. None without a usable answer.
    pub fn location(self, var: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
        let abs = |v: Option<String>| v.filter(|s| !s.is_empty()).map(PathBuf::from).filter(|p| p.is_absolute());
        let home = || abs(var("HOME"));
        let xdg_cache = || abs(var("XDG_CACHE_HOME")).or_else(|| home().map(|h| h.join(".cache")));
        let cargo_home = || abs(var("CARGO_HOME")).or_else(|| home().map(|h| h.join(".cargo")));
        // GOPATH is a list; go uses the first entry.
        let gopath = || {
            abs(var("GOPATH").and_then(|g| g.split(':').next().map(str::to_string)))
                .or_else(|| home().map(|h| h.join("go")))
        };
        match self {
            Cache::Pip => abs(var("PIP_CACHE_DIR")).or_else(|| xdg_cache().map(|c| c.join("pip"))),
            Cache::Npm => abs(var("npm_config_cache"))
                .or_else(|| abs(var("NPM_CONFIG_CACHE")))
                .or_else(|| home().map(|h| h.join(".npm"))),
            Cache::CargoRegistry => cargo_home().map(|c| c.join("registry")),
            Cache::CargoGit => cargo_home().map(|c| c.join("git")),
            Cache::GoModules => abs(var("GOMODCACHE")).or_else(|| gopath().map(|g| g.join("pkg/mod"))),
            Cache::GoBuild => abs(var("GOCACHE")).or_else(|| xdg_cache().map(|c| c.join("go-build"))),
        }
    }
}

/// One cache of one run: txbox's directory, and where the command sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheMount {
    pub cache: Cache,
    /// Under `BASE/caches/<workspace id>/`: txbox's.
    pub source: PathBuf,
    /// The tool's default location, which the source covers inside the sandbox.
    pub target: PathBuf,
}

/// The directory of every cache under the state base.
pub fn caches_dir(base: &Path) -> PathBuf {
    base.join("caches")
}

/// A workspace's name among the caches: a hash of its path (16 hex digits, FNV-1a), never a
/// name a workspace could choose.
pub fn workspace_id(workspace: &Path) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::os::unix::ffi::OsStrExt::as_bytes(workspace.as_os_str()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The caches of a run in `workspace`: for each of `caches`, txbox's directory (per workspace)
/// and the tool's location from `var`. Left out: a tool without a location, a location that is
/// not a plain absolute path, one inside the workspace (its writes belong to the transaction)
/// or one that holds or is held by the state base (txbox's own), and a location a cache
/// earlier in the list covers already.
pub fn plan(caches: &[Cache], var: &dyn Fn(&str) -> Option<String>, base: &Path, workspace: &Path) -> Vec<CacheMount> {
    let dir = caches_dir(base).join(workspace_id(workspace));
    let mut out: Vec<CacheMount> = Vec::new();
    for &cache in caches {
        let Some(target) = cache.location(var) else { continue };
        let plain =
            target.components().all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
        let clash = target.starts_with(workspace)
            || workspace.starts_with(&target)
            || target.starts_with(base)
            || base.starts_with(&target)
            || out.iter().any(|m| target.starts_with(&m.target) || m.target.starts_with(&target));
        if !plain || clash || target == Path::new("/") {
            continue;
        }
        out.push(CacheMount { cache, source: dir.join(cache.name()), target });
    }
    out
}

/// The caches of the tools installed here: a tool counts when one of its programs is on
/// `path` (the command's `PATH`).
pub fn installed(path: &str) -> Vec<Cache> {
    // Each directory once: a PATH often names one twice (profiles that prepend it again).
    let mut dirs: Vec<&str> = Vec::new();
    for d in path.split(':').filter(|d| d.starts_with('/')) {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    let on_path = |names: &[&str]| dirs.iter().any(|d| names.iter().any(|n| Path::new(d).join(n).is_file()));
    let mut out = Vec::new();
    if on_path(&["pip", "pip3"]) {
        out.push(Cache::Pip);
    }
    if on_path(&["npm"]) {
        out.push(Cache::Npm);
    }
    if on_path(&["cargo"]) {
        out.extend([Cache::CargoRegistry, Cache::CargoGit]);
    }
    if on_path(&["go"]) {
        out.extend([Cache::GoModules, Cache::GoBuild]);
    }
    out
}

/// [`installed`] on this process's `PATH`, looked for once per process.
pub fn installed_here() -> &'static [Cache] {
    static TOOLS: std::sync::OnceLock<Vec<Cache>> = std::sync::OnceLock::new();
    TOOLS.get_or_init(|| installed(&std::env::var("PATH").unwrap_or_default()))
}

/// The caches' locations for a run in `workspace` with this process's environment, as the
/// policy sees them (writing there is writing to a cache, not to the host). The tools on
/// `PATH` are looked for once per process.
pub fn locations_here(workspace: &Path) -> Vec<PathBuf> {
    let tools = installed_here();
    let var = |k: &str| std::env::var(k).ok();
    tools
        .iter()
        .filter_map(|c| c.location(&var))
        .filter(|t| !t.starts_with(workspace) && !workspace.starts_with(t))
        .collect()
}

/// What the host holds at a cache's location, as [`look`] finds it: the facts [`decide`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The real path (symlinks resolved) of the deepest part of the location that exists.
    pub real: PathBuf,
    /// Who owns it and its mode, when it is a directory (`None`: something else).
    pub dir: Option<Owner>,
    /// The names beneath `real` that do not exist yet, outermost first; empty when the whole
    /// location exists.
    pub missing: Vec<std::ffi::OsString>,
}

/// A directory's owner and permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub mode: u32,
}

/// What to do for one cache's location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The location is a directory: mount over its real path.
    Mount { target: PathBuf },
    /// Make `names` one below the other beneath the directory `at` (mode 0700, the caller's),
    /// then mount over the last (`target`).
    Make { at: PathBuf, names: Vec<std::ffi::OsString>, target: PathBuf },
}

impl Step {
    /// Where the cache is mounted.
    pub fn target(&self) -> &Path {
        match self {
            Step::Mount { target } | Step::Make { target, .. } => target,
        }
    }
}

/// Why a location gets no cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The location (or the deepest part of it that exists) is not a directory.
    NotADirectory,
    /// Something would have to be made, and the caller has no usable home (`HOME` unset,
    /// relative, not plain, or `/`): a service account, not a user whose tools would make it.
    NoHome,
    /// Something would have to be made directly in `/`.
    AtRoot,
    /// Something would have to be made in a directory the caller does not own.
    NotTheCallers,
    /// Something would have to be made in a directory others may write (and so swap what is
    /// made for a link before it is mounted).
    WritableByOthers,
}

/// Whether `home` (the caller's `HOME`) is a home txbox may make a tool's directory beneath.
fn usable_home(home: Option<&Path>) -> bool {
    home.is_some_and(|h| {
        h.is_absolute()
            && h != Path::new("/")
            && h.components().all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)))
    })
}

/// What to do for a location, from what the host holds there (pure). An existing directory is
/// mounted over at its real path, wherever a symlink on the way led (the tool, following the
/// same link inside the sandbox, lands on the mount). A missing location is made as the tool's
/// own first run would make it, an empty directory per missing name, but only beneath a
/// directory the caller owns and no one else may write, never directly in `/`, and only for a
/// caller with a usable home (`home`: its `HOME`).
pub fn decide(found: &Found, home: Option<&Path>, euid: u32) -> Result<Step, Skip> {
    let dir = found.dir.ok_or(Skip::NotADirectory)?;
    if found.missing.is_empty() {
        return Ok(Step::Mount { target: found.real.clone() });
    }
    if !usable_home(home) {
        return Err(Skip::NoHome);
    }
    if found.real == Path::new("/") {
        return Err(Skip::AtRoot);
    }
    if dir.uid != euid {
        return Err(Skip::NotTheCallers);
    }
    if dir.mode & 0o022 != 0 {
        return Err(Skip::WritableByOthers);
    }
    let target = found.missing.iter().fold(found.real.clone(), |p, n| p.join(n));
    Ok(Step::Make { at: found.real.clone(), names: found.missing.clone(), target })
}

/// Whether a cache at `target` (a real path) would clash with the workspace, txbox's state
/// (`base`), a hidden path (mounting there would make it visible again: `secrets::hidden`
/// keeps every path above a writable one), or a cache already placed (`taken`).
pub fn clashes(target: &Path, workspace: &Path, base: &Path, hidden: &[PathBuf], taken: &[PathBuf]) -> bool {
    let nested = |a: &Path, b: &Path| beneath(a, b) || beneath(b, a);
    target == Path::new("/")
        || nested(target, workspace)
        || nested(target, base)
        || hidden.iter().any(|h| beneath(target, h))
        || taken.iter().any(|t| nested(target, t))
}

/// Whether `p` is `dir` or lies beneath it, by bytes: every path here is absolute and plain,
/// and a run compares each cache with every hidden path (a hundred).
fn beneath(p: &Path, dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (p, d) = (p.as_os_str().as_bytes(), dir.as_os_str().as_bytes());
    p.starts_with(d) && (p.len() == d.len() || p[d.len()] == b'/' || d.ends_with(b"/"))
}

/// Where the caches of one run may not go: the workspace, txbox's state base, the paths the
/// sandbox hides; and the caller's `HOME` (as the caller's environment has it).
#[derive(Debug, Clone, Copy)]
pub struct Bounds<'a> {
    pub workspace: &'a Path,
    pub base: &'a Path,
    pub hidden: &'a [PathBuf],
    pub home: Option<&'a Path>,
}

/// Make ready the caches of `mounts`: for each, look at its location on the host, [`decide`]
/// what to do, drop it when its real path [`clashes`], make the tool's missing directories
/// (`make`) and txbox's own (0700), and mark the cache used. Anything unexpected (a link
/// where a directory was made, another owner, a read-only or unreadable place) drops that
/// cache and nothing else: a run never fails for want of one. The kept mounts' targets are
/// real paths.
pub fn prepare(mounts: Vec<CacheMount>, bounds: &Bounds<'_>) -> Vec<CacheMount> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = rustix::process::geteuid().as_raw();
    let mut ready: Vec<CacheMount> = Vec::new();
    for m in mounts {
        let Some(found) = look(&m.target) else { continue };
        let Ok(step) = decide(&found, bounds.home, uid) else { continue };
        let taken: Vec<PathBuf> = ready.iter().map(|r| r.target.clone()).collect();
        if clashes(step.target(), bounds.workspace, bounds.base, bounds.hidden, &taken) {
            continue;
        }
        // txbox's own directory: made on first use; once it is there (the caller's directory,
        // not a link), what every later run pays is one `lstat`.
        let ours = |md: &std::fs::Metadata| md.is_dir() && md.uid() == uid;
        let md = match std::fs::symlink_metadata(&m.source) {
            Ok(md) if ours(&md) => md,
            _ => {
                let made = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&m.source).is_ok();
                match std::fs::symlink_metadata(&m.source) {
                    Ok(md) if made && ours(&md) => md,
                    _ => continue,
                }
            }
        };
        if let Step::Make { at, names, .. } = &step {
            if make(at, names, uid).is_err() {
                continue;
            }
        }
        if stale(md.modified().ok(), std::time::SystemTime::now()) {
            let _ = touch(&m.source);
        }
        ready.push(CacheMount { cache: m.cache, source: m.source, target: step.target().to_path_buf() });
    }
    ready
}

/// The facts about `location` on the host: the real path of the deepest part that exists, what
/// that is, and the names missing beneath it. None when the host cannot say (no permission to
/// look, a file where a directory would be).
fn look(location: &Path) -> Option<Found> {
    let mut missing = Vec::new();
    let mut at = location;
    loop {
        match std::fs::canonicalize(at) {
            Ok(real) => {
                let md = std::fs::metadata(&real).ok()?;
                let dir = md.is_dir().then(|| {
                    use std::os::unix::fs::MetadataExt;
                    Owner { uid: md.uid(), mode: md.mode() }
                });
                missing.reverse();
                return Some(Found { real, dir, missing });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                missing.push(at.file_name()?.to_os_string());
                at = at.parent()?;
            }
            Err(_) => return None,
        }
    }
}

/// Make `names` one below the other beneath `at` (mode 0700), walking with directory handles:
/// `at` is opened without following any symlink (it is a real path) and checked again (a
/// directory of `uid`'s that no one else may write), and each name is made with `mkdirat`,
/// opened with `O_NOFOLLOW` and checked to be `uid`'s directory, so a link or someone else's
/// directory put in its place stops the walk. A name that exists already (a concurrent run
/// made it) is used when it passes the same check.
fn make(at: &Path, names: &[std::ffi::OsString], uid: u32) -> rustix::io::Result<()> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::openat2(rustix::fs::CWD, at, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS)?;
    let st = rustix::fs::fstat(&dir)?;
    if st.st_uid != uid || st.st_mode & 0o022 != 0 {
        return Err(rustix::io::Errno::PERM);
    }
    for name in names {
        let made = match rustix::fs::mkdirat(&dir, name.as_os_str(), Mode::from_raw_mode(0o700)) {
            Ok(()) => true,
            Err(rustix::io::Errno::EXIST) => false,
            Err(e) => return Err(e),
        };
        let next = rustix::fs::openat(&dir, name.as_os_str(), flags, Mode::empty())?;
        let st = rustix::fs::fstat(&next)?;
        if st.st_uid != uid || !rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() {
            return Err(rustix::io::Errno::PERM);
        }
        if made {
            // Exactly 0700, whatever the umask.
            rustix::fs::fchmod(&next, Mode::from_raw_mode(0o700))?;
        }
        dir = next;
    }
    Ok(())
}

/// Mark a cache used now (its directory's mtime), for [`gc`]'s order.
/// How often a run marks a cache used: [`gc`] removes the least recently used first, and
/// caches used within the same minute are equally recent for that; a run of quick commands
/// does not write the cache's inode each time.
pub const TOUCH_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether a cache last marked at `marked` (its mtime; unknown: yes) is due to be marked again.
fn stale(marked: Option<std::time::SystemTime>, now: std::time::SystemTime) -> bool {
    marked.and_then(|t| now.duration_since(t).ok()).is_none_or(|age| age >= TOUCH_EVERY)
}

fn touch(dir: &Path) -> std::io::Result<()> {
    let now = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
        last_modification: rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_NOW },
    };
    rustix::fs::utimensat(rustix::fs::CWD, dir, &now, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).map_err(Into::into)
}

/// The default size budget of every cache together: 10 GiB.
pub const DEFAULT_BUDGET: u64 = 10 << 30;

/// What [`gc`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Bytes allocated by every cache before and after.
    pub before: u64,
    pub after: u64,
    /// Caches removed (`<workspace id>/<cache>`), least recently used first.
    pub removed: Vec<String>,
    /// What could not be measured or removed, and why.
    pub errors: Vec<String>,
}

/// Bring every cache under `base` within `budget` bytes: remove whole caches, least recently
/// used first (a run marks the caches it mounts), until the rest fit. A cache in use by a
/// running command loses its content under it; the tool downloads again.
pub fn gc(base: &Path, budget: u64) -> GcReport {
    let mut report = GcReport::default();
    let root = caches_dir(base);
    let mut all: Vec<(std::time::SystemTime, u64, PathBuf, String)> = Vec::new();
    let Ok(workspaces) = std::fs::read_dir(&root) else { return report };
    for ws in workspaces.flatten() {
        let Ok(caches) = std::fs::read_dir(ws.path()) else { continue };
        for c in caches.flatten() {
            let path = c.path();
            let Ok(md) = std::fs::symlink_metadata(&path) else { continue };
            if !md.is_dir() {
                continue;
            }
            let size = match allocated(&path) {
                Ok(s) => s,
                Err(e) => {
                    report.errors.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            let used = md.modified().unwrap_or(std::time::UNIX_EPOCH);
            let name = format!("{}/{}", ws.file_name().to_string_lossy(), c.file_name().to_string_lossy());
            all.push((used, size, path, name));
        }
    }
    report.before = all.iter().map(|c| c.1).sum();
    report.after = report.before;
    all.sort();
    for (_, size, path, name) in all {
        if report.after <= budget {
            break;
        }
        match remove_cache(&path) {
            Ok(()) => {
                report.after -= size;
                report.removed.push(name);
            }
            Err(e) => report.errors.push(format!("{}: {e}", path.display())),
        }
    }
    // A workspace left without caches: its directory goes too (fails, harmlessly, if not empty).
    for ws in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let _ = std::fs::remove_dir(ws.path());
    }
    report
}

/// Bytes a tree allocates (`st_blocks`), not following symlinks, each inode once.
fn allocated(root: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let md = e.metadata()?;
            if md.nlink() > 1 && !md.is_dir() && !seen.insert(md.ino()) {
                continue;
            }
            total = total.saturating_add(md.blocks().saturating_mul(512));
            if md.is_dir() {
                todo.push(e.path());
            }
        }
    }
    Ok(total)
}

/// Remove a cache directory: go makes its module tree read-only, so directories are made
/// writable first; symlinks are never followed.
fn remove_cache(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut todo = vec![path.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        for e in std::fs::read_dir(&dir)?.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
        }
    }
    std::fs::remove_dir_all(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn defaults_come_from_home() {
        let var = env(&[("HOME", "/home/a")]);
        let got: Vec<(Cache, PathBuf)> = Cache::ALL.iter().map(|c| (*c, c.location(&var).unwrap())).collect();
        let p = PathBuf::from;
        assert_eq!(
            got,
            [
                (Cache::Pip, p("/home/a/.cache/pip")),
                (Cache::Npm, p("/home/a/.npm")),
                (Cache::CargoRegistry, p("/home/a/.cargo/registry")),
                (Cache::CargoGit, p("/home/a/.cargo/git")),
                (Cache::GoModules, p("/home/a/go/pkg/mod")),
                (Cache::GoBuild, p("/home/a/.cache/go-build")),
            ]
        );
    }

    #[test]
    fn the_tools_own_variables_win() {
        let var = env(&[
            ("HOME", "/home/a"),
            ("XDG_CACHE_HOME", "/x"),
            ("PIP_CACHE_DIR", "/pc"),
            ("npm_config_cache", "/nc"),
            ("CARGO_HOME", "/ch"),
            ("GOPATH", "/g1:/g2"),
            ("GOCACHE", "/gc"),
        ]);
        assert_eq!(Cache::Pip.location(&var), Some(PathBuf::from("/pc")));
        assert_eq!(Cache::Npm.location(&var), Some(PathBuf::from("/nc")));
        assert_eq!(Cache::CargoRegistry.location(&var), Some(PathBuf::from("/ch/registry")));
        assert_eq!(Cache::GoModules.location(&var), Some(PathBuf::from("/g1/pkg/mod")));
        assert_eq!(Cache::GoBuild.location(&var), Some(PathBuf::from("/gc")));
        let var = env(&[("HOME", "/home/a"), ("XDG_CACHE_HOME", "/x"), ("GOMODCACHE", "/gm")]);
        assert_eq!(Cache::Pip.location(&var), Some(PathBuf::from("/x/pip")));
        assert_eq!(Cache::GoModules.location(&var), Some(PathBuf::from("/gm")));
        // Relative or empty values are not locations.
        let var = env(&[("PIP_CACHE_DIR", "rel"), ("CARGO_HOME", "")]);
        assert_eq!(Cache::Pip.location(&var), None);
        assert_eq!(Cache::CargoRegistry.location(&var), None);
    }

    #[test]
    fn plan_is_per_workspace_and_leaves_out_what_clashes() {
        let base = Path::new("/home/a/.local/state/txbox");
        let ws = Path::new("/home/a/proj");
        let var = env(&[("HOME", "/home/a")]);
        let m = plan(&Cache::ALL, &var, base, ws);
        assert_eq!(m.len(), 6);
        let id = workspace_id(ws);
        assert!(m.iter().all(|c| c.source == base.join("caches").join(&id).join(c.cache.name())));
        // Another workspace: other directories.
        let other = plan(&Cache::ALL, &var, base, Path::new("/home/a/other"));
        assert!(m.iter().zip(&other).all(|(a, b)| a.source != b.source && a.target == b.target));
        // A location inside the workspace, above it, in txbox's state, or `..`: left out.
        let var = env(&[
            ("HOME", "/home/a"),
            ("PIP_CACHE_DIR", "/home/a/proj/.pip"),
            ("npm_config_cache", "/home"),
            ("GOCACHE", "/home/a/.local/state/txbox/x"),
            ("CARGO_HOME", "/home/a/../../etc"),
        ]);
        let m = plan(&Cache::ALL, &var, base, ws);
        assert_eq!(m.iter().map(|c| c.cache).collect::<Vec<_>>(), [Cache::GoModules]);
        // Nested locations: the first wins.
        let var = env(&[("HOME", "/h"), ("GOMODCACHE", "/h/.cache/pip/x")]);
        let m = plan(&[Cache::Pip, Cache::GoModules], &var, base, ws);
        assert_eq!(m.iter().map(|c| c.cache).collect::<Vec<_>>(), [Cache::Pip]);
        assert!(plan(&[], &var, base, ws).is_empty());
    }

    fn os(names: &[&str]) -> Vec<std::ffi::OsString> {
        names.iter().map(std::ffi::OsString::from).collect()
    }

    fn found(real: &str, dir: Option<(u32, u32)>, missing: &[&str]) -> Found {
        Found {
            real: PathBuf::from(real),
            dir: dir.map(|(uid, mode)| Owner { uid, mode: 0o040_000 | mode }),
            missing: os(missing),
        }
    }

    #[test]
    fn an_existing_location_is_mounted_at_its_real_path_whoever_owns_it() {
        let home = Some(Path::new("/home/a"));
        // Reached through a link (`~/.cache` → `/data/cache`): the real path.
        let f = found("/data/cache/pip", Some((0, 0o777)), &[]);
        assert_eq!(decide(&f, home, 1000), Ok(Step::Mount { target: PathBuf::from("/data/cache/pip") }));
        // Nothing is made, so neither the home nor the owner matters.
        assert!(matches!(decide(&f, None, 1000), Ok(Step::Mount { .. })));
        // Not a directory: no cache.
        assert_eq!(decide(&found("/home/a/.npm", None, &[]), home, 1000), Err(Skip::NotADirectory));
    }

    #[test]
    fn a_missing_location_is_made_beneath_the_callers_own_directory() {
        let home = Some(Path::new("/home/a"));
        // The leaf (`~/.npm`).
        let f = found("/home/a", Some((1000, 0o755)), &[".npm"]);
        assert_eq!(
            decide(&f, home, 1000),
            Ok(Step::Make {
                at: PathBuf::from("/home/a"),
                names: os(&[".npm"]),
                target: PathBuf::from("/home/a/.npm")
            })
        );
        // A chain (`~/.cargo/registry` on a fresh machine), in order.
        let f = found("/home/a", Some((1000, 0o700)), &[".cargo", "registry"]);
        let step = decide(&f, home, 1000).unwrap();
        assert_eq!(step.target(), Path::new("/home/a/.cargo/registry"));
        assert!(matches!(&step, Step::Make { names, .. } if *names == os(&[".cargo", "registry"])));
        // Beneath a link's real path: made there.
        let f = found("/data/cache", Some((1000, 0o700)), &["pip"]);
        assert_eq!(decide(&f, home, 1000).unwrap().target(), Path::new("/data/cache/pip"));
        // Root makes beneath its own directories, outside its home too (`CARGO_HOME=/usr/local/cargo`).
        let f = found("/usr/local/cargo", Some((0, 0o755)), &["registry"]);
        assert_eq!(decide(&f, Some(Path::new("/root")), 0).unwrap().target(), Path::new("/usr/local/cargo/registry"));
    }

    #[test]
    fn nothing_is_made_where_the_caller_is_not_alone_or_has_no_home() {
        let home = Some(Path::new("/home/a"));
        let mine = Some((1000, 0o755));
        // Someone else's directory (root's, or the caller's home under `sudo` keeping `HOME`).
        assert_eq!(decide(&found("/home/a", Some((0, 0o755)), &[".npm"]), home, 1000), Err(Skip::NotTheCallers));
        assert_eq!(decide(&found("/home/a", Some((1000, 0o755)), &[".npm"]), home, 0), Err(Skip::NotTheCallers));
        // Writable by the group or by anyone (`/tmp`-like, sticky or not).
        for mode in [0o775, 0o757, 0o1777, 0o770] {
            let f = found("/home/a", Some((1000, mode)), &[".npm"]);
            assert_eq!(decide(&f, home, 1000), Err(Skip::WritableByOthers), "{mode:o}");
        }
        // Directly in `/`, even as root.
        assert_eq!(decide(&found("/", Some((0, 0o755)), &[".npm"]), Some(Path::new("/root")), 0), Err(Skip::AtRoot));
        // No usable home: unset, relative, `/`, not plain.
        for h in [None, Some(""), Some("home/a"), Some("/"), Some("/home/a/../b")] {
            let f = found("/home/a", mine, &[".npm"]);
            assert_eq!(decide(&f, h.map(Path::new), 1000), Err(Skip::NoHome), "{h:?}");
        }
        // Beneath something that is not a directory.
        assert_eq!(decide(&found("/home/a/.cache", None, &["pip"]), home, 1000), Err(Skip::NotADirectory));
    }

    #[test]
    fn real_paths_clash_with_the_workspace_the_state_hidden_paths_and_each_other() {
        let ws = Path::new("/home/a/proj");
        let base = Path::new("/home/a/.local/state/txbox");
        let hidden = [PathBuf::from("/home/a/.aws"), PathBuf::from("/run/user")];
        let taken = [PathBuf::from("/home/a/.npm")];
        let c = |t: &str| clashes(Path::new(t), ws, base, &hidden, &taken);
        assert!(!c("/home/a/.cache/pip") && !c("/data/cache/pip"));
        // A link into the workspace, above it, into txbox's state, above it.
        for t in ["/home/a/proj/.cache/pip", "/home/a", "/home/a/.local/state/txbox/caches", "/home/a/.local", "/"] {
            assert!(c(t), "{t}");
        }
        // In a hidden path (it would be visible again); a path above one is not hidden itself.
        assert!(c("/home/a/.aws") && c("/home/a/.aws/pip") && c("/run/user/1000/cache/pip"));
        assert!(!c("/run/pip") && !c("/home/a/.awsome/pip"));
        // Nested with a cache already placed, either way.
        assert!(c("/home/a/.npm/x") && c("/home/a/.npm"));
    }

    #[test]
    fn look_and_make_on_a_scratch_home() {
        let root = std::env::temp_dir().join(format!("txbox-caches-make-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let home = root.join("home");
        std::fs::create_dir_all(home.join("real")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        for d in [&home, &home.join("real")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::os::unix::fs::symlink(home.join("real"), home.join(".cache")).unwrap();
        let home = std::fs::canonicalize(&home).unwrap();
        let uid = rustix::process::geteuid().as_raw();
        // A chain, through a link: the real path, and what is missing beneath it.
        let f = look(&home.join(".cache/pip/http")).unwrap();
        assert_eq!((&f.real, &f.missing), (&home.join("real"), &os(&["pip", "http"])));
        let step = decide(&f, Some(&home), uid).unwrap();
        let Step::Make { at, names, target } = step else { panic!("{step:?}") };
        make(&at, &names, uid).unwrap();
        let md = std::fs::symlink_metadata(&target).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(md.is_dir() && md.mode() & 0o7777 == 0o700 && md.uid() == uid, "{md:?}");
        assert_eq!(look(&home.join(".cache/pip/http")).unwrap().missing, os(&[]));
        // Made again (a concurrent run): fine.
        make(&at, &names, uid).unwrap();
        // A link where a name is to be made: the walk stops, nothing is made through it.
        std::fs::create_dir(root.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), home.join(".npm")).unwrap();
        assert!(make(&home, &os(&[".npm", "x"]), uid).is_err());
        assert!(!root.join("elsewhere/x").exists());
        // `at` through a link is refused (only real paths are walked).
        assert!(make(&home.join(".cache"), &os(&["go-build"]), uid).is_err());
        // A directory others may write, rechecked on the handle.
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(make(&home, &os(&[".cargo"]), uid).is_err());
        assert!(!home.join(".cargo").exists());
        // A file where a directory would be: no facts, no cache.
        std::fs::write(home.join("real/file"), "").unwrap();
        assert_eq!(look(&home.join(".cache/file/x")), None);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn tools_are_found_on_path_each_directory_once() {
        let root = std::env::temp_dir().join(format!("txbox-caches-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::create_dir_all(root.join("other/npm")).unwrap();
        std::fs::write(root.join("bin/pip3"), "").unwrap();
        std::fs::write(root.join("bin/cargo"), "").unwrap();
        let bin = root.join("bin").to_string_lossy().into_owned();
        let other = root.join("other").to_string_lossy().into_owned();
        // Named twice, and a relative entry (never looked in): the same answer.
        let path = format!("{bin}:relative:{other}:{bin}");
        assert_eq!(installed(&path), [Cache::Pip, Cache::CargoRegistry, Cache::CargoGit]);
        assert!(installed(&format!("{other}:relative")).is_empty(), "a directory named npm is not the tool");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_cache_is_marked_used_at_most_once_a_minute() {
        let now = std::time::SystemTime::now();
        assert!(stale(None, now), "unknown: marked");
        assert!(!stale(Some(now), now));
        assert!(!stale(Some(now - TOUCH_EVERY / 2), now));
        assert!(stale(Some(now - TOUCH_EVERY), now));
        assert!(stale(Some(now + TOUCH_EVERY), now), "a time in the future is not trusted");
    }

    #[test]
    fn prepare_makes_txbox_s_directory_once_and_refuses_a_link_in_its_place() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("txbox-caches-prepare-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["home/.npm", "ws", "base", "elsewhere"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let root = std::fs::canonicalize(&root).unwrap();
        std::fs::set_permissions(root.join("home"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (home, ws, base) = (root.join("home"), root.join("ws"), root.join("base"));
        let bounds = Bounds { workspace: &ws, base: &base, hidden: &[], home: Some(&home) };
        let var = |k: &str| (k == "HOME").then(|| home.to_string_lossy().into_owned());
        let mounts = || plan(&[Cache::Npm], &var, &base, &ws);
        let source = mounts()[0].source.clone();
        // First use: made, 0700, and the location mounted at its real path.
        let ready = prepare(mounts(), &bounds);
        assert_eq!(ready.len(), 1, "{ready:?}");
        assert_eq!(ready[0].target, home.join(".npm"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::symlink_metadata(&source).unwrap().mode() & 0o7777, 0o700);
        // An old mark is renewed; a fresh one is left alone.
        let old = std::time::SystemTime::now() - 2 * TOUCH_EVERY;
        std::fs::File::open(&source).unwrap().set_modified(old).unwrap();
        assert_eq!(prepare(mounts(), &bounds).len(), 1);
        let marked = std::fs::symlink_metadata(&source).unwrap().modified().unwrap();
        assert!(marked > old + TOUCH_EVERY, "renewed: {marked:?}");
        assert_eq!(prepare(mounts(), &bounds).len(), 1);
        assert_eq!(std::fs::symlink_metadata(&source).unwrap().modified().unwrap(), marked, "fresh: left alone");
        // A link where txbox's directory was (planted between two runs): no cache, and
        // nothing made through it.
        std::fs::remove_dir(&source).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), &source).unwrap();
        assert!(prepare(mounts(), &bounds).is_empty());
        assert!(std::fs::read_dir(root.join("elsewhere")).unwrap().next().is_none());
        // A file in its place: no cache either.
        std::fs::remove_file(&source).unwrap();
        std::fs::write(&source, "").unwrap();
        assert!(prepare(mounts(), &bounds).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn gc_removes_least_recently_used_caches_until_within_budget() {
        let base = std::env::temp_dir().join(format!("txbox-caches-gc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dirs = ["aaaa/pip", "aaaa/npm", "bbbb/go-mod"];
        for (i, d) in dirs.iter().enumerate() {
            let p = caches_dir(&base).join(d);
            std::fs::create_dir_all(p.join("sub")).unwrap();
            std::fs::write(p.join("sub/blob"), vec![1u8; 64 * 1024]).unwrap();
            // Oldest first: aaaa/pip, then aaaa/npm, then bbbb/go-mod.
            let t = rustix::fs::Timespec { tv_sec: 1_000_000 + i as i64 * 1000, tv_nsec: 0 };
            let ts = rustix::fs::Timestamps { last_access: t, last_modification: t };
            rustix::fs::utimensat(rustix::fs::CWD, &p, &ts, rustix::fs::AtFlags::empty()).unwrap();
        }
        // Go's read-only module trees are removed too.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(caches_dir(&base).join("bbbb/go-mod/sub"), std::fs::Permissions::from_mode(0o555))
            .unwrap();
        let r = gc(&base, u64::MAX);
        assert!(r.removed.is_empty() && r.before > 3 * 64 * 1024 && r.after == r.before, "{r:?}");
        let one = r.before / 3;
        let r = gc(&base, one + one / 2);
        assert_eq!(r.removed, ["aaaa/pip", "aaaa/npm"], "{r:?}");
        assert!(r.after <= one + one / 2 && r.errors.is_empty(), "{r:?}");
        assert!(caches_dir(&base).join("bbbb/go-mod/sub/blob").exists());
        let r = gc(&base, 0);
        assert_eq!(r.removed, ["bbbb/go-mod"], "{r:?}");
        assert_eq!(r.after, 0);
        let _ = std::fs::remove_dir_all(&base);
        // No caches at all: nothing to do.
        assert_eq!(gc(&base, 0), GcReport::default());
    }
}
