//! The audit entries of txbox's transactions (the hash-chained log itself is `txbox_txn::audit`):
//! a run's or step's outcome, a commit's entry appended at its commit point ([`CommitAudit`]),
//! and what recovery did ([`audit_recovered`]).
//!
//! Owns what an entry says; may not change an outcome (a failed append is reported beside it, in
//! `audit_error`), nor refuse anything but a commit whose log cannot be opened.

use std::path::PathBuf;
use std::time::Instant;

use txbox_txn::audit::{self, Counts};
use txbox_txn::{ChangeSet, Recovered, StateDir};

use crate::request::{Command, Env};
use crate::result::{Changes, Outcome, RunResult};

/// The audit entry of `r` (its outcome and changes as they are now).
fn entry_of(env: &Env, command: &Command, r: &RunResult) -> audit::Entry {
    audit::Entry {
        time_ms: audit::now_ms(),
        tx: r.tx.clone(),
        workspace: env.workspace.to_string_lossy().into_owned(),
        command: crate::redact::redact(&command.display()).into_owned(),
        action: r.decision.action.as_str().to_string(),
        rule: r.decision.rule.clone(),
        reason: r.decision.reason.clone(),
        outcome: r.outcome.as_str().to_string(),
        rollback_reason: r.rollback_reason.map(|x| x.as_str().to_string()),
        exit_code: Some(r.exit_code),
        signal: r.signal,
        changes: r.changes.counts(),
        duration_ms: r.duration_ms,
        network: r.network.as_ref().and_then(|n| serde_json::to_value(n).ok()),
        ..audit::Entry::default()
    }
}

fn rounded_ms(started: Instant) -> f64 {
    (started.elapsed().as_secs_f64() * 1e3 * 10.0).round() / 10.0
}

/// Append `r`'s outcome to the audit log. A failure does not change the outcome: it is
/// reported with it (`audit_error`), never as "nothing changed" (#14.3).
pub(crate) fn audit(env: &Env, command: &Command, r: &mut RunResult, started: Instant, durable: bool) {
    r.duration_ms = rounded_ms(started);
    let entry = entry_of(env, command, r);
    if let Err(e) = env.state.audit_log().and_then(|mut log| log.append(entry, durable)) {
        r.audit_error = Some(e.to_string());
    }
}

/// Why a commit's audit entry is not in the log.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CommitAuditError {
    /// Before the commit point: the log does not open, so the commit is refused.
    #[error("the commit cannot be audited ({0}); nothing changed")]
    Unavailable(audit::AuditError),
    /// At the commit point: the log was not opened before it.
    #[error("the audit log was not opened")]
    NotOpened,
    /// At the commit point: appending failed; the commit stands, reported with `audit_error`.
    #[error(transparent)]
    Append(audit::AuditError),
}

/// The audit of a transaction that may commit: the log is opened before the commit point (a
/// log that cannot be written refuses the commit: nothing changed), and the entry is appended
/// at the commit point, and the commit's flush after applying makes it durable with the change.
pub(crate) struct CommitAudit<'a> {
    env: &'a Env,
    command: &'a Command,
    started: Instant,
    template: audit::Entry,
    log: Option<audit::Log>,
    /// The log or its head was empty when opened (maybe just created): the commit flushes
    /// the state directory too, for their names.
    fresh: bool,
    /// Set once the commit's entry was appended (Ok) or could not be (why).
    written: Option<Result<(), CommitAuditError>>,
    /// The kept directories the commit changes, and whether it changes nothing else.
    kept: Vec<String>,
    kept_only: bool,
    /// A failed command's kept directories: the entry keeps the outcome `rolled_back`.
    failed: bool,
}

impl<'a> CommitAudit<'a> {
    pub(crate) fn new(env: &'a Env, command: &'a Command, r: &RunResult, started: Instant) -> CommitAudit<'a> {
        CommitAudit {
            env,
            command,
            started,
            template: entry_of(env, command, r),
            log: None,
            fresh: false,
            written: None,
            kept: Vec::new(),
            kept_only: false,
            failed: false,
        }
    }

    /// Before the commit point: what of the commit is kept directories.
    pub(crate) fn kept(&mut self, kept: Vec<String>, kept_only: bool, failed: bool) {
        (self.kept, self.kept_only, self.failed) = (kept, kept_only, failed);
    }

    /// Before the commit point: open the log, or say why the commit cannot be audited.
    pub(crate) fn prepare(&mut self) -> Result<(), CommitAuditError> {
        match self.env.state.audit_log() {
            Ok(log) => {
                let empty = |p: PathBuf| std::fs::symlink_metadata(p).map_or(true, |m| m.len() == 0);
                self.fresh = empty(self.env.state.audit_path()) || empty(self.env.state.audit_head_path());
                self.log = Some(log);
                Ok(())
            }
            Err(e) => Err(CommitAuditError::Unavailable(e)),
        }
    }

    /// Once prepared: the log or its head was empty when opened (maybe just created), so the
    /// commit flushes the state directory too, for their names.
    pub(crate) fn fresh(&self) -> bool {
        self.fresh
    }

    /// At the commit point: the entry, outcome `committed`.
    pub(crate) fn committed(&mut self, cs: &ChangeSet) {
        let mut entry = self.template.clone();
        if !self.failed {
            entry.outcome = Outcome::Committed.as_str().to_string();
            entry.rollback_reason = None;
        }
        entry.kept = self.kept.clone();
        entry.kept_only = self.kept_only;
        entry.changes = Changes::of(cs).counts();
        entry.duration_ms = rounded_ms(self.started);
        entry.time_ms = audit::now_ms();
        self.written = Some(match self.log.as_mut() {
            Some(log) => log.append(entry, false).map(drop).map_err(CommitAuditError::Append),
            None => Err(CommitAuditError::NotOpened),
        });
    }

    /// After the commit: append the outcome if the commit point was not reached (rolled back,
    /// conflict, error, nothing to commit), and report what could not be appended.
    pub(crate) fn finish(mut self, r: &mut RunResult) {
        r.duration_ms = rounded_ms(self.started);
        match self.written.take() {
            Some(Ok(())) => {}
            Some(Err(e)) => r.audit_error = Some(e.to_string()),
            None => {
                let durable = r.outcome == Outcome::Committed && r.changes.counts() != Counts::default();
                let entry = entry_of(self.env, self.command, r);
                let appended = match self.log.as_mut() {
                    Some(log) => log.append(entry, durable),
                    None => self.env.state.audit_log().and_then(|mut log| log.append(entry, durable)),
                };
                if let Err(e) = appended {
                    r.audit_error = Some(e.to_string());
                }
            }
        }
    }
}

/// Append what recovery did: a transaction rolled forward or found landed is `committed` (and
/// `rolled_forward` when its own entry already says committed: recovery only finished
/// applying it); one whose own entry is there and that recovery only cleaned up is not
/// repeated; a discarded one is `discarded`.
pub fn audit_recovered(state: &StateDir, done: &[Recovered]) -> Result<(), audit::AuditError> {
    let mut log = state.audit_log()?;
    for r in done {
        let logged = |tx: &str, at: u64| audit::has_committed(&state.audit_path(), tx, at).unwrap_or(false);
        let (tx, workspace, outcome, reason, changes) = match r {
            Recovered::RolledForward { tx, workspace, changes, committed_ms } => {
                let (outcome, reason) = if logged(tx, *committed_ms) {
                    ("rolled_forward", "recovery finished applying a commit cut short")
                } else {
                    (
                        "committed",
                        "rolled forward by recovery: the transaction passed its commit point before it was cut short",
                    )
                };
                (tx, Some(workspace), outcome, reason, changes.clone())
            }
            Recovered::Landed { tx, workspace, changes, committed_ms } => {
                if logged(tx, *committed_ms) {
                    continue;
                }
                (
                    tx,
                    Some(workspace),
                    "committed",
                    "applied before its process ended, which left no audit entry",
                    changes.clone(),
                )
            }
            Recovered::Discarded { tx } => {
                (tx, None, "discarded", "its process ended before its commit point", Counts::default())
            }
        };
        let entry = audit::Entry {
            time_ms: audit::now_ms(),
            tx: tx.clone(),
            workspace: workspace.map(|w| w.to_string_lossy().into_owned()).unwrap_or_default(),
            command: "recover".into(),
            action: "recover".into(),
            reason: reason.into(),
            outcome: outcome.into(),
            changes,
            ..audit::Entry::default()
        };
        log.append(entry, true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed errors say what the strings they replaced said: `error` and `audit_error` are
    /// part of the result a caller reads.
    #[test]
    fn commit_audit_errors_keep_their_words() {
        let broken =
            || audit::AuditError::Broken { path: PathBuf::from("/s/audit.log"), line: 3, what: "bad hash".into() };
        assert_eq!(
            CommitAuditError::Unavailable(broken()).to_string(),
            "the commit cannot be audited (audit log /s/audit.log, line 3: bad hash); nothing changed"
        );
        assert_eq!(CommitAuditError::NotOpened.to_string(), "the audit log was not opened");
        assert_eq!(CommitAuditError::Append(broken()).to_string(), "audit log /s/audit.log, line 3: bad hash");
    }
}
