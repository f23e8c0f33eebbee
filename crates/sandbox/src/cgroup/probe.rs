//! The host probe for `txbox doctor`: detect the layout, try to create (and remove at once) a
//! child cgroup where each controller lives, and say what lacks with a hint.
//!
//! May create and remove only its own `txbox-probe-PID` directories; never writes limits nor
//! enables controllers.

use std::fmt;
use std::fs;
use std::path::Path;

use super::files::list_procs;
use super::files::read_opt;
use super::hints::{create_problem, missing_controller_hint, DELEGATE_HINT};
use super::{CgroupLayout, CgroupMode, CgroupVersion, Controller, ControllerDir};

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
    use crate::cgroup::testutil::*;

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
}
