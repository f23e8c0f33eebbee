//! Memory and pids limits through cgroups (DESIGN §3 `--memory`/`--pids`, §5 "Limits").
//!
//! - [`CgroupLayout`]: where this process's own cgroup lives for each controller, parsed from
//!   `/proc/self/cgroup` and `/proc/self/mountinfo` (pure text parsing plus, for cgroup v2, one
//!   read of `cgroup.controllers`; every path goes through a root prefix so tests use fake trees).
//!   txbox's cgroups are created as *children* of that cgroup, so limits nest under whatever
//!   already limits txbox.
//! - [`Cgroup`]: one transaction step's cgroup: a directory per controller a limit needs (one
//!   directory on cgroup v2), the limits written, processes added, limit hits read back, the
//!   whole tree killed, the directories removed (on [`Cgroup::remove`] or drop).
//! - [`probe`]: what this host supports, for `txbox doctor`, with a hint when something lacks.
//!
//! Cpu time is not limited here: `--cpu` is enforced with `RLIMIT_CPU` by the sandbox, so
//! [`Limits::cpu_seconds`] needs no controller (the layout still reports where `cpu` lives).
//!
//! Hosts: cgroup v1 hierarchies (`/sys/fs/cgroup/memory`, `/sys/fs/cgroup/pids`, ...), "hybrid"
//! (v1 controllers plus a cgroup2 mount, often with no controllers), and pure cgroup v2 (the
//! unified hierarchy, possibly delegated to the user, e.g. `systemd-run --user --scope -p
//! Delegate=yes`). On v2 the parent must enable the controllers in its `cgroup.subtree_control`,
//! which the kernel refuses (EBUSY) while the parent itself holds processes; when txbox is the
//! only process there, [`Cgroup::create`] moves txbox into a leaf child `txbox-supervisor` first
//! (what container runtimes do too).

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// Leaf cgroup (v2) txbox moves itself into when its own cgroup must enable controllers.
pub const SUPERVISOR_LEAF: &str = "txbox-supervisor";

/// How long [`Cgroup::kill_all`] keeps killing before it gives up.
const KILL_DEADLINE: Duration = Duration::from_secs(5);
/// How many times `rmdir` is retried on EBUSY, and the pause between tries.
const RMDIR_TRIES: u32 = 50;
const RMDIR_PAUSE: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A filesystem step failed: which step, on which path.
    #[error("cgroup: {step} {}: {source}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cgroup: invalid cgroup name {0:?}: it must be one non-empty path component")]
    InvalidName(String),
    #[error("cgroup: cannot parse {what}: {line:?}")]
    Parse { what: &'static str, line: String },
    /// A limit needs a controller this process has no cgroup for (or may not use).
    #[error("cgroup: the {controller} controller is not available: {hint}")]
    ControllerUnavailable { controller: &'static str, hint: String },
    #[error("cgroup: processes are still alive in {} after SIGKILL", path.display())]
    StillPopulated { path: PathBuf },
}

impl CgroupError {
    fn io(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
        let path = path.to_path_buf();
        move |source| CgroupError::Io { step, path, source }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// Which cgroup hierarchies this process sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// No cgroup filesystem at all.
    None,
    /// Only cgroup v1 hierarchies.
    V1,
    /// Only the cgroup v2 unified hierarchy.
    V2,
    /// cgroup v1 hierarchies and a cgroup2 mount side by side (systemd's "hybrid"); each
    /// controller lives in exactly one of them.
    Hybrid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    pub const ALL: [Controller; 3] = [Controller::Memory, Controller::Pids, Controller::Cpu];

    /// The kernel's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
        }
    }
}

/// Where this process's cgroup is for one controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerDir {
    pub version: CgroupVersion,
    /// e.g. `/sys/fs/cgroup/memory/process_api/xyz` (v1) or `/sys/fs/cgroup/user.slice/...` (v2).
    pub dir: PathBuf,
}

/// Where this process's own cgroups are: the parents of the cgroups txbox creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    pub mode: CgroupMode,
    pub memory: Option<ControllerDir>,
    pub pids: Option<ControllerDir>,
    pub cpu: Option<ControllerDir>,
    /// This process's cgroup in the cgroup2 hierarchy, when one is mounted (even with no
    /// controllers, as in hybrid mode).
    pub unified: Option<PathBuf>,
}

/// One mount of a cgroup filesystem, from mountinfo.
#[derive(Debug)]
struct CgroupMount {
    version: CgroupVersion,
    /// The part of the hierarchy mounted there (mountinfo field 4).
    root: String,
    mount_point: String,
    /// v1: the controllers bound to the hierarchy (from the super options).
    controllers: Vec<String>,
}

/// One line of /proc/self/cgroup.
#[derive(Debug)]
struct Membership<'a> {
    hierarchy_id: &'a str,
    controllers: Vec<&'a str>,
    path: &'a str,
}

impl CgroupLayout {
    /// The layout of the calling process on this host.
    pub fn detect() -> Result<CgroupLayout, CgroupError> {
        let cgroup = read_to_string("read", Path::new("/proc/self/cgroup"))?;
        let mountinfo = read_to_string("read", Path::new("/proc/self/mountinfo"))?;
        CgroupLayout::parse(&cgroup, &mountinfo, Path::new("/"))
    }

    /// Parse `/proc/self/cgroup` and `/proc/self/mountinfo` text. `root` prefixes every path
    /// (`/` on a real host, a temporary directory in tests). For cgroup v2 the controllers
    /// available to this process are read from `<its cgroup>/cgroup.controllers` under `root`.
    pub fn parse(proc_self_cgroup: &str, mountinfo: &str, root: &Path) -> Result<CgroupLayout, CgroupError> {
        let memberships = parse_proc_cgroup(proc_self_cgroup)?;
        let mounts = parse_mountinfo(mountinfo)?;

        let has_v1 = mounts.iter().any(|m| m.version == CgroupVersion::V1);
        let has_v2 = mounts.iter().any(|m| m.version == CgroupVersion::V2);
        let mode = match (has_v1, has_v2) {
            (false, false) => CgroupMode::None,
            (true, false) => CgroupMode::V1,
            (false, true) => CgroupMode::V2,
            (true, true) => CgroupMode::Hybrid,
        };

        // If an earlier `Cgroup::create` moved txbox into its supervisor leaf, txbox's cgroup is
        // still the leaf's parent: new cgroups go next to the leaf, not under it.
        let unified = memberships
            .iter()
            .find(|m| m.hierarchy_id == "0" && m.controllers.is_empty())
            .map(|m| {
                m.path
                    .strip_suffix(SUPERVISOR_LEAF)
                    .and_then(|p| p.strip_suffix('/'))
                    .map(|p| if p.is_empty() { "/" } else { p })
                    .unwrap_or(m.path)
            })
            .and_then(|path| locate(&mounts, CgroupVersion::V2, None, path, root));
        let v2_controllers: Vec<String> = match &unified {
            Some(dir) => fs::read_to_string(dir.join("cgroup.controllers"))
                .map(|s| s.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
            None => Vec::new(),
        };

        let find = |c: Controller| -> Option<ControllerDir> {
            let v1 = memberships
                .iter()
                .filter(|m| m.hierarchy_id != "0" && m.controllers.contains(&c.name()))
                .find_map(|m| locate(&mounts, CgroupVersion::V1, Some(c.name()), m.path, root));
            if let Some(dir) = v1 {
                return Some(ControllerDir { version: CgroupVersion::V1, dir });
            }
            match &unified {
                Some(dir) if v2_controllers.iter().any(|n| n == c.name()) => {
                    Some(ControllerDir { version: CgroupVersion::V2, dir: dir.clone() })
                }
                _ => None,
            }
        };
        Ok(CgroupLayout {
            mode,
            memory: find(Controller::Memory),
            pids: find(Controller::Pids),
            cpu: find(Controller::Cpu),
            unified,
        })
    }

    pub fn controller(&self, c: Controller) -> Option<&ControllerDir> {
        match c {
            Controller::Memory => self.memory.as_ref(),
            Controller::Pids => self.pids.as_ref(),
            Controller::Cpu => self.cpu.as_ref(),
        }
    }
}

fn parse_proc_cgroup(text: &str) -> Result<Vec<Membership<'_>>, CgroupError> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            return Err(CgroupError::Parse { what: "/proc/self/cgroup", line: line.to_owned() });
        };
        let controllers = ctrls.split(',').filter(|c| !c.is_empty()).collect();
        out.push(Membership { hierarchy_id: id, controllers, path });
    }
    Ok(out)
}

fn parse_mountinfo(text: &str) -> Result<Vec<CgroupMount>, CgroupError> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let bad = || CgroupError::Parse { what: "/proc/self/mountinfo", line: line.to_owned() };
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-").ok_or_else(bad)?;
        if sep < 6 || fields.len() < sep + 4 {
            return Err(bad());
        }
        let version = match fields[sep + 1] {
            "cgroup" => CgroupVersion::V1,
            "cgroup2" => CgroupVersion::V2,
            _ => continue,
        };
        let controllers = match version {
            CgroupVersion::V1 => fields[sep + 3]
                .split(',')
                .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains('='))
                .map(str::to_owned)
                .collect(),
            CgroupVersion::V2 => Vec::new(),
        };
        out.push(CgroupMount {
            version,
            root: unescape_mountinfo(fields[3]),
            mount_point: unescape_mountinfo(fields[4]),
            controllers,
        });
    }
    Ok(out)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of cgroup `path` through the mounts of that hierarchy (the last mount that
/// shows it wins, as a later mount shadows an earlier one).
fn locate(
    mounts: &[CgroupMount],
    version: CgroupVersion,
    controller: Option<&str>,
    path: &str,
    root: &Path,
) -> Option<PathBuf> {
    mounts
        .iter()
        .filter(|m| m.version == version)
        .filter(|m| controller.is_none_or(|c| m.controllers.iter().any(|mc| mc == c)))
        .filter_map(|m| {
            let rel = relative_to(path, &m.root)?;
            let mut dir = root.join(m.mount_point.trim_start_matches('/'));
            if !rel.is_empty() {
                dir.push(rel);
            }
            Some(dir)
        })
        .next_back()
}

/// `path` below the mounted `root` of the hierarchy, without leading `/`; `None` if the cgroup
/// is not visible through that mount.
fn relative_to<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    let root = root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    if !rest.is_empty() && !rest.starts_with('/') {
        return None;
    }
    Some(rest.trim_matches('/'))
}

/// The limits a cgroup enforces. `cpu_seconds` is accepted for completeness but enforced by
/// `RLIMIT_CPU` elsewhere; it creates no cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of memory (swap is limited to nothing extra where the kernel lets us).
    pub memory: Option<u64>,
    /// Maximum number of processes and threads.
    pub pids: Option<u64>,
    pub cpu_seconds: Option<u64>,
}

impl Limits {
    pub fn needs_cgroup(&self) -> bool {
        self.memory.is_some() || self.pids.is_some()
    }
}

/// Which limits the processes of a cgroup ran into.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exceeded {
    /// The OOM killer killed a process of the cgroup (v1 `memory.oom_control` `oom_kill`,
    /// v2 `memory.events` `oom_kill`).
    pub memory: bool,
    /// The memory limit was reached at least once (v1 `memory.failcnt`, v2 `memory.events`
    /// `max`). Not fatal by itself (the kernel may reclaim); together with a SIGKILL death
    /// it means the limit killed the command (older v1 kernels report no `oom_kill`).
    pub memory_limit_hit: bool,
    /// A fork or clone failed because of `pids.max` (`pids.events` `max`).
    pub pids: bool,
}

impl Exceeded {
    /// Whether the memory limit killed the command, given the signal that ended it (if any).
    pub fn memory_killed(&self, term_signal: Option<i32>) -> bool {
        self.memory || (self.memory_limit_hit && term_signal == Some(libc::SIGKILL))
    }

    /// The `limit_exceeded` name (DESIGN §3): `memory` before `pids`.
    pub fn limit_name(&self, term_signal: Option<i32>) -> Option<&'static str> {
        if self.memory_killed(term_signal) {
            Some("memory")
        } else if self.pids {
            Some("pids")
        } else {
            None
        }
    }
}

/// One directory of a txbox cgroup (one per v1 hierarchy, one in all on v2).
#[derive(Debug)]
struct Dir {
    version: CgroupVersion,
    path: PathBuf,
    controllers: Vec<Controller>,
}

/// A cgroup txbox created for one command. Dropping it kills what is left inside and removes
/// its directories (best effort); [`Cgroup::remove`] does the same and reports failures.
#[derive(Debug)]
pub struct Cgroup {
    dirs: Vec<Dir>,
}

impl Cgroup {
    /// Create `name` under this process's cgroup for each controller the set limits need
    /// (memory, pids) and write the limits. Nothing is created when no limit needs a cgroup.
    /// On error, whatever was created is removed again.
    ///
    /// `name` must be unique among live txbox cgroups (e.g. the transaction id and step): an
    /// existing empty cgroup of that name is taken for a crashed run's leftover and replaced.
    pub fn create(layout: &CgroupLayout, name: &str, limits: &Limits) -> Result<Cgroup, CgroupError> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
            return Err(CgroupError::InvalidName(name.to_owned()));
        }
        let mut needed = Vec::new();
        if limits.memory.is_some() {
            needed.push(Controller::Memory);
        }
        if limits.pids.is_some() {
            needed.push(Controller::Pids);
        }

        // Group the controllers by parent directory (one group per v1 hierarchy, one on v2).
        let mut groups: Vec<(ControllerDir, Vec<Controller>)> = Vec::new();
        for c in needed {
            let Some(parent) = layout.controller(c) else {
                return Err(CgroupError::ControllerUnavailable {
                    controller: c.name(),
                    hint: missing_controller_hint(c, layout),
                });
            };
            match groups.iter_mut().find(|(p, _)| p.dir == parent.dir) {
                Some((_, cs)) => cs.push(c),
                None => groups.push((parent.clone(), vec![c])),
            }
        }

        // From here on, `cg` owns what exists: an early return drops it, which cleans up.
        let mut cg = Cgroup { dirs: Vec::new() };
        for (parent, controllers) in groups {
            if parent.version == CgroupVersion::V2 {
                enable_v2_controllers(&parent.dir, &controllers)?;
            }
            let path = parent.dir.join(name);
            make_dir(&path)?;
            cg.dirs.push(Dir { version: parent.version, path, controllers });
        }
        cg.write_limits(limits)?;
        Ok(cg)
    }

    fn write_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        for d in &self.dirs {
            for c in &d.controllers {
                write_limit(d, *c, limits)?;
            }
        }
        Ok(())
    }

    /// The directories of this cgroup (one per controller hierarchy).
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|d| d.path.as_path())
    }

    /// Move process `pid` (and its threads) into the cgroup, in every hierarchy. Do it before
    /// the process forks: children inherit the cgroup, earlier ones stay outside.
    pub fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        for d in &self.dirs {
            let file = d.path.join("cgroup.procs");
            write_file(&file, &pid.to_string()).map_err(CgroupError::io("add process to", &file))?;
        }
        Ok(())
    }

    /// Which limits were hit so far. Unreadable files count as "not hit".
    pub fn usage(&self) -> Exceeded {
        let mut ex = Exceeded::default();
        for d in &self.dirs {
            for c in &d.controllers {
                match (c, d.version) {
                    (Controller::Memory, CgroupVersion::V1) => {
                        let oom = read_opt(&d.path.join("memory.oom_control"));
                        let fail = read_opt(&d.path.join("memory.failcnt"));
                        let v1 = memory_usage_v1(oom.as_deref(), fail.as_deref());
                        ex.memory |= v1.memory;
                        ex.memory_limit_hit |= v1.memory_limit_hit;
                    }
                    (Controller::Memory, CgroupVersion::V2) => {
                        let events = read_opt(&d.path.join("memory.events"));
                        let v2 = memory_usage_v2(events.as_deref());
                        ex.memory |= v2.memory;
                        ex.memory_limit_hit |= v2.memory_limit_hit;
                    }
                    (Controller::Pids, _) => {
                        let events = read_opt(&d.path.join("pids.events"));
                        ex.pids |= pids_hit(events.as_deref());
                    }
                    (Controller::Cpu, _) => {}
                }
            }
        }
        ex
    }

    /// Whether any process is still in the cgroup.
    pub fn is_populated(&self) -> bool {
        self.dirs.iter().any(|d| !list_procs(&d.path).is_empty())
    }

    /// SIGKILL every process in the cgroup (v2: through `cgroup.kill` when the kernel has it)
    /// and wait until it is empty, killing again what was forked meanwhile.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        for d in &self.dirs {
            let kill = d.path.join("cgroup.kill");
            if d.version == CgroupVersion::V2 && kill.exists() {
                // Best effort: the loop below does the job if this fails.
                let _ = write_file(&kill, "1");
            }
        }
        let me = rustix::process::getpid();
        let deadline = Instant::now() + KILL_DEADLINE;
        loop {
            let mut any = false;
            for d in &self.dirs {
                for pid in list_procs(&d.path) {
                    let Some(pid) = Pid::from_raw(pid) else {
                        continue;
                    };
                    if pid == me {
                        continue; // never kill txbox itself, should someone have added it
                    }
                    any = true;
                    let _ = rustix::process::kill_process(pid, Signal::KILL);
                }
            }
            if !any {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let path = self.dirs.first().map(|d| d.path.clone()).unwrap_or_default();
                return Err(CgroupError::StillPopulated { path });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kill what is left and remove the directories.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.remove_dirs()
    }

    fn remove_dirs(&mut self) -> Result<(), CgroupError> {
        let killed = self.kill_all();
        let mut first_err = killed.err();
        // Children first would matter only for nested dirs; ours are siblings in separate
        // hierarchies. Keep the ones that failed so a later drop does not retry blindly.
        for d in std::mem::take(&mut self.dirs) {
            if let Err(e) = remove_dir_retrying(&d.path) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if !self.dirs.is_empty() {
            let _ = self.remove_dirs();
        }
    }
}

fn write_limit(d: &Dir, c: Controller, limits: &Limits) -> Result<(), CgroupError> {
    let p = &d.path;
    match (c, d.version) {
        (Controller::Memory, v) => {
            let Some(bytes) = limits.memory else {
                return Ok(());
            };
            let bytes = bytes.to_string();
            match v {
                CgroupVersion::V1 => {
                    let f = p.join("memory.limit_in_bytes");
                    write_file(&f, &bytes).map_err(CgroupError::io("set memory limit", &f))?;
                    // No swap beyond the limit; absent without swap accounting.
                    let sw = p.join("memory.memsw.limit_in_bytes");
                    if sw.exists() {
                        let _ = write_file(&sw, &bytes);
                    }
                }
                CgroupVersion::V2 => {
                    let f = p.join("memory.max");
                    write_file(&f, &bytes).map_err(CgroupError::io("set memory limit", &f))?;
                    let sw = p.join("memory.swap.max");
                    if sw.exists() {
                        let _ = write_file(&sw, "0");
                    }
                    // An OOM kill takes the whole command down, not one random process.
                    let group = p.join("memory.oom.group");
                    if group.exists() {
                        let _ = write_file(&group, "1");
                    }
                }
            }
        }
        (Controller::Pids, _) => {
            let Some(n) = limits.pids else { return Ok(()) };
            let f = p.join("pids.max");
            write_file(&f, &n.to_string()).map_err(CgroupError::io("set pids limit", &f))?;
        }
        (Controller::Cpu, _) => {} // RLIMIT_CPU, elsewhere
    }
    Ok(())
}

/// Make sure `parent` (v2) passes `controllers` to its children, enabling them in its
/// `cgroup.subtree_control` if needed. The kernel refuses that while `parent` holds processes
/// ("no internal processes"); if the only one is txbox, move it into a leaf child first.
fn enable_v2_controllers(parent: &Path, controllers: &[Controller]) -> Result<(), CgroupError> {
    let subtree = parent.join("cgroup.subtree_control");
    let enabled = read_to_string("read", &subtree)?;
    let missing: Vec<Controller> =
        controllers.iter().copied().filter(|c| !enabled.split_whitespace().any(|e| e == c.name())).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let available_file = parent.join("cgroup.controllers");
    let available = read_to_string("read", &available_file)?;
    for c in &missing {
        if !available.split_whitespace().any(|a| a == c.name()) {
            return Err(CgroupError::ControllerUnavailable {
                controller: c.name(),
                hint: format!(
                    "{} does not list it: the parent cgroup does not delegate it; {}",
                    available_file.display(),
                    DELEGATE_HINT
                ),
            });
        }
    }
    let request = missing.iter().map(|c| format!("+{}", c.name())).collect::<Vec<_>>().join(" ");
    match write_file(&subtree, &request) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
        Err(e) => return Err(CgroupError::Io { step: "enable controllers in", path: subtree, source: e }),
    }
    // EBUSY: processes live in `parent`. Move txbox out of the way if it is alone there.
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let procs = list_procs(parent);
    if procs.iter().any(|p| *p != me) {
        return Err(CgroupError::ControllerUnavailable {
            controller: missing[0].name(),
            hint: format!(
                "{} holds other processes, and cgroup v2 cannot enable controllers for the \
                 children of a cgroup with processes; run txbox in a cgroup of its own, e.g. \
                 `systemd-run --user --scope -p Delegate=yes txbox ...`",
                parent.display()
            ),
        });
    }
    let leaf = parent.join(SUPERVISOR_LEAF);
    match fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(CgroupError::Io { step: "create supervisor leaf", path: leaf, source: e }),
    }
    let leaf_procs = leaf.join("cgroup.procs");
    write_file(&leaf_procs, &me.to_string())
        .map_err(CgroupError::io("move txbox into supervisor leaf", &leaf_procs))?;
    write_file(&subtree, &request).map_err(CgroupError::io("enable controllers in", &subtree))
}

const DELEGATE_HINT: &str = "run txbox as root, or in a delegated cgroup: \
     `systemd-run --user --scope -p Delegate=yes txbox ...`";

fn missing_controller_hint(c: Controller, layout: &CgroupLayout) -> String {
    let name = c.name();
    match layout.mode {
        CgroupMode::None => "no cgroup filesystem is mounted; mount cgroup2 at /sys/fs/cgroup \
                             (or the cgroup v1 hierarchies)"
            .to_owned(),
        CgroupMode::V1 => {
            format!("no cgroup v1 hierarchy with the {name} controller is mounted; mount one at /sys/fs/cgroup/{name}")
        }
        CgroupMode::Hybrid => format!(
            "no cgroup v1 hierarchy has the {name} controller and this process's cgroup v2 \
             group does not have it either; mount the v1 hierarchy at /sys/fs/cgroup/{name}, or \
             {DELEGATE_HINT}"
        ),
        CgroupMode::V2 => format!(
            "this process's cgroup does not have the {name} controller (its parent does not \
             delegate it); {DELEGATE_HINT}"
        ),
    }
}

/// mkdir, replacing an empty leftover of a crashed run.
fn make_dir(path: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_dir(path).map_err(CgroupError::io("remove stale cgroup", path))?;
            fs::create_dir(path).map_err(CgroupError::io("create cgroup", path))
        }
        Err(e) => Err(CgroupError::Io { step: "create cgroup", path: path.to_path_buf(), source: e }),
    }
}

fn remove_dir_retrying(path: &Path) -> Result<(), CgroupError> {
    let mut tries = 0;
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < RMDIR_TRIES => {
                tries += 1;
                // Dying processes may take a moment to leave; kill anything still there.
                for pid in list_procs(path) {
                    if let Some(pid) = Pid::from_raw(pid) {
                        if pid != rustix::process::getpid() {
                            let _ = rustix::process::kill_process(pid, Signal::KILL);
                        }
                    }
                }
                std::thread::sleep(RMDIR_PAUSE);
            }
            Err(e) => return Err(CgroupError::Io { step: "remove cgroup", path: path.to_path_buf(), source: e }),
        }
    }
}

/// One `write(2)` of the whole value, as cgroup files want; never creates the file.
fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).truncate(true).open(path)?;
    f.write_all(value.as_bytes())
}

fn read_to_string(step: &'static str, path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(CgroupError::io(step, path))
}

fn read_opt(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok()
}

fn list_procs(dir: &Path) -> Vec<i32> {
    read_opt(&dir.join("cgroup.procs"))
        .map(|s| s.split_whitespace().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}

/// The value of `key` in a flat-keyed cgroup file (`key value` per line).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next().and_then(|v| v.parse().ok())).flatten()
    })
}

/// v1: `memory.oom_control` (`oom_kill N`, kernel ≥ 4.13) and `memory.failcnt`.
fn memory_usage_v1(oom_control: Option<&str>, failcnt: Option<&str>) -> Exceeded {
    let oom_kills = oom_control.and_then(|t| keyed(t, "oom_kill")).unwrap_or(0);
    let fails = failcnt.and_then(|t| t.trim().parse::<u64>().ok()).unwrap_or(0);
    Exceeded { memory: oom_kills > 0, memory_limit_hit: fails > 0 || oom_kills > 0, pids: false }
}

/// v2: `memory.events` (`max N`, `oom_kill N`).
fn memory_usage_v2(events: Option<&str>) -> Exceeded {
    let t = events.unwrap_or("");
    let oom_kills = keyed(t, "oom_kill").unwrap_or(0);
    let max = keyed(t, "max").unwrap_or(0);
    Exceeded { memory: oom_kills > 0, memory_limit_hit: max > 0 || oom_kills > 0, pids: false }
}

/// v1 and v2: `pids.events` (`max N`).
fn pids_hit(events: Option<&str>) -> bool {
    events.and_then(|t| keyed(t, "max")).unwrap_or(0) > 0
}

/// What the host offers for one controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSupport {
    pub controller: Controller,
    /// Where this process's cgroup is for it, if the controller is available at all.
    pub location: Option<ControllerDir>,
    /// Whether txbox can create a child cgroup there that carries the controller.
    pub usable: bool,
    /// Why not, when it is not.
    pub problem: Option<String>,
}

/// What `txbox doctor` reports about cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupSupport {
    pub mode: CgroupMode,
    /// `None` when /proc/self/cgroup or mountinfo could not be read or parsed.
    pub layout: Option<CgroupLayout>,
    /// memory, pids, cpu (in that order).
    pub controllers: Vec<ControllerSupport>,
    /// Whether `--memory` and `--pids` can be enforced with cgroups.
    pub limits_supported: bool,
    /// What to do about it, when they cannot.
    pub hint: Option<String>,
}

/// Probe this host for `txbox doctor`: detect the layout and try to create (and remove) a
/// child cgroup where each controller lives.
pub fn probe() -> CgroupSupport {
    match CgroupLayout::detect() {
        Ok(layout) => probe_layout(&layout),
        Err(e) => CgroupSupport {
            mode: CgroupMode::None,
            layout: None,
            controllers: Vec::new(),
            limits_supported: false,
            hint: Some(format!("cannot find this process's cgroups ({e}); is /proc mounted?")),
        },
    }
}

/// [`probe`] on a given layout (tests point it into a fake tree).
pub fn probe_layout(layout: &CgroupLayout) -> CgroupSupport {
    let controllers: Vec<ControllerSupport> = Controller::ALL.iter().map(|&c| probe_controller(layout, c)).collect();
    let limited: Vec<&ControllerSupport> =
        controllers.iter().filter(|s| matches!(s.controller, Controller::Memory | Controller::Pids)).collect();
    let limits_supported = limited.iter().all(|s| s.usable);
    let hint = if limits_supported {
        None
    } else {
        let problems: Vec<String> = limited
            .iter()
            .filter_map(|s| s.problem.as_ref().map(|p| format!("{}: {p}", s.controller.name())))
            .collect();
        Some(format!(
            "{}. Without cgroups, --memory and --pids fall back to rlimits (per process, not \
             per command)",
            problems.join("; ")
        ))
    };
    CgroupSupport { mode: layout.mode, layout: Some(layout.clone()), controllers, limits_supported, hint }
}

fn probe_controller(layout: &CgroupLayout, c: Controller) -> ControllerSupport {
    let Some(loc) = layout.controller(c) else {
        return ControllerSupport {
            controller: c,
            location: None,
            usable: false,
            problem: Some(missing_controller_hint(c, layout)),
        };
    };
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let probe_dir = loc.dir.join(format!("txbox-probe-{me}"));
    let problem = match fs::create_dir(&probe_dir) {
        Ok(()) => {
            let _ = fs::remove_dir(&probe_dir);
            if loc.version == CgroupVersion::V2 {
                v2_enable_problem(&loc.dir, c, me)
            } else {
                None
            }
        }
        Err(e) => Some(create_problem(&loc.dir, loc.version, &e)),
    };
    ControllerSupport { controller: c, location: Some(loc.clone()), usable: problem.is_none(), problem }
}

/// Why children of `dir` (v2) would not get controller `c`, if they would not.
fn v2_enable_problem(dir: &Path, c: Controller, me: i32) -> Option<String> {
    let subtree = dir.join("cgroup.subtree_control");
    let enabled = read_opt(&subtree).unwrap_or_default();
    if enabled.split_whitespace().any(|e| e == c.name()) {
        return None;
    }
    if rustix::fs::access(&subtree, rustix::fs::Access::WRITE_OK).is_err() {
        return Some(format!(
            "{} is not writable, so {} cannot be enabled for child cgroups; {}",
            subtree.display(),
            c.name(),
            DELEGATE_HINT
        ));
    }
    if list_procs(dir).iter().any(|p| *p != me) {
        return Some(format!(
            "{} holds other processes, so cgroup v2 will not enable {} for child cgroups; run \
             txbox in a cgroup of its own, e.g. `systemd-run --user --scope -p Delegate=yes txbox ...`",
            dir.display(),
            c.name()
        ));
    }
    None
}

fn create_problem(dir: &Path, version: CgroupVersion, e: &io::Error) -> String {
    let base = format!("cannot create a child cgroup in {}: {e}", dir.display());
    match (e.raw_os_error(), version) {
        (Some(libc::EROFS), _) => format!(
            "{base}; the cgroup filesystem is read-only (typical in a container): give the \
             container a writable cgroup (e.g. `--cgroupns=private` with cgroup v2, or \
             `--privileged`)"
        ),
        (Some(libc::EACCES | libc::EPERM), CgroupVersion::V2) => format!("{base}; {DELEGATE_HINT}"),
        (Some(libc::EACCES | libc::EPERM), CgroupVersion::V1) => format!(
            "{base}; cgroup v1 is not delegated to users: run txbox as root (or chown {} to \
             your user)",
            dir.display()
        ),
        _ => base,
    }
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

impl fmt::Display for CgroupMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupMode::None => "none",
            CgroupMode::V1 => "cgroup v1",
            CgroupMode::V2 => "cgroup v2 (unified)",
            CgroupMode::Hybrid => "hybrid (cgroup v1 controllers + cgroup2)",
        })
    }
}

/// Human report for `txbox doctor`.
impl fmt::Display for CgroupSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "cgroups: {}", self.mode)?;
        for s in &self.controllers {
            let state = match (&s.location, s.usable) {
                (Some(_), true) => "ok".to_owned(),
                (_, _) => format!("unusable: {}", s.problem.as_deref().unwrap_or("unknown")),
            };
            let at = match &s.location {
                Some(l) => format!("{} at {}", l.version, l.dir.display()),
                None => "not available".to_owned(),
            };
            let note = if s.controller == Controller::Cpu { " (cpu time is limited with RLIMIT_CPU)" } else { "" };
            writeln!(f, "  {:<7} {at}: {state}{note}", format!("{}:", s.controller.name()))?;
        }
        if let Some(h) = &self.hint {
            writeln!(f, "  hint: {h}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A scratch directory standing in for `/`, removed on drop.
    struct Fake(PathBuf);

    impl Fake {
        fn new(tag: &str) -> Fake {
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
            let p = std::env::temp_dir().join(format!("txbox-cgtest-{}-{tag}-{nanos}", std::process::id()));
            fs::create_dir_all(&p).unwrap();
            Fake(p)
        }
        fn path(&self, rel: &str) -> PathBuf {
            self.0.join(rel.trim_start_matches('/'))
        }
        /// Create `rel` with `content`, and its parent directories.
        fn file(&self, rel: &str, content: &str) -> PathBuf {
            let p = self.path(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, content).unwrap();
            p
        }
        fn dir(&self, rel: &str) -> PathBuf {
            let p = self.path(rel);
            fs::create_dir_all(&p).unwrap();
            p
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    // This very host: v1 controllers, cgroup2 without controllers, memory in a nested cgroup.
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/bf92e4dc
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";
    const HYBRID_MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 8:1 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const V2_CGROUP: &str = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n";
    const V2_MOUNTINFO: &str = "\
27 1 8:1 / / rw,relatime - ext4 /dev/vda rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    const V2_DIR: &str = "sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope";

    fn v1(dir: PathBuf) -> Option<ControllerDir> {
        Some(ControllerDir { version: CgroupVersion::V1, dir })
    }
    fn v2(dir: PathBuf) -> Option<ControllerDir> {
        Some(ControllerDir { version: CgroupVersion::V2, dir })
    }

    #[test]
    fn layout_hybrid_v1_controllers_nest_under_own_cgroup() {
        let f = Fake::new("hybrid");
        f.file("sys/fs/cgroup/unified/cgroup.controllers", "\n"); // no controllers
        let l = CgroupLayout::parse(HYBRID_CGROUP, HYBRID_MOUNTINFO, &f.0).unwrap();
        assert_eq!(l.mode, CgroupMode::Hybrid);
        assert_eq!(l.memory, v1(f.path("sys/fs/cgroup/memory/process_api/bf92e4dc")));
        assert_eq!(l.pids, v1(f.path("sys/fs/cgroup/pids")));
        assert_eq!(l.cpu, v1(f.path("sys/fs/cgroup/cpu")));
        assert_eq!(l.unified, Some(f.path("sys/fs/cgroup/unified")));
    }

    #[test]
    fn layout_hybrid_works_without_reading_anything() {
        // The fake root has no files at all: v1 needs none, v2 just has no controllers.
        let l = CgroupLayout::parse(HYBRID_CGROUP, HYBRID_MOUNTINFO, Path::new("/nonexistent-root")).unwrap();
        assert_eq!(l.memory.map(|c| c.version), Some(CgroupVersion::V1));
        assert_eq!(l.unified, Some(PathBuf::from("/nonexistent-root/sys/fs/cgroup/unified")));
    }

    #[test]
    fn layout_pure_v1_combined_hierarchy_and_container_mount_root() {
        // Docker-style: the hierarchy is mounted from /docker/abc, we sit in /docker/abc/job;
        // cpu and cpuacct share a hierarchy; a bind mount of another subtree is ignored; a
        // hierarchy without mount (pids) gives no directory.
        let cg = "3:memory:/docker/abc/job\n2:cpu,cpuacct:/docker/abc\n1:pids:/docker/abc\n";
        let mi = "\
100 99 0:50 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
101 99 0:51 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct
102 99 0:50 /other /mnt/other rw - cgroup cgroup rw,memory
";
        let l = CgroupLayout::parse(cg, mi, Path::new("/r")).unwrap();
        assert_eq!(l.mode, CgroupMode::V1);
        assert_eq!(l.memory, v1(PathBuf::from("/r/sys/fs/cgroup/memory/job")));
        assert_eq!(l.cpu, v1(PathBuf::from("/r/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(l.pids, None);
        assert_eq!(l.unified, None);
    }

    #[test]
    fn layout_v1_path_prefix_must_match_whole_components() {
        assert_eq!(relative_to("/docker/abcdef", "/docker/abc"), None);
        assert_eq!(relative_to("/docker/abc/x/y", "/docker/abc"), Some("x/y"));
        assert_eq!(relative_to("/docker/abc", "/docker/abc/"), Some(""));
        assert_eq!(relative_to("/a/b", "/"), Some("a/b"));
        assert_eq!(relative_to("/", "/"), Some(""));
    }

    #[test]
    fn layout_v2_delegated_controllers() {
        let f = Fake::new("v2");
        f.file(&format!("{V2_DIR}/cgroup.controllers"), "cpu memory pids\n");
        let l = CgroupLayout::parse(V2_CGROUP, V2_MOUNTINFO, &f.0).unwrap();
        assert_eq!(l.mode, CgroupMode::V2);
        let dir = f.path(V2_DIR);
        assert_eq!(l.memory, v2(dir.clone()));
        assert_eq!(l.pids, v2(dir.clone()));
        assert_eq!(l.cpu, v2(dir.clone()));
        assert_eq!(l.unified, Some(dir));
    }

    #[test]
    fn layout_v2_only_delegated_controllers_are_available() {
        let f = Fake::new("v2partial");
        f.file(&format!("{V2_DIR}/cgroup.controllers"), "pids\n");
        let l = CgroupLayout::parse(V2_CGROUP, V2_MOUNTINFO, &f.0).unwrap();
        assert_eq!(l.memory, None);
        assert_eq!(l.cpu, None);
        assert_eq!(l.pids, v2(f.path(V2_DIR)));
        let err = Cgroup::create(&l, "t", &Limits { memory: Some(1 << 20), ..Limits::default() }).unwrap_err();
        assert!(matches!(err, CgroupError::ControllerUnavailable { controller: "memory", .. }), "{err}");
        assert!(err.to_string().contains("Delegate=yes"), "{err}");
    }

    #[test]
    fn layout_v2_sees_through_the_supervisor_leaf() {
        let f = Fake::new("v2leaf");
        f.file(&format!("{V2_DIR}/cgroup.controllers"), "memory pids\n");
        let cg = format!("{}/{SUPERVISOR_LEAF}\n", V2_CGROUP.trim_end());
        let l = CgroupLayout::parse(&cg, V2_MOUNTINFO, &f.0).unwrap();
        assert_eq!(l.unified, Some(f.path(V2_DIR)));
        assert_eq!(l.memory, v2(f.path(V2_DIR)));
        let top = format!("0::/{SUPERVISOR_LEAF}\n");
        let l = CgroupLayout::parse(&top, V2_MOUNTINFO, Path::new("/r")).unwrap();
        assert_eq!(l.unified, Some(PathBuf::from("/r/sys/fs/cgroup")));
    }

    #[test]
    fn layout_v2_root_and_escaped_mount_point() {
        let mi = "30 23 0:26 / /my\\040cgroups rw - cgroup2 none rw\n";
        let l = CgroupLayout::parse("0::/\n", mi, Path::new("/r")).unwrap();
        assert_eq!(l.unified, Some(PathBuf::from("/r/my cgroups")));
        assert_eq!(l.memory, None); // no cgroup.controllers under /r
        assert_eq!(unescape_mountinfo("a\\011b\\134c\\0"), "a\tb\\c\\0");
    }

    #[test]
    fn layout_no_cgroups() {
        let l = CgroupLayout::parse("0::/\n", "27 1 8:1 / / rw - ext4 /dev/vda rw\n", Path::new("/r")).unwrap();
        assert_eq!(l.mode, CgroupMode::None);
        assert_eq!((&l.memory, &l.pids, &l.cpu, &l.unified), (&None, &None, &None, &None));
        let err = Cgroup::create(&l, "t", &Limits { pids: Some(3), ..Limits::default() }).unwrap_err();
        assert!(err.to_string().contains("no cgroup filesystem"), "{err}");
    }

    #[test]
    fn layout_parse_errors_name_the_file() {
        let err = CgroupLayout::parse("garbage\n", "", Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("/proc/self/cgroup"), "{err}");
        let err = CgroupLayout::parse("0::/\n", "1 2 3 4\n", Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("/proc/self/mountinfo"), "{err}");
    }

    #[test]
    fn create_rejects_bad_names() {
        let l = CgroupLayout::parse(HYBRID_CGROUP, HYBRID_MOUNTINFO, Path::new("/r")).unwrap();
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            let err = Cgroup::create(&l, bad, &Limits::default()).unwrap_err();
            assert!(matches!(err, CgroupError::InvalidName(_)), "{bad:?}: {err}");
        }
    }

    #[test]
    fn create_without_cgroup_limits_creates_nothing() {
        let l = CgroupLayout::parse("0::/\n", "", Path::new("/r")).unwrap();
        let cg = Cgroup::create(&l, "t", &Limits { cpu_seconds: Some(3), ..Limits::default() }).unwrap();
        assert_eq!(cg.paths().count(), 0);
        assert_eq!(cg.usage(), Exceeded::default());
        cg.kill_all().unwrap();
        cg.remove().unwrap();
    }

    #[test]
    fn create_failure_names_step_and_path_and_cleans_up() {
        // A fake tree's mkdir makes no interface files, so writing the limit fails: the error
        // names the step and the file, and the directories created so far are removed again.
        let f = Fake::new("createfail");
        let mem = f.dir("sys/fs/cgroup/memory/process_api/bf92e4dc");
        let pids = f.dir("sys/fs/cgroup/pids");
        let l = CgroupLayout::parse(HYBRID_CGROUP, HYBRID_MOUNTINFO, &f.0).unwrap();
        let limits = Limits { memory: Some(64 << 20), pids: Some(5), cpu_seconds: None };
        let err = Cgroup::create(&l, "tx1", &limits).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("set memory limit"), "{msg}");
        assert!(msg.contains(&mem.join("tx1/memory.limit_in_bytes").display().to_string()), "{msg}");
        assert!(!mem.join("tx1").exists());
        assert!(!pids.join("tx1").exists());
    }

    #[test]
    fn create_replaces_an_empty_stale_cgroup_but_not_a_busy_one() {
        let f = Fake::new("stale");
        let pids = f.dir("sys/fs/cgroup/pids");
        let l = CgroupLayout::parse(HYBRID_CGROUP, HYBRID_MOUNTINFO, &f.0).unwrap();
        f.dir("sys/fs/cgroup/pids/tx1");
        make_dir(&pids.join("tx1")).unwrap();
        assert!(pids.join("tx1").is_dir());
        f.file("sys/fs/cgroup/pids/tx1/cgroup.procs", "");
        let err = Cgroup::create(&l, "tx1", &Limits { pids: Some(5), ..Limits::default() }).unwrap_err();
        assert!(err.to_string().contains("remove stale cgroup"), "{err}");
    }

    /// A `Cgroup` over fake directories that already hold the kernel's interface files.
    fn fake_cgroup(dirs: Vec<(CgroupVersion, PathBuf, Vec<Controller>)>) -> Cgroup {
        Cgroup {
            dirs: dirs.into_iter().map(|(version, path, controllers)| Dir { version, path, controllers }).collect(),
        }
    }

    fn read(p: &Path) -> String {
        fs::read_to_string(p).unwrap()
    }

    /// Empty the fake directories so that removal (rmdir) can succeed.
    fn clear(cg: &Cgroup) {
        for p in cg.paths() {
            for e in fs::read_dir(p).unwrap() {
                fs::remove_file(e.unwrap().path()).unwrap();
            }
        }
    }

    #[test]
    fn v1_limits_and_pids_written() {
        let f = Fake::new("v1write");
        let mem = f.dir("memory/tx");
        let pids = f.dir("pids/tx");
        for n in ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "cgroup.procs"] {
            f.file(&format!("memory/tx/{n}"), "9223372036854771712\n");
        }
        for n in ["pids.max", "cgroup.procs"] {
            f.file(&format!("pids/tx/{n}"), "max\n");
        }
        let cg = fake_cgroup(vec![
            (CgroupVersion::V1, mem.clone(), vec![Controller::Memory]),
            (CgroupVersion::V1, pids.clone(), vec![Controller::Pids]),
        ]);
        cg.write_limits(&Limits { memory: Some(67108864), pids: Some(5), cpu_seconds: Some(1) }).unwrap();
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), "67108864");
        assert_eq!(read(&mem.join("memory.memsw.limit_in_bytes")), "67108864");
        assert_eq!(read(&pids.join("pids.max")), "5");
        cg.add_pid(4242).unwrap();
        assert_eq!(read(&mem.join("cgroup.procs")), "4242");
        assert_eq!(read(&pids.join("cgroup.procs")), "4242");
        // Nothing will be killed: pretend the process left.
        fs::write(mem.join("cgroup.procs"), "").unwrap();
        fs::write(pids.join("cgroup.procs"), "").unwrap();
        clear(&cg);
        cg.remove().unwrap();
        assert!(!mem.exists() && !pids.exists());
    }

    #[test]
    fn v1_memsw_is_optional() {
        let f = Fake::new("v1nosw");
        let mem = f.dir("memory/tx");
        f.file("memory/tx/memory.limit_in_bytes", "max");
        let cg = fake_cgroup(vec![(CgroupVersion::V1, mem.clone(), vec![Controller::Memory])]);
        cg.write_limits(&Limits { memory: Some(4096), ..Limits::default() }).unwrap();
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), "4096");
        assert!(!mem.join("memory.memsw.limit_in_bytes").exists());
        clear(&cg);
    }

    #[test]
    fn v2_limits_written_in_one_directory() {
        let f = Fake::new("v2write");
        let d = f.dir("cg/tx");
        for n in ["memory.max", "memory.swap.max", "memory.oom.group", "pids.max", "cgroup.procs"] {
            f.file(&format!("cg/tx/{n}"), "max\n");
        }
        let cg = fake_cgroup(vec![(CgroupVersion::V2, d.clone(), vec![Controller::Memory, Controller::Pids])]);
        cg.write_limits(&Limits { memory: Some(1 << 30), pids: Some(64), cpu_seconds: None }).unwrap();
        assert_eq!(read(&d.join("memory.max")), "1073741824");
        assert_eq!(read(&d.join("memory.swap.max")), "0");
        assert_eq!(read(&d.join("memory.oom.group")), "1");
        assert_eq!(read(&d.join("pids.max")), "64");
        assert_eq!(cg.paths().count(), 1);
        clear(&cg);
    }

    #[test]
    fn v2_enable_controllers_in_parent() {
        let f = Fake::new("v2enable");
        let parent = f.dir("cg");
        f.file("cg/cgroup.controllers", "cpu memory pids\n");
        f.file("cg/cgroup.subtree_control", "cpu\n");
        f.file("cg/cgroup.procs", "");
        enable_v2_controllers(&parent, &[Controller::Memory, Controller::Pids]).unwrap();
        assert_eq!(read(&parent.join("cgroup.subtree_control")), "+memory +pids");
        // Already enabled: nothing written.
        f.file("cg/cgroup.subtree_control", "memory pids\n");
        enable_v2_controllers(&parent, &[Controller::Memory]).unwrap();
        assert_eq!(read(&parent.join("cgroup.subtree_control")), "memory pids\n");
        // Not delegated.
        f.file("cg/cgroup.controllers", "pids\n");
        f.file("cg/cgroup.subtree_control", "");
        let err = enable_v2_controllers(&parent, &[Controller::Memory]).unwrap_err();
        assert!(matches!(err, CgroupError::ControllerUnavailable { controller: "memory", .. }), "{err}");
        assert!(err.to_string().contains("cgroup.controllers"), "{err}");
    }

    #[test]
    fn usage_v1_parsing() {
        let oom0 = "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n";
        let oom2 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(memory_usage_v1(Some(oom0), Some("0\n")), Exceeded::default());
        let e = memory_usage_v1(Some(oom2), Some("0\n"));
        assert!(e.memory && e.memory_limit_hit);
        // Old kernels: no oom_kill line; failcnt alone counts only with a SIGKILL death.
        let e = memory_usage_v1(Some("oom_kill_disable 0\nunder_oom 0\n"), Some("17\n"));
        assert!(!e.memory && e.memory_limit_hit);
        assert!(e.memory_killed(Some(libc::SIGKILL)));
        assert!(!e.memory_killed(Some(libc::SIGTERM)));
        assert!(!e.memory_killed(None));
        assert_eq!(e.limit_name(Some(libc::SIGKILL)), Some("memory"));
        assert_eq!(e.limit_name(None), None);
        assert_eq!(memory_usage_v1(None, None), Exceeded::default());
    }

    #[test]
    fn usage_v2_and_pids_parsing() {
        let ev = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        let e = memory_usage_v2(Some(ev));
        assert!(e.memory && e.memory_limit_hit);
        let e = memory_usage_v2(Some("low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n"));
        assert!(!e.memory && e.memory_limit_hit);
        assert_eq!(memory_usage_v2(None), Exceeded::default());
        assert!(!pids_hit(Some("max 0\n")));
        assert!(pids_hit(Some("max 4\n")));
        assert!(!pids_hit(Some("max.imposed 3\nmax 0\n")));
        assert!(pids_hit(Some("max 1\nmax.imposed 0\n")));
        assert!(!pids_hit(None));
        let both = Exceeded { memory: true, memory_limit_hit: true, pids: true };
        assert_eq!(both.limit_name(None), Some("memory"));
        assert_eq!(Exceeded { pids: true, ..Exceeded::default() }.limit_name(None), Some("pids"));
    }

    #[test]
    fn usage_reads_fake_tree() {
        let f = Fake::new("usage");
        let mem = f.dir("memory/tx");
        let pids = f.dir("pids/tx");
        let v2d = f.dir("unified/tx");
        f.file("memory/tx/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
        f.file("memory/tx/memory.failcnt", "0\n");
        f.file("pids/tx/pids.events", "max 0\n");
        let cg = fake_cgroup(vec![
            (CgroupVersion::V1, mem.clone(), vec![Controller::Memory]),
            (CgroupVersion::V1, pids.clone(), vec![Controller::Pids]),
        ]);
        assert_eq!(cg.usage(), Exceeded::default());
        f.file("pids/tx/pids.events", "max 3\n");
        assert_eq!(cg.usage(), Exceeded { pids: true, ..Exceeded::default() });
        f.file("memory/tx/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n");
        assert_eq!(cg.usage(), Exceeded { memory: true, memory_limit_hit: true, pids: true });
        clear(&cg);

        f.file("unified/tx/memory.events", "low 0\nhigh 0\nmax 1\noom 0\noom_kill 0\n");
        f.file("unified/tx/pids.events", "max 0\n");
        let cg2 = fake_cgroup(vec![(CgroupVersion::V2, v2d, vec![Controller::Memory, Controller::Pids])]);
        assert_eq!(cg2.usage(), Exceeded { memory_limit_hit: true, ..Exceeded::default() });
        clear(&cg2);
    }

    #[test]
    fn kill_all_never_kills_txbox_itself() {
        let f = Fake::new("killself");
        let d = f.dir("pids/tx");
        f.file("pids/tx/cgroup.procs", &format!("{}\n", std::process::id()));
        let cg = fake_cgroup(vec![(CgroupVersion::V1, d, vec![Controller::Pids])]);
        cg.kill_all().unwrap(); // returns at once: nothing else to kill
        assert!(cg.is_populated());
        clear(&cg);
    }

    #[test]
    fn probe_fake_trees() {
        let f = Fake::new("probe");
        f.dir("sys/fs/cgroup/memory/process_api/bf92e4dc");
        f.dir("sys/fs/cgroup/pids");
        f.dir("sys/fs/cgroup/cpu");
        let l = CgroupLayout::parse(HYBRID_CGROUP, HYBRID_MOUNTINFO, &f.0).unwrap();
        let s = probe_layout(&l);
        assert!(s.limits_supported, "{s}");
        assert_eq!(s.hint, None);
        assert_eq!(s.controllers.len(), 3);
        assert!(s.controllers.iter().all(|c| c.usable), "{s}");
        // Probing leaves nothing behind.
        assert_eq!(fs::read_dir(f.path("sys/fs/cgroup/pids")).unwrap().count(), 0);
        let text = s.to_string();
        assert!(text.contains("hybrid") && text.contains("memory: v1 at"), "{text}");

        // v2: memory not delegated; pids delegated but the cgroup holds other processes.
        let g = Fake::new("probe2");
        g.file(&format!("{V2_DIR}/cgroup.controllers"), "pids\n");
        g.file(&format!("{V2_DIR}/cgroup.subtree_control"), "\n");
        g.file(&format!("{V2_DIR}/cgroup.procs"), "1\n");
        let l = CgroupLayout::parse(V2_CGROUP, V2_MOUNTINFO, &g.0).unwrap();
        let s = probe_layout(&l);
        assert!(!s.limits_supported);
        let hint = s.hint.clone().unwrap_or_default();
        assert!(hint.contains("memory: this process's cgroup does not have the memory controller"), "{hint}");
        assert!(hint.contains("holds other processes"), "{hint}");
        assert!(hint.contains("systemd-run --user --scope -p Delegate=yes"), "{hint}");
    }

    #[test]
    fn probe_this_host_does_not_panic() {
        let s = probe();
        eprintln!("{s}");
    }

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// Spawn `sh -c SCRIPT` held at a `read` gate, so that it cannot fork before it is in
    /// the cgroup; move it in, then open the gate.
    fn spawn_gated_into(cg: &Cgroup, script: &str) -> std::process::Child {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("read gate; {script}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        cg.add_pid(child.id() as i32).unwrap();
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        child
    }

    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn real_pids_limit_is_hit_and_tree_killed() {
        if !is_root() {
            eprintln!("SKIP (not root): real cgroup test needs root");
            return;
        }
        let layout = CgroupLayout::detect().unwrap();
        let name = format!("txbox-test-pids-{}", std::process::id());
        let limits = Limits { memory: Some(64 << 20), pids: Some(5), cpu_seconds: None };
        let cg = Cgroup::create(&layout, &name, &limits).unwrap_or_else(|e| panic!("{e}\n{}", probe_layout(&layout)));
        let paths: Vec<PathBuf> = cg.paths().map(Path::to_path_buf).collect();
        assert!(!paths.is_empty());
        for p in &paths {
            assert!(p.is_dir(), "{}", p.display());
            assert!(p.ends_with(&name));
        }
        // The limits are in place, under this process's own cgroups.
        let mem = layout.memory.as_ref().unwrap();
        let mem_file = match mem.version {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        };
        assert_eq!(read(&mem.dir.join(&name).join(mem_file)).trim(), "67108864");
        assert_eq!(read(&layout.pids.as_ref().unwrap().dir.join(&name).join("pids.max")).trim(), "5");
        assert_eq!(cg.usage(), Exceeded::default());

        let mut child = spawn_gated_into(&cg, "for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; wait");
        wait_until("pids.events max > 0", || cg.usage().pids);
        let usage = cg.usage();
        assert!(usage.pids && !usage.memory, "{usage:?}");
        assert_eq!(usage.limit_name(None), Some("pids"));
        assert!(cg.is_populated());

        let t = Instant::now();
        cg.kill_all().unwrap();
        assert!(!cg.is_populated());
        assert!(t.elapsed() < Duration::from_secs(4), "kill took {:?}", t.elapsed());
        // dash gives up (exit 2) when a fork fails; if it was still waiting, it was killed.
        let status = child.wait().unwrap();
        assert!(!status.success(), "{status:?}");
        cg.remove().unwrap();
        for p in &paths {
            assert!(!p.exists(), "{} still exists", p.display());
        }
    }

    #[test]
    fn real_memory_limit_oom_kill_is_reported() {
        if !is_root() {
            eprintln!("SKIP (not root): real cgroup test needs root");
            return;
        }
        let layout = CgroupLayout::detect().unwrap();
        let name = format!("txbox-test-mem-{}", std::process::id());
        let limits = Limits { memory: Some(32 << 20), pids: Some(32), cpu_seconds: None };
        let cg = Cgroup::create(&layout, &name, &limits).unwrap_or_else(|e| panic!("{e}\n{}", probe_layout(&layout)));
        // The shell keeps a command substitution's output in memory: 256 MiB of it.
        let mut child = spawn_gated_into(&cg, "x=$(head -c 268435456 /dev/zero | tr '\\000' a); echo ${#x}");
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        let usage = cg.usage();
        assert!(usage.memory, "{usage:?} {status:?}");
        assert_eq!(usage.limit_name(status.signal()), Some("memory"));
        cg.remove().unwrap();
        assert!(!layout.memory.as_ref().unwrap().dir.join(&name).exists());
    }
}
