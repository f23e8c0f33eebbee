//! Landing a transaction: under the workspace lock, classify its upper layer and refuse what
//! conflicts with the commits since its base (with strict isolation, any commit), what is over
//! the write limit, and what the commit-time policy denies or holds; else commit it through the
//! journal (`txbox_txn::commit`) with the flushes it waits for, and retain it for undo. Then
//! turn the attempt into the result's outcome (`settle`, `settle_kept`).
//!
//! Owns the conflict check, the order of a commit's flushes and settling its result; may not run
//! anything in the sandbox (`crate::execute`), decide what becomes of the transaction's directory
//! afterwards (the caller's: `crate::collect`, or a hold), nor write the audit log but through
//! `crate::audit::CommitAudit`.

use std::path::{Path, PathBuf};

use txbox_policy::{Action, CommitAction, Decision, Policy};
use txbox_txn::commit::{CommitError, CommitTarget, Durability};
use txbox_txn::durable::{Flush, Fsync};
use txbox_txn::keep::KeepRules;
use txbox_txn::meta::display_rel;
use txbox_txn::retain::{self, KeepOptions, Retention};
use txbox_txn::session::Fingerprints;
use txbox_txn::{ChangeSet, CrashHook, StateDir};

use crate::audit::CommitAudit;
use crate::request::{EngineError, Env};
use crate::result::{Changes, DroppedXattr, HeldChange, Outcome, RollbackReason, RunResult, EXIT_HELD};

/// Turn a commit attempt into the result's outcome. Returns, for a held change, the base
/// fingerprints a run's transaction keeps (a session has its own: the default set), and what
/// retention did (the transaction's directory is retention's if `retained`).
pub(crate) fn settle(r: &mut RunResult, committed: Result<Landed, TxError>) -> Settled {
    match committed {
        Ok(Landed { cs, kept, retention }) => {
            r.outcome = Outcome::Committed;
            r.changes = Changes::of(&cs);
            r.skipped = cs.skipped.iter().map(|p| display_rel(p)).collect();
            r.dropped_xattrs = DroppedXattr::of(&cs);
            r.kept = kept;
            r.no_longer_undoable.extend(retention.evicted.iter().cloned());
            if !retention.retained && !cs.is_empty() && retention.error.is_some() {
                r.no_longer_undoable.push(r.tx.clone());
            }
            return Settled { held: None, retention };
        }
        Err(TxError::Conflict(paths, msg)) => {
            r.outcome = Outcome::Conflict;
            r.exit_code = 3;
            r.conflicts = paths;
            r.error = Some(msg);
        }
        Err(TxError::Unfinished(landed, msg)) => {
            // Committed: the command's exit status stands (125 would say nothing changed).
            let Landed { cs, kept, .. } = *landed;
            r.outcome = Outcome::Committed;
            r.kept = kept;
            r.changes = Changes::of(&cs);
            r.skipped = cs.skipped.iter().map(|p| display_rel(p)).collect();
            r.dropped_xattrs = DroppedXattr::of(&cs);
            r.pending_recovery = Some(msg);
        }
        Err(TxError::Other(msg)) => {
            r.outcome = Outcome::Error;
            r.exit_code = 125;
            r.error = Some(msg);
        }
        Err(TxError::Held(h)) => {
            let Held { cs, findings, fps } = *h;
            r.outcome = Outcome::Held;
            r.exit_code = EXIT_HELD;
            r.changes = Changes::of(&cs);
            r.skipped = cs.skipped.iter().map(|p| display_rel(p)).collect();
            r.dropped_xattrs = DroppedXattr::of(&cs);
            r.held = findings;
            return Settled { held: Some(fps.unwrap_or_default()), retention: Retention::default() };
        }
        Err(TxError::Denied { rule, reason }) => {
            r.outcome = Outcome::Denied;
            r.exit_code = 126;
            r.rollback_reason = Some(RollbackReason::Policy);
            r.error = Some(format!("commit refused by rule {rule}: {reason}"));
            r.decision = Decision { action: Action::Deny, rule: Some(rule), reason };
        }
        Err(TxError::Limit { name, msg }) => {
            r.outcome = Outcome::RolledBack;
            r.rollback_reason = Some(RollbackReason::Limit);
            r.limit_exceeded = Some(name.to_string());
            r.error = Some(msg);
            if r.exit_code == 0 {
                // The command completed, but what it wrote is over the limit: the status a
                // shell shows for a process stopped by a file size limit (SIGXFSZ).
                r.exit_code = 128 + libc::SIGXFSZ;
            }
        }
    }
    Settled::default()
}

/// What [`settle`] reports besides the result.
#[derive(Default)]
pub(crate) struct Settled {
    /// Held for a person: the base fingerprints its transaction keeps.
    pub held: Option<Fingerprints>,
    /// What retention did with a commit.
    pub retention: Retention,
}

/// Turn the commit of a failed command's kept directories into its result: the outcome stays
/// `rolled_back` (the command's status stands); what landed is in `changes` and `kept`, and
/// why nothing was kept, if so, in `kept_error`.
pub(crate) fn settle_kept(r: &mut RunResult, kept: Result<Landed, TxError>) {
    let refused = |r: &mut RunResult, why: String| r.kept_error = Some(format!("{why}; nothing was kept"));
    match kept {
        Ok(Landed { cs, kept, .. }) => {
            r.changes = Changes::of(&cs);
            r.skipped = cs.skipped.iter().map(|p| display_rel(p)).collect();
            r.dropped_xattrs = DroppedXattr::of(&cs);
            r.kept = kept;
        }
        Err(TxError::Unfinished(landed, msg)) => {
            let Landed { cs, kept, .. } = *landed;
            r.changes = Changes::of(&cs);
            r.kept = kept;
            r.pending_recovery = Some(msg);
        }
        Err(TxError::Held(h)) => {
            let why: Vec<String> =
                h.findings.iter().map(|f| format!("{} ({}: {})", f.path, f.rule, f.reason)).collect();
            refused(r, format!("the commit-time policy holds {}", why.join(", ")));
        }
        Err(TxError::Denied { rule, reason }) => refused(r, format!("commit refused by rule {rule}: {reason}")),
        Err(TxError::Limit { msg, .. }) => refused(r, msg),
        Err(TxError::Conflict(_, msg) | TxError::Other(msg)) => refused(r, msg),
    }
}

/// What a commit landed: the change set, the kept directories it changed, and what retention
/// did with it.
pub(crate) struct Landed {
    pub cs: ChangeSet,
    pub kept: Vec<String>,
    pub retention: Retention,
}

/// A change held by the commit-time policy (what `settle` reports).
pub(crate) struct Held {
    cs: ChangeSet,
    findings: Vec<HeldChange>,
    /// A run's base fingerprints, taken under the workspace lock when it was held.
    fps: Option<Fingerprints>,
}

pub(crate) enum TxError {
    Conflict(Vec<String>, String),
    /// The change set is over a limit (`write`); nothing was applied.
    Limit {
        name: &'static str,
        msg: String,
    },
    /// The commit-time policy holds the change for a person; nothing was applied.
    Held(Box<Held>),
    /// A commit-time rule denies the change; nothing was applied.
    Denied {
        rule: String,
        reason: String,
    },
    /// Past its commit point: committed, applying stopped; recovery applies the rest.
    Unfinished(Box<Landed>, String),
    /// Refused or failed before the commit point: nothing changed.
    Other(String),
}

/// The pieces of a transaction a commit needs.
pub(crate) struct Target<'a> {
    pub id: &'a str,
    pub upper: &'a Path,
    pub trash: &'a Path,
    /// The write limit the change set must fit in (a session's steps were each checked).
    pub max_write: Option<u64>,
    /// Whose commit-time rules judge the change set.
    pub policy: &'a Policy,
    /// A person's approval (`txbox approve`): these held changes may commit; any other hold
    /// (something changed since) holds the transaction again.
    pub approved: Option<&'a [HeldChange]>,
    /// Kept directories: exempt from conflict checks, and listed.
    pub keep: &'a KeepRules,
    /// A failed command: commit only what lies in kept directories; a hold or a denial of it
    /// keeps nothing (nobody is asked about a failed command's build output).
    pub kept_only: bool,
    /// Where a run's root started (`TxDir::root_base`): a run held for a person keeps it, as a
    /// session's steps do. None for a session (its fingerprints have it).
    pub root_base: Option<txbox_txn::session::RootBase>,
}

/// Commits with at least this many steps show progress on a terminal.
const PROGRESS_FROM: usize = 2000;

/// What a transaction's commit is checked against.
pub(crate) enum Base<'a> {
    /// A `run`: the workspace's commit generation when it began; any txbox commit since then
    /// that touched one of our paths (or an ancestor or descendant of one) is a conflict.
    Generation(u64),
    /// A session: what each path held when a step first touched it (also catches edits made
    /// outside txbox), and the root's base for its top step (`Fingerprints::root_of`).
    Fingerprints(&'a Fingerprints, Option<txbox_txn::session::RootBase>),
}

fn overlapping(ours: &[PathBuf], theirs: &[PathBuf]) -> Vec<PathBuf> {
    ours.iter().filter(|p| theirs.iter().any(|q| p.starts_with(q) || q.starts_with(p))).cloned().collect()
}

/// Classify `upper` and commit it, under the workspace lock, unless a path it changes was
/// changed since the transaction's base (first committer wins), or, with `strict_since` (strict
/// isolation: the workspace's commit generation when the transaction began), unless any
/// transaction committed to the workspace since then. Paths in kept directories
/// (`t.keep`) are exempt from both (last writer wins) and are not logged for others' checks;
/// with `t.kept_only`, only they are committed. `audit` is made ready before the commit point
/// (a log that cannot be written refuses the commit) and told at it. A commit that changes
/// something is retained for undo (`txbox_txn::retain`) within the budget in force; one that
/// changed only kept directories is retained as such (undo does not call it the last commit).
pub(crate) fn commit_upper(
    env: &Env,
    t: &Target<'_>,
    base: Base<'_>,
    strict_since: Option<u64>,
    audit: &mut CommitAudit<'_>,
    hook: &mut CrashHook,
) -> Result<Landed, TxError> {
    let other = |e: &dyn std::fmt::Display| TxError::Other(e.to_string());
    let _lock = env.state.lock_workspace(&env.workspace).map_err(|e| other(&e))?;
    if let Some(since) = strict_since {
        strict_check(env, since).map_err(|e| other(&e))??;
    }
    let whole = txbox_txn::classify(t.upper, &env.workspace, &env.exclude).map_err(|e| other(&e))?;
    let split =
        txbox_txn::keep::split(&whole, t.keep, &txbox_txn::keep::Layers { upper: t.upper, workspace: &env.workspace });
    if t.kept_only && !split.roots.is_empty() && !split.inputs_changed.is_empty() {
        let mut shown: Vec<String> = split.inputs_changed.iter().take(3).map(|p| display_rel(p)).collect();
        if split.inputs_changed.len() > 3 {
            shown.push(format!("and {} more", split.inputs_changed.len() - 3));
        }
        return Err(TxError::Other(format!(
            "the command also changed {}, which the rollback restores: build output made from the changed \
             files would look newer than them",
            shown.join(", ")
        )));
    }
    let kept_only = t.kept_only || split.rest.is_empty();
    let kept: Vec<String> = split.roots.iter().map(|p| display_rel(p)).collect();
    let in_kept = |p: &Path| split.roots.iter().any(|r| p.starts_with(r));
    let cs = if t.kept_only { split.kept } else { whole };
    let run_base = matches!(base, Base::Generation(_));
    if let Some(max) = t.max_write.filter(|max| cs.bytes > *max) {
        return Err(TxError::Limit {
            name: "write",
            msg: format!("the change set allocates {} bytes, over the write limit of {max}", cs.bytes),
        });
    }
    // What others' commits are checked against: kept directories are last writer wins.
    let ours: Vec<PathBuf> = cs
        .changes
        .iter()
        .filter(|c| !matches!(c.op, txbox_txn::changeset::ChangeOp::DirMeta { .. }) && !in_kept(&c.path))
        .map(|c| c.path.clone())
        .collect();
    let mut paths = match base {
        Base::Generation(g) => {
            overlapping(&ours, &env.state.commits_since(&env.workspace, g).map_err(|e| other(&e))?.1)
        }
        Base::Fingerprints(f, root) => f.conflicts(&cs, &env.workspace, root.as_ref()).map_err(|e| other(&e))?,
    };
    paths.retain(|p| !in_kept(p));
    paths.sort();
    paths.dedup();
    if !paths.is_empty() {
        let shown: Vec<String> = paths.iter().map(|p| display_rel(p)).collect();
        let msg = format!("changed in the workspace since this transaction began: {}", shown.join(", "));
        return Err(TxError::Conflict(shown, msg));
    }
    // The commit-time policy: files the host runs later by itself wait for a person. Kept
    // content is judged like any other.
    let findings = crate::judge::judge(t.policy, &cs, t.upper, &env.workspace);
    if let Some(d) = findings.iter().find(|f| f.action == CommitAction::Deny) {
        return Err(TxError::Denied { rule: d.rule.clone(), reason: d.reason.clone() });
    }
    let holds: Vec<HeldChange> = findings
        .into_iter()
        .filter(|f| f.action == CommitAction::Hold)
        .map(|f| HeldChange { path: f.path, rule: f.rule, reason: f.reason })
        .collect();
    let approved = |h: &HeldChange| t.approved.is_some_and(|a| a.iter().any(|x| x.path == h.path && x.rule == h.rule));
    if !holds.iter().all(approved) {
        // A run keeps its base from now on as a session does: what each path holds now.
        let fps = if run_base && !t.kept_only {
            let mut fps = Fingerprints::default();
            fps.roots.extend(t.root_base.map(|b| (1, b)));
            fps.record_layer(1, t.upper, &env.workspace).map_err(|e| other(&e))?;
            Some(fps)
        } else {
            None
        };
        return Err(TxError::Held(Box::new(Held { cs, findings: holds, fps })));
    }
    if cs.is_empty() {
        return Ok(Landed { cs, kept: Vec::new(), retention: Retention::default() });
    }
    audit.kept(kept.clone(), kept_only, t.kept_only);
    audit.prepare().map_err(|e| TxError::Other(e.to_string()))?;
    env.state.release_reserve_if_low();
    let budget = crate::retention::budget().map_err(|e| other(&e))?;
    // The command may have filled the disk: undo data yields before the commit needs room.
    let yielded = env.yield_if_low();
    let root = &env.state.root;
    let mut before = Vec::new();
    // Every commit is logged with its id (undo finds commits there), durable before the record:
    // a strict session's base generation (in its durable meta) must never meet a log that lost
    // lines and counts again from below it.
    let generation = env.state.log_commit_of(&env.workspace, Some(t.id), &ours).map_err(|e| other(&e))?;
    before.push(Flush::data(root, &StateDir::commit_log_rel(&env.workspace)));
    if generation == 1 {
        before.push(Flush::dir(root, Path::new(txbox_txn::layout::LOCKS)));
    }
    // Retention (what undo needs, taken before the commit point) is best effort: a commit that
    // cannot be retained is committed all the same, and says it is not undoable. Its
    // `retain-pre` is flushed with the commit's own flushes before the record.
    let prepared = budget.enabled().then(|| retain::prepare(&env.state, t.id, &env.workspace, &cs));
    if matches!(prepared, Some(Ok(()))) {
        let tx_rel = Path::new(txbox_txn::layout::TX).join(t.id);
        before.push(Flush::data(root, &tx_rel.join(txbox_txn::layout::RETAIN_PRE)));
        before.push(Flush::dir(root, &tx_rel));
    }
    let mut after = vec![
        Flush::data(root, Path::new(txbox_txn::layout::AUDIT)),
        Flush::data(root, Path::new(txbox_txn::layout::AUDIT_HEAD)),
    ];
    if audit.fresh() {
        after.push(Flush::dir(root, Path::new("")));
    }
    let record = env.state.record_path(t.id);
    let relief = || env.state.release_reserve();
    let target = CommitTarget {
        tx: t.id,
        workspace: &env.workspace,
        upper: t.upper,
        trash: t.trash,
        record: &record,
        seal: env.state.seal(),
        relief: Some(&relief),
    };
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) && cs.changes.len() >= PROGRESS_FROM {
        hook.progress = Some(crate::progress::commit_step);
    }
    let keep = retain::record_keep_path(&env.state, t.id);
    let mut fsync = Fsync;
    let mut durability = Durability { before, after, flusher: &mut fsync };
    let result = txbox_txn::commit::commit_with(&target, &cs, hook, &mut || audit.committed(&cs), &mut durability);
    crate::progress::finish();
    if result.is_err() && !record.exists() && !keep.exists() {
        // It failed before its commit point: say so in the commit log, so that undo does not
        // take it for a commit.
        let _ = env.state.cancel_commit(&env.workspace, generation, t.id);
    }
    match result {
        Ok(()) => {
            let retention = match prepared {
                Some(Ok(())) => {
                    let opts = KeepOptions { budget, kept_only };
                    retain::keep_commit(&env.state, t.id, Some(generation), &opts)
                        .unwrap_or_else(|e| Retention { error: Some(e.to_string()), ..Retention::default() })
                }
                Some(Err(e)) => Retention { error: Some(e.to_string()), ..Retention::default() },
                None => Retention::default(),
            };
            let mut retention = retention;
            retention.evicted.splice(0..0, yielded);
            Ok(Landed { cs, kept, retention })
        }
        Err(CommitError::Conflict { path, what }) => {
            let p = display_rel(&path);
            Err(TxError::Conflict(
                vec![p.clone()],
                format!("{p} changed in the workspace during the transaction ({what})"),
            ))
        }
        Err(e) if e.committed() => {
            Err(TxError::Unfinished(Box::new(Landed { cs, kept, retention: Retention::default() }), e.to_string()))
        }
        Err(e) => Err(TxError::Other(format!("commit failed: {e}"))),
    }
}

/// Strict isolation: refused if the workspace's commit generation moved since `since`. What
/// the transaction read may mix states from before and after those commits, so even one that
/// changes nothing is refused (its output would describe a workspace that never existed).
fn strict_check(env: &Env, since: u64) -> Result<Result<(), TxError>, EngineError> {
    let now = env.state.generation(&env.workspace)?;
    if now <= since {
        return Ok(Ok(()));
    }
    let n = now - since;
    let msg = format!(
        "strict isolation: {n} other transaction{} committed to the workspace since this one began; \
         nothing applied, run it again",
        if n == 1 { "" } else { "s" }
    );
    Ok(Err(TxError::Conflict(Vec::new(), msg)))
}
