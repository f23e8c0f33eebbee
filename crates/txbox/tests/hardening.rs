//! What the caller's side must not hand a command unasked, and what a command must not be able
//! to set up for the next one: credentials in the environment (withheld, cold and warm, unless
//! passed with --pass-env), secrets in logged command lines (redacted, what runs unchanged), a
//! configuration committed from inside (refused when it widens), and the isolation level
//! (read-committed shows the mixed-state anomaly; strict refuses it). Root and unprivileged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::*;
use serde_json::Value;

const GH: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";

/// `txbox --json run` with extra environment; the parsed result.
fn run_env(who: As, s: &Scratch, args: &[&str], env: &[(&str, &str)]) -> (std::process::Output, Value) {
    let mut cmd = txbox_command(who);
    if who != As::Me {
        cmd.env("HOME", &s.root);
    }
    cmd.arg("--state-dir").arg(&s.state).arg("--json").arg("run").arg("-C").arg(&s.ws).args(args).current_dir(&s.ws);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    (out, v)
}

#[test]
fn credentials_in_the_environment_are_withheld_cold_and_warm() {
    for who in identities() {
        let s = Scratch::new("env");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let secrets = [
            ("GITHUB_TOKEN", "t1"),
            ("AWS_SECRET_ACCESS_KEY", "t2"),
            ("MY_API_KEY", "t3"),
            ("DB_PASSWORD", "t4"),
            ("SSH_AUTH_SOCK", "/tmp/agent.sock"),
            ("DEPLOY", GH),
            ("DATABASE_URL", "postgres://app:hunter2@db/x"),
        ];
        let mut env: Vec<(&str, &str)> = secrets.to_vec();
        env.push(("PLAIN_SETTING", "visible"));
        for warm in ["0", "1"] {
            let mut e = env.clone();
            e.push(("TXBOX_WARM", warm));
            // Warm: the first run starts the server; look until a run was served by it.
            let mut served = warm == "0";
            for _ in 0..20 {
                let mut e2 = e.clone();
                e2.push(("TXBOX_TIMING", "1"));
                let (out, r) = run_env(who, &s, &["-c", "env"], &e2);
                assert_eq!(r["outcome"], "committed", "{who:?}: {}", describe(&out));
                let seen = r["stdout"].as_str().unwrap();
                assert!(seen.contains("PLAIN_SETTING=visible"), "{who:?} warm={warm}: {seen}");
                for (k, v) in &secrets {
                    assert!(!seen.contains(&format!("{k}=")), "{who:?} warm={warm}: {k} reached the command");
                    assert!(!seen.contains(v), "{who:?} warm={warm}: the value of {k} reached the command");
                }
                if String::from_utf8_lossy(&out.stderr).contains("txbox sandbox: warm") {
                    served = true;
                    break;
                }
                if warm == "0" {
                    break;
                }
            }
            assert!(served, "{who:?}: no run was served warm");
            // Passed explicitly, one variable reaches the command; the others still do not.
            let (_, r) = run_env(who, &s, &["--pass-env", "GITHUB_TOKEN", "-c", "env"], &e);
            let seen = r["stdout"].as_str().unwrap();
            assert!(seen.contains("GITHUB_TOKEN=t1"), "{who:?} warm={warm}: {seen}");
            assert!(!seen.contains("MY_API_KEY"), "{who:?} warm={warm}");
        }
        // The shell drop-in: withheld too, TXBOX_PASS_ENV passes.
        let mut cmd = txbox_command(who);
        if who != As::Me {
            cmd.env("HOME", &s.root);
        }
        let out = cmd
            .arg("--state-dir")
            .arg(&s.state)
            .args(["sh", "-c", "env"])
            .current_dir(&s.ws)
            .env("GH_TOKEN", "t5")
            .env("NPM_TOKEN", "t6")
            .env("TXBOX_PASS_ENV", "NPM_TOKEN")
            .env_remove("TXBOX_CONFIG")
            .output()
            .unwrap();
        let seen = String::from_utf8_lossy(&out.stdout);
        assert!(!seen.contains("t5") && seen.contains("NPM_TOKEN=t6"), "{who:?}: {}", describe(&out));
    }
}

#[test]
fn secrets_in_logged_command_lines_are_redacted_not_what_runs() {
    for who in identities() {
        let s = Scratch::new("redact");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let script = format!(
            "echo https://alice:hunter2@example.org --password=s3cr3t 'Authorization: Bearer abcdef' {GH} > out.txt; \
             GITHUB_TOKEN=tok123 true"
        );
        let (out, r) = run_json(who, &s, &script);
        assert_eq!(r["outcome"], "committed", "{who:?}: {}", describe(&out));
        // What ran is unchanged.
        let written = std::fs::read_to_string(s.ws.join("out.txt")).unwrap();
        assert!(written.contains("hunter2") && written.contains("s3cr3t") && written.contains(GH), "{written}");
        // What is logged is not.
        let log = txbox(who, &s, &["--json", "log", "-C", s.ws.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&log.stdout).into_owned();
        let human = txbox(who, &s, &["log", "-C", s.ws.to_str().unwrap()]);
        let raw = std::fs::read_dir(&s.state)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() == "audit.log")
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect::<String>();
        assert!(!raw.is_empty(), "no audit log in {}", s.state.display());
        for shown in [text.as_str(), &String::from_utf8_lossy(&human.stdout), raw.as_str()] {
            for secret in ["hunter2", "s3cr3t", "abcdef", GH, "tok123"] {
                assert!(!shown.contains(secret), "{who:?}: {secret} logged: {shown}");
            }
            assert!(shown.contains("***"), "{who:?}: {shown}");
        }
        let verify = txbox(who, &s, &["log", "--verify"]);
        assert_eq!(verify.status.code(), Some(0), "{}", describe(&verify));
    }
}

/// Read-committed shows a state that never existed; strict refuses it. A reads P, waits until
/// B has committed new P and Q, reads Q: it saw (old P, new Q).
#[test]
fn isolation_read_committed_allows_the_mixed_read_strict_refuses_it() {
    for who in identities() {
        for strict in [false, true] {
            let s = Scratch::new("isolation");
            std::fs::write(s.ws.join("P"), "v0\n").unwrap();
            std::fs::write(s.ws.join("Q"), "v0\n").unwrap();
            if let As::User(uid) = who {
                s.chown(uid);
            }
            // A waits (bounded) for a marker the test drops into the real workspace once B has
            // committed; `ls` reads the directory without looking Q up.
            let a_script =
                "cat P; for i in $(seq 600); do ls | grep -qx done && break; sleep 0.05; done; cat Q; echo a > a.txt";
            let mut a = txbox_command(who);
            if who != As::Me {
                a.env("HOME", &s.root);
            }
            a.arg("--state-dir").arg(&s.state).arg("run").arg("-C").arg(&s.ws);
            if strict {
                a.args(["--isolation", "strict"]);
            }
            let mut a = a.args(["-c", a_script]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
            let mut a_out = BufReader::new(a.stdout.take().unwrap());
            let mut first = String::new();
            a_out.read_line(&mut first).unwrap();
            assert_eq!(first, "v0\n");
            let (out, r) = run_json(who, &s, "echo v1 > P; echo v1 > Q");
            assert_eq!(r["outcome"], "committed", "{}", describe(&out));
            std::fs::write(s.ws.join("done"), "").unwrap();
            let mut rest = String::new();
            std::io::Read::read_to_string(&mut a_out, &mut rest).unwrap();
            let a = a.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&a.stderr);
            // A's reads mixed the two states: old P, new Q.
            assert_eq!(rest, "v1\n", "{who:?} strict={strict}: {err}");
            if strict {
                assert_eq!(a.status.code(), Some(3), "{who:?}: {err}");
                assert!(err.contains("strict isolation"), "{err}");
                assert!(!s.ws.join("a.txt").exists(), "a refused transaction applied its change");
            } else {
                assert_eq!(a.status.code(), Some(0), "{who:?}: {err}");
                assert!(s.ws.join("a.txt").exists());
            }
        }
    }
}

#[test]
fn strict_sessions_conflict_on_any_commit_since_begin() {
    for who in identities() {
        let s = Scratch::new("isolation-session");
        std::fs::write(s.ws.join("P"), "v0\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let ws = s.ws.to_str().unwrap().to_string();
        let begin = |strict: bool| {
            let mut args = vec!["begin", "-C", &ws];
            if strict {
                args.extend(["--isolation", "strict"]);
            }
            let out = txbox(who, &s, &args);
            assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let (strict, relaxed) = (begin(true), begin(false));
        for tx in [&strict, &relaxed] {
            let out = txbox(who, &s, &["exec", tx, "-c", "cat P > seen-$RANDOM"]);
            assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        }
        let (out, r) = run_json(who, &s, "echo v1 > P");
        assert_eq!(r["outcome"], "committed", "{}", describe(&out));
        let out = txbox(who, &s, &["--json", "commit", &strict]);
        assert_eq!(out.status.code(), Some(3), "{who:?}: {}", describe(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["outcome"], "conflict", "{v}");
        let out = txbox(who, &s, &["--json", "commit", &relaxed]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        // With nothing committed in between, strict commits.
        let quiet = begin(true);
        let out = txbox(who, &s, &["exec", &quiet, "-c", "echo q > q.txt"]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let out = txbox(who, &s, &["commit", &quiet]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert!(s.ws.join("q.txt").exists());
    }
}

/// With $HOME inside the workspace, a command commits a txbox configuration that would give the
/// next `txbox sh` the host's network and another workspace: refused, with the reason. A file
/// there that only narrows is used; the same widening file outside is used.
#[test]
fn a_configuration_committed_from_inside_cannot_widen_the_next_run() {
    for who in identities() {
        let s = Scratch::new("config-inside");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let sh = |script: &str, extra: &[(&str, &std::path::Path)]| {
            let mut cmd = txbox_command(who);
            cmd.env("HOME", &s.ws)
                .env_remove("TXBOX_CONFIG")
                .env_remove("XDG_CONFIG_HOME")
                .env_remove("TXBOX_WORKSPACE");
            for (k, v) in extra {
                cmd.env(k, v);
            }
            cmd.arg("--state-dir").arg(&s.state).args(["sh", "-c", script]).current_dir(&s.ws).output().unwrap()
        };
        let plant = format!(
            "mkdir -p .config/txbox && printf 'network = \"host\"\\nworkspace = \"{}\"\\n' > .config/txbox/config.toml",
            s.root.display()
        );
        let out = sh(&plant, &[]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert!(s.ws.join(".config/txbox/config.toml").exists(), "the command's write was not committed");
        let out = sh("touch next-run", &[]);
        assert_eq!(out.status.code(), Some(125), "{who:?}: {}", describe(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("refused") && err.contains("network") && err.contains("workspace"), "{err}");
        assert!(!s.root.join("next-run").exists() && !s.ws.join("next-run").exists());
        // Through XDG_CONFIG_HOME pointing into the workspace too.
        let out = sh("true", &[("XDG_CONFIG_HOME", &s.ws.join(".config"))]);
        assert_eq!(out.status.code(), Some(125), "{who:?}: {}", describe(&out));
        // A file that only narrows is honoured where it is.
        std::fs::write(s.ws.join(".config/txbox/config.toml"), "timeout = 0.5\nnetwork = \"none\"\n").unwrap();
        let out = sh("sleep 20", &[]);
        assert_eq!(out.status.code(), Some(124), "{who:?}: the narrowing file was not used: {}", describe(&out));
        // Named explicitly and kept outside every workspace, the widening keys are the operator's.
        let outside = s.root.join("operator.toml");
        std::fs::write(&outside, "timeout = 30\n").unwrap();
        let out = sh("echo ok", &[("TXBOX_CONFIG", &outside)]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        // serve and mcp refuse to start with such a file.
        std::fs::write(s.ws.join(".config/txbox/config.toml"), "network = \"host\"\n").unwrap();
        let mut cmd = txbox_command(who);
        let out = cmd
            .env("HOME", &s.ws)
            .env_remove("TXBOX_CONFIG")
            .env_remove("XDG_CONFIG_HOME")
            .arg("--state-dir")
            .arg(&s.state)
            .args(["mcp", "-C"])
            .arg(&s.ws)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("refused"), "{}", describe(&out));
    }
}
