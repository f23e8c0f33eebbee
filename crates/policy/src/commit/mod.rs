//! The commit-time policy: rules over what a transaction changes, judged after the command ran
//! and before anything reaches the workspace. They catch *delayed escapes*: files the host runs
//! later by itself (git hooks, git settings that name programs, `.envrc`, editor tasks run on
//! folder open, agent settings with hooks). A match `hold`s the transaction for a person,
//! `deny` rolls it back, `allow` lets it through.
//!
//! ```toml
//! [[commit]]
//! id = "commit.git-config-exec"
//! action = "hold"                       # hold | deny | allow
//! reason = "{path} sets {key}, which makes git on the host run a program"
//! examples.match = [".git/config: core.fsmonitor=./fsmon"]
//! examples.no_match = [".git/config: user.name=dev"]
//! [[commit.when]]                        # alternatives; every field given must hold
//! paths = ["**/.git/config", "{git_includes}"]
//! git_config_keys = ["core.fsmonitor", "alias.*=!*"]
//! ```
//!
//! - `paths`: workspace-relative patterns, component by component (`*` within a component,
//!   `**` any number of them, a leading `**/` at any depth); `paths_none` excludes. Two
//!   placeholders name places the workspace's own git settings point to (read from
//!   `.git/config` before and after the change): `{hooks_path}` the directory of
//!   `core.hooksPath` when it lies in the workspace, `{git_includes}` the files that
//!   `include.path` and `includeIf.*.path` include from the workspace.
//! - Without a content field an alternative matches a path that is added or modified (a new
//!   file, new content, a new mode or owner, a type change); deletions never match.
//! - `git_config_keys`: the file is read as git configuration on both sides, and only the keys
//!   whose values changed count (`key` or `key=value` globs; keys are `section.name` or
//!   `section.subsection.name`, compared in lower case). `json_keys`: the same for JSON with
//!   comments, by the dotted path of each changed value or of any object above it.
//!   Content that cannot be judged (not a regular file, too large, not parseable) matches.
//! - A symlink that stands where a directory on the way to a protected path would be (`.git`
//!   itself, `.git/hooks`, `.claude`) matches too: it leads the host elsewhere; so does a
//!   regular file named `.git` (`gitdir: elsewhere`).
//!
//! Examples are paths (`.git/hooks/pre-commit`) or a path with one changed key
//! (`.git/config: core.fsmonitor=x`), judged with `core.hooksPath = .husky` and one include,
//! `.gitconfig`.

mod gitconfig;
mod jsonc;
mod pathpat;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::rules::{Examples, Override, Pat};
use pathpat::{components, PathPat};

/// What a commit rule does with a change it matches. Strictest wins: `Deny` > `Hold` > `Allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitAction {
    Allow,
    Hold,
    Deny,
}

impl CommitAction {
    pub fn as_str(self) -> &'static str {
        match self {
            CommitAction::Allow => "allow",
            CommitAction::Hold => "hold",
            CommitAction::Deny => "deny",
        }
    }

    fn parse(s: Option<&str>) -> Result<CommitAction, String> {
        match s {
            Some("hold") => Ok(CommitAction::Hold),
            Some("deny") => Ok(CommitAction::Deny),
            Some("allow") => Ok(CommitAction::Allow),
            Some(other) => Err(format!("unknown commit action `{other}` (hold, deny, allow)")),
            None => Err("missing `action`".into()),
        }
    }
}

/// One commit rule as written (`[[commit]]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CommitRuleSpec {
    pub id: crate::placed::Placed<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// As for command rules: weakening a built-in commit rule must say so.
    #[serde(default, rename = "override", skip_serializing_if = "Option::is_none")]
    pub override_: Option<Override>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples: Option<Examples>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<CommitMatchSpec>,
}

/// One alternative of a commit rule as written.
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct CommitMatchSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths_none: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub git_config_keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub json_keys: Vec<String>,
}

/// A path pattern, possibly anchored at a place the workspace's git settings name.
#[derive(Debug, Clone)]
enum PathSrc {
    Static(PathPat),
    /// `{hooks_path}/REST`
    HooksPath(PathPat),
    /// `{git_includes}`
    GitIncludes,
}

/// A `git_config_keys` entry: a key glob and, optionally, a value glob.
#[derive(Debug, Clone)]
struct KeyPat {
    key: Pat,
    value: Option<Pat>,
}

#[derive(Debug, Clone)]
enum Content {
    /// The path alone decides.
    Path,
    GitConfig(Vec<KeyPat>),
    Json(Vec<Pat>),
}

#[derive(Debug, Clone)]
struct Alt {
    paths: Vec<PathSrc>,
    paths_none: Vec<PathPat>,
    content: Content,
}

/// A compiled commit rule.
#[derive(Debug, Clone)]
pub(crate) struct CommitRule {
    pub id: String,
    pub action: CommitAction,
    reason: String,
    when: Vec<Alt>,
}

impl CommitRule {
    pub fn compile(spec: &CommitRuleSpec) -> Result<CommitRule, String> {
        let action = CommitAction::parse(spec.action.as_deref())?;
        let reason = spec.reason.clone().ok_or("missing `reason`")?;
        if spec.when.is_empty() {
            return Err("no `when` conditions: a commit rule must say what it matches".into());
        }
        let when = spec.when.iter().map(compile_alt).collect::<Result<_, _>>()?;
        Ok(CommitRule { id: spec.id.get_ref().clone(), action, reason, when })
    }

    /// Whether any alternative reads the workspace's git settings.
    fn dynamic(&self) -> bool {
        self.when.iter().any(|a| a.paths.iter().any(|p| !matches!(p, PathSrc::Static(_))))
    }
}

fn compile_alt(s: &CommitMatchSpec) -> Result<Alt, String> {
    if s.paths.is_empty() {
        return Err("`paths` is required: a commit rule matches paths".into());
    }
    let mut paths = Vec::new();
    for p in &s.paths {
        paths.push(if p == "{git_includes}" {
            PathSrc::GitIncludes
        } else if let Some(rest) = p.strip_prefix("{hooks_path}/") {
            PathSrc::HooksPath(PathPat::new(rest).map_err(|e| format!("`paths`: {e}"))?)
        } else if p.contains(['{', '}']) {
            return Err(format!("`paths`: unknown placeholder in `{p}` (known: {{hooks_path}}/…, {{git_includes}})"));
        } else {
            PathSrc::Static(PathPat::new(p).map_err(|e| format!("`paths`: {e}"))?)
        });
    }
    let paths_none = s
        .paths_none
        .iter()
        .map(|p| PathPat::new(p).map_err(|e| format!("`paths_none`: {e}")))
        .collect::<Result<_, _>>()?;
    let lower = |v: &str| Pat::new(&v.to_ascii_lowercase());
    let content = match (s.git_config_keys.is_empty(), s.json_keys.is_empty()) {
        (true, true) => Content::Path,
        (false, true) => Content::GitConfig(
            s.git_config_keys
                .iter()
                .map(|k| {
                    let (key, value) = match k.split_once('=') {
                        Some((k, v)) => (k, Some(Pat::new(v)?)),
                        None => (k.as_str(), None),
                    };
                    if key.is_empty() {
                        return Err(format!("`git_config_keys`: empty key in `{k}`"));
                    }
                    Ok(KeyPat { key: lower(key)?, value })
                })
                .collect::<Result<_, String>>()?,
        ),
        (true, false) => Content::Json(s.json_keys.iter().map(|k| lower(k)).collect::<Result<_, _>>()?),
        (false, false) => return Err("one of `git_config_keys` and `json_keys` per alternative".into()),
    };
    Ok(Alt { paths, paths_none, content })
}

/// How a path changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One path a commit changes, relative to the workspace (lossy UTF-8, `/`-separated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitChange {
    pub path: String,
    pub change: ChangeKind,
}

/// What an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    Absent,
    File,
    Dir,
    Symlink,
    Other,
}

impl ObjectKind {
    fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Absent => "nothing",
            ObjectKind::File => "file",
            ObjectKind::Dir => "directory",
            ObjectKind::Symlink => "symlink",
            ObjectKind::Other => "special file",
        }
    }
}

/// The content of a path on one side of the commit, as the caller could read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileContent {
    Absent,
    Regular(Vec<u8>),
    /// Not a regular file (never followed: a symlink is judged as one).
    NotRegular(ObjectKind),
    /// Could not be read, or too large to judge: the reason.
    Unreadable(String),
}

/// The two sides of a commit, provided by the caller: the only input the judge does not own.
pub trait CommitFiles {
    /// The workspace's absolute path (git settings may name paths in it absolutely).
    fn workspace(&self) -> &Path;
    /// What `path` is once committed.
    fn kind_after(&self, path: &str) -> ObjectKind;
    /// `path` in the workspace now.
    fn before(&self, path: &str) -> FileContent;
    /// `path` as the commit would leave it (the transaction's object, or the workspace's where
    /// the transaction did not touch it).
    fn after(&self, path: &str) -> FileContent;
}

/// A commit rule's verdict on one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommitFinding {
    pub path: String,
    pub rule: String,
    pub action: CommitAction,
    pub reason: String,
}

/// The compiled commit rules of a policy, with the index that keeps judging cheap: a changed
/// path none of whose components is a literal component of some pattern is not looked at.
#[derive(Debug, Clone, Default)]
pub(crate) struct CommitRules {
    rules: Vec<CommitRule>,
    /// Literal components of every static pattern.
    anchors: HashSet<String>,
    /// Some static pattern has no literal component (every path is a candidate).
    any_path: bool,
    /// Some rule reads the workspace's git settings.
    dynamic: bool,
}

/// The places the workspace's git settings point to, in the workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GitPlaces {
    /// `core.hooksPath` directories (before and after), workspace-relative.
    pub hooks_dirs: Vec<String>,
    /// Files `.git/config` includes (and they include in turn), workspace-relative.
    pub includes: Vec<String>,
}

/// The workspace's main git configuration file.
const GIT_CONFIG: &str = ".git/config";
/// How many included files are followed (includes of includes count).
const MAX_INCLUDES: usize = 8;

impl CommitRules {
    pub fn new(rules: Vec<CommitRule>) -> CommitRules {
        let mut out = CommitRules { dynamic: rules.iter().any(CommitRule::dynamic), ..CommitRules::default() };
        for alt in rules.iter().flat_map(|r| r.when.iter()) {
            for p in &alt.paths {
                if let PathSrc::Static(p) = p {
                    let mut any = false;
                    for l in p.literals() {
                        out.anchors.insert(l.to_string());
                        any = true;
                    }
                    out.any_path |= !any;
                }
            }
        }
        out.rules = rules;
        out
    }

    pub fn rules(&self) -> &[CommitRule] {
        &self.rules
    }

    /// Judge a change set: the findings of `hold` and `deny` rules, the strictest per path.
    pub fn judge(&self, changes: &[CommitChange], files: &dyn CommitFiles) -> Vec<CommitFinding> {
        if self.rules.is_empty() || changes.is_empty() {
            return Vec::new();
        }
        let places = if self.dynamic { git_places(changes, files) } else { GitPlaces::default() };
        let mut anchors_extra: HashSet<&str> = HashSet::new();
        for d in places.hooks_dirs.iter().chain(&places.includes) {
            anchors_extra.extend(components(d));
        }
        let mut best: BTreeMap<&str, CommitFinding> = BTreeMap::new();
        for c in changes {
            let comps = components(&c.path);
            let candidate =
                self.any_path || comps.iter().any(|x| self.anchors.contains(*x) || anchors_extra.contains(x));
            if !candidate {
                continue;
            }
            for rule in self.rules.iter().filter(|r| r.action > CommitAction::Allow) {
                if best.get(c.path.as_str()).is_some_and(|b| b.action >= rule.action) {
                    continue;
                }
                let keys = |format: Format| {
                    let (old, new) = (files.before(&c.path), files.after(&c.path));
                    changed_keys(format, &old, &new)
                };
                if let Some(reason) = rule_matches(rule, c, &comps, &places, files, &keys) {
                    best.insert(
                        &c.path,
                        CommitFinding { path: c.path.clone(), rule: rule.id.clone(), action: rule.action, reason },
                    );
                }
            }
        }
        best.into_values().collect()
    }
}

type KeysResult = Result<Vec<(String, Option<String>)>, String>;

#[derive(Clone, Copy)]
enum Format {
    Git,
    Json,
}

/// Whether `rule` matches change `c`; the rendered reason when it does. `keys` gives the
/// changed keys of the file read in a format (for alternatives that judge content), computed
/// at most once per format.
fn rule_matches(
    rule: &CommitRule,
    c: &CommitChange,
    comps: &[&str],
    places: &GitPlaces,
    files: &dyn CommitFiles,
    keys: &dyn Fn(Format) -> KeysResult,
) -> Option<String> {
    let mut git_keys: Option<KeysResult> = None;
    let mut json_keys: Option<KeysResult> = None;
    let mut new_kind: Option<ObjectKind> = None;
    for alt in &rule.when {
        let excluded = || alt.paths_none.iter().any(|p| p.matches(comps));
        if alt_paths(alt, places, |p| p.matches(comps)) && !excluded() {
            match &alt.content {
                Content::Path => {
                    if c.change != ChangeKind::Deleted {
                        return Some(render(&rule.reason, &c.path, None));
                    }
                }
                content => {
                    let ks = match content {
                        Content::Json(_) => json_keys.get_or_insert_with(|| keys(Format::Json)),
                        _ => git_keys.get_or_insert_with(|| keys(Format::Git)),
                    };
                    match ks {
                        Err(why) => {
                            return Some(format!(
                                "{}: cannot be judged by its keys ({why}), so {} takes it whole",
                                c.path, rule.id
                            ))
                        }
                        Ok(ks) => {
                            if let Some(k) = ks.iter().find(|k| content_matches(content, k)) {
                                return Some(render(&rule.reason, &c.path, Some(&k.0)));
                            }
                        }
                    }
                }
            }
        } else if c.change != ChangeKind::Deleted && !excluded() && alt_paths(alt, places, |p| p.guards(comps)) {
            // A symlink leads anywhere; of regular files only git's `.git` file does (it names
            // the git directory to use: `gitdir: elsewhere`).
            let kind = *new_kind.get_or_insert_with(|| files.kind_after(&c.path));
            let redirects = kind == ObjectKind::Symlink || (kind == ObjectKind::File && comps.last() == Some(&".git"));
            if redirects {
                return Some(format!(
                    "{}: a {} where rule {} expects a directory on the way to what it protects; it would lead the \
                     host elsewhere",
                    c.path,
                    kind.as_str(),
                    rule.id
                ));
            }
        }
    }
    None
}

/// Whether `test` holds for one of the alternative's patterns, placeholders expanded.
fn alt_paths(alt: &Alt, places: &GitPlaces, test: impl Fn(&PathPat) -> bool) -> bool {
    alt.paths.iter().any(|p| match p {
        PathSrc::Static(p) => test(p),
        PathSrc::HooksPath(rest) => places.hooks_dirs.iter().any(|d| test(&PathPat::literal_prefix(d, rest))),
        PathSrc::GitIncludes => places.includes.iter().any(|f| test(&PathPat::literal_prefix(f, &PathPat::EMPTY))),
    })
}

fn content_matches(content: &Content, (key, value): &(String, Option<String>)) -> bool {
    let key_l = key.to_ascii_lowercase();
    match content {
        Content::Path => false,
        Content::GitConfig(pats) => pats.iter().any(|p| {
            p.key.matches(&key_l)
                && p.value
                    .as_ref()
                    .is_none_or(|v| value.as_deref().is_some_and(|x| v.matches(x) || v.matches(x.trim())))
        }),
        Content::Json(pats) => {
            // The leaf's path and every object above it.
            let mut prefixes = vec![key_l.as_str()];
            prefixes.extend(key_l.match_indices('.').map(|(i, _)| &key_l[..i]));
            pats.iter().any(|p| prefixes.iter().any(|x| p.matches(x)))
        }
    }
}

fn render(reason: &str, path: &str, key: Option<&str>) -> String {
    let r = reason.replace("{path}", path);
    match key {
        Some(k) => r.replace("{key}", k),
        None => r.replace("{key}", "?"),
    }
}

/// The keys whose values differ between two versions of a file, with their new value; only
/// keys present in the new version count (removing a setting runs nothing new). A file that
/// cannot be judged is an error; an old version that does not parse counts as empty.
fn changed_keys(format: Format, old: &FileContent, new: &FileContent) -> KeysResult {
    let parse = |b: &[u8]| -> Result<Vec<(String, Option<String>)>, String> {
        match format {
            Format::Git => Ok(gitconfig::parse(b)?.into_iter().map(|s| (s.key, s.value)).collect()),
            Format::Json => Ok(jsonc::leaves(b)?.into_iter().map(|(k, v)| (k, Some(v))).collect()),
        }
    };
    let new = match new {
        FileContent::Absent => return Ok(Vec::new()),
        FileContent::Regular(b) => parse(b).map_err(|e| format!("does not parse: {e}"))?,
        FileContent::NotRegular(k) => return Err(format!("a {}, not a regular file", k.as_str())),
        FileContent::Unreadable(why) => return Err(why.clone()),
    };
    let old = match old {
        FileContent::Regular(b) => parse(b).unwrap_or_default(),
        _ => Vec::new(),
    };
    let group = |v: &[(String, Option<String>)]| {
        let mut m: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
        for (k, val) in v {
            m.entry(k.to_ascii_lowercase()).or_default().push(val.clone());
        }
        m
    };
    let (before, after) = (group(&old), group(&new));
    let mut out = Vec::new();
    for (k, vals) in &after {
        if before.get(k) != Some(vals) {
            // The display name as written last; its last value is the one in force.
            let shown = new.iter().rev().find(|(n, _)| n.eq_ignore_ascii_case(k)).map_or(k.clone(), |(n, _)| n.clone());
            for v in vals {
                out.push((shown.clone(), v.clone()));
            }
        }
    }
    Ok(out)
}

/// The hooks directories and included files the workspace's `.git/config` names, before and
/// after the change (and those the included files name in turn, up to [`MAX_INCLUDES`]).
fn git_places(changes: &[CommitChange], files: &dyn CommitFiles) -> GitPlaces {
    let changed: HashSet<&str> = changes.iter().map(|c| c.path.as_str()).collect();
    let mut out = GitPlaces::default();
    let mut todo = vec![GIT_CONFIG.to_string()];
    let mut seen: Vec<String> = Vec::new();
    while let Some(file) = todo.pop() {
        if seen.contains(&file) || seen.len() > MAX_INCLUDES {
            continue;
        }
        seen.push(file.clone());
        let mut sides = vec![files.before(&file)];
        if changed.contains(file.as_str()) {
            sides.push(files.after(&file));
        }
        let base = file.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        for side in sides {
            let FileContent::Regular(bytes) = side else { continue };
            let Ok(settings) = gitconfig::parse(&bytes) else { continue };
            for s in settings {
                let Some(v) = s.value.as_deref() else { continue };
                let k = s.key.as_str();
                if k == "core.hookspath" && file == GIT_CONFIG {
                    // Relative to where hooks run: the top of the working tree.
                    if let Some(d) = in_workspace("", v, files.workspace()) {
                        push_new(&mut out.hooks_dirs, d);
                    }
                } else if k == "include.path" || (k.starts_with("includeif.") && k.ends_with(".path")) {
                    if let Some(f) = in_workspace(&base, v, files.workspace()) {
                        push_new(&mut out.includes, f.clone());
                        todo.push(f);
                    }
                }
            }
        }
    }
    out
}

fn push_new(v: &mut Vec<String>, s: String) {
    if !v.contains(&s) {
        v.push(s);
    }
}

/// A path named in a setting, as a workspace-relative path when it lies in the workspace:
/// relative ones against `base` (workspace-relative), absolute ones under `workspace`.
/// `~` and git's `%(prefix)` name places outside.
fn in_workspace(base: &str, value: &str, workspace: &Path) -> Option<String> {
    if value.is_empty() || value.starts_with('~') || value.starts_with("%(") {
        return None;
    }
    let joined = if let Some(abs) = value.strip_prefix('/') {
        let ws = workspace.to_string_lossy();
        let ws = ws.trim_end_matches('/').trim_start_matches('/');
        let rest = abs.strip_prefix(ws)?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        rest.to_string()
    } else {
        format!("{base}/{value}")
    };
    let mut out: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    (!out.is_empty()).then(|| out.join("/"))
}

/// One example of a commit rule: `PATH` or `PATH: KEY[=VALUE]`.
fn parse_example(e: &str) -> (String, Option<(String, Option<String>)>) {
    match e.split_once(": ") {
        Some((path, kv)) => {
            let (k, v) = match kv.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (kv.to_string(), None),
            };
            (path.to_string(), Some((k, v)))
        }
        None => (e.to_string(), None),
    }
}

/// The git places examples are judged with.
fn example_places() -> GitPlaces {
    GitPlaces { hooks_dirs: vec![".husky".into()], includes: vec![".gitconfig".into()] }
}

/// Files for examples: nothing to read; the changed path is a symlink when the example's
/// path ends in `/` (an object in front of what a rule protects), else a regular file.
struct ExampleFiles {
    symlink: bool,
}

impl CommitFiles for ExampleFiles {
    fn workspace(&self) -> &Path {
        Path::new("/home/dev/proj")
    }
    fn kind_after(&self, _: &str) -> ObjectKind {
        if self.symlink {
            ObjectKind::Symlink
        } else {
            ObjectKind::File
        }
    }
    fn before(&self, _: &str) -> FileContent {
        FileContent::Absent
    }
    fn after(&self, _: &str) -> FileContent {
        FileContent::Absent
    }
}

/// Whether `rule` matches one example.
pub(crate) fn example_matches(rule: &CommitRule, example: &str) -> bool {
    let (path, key) = parse_example(example);
    let c = CommitChange { path: path.trim_end_matches('/').to_string(), change: ChangeKind::Added };
    let comps = components(&c.path);
    let keys = |_: Format| -> KeysResult { Ok(key.clone().into_iter().collect()) };
    let files = ExampleFiles { symlink: path.ends_with('/') };
    rule_matches(rule, &c, &comps, &example_places(), &files, &keys).is_some()
}

/// How the user's version of a built-in commit rule weakens it, if it does (as for command
/// rules: disabled, action lowered, or what it matches replaced).
pub(crate) fn weakens(base: &CommitRuleSpec, user: &CommitRuleSpec) -> Option<String> {
    let action = |s: &CommitRuleSpec| CommitAction::parse(s.action.as_deref()).unwrap_or(CommitAction::Allow);
    let (was, now) = (action(base), action(user));
    let mut how = Vec::new();
    if user.enabled == Some(false) && base.enabled != Some(false) && was > CommitAction::Allow {
        how.push("disables it".to_string());
    }
    if now < was {
        how.push(format!("lowers its action from {} to {}", was.as_str(), now.as_str()));
    }
    if user.when != base.when {
        how.push("replaces what it matches".to_string());
    }
    (!how.is_empty()).then(|| how.join(", "))
}

#[cfg(test)]
mod tests;
