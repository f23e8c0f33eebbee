//! `txbox mcp`: a Model Context Protocol server built on the official Rust SDK (`rmcp`, pinned),
//! on stdio, and over streamable HTTP at `/mcp` of `txbox serve` ([`http_service`]); and the
//! small adapter between its tool calls and [`txbox::api::Api`]. Tool schemas are generated from
//! the request types that parse the arguments (`txbox::api::schema_of`). The tool list and results are
//! plain JSON here and converted to rmcp's model types at the edge, so an SDK upgrade touches
//! only [`Server`] and [`http_service`]. Engine calls run on blocking threads; the process is
//! multi-threaded, so the sandbox launcher re-executes `/proc/self/exe __stage2`.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, ListToolsResult, PaginatedRequestParams,
    ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::{json, Value};
use txbox::api::{
    self, Api, ApiError, BeginBody, ExecArgs, ListArgs, LogArgs, RollbackArgs, RunBody, TxArgs, UndoArgs, JUDGE_STACK,
};
use txbox::render;
use txbox::result::RunResult;

/// A tool: its name, its description written for the model that calls it, and its input
/// schema generated from the request type that parses its arguments.
fn tool<T: schemars::JsonSchema>(name: &str, description: &str) -> Value {
    json!({"name": name, "description": description, "inputSchema": api::schema_of::<T>()})
}

/// The tools, with descriptions written for the model that calls them.
pub fn tools() -> Value {
    json!([
        tool::<RunBody>("run", "Run one shell command (bash -c semantics) in the workspace as ONE transaction, in a sandbox. \
    If it exits 0 (and `validate`, if given, also exits 0) its file changes are committed atomically; \
    if it fails (non-zero exit, signal, timeout, limit) EVERY change it made is rolled back and the workspace is exactly as before. \
    Commands that would do irreversible harm (e.g. deleting outside the workspace, pushing, network exfiltration) are denied by policy: nothing runs, outcome is `denied` and `decision.reason` says why — do not retry the same command. \
    Limits and network may only be narrowed below what the operator allows; asking for more is an error that says the ceiling. \
    Result: a one-line summary, then JSON with outcome (committed|rolled_back|denied|pending|conflict|error|held), exit_code, stdout, stderr (each at most 64 KiB: head and tail), changes {added, modified, deleted}. \
    Outcome `held` (exit_code 4): the changes include files the host would run by itself later (git hooks, git settings that run programs, .envrc, editor tasks, agent settings); nothing was applied, `held` says why, and only a person can approve it — you cannot; do not retry; continue without it or roll it back. \
    With no_commit=true the changes are kept pending: review with `diff`, then `commit` or `rollback`."),
        tool::<BeginBody>("begin", "Open a multi-step transaction and return its id. Then call `exec` for each step, `diff` to review the pending changes, and finally `commit` (apply them to the workspace) or `rollback` (discard them). Nothing reaches the workspace until `commit`."),
        tool::<ExecArgs>("exec", "Run one shell command as the next step of an open transaction (from `begin`). A step that succeeds becomes a savepoint; a step that fails is undone alone (earlier steps stay, the transaction stays open) unless keep_on_failure. Changes stay pending until `commit`. Denied commands do not run."),
        tool::<TxArgs>("diff", "Show what an open transaction would change if committed: the paths it adds, modifies and deletes, and the unified diff (at most 64 KiB). Use it to review before `commit` or `rollback`."),
        tool::<TxArgs>("commit", "Apply an open transaction's changes to the workspace atomically. If files it touches were changed outside the transaction meanwhile, the commit is refused (outcome `conflict`, nothing changed); the transaction is then gone, so redo the work. If the changes include files the host runs by itself later (git hooks, ...), the transaction is held for a person (outcome `held`): it stays open, and only a person can approve it."),
        tool::<RollbackArgs>("rollback", "Discard an open transaction entirely (the workspace was never touched), or with `to` undo only the steps after step number `to` and keep the transaction open."),
        tool::<UndoArgs>("undo", "Undo a committed transaction: by default the workspace's last commit, or `tx`, or with `to` every commit after `tx` (the workspace returns to the state right after it). \
    The undo is itself a transaction: exact (contents, modes, symlinks, extended attributes, hard links, empty directories, deletions and creations), atomic, shown in `log`; undoing it redoes. \
    If a path it would touch changed since (by another command or outside txbox), it is refused (outcome `conflict`, exit_code 3, `conflicts` lists the paths) and nothing changes. \
    A transaction whose undo data expired (retention budget) cannot be undone (outcome `error`). Result: the same JSON as `run`, with `undone` listing the transactions undone."),
        tool::<ListArgs>("list", "List the open transactions (id, name, workspace, status, steps)."),
        tool::<LogArgs>("log", "The audit log of a workspace: every command txbox ran, denied, committed or rolled back, newest last.")
    ])
}

fn text(s: String) -> Value {
    json!({"type": "text", "text": s})
}

fn result_content(r: &RunResult) -> Value {
    json!({"content": [text(render::summary(r)), text(render::json(r))], "isError": false})
}

/// A tool error: a line for the model, and the error object every front end uses.
fn tool_error(e: &ApiError) -> Value {
    json!({"content": [text(format!("txbox: error: {}", e.message)), text(e.to_json().to_string())], "isError": true})
}

fn ok(summary: String, payload: Value) -> Value {
    json!({"content": [text(summary), text(payload.to_string())], "isError": false})
}

/// One `tools/call`: the tool's result, or `Err` for an unknown tool (a protocol error).
pub fn call(api: &Api, name: &str, args: &Value) -> Result<Value, String> {
    let args = args.clone();
    let r: Result<Value, ApiError> = match name {
        "run" => api::parse::<RunBody>(args).and_then(|b| api.run(&b)).map(|r| result_content(&r)),
        "exec" => api::parse::<ExecArgs>(args).and_then(|a| api.exec(&a.tx, &a.step)).map(|r| result_content(&r)),
        "begin" => api::parse::<BeginBody>(args)
            .and_then(|b| api.begin(&b))
            .map(|tx| ok(format!("txbox: began tx {tx}"), json!({"tx": tx}))),
        "diff" => api::parse::<TxArgs>(args).and_then(|a| api.diff(&a.tx, true)).map(|v| {
            let n = |k: &str| v.get(k).and_then(Value::as_array).map_or(0, Vec::len);
            let line = format!("txbox: pending changes +{} ~{} -{}", n("added"), n("modified"), n("deleted"));
            let unified = v.get("diff").and_then(Value::as_str).unwrap_or("").to_string();
            let mut listing = v.clone();
            if let Value::Object(m) = &mut listing {
                m.remove("diff");
            }
            json!({"content": [text(line), text(listing.to_string()), text(unified)], "isError": false})
        }),
        "commit" => api::parse::<TxArgs>(args).and_then(|a| api.commit(&a.tx)).map(|r| result_content(&r)),
        "rollback" => {
            api::parse::<RollbackArgs>(args).and_then(|a| api.rollback(&a.tx, a.to)).map(|r| result_content(&r))
        }
        "undo" => api::parse::<UndoArgs>(args)
            .and_then(|a| api.undo(a.tx.as_deref(), a.to, a.workspace.as_deref()))
            .map(|r| result_content(&r)),
        "list" => api::parse::<ListArgs>(args).and_then(|a| api.list(a.workspace.as_deref())).and_then(|txs| {
            let v = serde_json::to_value(&txs).map_err(|e| ApiError::internal(e.to_string()))?;
            Ok(ok(format!("txbox: {} open transactions", txs.len()), v))
        }),
        "log" => api::parse::<LogArgs>(args).and_then(|a| api.log(a.workspace.as_deref(), a.n)).map(|v| {
            let count = v.as_array().map_or(0, Vec::len);
            ok(format!("txbox: {count} audit entries"), v)
        }),
        other => return Err(format!("unknown tool `{other}`")),
    };
    Ok(r.unwrap_or_else(|e| tool_error(&e)))
}

const INSTRUCTIONS: &str = "txbox runs shell commands as transactions: a command that fails is rolled back completely, \
one that succeeds is committed, and irreversible commands are denied. Use `run` for single commands; use begin/exec/diff \
then commit or rollback to review multi-step work before it reaches the workspace. A committed change can be undone \
with `undo` (refused if what it touched changed since).";

/// The rmcp handler: tools from [`tools`], calls through [`call`] on a blocking thread.
#[derive(Clone)]
pub(crate) struct Server {
    api: Arc<Api>,
    /// On stdio, the calls that may run at once (`--max-running`); a call waits for its turn.
    /// Over HTTP, `serve`'s connection bound is the bound.
    running: Option<Arc<tokio::sync::Semaphore>>,
}

fn convert<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ErrorData> {
    serde_json::from_value(v)
        .map_err(|e| ErrorData::internal_error(format!("txbox: building the MCP reply: {e}"), None))
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::default();
        info.capabilities = rmcp::model::ServerCapabilities::builder().enable_tools().build();
        info.server_info = rmcp::model::Implementation::new("txbox", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(INSTRUCTIONS.into());
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        convert(json!({ "tools": tools() }))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let api = self.api.clone();
        let name = request.name.to_string();
        let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        // An agent can send calls as fast as it likes, and each `run` is a sandbox: held until
        // the call is done, whatever it is.
        let _turn = match &self.running {
            Some(s) => Some(
                s.clone()
                    .acquire_owned()
                    .await
                    .map_err(|e| ErrorData::internal_error(format!("txbox: waiting for a turn: {e}"), None))?,
            ),
            None => None,
        };
        let out = tokio::task::spawn_blocking(move || call(&api, &name, &args))
            .await
            .map_err(|e| ErrorData::internal_error(format!("txbox: worker failed: {e}"), None))?
            .map_err(|m| ErrorData::invalid_params(m, None))?;
        Ok(convert::<CallToolResult>(out)?.into())
    }
}

/// MCP over streamable HTTP, for `txbox serve` to mount behind its bearer token: the same
/// [`Server`], stateless (no `Mcp-Session-Id`; the tools keep no per-client state, transactions
/// live in the state directory) and answering each POST with one JSON body rather than an SSE
/// stream. rmcp's `Host` allow-list (loopback only, against DNS rebinding) is off: every request
/// must carry the bearer token, which a rebinding page cannot, and `--listen` may be any address.
pub(crate) fn http_service(api: Arc<Api>) -> StreamableHttpService<Server, NeverSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(Server { api: api.clone(), running: None }),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// The longest line taken from stdin; a longer one is answered with a parse error and skipped.
const MAX_LINE: usize = 16 << 20;

/// A JSON-RPC 2.0 error reply.
fn rpc_error(id: Value, code: i64, message: &str, data: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": data}})
}

/// What to do with one line from the client: `None` passes it to the MCP service; `Some`
/// answers it with a JSON-RPC error per the specification: -32700 (parse error, id null) for
/// what is not JSON, -32600 (invalid request, with the request's id when it has a usable one)
/// for JSON that is not a JSON-RPC 2.0 message. Blank lines are dropped (`Some(Null)`).
pub fn screen(line: &[u8]) -> Option<Value> {
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() {
        return Some(Value::Null);
    }
    let v: Value = match serde_json::from_slice(trimmed) {
        Ok(v) => v,
        Err(e) => return Some(rpc_error(Value::Null, -32700, "Parse error", e.to_string())),
    };
    let Some(obj) = v.as_object() else {
        let why = "a message must be one JSON object (batches are not supported)".to_string();
        return Some(rpc_error(Value::Null, -32600, "Invalid Request", why));
    };
    let id = match obj.get("id") {
        None => None,
        Some(i @ (Value::String(_) | Value::Number(_))) => Some(i.clone()),
        Some(_) => {
            let why = "`id` must be a string or a number".to_string();
            return Some(rpc_error(Value::Null, -32600, "Invalid Request", why));
        }
    };
    let invalid = |why: &str| Some(rpc_error(id.clone().unwrap_or(Value::Null), -32600, "Invalid Request", why.into()));
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid("`jsonrpc` must be \"2.0\"");
    }
    match (obj.get("method"), obj.contains_key("result") || obj.contains_key("error")) {
        (Some(Value::String(_)), false) => {
            if obj.get("params").is_some_and(|p| !(p.is_object() || p.is_array())) {
                return invalid("`params` must be an object or an array");
            }
            None
        }
        (None, true) if id.is_some() => None,
        (Some(_), _) => invalid("`method` must be a string, in a request without `result` or `error`"),
        (None, _) => invalid("neither a request (`method`) nor a response (`id` with `result` or `error`)"),
    }
}

/// Read one line of at most [`MAX_LINE`] bytes (without its newline); `Ok(None)` at end of
/// input; `Err(())` for a line that was longer (the rest of it is skipped).
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<Result<(), ()>>> {
    use tokio::io::AsyncBufReadExt;
    buf.clear();
    let mut too_long = false;
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if buf.is_empty() && !too_long { None } else { Some(if too_long { Err(()) } else { Ok(()) }) });
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > MAX_LINE {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(Some(if too_long { Err(()) } else { Ok(()) }));
        }
    }
}

/// stdio for the MCP service behind [`screen`]: lines that are not JSON-RPC messages are
/// answered here, the rest pass through. Replies from both reach stdout a whole line at a
/// time. Returns the service's ends and the task that writes stdout (done when both
/// writers are).
fn screened_stdio() -> (tokio::io::DuplexStream, tokio::io::DuplexStream, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let (mut to_service, service_in) = tokio::io::duplex(1 << 16);
    let (service_out, from_service) = tokio::io::duplex(1 << 16);
    let (lines, mut queue) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    let errors = lines.clone();
    tokio::spawn(async move {
        let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
        let mut buf = Vec::new();
        while let Ok(Some(line)) = read_line(&mut stdin, &mut buf).await {
            let reply = match line {
                Err(()) => {
                    Some(rpc_error(Value::Null, -32700, "Parse error", format!("line longer than {MAX_LINE} bytes")))
                }
                Ok(()) => screen(&buf),
            };
            match reply {
                Some(Value::Null) => {}
                Some(err) => {
                    if errors.send(format!("{err}\n").into_bytes()).await.is_err() {
                        break;
                    }
                }
                None => {
                    buf.push(b'\n');
                    if to_service.write_all(&buf).await.is_err() {
                        break;
                    }
                }
            }
        }
        // End of input: the service sees it and ends.
        let _ = to_service.shutdown().await;
    });
    tokio::spawn(async move {
        let mut out = tokio::io::BufReader::new(from_service);
        let mut line = Vec::new();
        while matches!(out.read_until(b'\n', &mut line).await, Ok(n) if n > 0) {
            if lines.send(std::mem::take(&mut line)).await.is_err() {
                break;
            }
        }
    });
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = queue.recv().await {
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    (service_in, service_out, writer)
}

/// Serve MCP on stdin/stdout until the client closes stdin.
pub fn main(served: crate::serve::Served, max_running: usize) -> Result<i32> {
    let api = Arc::new(served.api()?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        // Requests are judged on these threads: room for the deepest command the policy parses
        // (txbox_policy's nesting bound; 2 MiB, the default, is not enough in a debug build).
        .thread_stack_size(JUDGE_STACK)
        .enable_all() // rmcp uses timers (request timeouts)
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let (input, output, writer) = screened_stdio();
        let turns = Some(Arc::new(tokio::sync::Semaphore::new(max_running)));
        let running = Server { api, running: turns }.serve((input, output)).await.context("MCP initialization")?;
        running.waiting().await.context("MCP service")?;
        let _ = writer.await;
        Ok::<i32, anyhow::Error>(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_that_are_not_json_rpc_get_spec_errors() {
        let code = |l: &str| screen(l.as_bytes()).map(|v| (v["error"]["code"].as_i64(), v["id"].clone()));
        assert_eq!(code("not json"), Some((Some(-32700), Value::Null)));
        assert_eq!(code("{\"jsonrpc\": \"2.0\", \"id\": 1, "), Some((Some(-32700), Value::Null)));
        assert_eq!(code("[]"), Some((Some(-32600), Value::Null)));
        assert_eq!(code("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]"), Some((Some(-32600), Value::Null)));
        assert_eq!(code("42"), Some((Some(-32600), Value::Null)));
        assert_eq!(code("{\"id\": 7, \"method\": \"ping\"}"), Some((Some(-32600), json!(7))));
        assert_eq!(code("{\"jsonrpc\": \"2.0\", \"id\": \"a\", \"method\": 5}"), Some((Some(-32600), json!("a"))));
        assert_eq!(code("{\"jsonrpc\": \"2.0\", \"id\": {}, \"method\": \"ping\"}"), Some((Some(-32600), Value::Null)));
        assert_eq!(code("{\"jsonrpc\": \"2.0\", \"id\": 3}"), Some((Some(-32600), json!(3))));
        assert_eq!(
            code("{\"jsonrpc\": \"2.0\", \"id\": 3, \"method\": \"x\", \"params\": 1}"),
            Some((Some(-32600), json!(3)))
        );
        assert_eq!(screen(b"   "), Some(Value::Null));
        assert_eq!(screen(br#"{"jsonrpc": "2.0", "id": 1, "method": "ping"}"#), None);
        assert_eq!(screen(br#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#), None);
        assert_eq!(screen(br#"{"jsonrpc": "2.0", "id": 1, "result": {}}"#), None);
    }
}
