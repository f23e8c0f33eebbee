//! The AST walk: lists, pipelines, compound commands, functions, redirections and simple
//! commands of brush-parser's AST, turned into expanded words ([`Raw`]) for `dispatch`. Owns
//! how shell structure carries state (subshells restore cwd and variables, pipelines feed
//! stdin); it may not know any program by name except `echo`/`printf` (static output).

use brush_parser::ast;

use super::{Cmd, Extractor, Raw, Redir};
use crate::words::{expand, EWord, Var, Vars};

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
}

enum ItemRef<'a> {
    Item(&'a ast::CommandPrefixOrSuffixItem),
    Word(&'a ast::Word),
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
