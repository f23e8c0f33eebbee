//! Descriptors a process inherited and must not pass on.
//!
//! Whatever the caller of txbox left open beyond stdin, stdout and stderr (a directory the
//! sandbox hides, a host file) would otherwise reach the command, which could then read or
//! write it through `/proc/self/fd/N`, whatever the mount plan hides. Every process txbox
//! executes (stage 2, the warm server, the collector, the command) starts from 0-2 and the
//! descriptors txbox itself installs. All of these functions are async-signal-safe.
//!
//! Owns closing and marking descriptors of the calling process; may not open anything.

/// `close_range(first, last, flags)`; false where the kernel lacks it (before 5.9; 5.11 for
/// `CLOSE_RANGE_CLOEXEC`).
fn close_range(first: u32, last: u32, flags: u32) -> bool {
    if first > last {
        return true;
    }
    // SAFETY: close_range takes integers only; closing descriptors this process owns.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) == 0 }
}

/// Mark every descriptor from `first` on close-on-exec: the next `execve` drops them. For the
/// step right before an exec (the command), and in a child between fork and exec, where
/// descriptors still in use (the standard library's exec-error pipe) must stay open until then.
pub fn cloexec_from(first: u32) -> bool {
    close_range(first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) || close_each(first, libc::F_SETFD)
}

/// Close every descriptor from `first` on, except those in `keep` (sorted ascending).
pub fn close_from_except(first: u32, keep: &[u32]) -> bool {
    let mut from = first;
    let mut ok = true;
    for &k in keep.iter().filter(|&&k| k >= first) {
        if k > from {
            ok &= close_range(from, k - 1, 0);
        }
        from = k + 1;
    }
    ok & close_range(from, u32::MAX, 0)
}

/// The slow way for kernels without `close_range`: each possible number up to the soft
/// limit. `how`: `F_SETFD` to mark close-on-exec.
fn close_each(first: u32, how: libc::c_int) -> bool {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    let max = if got { lim.rlim_cur.min(1 << 20) as i32 } else { 1024 };
    for fd in first as i32..max {
        // SAFETY: fcntl on a descriptor number; EBADF for ones that are not open.
        unsafe { libc::fcntl(fd, how, libc::FD_CLOEXEC) };
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn open_at(n: i32) {
        // SAFETY: opening /dev/null and moving it to a chosen number in a test process.
        unsafe {
            let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
            assert!(fd >= 0);
            // `n` may be the lowest free number (the harness's other threads hold what they
            // hold when the child forks): then it is already there, and must stay open.
            if fd != n {
                assert_eq!(libc::dup2(fd, n), n);
                libc::close(fd);
            }
        }
    }

    fn is_open(n: i32) -> bool {
        // SAFETY: F_GETFD only queries.
        unsafe { libc::fcntl(n, libc::F_GETFD) >= 0 }
    }

    /// In a forked child: the test harness has threads and descriptors of its own.
    fn in_child(f: fn() -> bool) -> bool {
        // SAFETY: the child only makes syscalls and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(i32::from(!f())) };
        }
        let mut st = 0;
        // SAFETY: reaping our child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0
    }

    #[test]
    fn closes_all_but_the_kept_ones() {
        assert!(in_child(|| {
            for n in [5, 6, 9, 200, 1000] {
                open_at(n);
            }
            close_from_except(3, &[6, 200])
                && !is_open(5)
                && is_open(6)
                && !is_open(9)
                && is_open(200)
                && !is_open(1000)
        }));
    }

    #[test]
    fn marks_close_on_exec() {
        assert!(in_child(|| {
            open_at(7);
            // SAFETY: F_GETFD only queries.
            cloexec_from(3) && is_open(7) && unsafe { libc::fcntl(7, libc::F_GETFD) } & libc::FD_CLOEXEC != 0
        }));
    }
}
