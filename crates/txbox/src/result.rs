//! The result of one transaction (docs/DESIGN.md §4's JSON object) and how a command's fate becomes
//! one. Front ends read these types; only the engine and sessions fill them in.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use txbox_policy::Decision;
use txbox_sandbox::Exit;
use txbox_txn::audit::Counts;
use txbox_txn::meta::display_rel;
use txbox_txn::ChangeSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Committed,
    RolledBack,
    Denied,
    Pending,
    Conflict,
    Error,
    /// The commit-time policy held the change for a person: the transaction stays open until
    /// `txbox approve` commits it or `txbox rollback` drops it.
    Held,
}

/// The exit status of a run, `sh`, `exec --commit` or `commit` whose change is held for a person
/// (distinct from 3, 124, 125, 126 and 128+N).
pub const EXIT_HELD: i32 = 4;

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::RolledBack => "rolled_back",
            Outcome::Denied => "denied",
            Outcome::Pending => "pending",
            Outcome::Conflict => "conflict",
            Outcome::Error => "error",
            Outcome::Held => "held",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RollbackReason {
    ExitStatus,
    Validation,
    Timeout,
    Limit,
    Policy,
    Requested,
}

impl RollbackReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RollbackReason::ExitStatus => "exit_status",
            RollbackReason::Validation => "validation",
            RollbackReason::Timeout => "timeout",
            RollbackReason::Limit => "limit",
            RollbackReason::Policy => "policy",
            RollbackReason::Requested => "requested",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Changes {
    pub added: Vec<String>,
    pub modified: Vec<String>,
    pub deleted: Vec<String>,
}

impl Changes {
    pub fn of(cs: &ChangeSet) -> Changes {
        let f = |v: &Vec<PathBuf>| v.iter().map(|p| display_rel(p)).collect();
        Changes { added: f(&cs.added), modified: f(&cs.modified), deleted: f(&cs.deleted) }
    }

    pub fn counts(&self) -> Counts {
        Counts { added: self.added.len(), modified: self.modified.len(), deleted: self.deleted.len() }
    }
}

/// A change the commit-time policy holds for a person: the path, the rule and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldChange {
    pub path: String,
    pub rule: String,
    pub reason: String,
}

/// An extended attribute a commit did not carry: the path and the name the command set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DroppedXattr {
    pub path: String,
    pub name: String,
}

impl DroppedXattr {
    pub fn of(cs: &ChangeSet) -> Vec<DroppedXattr> {
        cs.dropped_xattrs
            .iter()
            .map(|(p, n)| DroppedXattr { path: display_rel(p), name: n.to_string_lossy().into_owned() })
            .collect()
    }
}

/// The result of one `run`, exactly the JSON object of docs/DESIGN.md §4.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub tx: String,
    pub decision: Decision,
    pub outcome: Outcome,
    pub rollback_reason: Option<RollbackReason>,
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub limit_exceeded: Option<String>,
    pub changes: Changes,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: f64,
    /// Why txbox itself failed or refused to commit (not part of the success path).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Paths in conflict, for `outcome: conflict`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<String>,
    /// For `outcome: held`: what the commit-time policy holds for a person, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldChange>,
    /// Special files (devices, FIFOs, sockets) the command made; never committed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Extended attributes off the commit allowlist (file capabilities, `security.*`,
    /// `trusted.*`, `user.overlay.*`, ...): set by the command, never committed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped_xattrs: Vec<DroppedXattr>,
    /// For `exec`: the step number this command ran as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// For `undo`: the transactions it undid, newest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub undone: Vec<String>,
    /// Transactions that are no longer undoable because of this one: their retained data was
    /// evicted (retention budget, or yielded to a nearly full disk); this one too if it could not
    /// be retained.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub no_longer_undoable: Vec<String>,
    /// What the command did with the network (`crate::network`): present with an allowlist, or
    /// when the command tried to reach a network it did not have.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::network::Summary>,
    /// For `outcome: committed`: the change is committed but applying it stopped (why, and what
    /// recovery needs); recovery, which every txbox command on the workspace runs first,
    /// applies the rest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_recovery: Option<String>,
    /// The outcome could not be written to the audit log (why). The outcome stands.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_error: Option<String>,
    /// Kept directories (build output) this transaction changed in the workspace: committed
    /// even when the command failed (then `changes` lists what of them landed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    /// A failed command's kept directories were not committed: why (the commit-time policy,
    /// the write limit, an error). The outcome stands.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_error: Option<String>,
}

impl RunResult {
    pub(crate) fn new(tx: String, decision: Decision) -> RunResult {
        RunResult {
            tx,
            decision,
            outcome: Outcome::Error,
            rollback_reason: None,
            exit_code: 125,
            signal: None,
            timed_out: false,
            limit_exceeded: None,
            changes: Changes::default(),
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 0.0,
            error: None,
            conflicts: Vec::new(),
            held: Vec::new(),
            skipped: Vec::new(),
            dropped_xattrs: Vec::new(),
            step: None,
            undone: Vec::new(),
            no_longer_undoable: Vec::new(),
            network: None,
            pending_recovery: None,
            audit_error: None,
            kept: Vec::new(),
            kept_error: None,
        }
    }
}

/// Copy a finished command's fate into the result; true when it succeeded (status 0).
pub(crate) fn record(r: &mut RunResult, executed: crate::execute::Executed) -> bool {
    r.network = executed.network;
    let finished = executed.finished;
    r.stdout = String::from_utf8_lossy(&finished.stdout).into_owned();
    r.stderr = String::from_utf8_lossy(&finished.stderr).into_owned();
    r.stdout_truncated = finished.stdout_truncated;
    r.stderr_truncated = finished.stderr_truncated;
    r.timed_out = finished.timed_out;
    match finished.exit {
        Exit::Code(c) => r.exit_code = c,
        Exit::Signal(s) => {
            r.signal = Some(s);
            r.exit_code = 128 + s;
        }
    }
    if finished.timed_out {
        r.exit_code = 124;
    }
    r.limit_exceeded = finished.limit.map(str::to_string);
    let ok = !finished.timed_out && finished.limit.is_none() && finished.exit == Exit::Code(0);
    if !ok {
        r.rollback_reason = Some(if finished.limit.is_some() {
            RollbackReason::Limit
        } else if finished.timed_out {
            RollbackReason::Timeout
        } else {
            RollbackReason::ExitStatus
        });
        if finished.limit.is_some() && r.exit_code == 0 {
            // A command stopped by a limit did not complete, whatever it returned.
            r.exit_code = 128 + libc::SIGKILL;
        }
    }
    ok
}

pub(crate) fn setup_failed(r: &mut RunResult, e: impl std::fmt::Display) {
    r.error = Some(e.to_string());
    r.outcome = Outcome::Error;
    r.exit_code = 125;
}

pub(crate) fn deny(r: &mut RunResult) {
    r.outcome = Outcome::Denied;
    r.exit_code = 126;
    r.rollback_reason = Some(RollbackReason::Policy);
}
