//! The agent-facing front ends through the real binary: `txbox serve` (HTTP, driven with
//! hand-written HTTP/1.1 over std::net, and MCP over streamable HTTP at `/mcp`) and `txbox mcp`
//! (newline-delimited JSON-RPC on stdio). `tests/mcp_client.rs` drives `txbox mcp` with rmcp's
//! own client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const TOKEN: &str = "s3cret-test-token";

/// A running `txbox serve`, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn serve(s: &Scratch, workspaces: &[&Path]) -> Server {
    serve_with(s, workspaces, None)
}

fn serve_with(s: &Scratch, workspaces: &[&Path], state_dir: Option<&Path>) -> Server {
    serve_env(s, workspaces, state_dir, &[])
}

fn serve_env(s: &Scratch, workspaces: &[&Path], state_dir: Option<&Path>, env: &[(&str, &str)]) -> Server {
    let token_file = s.root.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    start_server(|port| {
        let mut cmd = Command::new(binary());
        cmd.arg("serve").arg("--listen").arg(format!("127.0.0.1:{port}")).arg("--token-file").arg(&token_file);
        for w in workspaces {
            cmd.arg("-C").arg(w);
        }
        if let Some(d) = state_dir {
            cmd.arg("--state-dir").arg(d);
        }
        cmd.envs(env.iter().copied())
            // Undo data must not yield to a shared disk running low during the undo tests.
            .env("TXBOX_RETAIN_MIN_FREE", "0");
        cmd
    })
}

/// A `txbox serve` made by `make` for a free port, waited for until it accepts: another port if
/// the one picked was taken meanwhile (the server exits). The token comes from the command
/// (`--token-file`), never from this process's `TXBOX_TOKEN`.
fn start_server(make: impl Fn(u16) -> Command) -> Server {
    for _ in 0..5 {
        let port = free_port();
        let child = make(port)
            .env_remove("TXBOX_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut server = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(_status) = server.child.try_wait().unwrap() {
                break; // port taken by someone else meanwhile: try another
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = server.child.kill();
    }
    panic!("txbox serve did not start");
}

/// One HTTP/1.1 request; returns (status, parsed JSON body or Null).
fn http(port: u16, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> (u16, Value) {
    http_with(port, method, path, token, body, &[])
}

fn http_with(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    conn.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let payload = if chunked { dechunk(rest) } else { rest.to_string() };
    (status, serde_json::from_str(&payload).unwrap_or(Value::Null))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn auth() -> Option<&'static str> {
    Some(TOKEN)
}

#[test]
fn http_auth_health_and_workspace_confinement() {
    let s = Scratch::new("http-auth");
    let other = s.root.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let srv = serve(&s, &[&s.ws]);
    let (st, v) = http(srv.port, "GET", "/v1/health", None, None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["ok"], true);
    let body = json!({"command": "echo hi > f"});
    for token in [None, Some("wrong"), Some("s3cret-test-toke")] {
        let (st, v) = http(srv.port, "POST", "/v1/run", token, Some(&body));
        assert_eq!(st, 401, "{token:?}: {v}");
        assert!(v["error"]["kind"] == "unauthorized" && v["error"]["message"].is_string(), "{v}");
    }
    assert!(!s.ws.join("f").exists(), "an unauthorized request ran");
    // Another path, and a path that climbs out of the served one, are refused.
    for ws in [other.to_str().unwrap().to_string(), format!("{}/..", s.ws.display()), "/".into()] {
        let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "touch x", "workspace": ws})));
        assert!(st == 403 || st == 400, "{ws}: {st} {v}");
        assert!(v["error"]["kind"] == "forbidden" || v["error"]["kind"] == "usage", "{v}");
        let (st, _) = http(srv.port, "POST", "/v1/tx", auth(), Some(&json!({"workspace": ws})));
        assert!(st == 403 || st == 400, "{ws}: {st}");
    }
    assert!(!other.join("x").exists() && !s.root.join("x").exists());
    // Bad input is a JSON 400; unknown routes and transactions are 404.
    let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"cmd": "true"})));
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["kind"] == "usage" && v["error"]["message"].is_string(), "{v}");
    for id in ["0123456789abcdef", "nothex", "../../etc"] {
        let (st, v) = http(srv.port, "GET", &format!("/v1/tx/{id}/diff"), auth(), None);
        assert_eq!(st, 404, "{id}: {v}");
        let (st, _) = http(srv.port, "POST", &format!("/v1/tx/{id}/commit"), auth(), None);
        assert_eq!(st, 404, "{id}");
    }
    let (st, _) = http(srv.port, "GET", "/v1/nope", auth(), None);
    assert_eq!(st, 404);
}

#[test]
fn http_run_commits_rolls_back_and_denies() {
    let s = Scratch::new("http-run");
    let srv = serve(&s, &[&s.ws]);
    let ws = s.ws.to_str().unwrap();
    let (st, v) = http(
        srv.port,
        "POST",
        "/v1/run",
        auth(),
        Some(&json!({"command": "echo hi > a.txt; echo out", "workspace": ws})),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "committed", "{v}");
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["changes"]["added"], json!(["a.txt"]));
    assert_eq!(std::fs::read_to_string(s.ws.join("a.txt")).unwrap(), "hi\n");
    let (st, v) =
        http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "echo x > b.txt; rm a.txt; exit 3"})));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "rolled_back", "{v}");
    assert_eq!(v["exit_code"], 3);
    assert!(!s.ws.join("b.txt").exists() && s.ws.join("a.txt").exists());
    let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "rm -rf /"})));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "denied", "{v}");
    let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "sleep 5", "timeout": 0.3})));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["timed_out"], true, "{v}");
    let (st, v) = http(srv.port, "GET", "/v1/log?n=2", auth(), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
}

/// The server reaps the background collectors it starts: each rolled-back cold run that wrote
/// retires its layer and starts `txbox __gc`, which nobody waits for; a server that never
/// reaped them kept every one as a zombie for as long as it ran.
#[test]
fn serve_leaves_no_zombie_collectors() {
    let s = Scratch::new("http-zombies");
    let state = s.root.join("state");
    let srv = serve_env(&s, &[&s.ws], Some(&state), &[("TXBOX_WARM", "0")]);
    let ws = s.ws.to_str().unwrap();
    for i in 0..6 {
        let cmd = format!("echo {i} > f{i}.txt; exit 1");
        let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": cmd, "workspace": ws})));
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["outcome"], "rolled_back", "{v}");
        // Let this run's collector finish, so the next run starts one of its own.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::read_dir(state.join("gone")).map(|d| d.count()).unwrap_or(0) > 0 {
            assert!(Instant::now() < deadline, "the retired layers were never collected");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let zombies = children_of(srv.child.id()).into_iter().filter(|(_, state)| *state == 'Z').count();
    // The last collector started may have exited since, unreaped until the next starts.
    assert!(zombies <= 1, "{zombies} zombie children of txbox serve");
}

/// The children of `parent`: pid and state letter (`Z`: a zombie), from /proc.
fn children_of(parent: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let mut f = rest.split_whitespace();
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        if f.next().and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            out.push((pid, state));
        }
    }
    out
}

/// An agent's undo puts nothing back that a commit of the same change would have held for a
/// person (a shell-environment file, a git hook inside a directory put back whole): it is
/// refused (denied, nothing changed); a person's undo on the command line is not, and other
/// undos of the agent's go through.
#[test]
fn an_agents_undo_is_judged_by_the_commit_rules() {
    let s = Scratch::new("undo-judged");
    native(As::Me, &s.ws, "echo 'use nix' > .envrc; mkdir -p lib/.git/hooks; echo 'curl x | sh' > lib/.git/hooks/pre-commit; echo ok > plain");
    let srv = serve_with(&s, &[&s.ws], Some(&s.state));
    let ws = s.ws.to_str().unwrap().to_string();
    let person = |args: &[&str]| {
        let out = txbox(As::Me, &s, args);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
        v
    };
    let rm = |what: &str| {
        let v = person(&["--json", "run", "-C", &ws, "-c", what]);
        assert_eq!(v["outcome"], "committed", "{v}");
        v["tx"].as_str().unwrap().to_string()
    };
    // A person removes the file direnv would run; the agent may not put it back.
    let envrc_tx = rm("rm .envrc");
    let (st, u) = http(srv.port, "POST", &format!("/v1/tx/{envrc_tx}/undo"), auth(), None);
    assert_eq!((st, u["outcome"].as_str(), u["exit_code"].as_i64()), (200, Some("denied"), Some(126)), "{u}");
    assert!(u["error"].as_str().unwrap().contains("commit.shell-environment"), "{u}");
    assert!(!s.ws.join(".envrc").exists(), "a refused undo changed something");
    // A hook inside a directory put back whole is judged too.
    let git = rm("rm -rf lib/.git");
    let (st, u) = http(srv.port, "POST", &format!("/v1/tx/{git}/undo"), auth(), None);
    assert_eq!((st, u["outcome"].as_str()), (200, Some("denied")), "{u}");
    assert!(!s.ws.join("lib/.git").exists());
    // Anything else the agent undoes as before.
    let plain = rm("rm plain");
    let (st, u) = http(srv.port, "POST", &format!("/v1/tx/{plain}/undo"), auth(), None);
    assert_eq!((st, u["outcome"].as_str()), (200, Some("committed")), "{u}");
    assert!(s.ws.join("plain").exists());
    // The person may.
    let v = person(&["--json", "undo", "-C", &ws, &git]);
    assert_eq!(v["outcome"], "committed", "{v}");
    assert!(s.ws.join("lib/.git/hooks/pre-commit").exists());
    let v = person(&["--json", "undo", "-C", &ws, &envrc_tx]);
    assert_eq!(v["outcome"], "committed", "{v}");
    assert_eq!(std::fs::read_to_string(s.ws.join(".envrc")).unwrap(), "use nix\n");
}

#[test]
fn http_undo_answers_with_the_run_result() {
    let s = Scratch::new("http-undo");
    let srv = serve_with(&s, &[&s.ws], Some(&s.state));
    let (_, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "echo hi > a.txt"})));
    let a = v["tx"].as_str().unwrap().to_string();
    let (st, u) = http(srv.port, "POST", &format!("/v1/tx/{a}/undo"), auth(), None);
    assert_eq!(st, 200, "{u}");
    assert_eq!((u["outcome"].as_str(), u["undone"].clone()), (Some("committed"), json!([a])), "{u}");
    assert_eq!(u["changes"]["deleted"], json!(["a.txt"]), "{u}");
    assert!(!s.ws.join("a.txt").exists());
    // A conflict is 409 and changes nothing.
    let (_, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "echo 1 > c.txt"})));
    let c = v["tx"].as_str().unwrap().to_string();
    std::fs::write(s.ws.join("c.txt"), "edited outside\n").unwrap();
    let (st, u) = http(srv.port, "POST", &format!("/v1/tx/{c}/undo"), auth(), Some(&json!({})));
    assert_eq!(st, 409, "{u}");
    assert_eq!(u["conflicts"], json!(["c.txt"]), "{u}");
    assert_eq!(std::fs::read_to_string(s.ws.join("c.txt")).unwrap(), "edited outside\n");
    // `to`: every commit after one.
    let (_, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "echo 2 > d.txt"})));
    let d = v["tx"].as_str().unwrap().to_string();
    http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "echo 3 > e.txt; echo 4 > f.txt"})));
    let (st, u) = http(srv.port, "POST", &format!("/v1/tx/{d}/undo"), auth(), Some(&json!({"to": true})));
    assert_eq!(st, 200, "{u}");
    assert!(s.ws.join("d.txt").exists() && !s.ws.join("e.txt").exists(), "{u}");
    // Bad ids and bodies; the token.
    let (st, _) = http(srv.port, "POST", "/v1/tx/nothex/undo", auth(), None);
    assert_eq!(st, 404);
    let (st, _) = http(srv.port, "POST", &format!("/v1/tx/{d}/undo"), auth(), Some(&json!({"bogus": 1})));
    assert_eq!(st, 400);
    let (st, _) = http(srv.port, "POST", &format!("/v1/tx/{d}/undo"), None, None);
    assert_eq!(st, 401);
}

#[test]
fn http_session_flow_and_conflict() {
    let s = Scratch::new("http-tx");
    std::fs::write(s.ws.join("main.rs"), "base\n").unwrap();
    // A state directory outside the workspace: with the default `<ws>/.txbox`, a step over an
    // earlier successful step fails to mount its stacked overlay (ELOOP) — an engine issue
    // outside the front ends, reported separately.
    let srv = serve_with(&s, &[&s.ws], Some(&s.state));
    let begin = || {
        let (st, v) = http(srv.port, "POST", "/v1/tx", auth(), Some(&json!({})));
        assert!(st == 200 || st == 201, "{st} {v}");
        let tx = v["tx"].as_str().unwrap().to_string();
        assert_eq!(tx.len(), 16);
        tx
    };
    let (a, b) = (begin(), begin());
    let exec = |tx: &str, cmd: &str| {
        http(srv.port, "POST", &format!("/v1/tx/{tx}/exec"), auth(), Some(&json!({"command": cmd})))
    };
    let (st, v) = exec(&a, "echo a > main.rs");
    assert_eq!((st, v["outcome"].as_str()), (200, Some("pending")), "{v}");
    let (st, v) = exec(&a, "echo broken > junk; exit 1");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "rolled_back", "{v}");
    let (st, v) = exec(&a, "test ! -e junk && echo new > new.txt");
    assert_eq!((st, v["outcome"].as_str()), (200, Some("pending")), "{v}");
    let (st, v) = exec(&b, "echo b > main.rs");
    assert_eq!(st, 200, "{v}");
    assert_eq!(std::fs::read_to_string(s.ws.join("main.rs")).unwrap(), "base\n", "an open tx touched the workspace");
    let (st, v) = http(srv.port, "GET", &format!("/v1/tx/{a}/diff"), auth(), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"tx": a, "added": ["new.txt"], "modified": ["main.rs"], "deleted": []}));
    let (st, v) = http(srv.port, "POST", &format!("/v1/tx/{a}/commit"), auth(), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "committed", "{v}");
    assert_eq!(std::fs::read_to_string(s.ws.join("main.rs")).unwrap(), "a\n");
    assert!(!s.ws.join("junk").exists());
    // b changed the same file from the same base: first committer wins, b gets 409.
    let (st, v) = http(srv.port, "POST", &format!("/v1/tx/{b}/commit"), auth(), None);
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["outcome"], "conflict", "{v}");
    assert_eq!(std::fs::read_to_string(s.ws.join("main.rs")).unwrap(), "a\n");
    // Committed and refused transactions are gone; rollback of a fresh one works.
    let (st, _) = http(srv.port, "POST", &format!("/v1/tx/{a}/commit"), auth(), None);
    assert_eq!(st, 404);
    // A failed first step, then a good one; rollback discards the transaction.
    let c = begin();
    let (st, v) = exec(&c, "echo broken > junk; exit 1");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "rolled_back", "{v}");
    let (st, v) = exec(&c, "echo c > c.txt");
    assert_eq!((st, v["outcome"].as_str()), (200, Some("pending")), "{v}");
    let (st, v) = http(srv.port, "POST", &format!("/v1/tx/{c}/rollback"), auth(), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "rolled_back", "{v}");
    assert!(!s.ws.join("c.txt").exists());
}

#[test]
fn http_concurrent_requests() {
    let s = Scratch::new("http-conc");
    let srv = serve(&s, &[&s.ws]);
    let port = srv.port;
    let handles: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                http(
                    port,
                    "POST",
                    "/v1/run",
                    auth(),
                    Some(&json!({"command": format!("echo {i} > f{i}.txt; sleep 0.2")})),
                )
            })
        })
        .collect();
    // Health answers while runs are in flight.
    let (st, _) = http(port, "GET", "/v1/health", None, None);
    assert_eq!(st, 200);
    for (i, h) in handles.into_iter().enumerate() {
        let (st, v) = h.join().unwrap();
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["outcome"], "committed", "{v}");
        assert_eq!(std::fs::read_to_string(s.ws.join(format!("f{i}.txt"))).unwrap(), format!("{i}\n"));
    }
}

/// One JSON-RPC message to `/mcp` as a streamable-HTTP MCP client sends it.
fn mcp_http(port: u16, token: Option<&str>, msg: &Value) -> (u16, Value) {
    let headers = [("Accept", "application/json, text/event-stream"), ("MCP-Protocol-Version", "2025-06-18")];
    http_with(port, "POST", "/mcp", token, Some(msg), &headers)
}

#[test]
fn http_mcp_behind_the_token() {
    let s = Scratch::new("http-mcp");
    let srv = serve_with(&s, &[&s.ws], Some(&s.state));
    let call = |id: u64, name: &str, args: Value| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}});
    // Without the token (or with a wrong one) nothing is answered and nothing runs.
    for token in [None, Some("wrong")] {
        let (st, v) = mcp_http(srv.port, token, &call(1, "run", json!({"command": "echo x > unauth.txt"})));
        assert_eq!(st, 401, "{token:?}: {v}");
    }
    assert!(!s.ws.join("unauth.txt").exists(), "an unauthorized MCP call ran");

    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}});
    let (st, v) = mcp_http(srv.port, auth(), &init);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["result"]["serverInfo"]["name"], "txbox", "{v}");
    assert!(v["result"]["capabilities"]["tools"].is_object(), "{v}");
    let (st, _) = mcp_http(srv.port, auth(), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    assert_eq!(st, 202);
    let (st, v) = mcp_http(srv.port, auth(), &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    assert_eq!(st, 200, "{v}");
    let names: Vec<&str> = v["result"]["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["run", "begin", "exec", "diff", "commit", "rollback", "undo", "list", "log"]);

    let payload = |v: &Value| -> Value {
        serde_json::from_str(v["result"]["content"][1]["text"].as_str().unwrap_or("null")).unwrap()
    };
    let (st, v) = mcp_http(srv.port, auth(), &call(3, "run", json!({"command": "echo hi > a.txt"})));
    assert_eq!(st, 200, "{v}");
    assert_eq!(payload(&v)["outcome"], "committed", "{v}");
    assert_eq!(std::fs::read_to_string(s.ws.join("a.txt")).unwrap(), "hi\n");
    let (_, v) = mcp_http(srv.port, auth(), &call(4, "run", json!({"command": "rm a.txt; exit 4"})));
    assert_eq!(
        (payload(&v)["outcome"].as_str(), payload(&v)["exit_code"].as_i64()),
        (Some("rolled_back"), Some(4)),
        "{v}"
    );
    assert!(s.ws.join("a.txt").exists());
    // Stateless: a transaction begun in one request is used by later ones.
    let (_, v) = mcp_http(srv.port, auth(), &call(5, "begin", json!({})));
    let tx = payload(&v)["tx"].as_str().unwrap().to_string();
    let (_, v) = mcp_http(srv.port, auth(), &call(6, "exec", json!({"tx": tx, "command": "echo s > s.txt"})));
    assert_eq!(payload(&v)["outcome"], "pending", "{v}");
    let (_, v) = mcp_http(srv.port, auth(), &call(7, "commit", json!({"tx": tx})));
    assert_eq!(payload(&v)["outcome"], "committed", "{v}");
    assert!(s.ws.join("s.txt").exists());
    // The plain HTTP API is unaffected next to it.
    let (st, _) = http(srv.port, "GET", "/v1/health", None, None);
    assert_eq!(st, 200);
}

#[test]
fn serve_refuses_to_start_without_a_token() {
    let s = Scratch::new("http-notoken");
    let out = Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "-C"])
        .arg(&s.ws)
        .env_remove("TXBOX_TOKEN")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"), "{}", describe(&out));
}

/// A running `txbox mcp`, killed on drop.
struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl Mcp {
    fn start(s: &Scratch) -> Mcp {
        Mcp::start_with(s, &[])
    }

    /// `txbox mcp` with `flags` before the workspace.
    fn start_with(s: &Scratch, flags: &[&str]) -> Mcp {
        let mut child = Command::new(binary())
            .arg("mcp")
            .args(flags)
            .arg("-C")
            .arg(&s.ws)
            .env("TXBOX_RETAIN_MIN_FREE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Mcp { child, stdin: Some(stdin), stdout, next: 1 }
    }

    /// The MCP handshake: `initialize` (its answer returned, checked to offer tools), then
    /// `notifications/initialized`.
    fn initialize(&mut self) -> Value {
        let init = self.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}),
        );
        assert!(init["result"]["capabilities"]["tools"].is_object(), "{init}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        init
    }

    fn send(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert_eq!(v["id"], id, "{v}");
        v
    }

    /// Call a tool; returns (isError, summary line, parsed JSON payload).
    /// Close stdin: the server must exit cleanly.
    fn finish(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "txbox mcp exited with {st} after stdin closed");
                return;
            }
            assert!(Instant::now() < deadline, "txbox mcp did not exit after stdin closed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn call(&mut self, name: &str, args: Value) -> (bool, String, Value) {
        let v = self.request("tools/call", json!({"name": name, "arguments": args}));
        let r = &v["result"];
        let content = r["content"].as_array().unwrap_or_else(|| panic!("{v}"));
        let summary = content[0]["text"].as_str().unwrap().to_string();
        let payload = content
            .get(1)
            .and_then(|c| c["text"].as_str())
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or(Value::Null);
        (r["isError"] == true, summary, payload)
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn mcp_lists_tools_and_runs_transactions() {
    let s = Scratch::new("mcp");
    let mut m = Mcp::start(&s);
    let init = m.initialize();
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    let list = m.request("tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["run", "begin", "exec", "diff", "commit", "rollback", "undo", "list", "log"]);
    for t in tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert!(t["description"].as_str().unwrap().len() > 40, "{t}");
    }

    let (err, summary, r) = m.call("run", json!({"command": "echo hi > a.txt"}));
    assert!(!err);
    assert!(summary.starts_with("txbox: committed"), "{summary}");
    assert_eq!(r["outcome"], "committed", "{r}");
    assert!(s.ws.join("a.txt").exists());

    let (err, summary, r) = m.call("run", json!({"command": "echo x > b.txt; exit 2"}));
    assert!(!err);
    assert!(summary.contains("rolled back"), "{summary}");
    assert_eq!(r["outcome"], "rolled_back");
    assert_eq!(r["exit_code"], 2);
    assert!(!s.ws.join("b.txt").exists());

    // The command's stdin is /dev/null, never the server's (which is this very protocol): a
    // command that reads stdin ends at once and the next request is still understood.
    let (err, _, r) = m.call("run", json!({"command": "cat; wc -c < /dev/stdin; echo read-done"}));
    assert!(!err, "{r}");
    assert_eq!(r["stdout"], "0\nread-done\n", "{r}");

    let (err, summary, r) = m.call("run", json!({"command": "rm -rf /"}));
    assert!(!err);
    assert!(summary.contains("denied"), "{summary}");
    assert_eq!(r["outcome"], "denied", "{r}");

    // Multi-step: begin, exec, diff, commit.
    let (_, _, b) = m.call("begin", json!({}));
    let tx = b["tx"].as_str().unwrap().to_string();
    let (err, _, r) = m.call("exec", json!({"tx": tx, "command": "echo step > step.txt"}));
    assert!(!err, "{r}");
    assert_eq!(r["outcome"], "pending", "{r}");
    let (_, _, d) = m.call("diff", json!({"tx": tx}));
    assert_eq!(d["added"], json!(["step.txt"]), "{d}");
    assert!(!s.ws.join("step.txt").exists());
    let (_, _, r) = m.call("commit", json!({"tx": tx}));
    assert_eq!(r["outcome"], "committed", "{r}");
    assert!(s.ws.join("step.txt").exists());

    // Undo: the last commit (that session), then the undo itself (a redo).
    let (err, summary, u) = m.call("undo", json!({}));
    assert!(!err, "{summary}");
    assert_eq!((u["outcome"].as_str(), u["undone"].clone()), (Some("committed"), json!([tx])), "{u}");
    assert!(!s.ws.join("step.txt").exists());
    let (_, _, r) = m.call("undo", json!({"tx": u["tx"]}));
    assert_eq!(r["outcome"], "committed", "{r}");
    assert!(s.ws.join("step.txt").exists());
    let (err, _, r) = m.call("undo", json!({"tx": tx}));
    assert!(!err);
    assert_eq!(r["outcome"], "error", "an undone transaction is not undone twice: {r}");
    assert!(r["error"].as_str().unwrap().contains("was undone by"), "{r}");

    // Errors are tool errors, not protocol errors; unknown tools are protocol errors.
    let (err, summary, _) = m.call("diff", json!({"tx": "0123456789abcdef"}));
    assert!(err, "{summary}");
    let (err, _, _) = m.call("run", json!({"command": "true", "workspace": "/"}));
    assert!(err);
    let bad = m.request("tools/call", json!({"name": "nope", "arguments": {}}));
    assert!(bad["error"].is_object(), "{bad}");
    let (_, _, log) = m.call("log", json!({}));
    assert!(log.as_array().map(Vec::len).unwrap_or(0) >= 4, "{log}");
    m.finish();
}

/// The PreToolUse hook of `examples/claude-code/settings.json` (`txbox hook || exit 2`, run by a
/// shell as Claude Code runs hooks), and the `txbox-bash-hook` wrapper kept for settings that
/// name it, each fed what Claude Code 2.1.197 sends a PreToolUse hook (captured from a real
/// run), and the rewritten command run as Claude Code's Bash tool would.
#[test]
fn claude_code_hook_routes_bash_through_txbox() {
    let s = Scratch::new("cc-hook");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/claude-code");
    let settings: Value =
        serde_json::from_str(&std::fs::read_to_string(examples.join("settings.json")).unwrap()).unwrap();
    let configured = settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"].as_str().unwrap().to_string();
    assert_eq!(configured, "txbox hook || exit 2");
    let wrapper = examples.join("txbox-bash-hook").display().to_string();
    let bin_dir = binary().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    for hook in [configured.as_str(), wrapper.as_str()] {
        let run_hook = |input: &[u8], path: &str| {
            let mut child = Command::new("sh")
                .arg("-c")
                .arg(hook)
                .env("PATH", path)
                .env("CLAUDE_PROJECT_DIR", &s.ws)
                .env_remove("TXBOX_WORKSPACE")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // A hook that blocks without reading (no txbox on PATH) closes its end first.
            let _ = child.stdin.take().unwrap().write_all(input);
            child.wait_with_output().unwrap()
        };
        let event = |command: &str| {
            json!({
                "session_id": "ba98a14c-f30e-46ce-9081-7fd16bea1a4b",
                "transcript_path": "/home/dev/.claude/projects/p/ba98a14c-f30e-46ce-9081-7fd16bea1a4b.jsonl",
                "cwd": s.ws, "prompt_id": "3079fa93-20bb-433d-b22f-d68a00edddfb", "permission_mode": "default",
                "effort": {"level": "high"}, "hook_event_name": "PreToolUse", "tool_name": "Bash",
                "tool_input": {"command": command, "description": "a step"}, "tool_use_id": "toolu_0003"
            })
            .to_string()
        };
        // What the Bash tool then runs: the rewritten command, in the session's directory.
        let bash_tool = |command: &str| {
            let out = run_hook(event(command).as_bytes(), &path);
            assert_eq!(out.status.code(), Some(0), "{hook}: {}", describe(&out));
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            let o = &v["hookSpecificOutput"];
            assert_eq!(
                (o["hookEventName"].as_str(), o["permissionDecision"].as_str()),
                (Some("PreToolUse"), Some("allow")),
                "{v}"
            );
            assert_eq!(o["updatedInput"]["description"], "a step", "other tool input must be kept: {v}");
            let wrapped = o["updatedInput"]["command"].as_str().unwrap();
            assert!(wrapped.contains(&format!(" {} sh -c -- ", binary().display())), "{wrapped}");
            Command::new("bash")
                .arg("-c")
                .arg(wrapped)
                .current_dir(&s.ws)
                .env("TXBOX_STATE_DIR", &s.state)
                .output()
                .unwrap()
        };
        let out = bash_tool("echo \"it's\" > a.txt; echo out; echo err >&2");
        assert_eq!(
            (out.status.code(), out.stdout.as_slice(), out.stderr.as_slice()),
            (Some(0), &b"out\n"[..], &b"err\n"[..]),
            "{}",
            describe(&out)
        );
        assert_eq!(std::fs::read_to_string(s.ws.join("a.txt")).unwrap(), "it's\n");
        // The command reaches txbox as it was written: quotes, substitutions, lines.
        let hostile = "printf '%s\\n' \"$(echo sub)\" '$(not run)' \"'\" > q.txt\nprintf 'line2\\n' >> q.txt";
        let out = bash_tool(hostile);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert_eq!(std::fs::read_to_string(s.ws.join("q.txt")).unwrap(), "sub\n$(not run)\n'\nline2\n");
        // A command that starts with `-` is a command, not options of the shell.
        let out = bash_tool("-e 2>/dev/null; echo dash > dash.txt");
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert_eq!(std::fs::read_to_string(s.ws.join("dash.txt")).unwrap(), "dash\n");
        std::fs::remove_file(s.ws.join("dash.txt")).unwrap();
        let out = bash_tool("echo x > b.txt; rm a.txt; exit 3");
        assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
        assert!(s.ws.join("a.txt").exists() && !s.ws.join("b.txt").exists(), "the failed command was not rolled back");
        let out = bash_tool("touch c.txt; rm -rf ~");
        assert_eq!(out.status.code(), Some(126), "{}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("denied by rule"), "{}", describe(&out));
        assert!(!s.ws.join("c.txt").exists());
        for f in ["a.txt", "q.txt"] {
            std::fs::remove_file(s.ws.join(f)).unwrap();
        }
        // Whatever cannot be rewritten blocks the call (exit 2, a reason, no answer) rather than
        // let it run unsandboxed: no txbox on PATH, input that is not an event, a NUL.
        for (input, path) in [
            (event("echo unsandboxed > d.txt"), "/usr/bin:/bin"),
            ("not json".to_string(), path.as_str()),
            (json!({"tool_input": {}}).to_string(), path.as_str()),
            (event("echo a\u{0}b > d.txt"), path.as_str()),
        ] {
            let out = run_hook(input.as_bytes(), path);
            assert_eq!(out.status.code(), Some(2), "{hook} {input}: {}", describe(&out));
            assert!(out.stdout.is_empty() && !out.stderr.is_empty(), "{}", describe(&out));
        }
        assert!(!s.ws.join("d.txt").exists());
    }
}

/// A `txbox serve` with extra arguments (ceilings, connection limits).
fn serve_args(s: &Scratch, extra: &[&str]) -> Server {
    let token_file = s.root.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    start_server(|port| {
        let mut cmd = Command::new(binary());
        cmd.arg("--state-dir")
            .arg(&s.state)
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--token-file")
            .arg(&token_file)
            .arg("-C")
            .arg(&s.ws)
            .args(extra)
            .env_remove("TXBOX_CONFIG");
        cmd
    })
}

/// The server's token file is hidden from the commands it runs, by its path and through a link
/// the workspace holds, with the host's network as without: a command that read it could call
/// the server as the agent (and, over MCP at /mcp, the same).
#[test]
fn the_servers_token_file_is_hidden_from_its_commands() {
    let s = Scratch::new("http-token-hidden");
    std::os::unix::fs::symlink(s.root.join("token"), s.ws.join("tok")).unwrap();
    for extra in [&[][..], &["--network", "host"][..]] {
        let srv = serve_args(&s, extra);
        let token = s.root.join("token");
        let mut body = json!({"command": format!("cat {} tok; echo rc=$?", token.display())});
        if !extra.is_empty() {
            body["network"] = json!("host");
        }
        let (st, v) = http(srv.port, "POST", "/v1/run", Some(TOKEN), Some(&body));
        assert_eq!(st, 200, "{extra:?}: {v}");
        let out = format!("{}{}", v["stdout"], v["stderr"]);
        // Hidden files read as empty, hidden directories as empty directories.
        assert!(out.contains("rc=") && !out.contains(TOKEN), "{extra:?}: the token reached the command: {v}");
        // The caller still reads it, and the server still takes it.
        assert!(std::fs::read_to_string(&token).unwrap().contains(TOKEN));
    }
}

/// Every route but /v1/health answers 401 without the token, whatever the method or path
/// (unknown routes included): authentication is a layer on the router, not a call in handlers.
#[test]
fn every_route_but_health_needs_the_token() {
    let s = Scratch::new("http-routes");
    let srv = serve(&s, &[&s.ws]);
    let tx = "0123456789abcdef";
    let routes = [
        ("POST", "/v1/run".to_string()),
        ("GET", "/v1/run".to_string()),
        ("POST", "/v1/tx".to_string()),
        ("GET", "/v1/tx".to_string()),
        ("POST", format!("/v1/tx/{tx}/exec")),
        ("GET", format!("/v1/tx/{tx}/diff")),
        ("POST", format!("/v1/tx/{tx}/commit")),
        ("POST", format!("/v1/tx/{tx}/rollback")),
        ("GET", "/v1/log".to_string()),
        ("POST", "/mcp".to_string()),
        ("GET", "/mcp".to_string()),
        ("DELETE", "/mcp".to_string()),
        ("GET", "/v1/nope".to_string()),
        ("GET", "/".to_string()),
        ("POST", "/v1/health/x".to_string()),
    ];
    for (method, path) in &routes {
        for token in [None, Some("wrong")] {
            let (st, v) = http(srv.port, method, path, token, Some(&json!({"command": "touch pwned"})));
            assert_eq!(st, 401, "{method} {path} {token:?}: {v}");
            assert_eq!(v["error"]["kind"], "unauthorized", "{method} {path}: {v}");
        }
    }
    assert!(!s.ws.join("pwned").exists());
    let (st, _) = http(srv.port, "GET", "/v1/health", None, None);
    assert_eq!(st, 200);
}

/// Every JSON field of the API with a wrong type or out of range: a 400 in the one error shape,
/// and nothing runs.
#[test]
fn http_refuses_wrong_types_and_ranges() {
    let s = Scratch::new("http-hostile");
    let srv = serve(&s, &[&s.ws]);
    let run = |body: &str| {
        let mut conn = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let req = format!(
            "POST /v1/run HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(req.as_bytes()).unwrap();
        let mut raw = String::new();
        conn.read_to_string(&mut raw).unwrap();
        let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, serde_json::from_str::<Value>(rest).unwrap_or(Value::Null))
    };
    let cmd = r#""command": "touch ran""#;
    let mut bodies: Vec<String> = vec![
        "not json".into(),
        "[]".into(),
        "\"touch ran\"".into(),
        "null".into(),
        r#"{"command": 5}"#.into(),
        r#"{"command": ["touch", "ran"]}"#.into(),
        r#"{"command": ""}"#.into(),
        format!(r#"{{{cmd}, "workspace": 1}}"#),
        format!(r#"{{{cmd}, "validate": false}}"#),
        format!(r#"{{{cmd}, "no_commit": "yes"}}"#),
        format!(r#"{{{cmd}, "keep_on_failure": 1}}"#),
        format!(r#"{{{cmd}, "isolation": "serializable"}}"#),
        format!(r#"{{{cmd}, "network": "all"}}"#),
        format!(r#"{{{cmd}, "unknown": 1}}"#),
    ];
    for field in ["timeout", "memory", "pids", "cpu", "max_output", "max_write"] {
        for v in ["0", "-1", "1e308", "1e999", "\"NaN\"", "\"inf\"", "\"garbage\"", "true", "[]", "{}", "-0.5"] {
            bodies.push(format!(r#"{{{cmd}, "{field}": {v}}}"#));
        }
    }
    for body in &bodies {
        let (st, v) = run(body);
        assert_eq!(st, 400, "{body}: {v}");
        assert_eq!(v["error"]["kind"], "usage", "{body}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}: {v}");
    }
    let (st, v) = run(&format!(r#"{{{cmd}, "timeout": 1e308}}"#));
    assert!(v["error"]["message"].as_str().unwrap().contains("(0, 2592000]"), "{st} {v}");
    assert!(!s.ws.join("ran").exists(), "a refused request ran");
    // The server still works.
    let (st, v) = run(&format!(r#"{{{cmd}, "timeout": 30, "memory": "64M", "pids": 64}}"#));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcome"], "committed", "{v}");
}

/// The operator's ceilings: requests may narrow them, never raise them (403 with the reason),
/// and get them when they ask for nothing; the MCP tools obey the same ceilings.
#[test]
fn http_and_mcp_requests_stay_under_the_operators_ceilings() {
    let s = Scratch::new("http-ceiling");
    let srv = serve_args(&s, &["--timeout", "5", "--pids", "64"]);
    let run = |body: Value| http(srv.port, "POST", "/v1/run", auth(), Some(&body));
    for body in [
        json!({"command": "touch a", "network": "host"}),
        json!({"command": "touch a", "timeout": 6}),
        json!({"command": "touch a", "pids": 65}),
    ] {
        let (st, v) = run(body.clone());
        assert_eq!(st, 403, "{body}: {v}");
        assert_eq!(v["error"]["kind"], "forbidden", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("ceiling"), "{v}");
    }
    let (st, v) = http(srv.port, "POST", "/v1/tx", auth(), Some(&json!({})));
    assert_eq!(st, 201, "{v}");
    let tx = v["tx"].as_str().unwrap().to_string();
    let (st, v) = http(
        srv.port,
        "POST",
        &format!("/v1/tx/{tx}/exec"),
        auth(),
        Some(&json!({"command": "touch b", "network": "host"})),
    );
    assert_eq!((st, v["error"]["kind"].as_str()), (403, Some("forbidden")), "{v}");
    assert!(!s.ws.join("a").exists() && !s.ws.join("b").exists());
    // Narrower is fine; nothing asked means the ceiling: this command outlives 5 s.
    let (st, v) = run(json!({"command": "touch a", "timeout": 1, "network": "none"}));
    assert_eq!((st, v["outcome"].as_str()), (200, Some("committed")), "{v}");
    let (st, v) = run(json!({"command": "sleep 30"}));
    assert_eq!((st, v["timed_out"].as_bool()), (200, Some(true)), "the ceiling's timeout applies: {v}");
    // The same ceiling over MCP: a tool error that says why.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "run", "arguments": {"command": "touch c", "network": "host"}}});
    let (st, v) = mcp_http(srv.port, auth(), &call);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["result"]["isError"], true, "{v}");
    assert!(v["result"]["content"][0]["text"].as_str().unwrap().contains("ceiling"), "{v}");
    assert!(!s.ws.join("c").exists());
    drop(srv);
    // An operator who allows the host network lets requests ask for it.
    let srv = serve_args(&s, &["--network", "host"]);
    let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "touch h", "network": "host"})));
    assert_eq!((st, v["outcome"].as_str()), (200, Some("committed")), "{v}");
}

/// The network's ceiling (#15): `--allow-host` at start is what a request gets and the most it
/// may ask for; a request may narrow it (to nothing, too), never widen it; without one, no
/// request may allow a host. A URL the command names is judged against what the request gets.
#[test]
fn requests_may_only_narrow_the_operators_allowlist() {
    let s = Scratch::new("http-allow-ceiling");
    let srv = serve_args(&s, &["--allow-host", "192.0.2.1,*.pkgs.example"]);
    let run = |body: Value| http(srv.port, "POST", "/v1/run", auth(), Some(&body));
    for wider in [json!(["192.0.2.2"]), json!(["pkgs.example"]), json!(["*.example"]), json!(["@pypi"])] {
        let (st, v) = run(json!({"command": "touch a", "allow_hosts": wider}));
        assert_eq!((st, v["error"]["kind"].as_str()), (403, Some("forbidden")), "{wider}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("ceiling"), "{v}");
    }
    assert!(!s.ws.join("a").exists());
    // Nothing asked: the ceiling, no more.
    // An interpreter's words are targets (its code may fetch them); this one only prints.
    let py = |urls: &str| format!("python3 -c \"print('{urls}')\"");
    let (st, v) = run(json!({"command": py("http://192.0.2.1/ http://a.pkgs.example/")}));
    assert_eq!((st, v["outcome"].as_str()), (200, Some("committed")), "{v}");
    let (st, v) = run(json!({"command": py("http://192.0.2.3/")}));
    assert_eq!((st, v["decision"]["rule"].as_str()), (200, Some("network.allowlist")), "{v}");
    // Narrower: a host under the ceiling's wildcard; or nothing at all.
    let (st, v) = run(json!({"command": py("http://a.pkgs.example/"), "allow_hosts": ["a.pkgs.example"]}));
    assert_eq!((st, v["outcome"].as_str()), (200, Some("committed")), "{v}");
    let (st, v) = run(json!({"command": py("http://192.0.2.1/"), "allow_hosts": ["a.pkgs.example"]}));
    assert_eq!(v["decision"]["rule"], "network.allowlist", "{st} {v}");
    let (st, v) = run(json!({"command": py("http://192.0.2.1/"), "allow_hosts": []}));
    assert_eq!(v["decision"]["rule"], "network.allowlist", "{st} {v}");
    // The same over MCP.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "run", "arguments": {"command": "touch c", "allow_hosts": ["192.0.2.9"]}}});
    let (st, v) = mcp_http(srv.port, auth(), &call);
    assert_eq!((st, v["result"]["isError"].as_bool()), (200, Some(true)), "{v}");
    assert!(!s.ws.join("c").exists());
    drop(srv);
    // No ceiling: no host for any request.
    let srv = serve_args(&s, &[]);
    let (st, v) =
        http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "touch a", "allow_hosts": ["192.0.2.1"]})));
    assert_eq!(st, 403, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("network is off"), "{v}");
}

/// Slow, half-sent requests (slowloris) do not stop the server from answering: partial
/// headers or bodies are dropped after --header-timeout, connections beyond --max-connections
/// are closed at once, and /v1/health keeps answering.
#[test]
fn serve_survives_slow_partial_requests() {
    let s = Scratch::new("http-slow");
    let srv = serve_args(&s, &["--header-timeout", "1", "--max-connections", "8"]);
    let port = srv.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Attackers: half a header, or full headers and half a body, then a byte now and then.
    let attackers: Vec<_> = (0..20)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || -> bool {
                let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else { return true };
                c.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                let start = if i % 2 == 0 {
                    "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_string()
                } else {
                    format!("POST /v1/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 1000\r\n\r\n{{")
                };
                if c.write_all(start.as_bytes()).is_err() {
                    return true;
                }
                // Bounded: at most 30 s, then give up (and fail the test).
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut buf = [0u8; 512];
                while Instant::now() < deadline && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match c.read(&mut buf) {
                        Ok(0) => return true, // closed by the server
                        Ok(_) => return true, // answered (a 400 for the body, then closed)
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(_) => return true, // reset
                    }
                    if c.write_all(b"a").is_err() {
                        return true;
                    }
                }
                false
            })
        })
        .collect();
    // Health answers while the attackers hold their connections (retried: a connection may be
    // refused while every slot is taken, until the timeout frees them).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut answered = false;
    while Instant::now() < deadline && !answered {
        answered = std::panic::catch_unwind(|| http(port, "GET", "/v1/health", None, None).0 == 200).unwrap_or(false);
        if !answered {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert!(answered, "/v1/health stopped answering under slow partial requests");
    let closed = attackers.into_iter().map(|a| a.join().unwrap()).filter(|c| *c).count();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(closed, 20, "the server must close every slow connection itself");
    let (st, _) = http(port, "GET", "/v1/health", None, None);
    assert_eq!(st, 200);
}

/// MCP on stdio: a line that is not JSON is answered with -32700 (id null), JSON that is not a
/// JSON-RPC request with -32600, and the server keeps serving.
#[test]
fn mcp_stdio_answers_garbage_with_json_rpc_errors() {
    let s = Scratch::new("mcp-garbage");
    let mut m = Mcp::start(&s);
    let mut reply = |line: &str| -> Value {
        let stdin = m.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
        let mut out = String::new();
        m.stdout.read_line(&mut out).unwrap();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"))
    };
    for (line, code, id) in [
        ("this is not json", -32700, Value::Null),
        ("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\"", -32700, Value::Null),
        ("\u{0}\u{1}", -32700, Value::Null),
        ("[]", -32600, Value::Null),
        ("42", -32600, Value::Null),
        ("{\"id\": 9, \"method\": \"ping\"}", -32600, json!(9)),
        ("{\"jsonrpc\": \"2.0\", \"id\": \"x\", \"method\": 1}", -32600, json!("x")),
        ("{\"jsonrpc\": \"2.0\", \"id\": [1], \"method\": \"ping\"}", -32600, Value::Null),
    ] {
        let v = reply(line);
        assert_eq!(v["jsonrpc"], "2.0", "{line}: {v}");
        assert_eq!(v["error"]["code"], code, "{line}: {v}");
        assert_eq!(v["id"], id, "{line}: {v}");
    }
    m.initialize();
    // Tool arguments of the wrong type are tool errors in the one error shape.
    let (err, _, payload) = m.call("run", json!({"command": "touch x", "timeout": "soon"}));
    assert!(err);
    assert_eq!(payload["error"]["kind"], "usage", "{payload}");
    let (err, _, payload) = m.call("run", json!({"command": "touch x", "memory": 0}));
    assert!(err && payload["error"]["kind"] == "usage", "{payload}");
    assert!(!s.ws.join("x").exists());
    let (err, _, r) = m.call("run", json!({"command": "echo ok"}));
    assert!(!err && r["outcome"] == "committed", "{r}");
    m.finish();
}

/// The CLI: every numeric option with 0, negative, huge, NaN, inf and garbage is a usage error
/// (exit 2) that names the accepted range, nothing runs, and with --json stdout is exactly one
/// error object; errors raised before a result exists are that object too.
#[test]
fn cli_refuses_out_of_range_options_with_one_json_error() {
    let s = Scratch::new("cli-hostile");
    let ws = s.ws.to_str().unwrap().to_string();
    for opt in ["--timeout", "--memory", "--pids", "--cpu", "--max-output", "--max-write"] {
        for v in ["0", "-1", "1e308", "NaN", "inf", "-inf", "garbage", "99999999999999999999999", ""] {
            for json in [true, false] {
                let mut args = vec![];
                if json {
                    args.push("--json");
                }
                let arg = format!("{opt}={v}");
                args.extend(["run", "-C", &ws, &arg, "-c", "touch ran"]);
                let out = txbox(As::Me, &s, &args);
                assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
                if json {
                    let text = String::from_utf8_lossy(&out.stdout);
                    assert_eq!(text.lines().count(), 1, "{args:?}: {}", describe(&out));
                    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
                    assert_eq!(v["error"]["kind"], "usage", "{v}");
                    assert!(
                        v["error"]["message"].as_str().unwrap().contains(" between ")
                            || v["error"]["message"].as_str().unwrap().contains("(0, "),
                        "{v}"
                    );
                } else {
                    assert!(out.stdout.is_empty(), "{}", describe(&out));
                }
            }
        }
    }
    assert!(!s.ws.join("ran").exists(), "a refused run ran");
    // A policy file is the caller's input: a host it cannot allow is a usage error wherever
    // the file is read, `policy check` included (it said `internal`, 125).
    let bad_policy = s.root.join("bad-hosts.toml");
    std::fs::write(&bad_policy, "version = 1\nallow_hosts = [\"not a host!!\"]\n").unwrap();
    let bad_policy = bad_policy.to_str().unwrap();
    for (args, code, kind) in [
        (vec!["--json", "policy", "check", "--policy", bad_policy, "-c", "ls"], 2, "usage"),
        (vec!["--json", "run", "-C", &ws, "--policy", bad_policy, "-c", "touch ran"], 2, "usage"),
        (vec!["--json", "diff", "0123456789abcdef"], 125, "not_found"),
        (vec!["--json", "run", "-C", "/nonexistent/dir", "-c", "true"], 2, "usage"),
        (vec!["--json", "run", "-C", &ws], 2, "usage"),
        (vec!["--json", "frobnicate"], 2, "usage"),
        (vec!["--json", "exec", "zz", "-c", "true"], 125, "not_found"),
    ] {
        let out = txbox(As::Me, &s, &args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", describe(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
        assert_eq!(v["error"]["kind"], kind, "{args:?}: {v}");
    }
    assert!(!s.ws.join("ran").exists(), "a run with an unusable policy file ran");
}

/// Everyday interface (#15): policy check exits 126 on a denial; the root and system
/// directories are refused as workspaces; a failed step says the transaction is still open;
/// HTTP lists open transactions; MCP returns capped output (head and tail) and a unified diff.
#[test]
fn everyday_interface() {
    let s = Scratch::new("everyday");
    let out = txbox(As::Me, &s, &["policy", "check", "-c", "rm -rf ~"]);
    assert_eq!(out.status.code(), Some(126), "{}", describe(&out));
    let out = txbox(As::Me, &s, &["policy", "check", "-c", "ls"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    for dir in ["/", "/usr", "/etc", "/proc", "/proc/self", "/sys/kernel", "/home", "/tmp"] {
        let out = txbox(As::Me, &s, &["--json", "run", "-C", dir, "-c", "true"]);
        assert_eq!(out.status.code(), Some(2), "{dir}: {}", describe(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("refusing"), "{v}");
    }
    let ws = s.ws.to_str().unwrap().to_string();
    let out = txbox(As::Me, &s, &["begin", "-C", &ws, "--name", "work"]);
    let tx = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = txbox(As::Me, &s, &["exec", &tx, "-c", "echo x > f; exit 1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("still open"), "{err}");

    let srv = serve_with(&s, &[&s.ws], Some(&s.state));
    let (st, v) = http(srv.port, "GET", "/v1/tx", auth(), None);
    assert_eq!(st, 200, "{v}");
    assert!(v.as_array().unwrap().iter().any(|t| t["tx"] == tx.as_str() && t["name"] == "work"), "{v}");
    let (st, v) = http(srv.port, "GET", "/v1/tx?workspace=/etc", auth(), None);
    assert_eq!(st, 403, "{v}");
    let call = |id: u64, name: &str, args: Value| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}});
    let (_, v) = mcp_http(
        srv.port,
        auth(),
        &call(1, "run", json!({"command": "head -c 300000 /dev/zero | tr '\\0' a; echo END"})),
    );
    let r: Value = serde_json::from_str(v["result"]["content"][1]["text"].as_str().unwrap()).unwrap();
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.len() < 70_000 && stdout.starts_with("aaa") && stdout.ends_with("END\n"), "{}", stdout.len());
    assert!(stdout.contains("bytes omitted") && r["stdout_truncated"] == true, "{r}");
    let (_, v) = mcp_http(srv.port, auth(), &call(2, "exec", json!({"tx": tx, "command": "echo hello > g.txt"})));
    assert_eq!(v["result"]["isError"], false, "{v}");
    let (_, v) = mcp_http(srv.port, auth(), &call(3, "diff", json!({"tx": tx})));
    let unified = v["result"]["content"][2]["text"].as_str().unwrap_or_default();
    assert!(unified.contains("+hello"), "{v}");
}

/// `-C` on the transaction subcommands: ids resolve from any directory; with `-C`, the step runs
/// in the workspace (the current directory when inside it), and a transaction of another
/// workspace is refused.
#[test]
fn transaction_subcommands_take_dash_c() {
    let s = Scratch::new("dash-c");
    let other = s.root.join("other");
    std::fs::create_dir_all(s.ws.join("sub")).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    let ws = s.ws.to_str().unwrap().to_string();
    let run_in = |dir: &Path, args: &[&str]| {
        let mut c = Command::new(binary());
        c.arg("--state-dir").arg(&s.state).args(args).current_dir(dir).output().unwrap()
    };
    let out = run_in(&s.ws, &["begin"]);
    let tx = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // From outside the workspace, by id alone: the step runs where the caller is not, at the root.
    let out = run_in(&s.root, &["--json", "exec", &tx, "-C", &ws, "-c", "pwd"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    assert_eq!(v["stdout"].as_str().map(str::trim), Some(ws.as_str()), "{v}");
    let out = run_in(&s.ws.join("sub"), &["--json", "exec", &tx, "-C", &ws, "-c", "pwd"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stdout"].as_str().map(str::trim), Some(format!("{ws}/sub").as_str()), "{v}");
    let out = run_in(&s.root, &["--json", "diff", &tx, "-C", other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("belongs to the workspace"), "{v}");
    for sub in ["diff", "commit"] {
        let out = run_in(&other, &[sub, &tx, "-C", &ws]);
        assert_eq!(out.status.code(), Some(0), "{sub}: {}", describe(&out));
    }
}

/// Commands built to exhaust the judge: nesting deep enough to overflow a thread's stack (one
/// construct of each kind the parser recurses on), and brace expansions of 2^40 words. Each is
/// answered (judged, then run or not: `exit 0` first, so bash never gets to them), and the
/// server keeps serving, over HTTP and MCP on stdio.
fn hostile_commands() -> Vec<String> {
    let nest =
        |open: &str, mid: &str, close: &str, n: usize| format!("exit 0; {}{mid}{}", open.repeat(n), close.repeat(n));
    vec![
        nest("(", "true", ")", 50_000),
        nest("echo $(", "true", ")", 20_000),
        nest("{ ", "true; ", "}; ", 20_000),
        nest("if true; then ", "true; ", "fi; ", 20_000),
        nest("while true; do ", "true; ", "done; ", 20_000),
        nest("case x in x) ", "true;; ", "esac;; ", 20_000),
        nest("f() { ", "true; ", "}; ", 20_000),
        nest("cat <(cat ", "x", ")", 20_000),
        nest("echo ${a:-", "x", "}", 20_000),
        nest("echo \"$(echo ", "x", ")\"", 20_000),
        format!("exit 0; [[ {}-n x ]]", "! ".repeat(50_000)),
        format!("exit 0; [[ {}-n x ]]", "-n x && ".repeat(50_000)),
        format!("exit 0; bash -c '{}'", nest("(", "true", ")", 200)),
        format!("exit 0; echo {}", "{a,b}".repeat(40)),
        format!("exit 0; rm -rf /tmp/{}", "{a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p}".repeat(12)),
    ]
}

#[test]
fn hostile_commands_do_not_kill_or_exhaust_the_server() {
    let s = Scratch::new("http-deep");
    let srv = serve(&s, &[&s.ws]);
    for cmd in hostile_commands() {
        let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": cmd, "timeout": 60})));
        assert_eq!(st, 200, "{}…: {v}", &cmd[..40]);
        assert!(v["outcome"].is_string(), "{}…: {v}", &cmd[..40]);
        let (st, _) = http(srv.port, "GET", "/v1/health", None, None);
        assert_eq!(st, 200, "the server died on {}…", &cmd[..40]);
    }
    let mut m = Mcp::start(&s);
    m.initialize();
    for cmd in hostile_commands() {
        let (err, _, r) = m.call("run", json!({"command": cmd, "timeout": 60}));
        assert!(!err && r["outcome"].is_string(), "{}…: {r}", &cmd[..40]);
    }
    let (err, _, r) = m.call("run", json!({"command": "echo ok"}));
    assert!(!err && r["outcome"] == "committed", "{r}");
    m.finish();
}

/// Every error the server answers is one JSON object in the one error shape, its status kept:
/// the ones axum and rmcp make by themselves (a wrong method, a path that does not decode,
/// `/mcp` without the media types it wants or with a body that is not JSON-RPC) included.
#[test]
fn every_error_is_one_json_object() {
    let s = Scratch::new("http-json-errors");
    let srv = serve(&s, &[&s.ws]);
    let long_id = "f".repeat(10_000);
    let mcp_ok = [("Accept", "application/json, text/event-stream"), ("Content-Type", "application/json")];
    type Case<'a> = (&'a str, String, Option<Value>, &'a [(&'a str, &'a str)], u16, &'a str);
    let cases: Vec<Case> = vec![
        ("GET", "/v1/run".into(), None, &[], 405, "usage"),
        ("DELETE", "/v1/tx".into(), None, &[], 405, "usage"),
        ("PUT", "/v1/tx/0123456789abcdef/commit".into(), None, &[], 405, "usage"),
        ("GET", "/v1/tx/%ff%fe/diff".into(), None, &[], 400, "usage"),
        ("GET", format!("/v1/tx/{long_id}/diff"), None, &[], 404, "not_found"),
        ("POST", "/v1/health".into(), None, &[], 405, "usage"),
        ("POST", "/mcp".into(), Some(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})), &[], 406, "usage"),
        ("POST", "/mcp".into(), Some(json!([1, 2])), &mcp_ok, 415, "usage"),
        ("POST", "/mcp".into(), Some(json!("ping")), &mcp_ok, 415, "usage"),
        ("GET", "/mcp".into(), None, &[], 405, "usage"),
        // A transaction's name is the caller's input: a bad one is a usage error, not txbox's.
        ("POST", "/v1/tx".into(), Some(json!({"name": "a\u{1b}[2Jb"})), &[], 400, "usage"),
        ("POST", "/v1/tx".into(), Some(json!({"name": "n".repeat(10_000)})), &[], 400, "usage"),
    ];
    for (method, path, body, headers, status, kind) in &cases {
        let (st, v) = http_with(srv.port, method, path, auth(), body.as_ref(), headers);
        let short = &path[..path.len().min(40)];
        assert_eq!(st, *status, "{method} {short}: {v}");
        assert_eq!(v["error"]["kind"], *kind, "{method} {short}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{method} {short}: {v}");
    }
    let (st, _) = http(srv.port, "GET", "/v1/health", None, None);
    assert_eq!(st, 200);
}

/// Served workspaces are disjoint: with one inside another, an agent's commit in the outer one
/// could replace the inner one with a link to any directory, and a transaction open in it would
/// then run and commit there. `serve` and `mcp` refuse to start so; siblings (a name that only
/// begins like another's included) are fine.
#[test]
fn nested_workspaces_are_refused_at_start() {
    let s = Scratch::new("nested-ws");
    let inner = s.ws.join("sub");
    let sibling = s.root.join(format!("{}-b", s.ws.file_name().unwrap().to_string_lossy()));
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::create_dir_all(&sibling).unwrap();
    let token_file = s.root.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    for front in ["serve", "mcp"] {
        for pair in [[&s.ws, &inner], [&inner, &s.ws]] {
            let mut cmd = Command::new(binary());
            cmd.arg(front);
            if front == "serve" {
                cmd.args(["--listen", "127.0.0.1:0", "--token-file"]).arg(&token_file);
            }
            cmd.arg("-C").arg(pair[0]).arg("-C").arg(pair[1]);
            let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
            // A server that started would serve until killed: give it a while to refuse.
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{front} {pair:?}: {}", describe(&out));
            assert!(String::from_utf8_lossy(&out.stderr).contains("is inside workspace"), "{}", describe(&out));
        }
    }
    let srv = serve(&s, &[&s.ws, &sibling]);
    let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": "touch b", "workspace": sibling})));
    assert_eq!((st, v["outcome"].as_str()), (200, Some("committed")), "{v}");
    assert!(sibling.join("b").exists());
}

/// The `diff` tool reads the workspace and the transaction's layer in the server's process,
/// which sees more than the sandbox: a committed link to a directory outside (or to a file
/// there), replaced in the transaction by a directory (or a file) of the same name, must not
/// make the diff show what is outside. A file too large to diff is named with its sizes.
#[test]
fn mcp_diff_shows_nothing_reached_through_a_link() {
    let s = Scratch::new("mcp-diff-link");
    let outside = s.root.join("outside");
    std::fs::create_dir_all(outside.join("deep")).unwrap();
    std::fs::write(outside.join("secret.txt"), "TOP-SECRET-1\n").unwrap();
    std::fs::write(outside.join("deep/secret.txt"), "TOP-SECRET-2\n").unwrap();
    let mut m = Mcp::start(&s);
    m.initialize();
    let o = outside.display();
    let (err, _, r) = m.call(
        "run",
        json!({"command": format!("ln -s {o} lnk && mkdir d && ln -s {o} d/lnk && ln -s {o}/secret.txt flnk")}),
    );
    assert!(!err && r["outcome"] == "committed", "{r}");
    let (err, _, r) = m.call("begin", json!({}));
    assert!(!err, "{r}");
    let tx = r["tx"].as_str().unwrap().to_string();
    let step = "rm lnk d/lnk flnk && mkdir -p lnk d/lnk/deep && echo mine > lnk/secret.txt \
        && echo mine > d/lnk/deep/secret.txt && echo mine > flnk && head -c 9437184 /dev/zero > big.txt";
    let (err, _, r) = m.call("exec", json!({"tx": tx, "command": step}));
    assert!(!err && r["outcome"] == "pending", "{r}");
    let v = m.request("tools/call", json!({"name": "diff", "arguments": {"tx": tx}}));
    let unified = v["result"]["content"][2]["text"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(!unified.contains("TOP-SECRET"), "the diff shows a file outside the workspace:\n{unified}");
    assert!(unified.contains("+mine"), "{unified}");
    assert!(unified.contains("Large file big.txt changed (0 -> 9437184 bytes"), "{unified}");
    let (err, _, r) = m.call("rollback", json!({"tx": tx}));
    assert!(!err, "{r}");
    m.finish();
}

/// What an agent wrote reaches the operator's terminal only as printable text: a command line
/// holding escape sequences (a window title, the clipboard, erasing the screen) shows in
/// `txbox log` with them escaped, and never as the bytes a terminal would act on.
#[test]
fn an_agents_escape_sequences_do_not_reach_the_operators_terminal() {
    let s = Scratch::new("http-escapes");
    let srv = serve_with(&s, &[&s.ws], Some(&s.state));
    let cmd = "echo \u{1b}]52;c;ZWNobyBwd25lZA==\u{7}\u{1b}[2J\u{9b}31m\u{202e} > f.txt";
    let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({"command": cmd})));
    assert_eq!((st, v["outcome"].as_str()), (200, Some("committed")), "{v}");
    let out = txbox(As::Me, &s, &["log", "-C", s.ws.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(text.contains("echo \\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J\\x9b31m\\u{202e} > f.txt"), "{text}");
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
}

/// An agent on MCP's stdio sends calls as fast as it likes, and each `run` is a sandbox: at
/// most `--max-running` run at once (the rest wait their turn and all get their answer).
#[test]
fn mcp_runs_at_most_max_running_calls_at_once() {
    let s = Scratch::new("mcp-running");
    let marker = format!("mrk-{}", std::process::id());
    let mut m = Mcp::start_with(&s, &["--max-running", "2"]);
    m.initialize();
    let calls = 5;
    for id in 100..100 + calls {
        let args = json!({"command": format!("sleep 1.5; : {marker}-{id}")});
        m.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "run", "arguments": args}}),
        );
    }
    // The shells of the calls, as the host sees them (not the txbox processes that carry the
    // same string in their arguments).
    let shells = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else { return false };
                let args: Vec<String> =
                    cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
                args[0].ends_with("bash") && args.iter().any(|a| a.contains(&marker))
            })
            .count()
    };
    let (mut most, mut answered) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let reader = std::thread::spawn(move || {
        let mut answers = Vec::new();
        for _ in 0..calls {
            let mut line = String::new();
            m.stdout.read_line(&mut line).unwrap();
            answers.push(serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("{e}: {line:?}")));
        }
        (m, answers)
    });
    while !reader.is_finished() {
        assert!(Instant::now() < deadline, "the calls were never all answered");
        most = most.max(shells());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut m, answers) = reader.join().unwrap();
    for a in &answers {
        let text = a["result"]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.starts_with("txbox: committed"), "{a}");
        answered += 1;
    }
    assert_eq!(answered, calls);
    assert!((1..=2).contains(&most), "{most} calls ran at once, with --max-running 2");
    m.finish();
    // A bound of nothing is a usage error.
    let o = Command::new(binary()).args(["mcp", "--max-running", "0"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
}

/// `POST /v1/run` of `script` (asserting 200), its stdout.
fn run_out(srv: &Server, script: &str) -> String {
    let (st, v) = http(srv.port, "POST", "/v1/run", auth(), Some(&json!({ "command": script })));
    assert_eq!(st, 200, "{script}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

/// A server keeps what it hides between runs only while nothing it was made from changed
/// (`txbox_sandbox::secrets::watched`): a secret the host links from the home between two runs
/// is hidden where it really is from the next run on, one re-pointed where it points now, and
/// what no longer leads to a secret is visible again.
#[test]
fn serve_hides_secrets_linked_between_its_runs() {
    let s = Scratch::new("http-linked-later");
    let (home, dot) = (s.root.join("home"), s.root.join("dot"));
    for d in ["ssh", "ssh2"] {
        std::fs::create_dir_all(dot.join(d)).unwrap();
        std::fs::write(dot.join(d).join("id"), "LINKED KEY\n").unwrap();
    }
    std::fs::create_dir_all(&home).unwrap();
    let srv = serve_env(&s, &[&s.ws], Some(&s.state), &[("HOME", home.to_str().unwrap())]);
    let cat = |d: &str| run_out(&srv, &format!("cat {} 2>/dev/null; echo", dot.join(d).join("id").display()));
    // Nothing leads there: readable, and again (from what the server kept).
    for _ in 0..3 {
        assert!(cat("ssh").contains("LINKED KEY"));
    }
    std::os::unix::fs::symlink(dot.join("ssh"), home.join(".ssh")).unwrap();
    for _ in 0..2 {
        assert!(!cat("ssh").contains("LINKED KEY"), "linked from ~/.ssh after the last run, not hidden");
    }
    std::fs::remove_file(home.join(".ssh")).unwrap();
    std::os::unix::fs::symlink(dot.join("ssh2"), home.join(".ssh")).unwrap();
    assert!(!cat("ssh2").contains("LINKED KEY"), "~/.ssh re-pointed after the last run, not hidden");
    assert!(cat("ssh").contains("LINKED KEY"), "no longer linked, still hidden");
    // Through a link further on the way (`~/.ssh -> mid/ssh`, `mid -> dot`): re-pointing that
    // one moves the secret too.
    // (In a directory that nothing else leads through.)
    let (mid, dot2) = (s.root.join("elsewhere/mid"), s.root.join("dot2"));
    std::fs::create_dir_all(dot2.join("ssh")).unwrap();
    std::fs::create_dir_all(s.root.join("elsewhere")).unwrap();
    std::fs::write(dot2.join("ssh/id"), "LINKED KEY\n").unwrap();
    std::os::unix::fs::symlink(&dot, &mid).unwrap();
    std::fs::remove_file(home.join(".ssh")).unwrap();
    std::os::unix::fs::symlink(mid.join("ssh"), home.join(".ssh")).unwrap();
    assert!(!cat("ssh").contains("LINKED KEY") && cat("ssh2").contains("LINKED KEY"));
    std::fs::remove_file(&mid).unwrap();
    std::os::unix::fs::symlink(&dot2, &mid).unwrap();
    let cat2 = run_out(&srv, &format!("cat {} 2>/dev/null; echo", dot2.join("ssh/id").display()));
    assert!(!cat2.contains("LINKED KEY"), "the link on the way re-pointed after the last run, not hidden");
    assert!(cat("ssh").contains("LINKED KEY"), "no longer linked, still hidden");
    // A secret that appears later behind a link on the way (`~/.config -> elsewhere/config`,
    // no `gh` in it yet): a watch on `~` alone would not see it.
    let config = s.root.join("elsewhere/config");
    std::fs::create_dir_all(&config).unwrap();
    std::os::unix::fs::symlink(&config, home.join(".config")).unwrap();
    std::fs::create_dir_all(dot.join("gh")).unwrap();
    std::fs::write(dot.join("gh/hosts.yml"), "LINKED KEY\n").unwrap();
    let gh = || run_out(&srv, &format!("cat {} 2>/dev/null; echo", dot.join("gh/hosts.yml").display()));
    for _ in 0..2 {
        assert!(gh().contains("LINKED KEY"));
    }
    std::os::unix::fs::symlink(dot.join("gh"), config.join("gh")).unwrap();
    assert!(!gh().contains("LINKED KEY"), "linked behind ~/.config's link after the last run, not hidden");
    // A watched directory replaced by another of the same name (a new `~/.aws` renamed over
    // the empty one): what changes in the new one is seen too.
    for d in ["aws1", "aws2", "aws3"] {
        std::fs::write(dot.join(d), "LINKED KEY\n").unwrap();
    }
    let aws = |d: &str| run_out(&srv, &format!("cat {} 2>/dev/null; echo", dot.join(d).display()));
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    assert!(aws("aws1").contains("LINKED KEY") && aws("aws1").contains("LINKED KEY"));
    std::fs::create_dir_all(home.join("aws-new")).unwrap();
    std::os::unix::fs::symlink(dot.join("aws2"), home.join("aws-new/credentials")).unwrap();
    std::fs::rename(home.join("aws-new"), home.join(".aws")).unwrap();
    assert!(!aws("aws2").contains("LINKED KEY") && aws("aws1").contains("LINKED KEY"));
    std::fs::remove_file(home.join(".aws/credentials")).unwrap();
    std::os::unix::fs::symlink(dot.join("aws3"), home.join(".aws/credentials")).unwrap();
    assert!(!aws("aws3").contains("LINKED KEY"), "re-linked in a ~/.aws made anew, not hidden");
}

/// Events lost to a full inotify queue: the kernel drops every event after the queue's bound
/// and queues one overflow instead. Among the lost ones here: a watched directory (`~/.aws`)
/// moved away and a new one made in its place. A server that took the overflow for an ordinary
/// change would look again but keep its watch on the old directory. It would then miss a link
/// made later in the new one, and keep serving a list that leaves the secret readable.
#[test]
fn serve_hides_secrets_after_its_watch_queue_overflowed() {
    let s = Scratch::new("http-overflow");
    let (home, dot) = (s.root.join("home"), s.root.join("dot"));
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::create_dir_all(&dot).unwrap();
    std::fs::write(dot.join("aws"), "LINKED KEY\n").unwrap();
    let srv = serve_env(&s, &[&s.ws], Some(&s.state), &[("HOME", home.to_str().unwrap())]);
    let cat = || run_out(&srv, &format!("cat {} 2>/dev/null; echo", dot.join("aws").display()));
    for _ in 0..2 {
        assert!(cat().contains("LINKED KEY"), "nothing leads there yet");
    }
    // More events than the queue holds (16384 by default; read the bound, in case it is larger).
    let bound: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(16384);
    for i in 0..bound + 64 {
        std::os::unix::fs::symlink("x", home.join(format!("f{i}"))).unwrap();
    }
    std::fs::rename(home.join(".aws"), home.join("aws-old")).unwrap();
    std::fs::create_dir(home.join(".aws")).unwrap();
    assert!(cat().contains("LINKED KEY"), "nothing leads there yet");
    std::os::unix::fs::symlink(dot.join("aws"), home.join(".aws/credentials")).unwrap();
    assert!(!cat().contains("LINKED KEY"), "linked in a ~/.aws made while events were lost, not hidden");
}

/// A link into the workspace that the last command made (the caller works in their home,
/// which is the workspace) is followed by the next run: what it leads to is hidden from then on.
#[test]
fn serve_hides_where_a_link_the_last_command_made_leads() {
    let s = Scratch::new("http-linked-by-command");
    let srv = serve_env(&s, &[&s.ws], Some(&s.state), &[("HOME", s.ws.to_str().unwrap())]);
    assert!(run_out(&srv, "mkdir keys && echo IN KEYS > keys/k && cat keys/k").contains("IN KEYS"));
    assert!(run_out(&srv, "cat keys/k").contains("IN KEYS"));
    assert!(run_out(&srv, "ln -s keys .aws && echo linked").contains("linked"));
    assert!(s.ws.join(".aws").is_symlink(), "the link was not committed");
    assert!(!run_out(&srv, "cat keys/k 2>/dev/null; echo").contains("IN KEYS"), "~/.aws's real place not hidden");
}

/// What the host mounts between two runs counts too (a mount changes what a path leads to
/// without a change in any directory): a directory with a link to a secret mounted over
/// `~/.config` hides the secret from the next run on; unmounted, it is visible again.
#[test]
fn serve_hides_what_a_mount_made_between_its_runs_leads_to() {
    if !is_root() {
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let s = Scratch::new("http-mounted-later");
    let (home, dot, cfg) = (s.root.join("home"), s.root.join("dot"), s.root.join("cfg"));
    std::fs::create_dir_all(dot.join("gh")).unwrap();
    std::fs::write(dot.join("gh/hosts.yml"), "GH TOKEN\n").unwrap();
    std::fs::create_dir_all(home.join(".config")).unwrap();
    std::fs::create_dir_all(&cfg).unwrap();
    std::os::unix::fs::symlink(dot.join("gh"), cfg.join("gh")).unwrap();
    let srv = serve_env(&s, &[&s.ws], Some(&s.state), &[("HOME", home.to_str().unwrap())]);
    let cat = || run_out(&srv, &format!("cat {} 2>/dev/null; echo", dot.join("gh/hosts.yml").display()));
    for _ in 0..2 {
        assert!(cat().contains("GH TOKEN"));
    }
    let target = home.join(".config");
    assert!(Command::new("mount").arg("--bind").arg(&cfg).arg(&target).status().unwrap().success());
    let mounted = Unmount(target);
    assert!(!cat().contains("GH TOKEN"), "~/.config/gh linked by a mount after the last run, not hidden");
    drop(mounted);
    assert!(cat().contains("GH TOKEN"), "unmounted, still hidden");
}

/// A server reads its umask once (`warm::client::pin_umask`): every command gets the one the
/// server was started with, cold and warm, run after run (two servers, two umasks).
#[test]
fn serve_gives_every_command_its_own_umask() {
    for mask in ["027", "077"] {
        let s = Scratch::new("http-umask");
        let token_file = s.root.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let srv = start_server(|port| {
            let mut cmd = Command::new("sh");
            cmd.arg("-c")
                .arg(format!("umask {mask}; exec \"$0\" \"$@\""))
                .arg(binary())
                .arg("--state-dir")
                .arg(&s.state)
                .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--token-file"])
                .arg(&token_file)
                .arg("-C")
                .arg(&s.ws);
            cmd
        });
        for _ in 0..3 {
            assert_eq!(run_out(&srv, "umask").trim(), format!("0{mask}"));
        }
    }
}

/// The server's token file is hidden where it really is now: its directory swapped for a link
/// to another between two runs (the server resolves the name it was given at start; each run
/// resolves that again), the file now there is hidden from the next run on, and the one moved
/// aside, no longer the token file, is not.
#[test]
fn the_servers_token_file_is_hidden_where_its_path_leads_now() {
    let s = Scratch::new("http-token-relinked");
    for d in ["a", "b"] {
        std::fs::create_dir_all(s.root.join(d)).unwrap();
        std::fs::write(s.root.join(d).join("token"), format!("{TOKEN}\n")).unwrap();
    }
    let srv = start_server(|port| {
        let mut cmd = Command::new(binary());
        cmd.arg("--state-dir")
            .arg(&s.state)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--token-file"])
            .arg(s.root.join("a/token"))
            .arg("-C")
            .arg(&s.ws);
        cmd
    });
    let cat = |d: &str| run_out(&srv, &format!("cat {} 2>/dev/null; echo", s.root.join(d).join("token").display()));
    for _ in 0..2 {
        assert!(!cat("a").contains(TOKEN) && cat("b").contains(TOKEN));
    }
    std::fs::rename(s.root.join("a"), s.root.join("a-old")).unwrap();
    std::os::unix::fs::symlink(s.root.join("b"), s.root.join("a")).unwrap();
    assert!(!cat("b").contains(TOKEN), "the token file's directory swapped after the last run, not hidden");
    assert!(cat("a-old").contains(TOKEN));
}
