//! Progress of long commits, on a terminal only (indicatif). The commit executor reports
//! through a plain `fn` pointer, so the bar lives here, one per thread: a commit runs on one
//! thread from start to end, and concurrent commits under `serve` (each on its own blocking
//! thread) each get their own bar instead of sharing one.

use std::cell::RefCell;

use indicatif::{ProgressBar, ProgressStyle};

thread_local! {
    static BAR: RefCell<Option<ProgressBar>> = const { RefCell::new(None) };
}

/// `CrashHook::progress` callback: (steps applied, steps in all).
pub fn commit_step(done: usize, total: usize) {
    BAR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let bar = slot.get_or_insert_with(|| {
            let b = ProgressBar::new(total as u64);
            if let Ok(style) = ProgressStyle::with_template("txbox: committing {pos}/{len} changes {bar:30} {elapsed}")
            {
                b.set_style(style);
            }
            b
        });
        bar.set_position(done as u64);
    });
}

/// Clear this thread's bar once the commit is over, whatever its outcome.
pub fn finish() {
    BAR.with(|slot| {
        if let Some(b) = slot.borrow_mut().take() {
            b.finish_and_clear();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_has_its_own_bar() {
        commit_step(1, 10);
        let other = std::thread::spawn(|| {
            let before = BAR.with(|s| s.borrow().is_some());
            commit_step(3, 5);
            let len = BAR.with(|s| s.borrow().as_ref().and_then(ProgressBar::length));
            finish();
            (before, len)
        })
        .join()
        .unwrap_or((true, None));
        assert_eq!(other, (false, Some(5)), "another thread starts a bar of its own");
        assert_eq!(BAR.with(|s| s.borrow().as_ref().map(ProgressBar::position)), Some(1), "ours is untouched");
        finish();
        assert!(BAR.with(|s| s.borrow().is_none()));
    }
}
