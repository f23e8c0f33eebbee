//! txbox as a library: the orchestration every front end shares, and how results are rendered.
//!
//! - [`engine`]: one command → one transaction (policy, sandbox, classify, commit/rollback, audit);
//! - [`render`]: the human summary line and the JSON of DESIGN §3.

pub mod diff;
pub mod engine;
pub mod limits;
pub mod network;
pub mod progress;
pub mod render;
pub mod session;
pub mod size;

pub use engine::{run, Command, Outcome, RunRequest, RunResult};
