//! txbox policy: decide, before anything runs, whether a command is denied, allowed, or run as a
//! transaction. Pure code: no syscalls, no filesystem access, so every rule is unit-testable.
//!
//! The public surface is [`Policy`], [`Context`], [`Evaluation`] and [`Decision`]. Front ends and
//! the transaction layer depend only on these types, so the engine behind them can grow
//! (full shell parsing, policy files) without changing its callers.

mod minimal;

use std::path::PathBuf;

use serde::Serialize;

/// What the engine decided. Strictest wins when several rules match: `Deny` > `Transact` > `Allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Transact,
    Deny,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Transact => "transact",
            Action::Deny => "deny",
        }
    }
}

/// A decision with the rule that produced it and a one-line reason an agent can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub action: Action,
    pub rule: Option<String>,
    pub reason: String,
}

impl Decision {
    /// The decision when no rule matched: run the command as a transaction.
    pub fn default_transact() -> Self {
        Decision {
            action: Action::Transact,
            rule: None,
            reason: "no rule matched; the command runs as a transaction".to_string(),
        }
    }
}

/// Where the command would run: used to classify path arguments (inside the workspace, home, ...).
#[derive(Debug, Clone)]
pub struct Context {
    pub workspace: PathBuf,
    pub cwd: PathBuf,
    pub home: Option<PathBuf>,
}

/// The result of evaluating one command string or argv.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub decision: Decision,
    /// The canonical argv of every command the engine extracted.
    pub commands: Vec<Vec<String>>,
}

/// A loaded policy. Today only the built-in default exists.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    _private: (),
}

impl Policy {
    /// The built-in default policy.
    pub fn builtin() -> Self {
        Policy { _private: () }
    }

    /// Evaluate a shell string as `bash -c` would run it.
    pub fn evaluate_str(&self, command: &str, ctx: &Context) -> Evaluation {
        minimal::evaluate(&minimal::split_commands(command), ctx)
    }

    /// Evaluate an argv (the `run -- PROGRAM ARGS` form). Arguments are taken literally.
    pub fn evaluate_argv(&self, argv: &[String], ctx: &Context) -> Evaluation {
        minimal::evaluate(&[argv.to_vec()], ctx)
    }
}
