//! Command-line syntax (clap) and its translation into library calls.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use txbox::api::{ApiError, Ceiling, ErrorKind};
use txbox::config::{Config, Untrusted};
use txbox::engine;
use txbox::options::{Isolation, LimitArgs, Seconds};
use txbox::render;
use txbox::request::{self, Command, RunRequest};
use txbox::request::{Io, Limits};
use txbox::session;
use txbox_policy::Policy;
use txbox_txn::keep::KeepRules;
use txbox_txn::{audit, CrashHook, Recovered, StateDir};

#[derive(Parser, Debug)]
#[command(
    name = "txbox",
    version,
    about = "Run an AI agent's shell commands as transactions: \
    committed atomically when they succeed, rolled back when they fail, refused when irreversible."
)]
struct Cli {
    /// State directory (journal, layers, audit log). Default: ${XDG_STATE_HOME:-$HOME/.local/state}/txbox
    /// when on the workspace's filesystem (see docs/ARCHITECTURE.md for elsewhere)
    #[arg(long, global = true, env = "TXBOX_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Machine-readable output: one JSON object on stdout.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Sub,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Run one command as one transaction: `run -- PROGRAM ARGS` or `run -c 'STRING'`.
    Run(RunArgs),
    /// Open a multi-step transaction; prints its id.
    Begin {
        #[command(flatten)]
        ws: WorkspaceArg,
        /// A name to recognise it by in `txbox list`.
        #[arg(long)]
        name: Option<String>,
        /// Hosts every step may reach through txbox's proxy (as `run --allow-host`).
        #[arg(long = "allow-host", value_name = "SPEC")]
        allow_host: Vec<String>,
        /// `strict`: the commit is refused (conflict, exit 3) if any other transaction committed
        /// to the workspace after begin. Default `read-committed` (see README, Isolation).
        #[arg(long, value_enum)]
        isolation: Option<Isolation>,
    },
    /// Run one step inside an open transaction (each step is a savepoint).
    Exec {
        tx: String,
        #[command(flatten)]
        ws: WorkspaceArg,
        #[command(flatten)]
        opts: ExecOpts,
        /// Keep a failed step's changes instead of undoing the step.
        #[arg(long, value_enum, default_value = "rollback")]
        on_failure: OnFailure,
        #[arg(short = 'c', value_name = "STRING", conflicts_with = "argv")]
        command: Option<String>,
        #[arg(last = true, value_name = "PROGRAM [ARG]...")]
        argv: Vec<OsString>,
    },
    /// Show what an open transaction would change.
    Diff {
        tx: String,
        #[command(flatten)]
        ws: WorkspaceArg,
        /// Only a summary per file.
        #[arg(long)]
        stat: bool,
    },
    /// Commit an open transaction into the workspace (or hold it for a person, exit 4, if the
    /// commit-time policy says so).
    Commit {
        tx: String,
        #[command(flatten)]
        ws: WorkspaceArg,
        #[command(flatten)]
        policy: PolicyArg,
    },
    /// Commit a transaction held for a person (outcome `held`), after reviewing it with
    /// `txbox diff TX`. For people only: never offered to an agent over MCP or HTTP.
    Approve {
        tx: String,
        #[command(flatten)]
        ws: WorkspaceArg,
        #[command(flatten)]
        policy: PolicyArg,
    },
    /// Roll back a whole transaction, or back to the state right after step STEP.
    Rollback {
        tx: String,
        #[command(flatten)]
        ws: WorkspaceArg,
        #[arg(long, value_name = "STEP")]
        to: Option<u32>,
    },
    /// List open transactions.
    List(WorkspaceArg),
    /// Undo the workspace's last commit, or TX, or (--to TX) every commit after TX; itself a
    /// transaction (undo it to redo). Refused with exit 3 if what it would touch changed since.
    Undo(UndoArgs),
    /// Apply the retention budget to undo data (oldest first; --purge deletes retained data now)
    /// and bring the package caches within theirs (whole caches, least recently used first).
    Gc(GcArgs),
    /// Drop-in for `sh -c STRING` (usable as $SHELL): run and commit on success.
    #[command(disable_help_flag = true)]
    Sh {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// PreToolUse hook for Claude Code's Bash tool (JSON event on stdin): rewrite the call into
    /// `txbox sh -c`, so the tool runs it as a transaction. Exits 2 (the call is blocked) when
    /// it cannot; configure it as `txbox hook || exit 2`.
    Hook {
        /// Answer "ask" (Claude Code prompts) instead of "allow".
        #[arg(long)]
        ask: bool,
    },
    /// Show the audit log.
    Log(LogArgs),
    /// Finish (roll forward) or discard transactions interrupted by a crash.
    Recover(WorkspaceArg),
    /// A guided run on a scratch workspace: a commit, a rollback and a refusal.
    Demo {
        /// Make the scratch workspace inside DIR (default: $TMPDIR, else /var/tmp).
        #[arg(short = 'C', long = "workspace", value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// What this host supports, and how to fix what it lacks.
    Doctor(WorkspaceArg),
    /// Inspect the policy.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// HTTP API (docs/DESIGN.md §8) and MCP over streamable HTTP (/mcp) for the workspaces named here; bearer-token auth.
    /// Limits given here are ceilings: the most a request may ask for, and what it gets by default.
    Serve {
        /// Address to listen on, e.g. 127.0.0.1:8731.
        #[arg(long, value_name = "ADDR")]
        listen: String,
        /// File whose first line is the bearer token (else env TXBOX_TOKEN).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Most connections open at once; further ones are closed at once.
        #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
        max_connections: u32,
        /// Seconds a client has to send a request's headers (and its body), and the longest a
        /// kept-alive connection may sit idle.
        #[arg(long, value_name = "SECS", default_value = "10")]
        header_timeout: Seconds,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Model Context Protocol server on stdio (tools run, begin, exec, diff, commit, rollback, undo, list, log).
    /// Limits given here are ceilings: the most a tool call may ask for, and what it gets by default.
    Mcp {
        /// Most tool calls at once (each `run` is a sandbox); further calls wait their turn.
        #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
        max_running: u32,
        #[command(flatten)]
        server: ServerArgs,
    },
}

/// What the operator sets for a server (`serve`, `mcp`): the workspaces, the policy and the
/// ceilings of every request. Flags win over the configuration file.
#[derive(Args, Debug, Clone)]
struct ServerArgs {
    /// A workspace requests may use (repeatable; default: the configuration's, else the current directory).
    #[arg(short = 'C', long = "workspace", value_name = "DIR")]
    workspaces: Vec<PathBuf>,
    #[command(flatten)]
    policy: PolicyArg,
    #[command(
        flatten,
        next_help_heading = "Ceilings (a request may only narrow them; `--network host` lets requests ask for it)"
    )]
    limits: LimitArgs,
    /// The weakest isolation a request may ask for (`strict`: every transaction is strict).
    #[arg(long, value_enum)]
    isolation: Option<Isolation>,
    /// Pass this variable to commands although its name or value marks a credential (repeatable).
    #[arg(long = "pass-env", value_name = "NAME")]
    pass_env: Vec<String>,
}

impl ServerArgs {
    /// Resolve flags over the configuration file into what `serve`/`mcp` need.
    fn resolve(self, state_dir: Option<PathBuf>) -> Result<crate::serve::Served> {
        let cwd = std::env::current_dir().context("reading the current directory")?;
        let untrusted = Untrusted {
            workspaces: self.workspaces.clone(),
            state_dir: state_dir.clone(),
            fallback: self.workspaces.is_empty().then(|| cwd.clone()),
        };
        let config = Config::load_default(&untrusted)?;
        let workspaces = match (self.workspaces.is_empty(), &config.workspace) {
            (true, Some(w)) => vec![w.clone()],
            (true, None) => vec![cwd],
            (false, _) => self.workspaces,
        };
        let ceiling = Ceiling {
            limits: self.limits.or(&config.limits),
            isolation: self.isolation.or(config.isolation).unwrap_or_default(),
            keep: config.keep_rules()?,
            pass_env: if self.pass_env.is_empty() { config.pass_env } else { self.pass_env },
            liftable: Vec::new(),
            hide: Vec::new(),
        };
        Ok(crate::serve::Served {
            workspaces,
            state_dir: state_dir.or(config.state_dir),
            policy_file: self.policy.file.or(config.policy),
            ceiling,
        })
    }
}

#[derive(Args, Debug)]
struct WorkspaceArg {
    /// Workspace directory (default: the current directory).
    #[arg(short = 'C', long = "workspace", value_name = "DIR")]
    workspace: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ExecOpts {
    #[command(flatten)]
    policy: PolicyArg,
    #[command(flatten)]
    limits: LimitArgs,
    /// Pass this variable to the command although its name or value marks a credential
    /// (repeatable); without it such variables are withheld.
    #[arg(long = "pass-env", value_name = "NAME")]
    pass_env: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum OnFailure {
    Rollback,
    Keep,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    ws: WorkspaceArg,
    #[command(flatten)]
    opts: ExecOpts,
    /// A check run after the command in the same transaction; commit only if it exits 0.
    #[arg(long, value_name = "STRING")]
    validate: Option<String>,
    /// What a failed command leaves: rolled back (default), or kept pending for review.
    #[arg(long, value_enum, default_value = "rollback")]
    on_failure: OnFailure,
    /// Leave the transaction pending for review (prints its id) instead of committing.
    #[arg(long)]
    no_commit: bool,
    /// Keep nothing of a failed command: without it, what it wrote in kept directories (build
    /// output: target/, __pycache__/, ...; the configuration's `keep`) is committed anyway.
    #[arg(long)]
    no_keep: bool,
    /// `strict`: refused as a conflict (exit 3, nothing applied) if any other transaction
    /// committed to the workspace while it ran. Default `read-committed` (see README, Isolation).
    #[arg(long, value_enum)]
    isolation: Option<Isolation>,
    /// The command as a shell string, run with `bash -c` semantics.
    #[arg(short = 'c', value_name = "STRING", conflicts_with = "argv")]
    command: Option<String>,
    /// The command as PROGRAM ARGS, after `--`.
    #[arg(last = true, value_name = "PROGRAM [ARG]...")]
    argv: Vec<OsString>,
}

#[derive(Args, Debug)]
struct UndoArgs {
    #[command(flatten)]
    ws: WorkspaceArg,
    /// The transaction to undo (default: the workspace's last commit).
    #[arg(value_name = "TX", conflicts_with = "to")]
    tx: Option<String>,
    /// Return to the state right after TX: undo every later commit, newest first, as one transaction.
    #[arg(long, value_name = "TX")]
    to: Option<String>,
}

#[derive(Args, Debug)]
struct GcArgs {
    #[command(flatten)]
    ws: WorkspaceArg,
    /// Delete this transaction's retained data now (it is no longer undoable). Repeatable.
    #[arg(long, value_name = "TX")]
    purge: Vec<String>,
    /// Delete all retained data of the state directory now (every workspace that uses it).
    #[arg(long, conflicts_with = "purge")]
    purge_all: bool,
    /// The most every package cache together may take (suffixes K, M, G; default 10G).
    #[arg(long, value_name = "BYTES", value_parser = txbox::size::parse_size)]
    max_cache_size: Option<u64>,
}

#[derive(Args, Debug)]
struct LogArgs {
    #[command(flatten)]
    ws: WorkspaceArg,
    /// Show only the last N entries.
    #[arg(short = 'n', value_name = "N")]
    n: Option<usize>,
    /// Check the hash chain instead of printing.
    #[arg(long)]
    verify: bool,
}

#[derive(Subcommand, Debug)]
enum PolicyCmd {
    /// Evaluate a command string and print the decision and the commands extracted.
    Check {
        #[command(flatten)]
        ws: WorkspaceArg,
        #[command(flatten)]
        policy: PolicyArg,
        /// Judge network targets the command names against these hosts (as `run --allow-host`;
        /// without any, the network is off, as for `run`).
        #[arg(long = "allow-host", value_name = "SPEC")]
        allow_host: Vec<String>,
        #[arg(short = 'c', value_name = "STRING")]
        command: String,
    },
    /// Check a policy file: syntax, rules, their examples; print warnings.
    Lint { file: PathBuf },
    /// Print the effective policy (the built-in one merged with --policy FILE) as TOML.
    Show {
        #[command(flatten)]
        policy: PolicyArg,
    },
}

#[derive(Args, Debug, Clone)]
struct PolicyArg {
    /// A policy file (TOML, version = 1) merged over the built-in policy.
    #[arg(long = "policy", value_name = "FILE", env = "TXBOX_POLICY")]
    file: Option<PathBuf>,
}

impl PolicyArg {
    fn load(&self) -> Result<Policy> {
        Ok(match &self.file {
            Some(f) => Policy::load(f)?,
            None => Policy::builtin(),
        })
    }
}

/// Whether `--json` is among the options (before `--`), for errors raised before parsing ends.
fn wants_json(args: &[OsString]) -> bool {
    args.iter().skip(1).take_while(|a| *a != "--").any(|a| a == "--json")
}

/// Parse, run, and report a failure: as `{"error": {"kind", "message"}}` on stdout with
/// `--json` (exactly one object, whatever failed), else as a line on stderr. Returns the exit
/// status: 2 for usage errors, 125 when txbox failed.
pub fn main(args: Vec<OsString>) -> i32 {
    let json = wants_json(&args);
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            // --help, --version: not errors.
            let _ = e.print();
            return 0;
        }
        Err(e) => {
            if json {
                println!("{}", ApiError::usage(first_line(&e.to_string())).to_json());
            } else {
                let _ = e.print();
            }
            return 2;
        }
    };
    // A shell drop-in's statuses are the command's own: any failure of txbox itself is 125.
    let shell = matches!(cli.command, Sub::Sh { .. });
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            let e = classify(&e);
            // With --json the object on stdout is for programs; the line on stderr for people.
            if json {
                println!("{}", e.to_json());
            }
            eprintln!("txbox: error: {}", e.message);
            if shell {
                125
            } else {
                e.kind.exit_code()
            }
        }
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim_start_matches("error: ").to_string()
}

/// The kind of a failure that ended a command before it had a result.
fn classify(e: &anyhow::Error) -> ApiError {
    // The chain of causes, each said once (a typed error often repeats its source's text).
    let mut message = String::new();
    for cause in e.chain() {
        let t = cause.to_string();
        if !message.contains(&t) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&t);
        }
    }
    let kind = if let Some(a) = e.downcast_ref::<ApiError>() {
        a.kind
    } else if let Some(x) = e.downcast_ref::<request::EngineError>() {
        txbox::api::engine_kind(x)
    } else if e.downcast_ref::<txbox::options::RangeError>().is_some()
        || e.downcast_ref::<txbox_policy::PolicyError>().is_some()
        || e.downcast_ref::<Usage>().is_some()
    {
        ErrorKind::Usage
    } else {
        ErrorKind::Internal
    };
    ApiError::new(kind, message)
}

/// A mistake in how txbox was called, found after parsing.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Usage(String);

fn dispatch(cli: Cli) -> Result<i32> {
    let json = cli.json;
    let state_dir = cli.state_dir;
    match cli.command {
        Sub::Run(a) => cmd_run(state_dir, json, a),
        Sub::Begin { ws, name, isolation, allow_host } => {
            let id = session::begin(
                &workspace_of(&ws)?,
                state_dir.as_deref(),
                name.as_deref(),
                isolation.unwrap_or_default(),
                &allow_host,
            )?;
            if json {
                println!("{}", serde_json::json!({ "tx": id }));
            } else {
                println!("{id}");
            }
            Ok(0)
        }
        Sub::Exec { tx, ws, opts, on_failure, command, argv } => {
            let command = command_of(command, argv)?;
            let (state, cwd) = locate_tx(state_dir.as_deref(), &ws, &tx)?;
            let req = session::ExecRequest {
                tx,
                cwd,
                command,
                policy: opts.policy.load()?,
                policy_file: opts.policy.file.clone(),
                io: if json { Io::Capture } else { Io::Inherit },
                limits: limits_of(&opts.limits)?,
                keep_on_failure: on_failure == OnFailure::Keep,
                pass_env: opts.pass_env.clone(),
            };
            let r = session::exec(&state, &req)?;
            Ok(show(json, &r))
        }
        Sub::Diff { tx, ws, stat } => {
            let (state, _) = locate_tx(state_dir.as_deref(), &ws, &tx)?;
            let held = session::held(&state, &tx)?;
            let text = session::with_diff(&state, &tx, |env, cs, upper| {
                Ok(if json {
                    let c = txbox::result::Changes::of(cs);
                    let dropped = txbox::result::DroppedXattr::of(cs);
                    serde_json::json!({"tx": tx, "added": c.added, "modified": c.modified, "deleted": c.deleted,
                        "dropped_xattrs": dropped, "held": held})
                    .to_string()
                } else {
                    // What a person is asked to approve comes first.
                    let mut text: String = held.iter().map(|h| format!("held: {} [{}]\n", h.reason, h.rule)).collect();
                    text.push_str(&if stat {
                        txbox::diff::stat(cs, &env.workspace, upper)
                    } else {
                        txbox::diff::unified(cs, &env.workspace, upper)
                    });
                    text
                })
            })?;
            print!("{text}");
            if json {
                println!();
            }
            Ok(0)
        }
        Sub::Commit { tx, ws, policy } => {
            let (state, _) = locate_tx(state_dir.as_deref(), &ws, &tx)?;
            let r = session::commit(&state, &tx, &policy.load()?)?;
            Ok(show(json, &r))
        }
        Sub::Approve { tx, ws, policy } => {
            let (state, _) = locate_tx(state_dir.as_deref(), &ws, &tx)?;
            let r = session::approve(&state, &tx, &policy.load()?)?;
            Ok(show(json, &r))
        }
        Sub::Rollback { tx, ws, to } => {
            let (state, _) = locate_tx(state_dir.as_deref(), &ws, &tx)?;
            let r = session::rollback(&state, &tx, to)?;
            Ok(show(json, &r))
        }
        Sub::List(ws) => {
            let txs = match state_for(state_dir, &ws)? {
                Some(state) => session::list(&state)?,
                None => Vec::new(),
            };
            if json {
                println!("{}", serde_json::to_string(&txs)?);
            } else {
                for t in &txs {
                    println!(
                        "{}  {:<10} steps {:?}  {}{}",
                        t.tx,
                        t.status,
                        t.steps,
                        t.workspace,
                        t.name.as_deref().map(|n| format!("  ({n})")).unwrap_or_default()
                    );
                    for h in &t.held {
                        println!("    held: {} [{}]", h.reason, h.rule);
                    }
                }
            }
            Ok(0)
        }
        Sub::Undo(a) => cmd_undo(state_dir, json, a),
        Sub::Gc(a) => cmd_gc(state_dir, json, a),
        Sub::Sh { args } => crate::shim::main(state_dir, args),
        Sub::Hook { ask } => Ok(crate::hook::main(ask)),
        Sub::Log(a) => cmd_log(state_dir, json, a),
        Sub::Recover(a) => cmd_recover(state_dir, json, a),
        Sub::Demo { dir } => crate::demo::run(dir.as_deref()),
        Sub::Doctor(a) => crate::doctor::run(json, state_dir.as_deref(), a.workspace.as_deref()),
        Sub::Policy(PolicyCmd::Check { ws, policy, allow_host, command }) => {
            cmd_policy_check(json, ws, &policy, &allow_host, &command)
        }
        Sub::Policy(PolicyCmd::Lint { file }) => match txbox_policy::lint(&file) {
            Ok(warnings) => {
                if json {
                    println!("{}", serde_json::json!({"ok": true, "warnings": warnings}));
                } else {
                    for w in &warnings {
                        println!("warning: {w}");
                    }
                    println!("{}: ok ({} warnings)", file.display(), warnings.len());
                }
                Ok(0)
            }
            Err(e) => {
                if json {
                    println!("{}", serde_json::json!({"ok": false, "error": e.to_string()}));
                } else {
                    eprintln!("txbox: {e}");
                }
                Ok(1)
            }
        },
        Sub::Serve { listen, token_file, max_connections, header_timeout, server } => {
            let limits =
                crate::serve::ConnLimits { max: max_connections as usize, header_timeout: header_timeout.duration() };
            crate::serve::main(&listen, server.resolve(state_dir)?, token_file.as_deref(), limits)
        }
        Sub::Mcp { max_running, server } => crate::mcp::main(server.resolve(state_dir)?, max_running as usize),
        Sub::Policy(PolicyCmd::Show { policy }) => {
            print!("{}", policy.load()?.to_toml());
            Ok(0)
        }
    }
}

/// The state directory of transaction `tx`, found from any directory, and the working directory
/// for a step: the current one, or with `-C DIR` the workspace, which must be the transaction's
/// (the current directory is kept when it lies inside it, as for `run`).
fn locate_tx(state_dir: Option<&std::path::Path>, ws: &WorkspaceArg, tx: &str) -> Result<(StateDir, PathBuf)> {
    let cwd = std::env::current_dir().unwrap_or_default();
    let state = session::locate_state(state_dir, &cwd, tx)?;
    if ws.workspace.is_none() {
        return Ok((state, cwd));
    }
    let named = workspace_of(ws)?;
    let meta = state.read_meta(tx)?;
    if meta.workspace != named {
        return Err(Usage(format!(
            "transaction {tx} belongs to the workspace {}, not {}",
            meta.workspace.display(),
            named.display()
        ))
        .into());
    }
    let cwd = if cwd.starts_with(&named) { cwd } else { named };
    Ok((state, cwd))
}

fn workspace_of(ws: &WorkspaceArg) -> Result<PathBuf> {
    Ok(request::resolve_workspace(&workspace_given(ws)?)?)
}

/// The workspace directory named (`-C`), else the current directory; not resolved.
fn workspace_given(ws: &WorkspaceArg) -> Result<PathBuf> {
    match &ws.workspace {
        Some(d) => Ok(d.clone()),
        None => std::env::current_dir().context("reading the current directory"),
    }
}

fn command_of(command: Option<String>, argv: Vec<OsString>) -> Result<Command> {
    Ok(match (command, argv.is_empty()) {
        (Some(s), true) => Command::Shell(s),
        (None, false) => Command::Argv(argv),
        (Some(_), false) => return Err(Usage("give either -c STRING or -- PROGRAM ARGS, not both".into()).into()),
        (None, true) => return Err(Usage("nothing to run: give -c STRING or -- PROGRAM ARGS".into()).into()),
    })
}

/// What `run` and `exec` enforce: the flags' limits; `--allow-host` with `--network host` is a
/// usage error (the host's whole network leaves nothing to allow).
fn limits_of(l: &LimitArgs) -> Result<Limits> {
    if l.network == Some(txbox::options::Network::Host) && l.allow_hosts.as_ref().is_some_and(|a| !a.is_empty()) {
        return Err(Usage(
            "--allow-host limits a command's network; with --network host it has the host's whole network".into(),
        )
        .into());
    }
    Ok(l.to_limits())
}

/// Print a result (JSON on stdout, or the summary on stderr, after what the network saw) and
/// return its exit status.
fn show(json: bool, r: &txbox::RunResult) -> i32 {
    // The network's hint (it was off, or hosts were refused) is said on stderr either way.
    let hint = r.network.as_ref().and_then(|n| n.hint.as_deref());
    if json {
        println!("{}", render::json(r));
        // What an agent reading only the status must not miss is said on stderr too.
        for warning in render::warnings(r).into_iter().chain(hint.map(str::to_string)) {
            eprintln!("{warning}");
        }
    } else {
        if let Some(hint) = hint {
            eprintln!("{hint}");
        }
        eprintln!("{}", render::summary(r));
    }
    r.exit_code
}

fn cmd_run(state_dir: Option<PathBuf>, json: bool, a: RunArgs) -> Result<i32> {
    let req = RunRequest {
        // As given: the engine resolves it (`Env::open`), once per run.
        workspace: workspace_given(&a.ws)?,
        state_dir,
        cwd: std::env::current_dir().unwrap_or_default(),
        command: command_of(a.command, a.argv)?,
        policy: a.opts.policy.load()?,
        policy_file: a.opts.policy.file.clone(),
        io: if json { Io::Capture } else { Io::Inherit },
        limits: limits_of(&a.opts.limits)?,
        validate: a.validate,
        no_commit: a.no_commit,
        keep_on_failure: a.on_failure == OnFailure::Keep,
        isolation: a.isolation.unwrap_or_default(),
        pass_env: a.opts.pass_env,
        keep: if a.no_keep { KeepRules::none() } else { configured_keep(&a.ws) },
    };
    let r = engine::run(&req)?;
    Ok(show(json, &r))
}

fn cmd_undo(state_dir: Option<PathBuf>, json: bool, a: UndoArgs) -> Result<i32> {
    use txbox_txn::undo::Target;
    let target = match (a.tx, a.to) {
        (Some(tx), None) => Target::Tx(tx),
        (None, Some(to)) => Target::To(to),
        _ => Target::Last,
    };
    // Without -C, a transaction named is undone in its own workspace (ids resolve from anywhere).
    let named = match &target {
        Target::Tx(id) | Target::To(id) => Some(id.clone()),
        Target::Last => None,
    };
    let workspace = match (&a.ws.workspace, named) {
        (None, Some(id)) => match txbox::undo::workspace_of(state_dir.as_deref(), &id) {
            Some(w) => w,
            None => workspace_of(&a.ws)?,
        },
        _ => workspace_of(&a.ws)?,
    };
    let r = txbox::undo::undo(&txbox::undo::UndoRequest { workspace, state_dir, target, judged_by: None })?;
    Ok(show(json, &r))
}

/// The kept directories of the configuration file, else the defaults. `run` reads no other key
/// of it; a file it cannot use is reported and the defaults apply.
fn configured_keep(ws: &WorkspaceArg) -> KeepRules {
    let cwd = std::env::current_dir().unwrap_or_default();
    let untrusted = Untrusted {
        workspaces: ws.workspace.iter().cloned().collect(),
        state_dir: None,
        fallback: ws.workspace.is_none().then_some(cwd),
    };
    match Config::load_default(&untrusted).and_then(|c| c.keep_rules()) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("txbox: {}; the default kept directories apply", e.message);
            KeepRules::default()
        }
    }
}

/// `txbox gc`: undo data within the retention budget (`txbox_txn::retain`), retired
/// directories, the package caches within theirs (`txbox::caches::gc`), and what warm servers
/// that are gone left (`txbox_sandbox::warm::stale`).
fn cmd_gc(state_dir: Option<PathBuf>, json: bool, a: GcArgs) -> Result<i32> {
    let Some(state) = state_for(state_dir, &a.ws)? else {
        if json {
            println!("{}", serde_json::json!({"purged": [], "evicted": [], "count": 0, "bytes": 0}));
        } else {
            eprintln!("txbox: nothing retained (no state directory yet)");
        }
        return Ok(0);
    };
    let budget = txbox::retention::budget().map_err(anyhow::Error::msg)?;
    let purged = if a.purge_all || !a.purge.is_empty() {
        txbox_txn::retain::purge(&state, &a.purge, a.purge_all)?
    } else {
        Vec::new()
    };
    let retired = state.collect_retired()?;
    let c = txbox_txn::retain::collect(&state, &budget)?;
    let caches = txbox::caches::gc(&state.root, a.max_cache_size.unwrap_or(txbox::caches::DEFAULT_BUDGET));
    let warm = txbox_sandbox::warm::stale::remove(&state.warm_dir());
    if json {
        println!(
            "{}",
            serde_json::json!({
                "purged": purged, "evicted": c.evicted, "measured": c.measured, "retired_deleted": retired,
                "count": c.count, "bytes": c.bytes,
                "budget": {"count": budget.count, "bytes": budget.bytes, "min_free": budget.min_free.to_string()},
                "caches": caches, "warm_servers_removed": warm,
            })
        );
    } else {
        for id in &purged {
            eprintln!("txbox: purged the retained data of {id} (no longer undoable)");
        }
        for id in &c.evicted {
            eprintln!("txbox: {id} expired (retention budget): no longer undoable");
        }
        eprintln!(
            "txbox: {} transactions undoable, {} retained (budget: {} transactions, {}, {} kept free)",
            c.count,
            txbox::undo::human_bytes(c.bytes),
            budget.count,
            txbox::undo::human_bytes(budget.bytes),
            budget.min_free
        );
        eprintln!(
            "txbox: package caches {} → {} ({} removed)",
            txbox::size::show_size(caches.before),
            txbox::size::show_size(caches.after),
            caches.removed.len()
        );
        if warm > 0 {
            eprintln!("txbox: removed what {warm} warm server(s) that are gone left behind");
        }
    }
    for e in &caches.errors {
        eprintln!("txbox: gc: {e}");
    }
    Ok(i32::from(!caches.errors.is_empty()))
}

/// The workspace's state directory if it has one (nothing is made: these commands only look).
fn state_for(state_dir: Option<PathBuf>, ws: &WorkspaceArg) -> Result<Option<StateDir>> {
    let workspace = match (&state_dir, &ws.workspace) {
        // With --state-dir and no -C, the workspace does not matter.
        (Some(_), None) => std::env::current_dir().context("reading the current directory")?,
        _ => workspace_of(ws)?,
    };
    Ok(StateDir::existing_for_workspace(state_dir.as_deref(), &workspace)?)
}

fn cmd_log(state_dir: Option<PathBuf>, json: bool, a: LogArgs) -> Result<i32> {
    let Some(state) = state_for(state_dir, &a.ws)? else {
        // No state directory yet: an empty log, which verifies.
        match (json, a.verify) {
            (true, true) => println!("{}", serde_json::json!({"ok": true, "entries": 0})),
            (true, false) => println!("[]"),
            (false, true) => println!("no audit log yet: 0 entries"),
            (false, false) => {}
        }
        return Ok(0);
    };
    let path = state.audit_path();
    if a.verify {
        return Ok(show_verify(json, &path, state.verify_audit()));
    }
    let mut entries = audit::read_all(&path)?;
    // One state directory serves many workspaces: show this one's entries (`-C`, else the
    // current directory), and those of no workspace in particular. `--verify` checks them all.
    let ws = workspace_of(&a.ws)?;
    let name = ws.to_string_lossy();
    entries.retain(|e| e.workspace == name || e.workspace.is_empty());
    if let Some(n) = a.n {
        let skip = entries.len().saturating_sub(n);
        entries.drain(..skip);
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Which committed transactions are still undoable, and what their undo data holds.
    let committed = |e: &audit::Entry| matches!(e.outcome.as_str(), "committed" | "rolled_forward");
    if json {
        let mut list = Vec::with_capacity(entries.len());
        for e in &entries {
            let mut v = serde_json::to_value(e)?;
            if committed(e) {
                if let serde_json::Value::Object(m) = &mut v {
                    m.insert("undo".into(), txbox::undo::undo_mark(&state, &e.tx));
                }
            }
            list.push(v);
        }
        writeln!(out, "{}", serde_json::Value::Array(list))?;
    } else {
        for e in &entries {
            let c = &e.changes;
            let rule = e.rule.as_deref().map(|r| format!(" [{r}]")).unwrap_or_default();
            let undo = if committed(e) { txbox::undo::undo_mark_text(&state, &e.tx) } else { String::new() };
            writeln!(
                out,
                "{:>4} {} {:<11} exit {:<3} +{} ~{} -{} {:>8} {:<15} {}{rule}",
                e.seq,
                render::short(&e.tx),
                e.outcome,
                e.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
                c.added,
                c.modified,
                c.deleted,
                render::ms(e.duration_ms),
                undo,
                render::printable(&e.command),
            )?;
        }
    }
    Ok(0)
}

/// Print what `log --verify` found; exit 0 when nothing was changed, removed or lost (torn
/// lines, appends a crash cut short, are reported but are no loss of a finished entry).
fn show_verify(json: bool, path: &std::path::Path, report: Result<audit::Report, audit::AuditError>) -> i32 {
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            if json {
                println!("{}", serde_json::json!({"ok": false, "error": e.to_string()}));
            } else {
                eprintln!("txbox: audit log does not verify: {e}");
            }
            return 1;
        }
    };
    let damage: Vec<String> = report.damage.iter().map(|(line, what)| format!("line {line}: {what}")).collect();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "ok": report.ok(),
                "entries": report.entries,
                "torn": report.torn,
                "damage": damage,
                "head": report.head,
                "error": (!report.problems.is_empty()).then(|| report.problems.join("; ")),
            })
        );
    } else {
        for p in &report.problems {
            eprintln!("txbox: audit log does not verify: {p}");
        }
        for d in &damage {
            eprintln!("txbox: audit log recorded a loss at {d}");
        }
        for t in &report.torn {
            eprintln!("txbox: audit log line {t} is torn (an append cut short by a crash or a full disk)");
        }
        if report.ok() {
            let head = if report.head { "" } else { " (no head record yet: the newest entries are not vouched for)" };
            println!("audit log {}: {} entries, hash chain intact{head}", path.display(), report.entries);
        }
    }
    if report.ok() {
        0
    } else {
        1
    }
}

fn cmd_recover(state_dir: Option<PathBuf>, json: bool, a: WorkspaceArg) -> Result<i32> {
    let Some(state) = state_for(state_dir, &a)? else {
        if json {
            println!("{}", serde_json::json!({"recovered": []}));
        } else {
            eprintln!("txbox: nothing to recover (no state directory yet)");
        }
        return Ok(0);
    };
    let done = txbox_txn::recover(&state, None, &mut CrashHook::from_env())?;
    // What was recovered stays recovered: a log that cannot take it is reported, not an error.
    let audit_error = txbox::audit::audit_recovered(&state, &done).err().map(|e| e.to_string());
    if let Some(e) = &audit_error {
        eprintln!("txbox: what recovery did could not be audited: {e}");
    }
    let mut items = Vec::new();
    for r in &done {
        let (tx, what) = match r {
            Recovered::RolledForward { tx, .. } => (tx.clone(), "rolled_forward"),
            Recovered::Landed { tx, .. } => (tx.clone(), "landed"),
            Recovered::Discarded { tx } => (tx.clone(), "discarded"),
        };
        if !json {
            eprintln!("txbox: {what} tx {}", render::short(&tx));
        }
        items.push(serde_json::json!({"tx": tx, "action": what}));
    }
    if json {
        let mut out = serde_json::json!({ "recovered": items });
        if let Some(e) = audit_error {
            out["audit_error"] = serde_json::Value::String(e);
        }
        println!("{out}");
    } else if done.is_empty() {
        eprintln!("txbox: nothing to recover");
    }
    Ok(0)
}

fn cmd_policy_check(json: bool, ws: WorkspaceArg, policy: &PolicyArg, allow: &[String], command: &str) -> Result<i32> {
    let cwd = std::env::current_dir().unwrap_or_default();
    let workspace = match &ws.workspace {
        Some(_) => workspace_of(&ws)?,
        None => cwd.clone(),
    };
    let policy = policy.load()?;
    let mut ev = policy.evaluate_str(command, &request::policy_context(&workspace, &cwd));
    if ev.decision.action != txbox_policy::Action::Deny {
        let allow_hosts = txbox_netproxy::allow::parse_all(allow).map_err(|e| Usage(e.to_string()))?;
        let limits = Limits { allow_hosts, ..Limits::default() };
        // The policy file's hosts are the caller's input, as `--allow-host` is.
        let limits = txbox::network::with_policy_hosts(&limits, &policy, &[]).map_err(|e| Usage(e.to_string()))?;
        if let Some(d) = txbox::network::visible_denial(&ev.commands, false, &limits.allow_hosts, None) {
            ev.decision = d;
        }
    }
    if json {
        let d = &ev.decision;
        println!(
            "{}",
            serde_json::json!({"action": d.action, "rule": d.rule, "reason": d.reason, "commands": ev.commands})
        );
    } else {
        let d = &ev.decision;
        println!(
            "{}: {}{}",
            d.action.as_str(),
            d.reason,
            d.rule.as_deref().map(|r| format!(" [{r}]")).unwrap_or_default()
        );
    }
    // As `run` would: 126 when the command would be refused.
    Ok(if ev.decision.action == txbox_policy::Action::Deny { 126 } else { 0 })
}
