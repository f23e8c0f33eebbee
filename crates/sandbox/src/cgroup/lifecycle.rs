//! One command's cgroup from birth to removal: create the directories (enabling v2 controllers
//! in the parent, moving txbox into its leaf when it must), write the limits, add processes,
//! read the hits, kill the tree, remove the directories (also on drop).
//!
//! Owns the directories it creates and nothing else: it may write the parent's
//! `cgroup.subtree_control` and move txbox itself, but never kills txbox nor touches a cgroup
//! it did not create (an empty stale one of the same name excepted).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use super::files::{list_procs, read_opt, read_to_string, write_file};
use super::hints::{missing_controller_hint, DELEGATE_HINT};
use super::limits::{memory_usage_v1, memory_usage_v2, pids_hit};
use super::{CgroupError, CgroupLayout, CgroupVersion, Controller, ControllerDir, Exceeded, Limits, SUPERVISOR_LEAF};

/// How long [`Cgroup::kill_all`] keeps killing before it gives up.
const KILL_DEADLINE: Duration = Duration::from_secs(5);
/// How many times `rmdir` is retried on EBUSY, and the pause between tries.
const RMDIR_TRIES: u32 = 50;
const RMDIR_PAUSE: Duration = Duration::from_millis(10);

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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::cgroup::probe_layout;
    use crate::cgroup::testutil::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

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
