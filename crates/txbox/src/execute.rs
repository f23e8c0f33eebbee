//! Run one command in the sandbox, for a `run` or a session's step: the sandbox spec assembled
//! from the workspace, its state directory, the transaction's layers and the limits (what to
//! hide, package caches, the network plan and its proxy, the limits watcher), launched warm or
//! cold (starting a warm server for the next runs), and the command's fate with what it did on
//! the network.
//!
//! Owns what one execution is given ([`Limits`], [`Io`], `Layers`) and the glue to
//! `txbox_sandbox::launch`; may not judge the command (the policy, before it: `crate::engine`),
//! nor look at what it changed (classification and commit, after it: `crate::commit`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use txbox_sandbox::{Finished, LaunchOptions, SandboxSpec};
use txbox_txn::StateDir;

use crate::request::{Command, Env, Io, Limits, DEFAULT_CAPTURE};

/// Where one sandboxed execution writes, and what it sees below.
pub(crate) struct Layers<'a> {
    /// Earlier steps, topmost first.
    pub lower: Vec<PathBuf>,
    pub upper: &'a Path,
    pub work: &'a Path,
}

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
/// runs look (this user's own is hidden with the state directory). Directories only: a symlink
/// of that name, in a directory anyone may write to (a filesystem's root in `/tmp`), would make
/// every root run hide what it points to.
fn other_states(workspace: &Path) -> Vec<PathBuf> {
    if !rustix::process::geteuid().is_root() {
        return Vec::new();
    }
    let Some(root) = txbox_txn::layout::mount_root(workspace) else { return Vec::new() };
    let Ok(dir) = std::fs::read_dir(&root) else { return Vec::new() };
    dir.flatten()
        .filter(|e| e.file_name().as_encoded_bytes().starts_with(txbox_txn::layout::AT_MOUNT_PREFIX.as_bytes()))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// The paths hidden by rule (`txbox_sandbox::secrets`) for a run in `workspace`: kept between
/// runs in a front end that lives long ([`serving_many_runs`]), looked for anew otherwise.
fn hidden_by_rule(workspace: &Path, writable: &[PathBuf]) -> Vec<PathBuf> {
    let states = other_states(workspace);
    if let Some(kept) = KEPT.get().and_then(Option::as_ref) {
        return kept.hidden(states, workspace, writable);
    }
    let host = txbox_sandbox::secrets::Host::gather(states);
    txbox_sandbox::secrets::hidden(&host, workspace, writable, &txbox_sandbox::secrets::HostFs)
}

/// Where `p` really is (`std::fs::canonicalize`), kept like the hidden paths where they are.
fn real_path(p: &Path) -> Option<PathBuf> {
    match KEPT.get().and_then(Option::as_ref) {
        Some(kept) => kept.real(p),
        None => std::fs::canonicalize(p).ok(),
    }
}

static KEPT: std::sync::OnceLock<Option<txbox_sandbox::secrets::watched::Watched>> = std::sync::OnceLock::new();

/// This process serves many runs (`serve`, `mcp`): keep between them what each would look up
/// again and what cannot change meanwhile unseen: the hidden paths while nothing they depend
/// on changes (`txbox_sandbox::secrets::watched`: looking at a hundred paths per run is a tenth
/// of the server's time per `true`), the environment filter's answer for an unchanged
/// environment, the umask (`warm::client::pin_umask`). A one-shot `txbox run` keeps nothing:
/// it would only pay for the watches and the copies.
pub fn serving_many_runs() {
    KEPT.get_or_init(txbox_sandbox::secrets::watched::Watched::new);
    crate::environ::remember();
    txbox_sandbox::warm::client::pin_umask();
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
    spec.hide.extend(policy_file.and_then(real_path));
    // The operator's own secrets (the server's token file), where they really are.
    spec.hide.extend(limits.hide.iter().filter_map(|p| real_path(p)));
    // Everything else by rule: other homes, host keys, credentials, sockets' places, other
    // state directories (txbox_sandbox::secrets).
    spec.hide.extend(hidden_by_rule(&env.workspace, &spec.writable));
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
    let net = crate::network::Session::start(plan, exe, &mut spec)
        .map_err(|e| txbox_sandbox::SandboxError::Proxy(Box::new(e)))?;
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
    if let Some(socket) = &finished.start_warm {
        // No server for sandboxes like this one yet (or none in the first free slot): start one
        // for the next runs. Failing to is only a missed speed-up.
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
