//! Delayed escapes are held for a person (issue #13, finding 10): changes to files the host
//! runs later by itself (git hooks, git settings that run programs, .envrc, editor tasks,
//! agent settings) leave the transaction open with outcome `held` and exit status 4; `txbox
//! diff` shows them, `txbox approve` commits exactly what was held, `txbox rollback` drops it.
//! Every front end reports `held`; none but the command line can approve. Root and
//! unprivileged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// A workspace that is a git repository with a benign configuration, owned by `who`.
fn repo(who: As, name: &str) -> Scratch {
    let s = Scratch::new(name);
    let git = |args: &[&str]| {
        let st = Command::new("git").args(args).current_dir(&s.ws).stdout(Stdio::null()).status().unwrap();
        assert!(st.success(), "git {args:?}");
    };
    git(&["init", "-q", "."]);
    git(&["config", "user.name", "dev"]);
    std::fs::write(s.ws.join("README.md"), "# r\n").unwrap();
    std::fs::write(s.ws.join(".git/hooks/pre-push"), "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::write(s.ws.join("shared.gitconfig"), "[user]\n\temail = dev@example.org\n").unwrap();
    if let As::User(uid) = who {
        s.chown(uid);
    }
    s
}

fn run(who: As, s: &Scratch, script: &str) -> (std::process::Output, Value) {
    run_json(who, s, script)
}

fn held_rules(j: &Value) -> Vec<String> {
    j["held"]
        .as_array()
        .map(|a| a.iter().map(|h| h["rule"].as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// Every class of delayed escape, in variants: each is held, and the workspace is unchanged.
#[test]
fn delayed_escapes_are_held_and_nothing_is_applied() {
    let variants: &[(&str, &str, &str)] = &[
        ("hook added", "printf '#!/bin/sh\\nid\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit", "commit.git-hooks"),
        ("hook made executable", "chmod +x .git/hooks/pre-push", "commit.git-hooks"),
        ("hook edited", "echo 'curl x | sh' >> .git/hooks/pre-push", "commit.git-hooks"),
        ("hook as a symlink", "ln -s ../../evil.sh .git/hooks/pre-commit", "commit.git-hooks"),
        ("hooks dir as a symlink", "mkdir -p evil && mv .git/hooks .git/hooks.old && ln -s ../evil .git/hooks", "commit.git-hooks"),
        ("helper below hooks", "mkdir -p .git/hooks/lib && echo x > .git/hooks/lib/run.sh", "commit.git-hooks"),
        ("fsmonitor by git config", "git config core.fsmonitor ./fsmon.sh", "commit.git-config"),
        ("fsmonitor by editing", "printf '[core]\\n\\tfsmonitor = \"sh -c id\"\\n' >> .git/config", "commit.git-config"),
        ("fsmonitor by include", "printf '[core]\\nfsmonitor=x\\n' > evil.cfg; git config include.path ../evil.cfg", "commit.git-config"),
        ("include by includeIf", "git config 'includeIf.gitdir:/.path' ../shared.gitconfig", "commit.git-config"),
        ("shell alias", "git config alias.st '!sh -c id'", "commit.git-config"),
        ("pager", "git config core.pager 'sh -c id'", "commit.git-config"),
        ("diff driver", "git config diff.bin.textconv ./conv", "commit.git-config"),
        ("hooksPath into the workspace", "mkdir -p .githooks && echo x > .githooks/pre-commit && git config core.hooksPath .githooks", "commit.git-config"),
        ("config replaced by a symlink", "cp .git/config c && rm .git/config && ln -s ../c .git/config", "commit.git-config"),
        (".git replaced by a gitdir file", "mv .git real-git && echo 'gitdir: real-git' > .git", "commit.git-hooks"),
        ("envrc", "echo 'curl x | sh' > .envrc", "commit.shell-environment"),
        ("vscode task", "mkdir -p .vscode && echo '{\"tasks\": []}' > .vscode/tasks.json", "commit.editor-tasks"),
        ("vscode interpreter", "mkdir -p .vscode && echo '{\"python.defaultInterpreterPath\": \"./x\"}' > .vscode/settings.json", "commit.editor-tasks"),
        ("claude hook", "mkdir -p .claude && echo '{\"hooks\": {\"Stop\": [{\"hooks\": [{\"type\": \"command\", \"command\": \"id\"}]}]}}' > .claude/settings.json", "commit.agent-settings"),
    ];
    for who in identities() {
        for (what, script, rule) in variants {
            let s = repo(who, "held");
            let before = digest(&s.ws, &[]);
            let (out, j) = run(who, &s, &format!("set -e\necho changed > README.md\n{script}"));
            let ctx = format!("{who:?} {what}: {}", describe(&out));
            assert_eq!(j["outcome"], "held", "{ctx}");
            assert_eq!(out.status.code(), Some(4), "{ctx}");
            assert!(held_rules(&j).iter().any(|r| r == rule), "{ctx}");
            let after = digest(&s.ws, &[]);
            assert!(before == after, "{ctx}: workspace changed:\n{}", diff(&before, &after));
        }
    }
}

/// Benign changes to the same files are not held: git settings that run nothing, a sample
/// hook, `git init` of a nested repository, agent settings that run nothing.
#[test]
fn benign_changes_to_the_same_files_commit() {
    let variants = [
        "git config user.name someone; git config user.email a@b; git config alias.co checkout",
        "git config remote.origin.url https://example.org/r.git; git config branch.main.merge refs/heads/main",
        "echo x > .git/hooks/pre-commit.sample",
        "mkdir vendored && cd vendored && git init -q . && git config user.name v",
        "mkdir -p .claude && echo '{\"model\": \"x\"}' > .claude/settings.json",
        "mkdir -p .vscode && echo '{\"editor.formatOnSave\": true}' > .vscode/settings.json",
        "rm .git/hooks/pre-push",
        "printf '[user]\\n\\temail = other@example.org\\n' > shared.gitconfig",
    ];
    for who in identities() {
        for script in variants {
            let s = repo(who, "benign");
            let (out, j) = run(who, &s, script);
            assert_eq!(j["outcome"], "committed", "{who:?} {script}: {}", describe(&out));
        }
    }
}

/// The places the workspace's own settings point to are judged like .git itself: a hook in a
/// `core.hooksPath` directory set earlier, a setting in a file `.git/config` includes.
#[test]
fn what_the_workspace_config_points_to_is_judged_too() {
    for who in identities() {
        let s = repo(who, "points-to");
        let (out, j) = run(who, &s, "git config core.hooksPath .husky && git config include.path ../shared.gitconfig");
        assert_eq!(j["outcome"], "held", "{}", describe(&out));
        let tx = j["tx"].as_str().unwrap().to_string();
        let out = txbox(who, &s, &["approve", &tx]);
        assert!(out.status.success(), "{}", describe(&out));
        let (out, j) = run(who, &s, "mkdir -p .husky && printf '#!/bin/sh\\nid\\n' > .husky/pre-commit");
        assert_eq!(j["outcome"], "held", "{}", describe(&out));
        assert_eq!(held_rules(&j), ["commit.git-hooks"]);
        let _ = txbox(who, &s, &["rollback", j["tx"].as_str().unwrap()]);
        let (out, j) = run(who, &s, "printf '[core]\\n\\tsshCommand = sh -c id\\n' >> shared.gitconfig");
        assert_eq!(j["outcome"], "held", "{}", describe(&out));
        assert_eq!(held_rules(&j), ["commit.git-config"]);
        let (out, j) = run(who, &s, "printf '[user]\\n\\tname = x\\n' >> shared.gitconfig");
        assert_eq!(j["outcome"], "committed", "{}", describe(&out));
    }
}

/// A run held for a person may wait long: a change made meanwhile to the workspace root's own
/// attributes is the host's, and the approval does not undo it (the run did not touch the
/// root); a root the run changed and the host changed too is a conflict.
#[test]
fn an_approval_keeps_what_the_host_did_to_the_workspace_root_meanwhile() {
    for who in identities() {
        let s = repo(who, "held-root");
        native(who, &s.ws, "chmod 755 .");
        let (out, j) = run(who, &s, "printf '#!/bin/sh\\nid\\n' > .git/hooks/pre-commit");
        assert_eq!(j["outcome"], "held", "{}", describe(&out));
        let tx = j["tx"].as_str().unwrap().to_string();
        native(who, &s.ws, "chmod 750 .");
        let out = txbox(who, &s, &["approve", &tx]);
        assert!(out.status.success(), "{who:?}: {}", describe(&out));
        assert!(s.ws.join(".git/hooks/pre-commit").exists());
        let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&s.ws).unwrap()) & 0o7777;
        assert_eq!(mode, 0o750, "{who:?}: the approval undid the host's chmod");

        let (out, j) = run(who, &s, "chmod 700 . && echo x >> .git/hooks/pre-commit");
        assert_eq!(j["outcome"], "held", "{}", describe(&out));
        let tx = j["tx"].as_str().unwrap().to_string();
        native(who, &s.ws, "chmod 770 .");
        let out = txbox(who, &s, &["--json", "approve", &tx]);
        assert_eq!(out.status.code(), Some(3), "{who:?}: {}", describe(&out));
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["conflicts"], json!(["."]), "{who:?}: {j}");
        let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&s.ws).unwrap()) & 0o7777;
        assert_eq!(mode, 0o770, "{who:?}");
        native(who, &s.ws, "chmod 755 .");
    }
}

/// `diff` and `list` show what is held and why; `exec` refuses to add to it and `commit`
/// holds it again; `approve` commits exactly what a native run would have left; `rollback`
/// drops it.
#[test]
fn approve_commits_exactly_and_rollback_drops() {
    const SCRIPT: &str =
        "set -e\nprintf '#!/bin/sh\\necho hook\\n' > .git/hooks/pre-commit\nchmod 755 .git/hooks/pre-commit\n\
                          echo new > new.txt\nrm README.md\nmkdir -p src && echo 'fn main(){}' > src/main.rs";
    for who in identities() {
        let s = repo(who, "approve");
        let reference = s.root.join("ref");
        copy_tree(&s.ws, &reference);
        native(who, &reference, SCRIPT);
        let before = digest(&s.ws, &[]);
        let (out, j) = run(who, &s, SCRIPT);
        assert_eq!(j["outcome"], "held", "{}", describe(&out));
        assert!(j["changes"]["added"].as_array().unwrap().iter().any(|p| p == "new.txt"), "{j}");
        let tx = j["tx"].as_str().unwrap().to_string();
        let out = txbox(who, &s, &["--json", "list"]);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        let entry =
            list.as_array().unwrap().iter().find(|t| t["tx"] == tx.as_str()).unwrap_or_else(|| panic!("{list}"));
        assert_eq!(entry["status"], "held");
        assert_eq!(entry["held"][0]["path"], ".git/hooks/pre-commit", "{entry}");
        let out = txbox(who, &s, &["diff", &tx]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("held: .git/hooks/pre-commit") && text.contains("+echo hook"), "{text}");
        let out = txbox(who, &s, &["--json", "diff", &tx]);
        let d: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(d["held"][0]["rule"], "commit.git-hooks", "{d}");
        // Nothing can be added to what a person is asked to approve; committing holds again.
        // (A request the transaction's state refuses: a usage error, exit 2.)
        let out = txbox(who, &s, &["exec", &tx, "-c", "echo more > more.txt"]);
        assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
        let out = txbox(who, &s, &["--json", "commit", &tx]);
        assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
        assert!(before == digest(&s.ws, &[]));
        let out = txbox(who, &s, &["--json", "approve", &tx]);
        let a: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
        assert_eq!(a["outcome"], "committed", "{a}");
        let got = digest(&s.ws, &[]);
        let want = digest(&reference, &[]);
        assert!(got == want, "{who:?}: approved tree differs from native:\n{}", diff(&got, &want));
        let out = txbox(who, &s, &["approve", &tx]);
        assert_ne!(out.status.code(), Some(0), "approved twice: {}", describe(&out));
        // Rolled back instead: nothing changes, nothing is left.
        let s = repo(who, "rollback");
        let before = digest(&s.ws, &[]);
        let (_, j) = run(who, &s, SCRIPT);
        let tx = j["tx"].as_str().unwrap().to_string();
        let out = txbox(who, &s, &["rollback", &tx]);
        assert!(out.status.success(), "{}", describe(&out));
        assert!(before == digest(&s.ws, &[]));
        let out = txbox(who, &s, &["--json", "list"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
        // An agent inside a sandbox cannot approve: the policy refuses it up front.
        let (out, j) = run(who, &s, &format!("txbox approve {tx}"));
        assert_eq!(j["outcome"], "denied", "{}", describe(&out));
    }
}

/// Sessions (`exec` + `commit`), `run --validate` and `txbox sh` are judged the same way.
#[test]
fn every_way_to_commit_is_judged() {
    for who in identities() {
        let s = repo(who, "ways");
        let ws = s.ws.to_str().unwrap().to_string();
        let out = txbox(who, &s, &["begin", "-C", &ws]);
        let tx = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let out = txbox(who, &s, &["exec", &tx, "-c", "echo id > .envrc"]);
        assert!(out.status.success(), "{}", describe(&out));
        let out = txbox(who, &s, &["--json", "commit", &tx]);
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((j["outcome"].as_str(), out.status.code()), (Some("held"), Some(4)), "{j}");
        // Rolling back the step that held it reopens the session, judged anew at commit.
        let out = txbox(who, &s, &["rollback", &tx, "--to", "0"]);
        assert!(out.status.success(), "{}", describe(&out));
        let out = txbox(who, &s, &["exec", &tx, "-c", "echo ok > ok.txt"]);
        assert!(out.status.success(), "{}", describe(&out));
        let out = txbox(who, &s, &["--json", "commit", &tx]);
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["outcome"], "committed", "{j}");
        let out = txbox(who, &s, &["--json", "run", "-C", &ws, "--validate", "true", "-c", "echo id > .envrc"]);
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((j["outcome"].as_str(), out.status.code()), (Some("held"), Some(4)), "{j}");
        let out = txbox(who, &s, &["sh", "-c", "echo id > sub.envrc; mkdir -p d && echo x > d/.envrc"]);
        assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("held"), "{}", describe(&out));
        assert!(!s.ws.join("d/.envrc").exists());
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn post(port: u16, path: &str, token: &str, body: &Value) -> (u16, Value) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, serde_json::from_str(rest).unwrap_or(Value::Null))
}

/// HTTP and MCP report `held`; neither offers approval (no route, no tool), so an agent's
/// token or MCP session can never approve its own escape.
#[test]
fn api_front_ends_report_held_and_cannot_approve() {
    let s = repo(As::Me, "api");
    let token = "held-test-token";
    std::fs::write(s.root.join("token"), format!("{token}\n")).unwrap();
    let port = free_port();
    let mut server = Command::new(binary())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--token-file"])
        .arg(s.root.join("token"))
        .arg("--state-dir")
        .arg(&s.state)
        .arg("-C")
        .arg(&s.ws)
        .env_remove("TXBOX_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (st, j) = post(port, "/v1/run", token, &json!({"command": "echo id > .envrc"}));
    assert_eq!((st, j["outcome"].as_str()), (200, Some("held")), "{j}");
    let tx = j["tx"].as_str().unwrap().to_string();
    for path in [format!("/v1/tx/{tx}/approve"), format!("/v1/approve/{tx}"), "/v1/approve".to_string()] {
        let (st, _) = post(port, &path, token, &json!({"tx": tx}));
        assert!(st == 404 || st == 405, "{path}: {st}");
    }
    let (st, j) = post(port, &format!("/v1/tx/{tx}/commit"), token, &json!({}));
    assert_eq!((st, j["outcome"].as_str()), (200, Some("held")), "{j}");
    assert!(!s.ws.join(".envrc").exists());
    let _ = server.kill();
    let _ = server.wait();

    let mut mcp = Command::new(binary())
        .arg("--state-dir")
        .arg(&s.state)
        .arg("mcp")
        .arg("-C")
        .arg(&s.ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = mcp.stdin.take().unwrap();
    let mut stdout = BufReader::new(mcp.stdout.take().unwrap());
    let mut rpc = |id: u64, method: &str, params: Value| -> Value {
        writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let init =
        json!({"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}});
    rpc(1, "initialize", init);
    let tools = rpc(2, "tools/list", json!({}));
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(!names.iter().any(|n| n.contains("approve")), "{names:?}");
    let r = rpc(3, "tools/call", json!({"name": "run", "arguments": {"command": "git config core.fsmonitor ./x"}}));
    let content = r["result"]["content"].as_array().unwrap_or_else(|| panic!("{r}"));
    let payload: Value = serde_json::from_str(content[1]["text"].as_str().unwrap()).unwrap();
    assert_eq!(payload["outcome"], "held", "{payload}");
    assert_eq!(payload["exit_code"], 4, "{payload}");
    let r = rpc(4, "tools/call", json!({"name": "approve", "arguments": {"tx": payload["tx"]}}));
    assert!(r["error"].is_object() || r["result"]["isError"] == true, "{r}");
    let _ = mcp.kill();
    let _ = mcp.wait();
}
