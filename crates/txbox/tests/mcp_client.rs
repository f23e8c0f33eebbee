//! `txbox mcp` driven by a real MCP client: rmcp's own, over the child's stdin/stdout, the way
//! an agent host starts an MCP server. It checks what `tests/frontends.rs` checks with
//! hand-written JSON-RPC, from the side of a client that validates the protocol itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::ServiceExt;
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ()>;

/// Call a tool; returns (isError, summary line, parsed JSON payload).
async fn call(client: &Client, name: &'static str, args: Value) -> (bool, String, Value) {
    let Value::Object(args) = args else { panic!("arguments must be an object") };
    let r = client.call_tool(CallToolRequestParams::new(name).with_arguments(args)).await.unwrap();
    let r = serde_json::to_value(&r).unwrap();
    let text = |i: usize| r["content"][i]["text"].as_str().map(str::to_string);
    let summary = text(0).unwrap_or_else(|| panic!("{name}: no text content: {r}"));
    let payload = text(1).and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(Value::Null);
    (r["isError"] == true, summary, payload)
}

#[tokio::test(flavor = "current_thread")]
async fn rmcp_client_runs_transactions() {
    let s = Scratch::new("mcp-client");
    std::fs::write(s.ws.join("keep.txt"), "base\n").unwrap();
    let mut child = tokio::process::Command::new(binary())
        .arg("--state-dir")
        .arg(&s.state)
        .args(["mcp", "-C"])
        .arg(&s.ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client: Client = ().serve(io).await.expect("MCP initialization with txbox mcp");
    let info = client.peer_info().expect("the server's initialize result");
    assert_eq!(info.server_info.as_ref().map(|i| i.name.as_str()), Some("txbox"));
    assert!(info.capabilities.tools.is_some(), "tools capability not announced");

    // Tools: the names of docs/DESIGN.md §8, each with an object input schema naming its required keys.
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["run", "begin", "exec", "diff", "commit", "rollback", "list", "log"]);
    for t in &tools {
        let schema = Value::Object((*t.input_schema).clone());
        assert_eq!(schema["type"], "object", "{}: {schema}", t.name);
        assert!(schema["properties"].is_object(), "{}: {schema}", t.name);
        for key in schema["required"].as_array().into_iter().flatten() {
            assert!(
                schema["properties"].get(key.as_str().unwrap()).is_some(),
                "{}: required {key} is not a property",
                t.name
            );
        }
    }
    let required = |name: &str| tools.iter().find(|t| t.name == name).map(|t| t.input_schema.get("required").cloned());
    assert_eq!(required("run"), Some(Some(json!(["command"]))));
    assert_eq!(required("exec"), Some(Some(json!(["tx", "command"]))));

    // A committing command: its file lands in the workspace.
    let (err, summary, r) = call(&client, "run", json!({"command": "echo hi > a.txt; echo out"})).await;
    assert!(!err && summary.starts_with("txbox: committed"), "{summary}");
    assert_eq!((r["outcome"].as_str(), r["stdout"].as_str()), (Some("committed"), Some("out\n")), "{r}");
    assert_eq!(r["changes"]["added"], json!(["a.txt"]));
    assert_eq!(std::fs::read_to_string(s.ws.join("a.txt")).unwrap(), "hi\n");

    // A failing command: non-zero exit, every change undone.
    let before = digest(&s.ws, &[]);
    let (err, summary, r) =
        call(&client, "run", json!({"command": "echo x > b.txt; rm keep.txt; echo c >> a.txt; exit 7"})).await;
    assert!(!err && summary.contains("rolled back"), "{summary}");
    assert_eq!((r["outcome"].as_str(), r["exit_code"].as_i64()), (Some("rolled_back"), Some(7)), "{r}");
    assert_eq!(r["rollback_reason"], "exit_status", "{r}");
    assert_eq!(digest(&s.ws, &[]), before, "the rolled-back command changed the workspace");

    // A multi-step transaction: a failed step is undone alone, the others stay pending until commit.
    let (err, _, b) = call(&client, "begin", json!({"name": "client-test"})).await;
    assert!(!err, "{b}");
    let tx = b["tx"].as_str().unwrap().to_string();
    let (_, _, r) = call(&client, "exec", json!({"tx": tx, "command": "echo one > one.txt"})).await;
    assert_eq!(r["outcome"], "pending", "{r}");
    let (_, _, r) =
        call(&client, "exec", json!({"tx": tx, "command": "echo two > two.txt; rm one.txt keep.txt; exit 1"})).await;
    assert_eq!((r["outcome"].as_str(), r["exit_code"].as_i64()), (Some("rolled_back"), Some(1)), "{r}");
    let (_, _, r) = call(
        &client,
        "exec",
        json!({"tx": tx, "command": "test -e one.txt && test ! -e two.txt && echo base >> keep.txt"}),
    )
    .await;
    assert_eq!(r["outcome"], "pending", "the failed step was not undone alone: {r}");
    let (err, summary, d) = call(&client, "diff", json!({"tx": tx})).await;
    assert!(!err, "{summary}");
    assert_eq!(d, json!({"tx": tx, "added": ["one.txt"], "modified": ["keep.txt"], "deleted": []}));
    assert_eq!(digest(&s.ws, &[]), before, "an open transaction touched the workspace");
    let (_, _, r) = call(&client, "commit", json!({"tx": tx})).await;
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(std::fs::read_to_string(s.ws.join("one.txt")).unwrap(), "one\n");
    assert_eq!(std::fs::read_to_string(s.ws.join("keep.txt")).unwrap(), "base\nbase\n");
    assert!(!s.ws.join("two.txt").exists());

    // A denial: nothing of the command runs, not even its harmless first part.
    let (err, summary, r) = call(&client, "run", json!({"command": "touch ran.txt; rm -rf ~"})).await;
    assert!(!err && summary.contains("denied"), "{summary}");
    assert_eq!((r["outcome"].as_str(), r["decision"]["action"].as_str()), (Some("denied"), Some("deny")), "{r}");
    assert!(r["decision"]["rule"].is_string(), "a denial names its rule: {r}");
    assert!(!s.ws.join("ran.txt").exists(), "a denied command ran");

    // Failures are tool errors the model can read, not protocol errors.
    let (err, summary, _) = call(&client, "commit", json!({"tx": tx})).await;
    assert!(err && summary.contains("unknown transaction"), "{summary}");
    let (_, _, log) = call(&client, "log", json!({"n": 3})).await;
    let outcomes: Vec<&str> = log.as_array().unwrap().iter().filter_map(|e| e["outcome"].as_str()).collect();
    assert_eq!(outcomes.last(), Some(&"denied"), "{log}");

    // Closing the client closes stdin; the server exits by itself, successfully.
    client.cancel().await.unwrap();
    let status =
        tokio::time::timeout(Duration::from_secs(10), child.wait()).await.expect("txbox mcp did not exit").unwrap();
    assert!(status.success(), "txbox mcp exited with {status}");
}
