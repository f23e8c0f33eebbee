//! `txbox serve`: the HTTP+JSON API of docs/DESIGN.md §8 and MCP over streamable HTTP at `/mcp`, over
//! [`txbox::api::Api`] (shared with `txbox mcp`). Workspaces and ceilings are fixed at start.
//!
//! Every route but `GET /v1/health` sits behind one authentication layer on the router (a
//! route cannot be added without it), which marks the request as an agent's
//! ([`Principal::Agent`]). Connections are bounded: at most `--max-connections` at once (more
//! are closed on accept), and a client has `--header-timeout` seconds to send a request's headers
//! and again its body; a kept-alive connection idle that long is closed. So slow or half-sent
//! requests cannot hold descriptors until the server stops answering.
//!
//! The engine is synchronous and forks sandboxes, so each call runs on a blocking thread (the
//! sandbox launcher re-executes `/proc/self/exe __stage2` in a multi-threaded process).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::StreamableHttpService;
use serde_json::{json, Value};
use txbox::api::{
    self, Api, ApiError, BeginBody, Ceiling, ErrorKind, ListArgs, LogArgs, Principal, RollbackBody, RunBody, StepBody,
    UndoBody, JUDGE_STACK,
};
use txbox::result::{Outcome, RunResult};

/// What the operator chose for a server: workspaces, state, policy, ceilings.
pub struct Served {
    pub workspaces: Vec<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub policy_file: Option<PathBuf>,
    pub ceiling: Ceiling,
}

impl Served {
    pub fn api(self) -> Result<Api> {
        Ok(Api::new(&self.workspaces, self.state_dir, self.policy_file, self.ceiling)?)
    }
}

/// Bounds on connections (see the module's documentation).
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max: usize,
    pub header_timeout: Duration,
}

/// The largest request body accepted.
const MAX_BODY: usize = 2 << 20;

struct AppState {
    api: Arc<Api>,
    mcp: StreamableHttpService<crate::mcp::Server, NeverSessionManager>,
    /// How long a client may take to send a request's body.
    body_timeout: Duration,
}

type Shared = Arc<AppState>;

fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Json(e.to_json())).into_response()
}

/// Every answer of the router in the one error shape: an error status whose body is not JSON
/// (what axum answers by itself, a wrong method (405) or a path that does not decode (400), and
/// rmcp's refusals at `/mcp`: 406, 415, 405) gets `{"error": {"kind", "message"}}`, the status
/// kept and the text as the message. Errors made here are JSON already and pass unchanged.
async fn json_errors(req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    let status = res.status();
    let is_json = res
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let (parts, body) = res.into_parts();
    // The bodies rewritten are axum's and rmcp's short texts.
    let text = axum::body::to_bytes(body, 64 << 10).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let kind = match status.as_u16() {
        401 => ErrorKind::Unauthorized,
        403 => ErrorKind::Forbidden,
        404 => ErrorKind::NotFound,
        409 => ErrorKind::Conflict,
        s if s >= 500 => ErrorKind::Internal,
        _ => ErrorKind::Usage,
    };
    let message = match text.trim() {
        "" => status.canonical_reason().unwrap_or("error").to_string(),
        t => t.to_string(),
    };
    let mut out = error_response(&ApiError::new(kind, message));
    *out.status_mut() = status;
    for name in [axum::http::header::ALLOW, axum::http::header::WWW_AUTHENTICATE] {
        if let Some(v) = parts.headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}

/// Compare in time independent of where the inputs differ (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The authentication layer: a request without the bearer token is answered 401 before any
/// handler sees it; one with it carries [`Principal::Agent`].
async fn authenticate(State(token): State<Arc<Vec<u8>>>, mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), &token) => {
            req.extensions_mut().insert(Principal::Agent);
            next.run(req).await
        }
        _ => error_response(&ApiError::new(
            ErrorKind::Unauthorized,
            "missing or wrong bearer token (Authorization: Bearer TOKEN)",
        )),
    }
}

/// A request's whole body, within the size limit and the time limit.
async fn read_body(st: &AppState, body: Body) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(st.body_timeout, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => Err(ApiError::usage(format!("reading the request body (at most {MAX_BODY} bytes): {e}"))),
        Err(_) => {
            Err(ApiError::usage(format!("the request body did not arrive within {} s", st.body_timeout.as_secs_f64())))
        }
    }
}

async fn body_of<T: serde::de::DeserializeOwned + schemars::JsonSchema + 'static>(
    st: &AppState,
    body: Body,
) -> Result<T, ApiError> {
    api::parse_bytes(&read_body(st, body).await?)
}

/// Run a blocking engine call off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
}

/// The HTTP status for a result: a refused commit is a conflict.
fn result_status(r: &RunResult) -> StatusCode {
    match r.outcome {
        Outcome::Conflict => StatusCode::CONFLICT,
        _ => StatusCode::OK,
    }
}

fn result_response(r: Result<RunResult, ApiError>) -> Response {
    match r {
        Ok(r) => {
            // render::json keeps docs/DESIGN.md §4's field order.
            let headers = [(axum::http::header::CONTENT_TYPE, "application/json")];
            (result_status(&r), headers, txbox::render::json(&r)).into_response()
        }
        Err(e) => error_response(&e),
    }
}

fn value_response(r: Result<Value, ApiError>, status: StatusCode) -> Response {
    match r {
        Ok(v) => (status, Json(v)).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn health(State(st): State<Shared>) -> Response {
    Json(json!({"ok": true, "version": env!("CARGO_PKG_VERSION"), "workspaces": st.api.workspaces().len()}))
        .into_response()
}

async fn run(State(st): State<Shared>, body: Body) -> Response {
    let req: RunBody = match body_of(&st, body).await {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let st = st.clone();
    result_response(blocking(move || st.api.run(&req)).await)
}

async fn begin(State(st): State<Shared>, body: Body) -> Response {
    let req: BeginBody = match body_of(&st, body).await {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let st = st.clone();
    let r = blocking(move || st.api.begin(&req)).await.map(|tx| json!({ "tx": tx }));
    value_response(r, StatusCode::CREATED)
}

/// `GET /v1/tx[?workspace=DIR]`: the open transactions.
async fn list(State(st): State<Shared>, RawQuery(q): RawQuery) -> Response {
    let args: ListArgs = match query(q.as_deref()) {
        Ok(a) => a,
        Err(e) => return error_response(&e),
    };
    let st = st.clone();
    let r = blocking(move || {
        let txs = st.api.list(args.workspace.as_deref())?;
        serde_json::to_value(txs).map_err(|e| ApiError::internal(e.to_string()))
    })
    .await;
    value_response(r, StatusCode::OK)
}

async fn exec(State(st): State<Shared>, UrlPath(tx): UrlPath<String>, body: Body) -> Response {
    let req: StepBody = match body_of(&st, body).await {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let st = st.clone();
    result_response(blocking(move || st.api.exec(&tx, &req)).await)
}

async fn diff(State(st): State<Shared>, UrlPath(tx): UrlPath<String>) -> Response {
    let st = st.clone();
    value_response(blocking(move || st.api.diff(&tx, false)).await, StatusCode::OK)
}

async fn commit(State(st): State<Shared>, UrlPath(tx): UrlPath<String>) -> Response {
    let st = st.clone();
    result_response(blocking(move || st.api.commit(&tx)).await)
}

async fn rollback(State(st): State<Shared>, UrlPath(tx): UrlPath<String>, body: Body) -> Response {
    let req: RollbackBody = match body_of(&st, body).await {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let st = st.clone();
    result_response(blocking(move || st.api.rollback(&tx, req.to)).await)
}

async fn undo(State(st): State<Shared>, UrlPath(tx): UrlPath<String>, body: Body) -> Response {
    let req: UndoBody = match body_of(&st, body).await {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let st = st.clone();
    result_response(blocking(move || st.api.undo(Some(&tx), req.to, None)).await)
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

/// A query string as a request type: each `k=v` a field (numbers where they parse as one),
/// checked like a JSON body.
fn query<T: serde::de::DeserializeOwned + schemars::JsonSchema + 'static>(q: Option<&str>) -> Result<T, ApiError> {
    let mut m = serde_json::Map::new();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = unescape(v);
        let value = match v.parse::<i64>() {
            Ok(n) if k == "n" => json!(n),
            _ => Value::String(v),
        };
        m.insert(unescape(k), value);
    }
    api::parse(Value::Object(m))
}

async fn log(State(st): State<Shared>, RawQuery(q): RawQuery) -> Response {
    let args: LogArgs = match query(q.as_deref()) {
        Ok(a) => a,
        Err(e) => return error_response(&e),
    };
    let st = st.clone();
    value_response(blocking(move || st.api.log(args.workspace.as_deref(), args.n)).await, StatusCode::OK)
}

/// MCP over streamable HTTP (`POST /mcp`, JSON-RPC), the tools of `txbox mcp`. The body is read
/// here first, under the same size and time limits as every other route.
async fn mcp(State(st): State<Shared>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match read_body(&st, body).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    st.mcp.handle(Request::from_parts(parts, Body::from(bytes))).await.map(Body::new)
}

async fn not_found() -> Response {
    error_response(&ApiError::not_found(
        "no such route (GET /v1/health, POST /v1/run, GET|POST /v1/tx, /v1/tx/ID/{exec,diff,commit,rollback,undo}, GET /v1/log; MCP at /mcp)",
    ))
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

/// The routes: `/v1/health` open, everything else (the fallback included) behind the token.
pub fn router(api: Api, token: Vec<u8>, body_timeout: Duration) -> Router {
    let api = Arc::new(api);
    let st: Shared = Arc::new(AppState { mcp: crate::mcp::http_service(api.clone()), api, body_timeout });
    let guarded = Router::new()
        .route("/v1/run", post(run))
        .route("/v1/tx", post(begin).get(list))
        .route("/v1/tx/{id}/exec", post(exec))
        .route("/v1/tx/{id}/diff", get(diff))
        .route("/v1/tx/{id}/commit", post(commit))
        .route("/v1/tx/{id}/rollback", post(rollback))
        .route("/v1/tx/{id}/undo", post(undo))
        .route("/v1/log", get(log))
        .route("/mcp", any(mcp))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(Arc::new(token), authenticate));
    Router::new().route("/v1/health", get(health)).merge(guarded).layer(middleware::from_fn(json_errors)).with_state(st)
}

/// Accept connections until the process is killed, at most `limits.max` at once.
async fn accept_loop(listener: tokio::net::TcpListener, app: Router, limits: ConnLimits) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors or a connection reset before accept: let others finish.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
            let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
        });
    }
}

/// `txbox serve`: bind, print the address on stderr, serve until killed.
pub fn main(listen: &str, mut served: Served, token_file: Option<&Path>, limits: ConnLimits) -> Result<i32> {
    let token = load_token(token_file)?;
    // A command must not read the token it could call this server with (`--network host`).
    if let Some(f) = token_file {
        let real = std::fs::canonicalize(f).with_context(|| format!("resolving token file {}", f.display()))?;
        served.ceiling.hide.push(real);
    }
    let api = served.api()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Requests are judged on these threads: room for the deepest command the policy parses
        // (txbox_policy's nesting bound; 2 MiB, the default, is not enough in a debug build).
        .thread_stack_size(JUDGE_STACK)
        .enable_all() // rmcp uses timers (request timeouts)
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr()?;
        eprintln!("txbox: serving {} on http://{addr} (HTTP API at /v1, MCP at /mcp)", api.listed());
        accept_loop(listener, router(api, token, limits.header_timeout), limits).await;
        Ok::<i32, anyhow::Error>(0)
    })
}
