//! txbox as a library: the orchestration every front end shares, and how results are rendered.
//!
//! - [`engine`]: one command → one transaction (policy, sandbox, classify, commit/rollback, audit);
//! - [`render`]: the human summary line and the JSON of DESIGN §3;
//! - [`undo`]: undo committed transactions (`txbox undo`), as transactions of their own;
//!   [`retention`]: how much undo data is kept.

pub mod diff;
pub mod engine;
pub mod limits;
pub mod progress;
pub mod render;
pub mod retention;
pub mod session;
pub mod size;
pub mod undo;

pub use engine::{run, Command, Outcome, RunRequest, RunResult};
