//! What one expanded command is: a wrapper to look through, a shell or interpreter, a builtin
//! that changes the extractor's state (`cd`, `export`, `eval`, `source`), or a plain program.
//! Owns the order of those checks; per-program models live in `programs`.

use std::path::PathBuf;

use super::flags::{basename, canon_argv};
use super::programs::{is_interp, is_shell};
use super::wrappers::{wrapper_inner, wrapper_target, Inner, Target};
use super::{hooks, Cmd, Extractor, Feature, Raw, MAX_DEPTH};
use crate::paths;
use crate::words::{EWord, Var};

impl Extractor<'_> {
    pub(super) fn command(&mut self, raw: Raw) {
        let Some(first) = raw.words.first() else { return };
        if !first.is_static() {
            let argv: Vec<String> = raw.words.iter().map(|w| w.text.clone()).collect();
            let why = format!("the program `{}` is not known statically", first.text);
            let n = self.out.len();
            self.opaque(argv, why);
            // An unknown program (`$SHELL`) may be a shell: what is piped in may be its code.
            if let Some(c) = self.out.get_mut(n) {
                c.code_from.clone_from(&raw.stdin_from);
            }
            return;
        }
        let path = first.text.clone();
        let prog = basename(&path).to_string();
        let mut argv: Vec<String> = raw.words.iter().map(|w| w.text.clone()).collect();
        argv[0] = prog.clone();
        let mut dyn_at: Vec<Option<usize>> = raw.words.iter().map(|w| w.dyn_at).collect();
        // Everything but the wrapper/shell handling (which reads `raw.words`) uses the canonical argv.
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
            feeds: raw.feeds.clone(),
            ..Cmd::default()
        };
        // Fork bombs: a function calling itself in a pipeline or in the background.
        if self.defining.contains(&prog) && self.in_pipeline_or_bg {
            cmd.features.push(Feature::ForkBomb);
        }
        let rest = &raw.words[1..];
        for code in hooks::embedded_code(&prog, &raw.words) {
            self.shell_code(&code, Vec::new());
        }
        match prog.as_str() {
            "cd" | "pushd" => {
                self.cd(rest.iter().find(|w| !w.text.starts_with('-') || w.text == "-"));
            }
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                for w in rest {
                    if let Some((n, v)) = w.text.split_once('=') {
                        let val = if !w.is_static() {
                            Var::Dynamic
                        } else if let Some(items) = v.strip_prefix('(').and_then(|v| v.strip_suffix(')')) {
                            Var::Array(items.split_whitespace().map(str::to_string).collect())
                        } else {
                            Var::Static(v.to_string())
                        };
                        if hooks::is_code_var(n) {
                            self.shell_code(&super::hooks::value_word(w, n.len() + 1), Vec::new());
                        }
                        self.vars.map.insert(n.to_string(), val);
                    }
                }
            }
            // `set -- a b` / `set a b`: new positional parameters.
            "set" => {
                let from = match rest.first().map(|w| w.text.as_str()) {
                    Some("--") => Some(1),
                    Some(a) if !a.starts_with('-') && !a.starts_with('+') => Some(0),
                    _ => None,
                };
                if let Some(from) = from {
                    self.vars.positional = rest[from..].iter().map(|w| w.text.clone()).collect();
                }
            }
            // An alias body runs wherever the alias is used: judge it where it is defined.
            "alias" => {
                for w in rest {
                    if let Some((n, _)) = w.text.split_once('=') {
                        self.shell_code(&super::hooks::value_word(w, n.len() + 1), Vec::new());
                    }
                }
            }
            // `trap CODE SIGNAL…`: the code runs on the signal.
            "trap" => {
                let args = if rest.first().is_some_and(|w| w.text == "--") { &rest[1..] } else { rest };
                if args.len() >= 2 && !args[0].text.starts_with('-') {
                    self.shell_code(&args[0].clone(), Vec::new());
                }
            }
            // `read` / `mapfile` from text known statically (`<<< 'rm -rf /'`) know their values.
            "read" | "mapfile" | "readarray" => {
                let names: Vec<String> =
                    rest.iter().filter(|w| !w.text.starts_with('-')).map(|w| w.text.clone()).collect();
                let text = raw.input.as_deref().filter(|_| !raw.stdin_other && rest.iter().all(|w| w.is_static()));
                let values: Vec<Var> = match (prog.as_str(), text) {
                    ("read", Some(t)) => {
                        let line = t.lines().next().unwrap_or_default().trim();
                        let mut fields: Vec<String> = line.split_whitespace().map(str::to_string).collect();
                        // The last name takes the rest of the line.
                        let mut v = Vec::new();
                        for k in 0..names.len() {
                            if k + 1 == names.len() {
                                v.push(Var::Static(std::mem::take(&mut fields).join(" ")));
                            } else if !fields.is_empty() {
                                v.push(Var::Static(fields.remove(0)));
                            } else {
                                v.push(Var::Static(String::new()));
                            }
                        }
                        v
                    }
                    (_, Some(t)) => vec![Var::Array(t.lines().map(str::to_string).collect())],
                    _ => Vec::new(),
                };
                for (k, n) in names.iter().enumerate() {
                    self.vars.map.insert(n.clone(), values.get(k).cloned().unwrap_or(Var::Dynamic));
                }
            }
            // `printf -v NAME FORMAT ARGS…` assigns what printf would print.
            "printf" if rest.first().is_some_and(|w| w.text == "-v") && rest.len() >= 3 => {
                let args: Vec<String> = rest[2..].iter().map(|w| w.text.clone()).collect();
                let val = match super::statics::printf(&args) {
                    Some(v) if rest.iter().all(|w| w.is_static()) => Var::Static(v),
                    _ => Var::Dynamic,
                };
                self.vars.map.insert(rest[1].text.clone(), val);
            }
            "unset" => {
                for w in rest {
                    self.vars.map.remove(&w.text);
                }
            }
            _ => {}
        }
        if self.funcs.contains_key(&prog)
            && !self.defining.contains(&prog)
            && !rest.is_empty()
            && self.depth < MAX_DEPTH
        {
            // A call with arguments: the body again, with them as `$1…` (its definition was
            // judged with them unknown).
            if let Some(body) = self.funcs.get(&prog).cloned() {
                let positional = rest.iter().map(|w| w.text.clone()).collect();
                let saved = std::mem::replace(&mut self.vars.positional, positional);
                self.depth += 1;
                self.defining.push(prog.clone());
                self.compound(&body);
                self.defining.pop();
                self.depth -= 1;
                self.vars.positional = saved;
            }
        }
        if self.funcs.contains_key(&prog) && self.defining.contains(&prog) {
            // Recursive call inside its own definition: nothing more to see.
            self.push(cmd);
            return;
        }
        if let Some(inner) = wrapper_inner(&prog, rest) {
            cmd.features.push(Feature::Wrapper);
            if wrapper_target(&prog, rest) == Some(Target::Named) {
                cmd.features.push(Feature::NonRootUser);
            }
            let inner_words: Vec<EWord> = match inner {
                Inner::Words(k) => {
                    // The wrapper's argv ends with the inner program; with a shell's `-c` too,
                    // so rules can tell `sudo sh -c CMD` (judged by CMD) from `sudo sh`.
                    let shell_c = is_shell(basename(&rest[k].text))
                        && rest.get(k + 1).is_some_and(|w| w.text.starts_with('-') && w.text.contains('c'));
                    let end = (k + 2 + usize::from(shell_c)).min(raw.words.len());
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
                Inner::Shell(code, at) => {
                    self.push(cmd);
                    self.shell_code(&hooks::value_word(code, at), Vec::new());
                    return;
                }
                Inner::ShellArgs(k) => {
                    // The user's shell (whichever it is) runs the arguments, as `sh ARGS` would.
                    let mut words = vec![EWord::lit("sh")];
                    words.extend(rest[k..].iter().cloned());
                    self.push(cmd);
                    self.command(Raw {
                        words,
                        redirects: raw.redirects,
                        stdin_from: raw.stdin_from,
                        input: raw.input,
                        stdin_other: raw.stdin_other,
                        features: Vec::new(),
                        feeds: raw.feeds,
                    });
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
            if prog == "watch"
                && inner_words.len() > 1
                && !raw.words.iter().any(|w| w.text == "-x" || w.text == "--exec")
            {
                // watch runs its arguments through `sh -c`.
                let joined = inner_words.iter().map(|w| w.text.clone()).collect::<Vec<_>>().join(" ");
                let srcs: Vec<String> = inner_words.iter().flat_map(|w| w.sources.clone()).collect();
                self.push(cmd);
                self.shell_code(&EWord { text: joined, dyn_at: None, sources: srcs }, Vec::new());
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
                feeds: raw.feeds,
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
                self.shell_code(&code, Vec::new());
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
    pub(super) fn shell_code(&mut self, code: &EWord, positional: Vec<String>) {
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
}
