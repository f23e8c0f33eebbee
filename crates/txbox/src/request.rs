//! What a run is asked to do and where: the request ([`RunRequest`], [`Command`]), the
//! workspace with its state directory ([`Env`]), how a command is judged
//! (`evaluate`, [`policy_context`]) and the error every stage returns ([`EngineError`]).
//!
//! Owns these shared types, so that the run pipeline (`crate::engine`) and the session
//! commands (`crate::session`), which `run --validate`/`--no-commit` hand over to, both depend
//! on them and not on each other. May not run anything: no stage of a transaction lives here.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use txbox_policy::{Context, Policy};
use txbox_txn::keep::KeepRules;
use txbox_txn::retain;
use txbox_txn::StateDir;

use serde::{Deserialize, Serialize};

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
    /// The operator's own secrets, hidden from the command besides what the rules hide (the
    /// server's token file): set by the front end, never by a request.
    pub hide: Vec<PathBuf>,
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

/// What a transaction sees of commits made while it runs, and what refuses its commit.
#[derive(clap::ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// Reads see the workspace as it is now (commits made after the transaction began
    /// included); the commit is refused only if a path it changes was changed since it began.
    #[default]
    ReadCommitted,
    /// As read-committed, and the commit is refused (conflict, exit 3) if any other
    /// transaction committed to the workspace since this one began.
    Strict,
}

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
    Audit(#[from] txbox_txn::audit::AuditError),
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

    /// On a nearly full filesystem, retained undo data yields first (oldest first,
    /// `txbox_txn::retain::yield_if_low`): the transactions no longer undoable. Costs one
    /// `statvfs` when there is room.
    pub fn yield_if_low(&self) -> Vec<String> {
        match crate::retention::budget() {
            Ok(b) if b.enabled() => retain::yield_if_low(&self.state, &b).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    pub(crate) fn cwd_for(&self, cwd: &Path) -> PathBuf {
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
