//! The one error of building a sandbox: which step failed, on which path, with which errno,
//! and what to do about it when that is known.
//!
//! Owns the wording of a failed step (`sandbox setup failed at `STEP PATH`: ERRNO (HINT)`),
//! which stage 2 reports to the launcher and a warm server gives as its reason; may not
//! touch the kernel.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

/// A step of building the sandbox failed.
#[derive(Debug, thiserror::Error)]
#[error("sandbox setup failed at `{}`: {}", self.what(), self.hint())]
pub struct StepError {
    /// What was being done: `unshare`, `mount overlay on`, `setrlimit Cpu`.
    pub step: Cow<'static, str>,
    /// What it was done to, when that is a path.
    pub path: Option<PathBuf>,
    pub errno: Errno,
}

impl StepError {
    pub fn new(step: impl Into<Cow<'static, str>>, errno: Errno) -> StepError {
        StepError { step: step.into(), path: None, errno }
    }

    /// `step` on `path` failed with `errno`.
    pub fn at_path(step: &'static str, path: &Path, errno: Errno) -> StepError {
        StepError { step: Cow::Borrowed(step), path: Some(path.to_path_buf()), errno }
    }

    /// `step` failed with the calling thread's last errno.
    pub fn last(step: &'static str) -> StepError {
        StepError::new(step, Errno::from_raw_os_error(crate::stage2::errno()))
    }

    /// `step` on `path` failed with an I/O error.
    pub fn io(step: &'static str, path: &Path, e: &std::io::Error) -> StepError {
        StepError::at_path(step, path, Errno::from_io_error(e).unwrap_or(Errno::IO))
    }

    /// The step and its path: `mount overlay on /work/repo`.
    pub fn what(&self) -> String {
        match &self.path {
            Some(p) => format!("{} {}", self.step, p.display()),
            None => self.step.to_string(),
        }
    }

    /// The error number, with what to do about it when that is known.
    pub fn hint(&self) -> String {
        let base = format!("{} (errno {})", self.errno, self.errno.raw_os_error());
        if self.step.starts_with("unshare") && matches!(self.errno, Errno::PERM | Errno::NOSPC) {
            return format!(
                "{base}; unprivileged user namespaces look disabled: enable them with \
                 `sysctl -w kernel.unprivileged_userns_clone=1` / `user.max_user_namespaces=15000`, or on \
                 Ubuntu `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (see `txbox doctor`)"
            );
        }
        if self.step.starts_with("mount overlay") {
            return format!(
                "{base}; overlayfs in a user namespace needs Linux ≥ 5.11 and an upper filesystem with user xattrs"
            );
        }
        base
    }
}

/// `map_err` for a step with no path: `.map_err(at("unshare"))`.
pub fn at(step: &'static str) -> impl FnOnce(Errno) -> StepError {
    move |errno| StepError::new(step, errno)
}

/// `map_err` for a step on a path; the path is copied only when the step failed.
pub fn at_path<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> StepError + 'a {
    move |errno| StepError::at_path(step, path, errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wording_names_step_path_and_errno() {
        let e = StepError::at_path("mount overlay on", Path::new("/w"), Errno::INVAL);
        let s = e.to_string();
        assert!(s.starts_with("sandbox setup failed at `mount overlay on /w`: "), "{s}");
        assert!(s.contains("(errno 22)") && s.contains("overlayfs in a user namespace"), "{s}");
        let s = StepError::new("unshare", Errno::PERM).to_string();
        assert!(s.contains("`unshare`") && s.contains("unprivileged user namespaces"), "{s}");
        assert_eq!(StepError::new(format!("drop capability {}", 21), Errno::PERM).what(), "drop capability 21");
    }
}
