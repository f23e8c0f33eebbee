//! Fake cgroup trees and the mountinfo of real hosts, shared by the tests of every module.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

/// A scratch directory standing in for `/`, removed on drop.
pub(crate) struct Fake(pub(crate) PathBuf);

impl Fake {
    pub(crate) fn new(tag: &str) -> Fake {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let p = std::env::temp_dir().join(format!("txbox-cgtest-{}-{tag}-{nanos}", std::process::id()));
        fs::create_dir_all(&p).unwrap();
        Fake(p)
    }
    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel.trim_start_matches('/'))
    }
    /// Create `rel` with `content`, and its parent directories.
    pub(crate) fn file(&self, rel: &str, content: &str) -> PathBuf {
        let p = self.path(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, content).unwrap();
        p
    }
    pub(crate) fn dir(&self, rel: &str) -> PathBuf {
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
pub(crate) const HYBRID_CGROUP: &str = "\
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
pub(crate) const HYBRID_MOUNTINFO: &str = "\
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

pub(crate) const V2_CGROUP: &str = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n";
pub(crate) const V2_MOUNTINFO: &str = "\
27 1 8:1 / / rw,relatime - ext4 /dev/vda rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
pub(crate) const V2_DIR: &str = "sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope";

pub(crate) fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap()
}
