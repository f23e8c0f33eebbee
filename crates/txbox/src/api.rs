//! What the agent-facing servers share (`txbox serve`'s HTTP routes and `txbox mcp`'s tools,
//! on stdio and over HTTP): the workspaces and the ceilings an operator set when starting the
//! server ([`Api`], [`Ceiling`]), the requests an agent may send ([`RunBody`] and friends,
//! validated when parsed, their MCP schemas generated from the same definitions), and errors in
//! one shape for every front end ([`ApiError`]: `{"error": {"kind": ..., "message": ...}}`).
//!
//! The agent on the other side is not trusted: a request names only what it wants, never a
//! path outside the served workspaces, never more than the operator's ceiling, never an
//! operator's action (approving held work, lifting a policy rule): see [`Principal`].
//!
//! Owns: request types, ceilings, the error shape. May not touch: sockets and protocols (the
//! binary's `serve.rs` and `mcp.rs`), transactions (the engine and sessions do that).

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use txbox_policy::Policy;
use txbox_txn::{audit, StateDir, StateError};

use crate::engine;
use crate::options::{Exceeds, Isolation, LimitArgs, RangeError};
use crate::request::{self, Command, EngineError, Io, Limits, RunRequest};
use crate::result::{Changes, RunResult};
use crate::session;

/// What kind of failure an error is; decides the HTTP status and the CLI exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Malformed or out-of-range input (HTTP 400, exit 2).
    Usage,
    /// No or a wrong credential (HTTP 401).
    Unauthorized,
    /// Valid, but beyond what the operator allows (HTTP 403).
    Forbidden,
    /// An unknown transaction or route (HTTP 404).
    NotFound,
    /// Refused because of concurrent work (HTTP 409, exit 3).
    Conflict,
    /// txbox itself failed (HTTP 500, exit 125).
    Internal,
}

impl ErrorKind {
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::Usage => 400,
            ErrorKind::Unauthorized => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::Conflict => 409,
            ErrorKind::Internal => 500,
        }
    }

    /// The CLI's exit status (docs/DESIGN.md §3): usage errors 2, conflicts 3, anything else 125.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::Usage => 2,
            ErrorKind::Conflict => 3,
            _ => 125,
        }
    }
}

/// An operation's failure, before any result exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError { kind, message: message.into() }
    }

    pub fn usage(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Usage, message)
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Forbidden, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::NotFound, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Internal, message)
    }

    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// The one error shape of every front end: `{"error": {"kind": ..., "message": ...}}`.
    pub fn to_json(&self) -> Value {
        json!({"error": {"kind": self.kind, "message": self.message}})
    }
}

/// The kind of an engine failure.
pub fn engine_kind(e: &EngineError) -> ErrorKind {
    match e {
        EngineError::State(StateError::UnknownTx(_)) => ErrorKind::NotFound,
        EngineError::Usage(_) | EngineError::Workspace { .. } => ErrorKind::Usage,
        // The caller's input, checked where it is stored.
        EngineError::State(StateError::BadName(_)) => ErrorKind::Usage,
        _ => ErrorKind::Internal,
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        ApiError::new(engine_kind(&e), e.to_string())
    }
}

impl From<Exceeds> for ApiError {
    fn from(e: Exceeds) -> ApiError {
        ApiError::forbidden(e.to_string())
    }
}

impl From<RangeError> for ApiError {
    fn from(e: RangeError) -> ApiError {
        ApiError::usage(e.0)
    }
}

/// Who is asking. Every credential a server accepts (the bearer token of `serve`, an MCP
/// session) is an agent's. Operator actions (approving a held transaction, lifting a policy
/// rule for one command) are refused to agents in [`Principal::require_operator`]; today the
/// operator acts only through the CLI, in a shell of their own. A server that one day accepts
/// an operator credential must make it a separate secret (another token file), never
/// derivable from or interchangeable with the agent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Principal {
    Agent,
    Operator,
}

impl Principal {
    pub fn require_operator(self, action: &str) -> Result<(), ApiError> {
        match self {
            Principal::Operator => Ok(()),
            Principal::Agent => Err(ApiError::forbidden(format!(
                "{action} is the operator's, from the command line; an agent's credential cannot do it"
            ))),
        }
    }
}

/// What the operator allows requests, set when starting `serve` or `mcp` (flags over the
/// configuration file). A request may only narrow it.
#[derive(Debug, Clone, Default)]
pub struct Ceiling {
    /// The most a request may ask for, and what it gets when it asks for nothing. Network
    /// `host` only if set here.
    pub limits: LimitArgs,
    /// The weakest isolation a request may ask for (`strict`: every transaction is strict).
    pub isolation: Isolation,
    /// Variables passed to commands although they look like credentials (never a request's).
    pub pass_env: Vec<String>,
    /// Policy rules a request may lift for one command. Empty, and no request field asks yet:
    /// lifting a rule is an operator's decision ([`Ceiling::may_lift`] is where a request's
    /// ask will be checked).
    pub liftable: Vec<String>,
    /// Kept directories (the configuration's, else the defaults); a request cannot change them.
    pub keep: txbox_txn::keep::KeepRules,
    /// The operator's secrets hidden from every command (`serve`'s token file: with the host's
    /// network a command that read it could call the server as the agent).
    pub hide: Vec<PathBuf>,
}

impl Ceiling {
    /// A request's limits under this ceiling.
    /// An allowlist asked for narrows the operator's by host: a preset is compared by the hosts
    /// it stands for (from the caller's package managers, `crate::network`).
    pub fn limits(&self, asked: &LimitArgs) -> Result<Limits, ApiError> {
        let base = txbox_txn::layout::base_dir().ok();
        let expand = |p| Some(crate::network::preset_rules(p, base.as_deref()));
        let mut limits = asked.within_expanding(&self.limits, &expand)?.to_limits();
        limits.hide.clone_from(&self.hide);
        Ok(limits)
    }

    /// A request's isolation: at least the operator's.
    pub fn isolation(&self, asked: Option<Isolation>) -> Result<Isolation, ApiError> {
        match (asked, self.isolation) {
            (None, floor) => Ok(floor),
            (Some(Isolation::ReadCommitted), Isolation::Strict) => {
                Err(ApiError::forbidden("isolation read-committed is weaker than the operator's strict isolation"))
            }
            (Some(a), _) => Ok(a),
        }
    }

    /// Whether a request may lift policy rule `rule` for one command.
    pub fn may_lift(&self, rule: &str) -> Result<(), ApiError> {
        if self.liftable.iter().any(|r| r == rule) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!("policy rule {rule} cannot be lifted by a request")))
        }
    }
}

/// Run one shell command as one transaction (`POST /v1/run`, the MCP tool `run`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct RunBody {
    /// The shell command (bash -c semantics), e.g. "make test" or "sed -i s/a/b/ f.txt".
    pub command: String,
    /// Workspace directory; may be omitted when the server serves only one.
    #[serde(default)]
    pub workspace: Option<String>,
    /// A check run after the command in the same transaction (e.g. "cargo test"); the changes are committed only if it also exits 0.
    #[serde(default)]
    pub validate: Option<String>,
    /// Leave the transaction pending for review instead of committing; the result's `tx` is its id.
    #[serde(default)]
    pub no_commit: bool,
    /// Keep a failed command's changes pending for review instead of rolling them back.
    #[serde(default)]
    pub keep_on_failure: bool,
    /// `read-committed` (default): reads see commits made meanwhile, the commit is refused only if a path it changes was changed. `strict`: the commit is refused (outcome conflict) if any other transaction committed to the workspace meanwhile.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    #[serde(flatten)]
    pub limits: LimitArgs,
}

/// One step of an open transaction (`POST /v1/tx/{id}/exec`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct StepBody {
    /// The shell command for this step.
    pub command: String,
    /// Keep a failed step's changes instead of undoing the step.
    #[serde(default)]
    pub keep_on_failure: bool,
    #[serde(flatten)]
    pub limits: LimitArgs,
}

/// The MCP tool `exec`: a step, and the transaction it belongs to.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct ExecArgs {
    /// Transaction id (16 hex digits) returned by begin or by run with no_commit.
    pub tx: String,
    #[serde(flatten)]
    pub step: StepBody,
}

/// Open a transaction (`POST /v1/tx`, the MCP tool `begin`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginBody {
    /// Workspace directory; may be omitted when the server serves only one.
    #[serde(default)]
    pub workspace: Option<String>,
    /// A label for the transaction.
    #[serde(default)]
    pub name: Option<String>,
    /// `read-committed` (default) or `strict`: with strict, the commit is refused if any other transaction committed to the workspace after begin.
    #[serde(default)]
    pub isolation: Option<Isolation>,
}

/// A transaction by id (the MCP tools `diff` and `commit`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TxArgs {
    /// Transaction id (16 hex digits) returned by begin or by run with no_commit.
    pub tx: String,
}

/// Roll back (`POST /v1/tx/{id}/rollback`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    /// Keep steps 1..=to and undo the later ones; without it the whole transaction is discarded.
    #[serde(default)]
    pub to: Option<u32>,
}

/// The MCP tool `rollback`: the body, and the transaction.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackArgs {
    /// Transaction id (16 hex digits) returned by begin or by run with no_commit.
    pub tx: String,
    /// Keep steps 1..=to and undo the later ones; without it the whole transaction is discarded.
    #[serde(default)]
    pub to: Option<u32>,
}

/// Undo (`POST /v1/tx/{id}/undo`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UndoBody {
    /// Undo every commit after the transaction (the workspace returns to the state right after
    /// it), not the transaction itself.
    #[serde(default)]
    pub to: bool,
}

/// The MCP tool `undo`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UndoArgs {
    /// Workspace directory; may be omitted when the server serves only one (or `tx` is given).
    #[serde(default)]
    pub workspace: Option<String>,
    /// Transaction id to undo (16 hex digits, from a result's `tx` or from `log`); default: the
    /// workspace's last commit.
    #[serde(default)]
    pub tx: Option<String>,
    /// Undo every commit after `tx` instead of `tx` itself.
    #[serde(default)]
    pub to: bool,
}

/// The audit log (`GET /v1/log?workspace=…&n=…`, the MCP tool `log`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogArgs {
    /// Workspace directory; may be omitted when the server serves only one.
    #[serde(default)]
    pub workspace: Option<String>,
    /// Only the last n entries.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub n: Option<usize>,
}

/// Open transactions (`GET /v1/tx`, the MCP tool `list`).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only this workspace's; all served workspaces' when omitted.
    #[serde(default)]
    pub workspace: Option<String>,
}

/// The JSON schema of a request type, as an MCP tool's `inputSchema`: generated from the type,
/// properties inlined, no others allowed.
pub fn schema_of<T: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| {
            s.meta_schema = None;
            s.inline_subschemas = true;
        })
        .for_deserialize()
        .into_generator();
    let mut v = generator.into_root_schema_for::<T>().to_value();
    if let Value::Object(m) = &mut v {
        m.remove("title");
        m.remove("description");
        m.insert("additionalProperties".into(), Value::Bool(false));
        let props = m.entry("properties").or_insert_with(|| json!({}));
        if let Value::Object(props) = props {
            props.values_mut().for_each(without_null);
        }
        m.entry("required").or_insert_with(|| json!([]));
    }
    v
}

/// Optional fields are simply not required: `null` is not offered to the model as a value.
fn without_null(prop: &mut Value) {
    let Value::Object(p) = prop else { return };
    if p.get("default") == Some(&Value::Null) {
        p.remove("default");
    }
    for key in ["type", "enum"] {
        if let Some(Value::Array(items)) = p.get_mut(key) {
            items.retain(|t| !t.is_null() && t != "null");
            if key == "type" && items.len() == 1 {
                let only = items.remove(0);
                p.insert(key.into(), only);
            }
        }
    }
}

/// The property names a request type accepts (from its schema, so never out of step with it).
/// Generated once per type and process: every request is parsed against them, and generating
/// a schema costs more than the rest of parsing.
fn known_fields<T: JsonSchema + 'static>() -> std::sync::Arc<[String]> {
    type Known = std::collections::HashMap<std::any::TypeId, std::sync::Arc<[String]>>;
    static KNOWN: std::sync::OnceLock<std::sync::Mutex<Known>> = std::sync::OnceLock::new();
    let generate = || -> std::sync::Arc<[String]> {
        schema_of::<T>()
            .get("properties")
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let mut known = KNOWN.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    known.entry(std::any::TypeId::of::<T>()).or_insert_with(generate).clone()
}

/// Parse a request from JSON: an object whose fields are all known (a misspelt option is an
/// error, never silently ignored) and of the right types and ranges.
pub fn parse<T: DeserializeOwned + JsonSchema + 'static>(v: Value) -> Result<T, ApiError> {
    let v = match v {
        Value::Null => Value::Object(serde_json::Map::new()),
        Value::Object(m) => Value::Object(m),
        other => return Err(ApiError::usage(format!("expected a JSON object, not {}", kind_of(&other)))),
    };
    let known = known_fields::<T>();
    if let Some(m) = v.as_object() {
        if let Some(k) = m.keys().find(|k| !known.contains(k)) {
            return Err(ApiError::usage(format!("unknown field `{k}` (accepted: {})", known.join(", "))));
        }
    }
    serde_json::from_value(v).map_err(|e| ApiError::usage(format!("bad request: {e}")))
}

/// [`parse`] from raw bytes (an HTTP body); empty means `{}`.
pub fn parse_bytes<T: DeserializeOwned + JsonSchema + 'static>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return parse(Value::Null);
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::usage(format!("bad JSON body: {e}")))?;
    parse(v)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The stack of a server's threads that run requests (the policy judges a command on the
/// calling thread; the main thread of the CLI has 8 MiB).
pub const JUDGE_STACK: usize = 16 << 20;

/// How much of each output stream a server returns by default (head and tail kept); the
/// command is not killed for more (`max_output` is the limit that kills).
pub const RETURNED_OUTPUT: usize = 64 << 10;

/// Keep the first and last `cap / 2` bytes of `s` with a marker between them saying how much
/// was left out. True if anything was.
pub fn cap_text(s: &mut String, cap: usize) -> bool {
    if s.len() <= cap {
        return false;
    }
    let half = cap / 2;
    let mut head_end = half;
    while !s.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = s.len() - half;
    while !s.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let omitted = tail_start - head_end;
    let marker = format!("\n[… txbox: {omitted} bytes omitted; run with max_output to stop such a command …]\n");
    let tail = s.split_off(tail_start);
    s.truncate(head_end);
    s.push_str(&marker);
    s.push_str(&tail);
    true
}

/// A result as a server returns it: output capped at [`RETURNED_OUTPUT`] per stream.
pub fn capped(mut r: RunResult) -> RunResult {
    r.stdout_truncated |= cap_text(&mut r.stdout, RETURNED_OUTPUT);
    r.stderr_truncated |= cap_text(&mut r.stderr, RETURNED_OUTPUT);
    r
}

/// Audit entries as shown: the command line with secrets redacted (entries written before
/// redaction existed included).
pub fn shown_entries(mut entries: Vec<audit::Entry>) -> Vec<audit::Entry> {
    for e in &mut entries {
        if let std::borrow::Cow::Owned(r) = crate::redact::redact(&e.command) {
            e.command = r;
        }
    }
    entries
}

/// Served workspaces must be disjoint: an agent's commit in one holding another could replace
/// the inner one (or a directory above it) with a link to anywhere, and the next request for
/// it, or a transaction already open in it, would run and commit there.
fn refuse_nested(ws: &[PathBuf]) -> Result<(), ApiError> {
    for outer in ws {
        if let Some(inner) = ws.iter().find(|w| *w != outer && w.starts_with(outer)) {
            return Err(ApiError::usage(format!(
                "workspace {} is inside workspace {}: an agent could replace it with a link to another \
                 directory by a commit in the outer one; serve only one of them",
                inner.display(),
                outer.display()
            )));
        }
    }
    Ok(())
}

/// What `serve` and `mcp` may touch: the workspaces named at start, their state, the policy,
/// and the operator's ceiling.
#[derive(Debug, Clone)]
pub struct Api {
    workspaces: Vec<PathBuf>,
    state_dir: Option<PathBuf>,
    policy: Policy,
    policy_file: Option<PathBuf>,
    ceiling: Ceiling,
}

impl Api {
    /// Canonicalize the workspaces (the current directory if none is given) and load the policy.
    pub fn new(
        workspaces: &[PathBuf],
        state_dir: Option<PathBuf>,
        policy_file: Option<PathBuf>,
        ceiling: Ceiling,
    ) -> Result<Api, ApiError> {
        let mut ws = Vec::new();
        if workspaces.is_empty() {
            let cwd = std::env::current_dir()
                .map_err(|e| ApiError::internal(format!("reading the current directory: {e}")))?;
            ws.push(request::resolve_workspace(&cwd)?);
        }
        for w in workspaces {
            let p = request::resolve_workspace(w)?;
            if !ws.contains(&p) {
                ws.push(p);
            }
        }
        refuse_nested(&ws)?;
        let policy = match &policy_file {
            Some(f) => Policy::load(f).map_err(|e| ApiError::usage(e.to_string()))?,
            None => Policy::builtin(),
        };
        // A front end over this serves many runs: what they would each look up again is kept.
        crate::execute::serving_many_runs();
        Ok(Api { workspaces: ws, state_dir, policy, policy_file, ceiling })
    }

    pub fn workspaces(&self) -> &[PathBuf] {
        &self.workspaces
    }

    pub fn ceiling(&self) -> &Ceiling {
        &self.ceiling
    }

    /// The served workspaces, for messages.
    pub fn listed(&self) -> String {
        self.workspaces.iter().map(|w| w.display().to_string()).collect::<Vec<_>>().join(", ")
    }

    /// The workspace a request names (or the only one), if it was named at start.
    pub fn workspace(&self, requested: Option<&str>) -> Result<PathBuf, ApiError> {
        let Some(req) = requested.filter(|s| !s.is_empty()) else {
            return match self.workspaces.as_slice() {
                [only] => Ok(only.clone()),
                _ => Err(ApiError::usage("several workspaces are served: name one with \"workspace\"")),
            };
        };
        // Compare canonical paths; a path that does not resolve cannot be one of ours.
        let p = std::fs::canonicalize(req).ok();
        match p.filter(|p| self.workspaces.contains(p)) {
            Some(p) => Ok(p),
            None => Err(ApiError::forbidden(format!("workspace {req} is not served here (served: {})", self.listed()))),
        }
    }

    fn state_of(&self, ws: &Path) -> Result<Option<StateDir>, StateError> {
        StateDir::existing_for_workspace(self.state_dir.as_deref(), ws)
    }

    /// The state directory holding transaction `tx` of one of our workspaces.
    fn locate(&self, tx: &str) -> Result<StateDir, ApiError> {
        let unknown = || ApiError::not_found(format!("unknown transaction id `{tx}`"));
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

    fn command(command: &str) -> Result<Command, ApiError> {
        if command.trim().is_empty() {
            return Err(ApiError::usage("command is empty"));
        }
        Ok(Command::Shell(command.to_string()))
    }

    pub fn run(&self, body: &RunBody) -> Result<RunResult, ApiError> {
        let workspace = self.workspace(body.workspace.as_deref())?;
        let req = RunRequest {
            state_dir: self.state_dir.clone(),
            cwd: workspace.clone(),
            workspace,
            command: Self::command(&body.command)?,
            policy: self.policy.clone(),
            policy_file: self.policy_file.clone(),
            io: Io::Api,
            limits: self.ceiling.limits(&body.limits)?,
            validate: body.validate.clone(),
            no_commit: body.no_commit,
            keep_on_failure: body.keep_on_failure,
            isolation: self.ceiling.isolation(body.isolation)?,
            pass_env: self.ceiling.pass_env.clone(),
            keep: self.ceiling.keep.clone(),
        };
        Ok(capped(engine::run(&req)?))
    }

    pub fn begin(&self, body: &BeginBody) -> Result<String, ApiError> {
        let ws = self.workspace(body.workspace.as_deref())?;
        let isolation = self.ceiling.isolation(body.isolation)?;
        Ok(session::begin(&ws, self.state_dir.as_deref(), body.name.as_deref(), isolation, &[])?)
    }

    pub fn exec(&self, tx: &str, body: &StepBody) -> Result<RunResult, ApiError> {
        let limits = self.ceiling.limits(&body.limits)?;
        let state = self.locate(tx)?;
        let meta = state.read_meta(tx).map_err(|e| ApiError::not_found(e.to_string()))?;
        let req = session::ExecRequest {
            tx: tx.to_string(),
            cwd: meta.workspace,
            command: Self::command(&body.command)?,
            policy: self.policy.clone(),
            policy_file: self.policy_file.clone(),
            io: Io::Api,
            limits,
            keep_on_failure: body.keep_on_failure,
            pass_env: self.ceiling.pass_env.clone(),
        };
        Ok(capped(session::exec(&state, &req)?))
    }

    /// What an open transaction would change: `{tx, added, modified, deleted}`, and with
    /// `unified`, the unified diff (capped at [`RETURNED_OUTPUT`]) as `diff`.
    pub fn diff(&self, tx: &str, unified: bool) -> Result<Value, ApiError> {
        let state = self.locate(tx)?;
        Ok(session::with_diff(&state, tx, |env, cs, upper| {
            let c = Changes::of(cs);
            let mut v = json!({"tx": tx, "added": c.added, "modified": c.modified, "deleted": c.deleted});
            if unified {
                let mut text = crate::diff::unified(cs, &env.workspace, upper);
                cap_text(&mut text, RETURNED_OUTPUT);
                v["diff"] = Value::String(text);
            }
            Ok(v)
        })?)
    }

    /// Commit an open transaction, judged by the commit-time rules (it may be held). There is
    /// deliberately no `approve` here: approving a held transaction is a person's, never an
    /// agent's over HTTP or MCP (`txbox approve` on the command line).
    pub fn commit(&self, tx: &str) -> Result<RunResult, ApiError> {
        let state = self.locate(tx)?;
        Ok(session::commit(&state, tx, &self.policy)?)
    }

    pub fn rollback(&self, tx: &str, to: Option<u32>) -> Result<RunResult, ApiError> {
        let state = self.locate(tx)?;
        Ok(session::rollback(&state, tx, to)?)
    }

    /// Undo a committed transaction of one of our workspaces (`to`: every commit after it); with
    /// no id, the last commit of `workspace` (or of the only one served).
    pub fn undo(&self, tx: Option<&str>, to: bool, workspace: Option<&str>) -> Result<RunResult, ApiError> {
        use txbox_txn::undo::Target;
        let target = match (tx, to) {
            (Some(id), true) => Target::To(id.to_string()),
            (Some(id), false) => Target::Tx(id.to_string()),
            (None, true) => return Err(ApiError::usage("`to` needs a transaction id")),
            (None, false) => Target::Last,
        };
        if let Some(id) = tx {
            if !txbox_txn::state::valid_id(id) {
                return Err(ApiError::not_found(format!("unknown transaction id `{id}`")));
            }
        }
        // The transaction's own workspace when it is named and retained; it must be served here.
        let retained_ws = tx.and_then(|id| {
            self.workspaces.iter().find_map(|ws| {
                let state = self.state_of(ws).ok()??;
                txbox_txn::retain::entry::header(&state, id).ok().map(|(r, _)| r.workspace)
            })
        });
        let workspace = match (retained_ws, workspace) {
            (Some(w), _) if self.workspaces.contains(&w) => w,
            (Some(w), _) => return Err(ApiError::forbidden(format!("workspace {} is not served here", w.display()))),
            (None, requested) => self.workspace(requested)?,
        };
        let req = crate::undo::UndoRequest {
            workspace,
            state_dir: self.state_dir.clone(),
            target,
            judged_by: Some(self.policy.clone()),
        };
        Ok(capped(crate::undo::undo(&req)?))
    }

    /// The open transactions of one served workspace, or of all.
    pub fn list(&self, workspace: Option<&str>) -> Result<Vec<session::TxInfo>, ApiError> {
        let wanted = match workspace.filter(|s| !s.is_empty()) {
            Some(w) => vec![self.workspace(Some(w))?],
            None => self.workspaces.clone(),
        };
        let mut out: Vec<session::TxInfo> = Vec::new();
        for ws in &wanted {
            let Some(state) = self.state_of(ws).map_err(|e| ApiError::internal(e.to_string()))? else { continue };
            for t in session::list(&state)? {
                if Path::new(&t.workspace) == ws && !out.iter().any(|o| o.tx == t.tx) {
                    out.push(t);
                }
            }
        }
        Ok(out)
    }

    /// The audit log of one workspace (the only one if none is named), the last `n` entries.
    pub fn log(&self, workspace: Option<&str>, n: Option<usize>) -> Result<Value, ApiError> {
        let ws = self.workspace(workspace)?;
        let state = self.state_of(&ws).map_err(|e| ApiError::internal(e.to_string()))?;
        let mut entries = match state {
            Some(state) => audit::read_all(&state.audit_path()).map_err(|e| ApiError::internal(e.to_string()))?,
            None => Vec::new(),
        };
        // One state directory serves many workspaces: show this one's entries only.
        let name = ws.to_string_lossy();
        entries.retain(|e| e.workspace == name);
        if let Some(n) = n {
            let skip = entries.len().saturating_sub(n);
            entries.drain(..skip);
        }
        serde_json::to_value(shown_entries(entries)).map_err(|e| ApiError::internal(e.to_string()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_wrong_types_are_usage_errors() {
        let bad = [
            json!({"cmd": "true"}),
            json!({"command": "true", "timout": 5}),
            json!({"command": 1}),
            json!({"command": "x", "no_commit": "yes"}),
            json!({"command": "x", "timeout": "5"}),
            json!({"command": "x", "timeout": 1e308}),
            json!({"command": "x", "memory": "1K"}),
            json!({"command": "x", "isolation": "serializable"}),
            json!({"command": "x", "workspace": 5}),
            json!([1, 2]),
            json!("run"),
        ];
        for b in bad {
            let e = parse::<RunBody>(b.clone()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Usage, "{b}: {e:?}");
        }
        let e = parse::<RunBody>(json!({"command": "x", "timout": 5})).unwrap_err();
        assert!(e.message.contains("timout") && e.message.contains("timeout"), "{e:?}");
        assert!(parse::<RunBody>(json!({"command": "x", "timeout": 5, "memory": "1G", "network": "none"})).is_ok());
        assert!(parse_bytes::<BeginBody>(b" ").is_ok());
        assert_eq!(parse_bytes::<BeginBody>(b"{").unwrap_err().kind, ErrorKind::Usage);
        assert_eq!(parse::<LogArgs>(json!({"n": -1})).unwrap_err().kind, ErrorKind::Usage);
        assert_eq!(parse::<RollbackBody>(json!({"to": "3"})).unwrap_err().kind, ErrorKind::Usage);
        assert_eq!(parse::<RollbackArgs>(json!({"to": 3})).unwrap_err().kind, ErrorKind::Usage);
    }

    #[test]
    fn tool_schemas_are_generated_with_every_option() {
        let run = schema_of::<RunBody>();
        let props = run["properties"].as_object().unwrap();
        for k in ["command", "workspace", "timeout", "memory", "pids", "cpu", "max_output", "max_write", "network"] {
            assert!(props.contains_key(k), "{k}: {run}");
            assert!(props[k]["description"].as_str().is_some_and(|d| d.len() > 10), "{k}: {run}");
        }
        assert_eq!(run["required"], json!(["command"]));
        assert_eq!(run["additionalProperties"], json!(false));
        assert_eq!(props["network"]["enum"], json!(["none", "host"]), "{run}");
        let exec = schema_of::<ExecArgs>();
        assert!(exec["properties"].as_object().unwrap().contains_key("memory"), "{exec}");
    }

    #[test]
    fn ceilings_and_isolation_floor() {
        let ceiling = Ceiling { isolation: Isolation::Strict, ..Ceiling::default() };
        assert_eq!(ceiling.isolation(None), Ok(Isolation::Strict));
        assert_eq!(ceiling.isolation(Some(Isolation::ReadCommitted)).unwrap_err().kind, ErrorKind::Forbidden);
        let open = Ceiling::default();
        assert_eq!(open.isolation(Some(Isolation::Strict)), Ok(Isolation::Strict));
        let host: RunBody = parse(json!({"command": "x", "network": "host"})).unwrap();
        assert_eq!(open.limits(&host.limits).unwrap_err().kind, ErrorKind::Forbidden);
        assert_eq!(open.may_lift("net.exfiltrate").unwrap_err().kind, ErrorKind::Forbidden);
        assert_eq!(Principal::Agent.require_operator("approve").unwrap_err().kind, ErrorKind::Forbidden);
    }

    #[test]
    fn output_is_capped_head_and_tail() {
        let mut s = format!("{}{}{}", "a".repeat(100), "b".repeat(1000), "c".repeat(100));
        assert!(cap_text(&mut s, 200));
        assert!(s.starts_with(&"a".repeat(100)) && s.ends_with(&"c".repeat(100)), "{s}");
        assert!(s.contains("1000 bytes omitted"), "{s}");
        let mut short = "abc".to_string();
        assert!(!cap_text(&mut short, 200));
        let mut multi = "é".repeat(300);
        assert!(cap_text(&mut multi, 101));
    }
}
