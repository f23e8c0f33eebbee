//! Extraction: parse a shell string with brush-parser and list every command it would run, in
//! canonical form, recursively through substitutions, `sh -c`, `eval`, wrappers, `xargs`,
//! `find -exec`, functions, loops and here-documents.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use brush_parser::ast;

use crate::paths;
use crate::words::{expand, EWord, Var, Vars};
use crate::Context;

const MAX_DEPTH: usize = 12;
const MAX_CMDS: usize = 512;

/// A redirection of one command.
#[derive(Debug, Clone)]
pub(crate) struct Redir {
    pub write: bool,
    pub target: String,
    pub dyn_at: Option<usize>,
}

/// One command the string would run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cmd {
    /// Canonical argv: program by basename, quotes removed, bundled flags expanded.
    pub argv: Vec<String>,
    /// Per argv element: offset of the first dynamic part.
    pub dyn_at: Vec<Option<usize>>,
    /// The program as written (after expansion), e.g. `/bin/rm`.
    pub path: String,
    pub redirects: Vec<Redir>,
    /// Working directory when it runs (`None`: unknown after a dynamic `cd`).
    pub cwd: Option<PathBuf>,
    /// Programs whose output reaches this command's stdin.
    pub stdin_from: Vec<String>,
    /// Programs whose output this command executes as code.
    pub code_from: Vec<String>,
    /// Engine features: `fork-bomb`, `interactive`, `wrapper`.
    pub features: Vec<&'static str>,
    /// Why the command is opaque to the engine (it cannot see what would run).
    pub opaque: Option<String>,
    /// Here-document / here-string text fed to stdin.
    pub input: Option<String>,
}

impl Cmd {
    pub fn program(&self) -> &str {
        self.argv.first().map(String::as_str).unwrap_or("")
    }
}

/// Everything extracted from one string.
#[derive(Debug, Default)]
pub(crate) struct Extraction {
    pub cmds: Vec<Cmd>,
    /// Set when the string did not parse.
    pub parse_error: Option<String>,
}

const SHELLS: &[&str] =
    &["sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "busybox-sh", "fish", "csh", "tcsh", "rbash"];
const INTERPRETERS: &[&str] = &[
    "python",
    "python2",
    "python3",
    "perl",
    "ruby",
    "node",
    "nodejs",
    "php",
    "lua",
    "luajit",
    "Rscript",
    "deno",
    "bun",
    "tclsh",
    "osascript",
    "pwsh",
    "awk",
    "gawk",
    "mawk",
    "nawk",
];

fn is_shell(p: &str) -> bool {
    SHELLS.contains(&p)
}

fn is_interp(p: &str) -> bool {
    INTERPRETERS.contains(&p) || (p.starts_with("python") && p[6..].chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// Programs whose single-letter flags must not be unbundled.
const NO_BUNDLE: &[&str] = &[
    "find",
    "kill",
    "java",
    "gcc",
    "g++",
    "cc",
    "clang",
    "ld",
    "ffmpeg",
    "dd",
    "tar",
    "ps",
    "iptables",
    "ip6tables",
    "xargs",
    "awk",
    "gawk",
    "sed",
    "nft",
    "openssl",
    "pkill",
    "killall",
    "terraform",
    "tofu",
    "go",
    "java",
    "mongo",
    "mongosh",
];

fn long_equiv(prog: &str, flag: &str) -> Option<&'static str> {
    let v = match (prog, flag) {
        ("rm", "--recursive") | ("rm", "-R") => "-r",
        ("rm", "--force") => "-f",
        ("rm", "--interactive") => "-i",
        ("rm", "--dir") => "-d",
        ("rm", "--verbose") => "-v",
        ("cp" | "mv", "--force") => "-f",
        ("cp", "--recursive") | ("cp", "-R") => "-r",
        ("cp" | "mv", "--interactive") => "-i",
        ("chmod" | "chown" | "chgrp" | "setfacl" | "chattr", "--recursive") => "-R",
        ("git", "--force") => "-f",
        ("git", "--delete") => "-d",
        ("git", "--hard") => "--hard",
        ("shred", "--remove") => "-u",
        ("shred", "--zero") => "-z",
        ("curl", "--upload-file") => "-T",
        ("curl", "--data") | ("curl", "--data-binary") | ("curl", "--data-raw") | ("curl", "--data-urlencode") => "-d",
        ("curl", "--form") => "-F",
        ("nc" | "ncat" | "netcat", "--exec") => "-e",
        ("nc" | "ncat" | "netcat", "--sh-exec") => "-c",
        ("sysctl", "--write") => "-w",
        ("kill", "-s") => "-s",
        _ => return None,
    };
    Some(v)
}

/// Canonicalise flags of an argv in place (program already a basename).
pub(crate) fn canon_argv(argv: &mut Vec<String>, dyn_at: &mut Vec<Option<usize>>) {
    let Some(prog) = argv.first().cloned() else { return };
    let bundle = !NO_BUNDLE.contains(&prog.as_str());
    let mut out = Vec::with_capacity(argv.len());
    let mut dout = Vec::with_capacity(argv.len());
    let mut ended = false;
    for (k, a) in argv.iter().enumerate() {
        let d = dyn_at.get(k).copied().flatten();
        if k == 0 || ended || d.is_some() {
            out.push(a.clone());
            dout.push(d);
            continue;
        }
        if a == "--" {
            ended = true;
            out.push(a.clone());
            dout.push(None);
            continue;
        }
        if let Some(long) = a.strip_prefix("--") {
            let (name, val) = match long.split_once('=') {
                Some((n, v)) => (format!("--{n}"), Some(v)),
                None => (a.clone(), None),
            };
            let canon = long_equiv(&prog, &name).map(str::to_string).unwrap_or(name);
            out.push(canon);
            dout.push(None);
            if let Some(v) = val {
                out.push(v.to_string());
                dout.push(None);
            }
            continue;
        }
        if bundle && a.len() > 2 && a.starts_with('-') && a[1..].chars().all(|c| c.is_ascii_alphabetic()) {
            for c in a[1..].chars() {
                let f = format!("-{c}");
                let f = long_equiv(&prog, &f).map(str::to_string).unwrap_or(f);
                out.push(f);
                dout.push(None);
            }
            continue;
        }
        if a.starts_with('-') && a.len() == 2 {
            if let Some(e) = long_equiv(&prog, a) {
                out.push(e.to_string());
                dout.push(None);
                continue;
            }
        }
        out.push(a.clone());
        dout.push(d);
    }
    *argv = out;
    *dyn_at = dout;
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// A command as words before classification.
struct Raw {
    words: Vec<EWord>,
    redirects: Vec<Redir>,
    stdin_from: Vec<String>,
    /// Static text fed to stdin (here-doc, here-string, `echo … |`).
    input: Option<String>,
    /// Stdin comes from a file or somewhere unknown.
    stdin_other: bool,
    features: Vec<&'static str>,
}

pub(crate) struct Extractor<'a> {
    ctx: &'a Context,
    vars: Vars,
    cwd: Option<PathBuf>,
    funcs: HashSet<String>,
    defining: Vec<String>,
    depth: usize,
    out: Vec<Cmd>,
    in_pipeline_or_bg: bool,
}

/// Parse a shell string into a program.
fn parse(text: &str) -> Result<ast::Program, String> {
    let opts = brush_parser::ParserOptions::default();
    let mut parser = brush_parser::Parser::new(std::io::Cursor::new(text), &opts);
    parser.parse_program().map_err(|e| e.to_string())
}

/// Extract every command of a shell string.
pub(crate) fn extract_str(text: &str, ctx: &Context) -> Extraction {
    let mut ex = Extractor::new(ctx);
    let err = ex.run_str(text);
    Extraction { cmds: ex.out, parse_error: err }
}

/// Extract from an argv taken literally.
pub(crate) fn extract_argv(argv: &[String], ctx: &Context) -> Extraction {
    let mut ex = Extractor::new(ctx);
    let raw = Raw {
        words: argv.iter().map(|a| EWord::lit(a)).collect(),
        redirects: Vec::new(),
        stdin_from: Vec::new(),
        input: None,
        stdin_other: false,
        features: Vec::new(),
    };
    ex.command(raw);
    Extraction { cmds: ex.out, parse_error: None }
}

impl<'a> Extractor<'a> {
    fn new(ctx: &'a Context) -> Self {
        let vars = Vars {
            home: ctx.home.as_ref().map(|h| h.to_string_lossy().into_owned()),
            pwd: Some(ctx.cwd.to_string_lossy().into_owned()),
            ..Vars::default()
        };
        Extractor {
            ctx,
            vars,
            cwd: Some(paths::normalize(&ctx.cwd)),
            funcs: HashSet::new(),
            defining: Vec::new(),
            depth: 0,
            out: Vec::new(),
            in_pipeline_or_bg: false,
        }
    }

    fn push(&mut self, c: Cmd) {
        if self.out.len() < MAX_CMDS {
            self.out.push(c);
        }
    }

    fn opaque(&mut self, argv: Vec<String>, why: String) {
        let n = argv.len();
        self.push(Cmd {
            path: argv.first().cloned().unwrap_or_default(),
            argv,
            dyn_at: vec![None; n],
            cwd: self.cwd.clone(),
            opaque: Some(why),
            ..Cmd::default()
        });
    }

    /// Parse and extract a string; returns the parse error, if any.
    fn run_str(&mut self, text: &str) -> Option<String> {
        if self.depth >= MAX_DEPTH {
            self.opaque(vec![], "nesting too deep".into());
            return None;
        }
        self.depth += 1;
        let res = match parse(text) {
            Ok(p) => {
                for cc in &p.complete_commands {
                    self.list(cc);
                }
                None
            }
            Err(e) => {
                self.opaque(vec![], format!("the string does not parse ({e})"));
                Some(e)
            }
        };
        self.depth -= 1;
        res
    }

    /// Extract a nested string and return the programs it runs.
    fn sub(&mut self, text: &str) -> Vec<String> {
        let start = self.out.len();
        let saved_cwd = self.cwd.clone();
        let saved_vars = self.vars.map.clone();
        let saved_pipe = self.in_pipeline_or_bg;
        self.in_pipeline_or_bg = false;
        self.run_str(text);
        self.in_pipeline_or_bg = saved_pipe;
        self.cwd = saved_cwd;
        self.vars.map = saved_vars;
        self.programs_since(start)
    }

    fn programs_since(&self, start: usize) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for c in &self.out[start..] {
            let p = c.program().to_string();
            if !p.is_empty() && !v.contains(&p) {
                v.push(p);
            }
        }
        v
    }

    fn list(&mut self, l: &ast::CompoundList) {
        for item in &l.0 {
            let bg = matches!(item.1, ast::SeparatorOperator::Async);
            let saved = self.in_pipeline_or_bg;
            if bg {
                self.in_pipeline_or_bg = true;
            }
            self.and_or(&item.0);
            self.in_pipeline_or_bg = saved;
        }
    }

    fn and_or(&mut self, a: &ast::AndOrList) {
        self.pipeline(&a.first);
        for x in &a.additional {
            match x {
                ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
            }
        }
    }

    fn pipeline(&mut self, p: &ast::Pipeline) {
        let mut prev: Option<(Vec<String>, Option<String>)> = None;
        let saved = self.in_pipeline_or_bg;
        if p.seq.len() > 1 {
            self.in_pipeline_or_bg = true;
        }
        for c in &p.seq {
            let start = self.out.len();
            let static_out = static_output(c, &self.vars);
            self.command_node(c, prev.as_ref());
            prev = Some((self.programs_since(start), static_out));
        }
        self.in_pipeline_or_bg = saved;
    }

    fn command_node(&mut self, c: &ast::Command, stdin: Option<&(Vec<String>, Option<String>)>) {
        match c {
            ast::Command::Simple(s) => self.simple(s, stdin),
            ast::Command::Compound(cc, redirs) => {
                let start = self.out.len();
                let mut raw_redirs = Vec::new();
                if let Some(r) = redirs {
                    for io in &r.0 {
                        self.redirect(io, &mut raw_redirs, &mut None, &mut Vec::new(), &mut false);
                    }
                }
                self.compound(cc);
                if let Some((progs, _)) = stdin {
                    for cmd in &mut self.out[start..] {
                        cmd.stdin_from.extend(progs.iter().cloned());
                    }
                }
                for cmd in &mut self.out[start..] {
                    cmd.redirects.extend(raw_redirs.iter().cloned());
                }
            }
            ast::Command::Function(f) => self.function(f),
            ast::Command::ExtendedTest(t, _) => {
                // Conditions only; command substitutions inside are rare but scanned.
                let s = format!("{t:?}");
                if s.contains("$(") || s.contains('`') {
                    self.opaque(vec!["[[".into()], "command substitution inside [[ ]]".into());
                }
            }
        }
    }

    fn compound(&mut self, cc: &ast::CompoundCommand) {
        match cc {
            ast::CompoundCommand::BraceGroup(b) => self.list(&b.list),
            ast::CompoundCommand::Subshell(s) => {
                let cwd = self.cwd.clone();
                let vars = self.vars.map.clone();
                self.list(&s.list);
                self.cwd = cwd;
                self.vars.map = vars;
            }
            ast::CompoundCommand::ForClause(f) => {
                let mut values: Vec<EWord> = Vec::new();
                if let Some(ws) = &f.values {
                    for w in ws {
                        let e = expand(&w.value, &self.vars);
                        for s in &e.subs {
                            self.sub(s);
                        }
                        values.extend(e.words);
                    }
                }
                let statics: Vec<String> =
                    values.iter().filter(|w| w.is_static()).map(|w| w.text.clone()).take(8).collect();
                let any_dyn = values.iter().any(|w| !w.is_static()) || f.values.is_none();
                for v in &statics {
                    self.vars.map.insert(f.variable_name.clone(), Var::Static(v.clone()));
                    self.list(&f.body.list);
                }
                if any_dyn || statics.is_empty() {
                    self.vars.map.insert(f.variable_name.clone(), Var::Dynamic);
                    self.list(&f.body.list);
                }
                self.vars.map.insert(f.variable_name.clone(), Var::Dynamic);
            }
            ast::CompoundCommand::ArithmeticForClause(f) => self.list(&f.body.list),
            ast::CompoundCommand::CaseClause(c) => {
                let e = expand(&c.value.value, &self.vars);
                for s in &e.subs {
                    self.sub(s);
                }
                for item in &c.cases {
                    if let Some(l) = &item.cmd {
                        self.list(l);
                    }
                }
            }
            ast::CompoundCommand::IfClause(i) => {
                self.list(&i.condition);
                self.list(&i.then);
                if let Some(elses) = &i.elses {
                    for e in elses {
                        if let Some(c) = &e.condition {
                            self.list(c);
                        }
                        self.list(&e.body);
                    }
                }
            }
            ast::CompoundCommand::WhileClause(w) | ast::CompoundCommand::UntilClause(w) => {
                self.list(&w.0);
                self.list(&w.1.list);
            }
            ast::CompoundCommand::Arithmetic(a) => {
                if a.expr.value.contains("$(") || a.expr.value.contains('`') {
                    let e = expand(&format!("\"{}\"", a.expr.value), &self.vars);
                    for s in &e.subs {
                        self.sub(s);
                    }
                }
            }
            ast::CompoundCommand::Coprocess(c) => self.command_node(&c.body, None),
        }
    }

    fn function(&mut self, f: &ast::FunctionDefinition) {
        let name = f.fname.value.clone();
        self.funcs.insert(name.clone());
        self.defining.push(name);
        // The body is extracted where it is defined: a conservative view of every call.
        let cwd = self.cwd.clone();
        let saved = self.in_pipeline_or_bg;
        self.in_pipeline_or_bg = false;
        self.compound(&f.body.0);
        self.in_pipeline_or_bg = saved;
        self.cwd = cwd;
        self.defining.pop();
    }

    fn redirect(
        &mut self,
        io: &ast::IoRedirect,
        redirs: &mut Vec<Redir>,
        input: &mut Option<String>,
        stdin_from: &mut Vec<String>,
        stdin_other: &mut bool,
    ) {
        match io {
            ast::IoRedirect::File(fd, kind, target) => {
                let write = matches!(
                    kind,
                    ast::IoFileRedirectKind::Write
                        | ast::IoFileRedirectKind::Append
                        | ast::IoFileRedirectKind::Clobber
                        | ast::IoFileRedirectKind::ReadAndWrite
                        | ast::IoFileRedirectKind::DuplicateOutput
                );
                let is_stdin = fd.unwrap_or(if write { 1 } else { 0 }) == 0 && !write;
                match target {
                    ast::IoFileRedirectTarget::Filename(w) | ast::IoFileRedirectTarget::Duplicate(w) => {
                        let e = expand(&w.value, &self.vars);
                        for s in &e.subs {
                            self.sub(s);
                        }
                        if let Some(t) = e.words.into_iter().next() {
                            let is_fd = matches!(target, ast::IoFileRedirectTarget::Duplicate(_))
                                && (t.text.chars().all(|c| c.is_ascii_digit() || c == '-'));
                            if !is_fd {
                                if is_stdin {
                                    *stdin_other = true;
                                }
                                redirs.push(Redir { write, target: t.text, dyn_at: t.dyn_at });
                            }
                        }
                    }
                    ast::IoFileRedirectTarget::Fd(_) => {}
                    ast::IoFileRedirectTarget::ProcessSubstitution(_, sub) => {
                        let start = self.out.len();
                        self.subshell_list(&sub.list);
                        let progs = self.programs_since(start);
                        if is_stdin {
                            stdin_from.extend(progs);
                        }
                    }
                }
            }
            ast::IoRedirect::OutputAndError(w, _) => {
                let e = expand(&w.value, &self.vars);
                for s in &e.subs {
                    self.sub(s);
                }
                if let Some(t) = e.words.into_iter().next() {
                    redirs.push(Redir { write: true, target: t.text, dyn_at: t.dyn_at });
                }
            }
            ast::IoRedirect::HereDocument(_, doc) => {
                if doc.requires_expansion {
                    let e = expand(&format!("\"{}\"", doc.doc.value.replace('"', "\\\"")), &self.vars);
                    for s in &e.subs {
                        let p = self.sub(s);
                        stdin_from.extend(p);
                    }
                    if let Some(w) = e.words.into_iter().next() {
                        if w.is_static() {
                            *input = Some(w.text);
                        } else {
                            *input = Some(w.text);
                            *stdin_other = true;
                        }
                    }
                } else {
                    *input = Some(doc.doc.value.clone());
                }
            }
            ast::IoRedirect::HereString(_, w) => {
                let e = expand(&w.value, &self.vars);
                for s in &e.subs {
                    let p = self.sub(s);
                    stdin_from.extend(p);
                }
                if let Some(t) = e.words.into_iter().next() {
                    if !t.is_static() {
                        *stdin_other = true;
                    }
                    *input = Some(t.text);
                }
            }
        }
    }

    fn subshell_list(&mut self, l: &ast::CompoundList) {
        let cwd = self.cwd.clone();
        let vars = self.vars.map.clone();
        self.list(l);
        self.cwd = cwd;
        self.vars.map = vars;
    }

    fn simple(&mut self, s: &ast::SimpleCommand, stdin: Option<&(Vec<String>, Option<String>)>) {
        let mut words: Vec<EWord> = Vec::new();
        let mut redirects = Vec::new();
        let mut input = None;
        let mut stdin_from = Vec::new();
        let mut stdin_other = false;
        let mut assigns: Vec<(String, Var)> = Vec::new();
        if let Some((progs, out)) = stdin {
            stdin_from.extend(progs.iter().cloned());
            if let Some(o) = out {
                input = Some(o.clone());
            }
        }
        let items = s.prefix.iter().flat_map(|p| p.0.iter());
        let word_item = s.word_or_name.iter().map(|w| (w, true));
        let mut all: Vec<ItemRef> = items.map(ItemRef::Item).collect();
        for (w, _) in word_item {
            all.push(ItemRef::Word(w));
        }
        if let Some(sfx) = &s.suffix {
            all.extend(sfx.0.iter().map(ItemRef::Item));
        }
        for it in all {
            match it {
                ItemRef::Word(w) | ItemRef::Item(ast::CommandPrefixOrSuffixItem::Word(w)) => {
                    let e = expand(&w.value, &self.vars);
                    let mut srcs = Vec::new();
                    for sub in &e.subs {
                        srcs.extend(self.sub(sub));
                    }
                    for mut ew in e.words {
                        ew.sources = srcs.clone();
                        words.push(ew);
                    }
                }
                ItemRef::Item(ast::CommandPrefixOrSuffixItem::AssignmentWord(a, w)) => {
                    let name = match &a.name {
                        ast::AssignmentName::VariableName(n) => n.clone(),
                        ast::AssignmentName::ArrayElementName(n, _) => n.clone(),
                    };
                    let val = match &a.value {
                        ast::AssignmentValue::Scalar(v) => {
                            let e = expand(&v.value, &self.vars);
                            for sub in &e.subs {
                                self.sub(sub);
                            }
                            match e.words.into_iter().next() {
                                Some(w) if w.is_static() && !a.append => Var::Static(w.text),
                                None => Var::Static(String::new()),
                                _ => Var::Dynamic,
                            }
                        }
                        ast::AssignmentValue::Array(_) => Var::Dynamic,
                    };
                    if words.is_empty() {
                        assigns.push((name, val));
                    } else {
                        // `export X=…`, `env X=…` style: an argument word.
                        let e = expand(&w.value, &self.vars);
                        for sub in &e.subs {
                            self.sub(sub);
                        }
                        words.extend(e.words);
                    }
                }
                ItemRef::Item(ast::CommandPrefixOrSuffixItem::IoRedirect(io)) => {
                    self.redirect(io, &mut redirects, &mut input, &mut stdin_from, &mut stdin_other);
                }
                ItemRef::Item(ast::CommandPrefixOrSuffixItem::ProcessSubstitution(_, sub)) => {
                    let start = self.out.len();
                    self.subshell_list(&sub.list);
                    let progs = self.programs_since(start);
                    words.push(EWord { text: "/dev/fd/63".into(), dyn_at: None, sources: progs });
                }
            }
        }
        if words.is_empty() {
            for (n, v) in assigns {
                self.vars.map.insert(n, v);
            }
            if !redirects.is_empty() {
                self.push(Cmd { redirects, cwd: self.cwd.clone(), ..Cmd::default() });
            }
            return;
        }
        let features = Vec::new();
        self.command(Raw { words, redirects, stdin_from, input, stdin_other, features });
    }

    /// Classify an expanded command: unwrap wrappers, recurse into shells, push the result.
    fn command(&mut self, raw: Raw) {
        let Some(first) = raw.words.first() else { return };
        if !first.is_static() {
            let argv: Vec<String> = raw.words.iter().map(|w| w.text.clone()).collect();
            let why = format!("the program `{}` is not known statically", first.text);
            self.opaque(argv, why);
            return;
        }
        let path = first.text.clone();
        let prog = basename(&path).to_string();
        let mut argv: Vec<String> = raw.words.iter().map(|w| w.text.clone()).collect();
        argv[0] = prog.clone();
        let mut dyn_at: Vec<Option<usize>> = raw.words.iter().map(|w| w.dyn_at).collect();
        // Everything but the wrapper/shell handling uses the canonical argv.
        let raw_argv = argv.clone();
        canon_argv(&mut argv, &mut dyn_at);
        let mut cmd = Cmd {
            argv,
            dyn_at,
            path,
            redirects: raw.redirects.clone(),
            cwd: self.cwd.clone(),
            stdin_from: raw.stdin_from.clone(),
            features: raw.features.clone(),
            input: raw.input.clone(),
            ..Cmd::default()
        };
        // Fork bombs: a function calling itself in a pipeline or in the background.
        if self.defining.contains(&prog) && self.in_pipeline_or_bg {
            cmd.features.push("fork-bomb");
        }
        let rest = &raw.words[1..];
        match prog.as_str() {
            "cd" | "pushd" => {
                self.cd(rest.iter().find(|w| !w.text.starts_with('-') || w.text == "-"));
            }
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                for w in rest {
                    if let Some((n, v)) = w.text.split_once('=') {
                        let val = if w.dyn_at.is_none_or(|d| d <= n.len()) && w.dyn_at.is_some() {
                            Var::Dynamic
                        } else if w.is_static() {
                            Var::Static(v.to_string())
                        } else {
                            Var::Dynamic
                        };
                        self.vars.map.insert(n.to_string(), val);
                    }
                }
            }
            "read" | "mapfile" | "readarray" => {
                for w in rest.iter().filter(|w| !w.text.starts_with('-')) {
                    self.vars.map.insert(w.text.clone(), Var::Dynamic);
                }
            }
            "unset" => {
                for w in rest {
                    self.vars.map.remove(&w.text);
                }
            }
            _ => {}
        }
        if self.funcs.contains(&prog) && self.defining.contains(&prog) {
            // Recursive call inside its own definition: nothing more to see.
            self.push(cmd);
            return;
        }
        if let Some(inner) = wrapper_inner(&prog, rest) {
            cmd.features.push("wrapper");
            let stdin_from = raw.stdin_from.clone();
            let inner_words: Vec<EWord> = match inner {
                Inner::Words(k) => {
                    let end = (k + 2).min(raw.words.len());
                    let mut a: Vec<String> = raw.words[..end].iter().map(|w| w.text.clone()).collect();
                    a[0] = prog.clone();
                    if let Some(last) = a.last_mut().filter(|_| end > 1) {
                        *last = basename(last).to_string();
                    }
                    let mut d = vec![None; a.len()];
                    canon_argv(&mut a, &mut d);
                    cmd.argv = a;
                    cmd.dyn_at = d;
                    rest[k..].to_vec()
                }
                Inner::Shell(code) => {
                    self.push(cmd);
                    self.shell_code(code, Vec::new(), &stdin_from);
                    return;
                }
                Inner::None => {
                    self.push(cmd);
                    return;
                }
            };
            // env assignments
            let mut inner_words = inner_words;
            if prog == "env" {
                while inner_words.first().is_some_and(|w| w.text.contains('=') && !w.text.starts_with('=')) {
                    inner_words.remove(0);
                }
            }
            if prog == "watch" && inner_words.len() > 1 && !raw_argv.iter().any(|a| a == "-x" || a == "--exec") {
                // watch runs its arguments through `sh -c`.
                let joined = inner_words.iter().map(|w| w.text.clone()).collect::<Vec<_>>().join(" ");
                let srcs: Vec<String> = inner_words.iter().flat_map(|w| w.sources.clone()).collect();
                self.push(cmd);
                self.shell_code(&EWord { text: joined, dyn_at: None, sources: srcs }, Vec::new(), &stdin_from);
                return;
            }
            self.push(cmd);
            if inner_words.is_empty() {
                return;
            }
            self.command(Raw {
                words: inner_words,
                redirects: raw.redirects,
                stdin_from: raw.stdin_from,
                input: raw.input,
                stdin_other: raw.stdin_other,
                features: Vec::new(),
            });
            return;
        }
        if is_shell(&prog) || is_interp(&prog) {
            self.shell_or_interp(cmd, &prog, rest, &raw);
            return;
        }
        match prog.as_str() {
            "eval" => {
                let joined = rest.iter().map(|w| w.text.clone()).collect::<Vec<_>>().join(" ");
                let dynamic = rest.iter().any(|w| !w.is_static());
                let srcs: Vec<String> = rest.iter().flat_map(|w| w.sources.clone()).collect();
                let code = EWord { text: joined, dyn_at: if dynamic { Some(0) } else { None }, sources: srcs };
                self.push(cmd);
                self.shell_code(&code, Vec::new(), &raw.stdin_from);
            }
            "source" | "." => {
                if let Some(f) = rest.first() {
                    if !f.sources.is_empty() {
                        cmd.code_from.extend(f.sources.iter().cloned());
                        cmd.opaque = Some(format!("`{prog}` runs code produced by {}", f.sources.join(", ")));
                    } else if f.text == "/dev/stdin" || f.text == "-" {
                        cmd.code_from.extend(raw.stdin_from.iter().cloned());
                        cmd.opaque = Some(format!("`{prog}` runs code read from stdin"));
                    }
                }
                self.push(cmd);
            }
            "xargs" | "parallel" => {
                self.push(cmd);
                self.xargs(rest, &raw);
            }
            "find" => {
                self.find(cmd, rest);
            }
            "exec" if rest.is_empty() => self.push(cmd),
            _ => self.push(cmd),
        }
    }

    fn cd(&mut self, target: Option<&EWord>) {
        let Some(t) = target else {
            self.cwd = self.ctx.home.as_ref().map(|h| paths::normalize(h));
            return;
        };
        if !t.is_static() || t.text == "-" {
            self.cwd = None;
            return;
        }
        let home = self.ctx.home.clone().unwrap_or_else(|| PathBuf::from("/root"));
        let p = if t.text == "~" {
            home
        } else if let Some(r) = t.text.strip_prefix("~/") {
            home.join(r)
        } else if t.text.starts_with('/') {
            PathBuf::from(&t.text)
        } else {
            match &self.cwd {
                Some(c) => c.join(&t.text),
                None => return,
            }
        };
        let n = paths::normalize(&p);
        self.vars.pwd = Some(n.to_string_lossy().into_owned());
        self.cwd = Some(n);
    }

    /// Run shell code given as a word (`bash -c`, `eval`, `su -c`).
    fn shell_code(&mut self, code: &EWord, positional: Vec<String>, stdin_from: &[String]) {
        let _ = stdin_from;
        if !code.sources.is_empty() {
            let n = self.out.len();
            self.opaque(
                vec!["sh".into(), "-c".into(), code.text.clone()],
                format!("runs code produced by {}", code.sources.join(", ")),
            );
            if let Some(c) = self.out.get_mut(n) {
                c.code_from = code.sources.clone();
            }
            return;
        }
        if !code.is_static() {
            self.opaque(
                vec!["sh".into(), "-c".into(), code.text.clone()],
                format!("runs code that is not known statically: {}", code.text),
            );
            return;
        }
        let saved = std::mem::replace(&mut self.vars.positional, positional);
        let saved_cwd = self.cwd.clone();
        let saved_map = self.vars.map.clone();
        self.run_str(&code.text);
        self.vars.positional = saved;
        self.cwd = saved_cwd;
        self.vars.map = saved_map;
    }

    fn shell_or_interp(&mut self, mut cmd: Cmd, prog: &str, rest: &[EWord], raw: &Raw) {
        let shell = is_shell(prog);
        // Find -c / -e code, or a script operand.
        let mut i = 0;
        let mut code: Option<(usize, bool)> = None; // (index of code word, is_shell_code)
        let mut script: Option<usize> = None;
        let mut reads_stdin_flag = false;
        let mut module = false;
        while i < rest.len() {
            let a = &rest[i].text;
            if a == "--" {
                if i + 1 < rest.len() {
                    script = Some(i + 1);
                }
                break;
            }
            if a == "-" {
                reads_stdin_flag = true;
                break;
            }
            if let Some(flags) = a.strip_prefix('-').filter(|_| !a.starts_with("--")) {
                if shell && (flags.contains('c')) {
                    code = Some((i + 1, true));
                    break;
                }
                if shell && flags.contains('s') {
                    reads_stdin_flag = true;
                }
                if !shell
                    && (flags.starts_with('c')
                        || flags.starts_with('e')
                        || flags.starts_with('E')
                        || flags.starts_with('r'))
                    && prog != "awk"
                {
                    code = Some((i + 1, false));
                    // `perl -e'code'` / `python -c'code'`
                    if flags.len() > 1 && !flags[1..].chars().all(|c| c.is_ascii_alphabetic()) {
                        code = Some((i, false));
                    }
                    break;
                }
                if !shell && flags.starts_with('m') {
                    module = true;
                    break;
                }
                if shell && (flags == "o" || flags == "O") {
                    i += 1;
                }
                i += 1;
                continue;
            }
            if a.starts_with("--") {
                if !shell && (a == "--eval" || a == "--command" || a == "--print") {
                    code = Some((i + 1, false));
                    break;
                }
                i += 1;
                continue;
            }
            if prog.ends_with("awk") {
                // awk's first operand is its program text.
                code = Some((i, false));
                break;
            }
            script = Some(i);
            break;
        }
        if prog.ends_with("awk") {
            // awk programs can run commands via system() or pipes: opaque only if they do.
            if let Some((k, _)) = code {
                if let Some(w) = rest.get(k) {
                    if w.text.contains("system")
                        || w.text.contains("| \"")
                        || w.text.contains("|\"")
                        || w.text.contains("|&")
                    {
                        cmd.opaque = Some("awk program runs commands".into());
                    }
                }
            }
            self.push(cmd);
            return;
        }
        if let Some((k, is_shell_code)) = code {
            let Some(w) = rest.get(k) else {
                self.push(cmd);
                return;
            };
            if is_shell_code {
                let positional: Vec<String> = rest.iter().skip(k + 2).map(|w| w.text.clone()).collect();
                let w = w.clone();
                self.push(cmd);
                self.shell_code(&w, positional, &raw.stdin_from);
            } else {
                if !w.sources.is_empty() {
                    cmd.code_from.extend(w.sources.iter().cloned());
                }
                cmd.opaque = Some(format!("`{prog}` runs inline code the engine cannot see through"));
                self.push(cmd);
            }
            return;
        }
        if module {
            self.push(cmd);
            return;
        }
        if let Some(k) = script.filter(|_| !reads_stdin_flag) {
            let w = &rest[k];
            if !w.sources.is_empty() {
                cmd.code_from.extend(w.sources.iter().cloned());
                cmd.opaque = Some(format!("`{prog}` runs code produced by {}", w.sources.join(", ")));
            } else if w.text == "/dev/stdin" {
                cmd.code_from.extend(raw.stdin_from.iter().cloned());
                cmd.opaque = Some(format!("`{prog}` runs code read from stdin"));
            }
            self.push(cmd);
            return;
        }
        // Reads its program from stdin.
        cmd.code_from.extend(raw.stdin_from.iter().cloned());
        let static_input = raw.input.clone().filter(|_| !raw.stdin_other);
        match static_input {
            Some(text) if shell => {
                self.push(cmd);
                let positional: Vec<String> =
                    rest.iter().filter(|w| !w.text.starts_with('-')).map(|w| w.text.clone()).collect();
                self.shell_code(&EWord::lit(&text), positional, &[]);
            }
            Some(_) => {
                cmd.opaque = Some(format!("`{prog}` runs code from its input"));
                self.push(cmd);
            }
            None => {
                cmd.opaque = Some(if raw.stdin_from.is_empty() {
                    format!("`{prog}` reads commands from stdin")
                } else {
                    format!("`{prog}` runs code piped from {}", raw.stdin_from.join(", "))
                });
                self.push(cmd);
            }
        }
    }

    fn xargs(&mut self, rest: &[EWord], raw: &Raw) {
        let mut i = 0;
        let mut replace: Option<String> = None;
        let mut interactive = false;
        while i < rest.len() {
            let a = rest[i].text.as_str();
            if a == "--" {
                i += 1;
                break;
            }
            if !a.starts_with('-') {
                break;
            }
            match a {
                "-I" => {
                    replace = rest.get(i + 1).map(|w| w.text.clone());
                    i += 2;
                    continue;
                }
                "-i" => replace = Some("{}".into()),
                "-p" | "--interactive" => interactive = true,
                "-n" | "-P" | "-d" | "-L" | "-s" | "-a" | "-E" | "-e" | "-j" | "--jobs" | "--max-args"
                | "--max-procs" | "--delimiter" | "--arg-file" | "--max-lines" => {
                    i += 2;
                    continue;
                }
                _ => {
                    if let Some(r) = a.strip_prefix("-I") {
                        replace = Some(r.to_string());
                    } else if let Some(r) = a.strip_prefix("--replace=") {
                        replace = Some(r.to_string());
                    } else if let Some(r) = a.strip_prefix("-i") {
                        replace = Some(r.to_string());
                    }
                }
            }
            i += 1;
        }
        let mut inner: Vec<EWord> = rest[i..].to_vec();
        if inner.is_empty() {
            inner.push(EWord::lit("echo"));
        }
        // What arrives on stdin: static text from `echo …|`, else unknown.
        let items: Vec<EWord> = match &raw.input {
            Some(t) if !raw.stdin_other => t.split_whitespace().take(16).map(EWord::lit).collect(),
            _ => vec![EWord { text: "{xargs}".into(), dyn_at: Some(0), sources: raw.stdin_from.clone() }],
        };
        const FILTERS: &[&str] =
            &["find", "ls", "tr", "grep", "egrep", "sort", "uniq", "head", "tail", "sed", "awk", "xargs", "cut", "cat"];
        let items = if raw.input.is_none()
            && !raw.stdin_from.is_empty()
            && raw.stdin_from.iter().all(|p| FILTERS.contains(&p.as_str()))
        {
            // Items come from a `find`/`ls`: the finder's command tells where.
            self.finder_items().unwrap_or(items)
        } else {
            items
        };
        let mut words: Vec<EWord> = Vec::new();
        match replace {
            Some(r) if !r.is_empty() => {
                for w in inner {
                    if w.text.contains(&r) {
                        for it in &items {
                            words.push(EWord {
                                text: w.text.replace(&r, &it.text),
                                dyn_at: it.dyn_at.map(|_| 0),
                                sources: it.sources.clone(),
                            });
                        }
                    } else {
                        words.push(w);
                    }
                }
            }
            _ => {
                words = inner;
                words.extend(items);
            }
        }
        let features = if interactive { vec!["interactive"] } else { Vec::new() };
        self.command(Raw {
            words,
            redirects: Vec::new(),
            stdin_from: Vec::new(),
            input: None,
            stdin_other: true,
            features,
        });
    }

    /// The item paths a preceding `find ROOT …` / `ls DIR` in the pipeline would print.
    fn finder_items(&self) -> Option<Vec<EWord>> {
        let c = self.out.iter().rev().find(|c| c.program() == "find" || c.program() == "ls")?;
        let roots = find_roots(&c.argv[1..]);
        let scope = if c.program() == "find" { find_scope(&c.argv[1..]) } else { "{}" };
        Some(roots.iter().map(|r| EWord::lit(&join_marker(r, scope))).collect())
    }

    fn find(&mut self, mut cmd: Cmd, rest: &[EWord]) {
        let args: Vec<String> = rest.iter().map(|w| w.text.clone()).collect();
        let roots = find_roots(&args);
        let scope = find_scope(&args);
        let markers: Vec<String> = roots.iter().map(|r| join_marker(r, scope)).collect();
        let mut i = 0;
        let mut deletes = false;
        let mut execs: Vec<(Vec<EWord>, bool)> = Vec::new();
        while i < rest.len() {
            let a = rest[i].text.as_str();
            match a {
                "-delete" => deletes = true,
                "-exec" | "-execdir" | "-ok" | "-okdir" => {
                    let interactive = a.starts_with("-ok");
                    let mut j = i + 1;
                    let mut inner = Vec::new();
                    while j < rest.len() && rest[j].text != ";" && rest[j].text != "+" {
                        let glued = rest[j].text.len() > 1 && rest[j].text.ends_with(';');
                        let text = if glued {
                            rest[j].text[..rest[j].text.len() - 1].to_string()
                        } else {
                            rest[j].text.clone()
                        };
                        if text.contains("{}") {
                            for m in &markers {
                                inner.push(EWord { text: text.replace("{}", m), dyn_at: None, sources: Vec::new() });
                            }
                            if glued {
                                break;
                            }
                            j += 1;
                            continue;
                        }
                        if glued {
                            inner.push(EWord::lit(&text));
                            break;
                        }
                        if rest[j].text.contains("{}") {
                            for m in &markers {
                                inner.push(EWord {
                                    text: rest[j].text.replace("{}", m),
                                    dyn_at: None,
                                    sources: Vec::new(),
                                });
                            }
                        } else {
                            inner.push(rest[j].clone());
                        }
                        j += 1;
                    }
                    execs.push((inner, interactive));
                    i = j;
                }
                _ => {}
            }
            i += 1;
        }
        if deletes || !execs.is_empty() {
            cmd.features.push("find-action");
        }
        self.push(cmd);
        if deletes {
            let mut words = vec![EWord::lit("rm"), EWord::lit("-r"), EWord::lit("-f")];
            words.extend(markers.iter().map(|m| EWord::lit(m)));
            self.command(Raw {
                words,
                redirects: Vec::new(),
                stdin_from: Vec::new(),
                input: None,
                stdin_other: true,
                features: vec!["find-delete"],
            });
        }
        for (inner, interactive) in execs {
            if inner.is_empty() {
                continue;
            }
            let features = if interactive { vec!["interactive"] } else { Vec::new() };
            self.command(Raw {
                words: inner,
                redirects: Vec::new(),
                stdin_from: Vec::new(),
                input: None,
                stdin_other: true,
                features,
            });
        }
    }
}

enum ItemRef<'a> {
    Item(&'a ast::CommandPrefixOrSuffixItem),
    Word(&'a ast::Word),
}

/// `find` roots: operands before the first expression token.
fn find_roots(args: &[String]) -> Vec<String> {
    let mut roots = Vec::new();
    for a in args {
        if a == "-H" || a == "-L" || a == "-P" {
            continue;
        }
        if a.starts_with('-') || a == "(" || a == "!" || a == "\\(" {
            break;
        }
        roots.push(a.clone());
    }
    if roots.is_empty() {
        roots.push(".".into());
    }
    roots
}

/// Disposable or specific name patterns narrow a find; generic user-data types do not.
fn find_scope(args: &[String]) -> &'static str {
    const GENERIC_EXT: &[&str] =
        &["txt", "mp3", "mp4", "mpg", "mpeg", "avi", "mkv", "jpg", "jpeg", "png", "gif", "wav", "flac", "mov", "*"];
    let mut selective = false;
    let mut k = 0;
    while k < args.len() {
        let a = args[k].as_str();
        if matches!(
            a,
            "-name" | "-iname" | "-path" | "-ipath" | "-wholename" | "-regex" | "-iregex" | "-inum" | "-samefile"
        ) {
            if let Some(p) = args.get(k + 1) {
                let p = &p.trim_matches(|c| c == '\u{2018}' || c == '\u{2019}').to_string();
                let generic = p == "*"
                    || p.strip_prefix("*.").is_some_and(|e| GENERIC_EXT.contains(&e.to_ascii_lowercase().as_str()))
                    || p == ".*";
                if !generic {
                    selective = true;
                }
            }
            k += 2;
            continue;
        }
        k += 1;
    }
    if selective {
        "**"
    } else {
        "{}"
    }
}

fn join_marker(root: &str, marker: &str) -> String {
    if root.ends_with('/') {
        format!("{root}{marker}")
    } else {
        format!("{root}/{marker}")
    }
}

/// Text an `echo`/`printf` with static words prints (for `echo … | sh`, `echo … | xargs`).
fn static_output(c: &ast::Command, vars: &Vars) -> Option<String> {
    let ast::Command::Simple(s) = c else { return None };
    let prog = s.word_or_name.as_ref()?;
    let p = expand(&prog.value, vars).words.into_iter().next()?;
    if !(p.text == "echo" || p.text == "printf") || !p.is_static() {
        return None;
    }
    let mut parts = Vec::new();
    for it in s.suffix.iter().flat_map(|x| x.0.iter()) {
        match it {
            ast::CommandPrefixOrSuffixItem::Word(w) => {
                let e = expand(&w.value, vars);
                if !e.subs.is_empty() {
                    return None;
                }
                for w in e.words {
                    if !w.is_static() {
                        return None;
                    }
                    if parts.is_empty()
                        && p.text == "echo"
                        && (w.text == "-e" || w.text == "-n" || w.text == "-ne" || w.text == "-en")
                    {
                        continue;
                    }
                    parts.push(w.text);
                }
            }
            ast::CommandPrefixOrSuffixItem::IoRedirect(_) => {}
            _ => return None,
        }
    }
    let text = parts.join(" ");
    Some(text.replace("\\n", "\n"))
}

enum Inner<'w> {
    /// The inner command starts at this index of the arguments.
    Words(usize),
    /// The wrapper runs this shell code (`su -c CODE`).
    Shell(&'w EWord),
    /// No inner command (e.g. `sudo -l`, `command -v x`).
    None,
}

/// Where a wrapper's inner command starts.
fn wrapper_inner<'w>(prog: &str, rest: &'w [EWord]) -> Option<Inner<'w>> {
    // (options taking a value, positional operands before the command)
    let (valued, skip): (&[&str], usize) = match prog {
        "sudo" => (
            &[
                "-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "-R", "--user", "--group", "--chdir",
                "--prompt",
            ],
            0,
        ),
        "doas" => (&["-u", "-C"], 0),
        "run0" | "pkexec" => (&["--user", "-u"], 0),
        "runuser" => (&["-u", "-g", "-G", "--user", "--group"], 0),
        "env" => (&["-u", "-C", "-S", "--unset", "--chdir", "--split-string"], 0),
        "nice" => (&["-n", "--adjustment"], 0),
        "ionice" => (&["-c", "-n", "-p", "-P", "-u", "--class", "--classdata"], 0),
        "timeout" => (&["-s", "-k", "--signal", "--kill-after"], 1),
        "nohup" | "builtin" | "setsid" | "unbuffer" | "torsocks" | "proxychains" | "proxychains4" | "caffeinate"
        | "tsocks" | "catchsegv" => (&[], 0),
        "command" => (&[], 0),
        "exec" => (&["-a"], 0),
        "stdbuf" => (&["-i", "-o", "-e", "--input", "--output", "--error"], 0),
        "chroot" => (&["--userspec", "--groups"], 1),
        "time" => (&["-f", "-o", "--format", "--output"], 0),
        "watch" => (&["-n", "-d", "--interval", "-q", "--chgexit"], 0),
        "flock" => (&["-w", "-E", "--timeout", "--conflict-exit-code"], 1),
        "strace" | "ltrace" => (&["-e", "-o", "-p", "-s", "-u", "-E"], 0),
        "su" => (&[], 0),
        "firejail" | "bwrap" | "unshare" | "nsenter" | "systemd-run" | "faketime" => (&[], 0),
        "sg" => (&[], 1),
        _ => return None,
    };
    if prog == "su" {
        // su [opts] [user] [-c CODE]
        let mut k = 0;
        while k < rest.len() {
            let a = rest[k].text.as_str();
            if a == "-c" || a == "--command" {
                return Some(rest.get(k + 1).map(Inner::Shell).unwrap_or(Inner::None));
            }
            if let Some(c) = a.strip_prefix("--command=") {
                let _ = c;
                return Some(Inner::None);
            }
            k += 1;
        }
        return Some(Inner::None);
    }
    let mut k = 0;
    let mut skipped = 0;
    while k < rest.len() {
        let a = rest[k].text.as_str();
        if a == "--" {
            k += 1;
            break;
        }
        if prog == "command" && (a == "-v" || a == "-V") {
            return Some(Inner::None);
        }
        if a.starts_with('-') && a.len() > 1 {
            if valued.contains(&a) {
                k += 2;
            } else {
                k += 1;
            }
            continue;
        }
        if prog == "env" && a.contains('=') {
            k += 1;
            continue;
        }
        if skipped < skip {
            skipped += 1;
            k += 1;
            continue;
        }
        break;
    }
    if prog == "time" && k == 0 && rest.is_empty() {
        return Some(Inner::None);
    }
    if k >= rest.len() {
        return Some(Inner::None);
    }
    Some(Inner::Words(k))
}

/// Where a word would point (a helper for tests and rules).
#[allow(dead_code)]
pub(crate) fn cwd_of(c: &Cmd) -> Option<&Path> {
    c.cwd.as_deref()
}

/// Map of variables (exposed for tests).
#[allow(dead_code)]
pub(crate) type VarMap = HashMap<String, Var>;

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Context {
        Context {
            workspace: PathBuf::from("/home/dev/proj"),
            cwd: PathBuf::from("/home/dev/proj"),
            home: Some(PathBuf::from("/home/dev")),
        }
    }

    fn argvs(s: &str) -> Vec<Vec<String>> {
        extract_str(s, &ctx()).cmds.into_iter().map(|c| c.argv).collect()
    }

    fn has(s: &str, want: &[&str]) -> bool {
        argvs(s).iter().any(|a| a == want)
    }

    #[test]
    fn basic_canonical() {
        assert!(has("r''m -rf /", &["rm", "-r", "-f", "/"]));
        assert!(has("$'\\x72\\x6d' -rf /", &["rm", "-r", "-f", "/"]));
        assert!(has("/bin/rm --recursive --force /", &["rm", "-r", "-f", "/"]));
        assert!(has("rm -R -f x", &["rm", "-r", "-f", "x"]));
    }

    #[test]
    fn nesting() {
        assert!(has("bash -c 'rm -rf ~'", &["rm", "-r", "-f", "~"]));
        assert!(has("eval 'rm -rf /'", &["rm", "-r", "-f", "/"]));
        assert!(has("echo $(rm -rf /)", &["rm", "-r", "-f", "/"]));
        assert!(has("echo `rm -rf /`", &["rm", "-r", "-f", "/"]));
        assert!(has("sudo rm -rf /", &["rm", "-r", "-f", "/"]));
        assert!(has("timeout 5 rm -rf /", &["rm", "-r", "-f", "/"]));
        assert!(has("env FOO=1 rm -rf /", &["rm", "-r", "-f", "/"]));
        assert!(has("nice -n 5 ionice -c 3 rm -rf /", &["rm", "-r", "-f", "/"]));
        assert!(has("echo / | xargs rm -rf", &["rm", "-r", "-f", "/"]));
        assert!(has("find ~ -exec rm -rf {} +", &["rm", "-r", "-f", "~/{}"]));
        assert!(
            has("find / -delete", &["rm", "-r", "-f", "//{}"]) || has("find / -delete", &["rm", "-r", "-f", "/{}"])
        );
        assert!(has("sh -c 'rm -rf $1' x /", &["rm", "-r", "-f", "/"]));
        assert!(has("f() { rm -rf /; }; f", &["rm", "-r", "-f", "/"]));
        assert!(has("for d in / ~; do rm -rf $d; done", &["rm", "-r", "-f", "/"]));
        assert!(has("bash <<EOF\nrm -rf /\nEOF", &["rm", "-r", "-f", "/"]));
        assert!(has("bash <<< 'rm -rf /'", &["rm", "-r", "-f", "/"]));
        assert!(has("echo 'rm -rf /' | sh", &["rm", "-r", "-f", "/"]));
        assert!(has("su -c 'rm -rf /' root", &["rm", "-r", "-f", "/"]));
        assert!(has("X=/; rm -rf $X", &["rm", "-r", "-f", "/"]));
        assert!(has("rm -rf ${X:-/}", &["rm", "-r", "-f", "/"]));
        assert!(has("(cd /tmp && rm -rf x)", &["rm", "-r", "-f", "x"]));
        assert!(has("cat <(rm -rf /)", &["rm", "-r", "-f", "/"]));
    }

    #[test]
    fn cwd_tracking() {
        let e = extract_str("cd / && rm -rf *", &ctx());
        let rm = e.cmds.iter().find(|c| c.program() == "rm").map(|c| c.cwd.clone());
        assert_eq!(rm, Some(Some(PathBuf::from("/"))));
    }

    #[test]
    fn opacity() {
        let e = extract_str("$CMD -rf /", &ctx());
        assert!(e.cmds.iter().any(|c| c.opaque.is_some()));
        let e = extract_str("eval \"$x\"", &ctx());
        assert!(e.cmds.iter().any(|c| c.opaque.is_some()));
        let e = extract_str("curl x | sh", &ctx());
        assert!(e.cmds.iter().any(|c| c.code_from == ["curl"]));
        let e = extract_str("bash <(curl x)", &ctx());
        assert!(e.cmds.iter().any(|c| c.code_from == ["curl"]));
        let e = extract_str("sh -c \"$(curl x)\"", &ctx());
        assert!(e.cmds.iter().any(|c| c.code_from == ["curl"]));
        let e = extract_str("if then fi (", &ctx());
        assert!(e.parse_error.is_some());
    }

    #[test]
    fn fork_bomb() {
        let e = extract_str(":(){ :|:& };:", &ctx());
        assert!(e.cmds.iter().any(|c| c.features.contains(&"fork-bomb")), "{:?}", e.cmds);
        let e = extract_str("bomb() { bomb | bomb & }; bomb", &ctx());
        assert!(e.cmds.iter().any(|c| c.features.contains(&"fork-bomb")));
        let e = extract_str("f() { echo hi; }; f | f", &ctx());
        assert!(!e.cmds.iter().any(|c| c.features.contains(&"fork-bomb")));
    }
}
