//! What runs beside a command: limits that need watching (bytes written to the upper layer, which
//! no kernel knob counts, and, through cgroups, memory and process count), and early writeback
//! of the upper layer for commands that run long. Implements the sandbox's `Watch` hooks.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use txbox_txn::writeback::Writeback;

use txbox_sandbox::cgroup::{self, Cgroup};
use txbox_sandbox::{Exit, Finished, SandboxError, Watch};

use crate::engine::Limits;

pub struct Watcher {
    upper: PathBuf,
    max_write: Option<u64>,
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

impl Watcher {
    /// Set up what the limits need. A limit that cannot be enforced is an error, never ignored.
    pub fn new(upper: &Path, limits: &Limits) -> Result<Watcher, SandboxError> {
        let wanted = cgroup::Limits { memory: limits.memory, pids: limits.pids, cpu_seconds: None };
        let cgroup = if wanted.needs_cgroup() {
            let refuse = |e: cgroup::CgroupError| {
                SandboxError::Setup(format!(
                    "--memory/--pids need a cgroup, and none can be made here: {e} (see `txbox doctor`)"
                ))
            };
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
            // RLIMIT_FSIZE stops a single file at the limit (SIGXFSZ, or EFBIG for programs
            // that ignore it, like Python): the upper layer then holds at least the limit.
            if sig == Some(libc::SIGXFSZ) || (f.exit != Exit::Code(0) && upper_bytes(&self.upper) >= max) {
                return Some("write");
            }
        }
        None
    }
}

impl Watch for Watcher {
    fn started(&mut self, pid: u32) -> Result<(), String> {
        match &self.cgroup {
            Some(c) => c.add_pid(pid as i32).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    fn check(&mut self) -> Option<&'static str> {
        if self.writeback_due.is_some_and(|due| Instant::now() >= due) {
            self.writeback_due = None;
            // Failing to start it costs only time: the commit syncs regardless.
            self.writeback = Writeback::start(&self.upper, WRITEBACK_EVERY).ok();
        }
        // A process limit that bites or an OOM kill ends the transaction at once.
        if let Some(l) = self.cgroup.as_ref().and_then(|c| c.usage().limit_name(None)) {
            return Some(l);
        }
        match self.max_write {
            Some(max) if upper_bytes(&self.upper) > max => Some("write"),
            _ => None,
        }
    }
}

/// Bytes a layer occupies on disk (allocated blocks: a sparse file counts only its data).
pub fn upper_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else {
                total = total.saturating_add(md.blocks() * 512);
            }
        }
    }
    total
}
