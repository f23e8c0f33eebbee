//! The profiler of one run: phase timings printed to stderr when `TXBOX_TIMING` is set.

use std::time::{Duration, Instant};

/// Phase timings of one run, printed to stderr when `TXBOX_TIMING` is set: the documented
/// way to see where a transaction's time goes (docs/BENCHMARKS.md).
pub(crate) struct Timeline {
    pub(crate) enabled: bool,
    last: Instant,
    marks: Vec<(&'static str, Duration)>,
    /// Where the command ran: `warm`, or `cold (why no warm server took it)`.
    pub(crate) sandbox: Option<String>,
    /// How many entries recovery looked at (`RecoverStats`): must not grow with history.
    pub(crate) recovery_looked_at: Option<usize>,
}

impl Timeline {
    pub(crate) fn new(started: Instant) -> Timeline {
        Timeline {
            enabled: std::env::var_os("TXBOX_TIMING").is_some(),
            last: started,
            marks: Vec::new(),
            sandbox: None,
            recovery_looked_at: None,
        }
    }

    pub(crate) fn mark(&mut self, phase: &'static str) {
        if self.enabled {
            let now = Instant::now();
            self.marks.push((phase, now - self.last));
            self.last = now;
        }
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        if self.enabled {
            let parts: Vec<String> =
                self.marks.iter().map(|(p, d)| format!("{p} {:.3}", d.as_secs_f64() * 1e3)).collect();
            eprintln!("txbox timing (ms): {}", parts.join(", "));
            if let Some(s) = &self.sandbox {
                eprintln!("txbox sandbox: {s}");
            }
            if let Some(n) = self.recovery_looked_at {
                eprintln!("txbox recovery: looked at {n} entries");
            }
        }
    }
}
