//! The limit model: what a cgroup enforces ([`Limits`]) and what its processes ran into
//! ([`Exceeded`]), decoded from the kernel's counter files by pure functions.
//!
//! May not touch the filesystem: [`super::lifecycle`] reads the files and hands the text here.

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

    /// The `limit_exceeded` name (docs/DESIGN.md §4): `memory` before `pids`.
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

/// The value of `key` in a flat-keyed cgroup file (`key value` per line).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next().and_then(|v| v.parse().ok())).flatten()
    })
}

/// v1: `memory.oom_control` (`oom_kill N`, kernel ≥ 4.13) and `memory.failcnt`.
pub(super) fn memory_usage_v1(oom_control: Option<&str>, failcnt: Option<&str>) -> Exceeded {
    let oom_kills = oom_control.and_then(|t| keyed(t, "oom_kill")).unwrap_or(0);
    let fails = failcnt.and_then(|t| t.trim().parse::<u64>().ok()).unwrap_or(0);
    Exceeded { memory: oom_kills > 0, memory_limit_hit: fails > 0 || oom_kills > 0, pids: false }
}

/// v2: `memory.events` (`max N`, `oom_kill N`).
pub(super) fn memory_usage_v2(events: Option<&str>) -> Exceeded {
    let t = events.unwrap_or("");
    let oom_kills = keyed(t, "oom_kill").unwrap_or(0);
    let max = keyed(t, "max").unwrap_or(0);
    Exceeded { memory: oom_kills > 0, memory_limit_hit: max > 0 || oom_kills > 0, pids: false }
}

/// v1 and v2: `pids.events` (`max N`).
pub(super) fn pids_hit(events: Option<&str>) -> bool {
    events.and_then(|t| keyed(t, "max")).unwrap_or(0) > 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

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
}
