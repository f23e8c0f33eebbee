//! `txbox sh`: a drop-in for `sh -c STRING` (and `bash -lc STRING name args…`). The caller sees
//! what the shell would give — the command's own stdout, stderr and exit status — and the
//! command runs as a transaction: committed on success, rolled back otherwise. txbox speaks on
//! stderr only when it refuses (126), fails (125) or hits a conflict (3).
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

pub fn main(state_dir: Option<PathBuf>, args: Vec<OsString>) -> Result<i32> {
    let Some((script, argv)) = parse(&args) else {
        eprintln!("txbox sh: usage: txbox sh [-FLAGS] -c 'STRING' [NAME [ARG...]] (a shell reading a script file or stdin is not supported)");
        return Ok(2);
    };
    let cwd = std::env::current_dir()?;
    let workspace = std::env::var_os("TXBOX_WORKSPACE").map(PathBuf::from).unwrap_or_else(|| cwd.clone());
    let policy_file = std::env::var_os("TXBOX_POLICY").map(PathBuf::from);
    let timeout = std::env::var("TXBOX_TIMEOUT").ok().and_then(|t| t.parse::<f64>().ok()).filter(|t| *t > 0.0);
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
        limits: engine::Limits { timeout: timeout.map(Duration::from_secs_f64), ..engine::Limits::default() },
        validate: None,
        no_commit: false,
        keep_on_failure: false,
    };
    let r = engine::run(&req)?;
    if matches!(r.outcome, Outcome::Denied | Outcome::Error | Outcome::Conflict) || std::env::var_os("TXBOX_VERBOSE").is_some() {
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
