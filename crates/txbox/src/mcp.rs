//! `txbox mcp`: a Model Context Protocol server built on the official Rust SDK (`rmcp`, pinned),
//! on stdio, and over streamable HTTP at `/mcp` of `txbox serve` ([`http_service`]); and the
//! small adapter between its tool calls and [`crate::serve::Api`]. The tool list and results are
//! plain JSON here and converted to rmcp's model types at the edge, so an SDK upgrade touches
//! only [`Server`] and [`http_service`]. Engine calls run on blocking threads; the process is
//! multi-threaded, so the sandbox launcher re-executes `/proc/self/exe __stage2`.

use std::path::PathBuf;
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
use txbox::engine::RunResult;
use txbox::render;

use crate::serve::{Api, ApiError, RunBody};

const LIMIT_PROPS: &str = r#"{
  "timeout": {"type": "number", "description": "Wall-clock limit in seconds. On expiry the whole process tree is killed and every change is rolled back (outcome rolled_back, rollback_reason timeout, exit_code 124)."},
  "memory": {"type": ["integer", "string"], "description": "Memory limit of the process tree, bytes or with a suffix (\"512M\", \"2G\"). Exceeding it kills and rolls back."},
  "pids": {"type": "integer", "description": "Most processes at once."},
  "cpu": {"type": "integer", "description": "CPU seconds per process."},
  "max_output": {"type": ["integer", "string"], "description": "Output limit per stream; exceeding it kills and rolls back."},
  "max_write": {"type": ["integer", "string"], "description": "Most bytes the command may write into the workspace."},
  "network": {"type": "string", "enum": ["none", "host"], "description": "none (default): no network but loopback, and the hosts of allow_hosts through txbox's proxy. host: the host's network."},
  "allow_hosts": {"type": "array", "items": {"type": "string"}, "description": "Hosts the command may reach (HTTP and HTTPS through the proxy txbox sets in HTTPS_PROXY/HTTP_PROXY): \"host\", \"*.domain\", \"host:port\", or presets \"@pypi\", \"@npm\", \"@crates\", \"@go\", \"@github\". Default: everything the server allows; a request may only narrow that. The result's `network` lists every connection, allowed or refused."},
  "keep_on_failure": {"type": "boolean", "description": "Keep a failed command's changes pending for review instead of rolling them back."}
}"#;

fn limit_props() -> serde_json::Map<String, Value> {
    match serde_json::from_str::<Value>(LIMIT_PROPS) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

fn schema(props: Value, required: &[&str], with_limits: bool) -> Value {
    let mut p = match props {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    if with_limits {
        p.extend(limit_props());
    }
    json!({"type": "object", "properties": p, "required": required, "additionalProperties": false})
}

/// The tools, with descriptions written for the model that calls them.
pub fn tools() -> Value {
    let ws = json!({"type": "string", "description": "Workspace directory; may be omitted when the server serves only one."});
    let tx = json!({"type": "string", "description": "Transaction id (16 hex digits) returned by begin or by run with no_commit."});
    json!([
        {
            "name": "run",
            "description": "Run one shell command (bash -c semantics) in the workspace as ONE transaction, in a sandbox. \
    If it exits 0 (and `validate`, if given, also exits 0) its file changes are committed atomically; \
    if it fails (non-zero exit, signal, timeout, limit) EVERY change it made is rolled back and the workspace is exactly as before. \
    Commands that would do irreversible harm (e.g. deleting outside the workspace, pushing, network exfiltration) are denied by policy: nothing runs, outcome is `denied` and `decision.reason` says why — do not retry the same command. \
    Result: a one-line summary, then JSON with outcome (committed|rolled_back|denied|pending|conflict|error), exit_code, stdout, stderr, changes {added, modified, deleted}. \
    With no_commit=true the changes are kept pending: review with `diff`, then `commit` or `rollback`.",
            "inputSchema": schema(json!({
                "command": {"type": "string", "description": "The shell command, e.g. \"make test\" or \"sed -i s/a/b/ f.txt\"."},
                "workspace": ws,
                "validate": {"type": "string", "description": "A check run after the command in the same transaction (e.g. \"cargo test\"); the changes are committed only if it also exits 0."},
                "no_commit": {"type": "boolean", "description": "Leave the transaction pending for review instead of committing; the result's `tx` is its id."}
            }), &["command"], true)
        },
        {
            "name": "begin",
            "description": "Open a multi-step transaction and return its id. Then call `exec` for each step, `diff` to review the pending changes, and finally `commit` (apply them to the workspace) or `rollback` (discard them). Nothing reaches the workspace until `commit`.",
            "inputSchema": schema(json!({
                "workspace": ws,
                "name": {"type": "string", "description": "A label for the transaction."}
            }), &[], false)
        },
        {
            "name": "exec",
            "description": "Run one shell command as the next step of an open transaction (from `begin`). A step that succeeds becomes a savepoint; a step that fails is undone alone (earlier steps stay) unless keep_on_failure. Changes stay pending until `commit`. Denied commands do not run.",
            "inputSchema": schema(json!({
                "tx": tx,
                "command": {"type": "string", "description": "The shell command for this step."}
            }), &["tx", "command"], true)
        },
        {
            "name": "diff",
            "description": "Show which workspace paths an open transaction would add, modify and delete if committed. Use it to review before `commit` or `rollback`.",
            "inputSchema": schema(json!({"tx": tx}), &["tx"], false)
        },
        {
            "name": "commit",
            "description": "Apply an open transaction's changes to the workspace atomically. If files it touches were changed outside the transaction meanwhile, the commit is refused (outcome `conflict`, nothing changed); the transaction is then gone, so redo the work.",
            "inputSchema": schema(json!({"tx": tx}), &["tx"], false)
        },
        {
            "name": "rollback",
            "description": "Discard an open transaction entirely (the workspace was never touched), or with `to` undo only the steps after step number `to` and keep the transaction open.",
            "inputSchema": schema(json!({
                "tx": tx,
                "to": {"type": "integer", "minimum": 0, "description": "Keep steps 1..=to, undo the later ones."}
            }), &["tx"], false)
        },
        {
            "name": "log",
            "description": "The audit log of a workspace: every command txbox ran, denied, committed or rolled back, newest last.",
            "inputSchema": schema(json!({
                "workspace": ws,
                "n": {"type": "integer", "minimum": 1, "description": "Only the last n entries."}
            }), &[], false)
        }
    ])
}

fn text(s: String) -> Value {
    json!({"type": "text", "text": s})
}

fn result_content(r: &RunResult) -> Value {
    json!({"content": [text(render::summary(r)), text(render::json(r))], "isError": false})
}

fn tool_error(e: &ApiError) -> Value {
    json!({"content": [text(format!("txbox: error: {}", e.message))], "isError": true})
}

fn str_arg<'a>(args: &'a Value, k: &str) -> Option<&'a str> {
    args.get(k).and_then(Value::as_str)
}

fn required<'a>(args: &'a Value, k: &str) -> Result<&'a str, ApiError> {
    str_arg(args, k).ok_or_else(|| ApiError::new(400, format!("missing string argument `{k}`")))
}

fn run_body(args: &Value, drop: &[&str]) -> Result<RunBody, ApiError> {
    let mut a = match args {
        Value::Object(m) => m.clone(),
        Value::Null => serde_json::Map::new(),
        _ => return Err(ApiError::new(400, "arguments must be an object")),
    };
    for k in drop {
        a.remove(*k);
    }
    serde_json::from_value(Value::Object(a)).map_err(|e| ApiError::new(400, format!("bad arguments: {e}")))
}

/// One `tools/call`: the tool's result, or `Err` for an unknown tool (a protocol error).
pub fn call(api: &Api, name: &str, args: &Value) -> Result<Value, String> {
    let r: Result<Value, ApiError> = match name {
        "run" => run_body(args, &[]).and_then(|b| api.run(&b)).map(|r| result_content(&r)),
        "exec" => required(args, "tx")
            .and_then(|tx| Ok((tx, run_body(args, &["tx"])?)))
            .and_then(|(tx, b)| api.exec(tx, &b))
            .map(|r| result_content(&r)),
        "begin" => api.begin(str_arg(args, "workspace"), str_arg(args, "name")).map(|tx| {
            json!({"content": [text(format!("txbox: began tx {tx}")), text(json!({"tx": tx}).to_string())], "isError": false})
        }),
        "diff" => required(args, "tx").and_then(|tx| api.diff(tx)).map(|v| {
            let n = |k: &str| v.get(k).and_then(Value::as_array).map_or(0, Vec::len);
            let line = format!("txbox: pending changes +{} ~{} -{}", n("added"), n("modified"), n("deleted"));
            json!({"content": [text(line), text(v.to_string())], "isError": false})
        }),
        "commit" => required(args, "tx").and_then(|tx| api.commit(tx)).map(|r| result_content(&r)),
        "rollback" => required(args, "tx")
            .and_then(|tx| {
                let to = match args.get("to") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(
                        v.as_u64()
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| ApiError::new(400, "`to` must be a step number"))?,
                    ),
                };
                api.rollback(tx, to)
            })
            .map(|r| result_content(&r)),
        "log" => {
            let n = args.get("n").and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
            api.log(str_arg(args, "workspace"), n).map(|v| {
                let count = v.as_array().map_or(0, Vec::len);
                json!({"content": [text(format!("txbox: {count} audit entries")), text(v.to_string())], "isError": false})
            })
        }
        other => return Err(format!("unknown tool `{other}`")),
    };
    Ok(r.unwrap_or_else(|e| tool_error(&e)))
}

const INSTRUCTIONS: &str = "txbox runs shell commands as transactions: a command that fails is rolled back completely, \
one that succeeds is committed, and irreversible commands are denied. Use `run` for single commands; use begin/exec/diff \
then commit or rollback to review multi-step work before it reaches the workspace.";

/// The rmcp handler: tools from [`tools`], calls through [`call`] on a blocking thread.
#[derive(Clone)]
pub(crate) struct Server {
    api: Arc<Api>,
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
        move || Ok(Server { api: api.clone() }),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// Serve MCP on stdin/stdout until the client closes stdin.
pub fn main(
    workspaces: &[PathBuf],
    state_dir: Option<PathBuf>,
    policy_file: Option<PathBuf>,
    allow_hosts: &[String],
) -> Result<i32> {
    let api = Arc::new(Api::new(workspaces, state_dir, policy_file)?.with_allow_hosts(allow_hosts)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all() // rmcp uses timers (request timeouts)
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let running = Server { api }.serve(rmcp::transport::stdio()).await.context("MCP initialization")?;
        running.waiting().await.context("MCP service")?;
        Ok::<i32, anyhow::Error>(0)
    })
}
