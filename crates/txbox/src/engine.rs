//! One command, one transaction: policy → sandbox → classify → commit or roll back → audit.
//! Every front end (CLI, `sh` shim, MCP, HTTP) calls [`run`]; none of them decides anything.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use txbox_policy::{Action, Context, Decision, Policy};
use txbox_sandbox::warm::NotWarm;
use txbox_sandbox::{Exit, Finished, LaunchOptions, SandboxSpec, WarmUse};
use txbox_txn::audit::{self, Counts};
use txbox_txn::commit::{CommitError, CommitTarget};
use txbox_txn::layout::TxKind;
use txbox_txn::meta::display_rel;
use txbox_txn::session::Fingerprints;
use txbox_txn::{ChangeSet, CrashHook, StateDir, TxDir};

/// What to run.
#[derive(Debug, Clone)]
pub enum Command {
    /// `run -- PROGRAM ARGS`: executed directly, arguments taken literally.
    Argv(Vec<OsString>),
    /// `run -c STRING`: `bash -c` semantics.
    Shell(String),
    /// A whole shell command line (`txbox sh -lc S name a b`): the policy judges `script`
    /// (lossy text if it is not UTF-8), the sandbox runs `argv` byte for byte.
    Script { script: String, argv: Vec<OsString> },
}

impl Command {
    pub fn display(&self) -> String {
        match self {
            Command::Shell(s) | Command::Script { script: s, .. } => s.clone(),
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
    /// The policy file in use, if any: invisible inside the sandbox, never committed.
    pub policy_file: Option<PathBuf>,
    /// Where the command's stdio goes.
    pub io: Io,
    pub limits: Limits,
    /// A check run after the command, in the same transaction; commit only if it exits 0.
    pub validate: Option<String>,
    /// Leave the transaction pending for review instead of committing.
    pub no_commit: bool,
    /// On failure, keep the transaction pending instead of rolling it back.
    pub keep_on_failure: bool,
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
    /// For `exec`: the step number this command ran as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// What the command did with the network (`crate::network`): present with an allowlist, or
    /// when the command tried to reach a network it did not have.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::network::Summary>,
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
            skipped: Vec::new(),
            step: None,
            network: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Layers(#[from] txbox_txn::session::LayerError),
    #[error("{0}")]
    Usage(String),
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

/// Phase timings of one run, printed to stderr when `TXBOX_TIMING` is set: the documented
/// way to see where a transaction's time goes (docs/BENCHMARKS.md).
struct Timeline {
    enabled: bool,
    last: Instant,
    marks: Vec<(&'static str, Duration)>,
    /// Where the command ran: `warm`, or `cold (why no warm server took it)`.
    sandbox: Option<String>,
}

impl Timeline {
    fn new(started: Instant) -> Timeline {
        Timeline {
            enabled: std::env::var_os("TXBOX_TIMING").is_some(),
            last: started,
            marks: Vec::new(),
            sandbox: None,
        }
    }

    fn mark(&mut self, phase: &'static str) {
        if self.enabled {
            let now = Instant::now();
            self.marks.push((phase, now - self.last));
            self.last = now;
        }
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        if self.enabled {
            let parts: Vec<String> =
                self.marks.iter().map(|(p, d)| format!("{p} {:.3}", d.as_secs_f64() * 1e3)).collect();
            eprintln!("txbox timing (ms): {}", parts.join(", "));
            if let Some(s) = &self.sandbox {
                eprintln!("txbox sandbox: {s}");
            }
        }
    }
}

/// A resolved workspace with its state directory.
pub struct Env {
    pub workspace: PathBuf,
    pub state: StateDir,
    /// Relative paths never part of a change set (the state directory inside the workspace).
    pub exclude: HashSet<PathBuf>,
}

impl Env {
    /// Resolve the workspace and find (or make) its state directory: `state_dir` if given,
    /// else the default outside the workspace (`txbox_txn::layout::candidates`). Refused: a
    /// state directory txbox did not make. The state directory and the key's directory are
    /// never part of a change set, wherever they are.
    pub fn open(workspace: &Path, state_dir: Option<&Path>) -> Result<Env, EngineError> {
        let workspace = resolve_workspace(workspace)?;
        let state = StateDir::for_workspace(state_dir, &workspace)?;
        let exclude = state
            .hidden()
            .iter()
            .filter_map(|p| p.strip_prefix(&workspace).ok())
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .collect();
        if let Some(note) = txbox_txn::layout::earlier_state_note(&workspace, &state.root) {
            eprintln!("txbox: {note}");
        }
        Ok(Env { workspace, state, exclude })
    }

    /// Finish whatever a crash left behind in this workspace, before looking at it. Returns
    /// the workspace's commit generation: the base of a transaction that starts now.
    pub fn recover(&self) -> Result<u64, EngineError> {
        self.state.check_same_fs(&self.workspace)?;
        let _lock = self.state.lock_workspace(&self.workspace)?;
        txbox_txn::recover(&self.state, Some(&self.workspace), &mut CrashHook::default())?;
        Ok(self.state.generation(&self.workspace)?)
    }

    fn cwd_for(&self, cwd: &Path) -> PathBuf {
        if cwd.starts_with(&self.workspace) {
            cwd.to_path_buf()
        } else {
            self.workspace.clone()
        }
    }
}

pub(crate) fn evaluate(policy: &Policy, command: &Command, ctx: &Context) -> txbox_policy::Evaluation {
    match command {
        Command::Shell(s) | Command::Script { script: s, .. } => policy.evaluate_str(s, ctx),
        Command::Argv(a) => {
            let argv: Vec<String> = a.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            policy.evaluate_argv(&argv, ctx)
        }
    }
}

/// Where one sandboxed execution writes, and what it sees below.
pub(crate) struct Layers<'a> {
    /// Earlier steps, topmost first.
    pub lower: Vec<PathBuf>,
    pub upper: &'a Path,
    pub work: &'a Path,
}

/// Resource limits and network access of one execution (DESIGN §3 `run`/`exec` options).
#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub timeout: Option<Duration>,
    pub memory: Option<u64>,
    pub pids: Option<u64>,
    pub cpu_seconds: Option<u64>,
    /// Captured output per stream; exceeding it kills the command.
    pub max_output: Option<u64>,
    /// Bytes the command may write into its upper layer.
    pub max_write: Option<u64>,
    pub host_network: bool,
    /// `--allow-host` items (network by allowlist; ignored with `host_network`).
    pub allow_hosts: Vec<txbox_netproxy::Spec>,
}

/// Where a command's stdio goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    /// The caller's stdin, stdout and stderr (the CLI, `txbox sh`).
    Inherit,
    /// The caller's stdin; stdout and stderr captured into the result (`--json`).
    Capture,
    /// `/dev/null` as stdin, output captured: front ends whose own stdin is their protocol
    /// (MCP on stdio) or that answer a network peer (HTTP).
    Api,
}

/// Captured output per stream when no `--max-output` is given: truncated, not killed.
pub const DEFAULT_CAPTURE: usize = 16 << 20;

/// How long a warm server waits for its next transaction before it exits, unless
/// `TXBOX_WARM_IDLE` (seconds) says otherwise.
const WARM_IDLE: Duration = Duration::from_secs(60);

fn warm_idle() -> Duration {
    std::env::var("TXBOX_WARM_IDLE").ok().and_then(|v| v.parse::<u64>().ok()).map_or(WARM_IDLE, Duration::from_secs)
}

/// The socket of the warm server for sandboxes like `spec` (`STATE/warm/KEY.sock`), unless warm
/// servers are off (`TXBOX_WARM=0`) or the path is too long for a socket address.
fn warm_socket(state: &StateDir, spec: &SandboxSpec) -> Option<PathBuf> {
    if std::env::var_os("TXBOX_WARM").is_some_and(|v| v == "0") {
        return None;
    }
    let p = state.warm_dir().join(format!("{}.sock", spec.sandbox_key()));
    txbox_sandbox::warm::fits(&p).then_some(p)
}

/// A command's fate and what it did with the network.
pub(crate) struct Executed {
    pub finished: Finished,
    pub network: Option<crate::network::Summary>,
}

impl std::ops::Deref for Executed {
    type Target = Finished;
    fn deref(&self) -> &Finished {
        &self.finished
    }
}

pub(crate) fn execute(
    env: &Env,
    cwd: &Path,
    command: &Command,
    layers: Layers<'_>,
    io: Io,
    limits: &Limits,
    policy_file: Option<&Path>,
) -> Result<Executed, txbox_sandbox::SandboxError> {
    let argv = match command {
        Command::Argv(a) | Command::Script { argv: a, .. } => a.clone(),
        Command::Shell(s) => txbox_sandbox::shell_argv(s),
    };
    let mut spec = SandboxSpec::new(env.workspace.clone(), layers.upper.to_path_buf(), layers.work.to_path_buf(), argv);
    spec.layers = layers.lower;
    // The state directory and the directory of the key that authenticates it.
    spec.hide = env.state.hidden().to_vec();
    // The policy in force is neither readable for tricks nor writable for the command.
    spec.hide.extend(policy_file.and_then(|p| std::fs::canonicalize(p).ok()));
    let home = std::env::var_os("HOME").map(PathBuf::from);
    spec.hide.extend(
        txbox_sandbox::spec::default_secrets(home.as_deref()).into_iter().filter(|p| !env.workspace.starts_with(p)),
    );
    spec.cwd = env.cwd_for(cwd);
    spec.userns = !rustix::process::geteuid().is_root();
    spec.uid = rustix::process::getuid().as_raw();
    spec.gid = rustix::process::getgid().as_raw();
    spec.host_network = limits.host_network;
    spec.cpu_seconds = limits.cpu_seconds;
    spec.max_file_size = limits.max_write;
    let exe = Path::new("/proc/self/exe");
    let (plan, expansion) = crate::network::plan(limits.host_network, &limits.allow_hosts, Some(env.state.base()));
    let net = crate::network::Session::start(plan, exe, &mut spec).map_err(txbox_sandbox::SandboxError::Setup)?;
    let mut watch = crate::limits::Watcher::new(layers.upper, limits)?;
    spec.sync = watch.needs_sync();
    let opts = LaunchOptions {
        capture: (io != Io::Inherit)
            .then(|| limits.max_output.map_or(DEFAULT_CAPTURE, |m| usize::try_from(m).unwrap_or(usize::MAX))),
        null_stdin: io == Io::Api,
        output_limit_kills: limits.max_output.is_some(),
        timeout: limits.timeout,
        // A proxied run makes its own network namespace (and its listener in it).
        warm: if spec.proxy_port.is_some() { None } else { warm_socket(&env.state, &spec) },
        net_handoff: net.handoff(),
    };
    let mut finished = txbox_sandbox::launch(exe, &spec, &opts, &mut watch)?;
    if let (WarmUse::Cold(NotWarm::Absent), Some(socket)) = (&finished.warm, &opts.warm) {
        // No server for sandboxes like this one yet: start one for the next runs. Failing to
        // is only a missed speed-up.
        let _ = txbox_sandbox::warm::spawn(exe, socket, &env.state.root, warm_idle(), &spec);
    }
    if finished.limit.is_none() {
        finished.limit = watch.after(&finished);
    }
    // Dropping the watcher kills anything left in its cgroup and removes it.
    drop(watch);
    let network = net.finish(finished.net_attempts, expansion);
    Ok(Executed { finished, network })
}

/// Copy a finished command's fate into the result; true when it succeeded (status 0).
pub(crate) fn record(r: &mut RunResult, executed: Executed) -> bool {
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
    let limits = crate::network::with_policy_hosts(&req.limits, &req.policy, &[]).map_err(EngineError::Usage)?;
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
        audit(&env, &req.command, &mut r, started, false)?;
        return Ok(r);
    }

    // 2. Recover, 3. begin: the transaction's layers on the workspace's filesystem.
    let base_generation = env.recover()?;
    timeline.mark("recover");
    let tx = TxDir::create(&env.state, &env.workspace, TxKind::Run)?;
    timeline.mark("begin");
    let mut r = RunResult::new(tx.id.clone(), evaluation.decision);

    // 4. Execute in the sandbox.
    let layers = Layers { lower: Vec::new(), upper: &tx.upper, work: &tx.work };
    let finished = match execute(&env, &cwd, &req.command, layers, req.io, &limits, req.policy_file.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            setup_failed(&mut r, e);
            drop_tx(&env.state, tx, false);
            audit(&env, &req.command, &mut r, started, false)?;
            return Ok(r);
        }
    };
    let served_warm = finished.warm == WarmUse::Served;
    timeline.mark("sandbox");
    if timeline.enabled {
        timeline.sandbox = Some(match &finished.warm {
            WarmUse::Served => "warm".to_string(),
            WarmUse::Cold(why) => format!("cold ({why:?})"),
        });
    }

    // 5. Decide: commit only a command that ran to completion with status 0.
    if !record(&mut r, finished) {
        r.outcome = Outcome::RolledBack;
        drop_tx(&env.state, tx, served_warm);
        timeline.mark("rollback");
        audit(&env, &req.command, &mut r, started, false)?;
        timeline.mark("audit");
        return Ok(r);
    }

    // 6. Classify and commit under the workspace lock.
    let target = Target { id: &tx.id, upper: &tx.upper, trash: &tx.trash };
    let committed = commit_upper(&env, &target, Base::Generation(base_generation));
    timeline.mark("commit");
    settle(&mut r, committed);
    drop_tx(&env.state, tx, served_warm);
    timeline.mark("cleanup");
    let durable = r.outcome == Outcome::Committed && r.changes.counts() != Counts::default();
    audit(&env, &req.command, &mut r, started, durable)?;
    timeline.mark("audit");
    Ok(r)
}

pub(crate) fn deny(r: &mut RunResult) {
    r.outcome = Outcome::Denied;
    r.exit_code = 126;
    r.rollback_reason = Some(RollbackReason::Policy);
}

/// Turn a commit attempt into the result's outcome.
pub(crate) fn settle(r: &mut RunResult, committed: Result<ChangeSet, TxError>) {
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
}

pub(crate) enum TxError {
    Conflict(Vec<String>, String),
    Other(String),
}

/// The pieces of a transaction a commit needs.
pub(crate) struct Target<'a> {
    pub id: &'a str,
    pub upper: &'a Path,
    pub trash: &'a Path,
}

/// Commits with at least this many steps show progress on a terminal.
const PROGRESS_FROM: usize = 2000;

/// What a transaction's commit is checked against.
pub(crate) enum Base<'a> {
    /// A `run`: the workspace's commit generation when it began; any txbox commit since then
    /// that touched one of our paths (or an ancestor or descendant of one) is a conflict.
    Generation(u64),
    /// A session: what each path held when a step first touched it (also catches edits made
    /// outside txbox).
    Fingerprints(&'a Fingerprints),
}

fn overlapping(ours: &[PathBuf], theirs: &[PathBuf]) -> Vec<PathBuf> {
    ours.iter().filter(|p| theirs.iter().any(|q| p.starts_with(q) || q.starts_with(p))).cloned().collect()
}

/// Classify `upper` and commit it, under the workspace lock, unless a path it changes was
/// changed since the transaction's base (first committer wins).
pub(crate) fn commit_upper(env: &Env, t: &Target<'_>, base: Base<'_>) -> Result<ChangeSet, TxError> {
    let other = |e: &dyn std::fmt::Display| TxError::Other(e.to_string());
    let _lock = env.state.lock_workspace(&env.workspace).map_err(|e| other(&e))?;
    let cs = txbox_txn::classify(t.upper, &env.workspace, &env.exclude).map_err(|e| other(&e))?;
    let ours: Vec<PathBuf> = cs
        .changes
        .iter()
        .filter(|c| !matches!(c.op, txbox_txn::changeset::ChangeOp::DirMeta { .. }))
        .map(|c| c.path.clone())
        .collect();
    let mut paths = match base {
        Base::Generation(g) => {
            overlapping(&ours, &env.state.commits_since(&env.workspace, g).map_err(|e| other(&e))?.1)
        }
        Base::Fingerprints(f) => f.conflicts(&cs, &env.workspace).map_err(|e| other(&e))?,
    };
    paths.sort();
    paths.dedup();
    if !paths.is_empty() {
        let shown: Vec<String> = paths.iter().map(|p| display_rel(p)).collect();
        let msg = format!("changed in the workspace since this transaction began: {}", shown.join(", "));
        return Err(TxError::Conflict(shown, msg));
    }
    if !ours.is_empty() {
        env.state.log_commit(&env.workspace, &ours).map_err(|e| other(&e))?;
    }
    let record = env.state.record_path(t.id);
    let target = CommitTarget {
        tx: t.id,
        workspace: &env.workspace,
        upper: t.upper,
        trash: t.trash,
        record: &record,
        seal: env.state.seal(),
    };
    let mut hook = CrashHook::from_env();
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) && cs.changes.len() >= PROGRESS_FROM {
        hook.progress = Some(crate::progress::commit_step);
    }
    let result = txbox_txn::commit::commit(&target, &cs, &mut hook);
    crate::progress::finish();
    match result {
        Ok(()) => Ok(cs),
        Err(CommitError::Conflict { path, what }) => {
            let p = display_rel(&path);
            Err(TxError::Conflict(
                vec![p.clone()],
                format!("{p} changed in the workspace during the transaction ({what})"),
            ))
        }
        Err(e) => Err(TxError::Other(format!("commit failed: {e}"))),
    }
}

/// Discard a transaction's directory. Failure to clean up leaves garbage for `recover`, never
/// a wrong workspace, so it is not an error of the run.
/// `collected`: a warm server ran the transaction, and deletes retired directories itself
/// when idle, so retiring it is all there is to do here, unless so many wait that a
/// collector is wanted now (under sustained load the server is never idle).
pub(crate) fn drop_tx(state: &StateDir, tx: TxDir, collected: bool) {
    let id = tx.id.clone();
    let wrote_something = std::fs::read_dir(&tx.upper).map(|mut d| d.next().is_some()).unwrap_or(true);
    // A run that left nothing in its directory gives it to the next one (the lock held in
    // `tx` goes with it and is released below); one that wrote cannot, so is not examined.
    if !wrote_something && state.recycle_tx(&id) {
        return;
    }
    if collected && state.retire_tx(&id).is_ok() {
        drop(tx);
        start_collector(state, false);
        return;
    }
    drop(tx);
    if !wrote_something {
        // An empty layer is gone in a few syscalls.
        let _ = state.remove_tx(&id);
        return;
    }
    // A rollback returns as soon as the layer is retired; a detached collector deletes it
    // (DESIGN §8: rollback ≤ 50 ms, cleanup may continue in the background). Should it die,
    // the next collector finishes the job.
    if state.retire_tx(&id).is_err() {
        let _ = state.remove_tx(&id);
        return;
    }
    start_collector(state, true);
}

/// Start a detached `txbox __gc` for the state directory's retired directories if one is
/// wanted (see `StateDir::collector_wanted`).
fn start_collector(state: &StateDir, cold: bool) {
    if !state.collector_wanted(cold) {
        return;
    }
    let _ = std::process::Command::new("/proc/self/exe")
        .arg("__gc")
        .arg(&state.root)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

pub(crate) fn audit(
    env: &Env,
    command: &Command,
    r: &mut RunResult,
    started: Instant,
    durable: bool,
) -> Result<(), EngineError> {
    r.duration_ms = (started.elapsed().as_secs_f64() * 1e3 * 10.0).round() / 10.0;
    let entry = audit::Entry {
        time_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        tx: r.tx.clone(),
        workspace: env.workspace.to_string_lossy().into_owned(),
        command: command.display(),
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
    };
    audit::append(&env.state.audit_path(), entry, durable)?;
    Ok(())
}
