//! Network by allowlist (issue #15): what a sandboxed command may reach, and the proxy it reaches
//! it through.
//!
//! Pure parts, unit-tested without privileges:
//! - [`allow`]: `--allow-host` items, presets, matching, ceilings;
//! - [`addr`]: which addresses are public;
//! - [`http`]: the request heads the proxy reads;
//! - [`upstream`]: the caller's own proxy (`https_proxy`, `no_proxy`);
//! - [`report`]: what the proxy saw, for the result and the audit log;
//! - [`targets`]: the hosts a command line names, for the check before it runs.
//!
//! [`preset`] expands `@pypi` and friends from the caller's package managers (it runs them).
//!
//! The processes ([`process`]): a broker ([`broker`]), unconfined, the only part that resolves
//! names and connects, checking the allowlist itself; and the proxy ([`proxy`]), which reads
//! the sandbox's bytes and is confined first ([`confine`]).

pub mod addr;
pub mod allow;
pub mod broker;
pub mod confine;
mod fd;
pub mod http;
pub mod preset;
pub mod process;
pub mod proxy;
pub mod report;
pub mod targets;
pub mod upstream;

pub use allow::{Allowlist, Host, Preset, Rule, Spec, SpecError, Via};
pub use process::{start, Config, Running};
pub use report::{Connection, Report};
