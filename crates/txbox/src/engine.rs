//! One command, one transaction: policy → sandbox → classify → commit or roll back → audit.
//! Every front end (CLI, `sh` shim, MCP, HTTP) calls [`run`]; none of them decides anything.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use txbox_policy::{Action, Context, Decision, Policy};
use txbox_sandbox::{Exit, LaunchOptions, SandboxSpec};
use txbox_txn::audit::{self, Counts};
use txbox_txn::commit::{CommitError, CommitTarget};
use txbox_txn::meta::display_rel;
use txbox_txn::{ChangeSet, CrashHook, StateDir, TxDir};

/// What to run.
#[derive(Debug, Clone)]
pub enum Command {
    /// `run -- PROGRAM ARGS`: executed directly, arguments taken literally.
    Argv(Vec<OsString>),
    /// `run -c STRING`: `bash -c` semantics.
    Shell(String),
}

impl Command {
    pub fn display(&self) -> String {
        match self {
            Command::Shell(s) => s.clone(),
            Command::Argv(a) => a.iter().map(|s| s.to_string_lossy()).collect::<Vec<_>>().join(" "),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunRequest {
    pub workspace: PathBuf,
    pub state_dir: Option<PathBuf>,
    pub cwd: PathBuf,
    pub command: Command,
    pub policy: Policy,
    /// Capture output into the result (JSON mode) instead of streaming it.
    pub capture: bool,
    pub max_output: usize,
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Committed,
    RolledBack,
    Denied,
    Pending,
    Conflict,
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::RolledBack => "rolled_back",
            Outcome::Denied => "denied",
            Outcome::Pending => "pending",
            Outcome::Conflict => "conflict",
            Outcome::Error => "error",
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

#[derive(Debug, Clone, Default, Serialize)]
pub struct Changes {
    pub added: Vec<String>,
    pub modified: Vec<String>,
    pub deleted: Vec<String>,
}

impl Changes {
    fn of(cs: &ChangeSet) -> Changes {
        let f = |v: &Vec<PathBuf>| v.iter().map(|p| display_rel(p)).collect();
        Changes { added: f(&cs.added), modified: f(&cs.modified), deleted: f(&cs.deleted) }
    }

    pub fn counts(&self) -> Counts {
        Counts { added: self.added.len(), modified: self.modified.len(), deleted: self.deleted.len() }
    }
}

/// The result of one `run`, exactly the JSON object of DESIGN §3.
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
    /// Special files (devices, FIFOs, sockets) the command made; never committed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl RunResult {
    fn new(tx: String, decision: Decision) -> RunResult {
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
            skipped: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("workspace {path}: {source}")]
    Workspace { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    State(#[from] txbox_txn::StateError),
    #[error(transparent)]
    Recover(#[from] txbox_txn::RecoverError),
    #[error(transparent)]
    Audit(#[from] audit::AuditError),
}

/// Resolve a workspace argument to the real absolute directory the overlay will cover.
pub fn resolve_workspace(dir: &Path) -> Result<PathBuf, EngineError> {
    let p = std::fs::canonicalize(dir).map_err(|source| EngineError::Workspace { path: dir.to_path_buf(), source })?;
    if !p.is_dir() {
        return Err(EngineError::Workspace { path: p, source: std::io::ErrorKind::NotADirectory.into() });
    }
    Ok(p)
}

pub fn policy_context(workspace: &Path, cwd: &Path) -> Context {
    Context {
        workspace: workspace.to_path_buf(),
        cwd: cwd.to_path_buf(),
        home: std::env::var_os("HOME").map(PathBuf::from),
    }
}

/// Run one command as one transaction.
pub fn run(req: &RunRequest) -> Result<RunResult, EngineError> {
    let started = Instant::now();
    let workspace = resolve_workspace(&req.workspace)?;
    let state = StateDir::for_workspace(req.state_dir.as_deref(), &workspace);
    state.ensure()?;
    let state_root = std::fs::canonicalize(&state.root).unwrap_or_else(|_| state.root.clone());
    let state = StateDir { root: state_root };
    let cwd = if req.cwd.starts_with(&workspace) { req.cwd.clone() } else { workspace.clone() };

    // 1. Policy: a denial runs nothing.
    let ctx = policy_context(&workspace, &cwd);
    let evaluation = match &req.command {
        Command::Shell(s) => req.policy.evaluate_str(s, &ctx),
        Command::Argv(a) => {
            let argv: Vec<String> = a.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            req.policy.evaluate_argv(&argv, &ctx)
        }
    };
    if evaluation.decision.action == Action::Deny {
        let mut r = RunResult::new(txbox_txn::state::new_tx_id(), evaluation.decision);
        r.outcome = Outcome::Denied;
        r.exit_code = 126;
        r.rollback_reason = Some(RollbackReason::Policy);
        finish(&state, &workspace, req, &mut r, started, false)?;
        return Ok(r);
    }

    // 2. Finish whatever a crash left behind in this workspace, before looking at it.
    state.check_same_fs(&workspace)?;
    {
        let _lock = state.lock_workspace(&workspace)?;
        txbox_txn::recover(&state, Some(&workspace), &mut CrashHook::default())?;
    }

    // 3. Begin: the transaction's layers on the workspace's filesystem.
    let tx = TxDir::create(&state, &workspace, "run")?;
    let mut r = RunResult::new(tx.id.clone(), evaluation.decision);
    let exclude: HashSet<PathBuf> =
        state.root.strip_prefix(&workspace).ok().filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf).into_iter().collect();

    // 4. Execute in the sandbox.
    let argv = match &req.command {
        Command::Argv(a) => a.clone(),
        Command::Shell(s) => txbox_sandbox::shell_argv(s),
    };
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let spec = SandboxSpec {
        workspace: workspace.clone(),
        upper: tx.upper.clone(),
        work: tx.work.clone(),
        hide: vec![state.root.clone()],
        cwd,
        userns: !rustix::process::geteuid().is_root(),
        uid,
        gid,
        argv,
    };
    let opts = LaunchOptions { capture: req.capture.then_some(req.max_output), timeout: req.timeout };
    let finished = match txbox_sandbox::launch(Path::new("/proc/self/exe"), &spec, &opts) {
        Ok(f) => f,
        Err(e) => {
            r.error = Some(e.to_string());
            r.outcome = Outcome::Error;
            r.exit_code = 125;
            drop_tx(&state, tx);
            finish(&state, &workspace, req, &mut r, started, false)?;
            return Ok(r);
        }
    };
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

    // 5. Decide: commit only a command that ran to completion with status 0.
    let success = !finished.timed_out && finished.exit == Exit::Code(0);
    if !success {
        r.outcome = Outcome::RolledBack;
        r.rollback_reason = Some(if finished.timed_out { RollbackReason::Timeout } else { RollbackReason::ExitStatus });
        drop_tx(&state, tx);
        finish(&state, &workspace, req, &mut r, started, false)?;
        return Ok(r);
    }

    // 6. Classify and commit under the workspace lock.
    let committed = commit_tx(&state, &workspace, &tx, &exclude);
    match committed {
        Ok(cs) => {
            r.outcome = Outcome::Committed;
            r.changes = Changes::of(&cs);
            r.skipped = cs.skipped.iter().map(|p| display_rel(p)).collect();
        }
        Err(TxError::Conflict(paths, msg)) => {
            r.outcome = Outcome::Conflict;
            r.exit_code = 3;
            r.conflicts = paths;
            r.error = Some(msg);
        }
        Err(TxError::Other(msg)) => {
            r.outcome = Outcome::Error;
            r.exit_code = 125;
            r.error = Some(msg);
        }
    }
    let changed = r.outcome == Outcome::Committed;
    drop_tx(&state, tx);
    finish(&state, &workspace, req, &mut r, started, changed)?;
    Ok(r)
}

enum TxError {
    Conflict(Vec<String>, String),
    Other(String),
}

fn commit_tx(state: &StateDir, workspace: &Path, tx: &TxDir, exclude: &HashSet<PathBuf>) -> Result<ChangeSet, TxError> {
    let _lock = state.lock_workspace(workspace).map_err(|e| TxError::Other(e.to_string()))?;
    let cs = txbox_txn::classify(&tx.upper, workspace, exclude).map_err(|e| TxError::Other(e.to_string()))?;
    let record = state.record_path(&tx.id);
    let target = CommitTarget { tx: &tx.id, workspace, upper: &tx.upper, trash: &tx.trash, record: &record };
    match txbox_txn::commit::commit(&target, &cs, &mut CrashHook::from_env()) {
        Ok(()) => Ok(cs),
        Err(CommitError::Conflict { path, what }) => {
            let p = display_rel(&path);
            Err(TxError::Conflict(vec![p.clone()], format!("{p} changed in the workspace during the transaction ({what})")))
        }
        Err(e) => Err(TxError::Other(format!("commit failed: {e}"))),
    }
}

/// Discard a transaction's directory. Failure to clean up leaves garbage for `recover`, never
/// a wrong workspace, so it is not an error of the run.
fn drop_tx(state: &StateDir, tx: TxDir) {
    let id = tx.id.clone();
    drop(tx);
    let _ = state.remove_tx(&id);
}

fn finish(
    state: &StateDir,
    workspace: &Path,
    req: &RunRequest,
    r: &mut RunResult,
    started: Instant,
    durable: bool,
) -> Result<(), EngineError> {
    r.duration_ms = (started.elapsed().as_secs_f64() * 1e3 * 10.0).round() / 10.0;
    let entry = audit::Entry {
        time_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
        tx: r.tx.clone(),
        workspace: workspace.to_string_lossy().into_owned(),
        command: req.command.display(),
        action: r.decision.action.as_str().to_string(),
        rule: r.decision.rule.clone(),
        reason: r.decision.reason.clone(),
        outcome: r.outcome.as_str().to_string(),
        rollback_reason: r.rollback_reason.map(|x| serde_json::to_value(x).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()),
        exit_code: Some(r.exit_code),
        signal: r.signal,
        changes: r.changes.counts(),
        duration_ms: r.duration_ms,
        ..audit::Entry::default()
    };
    audit::append(&state.audit_path(), entry, durable)?;
    Ok(())
}
