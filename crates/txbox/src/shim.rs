//! `txbox sh`: a drop-in for `sh -c STRING` (and `bash -lc STRING name args…`). The caller sees
//! what the shell would give — the command's own stdout, stderr and exit status — and the
//! command runs as a transaction: committed on success, rolled back otherwise. txbox speaks on
//! stderr only when it refuses (126), fails (125), hits a conflict (3) or a limit kills the command.
//!
//! A shell drop-in gets no txbox flags, so configuration comes from the environment:
//! `TXBOX_WORKSPACE` (default: the current directory), `TXBOX_STATE_DIR`, `TXBOX_TIMEOUT`,
//! `TXBOX_PASS_ENV`, `TXBOX_ALLOW_HOSTS` (a comma list, as `--allow-host` takes), and from the
//! configuration file (`txbox::config`). The one exception: `--allow-host SPEC` (or
//! `--allow-host=SPEC`) given *first*, before any shell option, which no shell has; with it or
//! `TXBOX_ALLOW_HOSTS`, the configuration's `allow_hosts` is not used. Network hints go to the
//! JSON of the audit log only: the shell's stderr stays the command's.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Result;
use txbox::api::ApiError;
use txbox::config::{Config, Untrusted};
use txbox::engine;
use txbox::options::{HostItems, Seconds};
use txbox::render;
use txbox::request::Io;
use txbox::request::{Command, RunRequest};
use txbox::result::Outcome;
use txbox_policy::Policy;

/// Split a shell command line into the script the policy judges and the argv the sandbox runs,
/// the way bash reads its own: options (`-e`, bundles like `-lc`, `-o pipefail`, `+o posix`,
/// `-O extglob`, `--login`) before the script, `-c` anywhere among them (`bash -c -l S` is
/// `bash -lc S`), `--` or `-` ending them; the first operand is the script, the rest are `$0`,
/// `$1`, …. `None` when there is no `-c` (a shell reading a file or stdin) or the line is malformed.
pub fn parse(args: &[OsString]) -> Option<(OsString, Vec<OsString>)> {
    let shell = if std::path::Path::new("/bin/bash").exists() { "/bin/bash" } else { "/bin/sh" };
    let name = shell.rsplit('/').next().unwrap_or(shell);
    let mut opts = Vec::new();
    let mut command_string = false;
    let mut it = args.iter().peekable();
    while let Some(a) = it.peek() {
        let s = a.to_string_lossy();
        if s == "--" || s == "-" {
            it.next();
            break;
        }
        if let Some(long) = s.strip_prefix("--") {
            opts.push(OsString::from(&**a));
            it.next();
            if matches!(long, "rcfile" | "init-file") {
                opts.push(it.next()?.clone());
            }
            continue;
        }
        let (sign, letters) = match s.split_at_checked(1) {
            Some((sign @ ("-" | "+"), letters)) if !letters.is_empty() => (sign, letters),
            _ => break, // the first operand: the script
        };
        if !letters.chars().all(|c| c.is_ascii_alphabetic()) {
            return None;
        }
        it.next();
        let kept: String = letters.chars().filter(|&c| !(sign == "-" && c == 'c')).collect();
        command_string |= kept.len() < letters.len();
        if !kept.is_empty() {
            opts.push(OsString::from(format!("{sign}{kept}")));
        }
        // `-o NAME` / `-O NAME` (also bundled, `-eo pipefail`) take the next argument.
        for _ in kept.chars().filter(|c| matches!(c, 'o' | 'O')) {
            opts.push(it.next()?.clone());
        }
    }
    if !command_string {
        return None;
    }
    let script = it.next()?.clone();
    let mut argv = vec![OsString::from(shell)];
    argv.extend(opts);
    argv.push(OsString::from("-c"));
    if script.as_encoded_bytes().first().is_some_and(|b| matches!(b, b'-' | b'+')) {
        argv.push(OsString::from("--"));
    }
    argv.push(script.clone());
    // `$0` is the shell's name when none is given, as when the caller runs the shell itself
    // (`bash: line 1: …` in messages, not the path the sandbox executes).
    let rest: Vec<OsString> = it.cloned().collect();
    if rest.is_empty() {
        argv.push(OsString::from(name));
    }
    argv.extend(rest);
    Some((script, argv))
}

/// `--allow-host SPEC` / `--allow-host=SPEC` at the very start of the arguments, taken off.
fn leading_allow_hosts(mut args: Vec<OsString>) -> Result<(Vec<String>, Vec<OsString>)> {
    let mut allow = Vec::new();
    loop {
        let first = args.first().map(|a| a.to_string_lossy().into_owned());
        match first.as_deref() {
            Some("--allow-host") => {
                let v = args.get(1).ok_or_else(|| ApiError::usage("--allow-host needs a value"))?;
                allow.push(v.to_string_lossy().into_owned());
                args.drain(..2);
            }
            Some(a) if a.starts_with("--allow-host=") => {
                allow.push(a["--allow-host=".len()..].to_string());
                args.remove(0);
            }
            _ => return Ok((allow, args)),
        }
    }
}

pub fn main(state_dir: Option<PathBuf>, args: Vec<OsString>) -> Result<i32> {
    let (mut allow, args) = leading_allow_hosts(args)?;
    let Some((script, argv)) = parse(&args) else {
        eprintln!("txbox sh: usage: txbox sh [OPTIONS] -c 'STRING' [NAME [ARG...]] (a shell reading a script file or stdin is not supported)");
        return Ok(2);
    };
    let cwd = std::env::current_dir()?;
    let env_path = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let flagged_ws = env_path("TXBOX_WORKSPACE");
    // The configuration may only narrow if it lies where a sandboxed command could write it:
    // the workspace this run uses (or names), the state directory.
    let untrusted = Untrusted {
        workspaces: flagged_ws.iter().cloned().collect(),
        state_dir: state_dir.clone(),
        fallback: flagged_ws.is_none().then(|| cwd.clone()),
    };
    let config = Config::load_default(&untrusted)?;
    let workspace = flagged_ws.or(config.workspace.clone()).unwrap_or_else(|| cwd.clone());
    let policy_file = env_path("TXBOX_POLICY").or(config.policy.clone());
    let state_dir = state_dir.or(config.state_dir.clone());
    let mut limits = config.limits.clone();
    if let Some(t) = std::env::var_os("TXBOX_TIMEOUT").filter(|v| !v.is_empty()) {
        let t = t.to_string_lossy();
        limits.timeout = Some(t.parse::<Seconds>().map_err(|e| ApiError::usage(format!("TXBOX_TIMEOUT: {e}")))?);
    }
    let mut pass_env = config.pass_env.clone();
    pass_env.extend(txbox::environ::pass_from_env());
    allow.extend(std::env::var("TXBOX_ALLOW_HOSTS").ok().filter(|v| !v.trim().is_empty()));
    if !allow.is_empty() {
        let items = allow.iter().map(|a| a.parse::<HostItems>()).collect::<Result<Vec<_>, _>>();
        limits.allow_hosts = Some(items.map_err(|e| ApiError::usage(e.0))?);
    }
    // The sandbox runs the argv byte for byte; the policy judges the script as text (lossy if it
    // is not UTF-8).
    let command = Command::Script { script: script.to_string_lossy().into_owned(), argv };
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
        io: Io::Inherit,
        limits: limits.to_limits(),
        validate: None,
        no_commit: false,
        keep_on_failure: false,
        isolation: config.isolation.unwrap_or_default(),
        pass_env,
        keep: config.keep_rules()?,
    };
    let r = engine::run(&req)?;
    // Speak only when the shell itself would not explain the result: a refusal, a failure of
    // txbox, a conflict, or a limit/timeout that killed the command.
    let killed = r.timed_out || r.limit_exceeded.is_some();
    if killed
        || matches!(r.outcome, Outcome::Denied | Outcome::Error | Outcome::Conflict | Outcome::Held)
        || std::env::var_os("TXBOX_VERBOSE").is_some()
    {
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
    fn the_example_config_file_parses() {
        let path = std::path::Path::new("examples/claude-code/config.toml");
        let c = Config::parse(include_str!("../../../examples/claude-code/config.toml"), path).unwrap_or_default();
        let allow: Vec<String> = c.limits.allow_hosts.iter().flatten().map(|i| i.to_string()).collect();
        assert_eq!(allow, ["@pypi", "@npm", "@crates", "@github"]);
        assert_eq!(c.widening(), ["allow_hosts"], "an allowlist widens: refused from inside a workspace");
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn allow_host_is_taken_only_from_the_front() {
        let (allow, rest) =
            leading_allow_hosts(os(&["--allow-host", "a.example", "--allow-host=@npm", "-c", "x"])).unwrap();
        assert_eq!((allow, rest), (vec!["a.example".to_string(), "@npm".to_string()], os(&["-c", "x"])));
        let (allow, rest) = leading_allow_hosts(os(&["-c", "x", "--allow-host", "a"])).unwrap();
        assert!(allow.is_empty() && rest.len() == 4);
        assert!(leading_allow_hosts(os(&["--allow-host"])).is_err());
    }

    #[test]
    fn parses_sh_and_bash_style_invocations() {
        let p = |v: &[&str]| parse(&os(v)).map(|(s, argv)| (s, argv[1..].to_vec()));
        let n = if std::path::Path::new("/bin/bash").exists() { "bash" } else { "sh" };
        assert_eq!(p(&["-c", "echo hi"]), Some(("echo hi".into(), os(&["-c", "echo hi", n]))));
        assert_eq!(p(&["-lc", "make", "name", "a1"]), Some(("make".into(), os(&["-l", "-c", "make", "name", "a1"]))));
        assert_eq!(p(&["-e", "-c", "false"]).map(|x| x.1), Some(os(&["-e", "-c", "false", n])));
        // bash takes -c as a flag: the script is the first operand, wherever -c stood.
        assert_eq!(p(&["-c", "-l", "make", "n"]), Some(("make".into(), os(&["-l", "-c", "make", "n"]))));
        assert_eq!(p(&["-o", "pipefail", "-c", "x"]).map(|x| x.1), Some(os(&["-o", "pipefail", "-c", "x", n])));
        assert_eq!(p(&["-eco", "pipefail", "x"]).map(|x| x.1), Some(os(&["-eo", "pipefail", "-c", "x", n])));
        assert_eq!(
            p(&["--noprofile", "--norc", "-c", "x"]).map(|x| x.1),
            Some(os(&["--noprofile", "--norc", "-c", "x", n]))
        );
        assert_eq!(p(&["+o", "posix", "-c", "x"]).map(|x| x.1), Some(os(&["+o", "posix", "-c", "x", n])));
        // After `--` an operand that looks like an option is still the script.
        assert_eq!(p(&["-c", "--", "-x", "n"]), Some(("-x".into(), os(&["-c", "--", "-x", "n"]))));
        assert!(p(&["script.sh"]).is_none());
        assert!(p(&["-c"]).is_none());
        assert!(p(&["-o"]).is_none());
        assert!(p(&["-e", "script.sh"]).is_none(), "no -c: a script file");
    }
}
