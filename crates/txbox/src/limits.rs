//! What runs beside a command: limits that need watching (bytes written to the upper layer, which
//! no kernel knob counts, and, through cgroups, memory and process count), and early writeback
//! of the upper layer for commands that run long. Implements the sandbox's `Watch` hooks.
//!
//! Also the default limits of a run that gives none ([`with_defaults`], [`default_procs`]),
//! enforced without cgroups so that every run can have them (and warm sandboxes serve them):
//! a wall-clock timeout, a write limit (watched here, and checked on the change set before
//! commit), RLIMIT_NPROC, and the command as the OOM killer's first choice.
//! A default the host cannot enforce is skipped, never a reason to refuse a run.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use txbox_txn::writeback::Writeback;

use txbox_sandbox::cgroup::{self, Cgroup};
use txbox_sandbox::{Exit, Finished, SandboxError, Watch};

use crate::request::Limits;

pub struct Watcher {
    upper: PathBuf,
    max_write: Option<u64>,
    /// Bytes in use on the upper layer's filesystem when the command started: the layer is
    /// walked only once the filesystem grew by more than the write limit.
    fs_used_start: Option<u64>,
    cpu_seconds: Option<u64>,
    /// Present when --memory or --pids asked for one; removed (after killing what is left) on drop.
    cgroup: Option<Cgroup>,
    /// When to start early writeback; None once tried.
    writeback_due: Option<Instant>,
    /// Stops when the watcher is dropped.
    writeback: Option<Writeback>,
}

/// A command still running after this long starts early writeback of its layer. Shorter ones
/// write little, and should not pay for a thread, nor, when they fail, for flushed writes.
const WRITEBACK_AFTER: Duration = Duration::from_millis(100);
/// How often early writeback flushes. On this project's machine, 10,000 new files: the commit
/// phase drops from ~120 ms to ~60 ms (what is left is mostly classification), and the
/// command, which shares the disk with the flushes, slows by less (docs/BENCHMARKS.md).
const WRITEBACK_EVERY: Duration = Duration::from_millis(100);

/// [`WRITEBACK_EVERY`], or `TXBOX_WRITEBACK_MS` when set (0: no early writeback), for measuring
/// on a given disk. Read only when a command has run long enough to get it.
fn writeback_every() -> Option<Duration> {
    writeback_every_from(std::env::var("TXBOX_WRITEBACK_MS").ok().as_deref())
}

/// The interval `TXBOX_WRITEBACK_MS` (its value `v`, if set) asks for: None for 0, the default
/// when unset or not a number of milliseconds.
fn writeback_every_from(v: Option<&str>) -> Option<Duration> {
    match v.and_then(|v| v.parse::<u64>().ok()) {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None => Some(WRITEBACK_EVERY),
    }
}

impl Watcher {
    /// Set up what the limits need. A limit that cannot be enforced is an error, never ignored.
    pub fn new(upper: &Path, limits: &Limits) -> Result<Watcher, SandboxError> {
        let wanted = cgroup::Limits { memory: limits.memory, pids: limits.pids, cpu_seconds: None };
        let cgroup = if wanted.needs_cgroup() {
            let refuse = SandboxError::NoCgroup;
            let layout = cgroup::CgroupLayout::detect().map_err(refuse)?;
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some(Cgroup::create(&layout, &format!("txbox-{}-{n}", std::process::id()), &wanted).map_err(refuse)?)
        } else {
            None
        };
        Ok(Watcher {
            upper: upper.to_path_buf(),
            max_write: limits.max_write,
            fs_used_start: limits.max_write.and_then(|_| fs_used(upper)),
            cpu_seconds: limits.cpu_seconds,
            cgroup,
            writeback_due: Some(Instant::now() + WRITEBACK_AFTER),
            writeback: None,
        })
    }

    /// Whether stage 2 must wait to be attached before starting the command.
    pub fn needs_sync(&self) -> bool {
        self.cgroup.is_some()
    }

    /// After the command: name the limit that stopped it, if one did.
    pub fn after(&mut self, f: &Finished) -> Option<&'static str> {
        let sig = match f.exit {
            Exit::Signal(s) => Some(s),
            Exit::Code(_) => None,
        };
        if let Some(l) = self.cgroup.as_ref().and_then(|c| c.usage().limit_name(sig)) {
            return Some(l);
        }
        if self.cpu_seconds.is_some() && matches!(sig, Some(libc::SIGXCPU) | Some(libc::SIGKILL)) {
            return Some("cpu");
        }
        if let Some(max) = self.max_write {
            // A command that failed over the limit is reported as stopped by it (one that
            // exited 0 is checked on its change set, before commit).
            if f.exit != Exit::Code(0) && self.may_exceed(max) && upper_bytes(&self.upper) > max {
                return Some("write");
            }
        }
        None
    }
}

impl Watch for Watcher {
    fn started(&mut self, pid: u32) -> Result<(), cgroup::CgroupError> {
        match &self.cgroup {
            Some(c) => c.add_pid(pid as i32),
            None => Ok(()),
        }
    }

    fn check(&mut self) -> Option<&'static str> {
        if self.writeback_due.is_some_and(|due| Instant::now() >= due) {
            self.writeback_due = None;
            // Failing to start it costs only time: the commit syncs regardless.
            self.writeback = writeback_every().and_then(|every| Writeback::start(&self.upper, every).ok());
        }
        // A process limit that bites or an OOM kill ends the transaction at once.
        if let Some(l) = self.cgroup.as_ref().and_then(|c| c.usage().limit_name(None)) {
            return Some(l);
        }
        match self.max_write {
            Some(max) if self.may_exceed(max) && upper_bytes(&self.upper) > max => Some("write"),
            _ => None,
        }
    }
}

impl Watcher {
    /// Whether the layer may hold more than `max` bytes: its filesystem grew by more than that
    /// since the start (one `statvfs`; walking the layer ten times a second cost a busy
    /// command's layer a full scan each time). Unknown growth: yes.
    fn may_exceed(&self, max: u64) -> bool {
        match (self.fs_used_start, fs_used(&self.upper)) {
            (Some(start), Some(now)) => now.saturating_sub(start) > max,
            _ => true,
        }
    }
}

/// Bytes in use on the filesystem holding `dir`.
fn fs_used(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    st.f_blocks.checked_sub(st.f_bfree)?.checked_mul(st.f_frsize)
}

/// The wall-clock limit of a run that gives none: long enough for any build an agent waits
/// for, short enough that a command that never ends (a server in the foreground, a hung
/// test, a miner) does not hold a sandbox, a warm server and the caller forever.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
/// The default write limit is never below this, so that a nearly full filesystem still runs
/// commands that write little (their writes fail with ENOSPC, as natively).
const MIN_DEFAULT_WRITE: u64 = 1 << 30;
/// The default process limit: at least this many processes and threads, ...
const MIN_DEFAULT_PROCS: u64 = 4096;
/// ... or this many per CPU, for builds that scale with the machine.
const PROCS_PER_CPU: u64 = 64;

/// `given` with the defaults filled in where it says nothing: [`DEFAULT_TIMEOUT`], and a write
/// limit of half the space available on the workspace's filesystem now (at least 1 GiB), so
/// that a command cannot fill the disk the host lives on. Output needs no default here: what
/// is captured is truncated at `request::DEFAULT_CAPTURE` per stream, what streams through
/// costs nothing. Memory and processes: see [`default_procs`] and the sandbox's
/// `oom_score_adj`.
pub fn with_defaults(given: &Limits, workspace: &Path) -> Limits {
    let mut l = given.clone();
    l.timeout = l.timeout.or(Some(DEFAULT_TIMEOUT));
    if l.max_write.is_none() {
        l.max_write = default_write(workspace);
    }
    l
}

/// The defaults as a ceiling, for judging a configuration file a command could have written
/// (`config::Config::widening`): a limit above one of these widens what a run gets by default.
/// The write limit's default depends on the disk, so its smallest value stands for it.
pub fn defaults_ceiling() -> crate::options::LimitArgs {
    use crate::options::{LimitArgs, MaxWrite, Pids, Seconds};
    LimitArgs {
        timeout: Seconds::new(DEFAULT_TIMEOUT.as_secs_f64()).ok(),
        pids: Pids::new(default_proc_count()).ok(),
        max_write: MaxWrite::new(MIN_DEFAULT_WRITE).ok(),
        ..LimitArgs::default()
    }
}

/// Half the space available to this user on `workspace`'s filesystem, at least
/// [`MIN_DEFAULT_WRITE`]; None (no default) when the filesystem does not say.
pub fn default_write(workspace: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(workspace).ok()?;
    let avail = st.f_bavail.checked_mul(st.f_frsize)?;
    Some((avail / 2).max(MIN_DEFAULT_WRITE))
}

/// RLIMIT_NPROC for a run that does not limit processes with a cgroup (`--pids`):
/// max(4096, 64 per CPU). An unprivileged run's user namespace makes it count the sandbox's
/// own processes; for root the kernel does not apply it (`txbox doctor` says so), and the pid
/// namespace still ends every process with the command.
pub fn default_procs(limits: &Limits) -> Option<u64> {
    if limits.pids.is_some() {
        return None;
    }
    Some(default_proc_count())
}

/// max([`MIN_DEFAULT_PROCS`], [`PROCS_PER_CPU`] per CPU this process may use), the CPUs
/// counted as `std::thread::available_parallelism` counts them (the affinity mask, lowered by
/// a cgroup CPU quota: a dozen syscalls) only when the count can matter.
fn default_proc_count() -> u64 {
    let affinity = rustix::thread::sched_getaffinity(None).ok().map(|set| u64::from(set.count()));
    proc_count(affinity, || std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// [`default_proc_count`] from the affinity mask's count (`affinity`, None if unknown) and the
/// full count (`cpus`, called only when needed). The quota only ever lowers the count below
/// the affinity's, so when the affinity's gives no more than the minimum, the full count
/// would give the minimum too: one syscall then, not a dozen.
fn proc_count(affinity: Option<u64>, cpus: impl FnOnce() -> u64) -> u64 {
    let per_cpu = |n: u64| MIN_DEFAULT_PROCS.max(n.saturating_mul(PROCS_PER_CPU));
    match affinity {
        Some(n) if n > 0 && per_cpu(n) == MIN_DEFAULT_PROCS => MIN_DEFAULT_PROCS,
        _ => per_cpu(cpus()),
    }
}

/// Whether a finished step's layer holds more than the write limit (walked: the precise
/// check for a step that exited 0 before the watcher looked).
pub fn over_write_limit(upper: &Path, limits: &Limits) -> bool {
    limits.max_write.is_some_and(|max| upper_bytes(upper) > max)
}

/// Bytes a layer occupies on disk: allocated blocks of everything in it, directories
/// included, a hard-linked inode once (a sparse file counts only its data, `fallocate`d space
/// in full), as `ChangeSet::bytes` counts what a commit moves in.
pub fn upper_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut linked = std::collections::HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else if md.nlink() > 1 && !linked.insert(md.ino()) {
                continue;
            }
            total = total.saturating_add(md.blocks().saturating_mul(512));
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_writeback_interval_from_the_environment() {
        assert_eq!(writeback_every_from(None), Some(WRITEBACK_EVERY));
        assert_eq!(writeback_every_from(Some("0")), None);
        assert_eq!(writeback_every_from(Some("250")), Some(Duration::from_millis(250)));
        for junk in ["", "-5", "1.5", "ten", " 10"] {
            assert_eq!(writeback_every_from(Some(junk)), Some(WRITEBACK_EVERY), "{junk:?}");
        }
    }

    #[test]
    fn the_process_default_counts_cpus_fully_only_when_they_can_matter() {
        let never = || -> u64 { panic!("the full count is not needed") };
        assert_eq!(proc_count(Some(2), never), MIN_DEFAULT_PROCS);
        assert_eq!(proc_count(Some(MIN_DEFAULT_PROCS / PROCS_PER_CPU), never), MIN_DEFAULT_PROCS);
        // Above the minimum the cgroup quota may lower the count: asked, and it wins.
        assert_eq!(proc_count(Some(128), || 8), MIN_DEFAULT_PROCS);
        assert_eq!(proc_count(Some(128), || 100), 100 * PROCS_PER_CPU);
        // Affinity unknown (or an empty mask): the full count.
        assert_eq!(proc_count(None, || 100), 100 * PROCS_PER_CPU);
        assert_eq!(proc_count(Some(0), || 1), MIN_DEFAULT_PROCS);
        // The same answer as counting fully, here.
        let full = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        assert_eq!(default_proc_count(), MIN_DEFAULT_PROCS.max(full * PROCS_PER_CPU));
    }

    #[test]
    fn defaults_fill_only_what_is_not_given() {
        let dir = std::env::temp_dir();
        let d = with_defaults(&Limits::default(), &dir);
        assert_eq!(d.timeout, Some(DEFAULT_TIMEOUT));
        assert!(d.max_write.is_some_and(|w| w >= MIN_DEFAULT_WRITE));
        let given = Limits { timeout: Some(Duration::from_secs(5)), max_write: Some(7), ..Limits::default() };
        let d = with_defaults(&given, &dir);
        assert_eq!((d.timeout, d.max_write), (Some(Duration::from_secs(5)), Some(7)));
        // A filesystem that does not say gets no default write limit (never a refusal).
        assert_eq!(default_write(Path::new("/nonexistent/txbox")), None);
        assert!(default_procs(&Limits::default()).is_some_and(|n| n >= MIN_DEFAULT_PROCS));
        assert_eq!(default_procs(&Limits { pids: Some(10), ..Limits::default() }), None);
    }

    #[test]
    fn layer_bytes_count_blocks_once_per_inode() -> std::io::Result<()> {
        let d = std::env::temp_dir().join(format!("txbox-upper-bytes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub"))?;
        std::fs::write(d.join("sub/a"), vec![1u8; 100_000])?;
        std::fs::hard_link(d.join("sub/a"), d.join("b"))?;
        std::fs::File::create(d.join("sparse"))?.set_len(1 << 30)?;
        let blocks = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.blocks() * 512);
        let want = blocks(&d.join("sub"))? + blocks(&d.join("sub/a"))? + blocks(&d.join("sparse"))?;
        assert_eq!(upper_bytes(&d), want);
        std::fs::remove_dir_all(&d)
    }
}
