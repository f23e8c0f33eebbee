//! The syscall edge of txbox: namespaces, the mount plan, the stage-2 helper, process
//! supervision and output capture. The only crate with much `unsafe`. Each module opens with
//! what it owns and what it may not touch.
//!
//! - [`spec`]: the sandbox spec and the mount plan, as data (pure, unit-tested);
//! - [`stage2`]: the re-exec'd helper that builds the sandbox, its order written once, generic
//!   over `kernel::Kernel` (the syscall seam, whose recording fake pins the order in tests);
//! - [`step`]: the one error of a setup step (step, path, errno); `reap`: every wait loop;
//! - [`launch`]: the host side that starts it, captures output and enforces the timeout;
//! - [`net`]: the proxy's listener inside the sandbox, and counting attempts to reach the network;
//! - [`warm`]: sandboxes built ahead of time by a server and reused, one transaction at a time;
//! - [`supervisor`]: no host unix socket is reachable from inside (Landlock, or a seccomp
//!   supervisor that performs `connect` and sends by address after a check);
//! - [`cgroup`]: memory and pids limits (layout, limit model, lifecycle, probe);
//! - [`landlock`], [`seccomp`], [`secrets`]: the confinement and what is hidden, as data first;
//! - [`terminal`]: the command's own terminal, relayed; [`fds`]: nothing inherited goes on.
//!
//! May not: know about transactions (the `txn` crate) or policy; the caller hands a spec.

pub mod cgroup;
pub mod fds;
mod kernel;
pub mod landlock;
pub mod launch;
pub mod net;
mod reap;
pub mod seccomp;
pub mod secrets;
pub mod spec;
pub mod stage2;
pub mod step;
pub mod supervisor;
pub mod terminal;
pub mod warm;

pub use launch::{launch, shell_argv, Exit, Finished, LaunchOptions, SandboxError, WarmUse, Watch};
pub use spec::{MountOp, MountPlan, SandboxSpec};
