//! The AST walk: lists, pipelines, compound commands, functions, redirections and simple
//! commands of brush-parser's AST, turned into expanded words ([`Raw`]) for `dispatch`. Owns
//! how shell structure carries state (subshells restore cwd and variables, pipelines feed
//! stdin); it may not know any program by name except `echo`/`printf` (static output).

use std::path::PathBuf;

use brush_parser::ast;

use super::programs::{is_interp, is_shell};
use super::{hooks, statics, Cmd, Extractor, Raw, Redir};

/// The path a process substitution `<(…)` / `>(…)` stands for.
pub(super) const PROC_SUB: &str = "/dev/fd/63";
use crate::words::{expand, expand_with, EWord, Var};

impl Extractor<'_> {
    pub(super) fn list(&mut self, l: &ast::CompoundList) {
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
        let mut prev: Option<Stdin> = None;
        let saved = self.in_pipeline_or_bg;
        if p.seq.len() > 1 {
            self.in_pipeline_or_bg = true;
        }
        for (k, c) in p.seq.iter().enumerate() {
            let start = self.out.len();
            // What this stage prints, when it is computed from literals (read by a next stage, or
            // written to a file that may be run later).
            let to_file = redirects_output(c);
            let text = if k + 1 < p.seq.len() || to_file {
                statics::output(c, &self.vars, prev.as_ref().and_then(|p| p.text.as_deref()), &self.known())
            } else {
                None
            };
            self.command_node(c, prev.as_ref());
            if let Some(t) = text.as_ref().filter(|_| to_file) {
                let files: Vec<(String, Option<PathBuf>)> = self.out[start..]
                    .iter()
                    .flat_map(|c| {
                        c.redirects
                            .iter()
                            .filter(|r| r.write && r.dyn_at.is_none())
                            .map(|r| (r.target.clone(), c.cwd.clone()))
                    })
                    .collect();
                for (f, cwd) in files {
                    self.note_script(&f, cwd.as_deref(), t);
                }
            }
            // The last stage feeds nothing.
            if k + 1 == p.seq.len() {
                break;
            }
            // What a filter passes on came from its own input: `curl … | tee f | sh` runs
            // what curl fetched.
            let mut programs = self.programs_since(start);
            for cmd in &self.out[start..] {
                if passes_through(cmd.program()) {
                    for p in &cmd.stdin_from {
                        if !programs.contains(p) {
                            programs.push(p.clone());
                        }
                    }
                }
            }
            prev = Some(Stdin { programs, text, feeds: (start..self.out.len()).collect() });
        }
        self.in_pipeline_or_bg = saved;
    }

    fn command_node(&mut self, c: &ast::Command, stdin: Option<&Stdin>) {
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
                if let Some(input) = stdin {
                    for cmd in &mut self.out[start..] {
                        cmd.stdin_from.extend(input.programs.iter().cloned());
                        cmd.feeds.extend(input.feeds.iter().copied());
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

    pub(super) fn compound(&mut self, cc: &ast::CompoundCommand) {
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
        self.funcs.insert(name.clone(), f.body.0.clone());
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
                        let end = self.out.len();
                        self.feeds_acc.extend(start..end);
                        if is_stdin {
                            stdin_from.extend(self.programs_since(start));
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
                let value = super::heredoc::body(&doc.doc.value, &self.bodies).to_string();
                if doc.requires_expansion {
                    let e = expand(&format!("\"{}\"", value.replace('"', "\\\"")), &self.vars);
                    for s in &e.subs {
                        let p = self.sub_programs(s);
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
                    *input = Some(value);
                }
            }
            ast::IoRedirect::HereString(_, w) => {
                let e = expand_with(&w.value, &self.vars, &|b| statics::substitution(b, &self.vars, &self.kept));
                for s in &e.static_subs {
                    self.sub(s);
                }
                for s in &e.subs {
                    let p = self.sub_programs(s);
                    stdin_from.extend(p);
                }
                // A here-string is one word: what field splitting separated is joined again.
                if !e.words.is_empty() {
                    if e.words.iter().any(|t| !t.is_static()) {
                        *stdin_other = true;
                    }
                    *input = Some(e.words.iter().map(|t| t.text.as_str()).collect::<Vec<_>>().join(" "));
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

    fn simple(&mut self, s: &ast::SimpleCommand, stdin: Option<&Stdin>) {
        let mut words: Vec<EWord> = Vec::new();
        let mut redirects = Vec::new();
        let mut input = None;
        let mut stdin_from = Vec::new();
        let mut stdin_other = false;
        let mut assigns: Vec<(String, Var)> = Vec::new();
        let outer_feeds = std::mem::take(&mut self.feeds_acc);
        if let Some(i) = stdin {
            stdin_from.extend(i.programs.iter().cloned());
            input.clone_from(&i.text);
            self.feeds_acc.extend(i.feeds.iter().copied());
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
                    let mut srcs = self.feeds_of_vars(&w.value);
                    let e = expand_with(&w.value, &self.vars, &|b| statics::substitution(b, &self.vars, &self.kept));
                    for sub in &e.static_subs {
                        self.sub(sub);
                    }
                    for sub in &e.subs {
                        srcs.extend(self.sub_programs(sub));
                    }
                    for mut ew in e.words {
                        ew.sources = srcs.clone();
                        words.push(ew);
                    }
                }
                ItemRef::Item(ast::CommandPrefixOrSuffixItem::AssignmentWord(a, w)) => {
                    let (name, index) = match &a.name {
                        ast::AssignmentName::VariableName(n) => (n.clone(), None),
                        ast::AssignmentName::ArrayElementName(n, i) => (n.clone(), Some(i.clone())),
                    };
                    let val = match &a.value {
                        ast::AssignmentValue::Scalar(v) => {
                            let e = expand_with(&v.value, &self.vars, &|b| {
                                statics::substitution(b, &self.vars, &self.kept)
                            });
                            for sub in e.subs.iter().chain(&e.static_subs) {
                                self.sub(sub);
                            }
                            // An assignment is not split: what a substitution printed is one value.
                            // `x+=y` appends to a known value.
                            let old = match self.vars.map.get(&name) {
                                _ if !a.append => Some(String::new()),
                                Some(Var::Static(s)) if index.is_none() => Some(s.clone()),
                                None => Some(String::new()),
                                _ => None,
                            };
                            let value = old.filter(|_| e.words.iter().all(|w| w.is_static())).map(|old| {
                                old + &e.words.iter().map(|w| w.text.as_str()).collect::<Vec<_>>().join(" ")
                            });
                            match (value, index.and_then(|i| i.parse::<usize>().ok())) {
                                (Some(v), None) => Var::Static(v),
                                (Some(v), Some(k)) if k < 64 => {
                                    let mut items = match self.vars.map.get(&name) {
                                        Some(Var::Array(items)) => items.clone(),
                                        Some(Var::Static(s)) => vec![s.clone()],
                                        None => Vec::new(),
                                        Some(Var::Dynamic) => Vec::new(),
                                    };
                                    items.resize(items.len().max(k + 1), String::new());
                                    items[k] = v;
                                    Var::Array(items)
                                }
                                _ => Var::Dynamic,
                            }
                        }
                        ast::AssignmentValue::Array(elements) => {
                            let mut items = Vec::new();
                            let mut known = !a.append;
                            for (key, w) in elements {
                                let e = expand_with(&w.value, &self.vars, &|b| {
                                    statics::substitution(b, &self.vars, &self.kept)
                                });
                                for sub in e.subs.iter().chain(&e.static_subs) {
                                    self.sub(sub);
                                }
                                known &= key.is_none() && e.words.iter().all(|w| w.is_static());
                                items.extend(e.words.into_iter().map(|w| w.text));
                            }
                            if known {
                                Var::Array(items)
                            } else {
                                Var::Dynamic
                            }
                        }
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
                ItemRef::Item(ast::CommandPrefixOrSuffixItem::ProcessSubstitution(kind, sub)) => {
                    let start = self.out.len();
                    self.subshell_list(&sub.list);
                    let end = self.out.len();
                    self.feeds_acc.extend(start..end);
                    let progs = self.programs_since(start);
                    if matches!(kind, ast::ProcessSubstitutionKind::Write) {
                        // `tee >(sh)`: what the command writes there is the inner shell's input,
                        // and a filter writes what it reads.
                        let writer = words.first().is_some_and(|w| passes_through(&w.text));
                        let from: Vec<String> = if writer { stdin_from.clone() } else { Vec::new() };
                        for c in &mut self.out[start..end] {
                            if (is_shell(c.program()) || is_interp(c.program())) && c.opaque.is_some() {
                                c.code_from.extend(from.iter().cloned());
                            }
                        }
                    } else if let Some(text) = statics::list_output(&sub.list, &self.vars, &self.known()) {
                        // `. <(echo …)`: the file's content is known.
                        let cwd = self.cwd.clone();
                        self.forget_script(PROC_SUB);
                        self.note_script(PROC_SUB, cwd.as_deref(), &text);
                    }
                    words.push(EWord { text: PROC_SUB.into(), dyn_at: None, sources: progs });
                }
            }
        }
        let feeds = std::mem::replace(&mut self.feeds_acc, outer_feeds);
        if words.is_empty() {
            for (n, v) in assigns {
                if feeds.is_empty() {
                    self.var_feeds.remove(&n);
                } else {
                    self.var_feeds.insert(n.clone(), feeds.clone());
                }
                self.vars.map.insert(n, v);
            }
            if !redirects.is_empty() {
                self.push(Cmd { redirects, cwd: self.cwd.clone(), feeds, ..Cmd::default() });
            }
            return;
        }
        self.command(Raw { words, redirects, stdin_from, input, stdin_other, features: Vec::new(), feeds });
        // `GIT_SSH_COMMAND='…' git fetch`: the program runs the variable's value.
        for (n, v) in assigns.into_iter().filter(|(n, _)| hooks::is_code_var(n)) {
            let code = match v {
                Var::Static(s) => EWord::lit(&s),
                _ => EWord { text: format!("${n}"), dyn_at: Some(0), sources: Vec::new() },
            };
            self.shell_code(&code, Vec::new());
        }
    }

    /// What static evaluation may read besides the AST.
    fn known(&self) -> statics::Known<'_> {
        statics::Known { bodies: &self.bodies, files: self }
    }

    /// A word that expands a variable assigned from a substitution is fed by what that ran;
    /// returns those programs (the word is made of their output).
    fn feeds_of_vars(&mut self, raw: &str) -> Vec<String> {
        let mut programs = Vec::new();
        if self.var_feeds.is_empty() || !raw.contains('$') {
            return programs;
        }
        for (name, feeds) in &self.var_feeds {
            let named = raw.match_indices(name.as_str()).any(|(i, _)| {
                let before = &raw[..i];
                let after = raw[i + name.len()..].chars().next();
                (before.ends_with('$') || before.ends_with("${"))
                    && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            if named {
                self.feeds_acc.extend(feeds.iter().copied());
                for p in feeds.iter().filter_map(|i| self.out.get(*i)).map(|c| c.program().to_string()) {
                    if !p.is_empty() && !programs.contains(&p) {
                        programs.push(p);
                    }
                }
            }
        }
        programs
    }
}

/// What reaches a command's stdin from the pipeline stage before it.
pub(super) struct Stdin {
    /// The programs whose output arrives, through filters (`tee`, `base64 -d`, …) included.
    programs: Vec<String>,
    /// The text, when the stage only prints static words (`echo …`).
    text: Option<String>,
    /// The commands of that stage.
    feeds: Vec<usize>,
}

/// A simple command that sends its output to a file (`>`, `>>`, `>|`).
fn redirects_output(c: &ast::Command) -> bool {
    let ast::Command::Simple(s) = c else { return false };
    s.prefix.iter().flat_map(|p| p.0.iter()).chain(s.suffix.iter().flat_map(|x| x.0.iter())).any(|it| {
        matches!(
            it,
            ast::CommandPrefixOrSuffixItem::IoRedirect(ast::IoRedirect::File(
                None | Some(1),
                ast::IoFileRedirectKind::Write | ast::IoFileRedirectKind::Append | ast::IoFileRedirectKind::Clobber,
                _
            ))
        )
    })
}

/// Programs whose output is (a transformation of) their input.
pub(super) fn passes_through(p: &str) -> bool {
    const FILTERS: &[&str] = &[
        "cat",
        "tee",
        "base64",
        "base32",
        "basenc",
        "gunzip",
        "gzip",
        "zcat",
        "bzip2",
        "bunzip2",
        "bzcat",
        "xz",
        "unxz",
        "xzcat",
        "zstd",
        "unzstd",
        "zstdcat",
        "lz4",
        "brotli",
        "xxd",
        "rev",
        "tr",
        "sed",
        "awk",
        "gawk",
        "head",
        "tail",
        "dd",
        "openssl",
        "gpg",
        "tac",
        "sort",
        "uniq",
        "cut",
        "iconv",
        "dos2unix",
        "tar",
        "unzip",
        "uudecode",
        "jq",
        "b64decode",
        "pv",
        "stdbuf",
    ];
    FILTERS.contains(&p)
}

enum ItemRef<'a> {
    Item(&'a ast::CommandPrefixOrSuffixItem),
    Word(&'a ast::Word),
}
