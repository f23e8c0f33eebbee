//! Layout discovery: where this process's own cgroup is for each controller, from the text of
//! `/proc/self/cgroup` and `/proc/self/mountinfo` (pure parsing, plus for cgroup v2 one read of
//! `cgroup.controllers`; every path goes through a root prefix so tests use fake trees).
//!
//! Owns the vocabulary (versions, modes, controllers). May not create, write or remove
//! anything: that is [`super::lifecycle`]'s.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use super::files::read_to_string;
use super::{CgroupError, SUPERVISOR_LEAF};

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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::cgroup::testutil::*;
    use crate::cgroup::{Cgroup, Limits};

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
}
