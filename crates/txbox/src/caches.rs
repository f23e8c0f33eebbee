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
    let on_path = |names: &[&str]| {
        path.split(':').filter(|d| d.starts_with('/')).any(|d| names.iter().any(|n| Path::new(d).join(n).is_file()))
    };
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

/// Make txbox's directories (0700) for `mounts` and keep those whose location is a real
/// directory at its own path on the host. Nothing is made at a tool's location: a missing one
/// gets no cache (txbox writes nothing into the host's home; the tool's first run on the host,
/// or a `mkdir`, makes it), and one reached through a symlink gets none either (the mount
/// would land where the link points).
pub fn prepare(mounts: Vec<CacheMount>) -> Vec<CacheMount> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = rustix::process::geteuid().as_raw();
    let real_dir = |p: &Path| {
        std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) && std::fs::canonicalize(p).is_ok_and(|c| c == p)
    };
    let mut ready = Vec::new();
    for m in mounts {
        if !real_dir(&m.target) {
            continue;
        }
        let made = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&m.source).is_ok();
        if made && std::fs::symlink_metadata(&m.source).is_ok_and(|md| md.is_dir() && md.uid() == uid) {
            let _ = touch(&m.source);
            ready.push(m);
        }
    }
    ready
}

/// Mark a cache used now (its directory's mtime), for [`gc`]'s order.
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
