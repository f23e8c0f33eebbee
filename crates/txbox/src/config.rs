//! The configuration file (`$TXBOX_CONFIG`, else `$XDG_CONFIG_HOME/txbox/config.toml`, else
//! `~/.config/txbox/config.toml`), read by `txbox sh` (which takes no flags) and by `txbox serve`
//! and `txbox mcp` (flags win over it; for them limits and `network` are the operator's ceilings).
//!
//! A sandboxed command can write its workspace, and a commit makes that real: with `$HOME`
//! inside a workspace, a command could commit a configuration for the next `txbox sh`. So a file
//! that sets keys that *widen* confinement ([`Config::widening`]) is refused unless it lies
//! outside every place a sandboxed command can write ([`Untrusted`]): the workspaces in use, the
//! state directory and its base, and every directory txbox has committed into. Keys that only
//! narrow (a limit, strict isolation, `network = "none"`) are honoured wherever the file is.
//!
//! Owns: the file's keys and the trust rule. Touches: the file, and the state directory's commit
//! logs (read) to tell whether a directory has been a workspace.

use std::path::{Component, Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use crate::api::ApiError;
use crate::options::{Isolation, LimitArgs};
use txbox_txn::keep::KeepRules;

/// The configuration's keys (all optional). Unknown keys are errors.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
pub struct Config {
    /// The workspace of `txbox sh` (default: the current directory); served by `serve`/`mcp`
    /// when no `-C` is given.
    #[serde(default)]
    pub workspace: Option<PathBuf>,
    /// The state directory.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// A policy file merged over the built-in policy.
    #[serde(default)]
    pub policy: Option<PathBuf>,
    /// `read-committed` or `strict`.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    /// Variables passed to commands although their name or value marks a credential.
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Undo data kept: at most this many transactions (0 turns retention off). Read by
    /// `crate::retention` for every subcommand.
    #[serde(default)]
    pub retain_count: Option<u64>,
    /// Undo data kept: at most this many bytes (`1G`).
    #[serde(default)]
    pub retain_size: Option<String>,
    /// Undo data yields while less than this is free: a size (`2G`) or a percentage (`5%`).
    #[serde(default)]
    pub retain_min_free: Option<String>,
    /// Kept directories (build output committed even when a command fails; docs/DEVIATIONS.md):
    /// names matched at any depth of the workspace, e.g. `["target", "__pycache__"]`; `[]`
    /// keeps nothing. Default: `txbox_txn::keep::DEFAULT`.
    #[serde(default)]
    pub keep: Option<Vec<String>>,
    #[serde(flatten)]
    pub limits: LimitArgs,
}

/// Where the configuration comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub path: PathBuf,
    /// Named explicitly (`TXBOX_CONFIG`): it must exist.
    pub required: bool,
}

impl Source {
    /// `$TXBOX_CONFIG`, else `$XDG_CONFIG_HOME/txbox/config.toml`, else `~/.config/txbox/config.toml`.
    pub fn default_location() -> Option<Source> {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(p) = env("TXBOX_CONFIG") {
            return Some(Source { path: p, required: true });
        }
        let dir =
            env("XDG_CONFIG_HOME").filter(|p| p.is_absolute()).or_else(|| env("HOME").map(|h| h.join(".config")))?;
        Some(Source { path: dir.join("txbox/config.toml"), required: false })
    }
}

impl Source {
    /// The file's text; None when it is absent and not required.
    pub fn read(&self) -> Result<Option<String>, String> {
        match std::fs::read_to_string(&self.path) {
            Ok(t) => Ok(Some(t)),
            Err(e) if !self.required && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading {}: {e}", self.path.display())),
        }
    }
}

/// The default configuration file and its text ([`Source::default_location`], [`Source::read`]),
/// read once per process: what a process reads of it (`run`: the kept directories, the
/// retention budget; `serve`: everything, at start) comes from one reading, each judged as
/// [`Config::load`] judges it. A server reads it at start, as it did before.
pub fn default_text() -> Result<Option<(&'static Source, &'static str)>, String> {
    static TEXT: std::sync::OnceLock<Result<Option<(Source, String)>, String>> = std::sync::OnceLock::new();
    let read = || {
        let Some(src) = Source::default_location() else { return Ok(None) };
        Ok(src.read()?.map(|text| (src, text)))
    };
    match TEXT.get_or_init(read) {
        Ok(found) => Ok(found.as_ref().map(|(src, text)| (src, text.as_str()))),
        Err(e) => Err(e.clone()),
    }
}

/// The places a sandboxed command could have written a file: a configuration there may only
/// narrow.
#[derive(Debug, Clone, Default)]
pub struct Untrusted {
    /// Workspaces in use (the current one for `sh`, every served one for `serve`/`mcp`).
    pub workspaces: Vec<PathBuf>,
    /// The state directory named with `--state-dir`, if any (the default one's base is added).
    pub state_dir: Option<PathBuf>,
    /// The workspace in use when the file names none (the current directory, without `-C`).
    pub fallback: Option<PathBuf>,
}

impl Untrusted {
    /// Why `path` is not trusted, if it is not: inside a workspace in use, the state
    /// directory, the per-user state base, or a directory txbox has committed into.
    pub fn reason(&self, path: &Path) -> Option<String> {
        let mut forms = vec![absolute(path)];
        if let Ok(real) = std::fs::canonicalize(path) {
            forms.push(real);
        }
        for p in &forms {
            for ws in &self.workspaces {
                let ws_real = std::fs::canonicalize(ws).unwrap_or_else(|_| absolute(ws));
                if p.starts_with(&ws_real) || p.starts_with(absolute(ws)) {
                    return Some(format!("inside the workspace {}", ws_real.display()));
                }
            }
            let mut states: Vec<PathBuf> = self.state_dir.iter().map(|d| absolute(d)).collect();
            states.extend(txbox_txn::layout::base_dir().ok());
            for s in states {
                let real = std::fs::canonicalize(&s).unwrap_or(s);
                if p.starts_with(&real) {
                    return Some(format!("inside txbox's state directory {}", real.display()));
                }
            }
            for dir in p.ancestors().skip(1) {
                if committed_into(self.state_dir.as_deref(), dir) {
                    return Some(format!("inside {}, a directory txbox has committed into", dir.display()));
                }
            }
        }
        None
    }
}

/// Whether txbox has committed a transaction into `dir` as a workspace (its commit log in the
/// state directory it would use there says so).
fn committed_into(state_dir: Option<&Path>, dir: &Path) -> bool {
    if !dir.is_dir() {
        return false;
    }
    matches!(txbox_txn::StateDir::existing_for_workspace(state_dir, dir), Ok(Some(s)) if s.generation(dir).is_ok_and(|g| g > 0))
}

/// A path made absolute and lexically normal (no `.`; `..` removes a component).
fn absolute(p: &Path) -> PathBuf {
    let joined = if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(p) };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

impl Config {
    /// Parse a file's text (TOML): unknown keys, wrong types and out-of-range values are errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ApiError> {
        let value: toml::Value =
            toml::from_str(text).map_err(|e| ApiError::usage(format!("{}: {e}", path.display())))?;
        let json = serde_json::to_value(value).map_err(|e| ApiError::usage(format!("{}: {e}", path.display())))?;
        let config = crate::api::parse::<Config>(json)
            .map_err(|e| ApiError::usage(format!("{}: {}", path.display(), e.message)))?;
        config.keep_rules().map_err(|e| ApiError::usage(format!("{}: {}", path.display(), e.message)))?;
        Ok(config)
    }

    /// The kept directories this configuration sets (the defaults without the key).
    pub fn keep_rules(&self) -> Result<KeepRules, ApiError> {
        match &self.keep {
            None => Ok(KeepRules::default()),
            Some(list) => KeepRules::parse(list.iter().map(String::as_str)).map_err(ApiError::usage),
        }
    }

    /// The keys set here that widen confinement beyond txbox's defaults: another workspace or
    /// state directory, a policy file, credentials passed, the host's network, a limit above
    /// its default (`limits::defaults_ceiling`: the timeout, processes and, conservatively,
    /// the write limit's smallest default; limits without a default only narrow).
    pub fn widening(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.workspace.is_some() {
            keys.push("workspace");
        }
        if self.state_dir.is_some() {
            keys.push("state_dir");
        }
        if self.policy.is_some() {
            keys.push("policy");
        }
        if !self.pass_env.is_empty() {
            keys.push("pass_env");
        }
        // What can be undone is a person's safety net: a file a command could have written may
        // neither switch it off nor make it hold the disk.
        keys.extend(self.retain_keys());
        // Keeping more than the defaults lands more of a failed command's writes.
        if !self.keep_rules().is_ok_and(|k| k.within_defaults()) {
            keys.push("keep");
        }
        let mut limits = self.limits.clone();
        // Each limit over the defaults, one at a time.
        let ceiling = crate::limits::defaults_ceiling();
        while let Err(e) = limits.within(&ceiling) {
            keys.push(e.what);
            match e.what {
                "network" => limits.network = None,
                "allow_hosts" => limits.allow_hosts = None,
                "timeout" => limits.timeout = None,
                "memory" => limits.memory = None,
                "pids" => limits.pids = None,
                "cpu" => limits.cpu = None,
                "max_output" => limits.max_output = None,
                _ => limits.max_write = None,
            }
        }
        keys
    }

    /// The retention keys this file sets.
    pub fn retain_keys(&self) -> Vec<&'static str> {
        let set = [
            ("retain_count", self.retain_count.is_some()),
            ("retain_size", self.retain_size.is_some()),
            ("retain_min_free", self.retain_min_free.is_some()),
        ];
        set.into_iter().filter(|(_, on)| *on).map(|(k, _)| k).collect()
    }

    /// Load the configuration from `source` (none: empty), refusing it if it widens
    /// confinement from a place a sandboxed command could have written.
    pub fn load(source: Option<&Source>, untrusted: &Untrusted) -> Result<Config, ApiError> {
        let Some(src) = source else { return Ok(Config::default()) };
        match src.read().map_err(ApiError::usage)? {
            Some(text) => Config::judged(src, &text, untrusted),
            None => Ok(Config::default()),
        }
    }

    /// [`load`](Self::load) from the default location ([`Source::default_location`]), its
    /// text read once per process ([`default_text`]): a `run` needs its kept directories and
    /// its retention budget from it, and each reading would be judged again anyway.
    pub fn load_default(untrusted: &Untrusted) -> Result<Config, ApiError> {
        match default_text().map_err(ApiError::usage)? {
            Some((src, text)) => Config::judged(src, text, untrusted),
            None => Ok(Config::default()),
        }
    }

    /// The configuration in `text` (the file `src`), refused if it widens confinement from a
    /// place a sandboxed command could have written.
    fn judged(src: &Source, text: &str, untrusted: &Untrusted) -> Result<Config, ApiError> {
        let config = Config::parse(text, &src.path)?;
        let widening = config.widening();
        if widening.is_empty() {
            return Ok(config);
        }
        // Only a file that widens is worth the look at where it lies.
        let mut untrusted = untrusted.clone();
        match &config.workspace {
            Some(ws) => untrusted.workspaces.push(ws.clone()),
            None => untrusted.workspaces.extend(untrusted.fallback.clone()),
        }
        if let Some(why) = untrusted.reason(&src.path) {
            return Err(ApiError::forbidden(format!(
                "configuration {} refused: it lies {why}, where a sandboxed command can write, and sets keys \
                 that widen confinement ({}); move it outside every workspace and txbox's state directory \
                 (or name one with TXBOX_CONFIG), or remove those keys",
                src.path.display(),
                widening.join(", ")
            )));
        }
        Ok(config)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_types_and_unknown_keys() {
        let p = Path::new("c.toml");
        let c = Config::parse("workspace = \"/w\"\ntimeout = 30\nmemory = \"2G\"\nnetwork = \"host\"\n", p).unwrap();
        assert_eq!(c.workspace, Some(PathBuf::from("/w")));
        let l = c.limits.to_limits();
        assert_eq!((l.memory, l.host_network), (Some(2 << 30), true));
        assert!(Config::parse("workspaces = 1", p).is_err(), "a misspelt key must be an error");
        assert!(Config::parse("timeout = 0", p).is_err());
        assert!(Config::parse("timeout = \"30\"", p).is_err());
        assert!(Config::parse("memory = \"1K\"", p).is_err());
        assert!(Config::parse("isolation = \"strict\"", p).is_ok());
        assert!(Config::parse("keep = []", p).unwrap().keep_rules().unwrap().is_empty());
        assert!(Config::parse("", p).unwrap().limits.to_limits().caches, "caches are on by default");
        let c = Config::parse("no_caches = true", p).unwrap();
        assert!(!c.limits.to_limits().caches && c.widening().is_empty(), "turning caches off only narrows");
        assert!(Config::parse("keep = [\".git\"]", p).is_err(), "version control is never kept");
        assert!(Config::parse("keep = [\"../x\"]", p).is_err());
    }

    #[test]
    fn widening_keys() {
        let p = Path::new("c.toml");
        let w = |t: &str| Config::parse(t, p).unwrap().widening();
        assert!(w("timeout = 5\nmemory = \"1G\"\nnetwork = \"none\"\nisolation = \"strict\"").is_empty());
        assert_eq!(w("network = \"host\""), ["network"]);
        // Hosts reached through the proxy widen; an empty list only narrows.
        assert_eq!(w("allow_hosts = [\"a.example\", \"@pypi\"]"), ["allow_hosts"]);
        assert_eq!(w("network = \"host\"\nallow_hosts = [\"a.example\"]"), ["network", "allow_hosts"]);
        assert!(w("allow_hosts = []").is_empty());
        assert!(Config::parse("allow_hosts = [\"*\"]", p).is_err(), "a bad item is an error, not ignored");
        // Above the defaults a run gets without them: widening too.
        assert_eq!(w("timeout = 86400\npids = 1000000\nmax_write = \"100G\""), ["timeout", "pids", "max_write"]);
        assert!(w("timeout = 3600\npids = 100\nmax_write = \"1G\"").is_empty());
        assert_eq!(w("workspace = \"/\"\nstate_dir = \"/s\"\npolicy = \"/p\"\npass_env = [\"T\"]").len(), 4);
        assert_eq!(w("retain_count = 0\nretain_size = \"1G\"\nretain_min_free = \"5%\"").len(), 3);
        // Keeping less narrows; keeping another directory widens.
        assert!(w("keep = []\n").is_empty());
        assert!(w("keep = [\"target\"]\n").is_empty());
        assert_eq!(w("keep = [\"target\", \"src\"]\n"), ["keep"]);
    }

    #[test]
    fn a_widening_file_inside_a_workspace_is_refused_a_narrowing_one_is_used() {
        let dir = std::env::temp_dir().join(format!("txbox-config-test-{}", std::process::id()));
        let ws = dir.join("ws");
        std::fs::create_dir_all(ws.join(".config/txbox")).unwrap();
        let file = ws.join(".config/txbox/config.toml");
        let src = Source { path: file.clone(), required: true };
        let untrusted = Untrusted { workspaces: vec![ws.clone()], ..Untrusted::default() };
        std::fs::write(&file, "network = \"host\"\n").unwrap();
        let e = Config::load(Some(&src), &untrusted).unwrap_err();
        assert!(e.message.contains("network") && e.message.contains("inside the workspace"), "{e:?}");
        // Through a symlink from outside, and naming the workspace by `..`: still inside.
        let link = dir.join("cfg.toml");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = Config::load(Some(&Source { path: link, required: true }), &untrusted).unwrap_err();
        assert!(e.message.contains("refused"), "{e:?}");
        std::fs::write(&file, "timeout = 5\nnetwork = \"none\"\n").unwrap();
        assert!(Config::load(Some(&src), &untrusted).is_ok());
        // The same widening file outside every untrusted place is used.
        let outside = dir.join("outside.toml");
        std::fs::write(&outside, "network = \"host\"\n").unwrap();
        let c = Config::load(Some(&Source { path: outside, required: true }), &untrusted).unwrap();
        assert!(c.limits.to_limits().host_network);
        // A file that names another workspace is judged against that one too.
        std::fs::write(dir.join("ws2.toml"), format!("workspace = \"{}\"\n", dir.display())).unwrap();
        let e = Config::load(Some(&Source { path: dir.join("ws2.toml"), required: true }), &Untrusted::default());
        assert!(e.is_err(), "a file inside the workspace it names");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
