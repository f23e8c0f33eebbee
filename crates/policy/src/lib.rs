//! txbox policy: decide, before anything runs, whether a command is denied, allowed, or run as a
//! transaction. Pure code: no syscalls, no filesystem access, so every rule is unit-testable.
//!
//! The public surface is [`Policy`], [`Context`], [`Evaluation`] and [`Decision`]. Front ends and
//! the transaction layer depend only on these types, so the engine behind them can grow
//! (full shell parsing, policy files) without changing its callers.

mod builtin;
mod commit;
mod extract;
mod glob;
mod index;
pub mod paths;
mod placed;
mod rules;
mod words;
mod writes;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::Serialize;

pub use commit::{ChangeKind, CommitAction, CommitChange, CommitFiles, CommitFinding, FileContent, ObjectKind};

/// What the engine decided. Strictest wins when several rules match: `Deny` > `Transact` > `Allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Transact,
    Deny,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Transact => "transact",
            Action::Deny => "deny",
        }
    }
}

/// A decision with the rule that produced it and a one-line reason an agent can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub action: Action,
    pub rule: Option<String>,
    pub reason: String,
}

impl Decision {
    /// The decision when no rule matched: run the command as a transaction.
    pub fn default_transact() -> Self {
        Decision {
            action: Action::Transact,
            rule: None,
            reason: "no rule matched; the command runs as a transaction".to_string(),
        }
    }
}

/// Where the command would run: used to classify path arguments (inside the workspace, home, ...).
#[derive(Debug, Clone)]
pub struct Context {
    pub workspace: PathBuf,
    pub cwd: PathBuf,
    pub home: Option<PathBuf>,
    /// Places outside the workspace the sandbox keeps writable (package caches): writing there
    /// is like writing to `/tmp`.
    pub writable: Vec<PathBuf>,
}

/// The result of evaluating one command string or argv.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub decision: Decision,
    /// The canonical argv of every command the engine extracted.
    pub commands: Vec<Vec<String>>,
}

/// A built-in rule a policy file weakens, on purpose (`override = "weaken"`): what `policy show`
/// and `policy lint` report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Weakening {
    /// The built-in rule's id.
    pub rule: String,
    /// What the file does to it: `disables it`, `lowers its action from deny to transact`,
    /// `replaces what it matches`.
    pub how: String,
}

/// How `user` (the merged rule) weakens the built-in rule `base`, if it does. A rule weakens
/// when it is disabled or its action lowered (unless it was an `allow` rule: disabling or
/// raising one only makes the policy stricter), or when what it matches is replaced: a deny
/// or transact rule may then match less, an allow rule more.
fn weakens(base: &rules::RuleSpec, user: &rules::RuleSpec) -> Option<String> {
    let action = |s: &rules::RuleSpec| match s.action.as_deref() {
        Some("deny") => Action::Deny,
        Some("transact") => Action::Transact,
        _ => Action::Allow,
    };
    let (was, now) = (action(base), action(user));
    let mut how = Vec::new();
    if user.enabled == Some(false) && base.enabled != Some(false) && was > Action::Allow {
        how.push("disables it".to_string());
    }
    if now < was {
        how.push(format!("lowers its action from {} to {}", was.as_str(), now.as_str()));
    }
    if user.when != base.when {
        how.push("replaces what it matches".to_string());
    }
    if how.is_empty() {
        None
    } else {
        Some(how.join(", "))
    }
}

/// Why a policy could not be loaded. Displays as `file:line:col: rule `id`: message`.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}:{line}:{col}: {}{message}", rule.as_ref().map(|r| format!("rule `{r}`: ")).unwrap_or_default())]
    Invalid { file: String, line: usize, col: usize, rule: Option<String>, message: String },
}

impl PolicyError {
    fn at(file: &str, text: &str, offset: usize, rule: Option<&str>, message: impl Into<String>) -> Self {
        let (line, col) = line_col(text, offset);
        PolicyError::Invalid {
            file: file.to_string(),
            line,
            col,
            rule: rule.map(str::to_string),
            message: message.into(),
        }
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map(|i| before[i + 1..].chars().count()).unwrap_or(before.chars().count()) + 1;
    (line, col)
}

/// Which rules `Policy::build` checks (regexes compiled, inline examples evaluated).
#[derive(Clone, Copy)]
enum Check<'a> {
    Nothing,
    /// Every rule (the test that holds the built-in policy to its examples).
    #[cfg_attr(not(test), allow(dead_code))]
    All,
    /// The rules with these ids.
    Only(&'a [String]),
}

#[derive(Debug)]
struct Compiled {
    /// Effective rule specs, in order (disabled ones kept for `to_toml`); empty for the
    /// built-in policy as `Policy::builtin` loads it (`stripped`).
    specs: Vec<rules::RuleSpec>,
    /// Enabled rules, in policy order.
    rules: Vec<LazyRule>,
    /// Which rules may match a program.
    index: Index,
    /// Rules whose programs are patterns (`mkfs.*`) or paths (`/etc/init.d/*`).
    by_pattern: Vec<(rules::Pat, u32)>,
    /// The built-in policy without its inline examples (`Policy::builtin`): `to_toml` shows
    /// the whole built-in text instead.
    stripped: bool,
    /// Built-in rules the user file weakens (each with `override = "weaken"`).
    weakened: Vec<Weakening>,
    /// The file's `allow_hosts` (network by allowlist for every command under this policy).
    allow_hosts: Vec<String>,
    /// Effective commit rule specs, in order (disabled ones kept for `to_toml`).
    commit_specs: Vec<commit::CommitRuleSpec>,
    /// The enabled commit rules, compiled and indexed: when the policy is built for a policy
    /// file, else (the built-in policy) on first use, from `builtin::COMMIT`.
    commit: OnceLock<commit::CommitRules>,
}

/// An enabled rule: compiled when a policy file is loaded (its errors are the file's), or, in
/// the built-in policy, from its JSON when a command first meets it (#18).
#[derive(Debug)]
struct LazyRule {
    id: String,
    /// The rule as JSON (`builtin::RULES`); empty when compiled at load.
    json: &'static str,
    rule: OnceLock<rules::Rule>,
}

impl LazyRule {
    fn compiled(rule: rules::Rule) -> LazyRule {
        LazyRule { id: rule.id.clone(), json: "", rule: OnceLock::from(rule) }
    }

    fn get(&self) -> &rules::Rule {
        self.rule.get_or_init(|| builtin::compile_rule(&self.id, self.json))
    }
}

/// Rule indexes by program.
#[derive(Debug)]
enum Index {
    /// The built-in policy's, computed by build.rs (`builtin::candidates`).
    Builtin,
    /// A policy file's: by literal program name, the generic ones merged in, in policy order;
    /// and the rules that may match any program.
    Built { by_program: HashMap<String, Vec<u32>>, generic: Vec<u32> },
}

/// A loaded policy: the built-in default, possibly with a user file merged over it.
#[derive(Debug, Clone)]
pub struct Policy {
    inner: Arc<Compiled>,
}

const BUILTIN_TOML: &str = include_str!("builtin.toml");

/// The built-in policy with its inline examples: what user files merge over, `show` and `lint`.
fn builtin_cell() -> &'static Result<Policy, String> {
    static CELL: OnceLock<Result<Policy, String>> = OnceLock::new();
    CELL.get_or_init(|| {
        let spec = parse_file(BUILTIN_TOML, "<builtin>").map_err(|e| e.to_string())?;
        Policy::build(spec.rules, spec.commit, BUILTIN_TOML, "<builtin>", Check::Nothing).map_err(|e| e.to_string())
    })
}

/// The built-in policy as every `txbox run` without a policy file loads it: build.rs's tables
/// (`builtin`), without the inline examples (only tests and `lint` check them), each rule
/// compiled when a command first meets it. Loading the whole policy cost ~1 ms per process
/// as TOML and ~0.7 ms as JSON; now nothing until used (#18). `builtin_tables_are_the_policy`
/// checks that the tables are the TOML's policy.
fn runtime_cell() -> &'static Policy {
    static CELL: OnceLock<Policy> = OnceLock::new();
    CELL.get_or_init(|| Policy {
        inner: Arc::new(Compiled {
            specs: Vec::new(),
            rules: builtin::RULES
                .iter()
                .map(|(id, json)| LazyRule { id: (*id).to_string(), json, rule: OnceLock::new() })
                .collect(),
            index: Index::Builtin,
            by_pattern: builtin::patterns(),
            stripped: true,
            weakened: Vec::new(),
            allow_hosts: Vec::new(),
            commit_specs: Vec::new(),
            commit: OnceLock::new(),
        }),
    })
}

fn parse_file(text: &str, origin: &str) -> Result<rules::FileSpec, PolicyError> {
    let spec: rules::FileSpec = toml::from_str(text).map_err(|e| {
        let off = e.span().map(|s| s.start).unwrap_or(0);
        PolicyError::at(origin, text, off, None, e.message().trim().to_string())
    })?;
    if *spec.version.get_ref() != 1 {
        return Err(PolicyError::at(
            origin,
            text,
            spec.version.span().start,
            None,
            format!("unsupported version {} (expected 1)", spec.version.get_ref()),
        ));
    }
    Ok(spec)
}

/// The context examples are evaluated in.
pub fn example_context() -> Context {
    Context {
        workspace: PathBuf::from("/home/dev/proj"),
        cwd: PathBuf::from("/home/dev/proj"),
        home: Some(PathBuf::from("/home/dev")),
        writable: vec![PathBuf::from("/home/dev/.npm")],
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::builtin()
    }
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.to_toml() == other.to_toml()
    }
}

impl Policy {
    /// The built-in default policy (`src/builtin.toml`, as build.rs compiled it: each rule
    /// read when a command first meets it).
    pub fn builtin() -> Self {
        runtime_cell().clone()
    }

    /// Load a policy file merged over the built-in policy.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| PolicyError::Io { file: path.display().to_string(), source })?;
        Policy::from_toml_str(&text, &path.display().to_string())
    }

    /// Parse policy text (`origin` names it in errors) and merge it over the built-in policy.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let user = parse_file(text, origin)?;
        let (base, commit_base) = match builtin_cell() {
            Ok(p) => (p.inner.specs.clone(), p.inner.commit_specs.clone()),
            Err(e) => return Err(PolicyError::at("<builtin>", "", 0, None, e.clone())),
        };
        let mut specs = base;
        let mut seen: Vec<String> = Vec::new();
        let mut weakened = Vec::new();
        for r in user.rules {
            let id = r.id.get_ref().clone();
            if seen.contains(&id) {
                return Err(PolicyError::at(origin, text, r.id.span().start, Some(&id), "duplicate rule id"));
            }
            seen.push(id.clone());
            if let Some(b) = specs.iter_mut().find(|s| s.id.get_ref() == &id) {
                let b_examples = b.examples.clone();
                let mut merged = r.clone();
                if merged.action.is_none() {
                    merged.action = b.action.clone();
                }
                if merged.reason.is_none() {
                    merged.reason = b.reason.clone();
                }
                if merged.when.is_empty() {
                    merged.when = b.when.clone();
                    if merged.examples.is_none() {
                        merged.examples = b_examples;
                    }
                }
                if let Some(how) = weakens(b, &merged) {
                    if merged.override_ != Some(rules::Override::Weaken) {
                        return Err(PolicyError::at(
                            origin,
                            text,
                            r.id.span().start,
                            Some(&id),
                            format!(
                                "weakens the built-in rule ({how}); add `override = \"weaken\"` to the rule if that is \
                                 meant"
                            ),
                        ));
                    }
                    weakened.push(Weakening { rule: id.clone(), how });
                }
                *b = merged;
            } else {
                specs.push(r);
            }
        }
        let commit_specs = merge_commit_rules(commit_base, user.commit, text, origin, &mut seen, &mut weakened)?;
        // The rules this file adds or changes are checked (regexes, inline examples, inherited
        // ones included); the untouched built-in rules were checked by the tests, and checking
        // all of them again cost ~3 ms on every run with --policy.
        let mut p = Policy::build(specs, commit_specs, text, origin, Check::Only(&seen))?;
        if let Some(c) = Arc::get_mut(&mut p.inner) {
            c.weakened = weakened;
            c.allow_hosts = user.allow_hosts;
        }
        Ok(p)
    }

    /// `allow_hosts` of the policy file: hosts every command under this policy may reach
    /// (`--allow-host` items, as written).
    pub fn allow_hosts(&self) -> &[String] {
        &self.inner.allow_hosts
    }

    /// The built-in rules this policy weakens on purpose (`override = "weaken"`).
    pub fn weakened(&self) -> &[Weakening] {
        &self.inner.weakened
    }

    /// Compile rules, and check the regexes and inline examples of those `check` names (the
    /// built-in policy's are checked by `builtin_examples_hold`, not on every start).
    fn build(
        specs: Vec<rules::RuleSpec>,
        commit_specs: Vec<commit::CommitRuleSpec>,
        text: &str,
        origin: &str,
        check: Check<'_>,
    ) -> Result<Policy, PolicyError> {
        let mut compiled = Vec::new();
        let mut ids: Vec<&str> = Vec::new();
        for s in &specs {
            let id = s.id.get_ref();
            let err = |m: String| PolicyError::at(origin, text, s.id.span().start, Some(id), m);
            if ids.contains(&id.as_str()) {
                return Err(err("duplicate rule id".into()));
            }
            ids.push(id);
            if id.is_empty() {
                return Err(err("empty rule id".into()));
            }
            if s.enabled == Some(false) {
                continue;
            }
            let rule = rules::Rule::compile(s).map_err(err)?;
            let check_examples = match check {
                Check::Nothing => false,
                Check::All => true,
                Check::Only(ids) => ids.iter().any(|i| i == id),
            };
            if check_examples {
                rule.validate().map_err(err)?;
            }
            // Inline examples are checked against the rule alone.
            if let Some(ex) = s.examples.as_ref().filter(|_| check_examples) {
                let ctx = example_context();
                for e in &ex.matches {
                    if !rule_matches_str(&rule, e, &ctx) {
                        return Err(err(format!("example `{e}` should match but does not")));
                    }
                }
                for e in &ex.no_match {
                    if rule_matches_str(&rule, e, &ctx) {
                        return Err(err(format!("example `{e}` should not match but does")));
                    }
                }
            }
            compiled.push(rule);
        }
        let programs: Vec<Vec<Vec<&str>>> = compiled
            .iter()
            .map(|r| r.when.iter().map(|m| m.program.iter().map(rules::Pat::source).collect()).collect())
            .collect();
        let too_many = || PolicyError::at(origin, text, 0, None, "too many rules");
        let ix = index::index(&programs).ok_or_else(too_many)?;
        let by_program: HashMap<String, Vec<u32>> =
            ix.by_program.into_iter().map(|(name, v)| (name.to_string(), v)).collect();
        let mut by_pattern = Vec::new();
        for (p, i) in ix.by_pattern {
            // Compiled with its rule already: cannot fail here.
            by_pattern.push((rules::Pat::new(p).map_err(|e| PolicyError::at(origin, text, 0, None, e))?, i));
        }
        let generic = ix.generic;
        let commit = build_commit_rules(&commit_specs, text, origin, check)?;
        Ok(Policy {
            inner: Arc::new(Compiled {
                specs,
                rules: compiled.into_iter().map(LazyRule::compiled).collect(),
                index: Index::Built { by_program, generic },
                by_pattern,
                stripped: false,
                weakened: Vec::new(),
                allow_hosts: Vec::new(),
                commit_specs,
                commit: OnceLock::from(commit),
            }),
        })
    }

    /// The effective policy as TOML; loading it gives the same policy back. Built-in rules it
    /// weakens are listed first, as comments.
    pub fn to_toml(&self) -> String {
        if self.inner.stripped {
            if let Ok(full) = builtin_cell() {
                return full.to_toml();
            }
        }
        #[derive(Serialize)]
        struct Out<'a> {
            version: i64,
            #[serde(skip_serializing_if = "<[String]>::is_empty")]
            allow_hosts: &'a [String],
            rule: &'a [rules::RuleSpec],
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            commit: &'a [commit::CommitRuleSpec],
        }
        let out = Out {
            version: 1,
            allow_hosts: &self.inner.allow_hosts,
            rule: &self.inner.specs,
            commit: &self.inner.commit_specs,
        };
        let mut text = String::new();
        for w in &self.inner.weakened {
            text.push_str(&format!("# WEAKENED built-in rule `{}`: {} (override = \"weaken\")\n", w.rule, w.how));
        }
        text.push_str(&toml::to_string(&out).unwrap_or_default());
        text
    }

    /// Ids of the enabled rules, in order.
    pub fn rule_ids(&self) -> Vec<String> {
        self.inner.rules.iter().map(|r| r.id.clone()).collect()
    }

    /// The enabled commit rules (the built-in policy's compiled on first use).
    fn commit(&self) -> &commit::CommitRules {
        self.inner.commit.get_or_init(builtin::commit_rules)
    }

    /// Ids of the enabled commit rules, in order.
    pub fn commit_rule_ids(&self) -> Vec<String> {
        self.commit().rules().iter().map(|r| r.id.clone()).collect()
    }

    /// Judge what a transaction would commit (crate::commit): the `hold` and `deny` findings,
    /// the strictest per path. Cheap when no changed path has a component any rule names.
    pub fn judge_commit(&self, changes: &[CommitChange], files: &dyn CommitFiles) -> Vec<CommitFinding> {
        self.commit().judge(changes, files)
    }

    /// Evaluate a shell string as `bash -c` would run it.
    pub fn evaluate_str(&self, command: &str, ctx: &Context) -> Evaluation {
        let ex = extract::extract_str(command, ctx);
        self.decide(ex, ctx)
    }

    /// Evaluate an argv (the `run -- PROGRAM ARGS` form). Arguments are taken literally.
    pub fn evaluate_argv(&self, argv: &[String], ctx: &Context) -> Evaluation {
        let ex = extract::extract_argv(argv, ctx);
        self.decide(ex, ctx)
    }

    /// The rules that may match a command, in policy order: those naming its program, those
    /// whose program pattern matches it, and the generic ones.
    fn candidates(&self, c: &extract::Cmd) -> std::borrow::Cow<'_, [u32]> {
        let base: &[u32] = match &self.inner.index {
            Index::Builtin => builtin::candidates(c.program()),
            Index::Built { by_program, generic } => by_program.get(c.program()).unwrap_or(generic),
        };
        let extra: Vec<u32> =
            self.inner.by_pattern.iter().filter(|(p, _)| p.matches_program(c)).map(|(_, i)| *i).collect();
        if extra.is_empty() {
            return std::borrow::Cow::Borrowed(base);
        }
        let mut all: Vec<u32> = base.iter().copied().chain(extra).collect();
        all.sort_unstable();
        all.dedup();
        std::borrow::Cow::Owned(all)
    }

    /// The strictest decision over every extracted command: per command the first rule, in
    /// policy order, of the strictest action that matches (`engine.opaque` when the command is
    /// opaque and nothing stricter matched, else the default); over the commands, the first of
    /// the strictest. Only the winner's reason is rendered, and the argvs are moved, not copied.
    fn decide(&self, ex: extract::Extraction, ctx: &Context) -> Evaluation {
        /// Where a decision comes from, before its reason is written.
        enum Why {
            ParseError,
            Rule { rule: usize, cmd: usize, path: Option<String> },
            Opaque(usize),
            Default,
        }
        // Where the extraction stopped short of what bash would run, nothing after that point
        // was judged: the whole string is refused (a deny rule could be hidden past it).
        if let Some(why) = &ex.unjudged {
            let commands = ex.cmds.into_iter().filter(|c| !c.argv.is_empty()).map(|c| c.argv).collect();
            let reason = format!("txbox cannot judge all that bash would run of this string: {why}");
            return Evaluation {
                decision: Decision { action: Action::Deny, rule: Some("engine.unjudgeable".into()), reason },
                commands,
            };
        }
        let mut best: Option<(Action, Why)> = None;
        if ex.parse_error.is_some() {
            best = Some((Action::Transact, Why::ParseError));
        }
        for (k, c) in ex.cmds.iter().enumerate() {
            let view = rules::CmdView::new(c, ctx, &ex.cmds);
            let mut cmd_best: Option<(Action, Why)> = None;
            for &i in self.candidates(c).iter() {
                let i = i as usize;
                let Some(rule) = self.inner.rules.get(i).map(LazyRule::get) else { continue };
                if cmd_best.as_ref().is_some_and(|(a, _)| *a >= rule.action) {
                    continue;
                }
                if let Some(path) = rule.matches(&view) {
                    cmd_best = Some((rule.action, Why::Rule { rule: i, cmd: k, path }));
                }
            }
            if c.opaque.is_some() && cmd_best.as_ref().is_none_or(|(a, _)| *a < Action::Transact) {
                cmd_best = Some((Action::Transact, Why::Opaque(k)));
            }
            let d = cmd_best.unwrap_or((Action::Transact, Why::Default));
            if best.as_ref().is_none_or(|(a, _)| d.0 > *a) {
                best = Some(d);
            }
        }
        let decision = match best {
            None => Decision { action: Action::Allow, rule: None, reason: "nothing to run".into() },
            Some((action, why)) => match why {
                Why::ParseError => Decision {
                    action,
                    rule: Some("engine.parse-error".into()),
                    reason: format!(
                        "the command does not parse ({}); it runs as a transaction",
                        ex.parse_error.as_deref().unwrap_or_default()
                    ),
                },
                Why::Rule { rule, cmd, path } => {
                    match (self.inner.rules.get(rule).map(LazyRule::get), ex.cmds.get(cmd)) {
                        (Some(r), Some(c)) => {
                            Decision { action, rule: Some(r.id.clone()), reason: r.render(c, path.as_deref()) }
                        }
                        _ => Decision::default_transact(),
                    }
                }
                Why::Opaque(cmd) => Decision {
                    action,
                    rule: Some("engine.opaque".into()),
                    reason: format!(
                        "{}; it runs as a transaction",
                        ex.cmds.get(cmd).and_then(|c| c.opaque.as_deref()).unwrap_or_default()
                    ),
                },
                Why::Default => Decision::default_transact(),
            },
        };
        let commands = ex.cmds.into_iter().filter(|c| !c.argv.is_empty()).map(|c| c.argv).collect();
        Evaluation { decision, commands }
    }
}

/// Merge a file's commit rules over the built-in ones, as for command rules: a rule with a
/// built-in id replaces fields of it, and weakening it needs `override = "weaken"`.
fn merge_commit_rules(
    mut specs: Vec<commit::CommitRuleSpec>,
    user: Vec<commit::CommitRuleSpec>,
    text: &str,
    origin: &str,
    seen: &mut Vec<String>,
    weakened: &mut Vec<Weakening>,
) -> Result<Vec<commit::CommitRuleSpec>, PolicyError> {
    let mut seen_here: Vec<String> = Vec::new();
    for r in user {
        let id = r.id.get_ref().clone();
        if seen_here.contains(&id) {
            return Err(PolicyError::at(origin, text, r.id.span().start, Some(&id), "duplicate commit rule id"));
        }
        seen_here.push(id.clone());
        seen.push(id.clone());
        let Some(b) = specs.iter_mut().find(|s| s.id.get_ref() == &id) else {
            specs.push(r);
            continue;
        };
        let mut merged = r.clone();
        if merged.action.is_none() {
            merged.action = b.action.clone();
        }
        if merged.reason.is_none() {
            merged.reason = b.reason.clone();
        }
        if merged.when.is_empty() {
            merged.when = b.when.clone();
            if merged.examples.is_none() {
                merged.examples = b.examples.clone();
            }
        }
        if let Some(how) = commit::weakens(b, &merged) {
            if merged.override_ != Some(rules::Override::Weaken) {
                return Err(PolicyError::at(
                    origin,
                    text,
                    r.id.span().start,
                    Some(&id),
                    format!(
                        "weakens the built-in commit rule ({how}); add `override = \"weaken\"` to the rule if that is meant"
                    ),
                ));
            }
            weakened.push(Weakening { rule: id.clone(), how });
        }
        *b = merged;
    }
    Ok(specs)
}

/// Compile commit rules, checking the inline examples of those `check` names.
fn build_commit_rules(
    specs: &[commit::CommitRuleSpec],
    text: &str,
    origin: &str,
    check: Check<'_>,
) -> Result<commit::CommitRules, PolicyError> {
    let mut ids: Vec<&str> = Vec::new();
    let mut compiled = Vec::new();
    for s in specs {
        let id = s.id.get_ref();
        let err = |m: String| PolicyError::at(origin, text, s.id.span().start, Some(id), m);
        if ids.contains(&id.as_str()) {
            return Err(err("duplicate commit rule id".into()));
        }
        ids.push(id);
        if id.is_empty() {
            return Err(err("empty rule id".into()));
        }
        if s.enabled == Some(false) {
            continue;
        }
        let rule = commit::CommitRule::compile(s).map_err(err)?;
        let check_examples = match check {
            Check::Nothing => false,
            Check::All => true,
            Check::Only(ids) => ids.iter().any(|i| i == id),
        };
        if let Some(ex) = s.examples.as_ref().filter(|_| check_examples) {
            for e in &ex.matches {
                if !commit::example_matches(&rule, e) {
                    return Err(err(format!("example `{e}` should match but does not")));
                }
            }
            for e in &ex.no_match {
                if commit::example_matches(&rule, e) {
                    return Err(err(format!("example `{e}` should not match but does")));
                }
            }
        }
        compiled.push(rule);
    }
    Ok(commit::CommitRules::new(compiled))
}

fn rule_matches_str(rule: &rules::Rule, text: &str, ctx: &Context) -> bool {
    let ex = extract::extract_str(text, ctx);
    ex.cmds.iter().any(|c| rule.matches(&rules::CmdView::new(c, ctx, &ex.cmds)).is_some())
}

/// Check a policy file and return warnings (errors are `Err`).
pub fn lint(path: &Path) -> Result<Vec<String>, PolicyError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| PolicyError::Io { file: path.display().to_string(), source })?;
    let origin = path.display().to_string();
    let policy = Policy::from_toml_str(&text, &origin)?;
    let user = parse_file(&text, &origin)?;
    let builtin = match builtin_cell() {
        Ok(p) => p.clone(),
        Err(_) => Policy::builtin(),
    };
    let mut warnings = Vec::new();
    for r in &user.rules {
        let id = r.id.get_ref();
        let (line, col) = line_col(&text, r.id.span().start);
        let at = format!("{origin}:{line}:{col}: rule `{id}`");
        let base = builtin.inner.specs.iter().find(|s| s.id.get_ref() == id);
        if let Some(w) = policy.weakened().iter().find(|w| &w.rule == id) {
            let was = base.and_then(|b| b.action.as_deref()).unwrap_or("?");
            warnings.push(format!("{at}: WEAKENS the built-in {was} rule: {} (override = \"weaken\")", w.how));
        } else if r.override_.is_some() {
            let what = if base.is_some() { "weakens nothing" } else { "is not a built-in rule" };
            warnings.push(format!("{at}: has `override = \"weaken\"` but {what}"));
        }
        if r.enabled == Some(false) {
            if base.is_none() {
                warnings.push(format!("{at}: disables a rule that is not built in (no effect)"));
            }
            continue;
        }
        if base.is_none() && r.examples.as_ref().is_none_or(|e| e.matches.is_empty()) {
            warnings.push(format!("{at}: has no `examples.match`; add one so the rule is checked at load"));
        }
        if base.is_none() && !id.contains('.') {
            warnings.push(format!("{at}: id is not namespaced (e.g. `team.{id}`)"));
        }
        for (k, m) in r.when.iter().enumerate() {
            if *m == rules::MatchSpec::default() {
                warnings.push(format!("{at}: `when[{k}]` is empty and matches every command"));
            }
            if r.action.as_deref() == Some("allow") && m.program.is_empty() {
                warnings.push(format!("{at}: allow rule without `program` in `when[{k}]` allows broadly"));
            }
        }
    }
    for r in &user.commit {
        let id = r.id.get_ref();
        let (line, col) = line_col(&text, r.id.span().start);
        let at = format!("{origin}:{line}:{col}: commit rule `{id}`");
        let base = builtin.inner.commit_specs.iter().find(|s| s.id.get_ref() == id);
        if let Some(w) = policy.weakened().iter().find(|w| &w.rule == id && base.is_some()) {
            let was = base.and_then(|b| b.action.as_deref()).unwrap_or("?");
            warnings.push(format!("{at}: WEAKENS the built-in {was} commit rule: {} (override = \"weaken\")", w.how));
        } else if r.override_.is_some() {
            let what = if base.is_some() { "weakens nothing" } else { "is not a built-in commit rule" };
            warnings.push(format!("{at}: has `override = \"weaken\"` but {what}"));
        }
        if r.enabled == Some(false) {
            if base.is_none() {
                warnings.push(format!("{at}: disables a commit rule that is not built in (no effect)"));
            }
            continue;
        }
        if base.is_none() && r.examples.as_ref().is_none_or(|e| e.matches.is_empty()) {
            warnings.push(format!("{at}: has no `examples.match`; add one so the rule is checked at load"));
        }
        if base.is_none() && !id.contains('.') {
            warnings.push(format!("{at}: id is not namespaced (e.g. `team.{id}`)"));
        }
        if base.is_none() && r.action.as_deref() == Some("allow") {
            warnings.push(format!(
                "{at}: an allow commit rule exempts nothing (the strictest rule wins); to relax a built-in \
                 commit rule, give its id with `override = \"weaken\"`"
            ));
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// build.rs's tables are the built-in policy: each rule compiles from its JSON to what the
    /// TOML gives (less its examples), and the index is the one `Policy::build` makes.
    #[test]
    fn builtin_tables_are_the_policy() {
        let full = match builtin_cell() {
            Ok(p) => p.clone(),
            Err(e) => panic!("{e}"),
        };
        let lazy = Policy::builtin();
        assert!(lazy.inner.stripped && !full.inner.stripped);
        let fresh = match parse_file(BUILTIN_TOML, "<builtin>") {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let enabled: Vec<&rules::RuleSpec> = fresh.rules.iter().filter(|s| s.enabled != Some(false)).collect();
        assert_eq!(builtin::RULES.len(), enabled.len());
        assert_eq!(lazy.rule_ids(), full.rule_ids());
        let mut examples = 0;
        for ((id, json), spec) in builtin::RULES.iter().zip(enabled) {
            assert_eq!(*id, spec.id.get_ref());
            // The spec, value for value, less its examples (and its place in the text).
            let from_json: rules::RuleSpec = match placed::unplaced(|| serde_json::from_str(json)) {
                Ok(s) => s,
                Err(e) => panic!("{id}: {e}"),
            };
            assert!(from_json.examples.is_none(), "{id}: an example line spans several lines");
            examples += usize::from(spec.examples.is_some());
            let mut b = spec.clone();
            b.examples = None;
            b.id = from_json.id.clone();
            assert_eq!(format!("{from_json:?}"), format!("{b:?}"));
            // And compiled, fresh on both sides (a shared rule may have compiled a regex since).
            let a = builtin::compile_rule(id, json);
            let b = match rules::Rule::compile(spec) {
                Ok(r) => r,
                Err(e) => panic!("{id}: {e}"),
            };
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
        }
        assert!(examples > builtin::RULES.len() / 2, "the TOML's examples were not found");
        // The index.
        let Index::Built { by_program, generic } = &full.inner.index else { panic!("the TOML policy has no index") };
        assert_eq!(builtin::GENERIC, generic.as_slice());
        assert_eq!(builtin::BY_PROGRAM.len(), by_program.len());
        for (name, v) in builtin::BY_PROGRAM {
            assert_eq!(by_program.get(*name).map(Vec::as_slice), Some(*v), "{name}");
            assert_eq!(builtin::candidates(name), *v, "{name}");
        }
        let want: Vec<(&str, u32)> = full.inner.by_pattern.iter().map(|(p, i)| (p.source(), *i)).collect();
        let got: Vec<(&str, u32)> = lazy.inner.by_pattern.iter().map(|(p, i)| (p.source(), *i)).collect();
        assert_eq!(got, want);
        assert_eq!(builtin::BY_PATTERN.len(), want.len());
        // The commit rules.
        let commit = builtin::commit_rules();
        let want = match build_commit_rules(&fresh.commit, BUILTIN_TOML, "<builtin>", Check::Nothing) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert!(!want.rules().is_empty());
        assert_eq!(format!("{:?}", commit.rules()), format!("{:?}", want.rules()));
        assert_eq!(lazy.commit_rule_ids(), full.commit_rule_ids());
        // What users see and merge over is the whole text.
        assert_eq!(lazy.to_toml(), full.to_toml());
        assert!(lazy.to_toml().contains("examples"));
    }

    #[test]
    fn builtin_examples_hold() {
        let spec = parse_file(BUILTIN_TOML, "<builtin>").map_err(|e| e.to_string());
        let built = spec.and_then(|s| {
            Policy::build(s.rules, s.commit, BUILTIN_TOML, "<builtin>", Check::All).map_err(|e| e.to_string())
        });
        if let Err(e) = built {
            panic!("{e}");
        }
    }

    #[test]
    fn a_policy_file_may_list_hosts() {
        let p = match Policy::from_toml_str("version = 1\nallow_hosts = [\"@pypi\", \"a.example\"]\n", "t") {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(p.allow_hosts(), ["@pypi", "a.example"]);
        let again = match Policy::from_toml_str(&p.to_toml(), "again") {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(again.allow_hosts(), p.allow_hosts());
        assert!(Policy::builtin().allow_hosts().is_empty());
        assert!(!Policy::builtin().to_toml().contains("allow_hosts"));
    }

    #[test]
    fn builtin_parses() {
        if let Err(e) = builtin_cell() {
            panic!("{e}");
        }
        assert!(Policy::builtin().rule_ids().len() > 15);
    }
}
