//! Progress of long commits, on a terminal only (indicatif). The commit executor reports
//! through a plain `fn` pointer, so the bar lives here, process-wide.

use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// `CrashHook::progress` callback: (steps applied, steps in all).
pub fn commit_step(done: usize, total: usize) {
    let Ok(mut slot) = BAR.lock() else { return };
    let bar = slot.get_or_insert_with(|| {
        let b = ProgressBar::new(total as u64);
        if let Ok(style) = ProgressStyle::with_template("txbox: committing {pos}/{len} changes {bar:30} {elapsed}") {
            b.set_style(style);
        }
        b
    });
    bar.set_position(done as u64);
}

/// Clear the bar once the commit is over, whatever its outcome.
pub fn finish() {
    if let Ok(mut slot) = BAR.lock() {
        if let Some(b) = slot.take() {
            b.finish_and_clear();
        }
    }
}
