//! `txbox sh` as an agent's shell: the behaviours agents rely on, compared with `bash -c`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

use common::*;

fn sh<A: AsRef<OsStr>>(s: &Scratch, args: &[A]) -> Output {
    Command::new(binary())
        .args(["--state-dir", s.state.to_str().unwrap(), "sh"])
        .args(args)
        .current_dir(&s.ws)
        .env_remove("TXBOX_CONFIG")
        .env("HOME", &s.root)
        .output()
        .unwrap()
}

fn bash<A: AsRef<OsStr>>(s: &Scratch, args: &[A]) -> Output {
    Command::new("bash").args(args).current_dir(&s.ws).env("HOME", &s.root).output().unwrap()
}

/// Run the same shell command line through `txbox sh` and `bash`; both streams must be equal
/// byte for byte, and the exit status too.
fn same_as_bash<A: AsRef<OsStr> + std::fmt::Debug>(s: &Scratch, args: &[A]) -> Output {
    let ours = sh(s, args);
    let theirs = bash(s, args);
    assert_eq!(ours.status.code(), theirs.status.code(), "{args:?}: {}", describe(&ours));
    assert!(
        ours.stdout == theirs.stdout,
        "{args:?}: stdout differs ({} vs {} bytes): {}",
        ours.stdout.len(),
        theirs.stdout.len(),
        describe(&ours)
    );
    assert!(ours.stderr == theirs.stderr, "{args:?}: stderr differs: {}\nbash: {}", describe(&ours), describe(&theirs));
    ours
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
        same_as_bash(&s, &["-c", script, "name", "arg1", "arg2"]);
    }
    let ours = sh(&s, &["-lc", "echo login-shell"]);
    assert_eq!((ours.status.code(), ours.stdout.as_slice()), (Some(0), &b"login-shell\n"[..]), "{}", describe(&ours));
}

#[test]
fn exit_statuses() {
    let s = Scratch::new("shim-status");
    for (script, code) in
        [("true", 0), ("false", 1), ("exit 42", 42), ("(exit 255)", 255), ("no-such-command-anywhere", 127)]
    {
        let out = same_as_bash(&s, &["-c", script]);
        assert_eq!(out.status.code(), Some(code), "{script}");
    }
    // A child killed by a signal (bash's report names its pid, which differs in the sandbox).
    let out = sh(&s, &["-c", "sleep 10 & kill -9 $!; wait $!"]);
    assert_eq!(out.status.code(), Some(137), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Killed"), "{}", describe(&out));
    // A shell killed by a signal: bash's caller sees the signal, txbox sh's caller 128+N (what
    // a calling shell's `$?` shows for bash too).
    for (script, sig) in [("kill -TERM $$", 15), ("echo partial; kill -KILL $$; echo never", 9)] {
        let ours = sh(&s, &["-c", script]);
        let theirs = bash(&s, &["-c", script]);
        assert_eq!(theirs.status.signal(), Some(sig), "{script}: bash was not killed by {sig}");
        assert_eq!(ours.status.code(), Some(128 + sig), "{script}: {}", describe(&ours));
        assert_eq!(ours.stdout, theirs.stdout, "{script}");
    }
}

#[test]
fn invocations_agents_use() {
    let s = Scratch::new("shim-argv");
    let echo = r#"printf '[%s]' "$0" "$@"; echo"#;
    // Positional parameters after -c and -lc; options before, after and bundled with -c.
    for args in [
        vec!["-c", echo, "name", "a 1", "", "*"],
        vec!["-lc", echo, "name", "x"],
        vec!["-c", "-l", echo, "name", "y"],
        vec!["-e", "-c", "false; echo not reached"],
        vec!["-o", "pipefail", "-c", "false | true"],
        vec!["-eo", "pipefail", "-c", "false | true; echo not reached"],
        vec!["--noprofile", "--norc", "-c", echo],
        vec!["-c", "--", echo, "dash"],
        vec!["-xc", "true"],
    ] {
        same_as_bash(&s, &args);
    }
    // Quoting: single, double, $'…' (ANSI-C), backslash escapes, a glob that matches nothing.
    same_as_bash(
        &s,
        &[
            "-c",
            r#"printf '<%s>\n' 'single $HOME "q"' "double $((1+1)) 'q' \$ \" \\" $'tab\there\nnl\x41\u00e9' a\ b nomatch-*"#,
        ],
    );
    // A script that is not UTF-8 reaches the shell byte for byte.
    let script = OsString::from_vec(b"printf '%s' '\xff\xfe'; echo \x80".to_vec());
    let out = same_as_bash(&s, &[OsString::from("-c"), script]);
    assert_eq!(out.stdout, b"\xff\xfe\x80\n");
    // Without -c there is nothing to judge: refused like a shell with a usage error.
    let out = sh(&s, &["script.sh"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn large_and_binary_output_is_byte_exact() {
    let s = Scratch::new("shim-bytes");
    // Several MB on both streams at once (a reader that drained only one would deadlock), every
    // byte value on stdout and stderr.
    let out = same_as_bash(&s, &["-c", "seq 1 700000; seq 1 300000 >&2; seq 700001 900000"]);
    assert!(out.stdout.len() > 6_000_000 && out.stderr.len() > 1_900_000, "{} {}", out.stdout.len(), out.stderr.len());
    let all = "for i in $(seq 0 255); do printf \"\\\\$(printf %03o $i)\"; done";
    let out = same_as_bash(&s, &["-c", &format!("{all}; {all} >&2")]);
    let bytes: Vec<u8> = (0..=255).collect();
    assert_eq!((out.stdout.as_slice(), out.stderr.as_slice()), (bytes.as_slice(), bytes.as_slice()));
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
        c.args(["--state-dir", s.state.to_str().unwrap(), "sh", "-c", "echo x > made"])
            .current_dir(&s.root)
            .env("TXBOX_CONFIG", &cfg);
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
