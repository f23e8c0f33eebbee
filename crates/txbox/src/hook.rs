//! `txbox hook`: the PreToolUse hook of Claude Code's Bash tool (and of agents that share its
//! hook format). Reads the hook's event on stdin and answers with the call rewritten into
//!
//! ```text
//! TXBOX_WORKSPACE=<workspace> <this txbox> sh -c -- '<the command the model asked for>'
//! ```
//!
//! (`hookSpecificOutput.updatedInput`, every other field of the tool's input kept), so the
//! agent's own Bash tool runs the command as a transaction and the model sees its real output
//! and exit status. The workspace is `TXBOX_WORKSPACE`, else `CLAUDE_PROJECT_DIR`, else the
//! event's `cwd`. `permissionDecision` is `allow` (the call is sandboxed), `ask` with `--ask`.
//!
//! Fails closed: whatever goes wrong (input that is not such an event, a workspace or path that
//! JSON cannot carry, a NUL in the command, a panic), it says why on stderr and exits 2, which
//! blocks the call; it never lets a command through unsandboxed. Every exit but 0 and 2 lets
//! the agent run the call as it was, so nothing here may end the process any other way.
//!
//! This replaces a `sh` + `python3` script that cost 25 ms per command with a plain
//! `python3`, 126 ms behind pyenv's shim (docs/BENCHMARKS.md), several times what the
//! transaction itself adds.
//!
//! Pure: [`rewrite`] and [`quote`]; `main` reads, calls, writes.

use std::io::{Read, Write};

use serde_json::{json, Value};

/// The exit status that blocks the tool call (stderr goes to the model).
pub const BLOCK: i32 = 2;

/// The most bytes of event read: a command of megabytes is a here-document, not more.
const MAX_EVENT: u64 = 64 << 20;

/// Why a call could not be rewritten.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HookError {
    #[error("the event is not JSON: {0}")]
    Json(String),
    #[error("the event has no tool_input.command string")]
    NoCommand,
    #[error("the hook routes the Bash tool only, not {0} (give the hook the matcher \"Bash\")")]
    NotBash(String),
    #[error("the command holds a NUL byte, which no shell command can")]
    Nul,
    #[error("no workspace: TXBOX_WORKSPACE, CLAUDE_PROJECT_DIR and the event's cwd are all unset")]
    NoWorkspace,
    #[error("{0} is not UTF-8, which the hook's JSON answer cannot carry")]
    NotUtf8(&'static str),
}

/// Where the call runs and how it is decided.
pub struct Setting<'a> {
    /// This txbox, as the rewritten command names it.
    pub txbox: &'a str,
    /// `TXBOX_WORKSPACE`, else `CLAUDE_PROJECT_DIR` (empty counts as unset).
    pub workspace: Option<&'a str>,
    /// `ask` instead of `allow`.
    pub ask: bool,
}

/// The hook's answer to `event`.
pub fn rewrite(event: &Value, setting: &Setting<'_>) -> Result<Value, HookError> {
    // Another tool's `command` (a hook given a broader matcher) is not a shell command line.
    if let Some(tool) = event.get("tool_name").and_then(Value::as_str).filter(|t| *t != "Bash") {
        return Err(HookError::NotBash(tool.to_string()));
    }
    let input = event.get("tool_input").and_then(Value::as_object).ok_or(HookError::NoCommand)?;
    let command = input.get("command").and_then(Value::as_str).ok_or(HookError::NoCommand)?;
    if command.contains('\0') {
        return Err(HookError::Nul);
    }
    let workspace = setting
        .workspace
        .filter(|w| !w.is_empty())
        .or_else(|| event.get("cwd").and_then(Value::as_str).filter(|w| !w.is_empty()))
        .ok_or(HookError::NoWorkspace)?;
    // `--`: a command that starts with `-` is the script all the same, as the Bash tool runs it.
    let wrapped = format!("TXBOX_WORKSPACE={} {} sh -c -- {}", quote(workspace), quote(setting.txbox), quote(command));
    let mut updated = input.clone();
    updated.insert("command".into(), Value::String(wrapped));
    Ok(json!({
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": if setting.ask { "ask" } else { "allow" },
            "permissionDecisionReason": "runs as a txbox transaction (rolled back if it fails)",
            "updatedInput": updated,
        }
    }))
}

/// `s` as one shell word that means exactly `s`: unchanged when every character is one no
/// shell treats specially (`[A-Za-z0-9_@%+:,./-]`, and not empty), else in single quotes, each
/// `'` written as `'"'"'`. Python's `shlex.quote`, but for `=`, quoted too: zsh expands a word
/// that starts with it (`=ls` is the path of `ls`).
pub fn quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+:,./-".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r#"'"'"'"#))
}

/// `txbox hook [--ask]`: exits 0 with the answer on stdout, or [`BLOCK`].
pub fn main(ask: bool) -> i32 {
    match std::panic::catch_unwind(|| answer(ask)) {
        Ok(Ok(text)) => {
            let mut out = std::io::stdout().lock();
            if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_ok() {
                return 0;
            }
            block("the answer could not be written")
        }
        Ok(Err(why)) => block(&why),
        Err(_) => block("txbox failed"),
    }
}

fn answer(ask: bool) -> Result<String, String> {
    let mut raw = Vec::new();
    std::io::stdin().take(MAX_EVENT + 1).read_to_end(&mut raw).map_err(|e| format!("reading the event: {e}"))?;
    if raw.len() as u64 > MAX_EVENT {
        return Err(format!("the event is larger than {} MiB", MAX_EVENT >> 20));
    }
    let event: Value = serde_json::from_slice(&raw).map_err(|e| HookError::Json(e.to_string()).to_string())?;
    let exe = std::env::current_exe().map_err(|e| format!("where this txbox is: {e}"))?;
    let txbox = exe.to_str().ok_or_else(|| HookError::NotUtf8("the path of txbox").to_string())?;
    let var = |name: &'static str| -> Result<Option<String>, String> {
        match std::env::var(name) {
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(HookError::NotUtf8(name).to_string()),
        }
    };
    let workspace = match var("TXBOX_WORKSPACE")?.filter(|w| !w.is_empty()) {
        Some(w) => Some(w),
        None => var("CLAUDE_PROJECT_DIR")?,
    };
    let setting = Setting { txbox, workspace: workspace.as_deref(), ask };
    let answer = rewrite(&event, &setting).map_err(|e| e.to_string())?;
    Ok(format!("{answer}\n"))
}

fn block(why: &str) -> i32 {
    // Not `eprintln!`, which panics when stderr is closed: the exit must be 2 whatever happens.
    let _ =
        writeln!(std::io::stderr(), "txbox hook: could not route this command through txbox, so it was not run: {why}");
    BLOCK
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn setting(workspace: Option<&str>) -> Setting<'_> {
        Setting { txbox: "/usr/local/bin/txbox", workspace, ask: false }
    }

    fn event(command: &str) -> Value {
        json!({
            "session_id": "s", "cwd": "/home/u/project", "hook_event_name": "PreToolUse", "tool_name": "Bash",
            "tool_input": { "command": command, "description": "d", "timeout": 120000, "run_in_background": false }
        })
    }

    #[test]
    fn the_call_is_rewritten_and_the_rest_of_its_input_kept() {
        let a = rewrite(&event("make test"), &setting(None)).unwrap();
        let out = &a["hookSpecificOutput"];
        assert_eq!(out["hookEventName"], "PreToolUse");
        assert_eq!(out["permissionDecision"], "allow");
        assert_eq!(
            out["updatedInput"]["command"],
            "TXBOX_WORKSPACE=/home/u/project /usr/local/bin/txbox sh -c -- 'make test'"
        );
        assert_eq!(out["updatedInput"]["description"], "d");
        assert_eq!(out["updatedInput"]["timeout"], 120000);
        assert_eq!(out["updatedInput"]["run_in_background"], false);
        let asked = rewrite(&event("ls"), &Setting { ask: true, ..setting(None) }).unwrap();
        assert_eq!(asked["hookSpecificOutput"]["permissionDecision"], "ask");
    }

    #[test]
    fn the_workspace_is_the_variable_then_the_project_then_the_cwd() {
        let cmd = |a: Value| a["hookSpecificOutput"]["updatedInput"]["command"].as_str().unwrap().to_string();
        assert!(cmd(rewrite(&event("ls"), &setting(Some("/w x"))).unwrap()).starts_with("TXBOX_WORKSPACE='/w x' "));
        assert!(cmd(rewrite(&event("ls"), &setting(Some(""))).unwrap()).starts_with("TXBOX_WORKSPACE=/home/u/project "));
        let mut no_cwd = event("ls");
        no_cwd.as_object_mut().unwrap().remove("cwd");
        assert_eq!(rewrite(&no_cwd, &setting(None)), Err(HookError::NoWorkspace));
    }

    #[test]
    fn anything_but_a_command_string_is_refused() {
        for bad in [json!({}), json!({"tool_input": "ls"}), json!({"tool_input": {"command": 3}}), json!([1])] {
            assert_eq!(rewrite(&bad, &setting(None)), Err(HookError::NoCommand), "{bad}");
        }
        assert_eq!(rewrite(&event("ls\0rm -rf ~"), &setting(None)), Err(HookError::Nul));
        let mut other = event("ls");
        other["tool_name"] = json!("Task");
        assert_eq!(rewrite(&other, &setting(None)), Err(HookError::NotBash("Task".into())));
    }

    #[test]
    fn quoting_is_pythons_shlex_quote_with_equals_quoted() {
        for (s, q) in [
            ("", "''"),
            ("ls", "ls"),
            ("a-b_c.d/e:f,g@h%i+j", "a-b_c.d/e:f,g@h%i+j"),
            ("=ls", "'=ls'"),
            ("a=b", "'a=b'"),
            ("a b", "'a b'"),
            ("it's", r#"'it'"'"'s'"#),
            ("$(rm -rf ~)", "'$(rm -rf ~)'"),
            ("~", "'~'"),
            ("é", "'é'"),
        ] {
            assert_eq!(quote(s), q, "{s:?}");
        }
    }

    /// What bash makes of a quoted word: the bytes `printf %s` prints for it.
    fn through_bash(word: &str) -> Vec<u8> {
        let out = std::process::Command::new("bash").arg("-c").arg(format!("printf %s {word}")).output().unwrap();
        assert!(out.status.success(), "{word}: {out:?}");
        out.stdout
    }

    #[test]
    fn bash_reads_back_every_hostile_command_as_it_was() {
        for s in ["'; rm -rf ~ #", "a\nb", "`id`", "$HOME", "\\'", "'''", "-c", "--", "a\"b", "!x", "*", "~root"] {
            assert_eq!(through_bash(&quote(s)), s.as_bytes(), "{s:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
        #[test]
        fn any_string_is_one_word_that_bash_reads_back_unchanged(s in "[^\u{0}]{0,40}") {
            prop_assert_eq!(through_bash(&quote(&s)), s.as_bytes());
        }
    }
}
