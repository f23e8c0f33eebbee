//! Waiting for children, in one place: the EINTR loop and the reaper every pid 1 needs.
//!
//! Owns only `waitpid`; may not kill, signal or decide what a status means to the caller.

use rustix::io::Errno;

/// Wait for child `pid` to end (EINTR retried); its raw wait status.
pub(crate) fn wait(pid: i32) -> Result<i32, Errno> {
    loop {
        let mut st = 0;
        // SAFETY: plain waitpid on our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid && (libc::WIFEXITED(st) || libc::WIFSIGNALED(st)) {
            return Ok(st);
        }
        if r < 0 {
            let e = crate::stage2::errno();
            if e != libc::EINTR {
                return Err(Errno::from_raw_os_error(e));
            }
        }
    }
}

/// As a pid namespace's init: reap every child (orphans reparent to us) until `pid` has
/// ended; its raw wait status, or `None` when no child is left before that.
pub(crate) fn reap_until(pid: i32) -> Option<i32> {
    loop {
        let mut st = 0;
        // SAFETY: waitpid on any child with a valid out-pointer.
        let r = unsafe { libc::waitpid(-1, &mut st, 0) };
        if r == pid {
            return Some(st);
        }
        if r < 0 && crate::stage2::errno() == libc::ECHILD {
            return None;
        }
    }
}

/// Reap until no child is left.
pub(crate) fn reap_all() {
    let _ = reap_until(0);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn wait_returns_the_status_and_then_echild() {
        // SAFETY: the child only leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(7) };
        }
        let st = wait(pid).unwrap();
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 7);
        assert_eq!(wait(pid), Err(Errno::CHILD));
    }
}
