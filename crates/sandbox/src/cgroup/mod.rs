//! Memory and pids limits through cgroups (docs/DESIGN.md §3 `--memory`/`--pids`, §6 limits).
//!
//! Owns every cgroup txbox creates and every file it reads or writes under a cgroup
//! filesystem; may not touch processes other than by moving them into its own cgroups and
//! killing what is in them. Split by concern:
//!
//! - [`layout`]: where this process's own cgroup lives for each controller ([`CgroupLayout`]),
//!   parsed from `/proc/self/cgroup` and `/proc/self/mountinfo`. txbox's cgroups are created as
//!   *children* of that cgroup, so limits nest under whatever already limits txbox.
//! - [`limits`]: the limits a cgroup enforces ([`Limits`]) and which of them were hit
//!   ([`Exceeded`]), read from the kernel's counters by pure functions.
//! - [`lifecycle`]: one transaction step's cgroup ([`Cgroup`]): a directory per controller a
//!   limit needs (one on cgroup v2), limits written, processes added, hits read back, the whole
//!   tree killed, the directories removed (on [`Cgroup::remove`] or drop).
//! - [`probe`]: what this host supports, for `txbox doctor`; [`hints`]: what to do when
//!   something lacks; [`files`]: the one-write/one-read access cgroup files want.
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

mod files;
mod hints;
pub mod layout;
pub mod lifecycle;
pub mod limits;
pub mod probe;
#[cfg(test)]
mod testutil;

pub use layout::{CgroupLayout, CgroupMode, CgroupVersion, Controller, ControllerDir};
pub use lifecycle::Cgroup;
pub use limits::{Exceeded, Limits};
pub use probe::{probe, probe_layout, CgroupSupport, ControllerSupport};

use std::io;
use std::path::{Path, PathBuf};

/// Leaf cgroup (v2) txbox moves itself into when its own cgroup must enable controllers.
pub const SUPERVISOR_LEAF: &str = "txbox-supervisor";

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
