//! `txbox sh` as an agent's shell: the behaviours agents rely on, compared with `bash -c`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output};

use common::*;

fn sh(s: &Scratch, args: &[&str]) -> Output {
    Command::new(binary())
        .args(["--state-dir", s.state.to_str().unwrap(), "sh"])
        .args(args)
        .current_dir(&s.ws)
        .env_remove("TXBOX_CONFIG")
        .env("HOME", &s.root)
        .output()
        .unwrap()
}

fn bash(s: &Scratch, args: &[&str]) -> Output {
    Command::new("bash").args(args).current_dir(&s.ws).output().unwrap()
}

#[test]
fn output_and_status_are_what_bash_gives() {
    let s = Scratch::new("shim");
    for script in [
        "echo out; echo err >&2; exit 3",
        "printf 'a\\377b\\0c\\n'",
        "echo \"$0:$1:$2\"",
        "x='quoted \"words\"'; echo \"$x\" | tr a-z A-Z; echo $(( 6 * 7 ))",
        "no-such-command-anywhere",
        "head -c 5000000 /dev/zero | tr '\\0' y",
        "cat <<EOF\nheredoc $((1 + 1))\nEOF",
    ] {
        let ours = sh(&s, &["-c", script, "name", "arg1", "arg2"]);
        let theirs = bash(&s, &["-c", script, "name", "arg1", "arg2"]);
        assert_eq!(ours.status.code(), theirs.status.code(), "{script}: {}", describe(&ours));
        assert!(ours.stdout == theirs.stdout, "{script}: stdout differs ({} vs {} bytes)", ours.stdout.len(), theirs.stdout.len());
        if ours.status.code() != Some(127) {
            assert_eq!(ours.stderr, theirs.stderr, "{script}: stderr differs: {}", describe(&ours));
        }
    }
    let ours = sh(&s, &["-lc", "echo login-shell"]);
    assert_eq!((ours.status.code(), ours.stdout.as_slice()), (Some(0), &b"login-shell\n"[..]), "{}", describe(&ours));
}

#[test]
fn commits_on_success_only_and_refuses_with_one_line() {
    let s = Scratch::new("shim-tx");
    assert_eq!(sh(&s, &["-c", "echo kept > a"]).status.code(), Some(0));
    assert_eq!(sh(&s, &["-c", "echo gone > b; false"]).status.code(), Some(1));
    assert!(s.ws.join("a").exists() && !s.ws.join("b").exists());
    let out = sh(&s, &["-c", "rm -rf ~"]);
    assert_eq!(out.status.code(), Some(126), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "a denial is one line: {err:?}");
    assert!(err.starts_with("txbox: denied by rule "), "{err}");
}

#[test]
fn configuration_file_and_environment() {
    let s = Scratch::new("shim-cfg");
    let other = s.root.join("other-ws");
    std::fs::create_dir_all(&other).unwrap();
    let cfg = s.root.join("config.toml");
    std::fs::write(&cfg, format!("workspace = {:?}\n", other.to_str().unwrap())).unwrap();
    let run = |extra: &[(&str, &str)]| {
        let mut c = Command::new(binary());
        c.args(["--state-dir", s.state.to_str().unwrap(), "sh", "-c", "echo x > made"]).current_dir(&s.root).env("TXBOX_CONFIG", &cfg);
        for (k, v) in extra {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    assert_eq!(run(&[]).status.code(), Some(0));
    assert!(other.join("made").exists(), "the config file's workspace was not used");
    assert_eq!(run(&[("TXBOX_WORKSPACE", s.ws.to_str().unwrap())]).status.code(), Some(0));
    assert!(s.ws.join("made").exists(), "the environment must win over the file");
    std::fs::write(&cfg, "workspaces = 1\n").unwrap();
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(125), "a malformed config must be an error: {}", describe(&out));
}
