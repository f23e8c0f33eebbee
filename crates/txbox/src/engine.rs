//! One command, one transaction: policy → sandbox → classify → commit or roll back → audit.
//! Every front end (CLI, `sh` shim, MCP, HTTP) calls [`run`]; none of them decides anything.
//!
//! Owns the run pipeline and its order (parse the request, judge it, recover, begin, execute,
//! decide, commit or roll back, audit, clean up) and the recovery step every command takes
//! (`Env::recover`). What every stage shares (the request, [`Env`], [`EngineError`]) is
//! `crate::request`'s. The stages live apart: `crate::execute` (the sandbox), `crate::commit`
//! (conflict check, commit, settling the result), `crate::audit` (the entries),
//! `crate::collect` (dropping directories, the background collector). May not do a stage's
//! work itself: each step of [`run`] is one call.

use std::time::Instant;

use txbox_policy::Action;
use txbox_sandbox::WarmUse;
use txbox_txn::layout::TxKind;
use txbox_txn::session::Fingerprints;
use txbox_txn::{CrashHook, RecoverStats, TxDir};

use crate::audit::{audit, audit_recovered, CommitAudit};
use crate::collect::{after_retention, drop_tx};
use crate::commit::{commit_upper, settle, settle_kept, Base, Target};
use crate::execute::{execute, Layers};
use crate::options::Isolation;
use crate::request::{evaluate, policy_context, EngineError, Env, RunRequest};
use crate::result::{deny, record, setup_failed, Outcome, RunResult};
use crate::timing::Timeline;

/// The pipeline's recovery step, a method of [`Env`] so that every command that looks at a
/// workspace (`run`, the session commands, undo) takes it the same way.
impl Env {
    /// Finish whatever a crash left behind in this workspace, before looking at it. Returns
    /// the workspace's commit generation: the base of a transaction that starts now.
    pub fn recover(&self) -> Result<u64, EngineError> {
        self.recover_counting(&mut RecoverStats::default())
    }

    /// [`recover`](Self::recover), counting what recovery looked at. What it did is audited.
    pub fn recover_counting(&self, stats: &mut RecoverStats) -> Result<u64, EngineError> {
        self.state.check_same_fs(&self.workspace)?;
        let _lock = self.state.lock_workspace(&self.workspace)?;
        let done = txbox_txn::recover_counting(&self.state, Some(&self.workspace), &mut CrashHook::from_env(), stats)?;
        if !done.is_empty() {
            if let Err(e) = audit_recovered(&self.state, &done) {
                eprintln!("txbox: what recovery did could not be audited: {e}");
            }
        }
        Ok(self.state.generation(&self.workspace)?)
    }
}

/// Run one command as one transaction.
pub fn run(req: &RunRequest) -> Result<RunResult, EngineError> {
    if req.validate.is_some() || req.no_commit || req.keep_on_failure {
        return crate::session::run_as_session(req);
    }
    let started = Instant::now();
    let mut timeline = Timeline::new(started);
    let env = Env::open(&req.workspace, req.state_dir.as_deref())?;
    let cwd = env.cwd_for(&req.cwd);

    // 1. Policy: a denial runs nothing. A network target the command names outside its
    //    allowlist is denied here too (`crate::network`).
    let mut evaluation = evaluate(&req.policy, &req.command, &policy_context(&env.workspace, &cwd));
    let limits = crate::network::with_policy_hosts(&req.limits, &req.policy, &[])
        .map_err(|e| EngineError::Usage(e.to_string()))?;
    if evaluation.decision.action != Action::Deny {
        let base = Some(env.state.base());
        if let Some(d) =
            crate::network::visible_denial(&evaluation.commands, limits.host_network, &limits.allow_hosts, base)
        {
            evaluation.decision = d;
        }
    }
    timeline.mark("policy");
    if evaluation.decision.action == Action::Deny {
        let mut r = RunResult::new(txbox_txn::state::new_tx_id(), evaluation.decision);
        deny(&mut r);
        audit(&env, &req.command, &mut r, started, false);
        return Ok(r);
    }

    // 2. Recover, 3. begin: the transaction's layers on the workspace's filesystem (space
    //    held back given up first if the filesystem is all but full; retained undo data
    //    yields first if it is nearly full).
    let mut stats = RecoverStats::default();
    let base_generation = env.recover_counting(&mut stats)?;
    timeline.recovery_looked_at = Some(stats.looked_at);
    let yielded = env.yield_if_low();
    timeline.mark("recover");
    env.state.tend_reserve();
    let tx = TxDir::create(&env.state, &env.workspace, TxKind::Run)?;
    timeline.mark("begin");
    let mut r = RunResult::new(tx.id.clone(), evaluation.decision);
    r.no_longer_undoable = yielded;

    // 4. Execute in the sandbox, with default limits where the request gives none.
    let limits = crate::limits::with_defaults(&limits, &env.workspace);
    let layers = Layers { lower: Vec::new(), upper: &tx.upper, work: &tx.work };
    let finished =
        match execute(&env, &cwd, &req.command, layers, req.io, &limits, req.policy_file.as_deref(), &req.pass_env) {
            Ok(f) => f,
            Err(e) => {
                setup_failed(&mut r, e);
                drop_tx(&env.state, tx, false);
                audit(&env, &req.command, &mut r, started, false);
                return Ok(r);
            }
        };
    let served_warm = finished.warm.served();
    timeline.mark("sandbox");
    if timeline.enabled {
        timeline.sandbox = Some(match &finished.warm {
            WarmUse::Served { premounted: false } => "warm".to_string(),
            WarmUse::Served { premounted: true } => "warm, premounted".to_string(),
            WarmUse::Cold(why) => format!("cold ({why:?})"),
        });
    }

    // What steps 5 and 6 commit: the whole layer, or (a failed command) its kept directories.
    let target = |kept_only| Target {
        id: &tx.id,
        upper: &tx.upper,
        trash: &tx.trash,
        max_write: limits.max_write,
        policy: &req.policy,
        approved: None,
        keep: &req.keep,
        kept_only,
        root_base: Some(tx.root_base),
    };

    // 5. Decide: commit only a command that ran to completion with status 0. A failed one
    // still commits what it wrote in kept directories (build output), if anything.
    if !record(&mut r, finished) {
        r.outcome = Outcome::RolledBack;
        // By names first: a failed command that wrote nowhere kept costs no classification.
        if !txbox_txn::keep::upper_has_kept(&tx.upper, &req.keep) {
            drop_tx(&env.state, tx, served_warm);
            timeline.mark("rollback");
            audit(&env, &req.command, &mut r, started, false);
            timeline.mark("audit");
            return Ok(r);
        }
        let mut hook = CrashHook::from_env();
        let mut auditor = CommitAudit::new(&env, &req.command, &r, started);
        let kept = commit_upper(&env, &target(true), Base::Generation(base_generation), None, &mut auditor, &mut hook);
        timeline.mark("keep");
        settle_kept(&mut r, kept);
        auditor.finish(&mut r);
        timeline.mark("audit");
        let _ = hook.tick();
        match r.pending_recovery {
            Some(_) => drop(tx),
            None => drop_tx(&env.state, tx, served_warm),
        }
        timeline.mark("rollback");
        return Ok(r);
    }

    // 6. Classify and commit under the workspace lock (the write limit is checked on the change
    // set, whatever the command's status: a fast writer can exit 0 before the watcher looks).
    // The audit entry of a commit is appended at its commit point. 7. Audit what else
    // happened, 8. clean up (in this order: a crash in between leaves a directory recovery
    // knows to have landed, never an unaudited one).
    let strict = (req.isolation == Isolation::Strict).then_some(base_generation);
    let mut hook = CrashHook::from_env();
    let mut auditor = CommitAudit::new(&env, &req.command, &r, started);
    let committed =
        commit_upper(&env, &target(false), Base::Generation(base_generation), strict, &mut auditor, &mut hook);
    timeline.mark("commit");
    let settled = settle(&mut r, committed);
    auditor.finish(&mut r);
    timeline.mark("audit");
    let _ = hook.tick();
    match settled.held {
        // Held for a person: the run becomes a session of one step, under the same id.
        Some(fps) => keep_held(&env, tx, &fps, &mut r, served_warm),
        // Committed but not applied in full: the layers are what recovery applies (#14.1).
        None if r.pending_recovery.is_some() => drop(tx),
        // Retained for undo: its directory is in `kept/` now, not ours to drop.
        None if settled.retention.retained => {
            drop(tx);
            after_retention(&env.state, &settled.retention, served_warm);
        }
        None => drop_tx(&env.state, tx, served_warm),
    }
    timeline.mark("cleanup");
    Ok(r)
}

/// Keep a held run for a person; if that fails, it is rolled back and the run is an error.
fn keep_held(env: &Env, tx: TxDir, fps: &Fingerprints, r: &mut RunResult, served_warm: bool) {
    let kept = serde_json::to_string(&r.held)
        .map_err(|e| e.to_string())
        .and_then(|text| env.state.hold_run(&tx, &env.workspace, fps, &text).map_err(|e| e.to_string()));
    match kept {
        Ok(()) => drop(tx),
        Err(e) => {
            setup_failed(r, format!("keeping the held transaction: {e}"));
            drop_tx(&env.state, tx, served_warm);
        }
    }
}
