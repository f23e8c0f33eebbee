//! Early writeback: while a long command runs, flush its layer's filesystem in the background,
//! so that the commit's durability flush (fsyncs of its files before the commit record, or
//! `syncfs` for a large one: `durable::before_record`) finds little left
//! to write. The disk then works while the command computes, instead of after it.
//!
//! Only a speed-up: the commit syncs regardless, so a flush that fails or never runs changes
//! nothing but time. A rolled-back transaction wastes the writes flushed early; that is why
//! only commands that run long enough to have written much get it (see the caller).

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use rustix::fs::{Mode, OFlags};

/// A background thread that runs `syncfs` on one filesystem every `every` until dropped.
pub struct Writeback {
    /// Dropping it (or a message) ends the thread after its current flush.
    _stop: Sender<()>,
    flushes: Arc<AtomicUsize>,
}

impl Writeback {
    /// Start flushing the filesystem that holds `dir`: once at once, then every `every`.
    pub fn start(dir: &Path, every: Duration) -> io::Result<Writeback> {
        let fd: OwnedFd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        let (stop, stopped) = mpsc::channel::<()>();
        let flushes = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&flushes);
        // Not joined: a flush in progress can take seconds (a 1 GiB file), and neither a
        // rollback nor the commit, which syncs again itself, should wait for it here.
        std::thread::Builder::new().name("txbox-writeback".into()).spawn(move || loop {
            if rustix::fs::syncfs(&fd).is_ok() {
                count.fetch_add(1, Ordering::Relaxed);
            }
            match stopped.recv_timeout(every) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            }
        })?;
        Ok(Writeback { _stop: stop, flushes })
    }

    /// Flushes completed so far.
    pub fn flushes(&self) -> usize {
        self.flushes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn tempdir(tag: &str) -> io::Result<std::path::PathBuf> {
        let d = std::env::temp_dir().join(format!("txbox-writeback-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    #[test]
    fn flushes_repeatedly_until_dropped() -> io::Result<()> {
        let d = tempdir("repeat")?;
        let wb = Writeback::start(&d, Duration::from_millis(5))?;
        let until = Instant::now() + Duration::from_secs(20);
        while wb.flushes() < 3 {
            assert!(Instant::now() < until, "no third flush in 20 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        let flushes = Arc::clone(&wb.flushes);
        drop(wb);
        // The thread stops after the flush it may be in: at most one more.
        std::thread::sleep(Duration::from_millis(100));
        let after = flushes.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(flushes.load(Ordering::Relaxed), after, "still flushing after drop");
        std::fs::remove_dir_all(&d)
    }

    #[test]
    fn dropping_does_not_wait_for_the_next_flush() -> io::Result<()> {
        let d = tempdir("stop")?;
        // With an hour between flushes, only the first runs; a drop that waited for the
        // interval would hang this test.
        let wb = Writeback::start(&d, Duration::from_secs(3600))?;
        let flushes = Arc::clone(&wb.flushes);
        drop(wb);
        let until = Instant::now() + Duration::from_secs(20);
        while Arc::strong_count(&flushes) > 1 {
            assert!(Instant::now() < until, "writeback thread still alive 20 s after drop");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(flushes.load(Ordering::Relaxed) <= 1);
        std::fs::remove_dir_all(&d)
    }

    #[test]
    fn a_missing_directory_is_an_error() -> io::Result<()> {
        let d = tempdir("missing")?;
        assert!(Writeback::start(&d.join("absent"), Duration::from_millis(5)).is_err());
        std::fs::remove_dir_all(&d)
    }
}
