//! Per-program models the extractor needs to see what runs: shells and interpreters (`-c`
//! code, scripts, code on stdin), `xargs`/`parallel` (the command and its items) and `find`
//! (`-delete`, `-exec`, and how much of a tree a `find` reaches).

use super::{Cmd, Extractor, Feature, Raw};
use crate::words::EWord;

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

pub(super) fn is_shell(p: &str) -> bool {
    SHELLS.contains(&p)
}

pub(super) fn is_interp(p: &str) -> bool {
    INTERPRETERS.contains(&p) || (p.starts_with("python") && p[6..].chars().all(|c| c.is_ascii_digit() || c == '.'))
}

impl Extractor<'_> {
    pub(super) fn shell_or_interp(&mut self, mut cmd: Cmd, prog: &str, rest: &[EWord], raw: &Raw) {
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
                // `sh -c CODE NAME ARGS…`: NAME is `$0`.
                let arg0 = rest.get(k + 1).filter(|w| w.is_static()).map(|w| w.text.clone());
                let saved0 = std::mem::replace(&mut self.vars.arg0, arg0);
                let mut w = w.clone();
                // `sh -c "$(cat)"`: a filter in the code's substitution reads the shell's stdin.
                if !w.sources.is_empty() && w.sources.iter().all(|p| super::walk::passes_through(p)) {
                    w.sources.extend(raw.stdin_from.iter().cloned());
                }
                self.push(cmd);
                self.shell_code(&w, positional);
                self.vars.arg0 = saved0;
            } else {
                if !w.sources.is_empty() {
                    cmd.code_from.extend(w.sources.iter().cloned());
                }
                // Inline code that executes what it reads on stdin runs what is piped in.
                const STDIN: &[&str] =
                    &["sys.stdin", "<STDIN>", "STDIN.read", "$stdin", "process.stdin", "php://stdin"];
                if STDIN.iter().any(|s| w.text.contains(s)) {
                    cmd.code_from.extend(raw.stdin_from.iter().cloned());
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
                self.shell_code(&EWord::lit(&text), positional);
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

    pub(super) fn xargs(&mut self, rest: &[EWord], raw: &Raw) {
        let mut i = 0;
        let mut replace: Option<String> = None;
        let mut interactive = false;
        let mut arg_file: Option<String> = None;
        let mut null = false;
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
                "-0" | "--null" => null = true,
                "-p" | "--interactive" => interactive = true,
                "-a" | "--arg-file" => {
                    arg_file = rest.get(i + 1).filter(|w| w.is_static()).map(|w| w.text.clone());
                    i += 2;
                    continue;
                }
                "-n" | "-P" | "-d" | "-L" | "-s" | "-E" | "-e" | "-j" | "--jobs" | "--max-args" | "--max-procs"
                | "--delimiter" | "--max-lines" => {
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
        let file_text = arg_file.and_then(|f| self.script_text(&f, self.cwd.clone().as_deref()));
        let items: Vec<EWord> = match (&file_text, &raw.input) {
            (Some(t), _) => t
                .split(|c: char| c.is_whitespace() || c == '\0')
                .filter(|s| !s.is_empty())
                .take(16)
                .map(EWord::lit)
                .collect(),
            // With -0 only NULs separate items: `echo 'rm -rf /' | xargs -0 sh -c` is one.
            (None, Some(t)) if !raw.stdin_other && null => {
                t.split('\0').filter(|s| !s.is_empty()).take(16).map(EWord::lit).collect()
            }
            // With -I each line is one item.
            (None, Some(t)) if !raw.stdin_other && replace.is_some() => {
                t.lines().map(str::trim).filter(|s| !s.is_empty()).take(16).map(EWord::lit).collect()
            }
            (None, Some(t)) if !raw.stdin_other => t.split_whitespace().take(16).map(EWord::lit).collect(),
            (None, _) => vec![EWord { text: "{xargs}".into(), dyn_at: Some(0), sources: raw.stdin_from.clone() }],
        };
        const FILTERS: &[&str] =
            &["find", "ls", "tr", "grep", "egrep", "sort", "uniq", "head", "tail", "sed", "awk", "xargs", "cut", "cat"];
        let items = if file_text.is_none()
            && raw.input.is_none()
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
        let features = if interactive { vec![Feature::Interactive] } else { Vec::new() };
        self.command(Raw::derived(words, features, raw.feeds.clone()));
    }

    /// The item paths a preceding `find ROOT …` / `ls DIR` in the pipeline would print.
    fn finder_items(&self) -> Option<Vec<EWord>> {
        let c = self.out.iter().rev().find(|c| c.program() == "find" || c.program() == "ls")?;
        let roots = find_roots(&c.argv[1..]);
        let scope = if c.program() == "find" { find_scope(&c.argv[1..]) } else { "{}" };
        Some(roots.iter().map(|r| EWord::lit(&join_marker(r, scope))).collect())
    }

    pub(super) fn find(&mut self, mut cmd: Cmd, rest: &[EWord]) {
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
            cmd.features.push(Feature::FindAction);
        }
        self.push(cmd);
        if deletes {
            let mut words = vec![EWord::lit("rm"), EWord::lit("-r"), EWord::lit("-f")];
            words.extend(markers.iter().map(|m| EWord::lit(m)));
            self.command(Raw::derived(words, vec![Feature::FindDelete], Vec::new()));
        }
        for (inner, interactive) in execs {
            if inner.is_empty() {
                continue;
            }
            let features = if interactive { vec![Feature::Interactive] } else { Vec::new() };
            self.command(Raw::derived(inner, features, Vec::new()));
        }
    }
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
