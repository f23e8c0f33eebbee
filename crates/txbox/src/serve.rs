//! `txbox serve`: the HTTP+JSON API of DESIGN §7 and MCP over streamable HTTP at `/mcp`, and
//! [`Api`], the operations they share with `txbox mcp`. Workspaces are fixed at start; every route
//! but `GET /v1/health` needs the bearer token. The engine is synchronous and forks sandboxes, so each call runs on a blocking thread
//! (the sandbox launcher re-executes `/proc/self/exe __stage2` in a multi-threaded process).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::StreamableHttpService;
use serde::Deserialize;
use serde_json::{json, Value};
use txbox::engine::{self, Command, EngineError, Io, Outcome, RunRequest, RunResult};
use txbox::session;
use txbox_policy::Policy;
use txbox_txn::{audit, StateDir, StateError};

/// An operation's failure, with the HTTP status that fits it.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        let status = match &e {
            EngineError::State(StateError::UnknownTx(_)) => 404,
            EngineError::Usage(_) | EngineError::Workspace { .. } => 400,
            _ => 500,
        };
        ApiError::new(status, e.to_string())
    }
}

/// The options of `run` and `exec` as JSON (DESIGN §3 run options).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunBody {
    pub command: String,
    #[serde(default)]
    pub workspace: Option<String>,
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub memory: Option<Size>,
    #[serde(default)]
    pub pids: Option<u64>,
    #[serde(default)]
    pub cpu: Option<u64>,
    #[serde(default)]
    pub max_output: Option<Size>,
    #[serde(default)]
    pub max_write: Option<Size>,
    /// `none` (default) or `host`.
    #[serde(default)]
    pub network: Option<String>,
    /// Hosts the command may reach through txbox's proxy (`--allow-host` items); within the
    /// server's own `--allow-host`, which is the default.
    #[serde(default)]
    pub allow_hosts: Option<Vec<String>>,
    #[serde(default)]
    pub validate: Option<String>,
    #[serde(default)]
    pub no_commit: bool,
    /// Keep a failed command's changes pending for review instead of rolling back.
    #[serde(default)]
    pub keep_on_failure: bool,
}

/// A size: a number of bytes or a string with a suffix (`512M`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn bytes(&self, what: &str) -> Result<u64, ApiError> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(s) => txbox::size::parse_size(s).map_err(|e| ApiError::new(400, format!("{what}: {e}"))),
        }
    }
}

impl RunBody {
    fn limits(&self, ceiling: &[txbox_netproxy::Spec]) -> Result<engine::Limits, ApiError> {
        let timeout = match self.timeout {
            Some(t) if !(t.is_finite() && t > 0.0) => {
                return Err(ApiError::new(400, "timeout must be a positive number of seconds"))
            }
            Some(t) => Some(Duration::from_secs_f64(t)),
            None => None,
        };
        let host_network = match self.network.as_deref() {
            None | Some("none") => false,
            Some("host") => true,
            Some(other) => return Err(ApiError::new(400, format!("network must be `none` or `host`, not `{other}`"))),
        };
        let size = |s: &Option<Size>, what| s.as_ref().map(|s| s.bytes(what)).transpose();
        Ok(engine::Limits {
            timeout,
            memory: size(&self.memory, "memory")?,
            pids: self.pids,
            cpu_seconds: self.cpu,
            max_output: size(&self.max_output, "max_output")?,
            max_write: size(&self.max_write, "max_write")?,
            host_network,
            allow_hosts: if host_network {
                Vec::new()
            } else {
                let base = txbox_txn::layout::base_dir().ok();
                txbox::network::narrow(ceiling, self.allow_hosts.as_deref(), base.as_deref())
                    .map_err(|e| ApiError::new(403, e))?
            },
        })
    }

    fn command(&self) -> Result<Command, ApiError> {
        if self.command.trim().is_empty() {
            return Err(ApiError::new(400, "command is empty"));
        }
        Ok(Command::Shell(self.command.clone()))
    }
}

/// What `serve` and `mcp` may touch: the workspaces named at start, their state, the policy.
#[derive(Debug, Clone)]
pub struct Api {
    workspaces: Vec<PathBuf>,
    state_dir: Option<PathBuf>,
    policy: Policy,
    policy_file: Option<PathBuf>,
    /// The operator's `--allow-host`: what requests may reach at most (and by default).
    allow_hosts: Vec<txbox_netproxy::Spec>,
}

impl Api {
    /// Canonicalize the workspaces (the current directory if none is given).
    pub fn new(workspaces: &[PathBuf], state_dir: Option<PathBuf>, policy_file: Option<PathBuf>) -> Result<Api> {
        let mut ws = Vec::new();
        if workspaces.is_empty() {
            let cwd = std::env::current_dir().context("reading the current directory")?;
            ws.push(engine::resolve_workspace(&cwd)?);
        }
        for w in workspaces {
            let p = engine::resolve_workspace(w)?;
            if !ws.contains(&p) {
                ws.push(p);
            }
        }
        let policy = match &policy_file {
            Some(f) => Policy::load(f)?,
            None => Policy::builtin(),
        };
        Ok(Api { workspaces: ws, state_dir, policy, policy_file, allow_hosts: Vec::new() })
    }

    /// The operator's network ceiling (`serve`/`mcp --allow-host`).
    pub fn with_allow_hosts(mut self, items: &[String]) -> Result<Api> {
        self.allow_hosts = txbox_netproxy::allow::parse_all(items)?;
        Ok(self)
    }

    pub fn workspaces(&self) -> &[PathBuf] {
        &self.workspaces
    }

    /// The workspace a request names (or the only one), if it was named at start.
    pub fn workspace(&self, requested: Option<&str>) -> Result<PathBuf, ApiError> {
        let Some(req) = requested.filter(|s| !s.is_empty()) else {
            return match self.workspaces.as_slice() {
                [only] => Ok(only.clone()),
                _ => Err(ApiError::new(400, "several workspaces are served: name one with \"workspace\"")),
            };
        };
        // Compare canonical paths; a path that does not resolve cannot be one of ours.
        let p = std::fs::canonicalize(req).ok();
        match p.filter(|p| self.workspaces.contains(p)) {
            Some(p) => Ok(p),
            None => Err(ApiError::new(403, format!("workspace {req} is not served here (served: {})", self.listed()))),
        }
    }

    fn listed(&self) -> String {
        self.workspaces.iter().map(|w| w.display().to_string()).collect::<Vec<_>>().join(", ")
    }

    fn state_of(&self, ws: &Path) -> Result<Option<StateDir>, StateError> {
        StateDir::existing_for_workspace(self.state_dir.as_deref(), ws)
    }

    /// The state directory holding transaction `tx` of one of our workspaces.
    fn locate(&self, tx: &str) -> Result<StateDir, ApiError> {
        let unknown = || ApiError::new(404, format!("unknown transaction id `{tx}`"));
        if !txbox_txn::state::valid_id(tx) {
            return Err(unknown());
        }
        for ws in &self.workspaces {
            let Ok(Some(state)) = self.state_of(ws) else { continue };
            if let Ok(meta) = state.read_meta(tx) {
                if self.workspaces.contains(&meta.workspace) {
                    return Ok(state);
                }
            }
        }
        Err(unknown())
    }

    pub fn run(&self, body: &RunBody) -> Result<RunResult, ApiError> {
        let workspace = self.workspace(body.workspace.as_deref())?;
        let req = RunRequest {
            state_dir: self.state_dir.clone(),
            cwd: workspace.clone(),
            workspace,
            command: body.command()?,
            policy: self.policy.clone(),
            policy_file: self.policy_file.clone(),
            io: Io::Api,
            limits: body.limits(&self.allow_hosts)?,
            validate: body.validate.clone(),
            no_commit: body.no_commit,
            keep_on_failure: body.keep_on_failure,
        };
        Ok(engine::run(&req)?)
    }

    pub fn begin(&self, workspace: Option<&str>, name: Option<&str>) -> Result<String, ApiError> {
        let ws = self.workspace(workspace)?;
        Ok(session::begin(&ws, self.state_dir.as_deref(), name)?)
    }

    pub fn exec(&self, tx: &str, body: &RunBody) -> Result<RunResult, ApiError> {
        if body.validate.is_some() || body.no_commit || body.workspace.is_some() {
            return Err(ApiError::new(400, "exec takes command and limits only (no workspace, validate or no_commit)"));
        }
        let state = self.locate(tx)?;
        let meta = state.read_meta(tx).map_err(|e| ApiError::new(404, e.to_string()))?;
        let req = session::ExecRequest {
            tx: tx.to_string(),
            cwd: meta.workspace,
            command: body.command()?,
            policy: self.policy.clone(),
            policy_file: self.policy_file.clone(),
            io: Io::Api,
            limits: body.limits(&self.allow_hosts)?,
            keep_on_failure: body.keep_on_failure,
        };
        Ok(session::exec(&state, &req)?)
    }

    pub fn diff(&self, tx: &str) -> Result<Value, ApiError> {
        let state = self.locate(tx)?;
        Ok(session::with_diff(&state, tx, |_, cs, _| {
            let c = engine::Changes::of(cs);
            Ok(json!({"tx": tx, "added": c.added, "modified": c.modified, "deleted": c.deleted}))
        })?)
    }

    pub fn commit(&self, tx: &str) -> Result<RunResult, ApiError> {
        let state = self.locate(tx)?;
        Ok(session::commit(&state, tx)?)
    }

    pub fn rollback(&self, tx: &str, to: Option<u32>) -> Result<RunResult, ApiError> {
        let state = self.locate(tx)?;
        Ok(session::rollback(&state, tx, to)?)
    }

    /// The audit log of one workspace (the only one if none is named), the last `n` entries.
    pub fn log(&self, workspace: Option<&str>, n: Option<usize>) -> Result<Value, ApiError> {
        let ws = self.workspace(workspace)?;
        let state = self.state_of(&ws).map_err(|e| ApiError::new(500, e.to_string()))?;
        let mut entries = match state {
            Some(state) => audit::read_all(&state.audit_path()).map_err(|e| ApiError::new(500, e.to_string()))?,
            None => Vec::new(),
        };
        // One state directory serves many workspaces: show this one's entries only.
        let name = ws.to_string_lossy();
        entries.retain(|e| e.workspace == name);
        if let Some(n) = n {
            let skip = entries.len().saturating_sub(n);
            entries.drain(..skip);
        }
        serde_json::to_value(&entries).map_err(|e| ApiError::new(500, e.to_string()))
    }
}

/// The HTTP status for a result: a refused commit is a conflict.
fn result_status(r: &RunResult) -> StatusCode {
    match r.outcome {
        Outcome::Conflict => StatusCode::CONFLICT,
        _ => StatusCode::OK,
    }
}

struct AppState {
    api: Arc<Api>,
    token: Vec<u8>,
    mcp: StreamableHttpService<crate::mcp::Server, NeverSessionManager>,
}

type Shared = Arc<AppState>;

fn error(status: u16, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Json(json!({ "error": message }))).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.status, &self.message)
    }
}

/// Compare in time independent of where the inputs differ (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorize(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), &st.token) => Ok(()),
        _ => Err(ApiError::new(401, "missing or wrong bearer token (Authorization: Bearer TOKEN)")),
    }
}

fn parse<T: serde::de::DeserializeOwned + Default>(body: &Bytes, required: bool) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) && !required {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| ApiError::new(400, format!("bad JSON body: {e}")))
}

/// Run a blocking engine call off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::new(500, format!("worker failed: {e}")))?
}

fn result_response(r: Result<RunResult, ApiError>) -> Response {
    match r {
        Ok(r) => {
            let status = result_status(&r);
            // render::json keeps DESIGN §3's field order.
            let headers = [(axum::http::header::CONTENT_TYPE, "application/json")];
            (status, headers, txbox::render::json(&r)).into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn health(State(st): State<Shared>) -> Response {
    Json(json!({"ok": true, "version": env!("CARGO_PKG_VERSION"), "workspaces": st.api.workspaces().len()}))
        .into_response()
}

async fn run(State(st): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    let req: RunBody = match parse(&body, true) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let st = st.clone();
    result_response(blocking(move || st.api.run(&req)).await)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BeginBody {
    #[serde(default)]
    workspace: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

async fn begin(State(st): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    let req: BeginBody = match parse(&body, false) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let st = st.clone();
    match blocking(move || st.api.begin(req.workspace.as_deref(), req.name.as_deref())).await {
        Ok(tx) => (StatusCode::CREATED, Json(json!({ "tx": tx }))).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn exec(State(st): State<Shared>, UrlPath(tx): UrlPath<String>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    let req: RunBody = match parse(&body, true) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let st = st.clone();
    result_response(blocking(move || st.api.exec(&tx, &req)).await)
}

async fn diff(State(st): State<Shared>, UrlPath(tx): UrlPath<String>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    let st = st.clone();
    match blocking(move || st.api.diff(&tx)).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn commit(State(st): State<Shared>, UrlPath(tx): UrlPath<String>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    let st = st.clone();
    result_response(blocking(move || st.api.commit(&tx)).await)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    #[serde(default)]
    to: Option<u32>,
}

async fn rollback(State(st): State<Shared>, UrlPath(tx): UrlPath<String>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    let req: RollbackBody = match parse(&body, false) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let st = st.clone();
    result_response(blocking(move || st.api.rollback(&tx, req.to)).await)
}

/// Decode `%XX` and `+` in a query component.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or(())
                {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn log(State(st): State<Shared>, headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    let (mut ws, mut n) = (None, None);
    for pair in q.as_deref().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "workspace" => ws = Some(unescape(v)),
            "n" => match v.parse::<usize>() {
                Ok(v) => n = Some(v),
                Err(_) => return error(400, "n must be a number"),
            },
            _ => return error(400, &format!("unknown query parameter `{k}` (workspace, n)")),
        }
    }
    let st = st.clone();
    match blocking(move || st.api.log(ws.as_deref(), n)).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// MCP over streamable HTTP (`POST /mcp`, JSON-RPC), the tools of `txbox mcp`.
async fn mcp(State(st): State<Shared>, req: Request) -> Response {
    if let Err(e) = authorize(&st, req.headers()) {
        return e.into_response();
    }
    st.mcp.handle(req).await.map(axum::body::Body::new)
}

async fn not_found() -> Response {
    error(404, "no such route (see DESIGN §7: /v1/health, /v1/run, /v1/tx, /v1/log; MCP at /mcp)")
}

/// The token: `--token-file` (first line) or `$TXBOX_TOKEN`; refuse to start without one.
fn load_token(file: Option<&Path>) -> Result<Vec<u8>> {
    let token = match file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading token file {}", f.display()))?
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string(),
        None => std::env::var("TXBOX_TOKEN").unwrap_or_default().trim().to_string(),
    };
    if token.is_empty() {
        bail!("no bearer token: give --token-file FILE or set TXBOX_TOKEN (the server refuses to run open)");
    }
    Ok(token.into_bytes())
}

pub fn router(api: Api, token: Vec<u8>) -> Router {
    let api = Arc::new(api);
    let st: Shared = Arc::new(AppState { mcp: crate::mcp::http_service(api.clone()), api, token });
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/run", post(run))
        .route("/v1/tx", post(begin))
        .route("/v1/tx/{id}/exec", post(exec))
        .route("/v1/tx/{id}/diff", get(diff))
        .route("/v1/tx/{id}/commit", post(commit))
        .route("/v1/tx/{id}/rollback", post(rollback))
        .route("/v1/log", get(log))
        .route("/mcp", any(mcp))
        .fallback(not_found)
        .with_state(st)
}

/// `txbox serve`: bind, print the address on stderr, serve until killed.
pub fn main(
    listen: &str,
    workspaces: &[PathBuf],
    state_dir: Option<PathBuf>,
    token_file: Option<&Path>,
    policy_file: Option<PathBuf>,
    allow_hosts: &[String],
) -> Result<i32> {
    let token = load_token(token_file)?;
    let api = Api::new(workspaces, state_dir, policy_file)?.with_allow_hosts(allow_hosts)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all() // rmcp uses timers (request timeouts)
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr()?;
        eprintln!("txbox: serving {} on http://{addr} (HTTP API at /v1, MCP at /mcp)", api.listed());
        axum::serve(listener, router(api, token)).await.context("serving HTTP")?;
        Ok::<i32, anyhow::Error>(0)
    })
}
