//! txbox as a library: the orchestration every front end shares, and how results are rendered.
//!
//! - [`engine`]: one command → one transaction (policy, sandbox, classify, commit/rollback, audit),
//!   the pipeline's order; its stages: [`execute`] (the command in the sandbox), `commit`
//!   (conflict check, commit, settling the result), [`audit`] (the entries), [`collect`]
//!   (dropping transaction directories, the background collector);
//! - [`request`]: what a run is asked to do and where (the request, the workspace with its
//!   state directory, the shared error), which the pipeline and [`session`] both depend on;
//! - [`result`]: what one transaction did (the JSON object of docs/DESIGN.md §4);
//! - [`judge`]: the commit-time policy on a change set (what is held for a person);
//! - [`options`]: limits and other run options, defined once for the CLI, HTTP, MCP and the
//!   configuration file, validated when parsed;
//! - [`api`]: what the agent-facing servers (`serve`, `mcp`) share: the workspaces and ceilings
//!   an operator set, requests, and errors in one shape;
//! - [`render`]: the human summary line and the JSON of docs/DESIGN.md §3–4;
//! - [`undo`]: undo committed transactions (`txbox undo`), as transactions of their own;
//!   [`retention`]: how much undo data is kept.

pub mod api;
pub mod audit;
pub mod caches;
pub mod collect;
mod commit;
pub mod config;
pub mod diff;
pub mod engine;
pub mod environ;
pub mod execute;
pub mod judge;
pub mod limits;
pub mod network;
pub mod options;
pub mod progress;
pub mod redact;
pub mod render;
pub mod request;
pub mod result;
pub mod retention;
pub mod session;
pub mod size;
mod timing;
pub mod undo;

pub use engine::run;
pub use request::{Command, RunRequest};
pub use result::{Outcome, RunResult};
