//! The rule language: TOML specs, compiled matchers, and matching against extracted commands.

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::extract::{Cmd, Feature};
use crate::glob::Glob;
use crate::paths::{self, ClassSet, PathClass, PathInfo, Scope};
use crate::{Action, Context};

/// A policy file as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileSpec {
    pub version: crate::placed::Placed<i64>,
    /// Hosts every command run with this policy may reach through txbox's proxy (`--allow-host`
    /// items; checked by the engine, which knows the syntax).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
    #[serde(default, rename = "rule")]
    pub rules: Vec<RuleSpec>,
    /// Commit-time rules (`[[commit]]`, crate::commit).
    #[serde(default, rename = "commit")]
    pub commit: Vec<crate::commit::CommitRuleSpec>,
}

/// One rule as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleSpec {
    pub id: crate::placed::Placed<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `override = "weaken"`: the file means to weaken the built-in rule of the same id
    /// (disable it, lower its action, or replace what it matches). Without it, such a change is
    /// refused at load, so a reused id can never weaken a rule silently.
    #[serde(default, rename = "override", skip_serializing_if = "Option::is_none")]
    pub override_: Option<Override>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples: Option<Examples>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<MatchSpec>,
}

/// The only override a policy file can state.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Override {
    Weaken,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Examples {
    #[serde(default, rename = "match", skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_match: Vec<String>,
}

/// One alternative of a rule: every field given must hold (an empty spec matches anything).
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct MatchSpec {
    /// Program basenames or globs; an entry containing `/` matches the path as written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub program: Vec<String>,
    /// Positional words, in order, near the start (`["push"]`, `["s3", "rm"]`); `a|b` alternatives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subcommand: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags_any: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags_all: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags_none: Vec<String>,
    /// Globs: some argument matches one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args_any: Vec<String>,
    /// Globs: no argument matches any of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args_none: Vec<String>,
    /// Regex: some single argument matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_regex: Option<String>,
    /// Regex over the whole canonical command line (space-joined) plus any here-doc text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Path classes: some path argument has one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths_any: Vec<String>,
    /// Scopes the path must have to count (`full`, `bulk`, `selective`); default all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths_scope: Vec<String>,
    /// Classes of write-redirect targets (`> /dev/sda`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redirect_write_any: Vec<String>,
    /// Classes of the files the command writes: write redirects and the operands it writes
    /// (`tee FILE`, `cp … DEST`, `dd of=`, `sed -i FILE`, `curl -o FILE`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writes_any: Vec<String>,
    /// Classes of what the command receives: paths read by the commands whose output reaches
    /// it (through pipes, substitutions and variables, transitively); a dump of the
    /// environment (`env`, `printenv`) counts as `secret`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs_any: Vec<String>,
    /// Classes of any redirect target, read or write (`< ~/.ssh/id_rsa`, `>& /dev/tcp/…`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redirect_any: Vec<String>,
    /// The command runs code produced by one of these programs (`curl … | sh`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub code_from_any: Vec<String>,
    /// One of these programs feeds the command's stdin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stdin_from_any: Vec<String>,
    /// Engine features (`fork-bomb`, `interactive`, `find-delete`, `find-action`, `wrapper`,
    /// `non-root-user`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features_any: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features_none: Vec<String>,
}

/// A regex compiled on first use. Compiling every pattern of the built-in policy costs
/// milliseconds, paid by every `txbox run`, while one command meets only the few rules of its
/// programs (and `Matcher::matches` looks at regexes last, after every cheaper condition).
/// User policy files are validated eagerly at load (`validate`), so their errors still point
/// to the file. A pattern of plain characters only (`sysrq-trigger`) is a substring search and
/// is never compiled.
#[derive(Debug, Clone)]
pub(crate) struct LazyRe {
    src: String,
    /// `src` has no regex syntax at all: matching is `contains`.
    literal: bool,
    re: std::sync::Arc<std::sync::OnceLock<Option<Regex>>>,
}

impl LazyRe {
    pub fn new(src: String) -> LazyRe {
        let literal = src.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_' | '/'));
        LazyRe { literal, src, re: std::sync::Arc::new(std::sync::OnceLock::new()) }
    }

    /// An invalid pattern (possible only if `validate` was skipped) matches nothing.
    pub fn is_match(&self, s: &str) -> bool {
        if self.literal {
            return s.contains(&self.src);
        }
        self.re.get_or_init(|| Regex::new(&self.src).ok()).as_ref().is_some_and(|r| r.is_match(s))
    }

    pub fn validate(&self) -> Result<(), String> {
        Regex::new(&self.src)
            .map(|r| {
                let _ = self.re.set(Some(r));
            })
            .map_err(|e| e.to_string())
    }
}

/// A glob or literal.
#[derive(Debug, Clone)]
pub(crate) enum Pat {
    Lit(String),
    /// A glob and its source text.
    Glob(Glob, String),
}

impl Pat {
    pub fn new(glob: &str) -> Result<Pat, String> {
        if crate::index::is_literal(glob) {
            return Ok(Pat::Lit(glob.to_string()));
        }
        Ok(Pat::Glob(Glob::new(glob)?, glob.to_string()))
    }

    /// The entry as written.
    pub fn source(&self) -> &str {
        match self {
            Pat::Lit(l) => l,
            Pat::Glob(_, src) => src,
        }
    }

    pub fn matches(&self, s: &str) -> bool {
        match self {
            Pat::Lit(l) => l == s,
            Pat::Glob(g, _) => g.matches(s),
        }
    }

    /// As a `program` entry: one with a `/` matches the path as written, else the basename.
    pub fn matches_program(&self, c: &Cmd) -> bool {
        if p_has_slash(self) {
            self.matches(&c.path)
        } else {
            self.matches(c.program())
        }
    }
}

fn pats(v: &[String]) -> Result<Vec<Pat>, String> {
    v.iter().map(|s| Pat::new(s)).collect()
}

fn classes(v: &[String], field: &str) -> Result<ClassSet, String> {
    let mut set = ClassSet::default();
    for s in v {
        let c = PathClass::parse(s).ok_or_else(|| {
            let all: Vec<&str> = paths::ALL_CLASSES.iter().map(|c| c.as_str()).collect();
            format!("`{field}`: unknown path class `{s}` (known: {})", all.join(", "))
        })?;
        set.insert(c);
    }
    Ok(set)
}

/// A name's bit in [`Matcher::program_bits`]: from its length and its first and last bytes, which
/// tell apart the short names of programs well, at the cost of a few instructions.
fn name_bit(name: &str) -> u64 {
    let b = name.as_bytes();
    let (first, last) = (b.first().copied().unwrap_or(0), b.last().copied().unwrap_or(0));
    let h = (b.len() as u32).wrapping_mul(0x9e37).wrapping_add(u32::from(first).wrapping_mul(0x85eb)) ^ u32::from(last);
    1 << (h.wrapping_mul(0x2c1b_3c6d) >> 26)
}

/// A compiled alternative.
#[derive(Debug, Clone, Default)]
pub(crate) struct Matcher {
    pub program: Vec<Pat>,
    /// `program`'s plain basenames, sorted: one binary search instead of a comparison per entry
    /// (the read-only rule names a hundred programs, and most commands meet it).
    program_names: Vec<String>,
    /// One bit per name of `program_names` ([`name_bit`]): a program whose bit is clear is not
    /// among them, and most alternatives a command meets do not name its program.
    program_bits: u64,
    /// `program`'s globs and paths, matched one by one.
    program_other: Vec<Pat>,
    subcommand: Vec<Vec<Pat>>,
    flags_any: Vec<Pat>,
    flags_all: Vec<Pat>,
    flags_none: Vec<Pat>,
    args_any: Vec<Pat>,
    args_none: Vec<Pat>,
    args_regex: Option<LazyRe>,
    regex: Option<LazyRe>,
    paths_any: Option<ClassSet>,
    paths_scope: Vec<Scope>,
    redirect_write_any: Option<ClassSet>,
    writes_any: Option<ClassSet>,
    inputs_any: Option<ClassSet>,
    redirect_any: Option<ClassSet>,
    code_from_any: Vec<Pat>,
    stdin_from_any: Vec<Pat>,
    features_any: Vec<Feature>,
    features_none: Vec<Feature>,
}

impl Matcher {
    /// Globs were checked when parsed; regexes compile here.
    fn validate(&self) -> Result<(), String> {
        for (r, f) in [(&self.args_regex, "args_regex"), (&self.regex, "regex")] {
            if let Some(r) = r {
                r.validate().map_err(|e| format!("`{f}`: {e}"))?;
            }
        }
        Ok(())
    }

    pub fn compile(s: &MatchSpec) -> Result<Matcher, String> {
        let opt_classes = |v: &[String], f: &str| -> Result<Option<ClassSet>, String> {
            if v.is_empty() {
                Ok(None)
            } else {
                classes(v, f).map(Some)
            }
        };
        let mut scopes = Vec::new();
        for s in &s.paths_scope {
            scopes.push(
                Scope::parse(s).ok_or_else(|| format!("`paths_scope`: unknown scope `{s}` (full, bulk, selective)"))?,
            );
        }
        let program = pats(&s.program)?;
        let mut program_names: Vec<String> = program
            .iter()
            .filter_map(|p| match p {
                Pat::Lit(l) if !l.contains('/') => Some(l.clone()),
                _ => None,
            })
            .collect();
        program_names.sort_unstable();
        let program_bits = program_names.iter().fold(0, |bits, n| bits | name_bit(n));
        let program_other = program.iter().filter(|p| p_has_slash(p) || matches!(p, Pat::Glob(..))).cloned().collect();
        Ok(Matcher {
            program,
            program_names,
            program_bits,
            program_other,
            subcommand: s
                .subcommand
                .iter()
                .map(|a| pats(&a.split('|').map(str::to_string).collect::<Vec<_>>()))
                .collect::<Result<_, _>>()?,
            flags_any: pats(&s.flags_any)?,
            flags_all: pats(&s.flags_all)?,
            flags_none: pats(&s.flags_none)?,
            args_any: pats(&s.args_any)?,
            args_none: pats(&s.args_none)?,
            args_regex: s.args_regex.clone().map(LazyRe::new),
            regex: s.regex.clone().map(LazyRe::new),
            paths_any: opt_classes(&s.paths_any, "paths_any")?,
            paths_scope: scopes,
            redirect_write_any: opt_classes(&s.redirect_write_any, "redirect_write_any")?,
            writes_any: opt_classes(&s.writes_any, "writes_any")?,
            inputs_any: opt_classes(&s.inputs_any, "inputs_any")?,
            redirect_any: opt_classes(&s.redirect_any, "redirect_any")?,
            code_from_any: pats(&s.code_from_any)?,
            stdin_from_any: pats(&s.stdin_from_any)?,
            features_any: s.features_any.iter().map(|f| Feature::parse(f)).collect::<Result<_, _>>()?,
            features_none: s.features_none.iter().map(|f| Feature::parse(f)).collect::<Result<_, _>>()?,
        })
    }

    /// Does this alternative match the command? Returns the path that made it match, if any.
    pub fn matches(&self, c: &CmdView) -> Option<Option<String>> {
        let cmd = c.cmd;
        if !self.program.is_empty() {
            let name = cmd.program();
            let ok = (self.program_bits & name_bit(name) != 0
                && self.program_names.binary_search_by(|n| n.as_str().cmp(name)).is_ok())
                || self.program_other.iter().any(|p| p.matches_program(cmd));
            if !ok {
                return None;
            }
        }
        let flags = || cmd.argv.iter().skip(1).take_while(|a| *a != "--").filter(|a| a.starts_with('-') && a.len() > 1);
        if !self.subcommand.is_empty() {
            let pos: Vec<&String> = cmd.argv.iter().skip(1).filter(|a| !a.starts_with('-')).collect();
            let n = self.subcommand.len();
            let found = (0..=2usize).any(|start| {
                start + n <= pos.len()
                    && self
                        .subcommand
                        .iter()
                        .enumerate()
                        .all(|(k, alts)| alts.iter().any(|p| p.matches(pos[start + k])))
            });
            if !found {
                return None;
            }
        }
        if !self.flags_any.is_empty() && !flags().any(|f| self.flags_any.iter().any(|p| p.matches(f))) {
            return None;
        }
        if !self.flags_all.iter().all(|p| flags().any(|f| p.matches(f))) {
            return None;
        }
        if flags().any(|f| self.flags_none.iter().any(|p| p.matches(f))) {
            return None;
        }
        let args = || cmd.argv.iter().skip(1);
        if !self.args_any.is_empty() && !args().any(|a| self.args_any.iter().any(|p| p.matches(a))) {
            return None;
        }
        if args().any(|a| self.args_none.iter().any(|p| p.matches(a))) {
            return None;
        }
        if !self.features_any.is_empty() && !cmd.features.iter().any(|f| self.features_any.iter().any(|g| g == f)) {
            return None;
        }
        if cmd.features.iter().any(|f| self.features_none.iter().any(|g| g == f)) {
            return None;
        }
        if !self.code_from_any.is_empty()
            && !cmd.code_from.iter().any(|p| self.code_from_any.iter().any(|q| q.matches(p)))
        {
            return None;
        }
        if !self.stdin_from_any.is_empty()
            && !cmd.stdin_from.iter().any(|p| self.stdin_from_any.iter().any(|q| q.matches(p)))
        {
            return None;
        }
        let mut hit_path = None;
        if let Some(want) = self.redirect_write_any {
            let hit = c.redirects().iter().find(|(w, p)| *w && p.classes.intersects(want));
            match hit {
                Some((_, p)) => hit_path = Some(p.display.clone()),
                None => return None,
            }
        }
        if let Some(want) = self.writes_any {
            // A `find`/`xargs` marker (`DIR/{}`) stands for files a filter picked, not the
            // directory: bulk edits are judged by the delete and permission rules.
            match c.writes().iter().find(|p| p.classes.intersects(want) && p.scope == Scope::Full) {
                Some(p) => hit_path = Some(p.display.clone()),
                None => return None,
            }
        }
        if let Some(want) = self.inputs_any {
            match c.inputs().iter().find(|p| p.classes.intersects(want)) {
                Some(p) => hit_path = Some(p.display.clone()),
                None => return None,
            }
        }
        if let Some(want) = self.redirect_any {
            let hit = c.redirects().iter().find(|(_, p)| p.classes.intersects(want));
            match hit {
                Some((_, p)) => hit_path = Some(p.display.clone()),
                None => return None,
            }
        }
        if let Some(want) = self.paths_any {
            let hit = c.paths().iter().find(|p| {
                p.classes.intersects(want) && (self.paths_scope.is_empty() || self.paths_scope.contains(&p.scope))
            });
            match hit {
                Some(p) => hit_path = Some(p.display.clone()),
                None => return None,
            }
        }
        // Regexes last: every condition must hold, and these are the dearest (a first use
        // compiles the pattern).
        if let Some(r) = &self.args_regex {
            if !args().any(|a| r.is_match(a)) {
                return None;
            }
        }
        if let Some(r) = &self.regex {
            if !r.is_match(c.line()) {
                return None;
            }
        }
        Some(hit_path)
    }
}

fn p_has_slash(p: &Pat) -> bool {
    match p {
        Pat::Lit(l) => l.contains('/'),
        Pat::Glob(_, src) => src.contains('/'),
    }
}

/// A command with lazily computed path classes.
pub(crate) struct CmdView<'a> {
    pub cmd: &'a Cmd,
    ctx: &'a Context,
    /// Every command of the extraction (what [`Cmd::feeds`] indexes).
    all: &'a [Cmd],
    inputs: std::cell::OnceCell<Vec<PathInfo>>,
    paths: std::cell::OnceCell<Vec<PathInfo>>,
    redirects: std::cell::OnceCell<Vec<(bool, PathInfo)>>,
    writes: std::cell::OnceCell<Vec<PathInfo>>,
    line: std::cell::OnceCell<String>,
}

impl<'a> CmdView<'a> {
    pub fn new(cmd: &'a Cmd, ctx: &'a Context, all: &'a [Cmd]) -> Self {
        CmdView {
            cmd,
            ctx,
            all,
            inputs: std::cell::OnceCell::new(),
            paths: std::cell::OnceCell::new(),
            redirects: std::cell::OnceCell::new(),
            writes: std::cell::OnceCell::new(),
            line: std::cell::OnceCell::new(),
        }
    }

    /// What `regex` matches: the canonical argv joined by spaces, then any here-document or
    /// here-string text after a newline. Built once per command, not once per rule (a
    /// here-document can hold a whole file).
    pub fn line(&self) -> &str {
        self.line.get_or_init(|| {
            let mut line = self.cmd.argv.join(" ");
            if let Some(i) = &self.cmd.input {
                line.push('\n');
                line.push_str(i);
            }
            line
        })
    }

    pub fn paths(&self) -> &[PathInfo] {
        self.paths.get_or_init(|| {
            let mut v = Vec::new();
            let mut ended = false;
            for (k, a) in self.cmd.argv.iter().enumerate().skip(1) {
                if a == "--" {
                    ended = true;
                    continue;
                }
                if !ended && a.starts_with('-') && a.len() > 1 {
                    continue;
                }
                let dyn_at = self.cmd.dyn_at.get(k).copied().flatten();
                let (text, off) = path_candidate(a);
                if text.is_empty() || text.contains("://") {
                    continue;
                }
                if let Some(colon) = text.find(':') {
                    if !text[..colon].contains('/') {
                        continue;
                    }
                }
                let d = dyn_at.map(|d| d.saturating_sub(off));
                let mut info = paths::classify(text, d, self.cmd.cwd.as_deref(), self.ctx);
                if self.cmd.secret_args.contains(&k) {
                    info.classes.insert(PathClass::Secret);
                }
                v.push(info);
            }
            v
        })
    }

    /// The files the command writes: its write redirects, then the operands it writes; streams
    /// (`/dev/null`, `/dev/stderr`, …) are left out, as writing them changes no file.
    pub fn writes(&self) -> &[PathInfo] {
        self.writes.get_or_init(|| {
            let mut v: Vec<PathInfo> = self.redirects().iter().filter(|(w, _)| *w).map(|(_, p)| p.clone()).collect();
            for o in crate::writes::written(&self.cmd.argv) {
                let Some(text) = self.cmd.argv.get(o.index).and_then(|a| a.get(o.offset..)) else { continue };
                if text.is_empty() || text == "-" {
                    continue;
                }
                let dyn_at = self.cmd.dyn_at.get(o.index).copied().flatten().map(|d| d.saturating_sub(o.offset));
                v.push(paths::classify(text, dyn_at, self.cmd.cwd.as_deref(), self.ctx));
            }
            // Writing a stream changes no file: `touch a 2>/dev/null` writes `a`, not `/dev`.
            v.retain(|p| !p.classes.is_stream());
            v
        })
    }

    /// What the commands feeding this one read: their path operands and read redirects,
    /// following their own feeds in turn.
    pub fn inputs(&self) -> &[PathInfo] {
        self.inputs.get_or_init(|| {
            let mut v = Vec::new();
            // Paths named in the commands a file-transfer client reads from stdin
            // (`sftp host <<< 'put ~/.ssh/id_rsa'`).
            let batch = matches!(self.cmd.program(), "sftp" | "ftp" | "tftp" | "lftp" | "smbclient");
            if let Some(text) = self.cmd.input.as_ref().filter(|_| batch) {
                for t in text.split_whitespace().take(256).filter(|t| t.starts_with('/') || t.starts_with("~/")) {
                    v.push(paths::classify(t, None, self.cmd.cwd.as_deref(), self.ctx));
                }
            }
            let mut seen: Vec<usize> = Vec::new();
            let mut todo: Vec<usize> = self.cmd.feeds.clone();
            while let Some(i) = todo.pop() {
                if seen.contains(&i) || seen.len() >= 64 {
                    continue;
                }
                seen.push(i);
                let Some(src) = self.all.get(i) else { continue };
                let view = CmdView::new(src, self.ctx, self.all);
                // What echo and printf are given is text, not files they read.
                if !matches!(src.program(), "echo" | "printf") {
                    v.extend(view.paths().iter().cloned());
                }
                v.extend(view.redirects().iter().filter(|(w, _)| !*w).map(|(_, p)| p.clone()));
                let secret = |display: String| PathInfo {
                    display,
                    classes: ClassSet::of(&[PathClass::Secret]),
                    scope: Scope::Full,
                };
                if src.program() == "gpg"
                    && src.argv.iter().any(|a| a == "--export-secret-keys" || a == "--export-secret-subkeys")
                {
                    v.push(secret("the GnuPG secret keys".into()));
                }
                if matches!(src.program(), "env" | "printenv" | "set" | "export" | "declare")
                    && src.argv.len() <= 2
                    && src.argv.get(1).is_none_or(|a| a.starts_with('-'))
                {
                    v.push(secret("the environment".into()));
                }
                // A credential-looking variable printed into the pipe (`echo $API_TOKEN |`,
                // `printenv AWS_SECRET_ACCESS_KEY |`).
                if matches!(src.program(), "echo" | "printf" | "printenv" | "cat") {
                    for a in &src.argv[1..] {
                        let name = a.trim_start_matches(['$', '{', '"']).trim_end_matches(['}', '"']);
                        let expanded = src.program() == "printenv" || a.contains('$');
                        if expanded && secret_name(name) {
                            v.push(secret(format!("${name}")));
                        }
                    }
                }
                todo.extend(src.feeds.iter().copied());
            }
            v
        })
    }

    pub fn redirects(&self) -> &[(bool, PathInfo)] {
        self.redirects.get_or_init(|| {
            self.cmd
                .redirects
                .iter()
                .map(|r| (r.write, paths::classify(&r.target, r.dyn_at, self.cmd.cwd.as_deref(), self.ctx)))
                .collect()
        })
    }
}

/// Whether an environment variable's name says it holds a credential.
fn secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "APIKEY", "ACCESS_KEY", "PRIVATE_KEY", "CREDENTIAL"]
            .iter()
            .any(|s| upper.contains(s))
}

/// The path inside an argument: `of=/dev/sda` → `/dev/sda`, `@file` → `file`, `f=@x` → `x`.
pub(crate) fn path_candidate(a: &str) -> (&str, usize) {
    if let Some(i) = a.find("=@") {
        return (&a[i + 2..], i + 2);
    }
    if let Some(r) = a.strip_prefix('@') {
        return (r, 1);
    }
    // `name@/path` (`curl --data-urlencode k@/etc/shadow`); `user@host:path` is no path.
    if let Some(i) = a.find('@') {
        let v = &a[i + 1..];
        if v.starts_with('/') || v.starts_with("~/") {
            return (v, i + 1);
        }
    }
    if let Some(i) = a.find('=') {
        let v = &a[i + 1..];
        if v.starts_with('/') || v.starts_with('~') {
            return (v, i + 1);
        }
    }
    (a, 0)
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub id: String,
    pub action: Action,
    pub reason: String,
    pub when: Vec<Matcher>,
}

impl Rule {
    /// Compile every regex and glob now, reporting the first that is invalid.
    pub fn validate(&self) -> Result<(), String> {
        for m in &self.when {
            m.validate()?;
        }
        Ok(())
    }

    pub fn compile(spec: &RuleSpec) -> Result<Rule, String> {
        let action = match spec.action.as_deref() {
            Some("deny") => Action::Deny,
            Some("transact") => Action::Transact,
            Some("allow") => Action::Allow,
            Some(other) => return Err(format!("unknown action `{other}` (deny, transact, allow)")),
            None => return Err("missing `action`".into()),
        };
        let reason = spec.reason.clone().ok_or("missing `reason`")?;
        if spec.when.is_empty() {
            return Err("no `when` conditions: a rule must say what it matches".into());
        }
        let when = spec.when.iter().map(Matcher::compile).collect::<Result<_, _>>()?;
        Ok(Rule { id: spec.id.get_ref().clone(), action, reason, when })
    }

    /// Does the rule match the command? Returns the path behind the match, if any.
    pub fn matches(&self, c: &CmdView) -> Option<Option<String>> {
        if self.action == Action::Allow && !allow_eligible(c.cmd) {
            return None;
        }
        self.when.iter().find_map(|m| m.matches(c))
    }

    pub fn render(&self, c: &Cmd, path: Option<&str>) -> String {
        let mut r = self.reason.replace("{program}", c.program());
        if r.contains("{path}") {
            r = r.replace("{path}", path.unwrap_or("?"));
        }
        if r.contains("{command}") {
            r = r.replace("{command}", &c.argv.join(" "));
        }
        if r.contains("{code_from}") {
            r = r.replace("{code_from}", &c.code_from.join(", "));
        }
        r
    }
}

/// An allow rule may only allow a command that is fully known and writes nothing by redirect.
fn allow_eligible(c: &Cmd) -> bool {
    c.opaque.is_none()
        && c.code_from.is_empty()
        && c.dyn_at.first().copied().flatten().is_none()
        && c.redirects
            .iter()
            .all(|r| !r.write || matches!(r.target.as_str(), "/dev/null" | "/dev/stdout" | "/dev/stderr" | "/dev/tty"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod lazy_re_tests {
    use super::*;

    #[test]
    fn plain_patterns_are_substring_searches_with_the_regex_answers() {
        let lines = ["echo b > /proc/sysrq-trigger", "sysrq-trigge", "SYSRQ-TRIGGER", "", "a b", "x/y_z-1"];
        for (src, literal) in [
            ("sysrq-trigger", true),
            ("a b", true),
            ("x/y_z-1", true),
            ("a.b", false),
            ("^echo", false),
            ("a|b", false),
        ] {
            let lazy = LazyRe::new(src.to_string());
            assert_eq!(lazy.literal, literal, "{src}");
            let re = Regex::new(src).unwrap();
            for l in lines {
                assert_eq!(lazy.is_match(l), re.is_match(l), "{src} on {l:?}");
            }
            assert_eq!(lazy.re.get().is_some(), !literal, "{src}: compiled only when it is no plain text");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod program_tests {
    use super::*;
    use crate::extract::Cmd;
    use proptest::prelude::*;

    /// A program name from a small alphabet and few lengths, so that names share first and
    /// last bytes and lengths (and so bits) often.
    fn name() -> impl Strategy<Value = String> {
        "[a-c][a-c_.-]{0,3}"
    }

    proptest! {
        /// Matching `program` with the bits and the binary search answers as the entries one by
        /// one do: a name, a glob, a path.
        #[test]
        fn program_matching_agrees_with_the_entries_one_by_one(
            names in proptest::collection::vec(name(), 0..12),
            globs in proptest::collection::vec("[a-c]\\*|\\*[a-c]|/usr/bin/[a-c]", 0..2),
            argv0 in "(/usr/bin/)?[a-c][a-c_.-]{0,3}",
        ) {
            let spec = MatchSpec { program: names.into_iter().chain(globs).collect(), ..MatchSpec::default() };
            let m = Matcher::compile(&spec).unwrap();
            let cmd = Cmd { path: argv0.clone(), argv: vec![argv0.rsplit('/').next().unwrap().to_string()], ..Cmd::default() };
            let ctx = crate::example_context();
            let all = [cmd.clone()];
            let got = m.matches(&CmdView::new(&all[0], &ctx, &all)).is_some();
            let want = spec.program.is_empty() || m.program.iter().any(|p| p.matches_program(&cmd));
            prop_assert_eq!(got, want, "{:?} against {:?}", cmd.argv, spec.program);
        }
    }

    #[test]
    fn the_bits_of_program_names_spread() {
        let names = ["ls", "cat", "grep", "rg", "sed", "awk", "find", "git", "make", "cargo", "python3", "npm"];
        let bits: std::collections::HashSet<u64> = names.iter().map(|n| name_bit(n)).collect();
        assert!(bits.len() >= 10, "{} distinct bits for {} names", bits.len(), names.len());
        assert!(names.iter().all(|n| name_bit(n).count_ones() == 1));
    }
}
