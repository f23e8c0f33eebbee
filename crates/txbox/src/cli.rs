//! Command-line syntax (clap) and its translation into library calls.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::{Args, Parser, Subcommand};
use txbox::engine::{self, Command, Io, RunRequest};
use txbox::render;
use txbox::session;
use txbox_policy::Policy;
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
    },
    /// Run one step inside an open transaction (each step is a savepoint).
    Exec {
        tx: String,
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
        /// Only a summary per file.
        #[arg(long)]
        stat: bool,
    },
    /// Commit an open transaction into the workspace.
    Commit { tx: String },
    /// Roll back a whole transaction, or back to the state right after step STEP.
    Rollback {
        tx: String,
        #[arg(long, value_name = "STEP")]
        to: Option<u32>,
    },
    /// List open transactions.
    List(WorkspaceArg),
    /// Drop-in for `sh -c STRING` (usable as $SHELL): run and commit on success.
    #[command(disable_help_flag = true)]
    Sh {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// Show the audit log.
    Log(LogArgs),
    /// Finish (roll forward) or discard transactions interrupted by a crash.
    Recover(WorkspaceArg),
    /// A guided run on a scratch workspace: a commit, a rollback and a refusal.
    Demo,
    /// What this host supports, and how to fix what it lacks.
    Doctor,
    /// Inspect the policy.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// HTTP API (DESIGN §7) and MCP over streamable HTTP (/mcp) for the workspaces named here; bearer-token auth.
    Serve {
        /// Address to listen on, e.g. 127.0.0.1:8731.
        #[arg(long, value_name = "ADDR")]
        listen: String,
        /// A workspace requests may use (repeatable; default: the current directory).
        #[arg(short = 'C', long = "workspace", value_name = "DIR")]
        workspaces: Vec<PathBuf>,
        /// File whose first line is the bearer token (else env TXBOX_TOKEN).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        #[command(flatten)]
        policy: PolicyArg,
        /// Hosts commands may reach through txbox's proxy, at most (requests may only narrow it).
        #[arg(long = "allow-host", value_name = "SPEC")]
        allow_host: Vec<String>,
    },
    /// Model Context Protocol server on stdio (tools run, begin, exec, diff, commit, rollback, log).
    Mcp {
        /// A workspace the tools may use (repeatable; default: the current directory).
        #[arg(short = 'C', long = "workspace", value_name = "DIR")]
        workspaces: Vec<PathBuf>,
        #[command(flatten)]
        policy: PolicyArg,
        /// Hosts commands may reach through txbox's proxy, at most (requests may only narrow it).
        #[arg(long = "allow-host", value_name = "SPEC")]
        allow_host: Vec<String>,
    },
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
    /// Wall-clock limit in seconds; the whole process tree is killed and rolled back (exit 124).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Output limit per stream (suffixes: K, M, G): exceeding it kills and rolls back.
    #[arg(long, value_name = "BYTES", value_parser = txbox::size::parse_size)]
    max_output: Option<u64>,
    /// Memory limit of the whole process tree (cgroup).
    #[arg(long, value_name = "BYTES", value_parser = txbox::size::parse_size)]
    memory: Option<u64>,
    /// Most processes the command may have at once (cgroup).
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// CPU time limit in seconds per process (RLIMIT_CPU).
    #[arg(long, value_name = "SECS")]
    cpu: Option<u64>,
    /// Most bytes the command may write into the workspace view.
    #[arg(long, value_name = "BYTES", value_parser = txbox::size::parse_size)]
    max_write: Option<u64>,
    /// `none` (default): a private network namespace with loopback only; `host`: the host's.
    #[arg(long, value_enum, default_value = "none")]
    network: Network,
    /// Let the command reach these hosts through txbox's proxy (repeatable, comma lists): HOST,
    /// *.DOMAIN, HOST:PORT, an address, or a preset: @pypi @npm @crates @go @github.
    #[arg(long = "allow-host", value_name = "SPEC")]
    allow_host: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Network {
    None,
    Host,
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
    /// The command as a shell string, run with `bash -c` semantics.
    #[arg(short = 'c', value_name = "STRING", conflicts_with = "argv")]
    command: Option<String>,
    /// The command as PROGRAM ARGS, after `--`.
    #[arg(last = true, value_name = "PROGRAM [ARG]...")]
    argv: Vec<OsString>,
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

pub fn main(args: Vec<OsString>) -> Result<i32> {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return Ok(code);
        }
    };
    let json = cli.json;
    let state_dir = cli.state_dir;
    match cli.command {
        Sub::Run(a) => cmd_run(state_dir, json, a),
        Sub::Begin { ws, name, allow_host } => {
            let id = session::begin_with(&workspace_of(&ws)?, state_dir.as_deref(), name.as_deref(), &allow_host)?;
            if json {
                println!("{}", serde_json::json!({ "tx": id }));
            } else {
                println!("{id}");
            }
            Ok(0)
        }
        Sub::Exec { tx, opts, on_failure, command, argv } => {
            let command = command_of(command, argv)?;
            let cwd = std::env::current_dir().unwrap_or_default();
            let state = session::locate_state(state_dir.as_deref(), &cwd, &tx)?;
            let req = session::ExecRequest {
                tx,
                cwd,
                command,
                policy: opts.policy.load()?,
                policy_file: opts.policy.file.clone(),
                io: if json { Io::Capture } else { Io::Inherit },
                limits: limits(&opts)?,
                keep_on_failure: on_failure == OnFailure::Keep,
            };
            let r = session::exec(&state, &req)?;
            Ok(show(json, &r))
        }
        Sub::Diff { tx, stat } => {
            let cwd = std::env::current_dir().unwrap_or_default();
            let state = session::locate_state(state_dir.as_deref(), &cwd, &tx)?;
            let text = session::with_diff(&state, &tx, |env, cs, upper| {
                Ok(if json {
                    let c = txbox::engine::Changes::of(cs);
                    serde_json::json!({"tx": tx, "added": c.added, "modified": c.modified, "deleted": c.deleted})
                        .to_string()
                } else if stat {
                    txbox::diff::stat(cs, &env.workspace, upper)
                } else {
                    txbox::diff::unified(cs, &env.workspace, upper)
                })
            })?;
            print!("{text}");
            if json {
                println!();
            }
            Ok(0)
        }
        Sub::Commit { tx } => {
            let cwd = std::env::current_dir().unwrap_or_default();
            let state = session::locate_state(state_dir.as_deref(), &cwd, &tx)?;
            let r = session::commit(&state, &tx)?;
            Ok(show(json, &r))
        }
        Sub::Rollback { tx, to } => {
            let cwd = std::env::current_dir().unwrap_or_default();
            let state = session::locate_state(state_dir.as_deref(), &cwd, &tx)?;
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
                }
            }
            Ok(0)
        }
        Sub::Sh { args } => crate::shim::main(state_dir, args),
        Sub::Log(a) => cmd_log(state_dir, json, a),
        Sub::Recover(a) => cmd_recover(state_dir, json, a),
        Sub::Demo => crate::demo::run(),
        Sub::Doctor => crate::doctor::run(json),
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
        Sub::Serve { listen, workspaces, token_file, policy, allow_host } => {
            crate::serve::main(&listen, &workspaces, state_dir, token_file.as_deref(), policy.file, &allow_host)
        }
        Sub::Mcp { workspaces, policy, allow_host } => {
            crate::mcp::main(&workspaces, state_dir, policy.file, &allow_host)
        }
        Sub::Policy(PolicyCmd::Show { policy }) => {
            print!("{}", policy.load()?.to_toml());
            Ok(0)
        }
    }
}

fn workspace_of(ws: &WorkspaceArg) -> Result<PathBuf> {
    let dir = match &ws.workspace {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("reading the current directory")?,
    };
    Ok(engine::resolve_workspace(&dir)?)
}

fn command_of(command: Option<String>, argv: Vec<OsString>) -> Result<Command> {
    Ok(match (command, argv.is_empty()) {
        (Some(s), true) => Command::Shell(s),
        (None, false) => Command::Argv(argv),
        (Some(_), false) => bail!("give either -c STRING or -- PROGRAM ARGS, not both"),
        (None, true) => bail!("nothing to run: give -c STRING or -- PROGRAM ARGS"),
    })
}

fn limits(o: &ExecOpts) -> Result<engine::Limits> {
    let timeout = match o.timeout {
        Some(t) if !(t.is_finite() && t > 0.0) => bail!("--timeout must be a positive number of seconds"),
        Some(t) => Some(Duration::from_secs_f64(t)),
        None => None,
    };
    Ok(engine::Limits {
        timeout,
        memory: o.memory,
        pids: o.pids,
        cpu_seconds: o.cpu,
        max_output: o.max_output,
        max_write: o.max_write,
        host_network: o.network == Network::Host,
        allow_hosts: allow_hosts(&o.allow_host, o.network == Network::Host)?,
    })
}

/// `--allow-host` values, parsed (presets are expanded when the command runs).
fn allow_hosts(values: &[String], host_network: bool) -> Result<Vec<txbox_netproxy::Spec>> {
    if host_network && !values.is_empty() {
        bail!("--allow-host limits a command's network; with --network host it has the host's whole network");
    }
    Ok(txbox_netproxy::allow::parse_all(values)?)
}

/// Print a result (JSON on stdout, or the summary on stderr, after what the network saw) and
/// return its exit status.
fn show(json: bool, r: &engine::RunResult) -> i32 {
    if json {
        println!("{}", render::json(r));
    } else {
        if let Some(hint) = r.network.as_ref().and_then(|n| n.hint.as_deref()) {
            eprintln!("{hint}");
        }
        eprintln!("{}", render::summary(r));
    }
    r.exit_code
}

fn cmd_run(state_dir: Option<PathBuf>, json: bool, a: RunArgs) -> Result<i32> {
    let req = RunRequest {
        workspace: workspace_of(&a.ws)?,
        state_dir,
        cwd: std::env::current_dir().unwrap_or_default(),
        command: command_of(a.command, a.argv)?,
        policy: a.opts.policy.load()?,
        policy_file: a.opts.policy.file.clone(),
        io: if json { Io::Capture } else { Io::Inherit },
        limits: limits(&a.opts)?,
        validate: a.validate,
        no_commit: a.no_commit,
        keep_on_failure: a.on_failure == OnFailure::Keep,
    };
    let r = engine::run(&req)?;
    Ok(show(json, &r))
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
        return match audit::verify(&path) {
            Ok(n) => {
                if json {
                    println!("{}", serde_json::json!({"ok": true, "entries": n}));
                } else {
                    println!("audit log {}: {n} entries, hash chain intact", path.display());
                }
                Ok(0)
            }
            Err(e) => {
                if json {
                    println!("{}", serde_json::json!({"ok": false, "error": e.to_string()}));
                } else {
                    eprintln!("txbox: audit log does not verify: {e}");
                }
                Ok(1)
            }
        };
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
    if json {
        writeln!(out, "{}", serde_json::to_string(&entries)?)?;
    } else {
        for e in &entries {
            let c = &e.changes;
            let rule = e.rule.as_deref().map(|r| format!(" [{r}]")).unwrap_or_default();
            writeln!(
                out,
                "{:>4} {} {:<11} exit {:<3} +{} ~{} -{} {:>8}  {}{rule}",
                e.seq,
                render::short(&e.tx),
                e.outcome,
                e.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
                c.added,
                c.modified,
                c.deleted,
                render::ms(e.duration_ms),
                e.command.replace('\n', "⏎"),
            )?;
        }
    }
    Ok(0)
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
    let done = txbox_txn::recover(&state, None, &mut CrashHook::default())?;
    let mut items = Vec::new();
    for r in &done {
        let (tx, what, ws) = match r {
            Recovered::RolledForward { tx, workspace } => (tx.clone(), "rolled_forward", Some(workspace.clone())),
            Recovered::Discarded { tx } => (tx.clone(), "discarded", None),
        };
        let entry = audit::Entry {
            tx: tx.clone(),
            workspace: ws.as_deref().map(|w| w.to_string_lossy().into_owned()).unwrap_or_default(),
            command: "recover".into(),
            action: "recover".into(),
            outcome: what.into(),
            ..audit::Entry::default()
        };
        audit::append(&state.audit_path(), entry, true)?;
        if !json {
            eprintln!("txbox: {what} tx {}", render::short(&tx));
        }
        items.push(serde_json::json!({"tx": tx, "action": what}));
    }
    if json {
        println!("{}", serde_json::json!({ "recovered": items }));
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
    let mut ev = policy.evaluate_str(command, &engine::policy_context(&workspace, &cwd));
    if ev.decision.action != txbox_policy::Action::Deny {
        let limits = engine::Limits { allow_hosts: allow_hosts(allow, false)?, ..engine::Limits::default() };
        let limits = txbox::network::with_policy_hosts(&limits, &policy, &[]).map_err(anyhow::Error::msg)?;
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
    Ok(0)
}
