//! One command, one transaction: policy → sandbox → classify → commit or roll back → audit.
//! Every front end (CLI, `sh` shim, MCP, HTTP) calls [`run`]; none of them decides anything.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use txbox_policy::{Action, CommitAction, Context, Decision, Policy};
use txbox_sandbox::warm::NotWarm;
use txbox_sandbox::{Finished, LaunchOptions, SandboxSpec, WarmUse};
use txbox_txn::audit::{self, Counts};
use txbox_txn::commit::{CommitError, CommitTarget, Durability};
use txbox_txn::durable::{Flush, Fsync};
use txbox_txn::keep::KeepRules;
use txbox_txn::layout::TxKind;
use txbox_txn::meta::display_rel;
use txbox_txn::retain::{self, KeepOptions, Retention};
use txbox_txn::session::Fingerprints;
use txbox_txn::{ChangeSet, CrashHook, RecoverStats, Recovered, StateDir, TxDir};

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
    /// `strict`: refused as a conflict if any other transaction committed meanwhile.
    pub isolation: Isolation,
    /// Variables passed to the command although their name or value marks a credential.
    pub pass_env: Vec<String>,
    /// Kept directories (build output): committed even when the command fails, exempt from
    /// conflict checks. `KeepRules::none()` keeps nothing.
    pub keep: KeepRules,
}

use crate::options::Isolation;
pub(crate) use crate::result::{deny, record, setup_failed};
pub use crate::result::{Changes, DroppedXattr, HeldChange, Outcome, RollbackReason, RunResult, EXIT_HELD};
use crate::timing::Timeline;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Layers(#[from] txbox_txn::session::LayerError),
    #[error("{0}")]
    Usage(String),
    /// What txbox itself failed at (a record it wrote that does not read back, a scratch
    /// directory it could not make): not the caller's doing, exit 125 / HTTP 500.
    #[error("{0}")]
    Internal(String),
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
    if let Some(why) = unreasonable_workspace(&p) {
        return Err(EngineError::Usage(format!(
            "refusing {} as a workspace: {why}; name a project directory",
            p.display()
        )));
    }
    Ok(p)
}

/// Directories no transaction should cover: the root (the whole host), the system's own
/// top-level directories, and kernel filesystems.
fn unreasonable_workspace(p: &Path) -> Option<&'static str> {
    const SYSTEM: &[&str] = &[
        "/bin",
        "/boot",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/run",
        "/sbin",
        "/usr",
        "/var",
        "/home",
        "/tmp",
        "/var/tmp",
        "/usr/local",
        "/usr/lib",
        "/usr/bin",
    ];
    const KERNEL: &[&str] = &["/proc", "/sys", "/dev"];
    if p == Path::new("/") {
        Some("it is the root of the filesystem")
    } else if SYSTEM.iter().any(|s| p == Path::new(s)) {
        Some("it is a system directory")
    } else if KERNEL.iter().any(|k| p.starts_with(k)) {
        Some("it is a kernel filesystem")
    } else {
        None
    }
}

pub fn policy_context(workspace: &Path, cwd: &Path) -> Context {
    Context {
        workspace: workspace.to_path_buf(),
        cwd: cwd.to_path_buf(),
        home: std::env::var_os("HOME").map(PathBuf::from),
        // The package caches a run may mount (whether or not this one does: the sandbox is
        // what keeps the rest read-only).
        writable: crate::caches::locations_here(workspace),
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

    /// On a nearly full filesystem, retained undo data yields first (oldest first,
    /// `txbox_txn::retain::yield_if_low`): the transactions no longer undoable. Costs one
    /// `statvfs` when there is room.
    pub fn yield_if_low(&self) -> Vec<String> {
        match crate::retention::budget() {
            Ok(b) if b.enabled() => retain::yield_if_low(&self.state, &b).unwrap_or_default(),
            _ => Vec::new(),
        }
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

/// Resource limits and network access of one execution (docs/DESIGN.md §3, `run`/`exec` options).
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
    /// Mount txbox's package caches at the tools' default locations (`crate::caches`).
    pub caches: bool,
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
    // Named by this binary too: another one's server is never asked.
    let p = state.warm_dir().join(txbox_sandbox::warm::socket_name(spec, &txbox_sandbox::warm::binary_id()));
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

/// Other users' state directories at the root of the workspace's filesystem
/// (`.txbox-state-<uid>`). Only root can read another user's (they are 0700), so only root's
/// runs look (this user's own is hidden with the state directory).
fn other_states(workspace: &Path) -> Vec<PathBuf> {
    if !rustix::process::geteuid().is_root() {
        return Vec::new();
    }
    let Some(root) = txbox_txn::layout::mount_root(workspace) else { return Vec::new() };
    let Ok(dir) = std::fs::read_dir(&root) else { return Vec::new() };
    dir.flatten()
        .filter(|e| e.file_name().as_encoded_bytes().starts_with(txbox_txn::layout::AT_MOUNT_PREFIX.as_bytes()))
        .map(|e| e.path())
        .collect()
}

/// The package caches of a run: the installed tools' caches, per workspace, in the state
/// directory (`STATE/caches`, hidden from commands), over the tools' default locations in the
/// caller's environment (`crate::caches`), never in a path the sandbox hides (`hidden`).
fn package_caches(env: &Env, hidden: &[PathBuf]) -> Vec<(PathBuf, PathBuf)> {
    let var = |k: &str| std::env::var(k).ok();
    let tools = crate::caches::installed_here();
    let plan = crate::caches::plan(tools, &var, &env.state.root, &env.workspace);
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let bounds =
        crate::caches::Bounds { workspace: &env.workspace, base: &env.state.root, hidden, home: home.as_deref() };
    crate::caches::prepare(plan, &bounds).into_iter().map(|m| (m.source, m.target)).collect()
}

// Each argument is one independent input of the sandbox; grouping them would only rename them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn execute(
    env: &Env,
    cwd: &Path,
    command: &Command,
    layers: Layers<'_>,
    io: Io,
    limits: &Limits,
    policy_file: Option<&Path>,
    pass_env: &[String],
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
    // Everything else by rule: other homes, host keys, credentials, sockets' places, other
    // state directories (txbox_sandbox::secrets).
    let host = txbox_sandbox::secrets::Host::gather(other_states(&env.workspace));
    spec.hide.extend(txbox_sandbox::secrets::hidden(&host, &env.workspace, &spec.writable));
    // Then the caches, never in a hidden path: `secrets::hidden` keeps every path above a
    // writable one visible, so a cache there would show it; refused instead, a cache does not
    // change what is hidden.
    if limits.caches {
        spec.caches = package_caches(env, &spec.hide);
    }
    spec.cwd = env.cwd_for(cwd);
    spec.userns = !rustix::process::geteuid().is_root();
    spec.uid = rustix::process::getuid().as_raw();
    spec.gid = rustix::process::getgid().as_raw();
    spec.host_network = limits.host_network;
    spec.cpu_seconds = limits.cpu_seconds;
    // The write limit counts allocated blocks, so it is not RLIMIT_FSIZE (a file's length: a
    // sparse file's may exceed what it allocates, and an fallocate past it would just fail
    // while the command goes on to exit 0): the watcher and the change-set check hold it.
    spec.max_procs = crate::limits::default_procs(limits);
    let exe = Path::new("/proc/self/exe");
    let (plan, expansion) = crate::network::plan(limits.host_network, &limits.allow_hosts, Some(env.state.base()));
    let net = crate::network::Session::start(plan, exe, &mut spec).map_err(txbox_sandbox::SandboxError::Proxy)?;
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
        env: Some(crate::environ::for_command(pass_env)),
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
    let served_warm = finished.warm == WarmUse::Served;
    timeline.mark("sandbox");
    if timeline.enabled {
        timeline.sandbox = Some(match &finished.warm {
            WarmUse::Served => "warm".to_string(),
            WarmUse::Cold(why) => format!("cold ({why:?})"),
        });
    }

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
        let target = Target {
            id: &tx.id,
            upper: &tx.upper,
            trash: &tx.trash,
            max_write: limits.max_write,
            policy: &req.policy,
            approved: None,
            keep: &req.keep,
            kept_only: true,
        };
        let mut hook = CrashHook::from_env();
        let mut auditor = CommitAudit::new(&env, &req.command, &r, started);
        let kept = commit_upper(&env, &target, Base::Generation(base_generation), None, &mut auditor, &mut hook);
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
    let target = Target {
        id: &tx.id,
        upper: &tx.upper,
        trash: &tx.trash,
        max_write: limits.max_write,
        policy: &req.policy,
        approved: None,
        keep: &req.keep,
        kept_only: false,
    };
    // The audit entry of a commit is appended at its commit point. 7. Audit what else
    // happened, 8. clean up (in this order: a crash in between leaves a directory recovery
    // knows to have landed, never an unaudited one).
    let strict = (req.isolation == Isolation::Strict).then_some(base_generation);
    let mut hook = CrashHook::from_env();
    let mut auditor = CommitAudit::new(&env, &req.command, &r, started);
    let committed = commit_upper(&env, &target, Base::Generation(base_generation), strict, &mut auditor, &mut hook);
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
            if settled.retention.collector {
                start_retention_collector(&env.state);
            }
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
        Base::Fingerprints(f) => f.conflicts(&cs, &env.workspace).map_err(|e| other(&e))?,
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
    audit.prepare().map_err(TxError::Other)?;
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
    if audit.fresh {
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

/// Discard a transaction's directory. Failure to clean up leaves garbage for `recover`, never
/// a wrong workspace, so it is not an error of the run.
/// `collected`: a warm server ran the transaction, and deletes retired directories itself
/// when idle, so retiring it is all there is to do here, unless so many wait that a
/// collector is wanted now (under sustained load the server is never idle).
pub(crate) fn drop_tx(state: &StateDir, tx: TxDir, collected: bool) {
    let id = tx.id.clone();
    let wrote_something = wrote_something(&tx.upper);
    // A run that left nothing in its directory gives it to the next one (the lock held in
    // `tx` goes with it and is released below); one that wrote cannot, so is not examined.
    if !wrote_something && state.recycle_tx(&id) {
        return;
    }
    // The owner lock is let go only once the directory has left `tx`: a finished run's
    // directory without its lock is what another run's recovery takes for abandoned (and
    // audits as discarded).
    if collected && state.retire_tx(&id).is_ok() {
        drop(tx);
        start_collector(state, false);
        return;
    }
    if !wrote_something {
        // An empty layer is gone in a few syscalls.
        let _ = state.remove_tx(&id);
        drop(tx);
        return;
    }
    // A rollback returns as soon as the layer is retired; a detached collector deletes it
    // (docs/DESIGN.md §9: rollback ≤ 50 ms, cleanup may continue in the background). Should it die,
    // the next collector finishes the job.
    let retired = state.retire_tx(&id);
    drop(tx);
    if retired.is_err() {
        let _ = state.remove_tx(&id);
        return;
    }
    start_collector(state, true);
}

/// Whether a layer holds anything (unreadable: assume it does).
fn wrote_something(upper: &Path) -> bool {
    std::fs::read_dir(upper).map(|mut d| d.next().is_some()).unwrap_or(true)
}

/// Start a detached `txbox __gc` for the state directory's retired directories if one is
/// wanted (see `StateDir::collector_wanted`).
fn start_collector(state: &StateDir, cold: bool) {
    if !state.collector_wanted(cold) {
        return;
    }
    spawn_collector(state);
}

/// Start a detached `txbox __gc` for retained data to measure or evicted (unless a collector
/// is at work already).
pub(crate) fn start_retention_collector(state: &StateDir) {
    if state.collector_idle() {
        spawn_collector(state);
    }
}

fn spawn_collector(state: &StateDir) {
    let _ = std::process::Command::new("/proc/self/exe")
        .arg("__gc")
        .arg(&state.root)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

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
    written: Option<Result<(), String>>,
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
    fn kept(&mut self, kept: Vec<String>, kept_only: bool, failed: bool) {
        (self.kept, self.kept_only, self.failed) = (kept, kept_only, failed);
    }

    /// Before the commit point: open the log, or say why the commit cannot be audited.
    fn prepare(&mut self) -> Result<(), String> {
        match self.env.state.audit_log() {
            Ok(log) => {
                let empty = |p: PathBuf| std::fs::symlink_metadata(p).map_or(true, |m| m.len() == 0);
                self.fresh = empty(self.env.state.audit_path()) || empty(self.env.state.audit_head_path());
                self.log = Some(log);
                Ok(())
            }
            Err(e) => Err(format!("the commit cannot be audited ({e}); nothing changed")),
        }
    }

    /// At the commit point: the entry, outcome `committed`.
    fn committed(&mut self, cs: &ChangeSet) {
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
            Some(log) => log.append(entry, false).map(drop).map_err(|e| e.to_string()),
            None => Err("the audit log was not opened".to_string()),
        });
    }

    /// After the commit: append the outcome if the commit point was not reached (rolled back,
    /// conflict, error, nothing to commit), and report what could not be appended.
    pub(crate) fn finish(mut self, r: &mut RunResult) {
        r.duration_ms = rounded_ms(self.started);
        match self.written.take() {
            Some(Ok(())) => {}
            Some(Err(e)) => r.audit_error = Some(e),
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
