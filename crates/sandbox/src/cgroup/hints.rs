//! Fix-it hints: what to tell the user when a controller is missing or a cgroup cannot be
//! created, by host mode and errno. Pure text; may not probe or touch anything.

use std::io;
use std::path::Path;

use super::{CgroupLayout, CgroupMode, CgroupVersion, Controller};

pub(super) const DELEGATE_HINT: &str = "run txbox as root, or in a delegated cgroup: \
     `systemd-run --user --scope -p Delegate=yes txbox ...`";

pub(super) fn missing_controller_hint(c: Controller, layout: &CgroupLayout) -> String {
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

pub(super) fn create_problem(dir: &Path, version: CgroupVersion, e: &io::Error) -> String {
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
