//! Presets (`@pypi`, `@npm`, `@crates`, `@go`, `@github`): the hosts a package manager uses,
//! taken from that package manager's own configuration as the *caller* has it (mirrors and
//! company registries are common), never from files inside a workspace (every tool runs with
//! `/` or `$HOME` as its working directory), and never from a list written into txbox.
//!
//! | preset    | derived from |
//! |-----------|--------------|
//! | `@pypi`   | `python3`: pip's own configuration (`pip.conf` files, `PIP_*` variables) through pip's `Configuration`, its `index-url`, `extra-index-url`, `find-links` (URLs only) and `trusted-host`; without a configured `index-url`, pip's built-in index and file host (`pip._internal.models.index.PyPI`). Without pip, the same keys from `PIP_*` variables and the usual `pip.conf` files. |
//! | `@npm`    | `npm config list --json`: `registry` and every `@scope:registry`. |
//! | `@crates` | `$CARGO_HOME/config.toml` (and `config`): `[source.*] registry`, `[registries.*] index`, `CARGO_REGISTRIES_*_INDEX`; unless crates-io is replaced there, cargo's built-in index, learnt by running `cargo generate-lockfile` on a scratch project with an empty `CARGO_HOME` against a local recording proxy that refuses everything. For each sparse index, the download and API hosts its `config.json` names (fetched with `curl`). |
//! | `@go`     | `go env GOPROXY GOSUMDB`: the proxies' hosts and the checksum database's. |
//! | `@github` | GitHub CLI's `hosts.yml` (`$GH_CONFIG_DIR`, else `~/.config/gh`); without one, `github.com`. For `github.com`: also its API, archive and user-content hosts. |
//!
//! Results are cached in the state base directory (`presets/NAME.json`), keyed by the tool's
//! executable (path, size, modification time), its configuration files' modification times and
//! the variables it reads, so a run does not start four tools.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::allow::{Allowlist, Preset, Rule, Spec};

/// A preset's hosts, and what a person should know about them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Derived {
    pub rules: Vec<Rule>,
    /// E.g. "GOPROXY includes `direct`: module hosts are not covered".
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--allow-host {preset}: {why}")]
pub struct PresetError {
    pub preset: Preset,
    pub why: String,
}

/// How long one tool may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// The caller's environment as the derivations see it.
#[derive(Debug, Clone)]
pub struct Caller {
    vars: BTreeMap<String, String>,
    /// Where results are cached (`None`: not cached).
    pub cache: Option<PathBuf>,
}

impl Caller {
    /// This process's environment; `cache`: the state base directory.
    pub fn this_process(base: Option<&Path>) -> Caller {
        Caller { vars: std::env::vars().collect(), cache: base.map(|b| b.join("presets")) }
    }

    /// An environment given as pairs (tests).
    pub fn with_vars(vars: impl IntoIterator<Item = (String, String)>, cache: Option<PathBuf>) -> Caller {
        Caller { vars: vars.into_iter().collect(), cache }
    }

    pub fn var(&self, k: &str) -> Option<&str> {
        self.vars.get(k).map(String::as_str).filter(|v| !v.is_empty())
    }

    fn home(&self) -> Option<PathBuf> {
        self.var("HOME").map(PathBuf::from)
    }

    /// Where a tool's commands run: never a workspace.
    fn cwd(&self) -> PathBuf {
        self.home().filter(|h| h.is_dir()).unwrap_or_else(|| PathBuf::from("/"))
    }

    /// The executable `PATH` finds for `name`.
    pub fn which(&self, name: &str) -> Option<PathBuf> {
        let path = self.var("PATH")?;
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(name))
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
    }

    /// Run `program args` with this environment (plus `extra`), from [`Caller::cwd`]: its
    /// stdout, or why it failed.
    fn run(&self, program: &Path, args: &[&str], extra: &[(&str, String)]) -> Result<String, String> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(&self.vars)
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            .current_dir(self.cwd())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let shown = format!("`{} {}`", program.display(), args.join(" "));
        let mut child = cmd.spawn().map_err(|e| format!("{shown}: {e}"))?;
        let mut out = child.stdout.take();
        let mut err = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut o = Vec::new();
            if let Some(s) = out.as_mut() {
                let _ = s.take(16 << 20).read_to_end(&mut o);
            }
            o
        });
        let err_reader = std::thread::spawn(move || {
            let mut e = Vec::new();
            if let Some(s) = err.as_mut() {
                let _ = s.take(1 << 20).read_to_end(&mut e);
            }
            e
        });
        let deadline = Instant::now() + TOOL_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{shown} took longer than {}s", TOOL_TIMEOUT.as_secs()));
                }
                Err(e) => return Err(format!("{shown}: {e}")),
            }
        };
        let stdout = reader.join().unwrap_or_default();
        let stderr = err_reader.join().unwrap_or_default();
        if !status.success() {
            let last = String::from_utf8_lossy(&stderr).lines().last().unwrap_or("").to_string();
            return Err(format!("{shown} failed ({status}): {last}"));
        }
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    }
}

/// What a list of items expands to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expansion {
    pub allow: Allowlist,
    /// What to know about the presets used (hosts they cannot cover).
    pub notes: Vec<String>,
    /// Presets that gave no host, and why (`@go: go is not on PATH`): the command runs without
    /// them, and its result says so. A missing tool does not stop every command of a server
    /// whose ceiling names it.
    pub failed: Vec<String>,
}

/// Expand every preset in `specs` and collect the rules.
pub fn expand_with(specs: &[Spec], caller: &Caller) -> Expansion {
    let mut rules = Vec::new();
    let mut x = Expansion::default();
    for s in specs {
        match s {
            Spec::Rule(r) => rules.push(r.clone()),
            Spec::Preset(p) => match derive(*p, caller) {
                Ok(d) if d.rules.is_empty() => x.failed.push(format!("{p}: the configuration names no host")),
                Ok(d) => {
                    rules.extend(d.rules);
                    x.notes.extend(d.notes.into_iter().map(|n| format!("{p}: {n}")));
                }
                Err(e) => x.failed.push(format!("{p}: {}", e.why)),
            },
        }
    }
    x.allow = Allowlist::new(rules);
    x
}

/// [`expand_with`] for this process's environment, cached in `base/presets`.
pub fn expand(specs: &[Spec], base: Option<&Path>) -> Expansion {
    if !specs.iter().any(|s| matches!(s, Spec::Preset(_))) {
        return expand_with(specs, &Caller::with_vars([], None));
    }
    expand_with(specs, &Caller::this_process(base))
}

/// One preset's hosts: from the cache when nothing it depends on changed, else derived.
pub fn derive(p: Preset, caller: &Caller) -> Result<Derived, PresetError> {
    let key = cache_key(p, caller);
    if let Some(d) = cached(p, caller, &key) {
        return Ok(d);
    }
    let d = derive_now(p, caller).map_err(|why| PresetError { preset: p, why })?;
    store(p, caller, &key, &d);
    Ok(d)
}

fn derive_now(p: Preset, caller: &Caller) -> Result<Derived, String> {
    match p {
        Preset::Pypi => pypi(caller),
        Preset::Npm => npm(caller),
        Preset::Crates => crates(caller),
        Preset::Go => go(caller),
        Preset::Github => Ok(github(caller)),
    }
}

// ---------------------------------------------------------------------------------------------
// The cache.

#[derive(serde::Serialize, serde::Deserialize)]
struct CacheFile {
    key: String,
    derived: Derived,
}

/// What a preset's result depends on: executables, files (each with its size and modification
/// time, or `-` when missing), and variables.
fn cache_key(p: Preset, caller: &Caller) -> String {
    let file = |path: &Path| match std::fs::metadata(path) {
        Ok(m) => format!("{}:{}:{}.{}", path.display(), m.len(), m.mtime(), m.mtime_nsec()),
        Err(_) => format!("{}:-", path.display()),
    };
    let exe = |name: &str| caller.which(name).map_or_else(|| format!("{name}:-"), |p| file(&p));
    let vars = |prefixes: &[&str]| {
        caller
            .vars
            .iter()
            .filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p)))
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let home = caller.home().unwrap_or_default();
    let parts: Vec<String> = match p {
        Preset::Pypi => {
            let mut v = vec![exe("python3"), vars(&["PIP_", "VIRTUAL_ENV", "XDG_CONFIG"])];
            v.extend(pip_config_files(caller).iter().map(|f| file(f)));
            v
        }
        Preset::Npm => vec![
            exe("npm"),
            exe("node"),
            vars(&["npm_config_", "NPM_CONFIG_", "PREFIX"]),
            file(&home.join(".npmrc")),
            file(Path::new("/etc/npmrc")),
            file(Path::new("/usr/etc/npmrc")),
        ],
        Preset::Crates => {
            let mut v = vec![exe("cargo"), exe("curl"), vars(&["CARGO_", "RUSTUP_"])];
            v.extend(cargo_config_files(caller).iter().map(|f| file(f)));
            v
        }
        Preset::Go => vec![exe("go"), vars(&["GO", "XDG_CONFIG"]), file(&home.join(".config/go/env"))],
        Preset::Github => vec![file(&gh_hosts_file(caller)), vars(&["GH_"])],
    };
    format!("{} v1\n{}", p.name(), parts.join("\n"))
}

fn cache_path(p: Preset, caller: &Caller) -> Option<PathBuf> {
    caller.cache.as_ref().map(|d| d.join(format!("{}.json", p.name())))
}

fn cached(p: Preset, caller: &Caller, key: &str) -> Option<Derived> {
    let text = std::fs::read(cache_path(p, caller)?).ok()?;
    let f: CacheFile = serde_json::from_slice(&text).ok()?;
    (f.key == key).then_some(f.derived)
}

/// Best effort: a result that cannot be cached is derived again next time.
fn store(p: Preset, caller: &Caller, key: &str, d: &Derived) {
    let Some(path) = cache_path(p, caller) else { return };
    let Some(dir) = path.parent() else { return };
    if std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700).create(dir).is_err() {
        return;
    }
    let Ok(text) = serde_json::to_vec(&CacheFile { key: key.to_string(), derived: d.clone() }) else { return };
    let tmp = dir.join(format!(".{}.{}.tmp", p.name(), std::process::id()));
    let written = std::fs::File::create(&tmp).and_then(|mut f| f.write_all(&text));
    if written.is_err() || std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

// ---------------------------------------------------------------------------------------------
// Pure helpers.

/// The rule for a URL's host and port, if it is an http(s) URL.
pub fn url_rule(url: &str) -> Option<Rule> {
    let url = url.trim();
    let lower = url.to_ascii_lowercase();
    let url = lower.strip_prefix("sparse+").or_else(|| lower.strip_prefix("registry+")).unwrap_or(&lower);
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return None;
    }
    Rule::parse(url).ok()
}

fn push_unique(rules: &mut Vec<Rule>, r: Rule) {
    if !rules.contains(&r) {
        rules.push(r);
    }
}

// ---------------------------------------------------------------------------------------------
// @pypi

/// Prints `{"items": [[key, value]…], "default": [index URL, file host]}` from pip itself,
/// or from the variables and files pip reads when pip is not importable.
const PIP_SCRIPT: &str = r#"
import json, os
out = {"items": [], "default": []}
try:
    from pip._internal.configuration import Configuration
    c = Configuration(isolated=False)
    c.load()
    out["items"] = [[k.split(".", 1)[-1], str(v)] for k, v in c.items()]
except Exception:
    import configparser
    files = [os.environ.get("PIP_CONFIG_FILE", ""), "/etc/pip.conf", "/etc/xdg/pip/pip.conf",
             os.path.expanduser("~/.pip/pip.conf"), os.path.expanduser("~/.config/pip/pip.conf")]
    for f in files:
        if f and os.path.isfile(f):
            p = configparser.ConfigParser()
            try:
                p.read(f)
            except Exception:
                continue
            for s in ("global", "install", "download"):
                if p.has_section(s):
                    out["items"] += [[k, v] for k, v in p.items(s)]
    for k, v in os.environ.items():
        if k.startswith("PIP_"):
            out["items"].append([k[4:].lower().replace("_", "-"), v])
try:
    from pip._internal.models.index import PyPI
    out["default"] = [PyPI.url, PyPI.file_storage_domain]
except Exception:
    pass
print(json.dumps(out))
"#;

#[derive(serde::Deserialize)]
struct PipOut {
    items: Vec<(String, String)>,
    default: Vec<String>,
}

fn pypi(caller: &Caller) -> Result<Derived, String> {
    let python = caller.which("python3").ok_or("python3 is not on PATH")?;
    let text = caller.run(&python, &["-c", PIP_SCRIPT], &[])?;
    let out: PipOut = serde_json::from_str(text.trim()).map_err(|e| format!("reading pip's configuration: {e}"))?;
    Ok(pip_hosts(&out.items, &out.default))
}

/// The hosts of pip's configuration: the indexes, links and trusted hosts; pip's default index
/// and file host unless an `index-url` replaces them. Pure.
pub fn pip_hosts(items: &[(String, String)], default: &[String]) -> Derived {
    let mut d = Derived::default();
    let mut replaced = false;
    for (key, value) in items {
        for v in value.split_whitespace() {
            match key.as_str() {
                "index-url" | "extra-index-url" | "find-links" => {
                    replaced |= key == "index-url";
                    if let Some(r) = url_rule(v) {
                        push_unique(&mut d.rules, r);
                    }
                }
                "trusted-host" => {
                    if let Ok(r) = Rule::parse(v) {
                        push_unique(&mut d.rules, r);
                    }
                }
                _ => {}
            }
        }
    }
    if !replaced {
        match default {
            [index, files, ..] => {
                if let Some(r) = url_rule(index) {
                    push_unique(&mut d.rules, r);
                }
                if let Ok(r) = Rule::parse(&format!("https://{files}/")) {
                    push_unique(&mut d.rules, r);
                }
            }
            _ => d.notes.push("pip is not installed for python3: its default index is not known".into()),
        }
    }
    d
}

fn pip_config_files(caller: &Caller) -> Vec<PathBuf> {
    let home = caller.home().unwrap_or_default();
    let mut v = vec![
        PathBuf::from("/etc/pip.conf"),
        PathBuf::from("/etc/xdg/pip/pip.conf"),
        home.join(".pip/pip.conf"),
        home.join(".config/pip/pip.conf"),
    ];
    if let Some(f) = caller.var("PIP_CONFIG_FILE") {
        v.push(PathBuf::from(f));
    }
    if let Some(venv) = caller.var("VIRTUAL_ENV") {
        v.push(Path::new(venv).join("pip.conf"));
    }
    v
}

// ---------------------------------------------------------------------------------------------
// @npm

fn npm(caller: &Caller) -> Result<Derived, String> {
    let npm = caller.which("npm").ok_or("npm is not on PATH")?;
    let text = caller.run(&npm, &["config", "list", "--json"], &[("npm_config_update_notifier", "false".into())])?;
    npm_hosts(&text)
}

/// `registry` and `@scope:registry` of `npm config list --json`. Pure.
pub fn npm_hosts(json: &str) -> Result<Derived, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("reading npm's configuration: {e}"))?;
    let obj = v.as_object().ok_or("npm's configuration is not an object")?;
    let mut d = Derived::default();
    for (k, v) in obj {
        if k == "registry" || (k.starts_with('@') && k.ends_with(":registry")) {
            if let Some(r) = v.as_str().and_then(url_rule) {
                push_unique(&mut d.rules, r);
            }
        }
    }
    Ok(d)
}

// ---------------------------------------------------------------------------------------------
// @crates

fn cargo_home(caller: &Caller) -> PathBuf {
    caller.var("CARGO_HOME").map(PathBuf::from).unwrap_or_else(|| caller.home().unwrap_or_default().join(".cargo"))
}

fn cargo_config_files(caller: &Caller) -> Vec<PathBuf> {
    let home = cargo_home(caller);
    vec![home.join("config.toml"), home.join("config")]
}

/// What cargo's configuration says about registries.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CargoSources {
    /// Index URLs (`sparse+https://…`, or a git URL).
    pub indexes: Vec<String>,
    /// crates.io itself is replaced by another source.
    pub crates_io_replaced: bool,
}

/// Read `[source.*]` and `[registries.*]` from config files' text, and `CARGO_REGISTRIES_*_INDEX`
/// variables. Pure.
pub fn cargo_sources(files: &[String], vars: &BTreeMap<String, String>) -> CargoSources {
    let mut s = CargoSources::default();
    let push = |u: &str, s: &mut CargoSources| {
        if !s.indexes.iter().any(|x| x == u) {
            s.indexes.push(u.to_string());
        }
    };
    for text in files {
        let Ok(v) = text.parse::<toml::Table>() else { continue };
        if let Some(sources) = v.get("source").and_then(|x| x.as_table()) {
            for (name, src) in sources {
                if name == "crates-io" && src.get("replace-with").is_some() {
                    s.crates_io_replaced = true;
                }
                if let Some(u) = src.get("registry").and_then(|x| x.as_str()) {
                    push(u, &mut s);
                }
            }
        }
        if let Some(regs) = v.get("registries").and_then(|x| x.as_table()) {
            for reg in regs.values() {
                if let Some(u) = reg.get("index").and_then(|x| x.as_str()) {
                    push(u, &mut s);
                }
            }
        }
    }
    for (k, v) in vars {
        if k.starts_with("CARGO_REGISTRIES_") && k.ends_with("_INDEX") {
            push(v, &mut s);
        }
    }
    s
}

fn crates(caller: &Caller) -> Result<Derived, String> {
    let files: Vec<String> =
        cargo_config_files(caller).iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect();
    let sources = cargo_sources(&files, &caller.vars);
    let mut d = Derived::default();
    let mut indexes = sources.indexes.clone();
    if !sources.crates_io_replaced {
        let cargo = caller.which("cargo").ok_or("cargo is not on PATH")?;
        indexes.extend(cargo_default_index(caller, &cargo)?);
    }
    for index in &indexes {
        let Some(rule) = url_rule(index) else { continue };
        push_unique(&mut d.rules, rule);
        if !index.starts_with("sparse+") {
            d.notes.push(format!("{index} is a git index: the hosts its crates download from are not known"));
            continue;
        }
        match index_config(caller, index) {
            Ok(rules) => rules.into_iter().for_each(|r| push_unique(&mut d.rules, r)),
            Err(why) => d.notes.push(format!("{index}: {why}; crate downloads may be refused")),
        }
    }
    Ok(d)
}

/// The download and API hosts a sparse index's `config.json` names (`curl` fetches it).
fn index_config(caller: &Caller, index: &str) -> Result<Vec<Rule>, String> {
    let base = index.strip_prefix("sparse+").unwrap_or(index).trim_end_matches('/');
    let curl = caller.which("curl").ok_or("curl is not on PATH to read the index's config.json")?;
    let text = caller.run(&curl, &["-fsSL", "--max-time", "20", &format!("{base}/config.json")], &[])?;
    index_config_hosts(&text)
}

/// `dl` and `api` of an index's `config.json`. Pure.
pub fn index_config_hosts(json: &str) -> Result<Vec<Rule>, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("the index's config.json: {e}"))?;
    let mut out = Vec::new();
    for k in ["dl", "api"] {
        if let Some(r) = v.get(k).and_then(|x| x.as_str()).and_then(url_rule) {
            push_unique(&mut out, r);
        }
    }
    Ok(out)
}

/// cargo's built-in index: run cargo once, with no configuration of the caller's, against a
/// recording proxy that refuses every connection, and see where it goes.
fn cargo_default_index(caller: &Caller, cargo: &Path) -> Result<Vec<String>, String> {
    let scratch = std::env::temp_dir().join(format!(
        "txbox-preset-cargo-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    let setup = || -> std::io::Result<()> {
        std::fs::create_dir_all(scratch.join("home"))?;
        std::fs::create_dir_all(scratch.join("probe/src"))?;
        std::fs::write(
            scratch.join("probe/Cargo.toml"),
            "[package]\nname = \"probe\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[dependencies]\nlibc = \"0.2\"\n",
        )?;
        std::fs::write(scratch.join("probe/src/lib.rs"), "")
    };
    let result = setup().map_err(|e| format!("a scratch project for cargo: {e}")).and_then(|()| {
        let recorder = Recorder::start().map_err(|e| format!("a recording proxy: {e}"))?;
        let url = format!("http://127.0.0.1:{}", recorder.port);
        let manifest = scratch.join("probe/Cargo.toml");
        let extra = [
            ("CARGO_HOME", scratch.join("home").display().to_string()),
            ("CARGO_HTTP_PROXY", url.clone()),
            ("HTTPS_PROXY", url.clone()),
            ("https_proxy", url.clone()),
            ("HTTP_PROXY", url.clone()),
            ("http_proxy", url),
            ("CARGO_NET_RETRY", "0".into()),
            ("CARGO_HTTP_TIMEOUT", "20".into()),
            ("CARGO_NET_OFFLINE", "false".into()),
        ];
        // It fails (every connection is refused); what it asked for is the answer.
        let _ = caller.run(cargo, &["generate-lockfile", "--manifest-path", &manifest.display().to_string()], &extra);
        Ok(recorder.finish())
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let hosts = result?;
    if hosts.is_empty() {
        return Err("cargo asked for no host (is it configured offline?)".into());
    }
    // cargo's default protocol is sparse; its index lives at the root of that host.
    Ok(hosts.into_iter().map(|(host, port)| format!("sparse+https://{host}:{port}/")).collect())
}

/// A proxy on loopback that records the host of every `CONNECT` and refuses it.
struct Recorder {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, u16)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    fn start() -> std::io::Result<Recorder> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s, v) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                        let mut buf = Vec::new();
                        let mut chunk = [0u8; 2048];
                        while crate::http::head_end(&buf).is_none() && buf.len() < crate::http::MAX_HEAD {
                            match conn.read(&mut chunk) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        if let Ok(req) = crate::http::parse(&buf) {
                            if let Ok(mut seen) = v.lock() {
                                let hp = (req.host().to_string(), req.port());
                                if !seen.contains(&hp) {
                                    seen.push(hp);
                                }
                            }
                        }
                        let _ = conn.write_all(&crate::http::response(403, "Forbidden", "recorded"));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(Recorder { port, stop, seen, thread: Some(thread) })
    }

    fn finish(mut self) -> Vec<(String, u16)> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// @go

fn go(caller: &Caller) -> Result<Derived, String> {
    let go = caller.which("go").ok_or("go is not on PATH")?;
    let text = caller.run(&go, &["env", "GOPROXY", "GOSUMDB"], &[])?;
    let mut lines = text.lines();
    Ok(go_hosts(lines.next().unwrap_or(""), lines.next().unwrap_or("")))
}

/// The hosts of `GOPROXY` (a list separated by `,` or `|`) and `GOSUMDB` (`off`, `NAME`,
/// `NAME+KEY`, or `NAME+KEY URL`). Pure.
pub fn go_hosts(goproxy: &str, gosumdb: &str) -> Derived {
    let mut d = Derived::default();
    for item in goproxy.split([',', '|']).map(str::trim).filter(|s| !s.is_empty()) {
        match item {
            "direct" => d.notes.push(
                "GOPROXY includes `direct`: modules fetched from their own hosts are not covered; list those hosts"
                    .into(),
            ),
            "off" => {}
            url => {
                let url = if url.contains("://") { url.to_string() } else { format!("https://{url}") };
                if let Some(r) = url_rule(&url) {
                    push_unique(&mut d.rules, r);
                }
            }
        }
    }
    let sumdb = gosumdb.trim();
    if !sumdb.is_empty() && sumdb != "off" {
        let mut parts = sumdb.split_whitespace();
        let name = parts.next().unwrap_or("");
        let host = name.split('+').next().unwrap_or("");
        let rule = match parts.next() {
            Some(url) => url_rule(url),
            None => Rule::parse(&format!("https://{host}/")).ok(),
        };
        if let Some(r) = rule {
            push_unique(&mut d.rules, r);
        }
    }
    d
}

// ---------------------------------------------------------------------------------------------
// @github

fn gh_hosts_file(caller: &Caller) -> PathBuf {
    match caller.var("GH_CONFIG_DIR") {
        Some(d) => Path::new(d).join("hosts.yml"),
        None => caller
            .var("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| caller.home().unwrap_or_default().join(".config"))
            .join("gh/hosts.yml"),
    }
}

fn github(caller: &Caller) -> Derived {
    let text = std::fs::read_to_string(gh_hosts_file(caller)).unwrap_or_default();
    github_hosts(&text)
}

/// The hosts of GitHub CLI's `hosts.yml` (its top-level keys), or `github.com` without any;
/// for `github.com`, also its API, archive and user-content hosts. Pure.
pub fn github_hosts(hosts_yml: &str) -> Derived {
    let mut hosts: Vec<String> = hosts_yml
        .lines()
        .filter(|l| !l.starts_with([' ', '\t', '#', '-']) && l.trim_end().ends_with(':'))
        .map(|l| l.trim_end().trim_end_matches(':').trim_matches(['"', '\'']).to_string())
        .filter(|h| crate::allow::Host::parse(h).is_ok())
        .collect();
    if hosts.is_empty() {
        hosts.push("github.com".into());
    }
    let mut d = Derived::default();
    for h in hosts {
        let items: Vec<String> = if h == "github.com" {
            ["github.com", "api.github.com", "codeload.github.com", "*.githubusercontent.com"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            vec![h.clone(), format!("api.{h}")]
        };
        for i in items {
            if let Ok(r) = Rule::parse(&i) {
                push_unique(&mut d.rules, r);
            }
        }
    }
    d
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rules(d: &Derived) -> Vec<String> {
        d.rules.iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn pip_configuration_replaces_or_keeps_the_default() {
        let default = vec!["https://index.example/".to_string(), "files.example".to_string()];
        let d = pip_hosts(&[], &default);
        assert_eq!(rules(&d), ["index.example:443", "files.example:443"]);
        let items = vec![
            ("index-url".to_string(), "http://mirror.example:8080/simple".to_string()),
            ("extra-index-url".to_string(), "https://a.example/simple https://b.example/x".to_string()),
            ("find-links".to_string(), "/opt/wheels".to_string()),
            ("trusted-host".to_string(), "mirror.example".to_string()),
            ("cert".to_string(), "/etc/ssl/x.pem".to_string()),
        ];
        let d = pip_hosts(&items, &default);
        assert_eq!(rules(&d), ["mirror.example:8080", "a.example:443", "b.example:443", "mirror.example"]);
        assert!(pip_hosts(&[], &[]).notes[0].contains("not installed"));
    }

    #[test]
    fn npm_registries_and_scopes() {
        let d = npm_hosts(
            r#"{"registry":"https://npm.example/","@corp:registry":"http://corp.example:4873","cache":"/x"}"#,
        )
        .unwrap();
        assert_eq!(rules(&d), ["corp.example:4873", "npm.example:443"]);
        assert!(npm_hosts("not json").is_err());
    }

    #[test]
    fn cargo_sources_and_replacement() {
        let file = r#"
            [source.crates-io]
            replace-with = "mirror"
            [source.mirror]
            registry = "sparse+https://mirror.example/index/"
            [source.vendored]
            directory = "vendor"
            [registries.corp]
            index = "https://git.corp.example/index.git"
        "#;
        let vars = BTreeMap::from([(
            "CARGO_REGISTRIES_OTHER_INDEX".to_string(),
            "sparse+http://other.example:81/".to_string(),
        )]);
        let s = cargo_sources(&[file.to_string(), "not toml [".to_string()], &vars);
        assert!(s.crates_io_replaced);
        assert_eq!(
            s.indexes,
            [
                "sparse+https://mirror.example/index/",
                "https://git.corp.example/index.git",
                "sparse+http://other.example:81/"
            ]
        );
        assert_eq!(url_rule("sparse+https://mirror.example/index/").unwrap().to_string(), "mirror.example:443");
        assert_eq!(
            index_config_hosts(r#"{"dl":"https://dl.example/crates","api":"https://api.example"}"#)
                .unwrap()
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>(),
            ["dl.example:443", "api.example:443"]
        );
    }

    #[test]
    fn go_proxies_and_checksum_database() {
        let d = go_hosts("https://proxy.example,direct", "sum.example");
        assert_eq!(rules(&d), ["proxy.example:443", "sum.example:443"]);
        assert!(d.notes[0].contains("direct"));
        let d = go_hosts("https://a.example|http://b.example:8080", "corp+abc123 https://sumdb.example:8443");
        assert_eq!(rules(&d), ["a.example:443", "b.example:8080", "sumdb.example:8443"]);
        assert!(go_hosts("off", "off").rules.is_empty());
    }

    #[test]
    fn github_hosts_from_gh_or_the_default() {
        let d = github_hosts("ghe.corp.example:\n    user: me\n    git_protocol: https\n");
        assert_eq!(rules(&d), ["ghe.corp.example", "api.ghe.corp.example"]);
        let d = github_hosts("");
        assert!(
            rules(&d).contains(&"github.com".to_string()) && rules(&d).contains(&"*.githubusercontent.com".to_string())
        );
    }

    #[test]
    fn results_are_cached_until_a_dependency_changes() {
        let dir = std::env::temp_dir().join(format!("txbox-preset-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("gh")).unwrap();
        let caller = Caller::with_vars(
            [("GH_CONFIG_DIR".to_string(), dir.join("gh").display().to_string())],
            Some(dir.join("cache")),
        );
        std::fs::write(dir.join("gh/hosts.yml"), "one.example:\n").unwrap();
        assert_eq!(rules(&derive(Preset::Github, &caller).unwrap())[0], "one.example");
        assert!(dir.join("cache/github.json").exists());
        // A changed configuration is noticed.
        std::fs::write(dir.join("gh/hosts.yml"), "two.example:\n    user: x\n").unwrap();
        assert_eq!(rules(&derive(Preset::Github, &caller).unwrap())[0], "two.example");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
