//! Access to cgroup interface files: one `write(2)` of the whole value (never creating the file),
//! whole-file reads, the list of member processes. Owns no policy; may not interpret contents.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::CgroupError;

/// One `write(2)` of the whole value, as cgroup files want; never creates the file.
pub(super) fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).truncate(true).open(path)?;
    f.write_all(value.as_bytes())
}

pub(super) fn read_to_string(step: &'static str, path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(CgroupError::io(step, path))
}

pub(super) fn read_opt(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok()
}

pub(super) fn list_procs(dir: &Path) -> Vec<i32> {
    read_opt(&dir.join("cgroup.procs"))
        .map(|s| s.split_whitespace().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}
