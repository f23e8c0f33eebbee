//! `txbox undo`: undo committed transactions as a transaction of its own
//! (`txbox_txn::undo`), audited and reported like a `run`: outcome `committed`, `conflict`
//! (exit 3, nothing changed) or `error` (exit 125, nothing changed, e.g. not undoable any more).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Value};
use txbox_policy::{Action, CommitAction, Decision, Policy};
use txbox_txn::meta::display_rel;
use txbox_txn::retain::{self, Undoability};
use txbox_txn::undo::{self as txn_undo, Target, UndoOptions};
use txbox_txn::{CrashHook, StateDir};

use crate::audit::audit;
use crate::collect::start_retention_collector;
use crate::request::{Command, EngineError, Env};
use crate::result::{Changes, Outcome, RollbackReason, RunResult};

/// What to undo, where.
#[derive(Debug, Clone)]
pub struct UndoRequest {
    pub workspace: PathBuf,
    pub state_dir: Option<PathBuf>,
    pub target: Target,
    /// An agent's undo (`serve`, `mcp`): what it would put back or remove is judged by this
    /// policy's commit rules as a commit would be, and what they hold or deny is refused
    /// (approving is a person's). None: a person's undo on the command line.
    pub judged_by: Option<Policy>,
}

/// The command line an undo is audited as.
pub fn describe(target: &Target) -> String {
    match target {
        Target::Last => "undo".to_string(),
        Target::Tx(id) => format!("undo {id}"),
        Target::To(id) => format!("undo --to {id}"),
    }
}

/// Undo, audit, report.
pub fn undo(req: &UndoRequest) -> Result<RunResult, EngineError> {
    let started = Instant::now();
    let env = Env::open(&req.workspace, req.state_dir.as_deref())?;
    env.state.check_same_fs(&env.workspace)?;
    let budget = crate::retention::budget().map_err(EngineError::Usage)?;
    let what = describe(&req.target);
    let decision = Decision { action: Action::Transact, rule: None, reason: format!("{what} requested") };
    let mut hook = CrashHook::from_env();
    let vet = |t: &txn_undo::Touched| -> Result<(), String> {
        let Some(policy) = &req.judged_by else { return Ok(()) };
        let findings = crate::judge::judge_undo(policy, &env.workspace, t);
        match findings.iter().find(|f| f.action != CommitAction::Allow) {
            None => Ok(()),
            Some(f) => Err(format!(
                "undo refused by rule {}: {}; it would change files the host runs by itself, which only a person \
                 may approve: run `txbox undo` on the command line",
                f.rule, f.reason
            )),
        }
    };
    let result =
        txn_undo::undo_vetted(&env.state, &env.workspace, &req.target, &UndoOptions { budget }, Some(&vet), &mut hook);
    let mut r = RunResult::new(String::new(), decision);
    match result {
        Ok(u) => {
            r.tx = u.tx;
            r.undone = u.undone;
            if u.conflicts.is_empty() {
                r.outcome = Outcome::Committed;
                r.exit_code = 0;
                let f = |v: &Vec<PathBuf>| v.iter().map(|p| display_rel(p)).collect();
                r.changes = Changes {
                    added: f(&u.changes.added),
                    modified: f(&u.changes.modified),
                    deleted: f(&u.changes.deleted),
                };
                r.no_longer_undoable = u.evicted;
                if u.collector {
                    start_retention_collector(&env.state);
                }
            } else {
                r.outcome = Outcome::Conflict;
                r.exit_code = 3;
                r.conflicts = u.conflicts.iter().map(|c| display_rel(&c.path)).collect();
                let shown: Vec<String> =
                    u.conflicts.iter().take(10).map(|c| format!("{} ({})", display_rel(&c.path), c.what)).collect();
                let more = u.conflicts.len().saturating_sub(10);
                r.error = Some(format!(
                    "changed since the transaction committed: {}{}",
                    shown.join(", "),
                    if more > 0 { format!(" and {more} more") } else { String::new() }
                ));
            }
        }
        Err(txn_undo::UndoError::Refused(why)) => {
            r.tx = txbox_txn::state::new_tx_id();
            r.outcome = Outcome::Denied;
            r.exit_code = 126;
            r.rollback_reason = Some(RollbackReason::Policy);
            r.decision = Decision { action: Action::Deny, rule: None, reason: why.clone() };
            r.error = Some(why);
        }
        Err(e) => {
            r.tx = txbox_txn::state::new_tx_id();
            r.outcome = Outcome::Error;
            r.exit_code = 125;
            r.error = Some(e.to_string());
        }
    }
    // The log says which transactions it undid, whatever the request named.
    let what = match (&req.target, r.undone.as_slice()) {
        (Target::Last, [one]) => format!("undo {one}"),
        _ => what,
    };
    let durable = r.outcome == Outcome::Committed;
    audit(&env, &Command::Shell(what), &mut r, started, durable);
    Ok(r)
}

/// The workspace an undo of `id` is for, when no `-C` was given: the retained transaction's own
/// (found in the default state directories, or `state_dir`), else None.
pub fn workspace_of(state_dir: Option<&Path>, id: &str) -> Option<PathBuf> {
    let state = StateDir::find_kept(state_dir, id).ok()?;
    txbox_txn::retain::entry::header(&state, id).ok().map(|(r, _)| r.workspace)
}

/// What `txbox log` says about a committed transaction's undo, as JSON.
pub fn undo_mark(state: &StateDir, tx: &str) -> Value {
    match retain::undoability(state, tx) {
        Undoability::Undoable { bytes, estimate, kept_only } => {
            json!({"undoable": true, "retained_bytes": bytes, "estimate": estimate, "kept_only": kept_only})
        }
        Undoability::UndoneBy(by) => json!({"undoable": false, "undone_by": by}),
        Undoability::Gone => json!({"undoable": false}),
    }
}

/// The same for a person: `undo 12 KiB`, `undone by 7f3a…`, or empty.
pub fn undo_mark_text(state: &StateDir, tx: &str) -> String {
    match retain::undoability(state, tx) {
        Undoability::Undoable { bytes, estimate, .. } => {
            format!("undo {}{}", if estimate { "≥" } else { "" }, human_bytes(bytes))
        }
        Undoability::UndoneBy(by) => format!("undone by {}", crate::render::short(&by)),
        Undoability::Gone => String::new(),
    }
}

/// Bytes for people: `0 B`, `12 KiB`, `3.4 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else if v < 10.0 {
        format!("{v:.1} {}", UNITS[u])
    } else {
        format!("{v:.0} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_for_people() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(4096), "4.0 KiB");
        assert_eq!(human_bytes(12 << 20), "12 MiB");
    }
}
