//! Multi-step transactions: `begin`, `exec` (each step a savepoint), `diff`, `commit`,
//! `rollback [--to STEP]`, `list`. State lives on disk, so a session outlives the processes
//! that work on it; every operation on one transaction holds its lock.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use txbox_policy::{Action, Decision, Policy};
use txbox_txn::layout::{Status, TxKind};
use txbox_txn::session::{self, Fingerprints};
use txbox_txn::state::{remove_tree, TxMeta};
use txbox_txn::{ChangeSet, CrashHook, StateDir};

use crate::audit::{audit, CommitAudit};
use crate::collect::start_retention_collector;
use crate::commit::{commit_upper, settle, Base, Target};
use crate::execute::{execute, Layers};
use crate::options::Isolation;
use crate::request::{evaluate, policy_context, Command, EngineError, Env, Io, Limits, RunRequest};
use crate::result::{deny, record, setup_failed, Changes, HeldChange, Outcome, RollbackReason, RunResult};

/// Find the state directory for a transaction id, from any directory: `--state-dir` if
/// given, else the default one or one txbox uses on another filesystem (`StateDir::find_tx`).
pub fn locate_state(explicit: Option<&Path>, _cwd: &Path, tx: &str) -> Result<StateDir, EngineError> {
    Ok(StateDir::find_tx(explicit, tx)?)
}

/// Open a session's environment from its id.
fn open(state: &StateDir, tx: &str) -> Result<(Env, TxMeta), EngineError> {
    let meta = state.read_meta(tx)?;
    if meta.kind != TxKind::Session {
        return Err(EngineError::Usage(format!("transaction {tx} is a single `run`, not a session")));
    }
    let env = Env::open(&meta.workspace, Some(&state.root))?;
    Ok((env, meta))
}

/// `begin`: a new open transaction; returns its id. With strict isolation, the workspace's
/// commit generation now is its base: any commit after it refuses this one's. `allow_hosts`
/// (`begin --allow-host`): hosts every step may reach, besides what each `exec` allows;
/// sealed with the session.
pub fn begin(
    workspace: &Path,
    state_dir: Option<&Path>,
    name: Option<&str>,
    isolation: Isolation,
    allow_hosts: &[String],
) -> Result<String, EngineError> {
    txbox_netproxy::allow::parse_all(allow_hosts).map_err(|e| EngineError::Usage(e.to_string()))?;
    let env = Env::open(workspace, state_dir)?;
    let generation = env.recover()?;
    let strict = (isolation == Isolation::Strict).then_some(generation);
    let id = env.state.create_session_with(&env.workspace, name, strict)?;
    if !allow_hosts.is_empty() {
        env.state.set_allow_hosts(&id, allow_hosts)?;
    }
    Ok(id)
}

/// What an `exec` runs and how.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub tx: String,
    pub cwd: PathBuf,
    pub command: Command,
    pub policy: Policy,
    pub policy_file: Option<PathBuf>,
    pub io: Io,
    pub limits: Limits,
    /// Keep a failed step's changes instead of undoing the step.
    pub keep_on_failure: bool,
    /// Variables passed to the command although they look like credentials.
    pub pass_env: Vec<String>,
}

/// `exec`: run one step inside an open transaction. A step that fails is undone alone (unless
/// `keep_on_failure`); one that succeeds becomes a savepoint.
pub fn exec(state: &StateDir, req: &ExecRequest) -> Result<RunResult, EngineError> {
    let started = Instant::now();
    let _lock = state.lock_tx(&req.tx)?;
    let (env, _) = open(state, &req.tx)?;
    refuse_if_held(state, &req.tx, "run more steps in it")?;
    let steps = state.steps_root(&req.tx, &env.workspace)?;
    let mut evaluation = evaluate(&req.policy, &req.command, &policy_context(&env.workspace, &req.cwd));
    let limits = crate::network::with_policy_hosts(&req.limits, &req.policy, &state.allow_hosts(&req.tx)?)
        .map_err(|e| EngineError::Usage(e.to_string()))?;
    if evaluation.decision.action != Action::Deny {
        let base = Some(state.base());
        if let Some(d) =
            crate::network::visible_denial(&evaluation.commands, limits.host_network, &limits.allow_hosts, base)
        {
            evaluation.decision = d;
        }
    }
    let mut r = RunResult::new(req.tx.clone(), evaluation.decision);
    if r.decision.action == Action::Deny {
        deny(&mut r);
        audit(&env, &req.command, &mut r, started, false);
        return Ok(r);
    }
    let layers = session::layers(&steps)?;
    // Step numbers keep growing even when steps are undone, so a number names one step forever.
    let n = state
        .last_step(&req.tx)
        .max(layers.last().map(|(n, _)| *n).unwrap_or(0))
        .checked_add(1)
        .ok_or_else(|| EngineError::Usage(format!("transaction {}: no step numbers left", req.tx)))?;
    r.step = Some(n);
    let below = layers.last().map(|(_, p)| p.as_path());
    // The root's base: whether a kept step changed the root decides where this step's comes from.
    // With no kept step, none of the fingerprints kept belongs to a layer still there.
    let mut fps = match below {
        Some(_) => state.load_fingerprints(&req.tx)?,
        None => Fingerprints::default(),
    };
    let base = fps.root_of(&layers);
    let kept: Vec<u32> = layers.iter().map(|(m, _)| *m).collect();
    let (upper, work, root_base) = session::create_step(&steps, n, &env.workspace, below, base.as_ref())?;
    let lower: Vec<PathBuf> = layers.iter().rev().map(|(_, p)| p.clone()).collect();
    let layers = Layers { lower, upper: &upper, work: &work };
    let limits = crate::limits::with_defaults(&limits, &env.workspace);
    let finished =
        execute(&env, &req.cwd, &req.command, layers, req.io, &limits, req.policy_file.as_deref(), &req.pass_env);
    let ok = match finished {
        // The write limit holds for a step that exited 0 too: its layer is what it would add.
        Ok(f) => record(&mut r, f) && !over_write_limit(&mut r, &upper, &limits),
        Err(e) => {
            setup_failed(&mut r, e);
            session::drop_step(&steps, n)?;
            audit(&env, &req.command, &mut r, started, false);
            return Ok(r);
        }
    };
    state.set_last_step(&req.tx, n)?;
    // A step over the write limit is never kept, even for review: the limit protects the disk.
    if ok || (req.keep_on_failure && r.limit_exceeded.as_deref() != Some("write")) {
        // The base of every path this step touched, for conflict detection at commit, and the
        // root's (moved with the workspace root while no step changed it).
        fps.record_layer(n, &upper, &env.workspace)?;
        // Only the kept steps' bases, and this one's.
        fps.roots.retain(|k, _| kept.contains(k));
        if let Some(b) = root_base {
            fps.roots.insert(n, b);
        }
        state.save_fingerprints(&req.tx, &fps)?;
        r.outcome = Outcome::Pending;
        r.rollback_reason = None;
    } else {
        session::drop_step(&steps, n)?;
        r.outcome = Outcome::RolledBack;
    }
    audit(&env, &req.command, &mut r, started, false);
    Ok(r)
}

/// Mark `r` as stopped by the write limit if step layer `upper` is over it.
fn over_write_limit(r: &mut RunResult, upper: &Path, limits: &Limits) -> bool {
    if !crate::limits::over_write_limit(upper, limits) {
        return false;
    }
    r.rollback_reason = Some(RollbackReason::Limit);
    r.limit_exceeded = Some("write".into());
    if r.exit_code == 0 {
        r.exit_code = 128 + libc::SIGXFSZ;
    }
    true
}

/// Squash the layers of a session into its bottom layer; returns it (None: no steps).
fn squash(layers: &[(u32, PathBuf)]) -> Result<Option<PathBuf>, EngineError> {
    let Some(((_, bottom), rest)) = layers.split_first() else { return Ok(None) };
    for (_, top) in rest {
        session::squash_pair(bottom, top)?;
    }
    Ok(Some(bottom.clone()))
}

/// A held session takes no more steps: what a person is asked to approve must not change.
fn refuse_if_held(state: &StateDir, tx: &str, what: &str) -> Result<(), EngineError> {
    if state.status(tx)? == Status::Held {
        return Err(EngineError::Usage(format!(
            "transaction {tx} is held for a person (see `txbox diff {tx}`); it cannot {what}: a person approves it \
             (`txbox approve {tx}`) or it is rolled back"
        )));
    }
    Ok(())
}

/// Why a held session is held (empty for any other).
pub fn held(state: &StateDir, tx: &str) -> Result<Vec<HeldChange>, EngineError> {
    if state.status(tx)? != Status::Held {
        return Ok(Vec::new());
    }
    let text = state.hold(tx)?.unwrap_or_default();
    serde_json::from_str(&text).map_err(|e| EngineError::Internal(format!("transaction {tx}: its hold record: {e}")))
}

/// `commit`: squash the steps, check for conflicts against each path's base, judge with the
/// commit-time rules of `policy`, commit; or hold it for a person.
pub fn commit(state: &StateDir, tx: &str, policy: &Policy) -> Result<RunResult, EngineError> {
    commit_as(state, tx, policy, false)
}

/// `approve`: a person commits a held transaction. Exactly what was held may commit: a hold
/// the judge finds now that was not among them (it cannot change, but the policy can) holds
/// it again; a `deny` still refuses. Never offered to an agent (MCP, HTTP).
pub fn approve(state: &StateDir, tx: &str, policy: &Policy) -> Result<RunResult, EngineError> {
    commit_as(state, tx, policy, true)
}

fn commit_as(state: &StateDir, tx: &str, policy: &Policy, approving: bool) -> Result<RunResult, EngineError> {
    let started = Instant::now();
    let _lock = state.lock_tx(tx)?;
    let (env, meta) = open(state, tx)?;
    let approved = if approving {
        if state.status(tx)? != Status::Held {
            return Err(EngineError::Usage(format!("transaction {tx} is not held; `txbox commit {tx}` commits it")));
        }
        Some(held(state, tx)?)
    } else {
        None
    };
    env.recover()?;
    let tx_dir = state.tx_dir(tx);
    let reason = if approving { "a person approved the held transaction" } else { "commit of an open transaction" };
    let decision = Decision { action: Action::Transact, rule: None, reason: reason.into() };
    let mut r = RunResult::new(tx.to_string(), decision);
    r.exit_code = 0;
    let layers = session::layers(&state.steps_root(tx, &env.workspace)?)?;
    // Damaged or missing fingerprints are refused before anything changes: the session stays
    // open, its savepoints intact.
    let fps = state.load_fingerprints(tx)?;
    fps.check_covers(&layers)?;
    // From here a crash before the commit record means: the commit did not happen, and
    // recovery discards the half-squashed transaction (the workspace is untouched).
    state.set_status(tx, Status::Committing)?;
    let what = if approving { format!("approve {tx}") } else { format!("commit {tx}") };
    let command = Command::Shell(what);
    r.outcome = Outcome::Committed;
    let mut auditor = CommitAudit::new(&env, &command, &r, started);
    let mut hook = CrashHook::from_env();
    let mut retention = None;
    let root = fps.root_of(&layers);
    if let Some(upper) = squash(&layers)? {
        // A root no step changed takes the workspace root's attributes as they are now.
        session::rebase_root(&upper, &env.workspace, root.as_ref())?;
        let trash = tx_dir.join(txbox_txn::layout::TRASH);
        let target = Target {
            id: tx,
            upper: &upper,
            trash: &trash,
            max_write: None,
            policy,
            approved: approved.as_deref(),
            // Sessions keep nothing on rollback, and their kept directories are checked
            // for conflicts like any path (docs/DEVIATIONS.md).
            keep: &txbox_txn::keep::KeepRules::none(),
            kept_only: false,
            root_base: None,
        };
        let settled = settle(
            &mut r,
            commit_upper(&env, &target, Base::Fingerprints(&fps, root), meta.strict_since, &mut auditor, &mut hook),
        );
        retention = Some(settled.retention).filter(|r| r.retained);
    }
    auditor.finish(&mut r);
    let _ = hook.tick();
    if r.outcome == Outcome::Held {
        // Squashed into one layer, the session waits for a person; the record of why first,
        // then the status that says so.
        let text = serde_json::to_string(&r.held)
            .map_err(|e| EngineError::Internal(format!("transaction {}: writing its hold record: {e}", r.tx)))?;
        state.set_hold(tx, &text)?;
        state.set_status(tx, Status::Held)?;
    } else if let Some(retention) = retention {
        // A committed session is retained for undo as one transaction (its directory is in
        // `kept/`).
        if retention.collector() {
            start_retention_collector(state);
        }
    } else if r.pending_recovery.is_none() {
        // A commit left to recovery keeps its layers (removing them is refused anyway).
        let _ = state.remove_tx(tx);
    }
    Ok(r)
}

/// `rollback`: the whole transaction, or back to the state right after step `to`.
pub fn rollback(state: &StateDir, tx: &str, to: Option<u32>) -> Result<RunResult, EngineError> {
    let started = Instant::now();
    let lock = state.lock_tx(tx)?;
    let (env, _) = open(state, tx)?;
    let decision = Decision { action: Action::Transact, rule: None, reason: "rollback requested".into() };
    let mut r = RunResult::new(tx.to_string(), decision);
    r.exit_code = 0;
    r.rollback_reason = Some(RollbackReason::Requested);
    let steps = state.steps_root(tx, &env.workspace)?;
    match to {
        Some(step) => {
            for (n, _) in session::layers(&steps)? {
                if n > step {
                    session::drop_step(&steps, n)?;
                }
            }
            // What was held may be gone: the session is open again, and judged anew at commit.
            if state.status(tx)? == Status::Held {
                state.set_status(tx, Status::Open)?;
            }
            r.outcome = Outcome::Pending;
            r.step = Some(step);
        }
        None => {
            drop(lock);
            state.remove_tx(tx)?;
            r.outcome = Outcome::RolledBack;
        }
    }
    let what = match to {
        Some(s) => format!("rollback {tx} --to {s}"),
        None => format!("rollback {tx}"),
    };
    audit(&env, &Command::Shell(what), &mut r, started, false);
    Ok(r)
}

/// The change set of a session so far, computed on a hard-link copy of its layers so the
/// savepoints stay intact. The closure sees the squashed upper while it still exists.
pub fn with_diff<T>(
    state: &StateDir,
    tx: &str,
    f: impl FnOnce(&Env, &ChangeSet, &Path) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    let _lock = state.lock_tx(tx)?;
    let (env, _) = open(state, tx)?;
    let scratch = state.diff_scratch(tx);
    let _ = remove_tree(&scratch);
    std::fs::create_dir_all(&scratch)
        .map_err(|e| EngineError::Internal(format!("creating {}: {e}", scratch.display())))?;
    let result = (|| {
        let mut copies = Vec::new();
        let layers = session::layers(&state.steps_root(tx, &env.workspace)?)?;
        // As at commit: a root no step changed is the workspace root as it is now.
        let root = state.load_fingerprints(tx).ok().and_then(|fps| fps.root_of(&layers));
        for (n, upper) in layers {
            let dst = scratch.join(n.to_string());
            session::link_copy(&upper, &dst)?;
            copies.push((n, dst));
        }
        let squashed = squash(&copies)?;
        if let Some(upper) = &squashed {
            session::rebase_root(upper, &env.workspace, root.as_ref())?;
        }
        let cs = match squashed {
            Some(upper) => txbox_txn::classify(&upper, &env.workspace, &env.exclude)
                .map(|cs| (cs, upper))
                .map_err(|e| EngineError::Internal(format!("transaction {tx}: classifying its layers: {e}")))?,
            None => (ChangeSet::default(), scratch.clone()),
        };
        f(&env, &cs.0, &cs.1)
    })();
    let _ = remove_tree(&scratch);
    result
}

#[derive(Debug, Serialize)]
pub struct TxInfo {
    pub tx: String,
    pub name: Option<String>,
    pub workspace: String,
    pub status: String,
    pub steps: Vec<u32>,
    /// For a held transaction: what waits for a person, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldChange>,
}

/// `list`: the open (and half-committed) sessions of a state directory.
pub fn list(state: &StateDir) -> Result<Vec<TxInfo>, EngineError> {
    let mut out = Vec::new();
    for id in state.tx_ids()? {
        // Only what verifies is shown (a forged or damaged transaction is not one of ours).
        let Ok(meta) = state.read_meta(&id) else { continue };
        if meta.kind != TxKind::Session {
            continue;
        }
        let steps = state.steps_root(&id, &meta.workspace)?;
        out.push(TxInfo {
            name: meta.name,
            workspace: meta.workspace.to_string_lossy().into_owned(),
            status: state.status(&id).map_or("damaged", |s| s.as_str()).to_string(),
            steps: session::layers(&steps)?.into_iter().map(|(n, _)| n).collect(),
            held: held(state, &id).unwrap_or_default(),
            tx: id,
        });
    }
    Ok(out)
}

/// `run --validate` / `run --no-commit`: begin, exec the command (and the validation), then
/// commit, roll back, or leave the transaction pending.
pub fn run_as_session(req: &RunRequest) -> Result<RunResult, EngineError> {
    let started = Instant::now();
    let env = Env::open(&req.workspace, req.state_dir.as_deref())?;
    let tx = begin(&env.workspace, Some(&env.state.root), None, req.isolation, &[])?;
    let exec_req = |command: Command| ExecRequest {
        tx: tx.clone(),
        cwd: req.cwd.clone(),
        command,
        policy: req.policy.clone(),
        policy_file: req.policy_file.clone(),
        io: req.io,
        limits: req.limits.clone(),
        keep_on_failure: false,
        pass_env: req.pass_env.clone(),
    };
    let mut first = exec_req(req.command.clone());
    first.keep_on_failure = req.keep_on_failure;
    let mut r = exec(&env.state, &first)?;
    if r.outcome != Outcome::Pending {
        // Denied, rolled back or failed to start: nothing to keep (and no step left open).
        let _ = env.state.remove_tx(&tx);
        r.step = None;
        return Ok(r);
    }
    if r.exit_code != 0 {
        // --on-failure keep: the failed command's changes wait for review.
        r.changes = with_diff(&env.state, &tx, |_, cs, _| Ok(Changes::of(cs)))?;
        return Ok(r);
    }
    {
        if let Some(v) = &req.validate {
            let check = exec(&env.state, &exec_req(Command::Shell(v.clone())))?;
            if check.outcome != Outcome::Pending {
                let _ = rollback(&env.state, &tx, None)?;
                r.outcome = if check.outcome == Outcome::Denied { Outcome::Denied } else { Outcome::RolledBack };
                r.rollback_reason = Some(RollbackReason::Validation);
                r.stdout.push_str(&check.stdout);
                r.stderr.push_str(&check.stderr);
                r.exit_code = if check.exit_code == 0 { 1 } else { check.exit_code };
                r.error = Some(format!("validation `{v}` failed with exit status {}", check.exit_code));
                r.step = None;
                return Ok(r);
            }
        }
    }
    if req.no_commit {
        r.outcome = Outcome::Pending;
        r.changes = with_diff(&env.state, &tx, |_, cs, _| Ok(Changes::of(cs)))?;
        return Ok(r);
    }
    let c = commit(&env.state, &tx, &req.policy)?;
    r.outcome = c.outcome;
    r.changes = c.changes;
    r.conflicts = c.conflicts;
    r.error = c.error;
    r.held = c.held;
    r.dropped_xattrs = c.dropped_xattrs;
    r.pending_recovery = c.pending_recovery;
    r.audit_error = r.audit_error.or(c.audit_error);
    if c.outcome != Outcome::Committed {
        r.exit_code = c.exit_code;
        r.decision = c.decision;
        r.rollback_reason = c.rollback_reason;
    }
    r.duration_ms = (started.elapsed().as_secs_f64() * 1e3 * 10.0).round() / 10.0;
    Ok(r)
}
