//! `txbox sh`: a drop-in for `sh -c STRING` (and `bash -lc STRING name args…`). The caller sees
//! what the shell would give — the command's own stdout, stderr and exit status — and the
//! command runs as a transaction: committed on success, rolled back otherwise. txbox speaks on
//! stderr only when it refuses (126), fails (125), hits a conflict (3) or a limit kills the command.
//!
//! A shell drop-in gets no txbox flags, so configuration comes from the environment:
//! `TXBOX_WORKSPACE` (default: the current directory), `TXBOX_STATE_DIR`, `TXBOX_TIMEOUT`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use txbox::engine::{self, Command, Outcome, RunRequest};
use txbox::render;
use txbox_policy::Policy;

/// Split `[FLAGS] -c SCRIPT [NAME ARGS…]` into the shell argv and the script the policy judges.
pub fn parse(args: &[OsString]) -> Option<(String, Vec<OsString>)> {
    let shell = if std::path::Path::new("/bin/bash").exists() { "/bin/bash" } else { "/bin/sh" };
    let mut argv = vec![OsString::from(shell)];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s.starts_with('-') && s.len() > 1 && s[1..].chars().all(|c| c.is_ascii_alphabetic()) {
            if s.contains('c') {
                let script = it.next()?.to_string_lossy().into_owned();
                let rest: String = s.chars().filter(|c| *c != 'c').collect();
                if rest != "-" {
                    argv.push(OsString::from(rest));
                }
                argv.push(OsString::from("-c"));
                argv.push(OsString::from(&script));
                argv.extend(it.cloned());
                return Some((script, argv));
            }
            argv.push(a.clone());
        } else {
            return None;
        }
    }
    None
}

/// The shim's configuration file (all keys optional).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub workspace: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub policy: Option<PathBuf>,
    pub timeout: Option<f64>,
    pub memory: Option<String>,
    pub pids: Option<u64>,
    pub max_write: Option<String>,
    pub network: Option<String>,
}

impl Config {
    /// `$TXBOX_CONFIG`, else `~/.config/txbox/config.toml`; a missing default file is no
    /// configuration, a missing or malformed named one is an error.
    pub fn load() -> Result<Config> {
        let (path, required) = match std::env::var_os("TXBOX_CONFIG") {
            Some(p) => (PathBuf::from(p), true),
            None => match std::env::var_os("HOME") {
                Some(h) => (PathBuf::from(h).join(".config/txbox/config.toml"), false),
                None => return Ok(Config::default()),
            },
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(e) => anyhow::bail!("reading {}: {e}", path.display()),
        };
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    fn limits(&self, timeout: Option<f64>) -> Result<engine::Limits> {
        let size = |s: &Option<String>| s.as_deref().map(txbox::size::parse_size).transpose().map_err(|e| anyhow::anyhow!(e));
        Ok(engine::Limits {
            timeout: timeout.or(self.timeout).filter(|t| *t > 0.0).map(Duration::from_secs_f64),
            memory: size(&self.memory)?,
            pids: self.pids,
            max_write: size(&self.max_write)?,
            host_network: self.network.as_deref() == Some("host"),
            ..engine::Limits::default()
        })
    }
}

pub fn main(state_dir: Option<PathBuf>, args: Vec<OsString>) -> Result<i32> {
    let Some((script, argv)) = parse(&args) else {
        eprintln!("txbox sh: usage: txbox sh [-FLAGS] -c 'STRING' [NAME [ARG...]] (a shell reading a script file or stdin is not supported)");
        return Ok(2);
    };
    let config = Config::load()?;
    let cwd = std::env::current_dir()?;
    let env_path = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let workspace = env_path("TXBOX_WORKSPACE").or(config.workspace.clone()).unwrap_or_else(|| cwd.clone());
    let policy_file = env_path("TXBOX_POLICY").or(config.policy.clone());
    let state_dir = state_dir.or(config.state_dir.clone());
    let timeout = std::env::var("TXBOX_TIMEOUT").ok().and_then(|t| t.parse::<f64>().ok());
    // Plain `-c STRING` runs exactly like `run -c`; extra flags or arguments keep their argv.
    let command = if argv.len() == 3 { Command::Shell(script) } else { Command::Script { script, argv } };
    let req = RunRequest {
        workspace,
        state_dir,
        cwd,
        command,
        policy: match &policy_file {
            Some(f) => Policy::load(f)?,
            None => Policy::builtin(),
        },
        policy_file: policy_file.clone(),
        capture: false,
        limits: config.limits(timeout)?,
        validate: None,
        no_commit: false,
        keep_on_failure: false,
    };
    let r = engine::run(&req)?;
    // Speak only when the shell itself would not explain the result: a refusal, a failure of
    // txbox, a conflict, or a limit/timeout that killed the command.
    let killed = r.timed_out || r.limit_exceeded.is_some();
    if killed || matches!(r.outcome, Outcome::Denied | Outcome::Error | Outcome::Conflict) || std::env::var_os("TXBOX_VERBOSE").is_some() {
        eprintln!("{}", render::summary(&r));
    }
    Ok(r.exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn config_file_keys_and_unknown_keys() {
        let c: Config = toml::from_str("workspace = \"/w\"\ntimeout = 30\nmemory = \"2G\"\nnetwork = \"host\"\n").unwrap_or_default();
        assert_eq!(c.workspace, Some(PathBuf::from("/w")));
        let l = c.limits(None).unwrap_or_default();
        assert_eq!((l.memory, l.host_network, l.timeout), (Some(2 << 30), true, Some(Duration::from_secs(30))));
        assert_eq!(c.limits(Some(5.0)).map(|l| l.timeout).ok().flatten(), Some(Duration::from_secs(5)));
        assert!(toml::from_str::<Config>("workspaces = 1").is_err(), "a misspelt key must be an error");
    }

    #[test]
    fn parses_sh_and_bash_style_invocations() {
        let (s, argv) = parse(&os(&["-c", "echo hi"])).unwrap_or_default();
        assert_eq!(s, "echo hi");
        assert_eq!(argv[1..], os(&["-c", "echo hi"])[..]);
        let (s, argv) = parse(&os(&["-lc", "make", "name", "a1"])).unwrap_or_default();
        assert_eq!(s, "make");
        assert_eq!(argv[1..], os(&["-l", "-c", "make", "name", "a1"])[..]);
        let (_, argv) = parse(&os(&["-e", "-c", "false"])).unwrap_or_default();
        assert_eq!(argv[1..], os(&["-e", "-c", "false"])[..]);
        assert!(parse(&os(&["script.sh"])).is_none());
        assert!(parse(&os(&["-c"])).is_none());
    }
}
