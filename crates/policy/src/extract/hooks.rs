//! Code embedded in another command's arguments or environment, which that command runs
//! through a shell: `git -c alias.x='!…'` and `git config` keys that run programs, tar's
//! checkpoint actions and compression programs, `rsync -e`, `ssh -o ProxyCommand=`, `zip -TT`,
//! `env -S`, `system()` in awk, `os.system`/`subprocess`/backticks in interpreter one-liners,
//! and variables such as `GIT_SSH_COMMAND` or `PAGER`. Owns these per-program tables; the
//! extractor (`dispatch`) runs each piece of code found as shell code, so rules judge it.

use crate::words::EWord;

/// Environment variables whose value a program runs as a command line.
const CODE_VARS: &[&str] = &[
    "GIT_SSH_COMMAND",
    "GIT_SSH",
    "GIT_EXTERNAL_DIFF",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_ASKPASS",
    "GIT_PROXY_COMMAND",
    "SSH_ASKPASS",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "MANPAGER",
    "SYSTEMD_PAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "BROWSER",
    "PROMPT_COMMAND",
    "BASH_ENV",
    "ENV",
];

pub(super) fn is_code_var(name: &str) -> bool {
    CODE_VARS.contains(&name)
}

/// The value of a `NAME=VALUE` word (starting at byte `at`), as a word of its own.
pub(super) fn value_word(w: &EWord, at: usize) -> EWord {
    tail(w, at)
}

/// `text[at..]` as a word, keeping where its dynamic part starts.
fn tail(w: &EWord, at: usize) -> EWord {
    EWord {
        text: w.text.get(at..).unwrap_or_default().to_string(),
        dyn_at: w.dyn_at.map(|d| d.saturating_sub(at)),
        sources: w.sources.clone(),
    }
}

/// Git configuration keys (lowercase) whose value git runs as a command, and whether only a
/// value starting with `!` is one (aliases, credential helpers).
fn git_code_key(key: &str) -> Option<bool> {
    let key = key.to_ascii_lowercase();
    const PLAIN: &[&str] = &[
        "core.pager",
        "core.editor",
        "core.sshcommand",
        "core.fsmonitor",
        "core.askpass",
        "diff.external",
        "sequence.editor",
        "gpg.program",
        "gpg.ssh.program",
        "uploadpack.packobjectshook",
        "pager.log",
        "pager.diff",
        "pager.show",
    ];
    if key.starts_with("alias.") || key.starts_with("credential.") && key.ends_with("helper") {
        return Some(true);
    }
    let suffix_code =
        [".textconv", ".command", ".driver", ".clean", ".smudge", ".process", ".uploadpack", ".receivepack"];
    if PLAIN.contains(&key.as_str())
        || (key.starts_with("pager.") && !key.contains(' '))
        || ((key.starts_with("diff.")
            || key.starts_with("merge.")
            || key.starts_with("filter.")
            || key.starts_with("remote."))
            && suffix_code.iter().any(|s| key.ends_with(s)))
    {
        return Some(false);
    }
    None
}

/// The code a git `KEY=VALUE` (or KEY and VALUE) would run, if the key runs programs.
fn git_value(key: &str, value: &EWord, value_at: usize) -> Option<EWord> {
    let bang = git_code_key(key)?;
    let v = tail(value, value_at);
    if bang {
        v.text.starts_with('!').then(|| tail(&v, 1))
    } else {
        Some(v)
    }
}

/// Option values of `words` (`-o V`, `-oV`, `--opt=V`, `--opt V`) for the options named.
fn option_values(words: &[EWord], short: &[&str], long: &[&str]) -> Vec<EWord> {
    let mut out = Vec::new();
    let mut k = 0;
    while k < words.len() {
        let a = words[k].text.as_str();
        if short.contains(&a) || long.contains(&a) {
            if let Some(v) = words.get(k + 1) {
                out.push(v.clone());
            }
            k += 2;
            continue;
        }
        if let Some(l) = long.iter().find(|l| a.starts_with(**l) && a[l.len()..].starts_with('=')) {
            out.push(tail(&words[k], l.len() + 1));
        } else if let Some(s) = short.iter().find(|s| a.len() > s.len() && a.starts_with(**s) && !a.starts_with("--")) {
            out.push(tail(&words[k], s.len()));
        }
        k += 1;
    }
    out
}

/// `hay.find(needle)`, without setting up `str::find`'s searcher (hundreds of instructions)
/// where `needle` cannot occur: an interpreter's arguments are each searched for a dozen calls,
/// and most are short words like `--seed` that hold none.
fn find(hay: &str, needle: &str) -> Option<usize> {
    let possible = needle.len() <= hay.len() && needle.as_bytes().first().is_none_or(|b| hay.as_bytes().contains(b));
    possible.then(|| hay.find(needle)).flatten()
}

/// Quoted string literals that follow one of `calls` (`system("…")`, `` `…` ``).
fn call_literals(code: &str, calls: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for call in calls {
        let mut from = 0;
        while let Some(i) = find(&code[from..], call) {
            let after = from + i + call.len();
            from = after;
            let rest = code[after..].trim_start_matches(|c: char| c == '(' || c.is_whitespace() || c == '[');
            // `system("a b")`, and the list form `system "a", "b"`: the words joined.
            let mut rest = rest;
            let mut words = Vec::new();
            // `"r" + "m -rf /"` (Python, JavaScript, Ruby) and `"r" . "m"` (Perl) concatenate.
            let mut joined = String::new();
            while let Some(q) = rest.chars().next().filter(|c| matches!(c, '"' | '\'' | '`')) {
                let Some(end) = rest[1..].find(q) else { break };
                joined.push_str(&rest[1..1 + end]);
                rest = rest[end + 2..].trim_start();
                if let Some(r) = rest.strip_prefix('+').or_else(|| rest.strip_prefix(". ")) {
                    rest = r.trim_start();
                    continue;
                }
                words.push(std::mem::take(&mut joined));
                match rest.strip_prefix(',') {
                    Some(r) => rest = r.trim_start(),
                    None => break,
                }
            }
            if !joined.is_empty() {
                words.push(joined);
            }
            if !words.is_empty() {
                out.push(words.join(" "));
            }
        }
    }
    // Perl's `qx(…)`, `qx{…}`, `qx/…/` run a shell.
    let mut from = 0;
    while let Some(i) = find(&code[from..], "qx") {
        let at = from + i + 2;
        from = at;
        let Some(open) = code[at..].chars().next() else { break };
        let close = match open {
            '(' => ')',
            '{' => '}',
            '[' => ']',
            '<' => '>',
            '/' | '!' | '|' | '#' => open,
            _ => continue,
        };
        if let Some(end) = code[at + open.len_utf8()..].find(close) {
            out.push(code[at + open.len_utf8()..at + open.len_utf8() + end].to_string());
        }
    }
    // Backticks run a shell in Perl and Ruby.
    let mut parts = code.split('`');
    parts.next();
    while let (Some(inner), Some(_)) = (parts.next(), parts.next().or(Some(""))) {
        if !inner.is_empty() {
            out.push(inner.to_string());
        }
    }
    out
}

/// Shell code that `prog` (a basename) would run, found in its argument words.
pub(super) fn embedded_code(prog: &str, words: &[EWord]) -> Vec<EWord> {
    let rest = words.get(1..).unwrap_or_default();
    match prog {
        "git" => {
            let mut out = Vec::new();
            let mut k = 0;
            while k < rest.len() {
                let a = &rest[k];
                if a.text == "-c" {
                    if let Some(kv) = rest.get(k + 1) {
                        if let Some((key, _)) = kv.text.split_once('=') {
                            out.extend(git_value(key, kv, key.len() + 1));
                        }
                    }
                    k += 2;
                    continue;
                }
                if a.text == "config" {
                    // git config [options] KEY VALUE
                    let ops: Vec<&EWord> = rest[k + 1..].iter().filter(|w| !w.text.starts_with('-')).collect();
                    if let [key, value, ..] = ops.as_slice() {
                        out.extend(git_value(&key.text, value, 0));
                    }
                    break;
                }
                if !a.text.starts_with('-') {
                    break;
                }
                k += 1;
            }
            out
        }
        "tar" | "gtar" | "bsdtar" => {
            let mut out = option_values(
                rest,
                &["-I", "-F"],
                &["--to-command", "--use-compress-program", "--rsh-command", "--info-script", "--new-volume-script"],
            );
            for v in option_values(rest, &[], &["--checkpoint-action"]) {
                if let Some(at) = v.text.find("exec=").filter(|at| *at == 0) {
                    out.push(tail(&v, at + 5));
                }
            }
            out
        }
        "rsync" => option_values(rest, &["-e"], &["--rsh", "--rsync-path"]),
        "ssh" | "scp" | "sftp" => {
            let mut out = option_values(rest, &["-S"], &[]).into_iter().filter(|_| prog != "ssh").collect::<Vec<_>>();
            for o in option_values(rest, &["-o"], &[]) {
                let lower = o.text.to_ascii_lowercase();
                for key in ["proxycommand", "localcommand", "knownhostscommand"] {
                    if lower.starts_with(key) {
                        let at = key.len() + usize::from(o.text[key.len()..].starts_with(['=', ' ']));
                        out.push(tail(&o, at));
                    }
                }
            }
            out
        }
        "zip" => option_values(rest, &["-TT"], &["--unzip-command"]),
        "env" => option_values(rest, &["-S"], &["--split-string"]),
        "awk" | "gawk" | "mawk" | "nawk" | "busybox-awk" => {
            let Some(prog_text) = rest.iter().find(|w| !w.text.starts_with('-')).filter(|w| w.is_static()) else {
                return Vec::new();
            };
            let mut out: Vec<EWord> =
                call_literals(&prog_text.text, &["system", "| \"", "|\""]).iter().map(|c| EWord::lit(c)).collect();
            // `print "CODE" | "sh"`: what is printed into a shell is code.
            static PRINT_TO_SHELL: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
            let re = PRINT_TO_SHELL.get_or_init(|| {
                regex::Regex::new(
                    r#"print[f]?\s*\(?\s*"([^"]*)"\s*\)?\s*\|\s*"\s*(/bin/|/usr/bin/)?(sh|bash|dash|zsh|ksh)\b"#,
                )
                .ok()
            });
            if let Some(re) = re.as_ref().filter(|_| prog_text.text.contains('|')) {
                out.extend(re.captures_iter(&prog_text.text).filter_map(|c| c.get(1)).map(|m| EWord::lit(m.as_str())));
            }
            out
        }
        _ if super::programs::is_interp(prog) => rest
            .iter()
            .filter(|w| w.is_static())
            .flat_map(|w| {
                call_literals(
                    &w.text,
                    &[
                        "system",
                        "popen",
                        "exec ",
                        "exec(",
                        "execSync",
                        "spawnSync",
                        "subprocess.run",
                        "subprocess.call",
                        "subprocess.Popen",
                        "check_output",
                        "check_call",
                        "getoutput",
                        "getstatusoutput",
                        "%x",
                    ],
                )
            })
            .map(|c| EWord::lit(&c))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(s: &str) -> Vec<String> {
        let words: Vec<EWord> = s.split('\u{1}').map(EWord::lit).collect();
        let prog = words[0].text.clone();
        embedded_code(&prog, &words).into_iter().map(|w| w.text).collect()
    }

    #[test]
    fn finds_embedded_code() {
        assert_eq!(code("git\u{1}-c\u{1}alias.x=!rm -rf /\u{1}x"), ["rm -rf /"]);
        assert_eq!(code("git\u{1}-c\u{1}alias.st=status\u{1}st"), Vec::<String>::new());
        assert_eq!(code("git\u{1}-c\u{1}core.pager=less -R\u{1}log"), ["less -R"]);
        assert_eq!(code("git\u{1}config\u{1}--global\u{1}alias.p\u{1}!sh x"), ["sh x"]);
        assert_eq!(code("git\u{1}config\u{1}user.name\u{1}dev"), Vec::<String>::new());
        assert_eq!(code("tar\u{1}-cf\u{1}a\u{1}--checkpoint-action=exec=id"), ["id"]);
        assert_eq!(code("tar\u{1}-xf\u{1}a\u{1}--to-command\u{1}id"), ["id"]);
        assert_eq!(code("tar\u{1}-cf\u{1}a\u{1}-I\u{1}zstd -19"), ["zstd -19"]);
        assert_eq!(code("rsync\u{1}-e\u{1}ssh -p 22\u{1}a\u{1}b:c"), ["ssh -p 22"]);
        assert_eq!(code("ssh\u{1}-o\u{1}ProxyCommand=nc x 1\u{1}h"), ["nc x 1"]);
        assert_eq!(code("env\u{1}-S\u{1}rm -rf /"), ["rm -rf /"]);
        assert_eq!(code("awk\u{1}BEGIN { system(\"id\") }"), ["id"]);
        assert_eq!(code("awk\u{1}BEGIN { print \"id\" | \"sh\" }"), ["id"]);
        assert_eq!(code("python3\u{1}-c\u{1}import os; os.system('id')"), ["id"]);
        assert_eq!(code("perl\u{1}-e\u{1}exec \"id\""), ["id"]);
        assert_eq!(code("ruby\u{1}-e\u{1}`id`"), ["id"]);
        assert_eq!(code("perl\u{1}-e\u{1}qx(id -u)"), ["id -u"]);
        assert_eq!(code("python3\u{1}-c\u{1}print(1)"), Vec::<String>::new());
        assert_eq!(code("python3\u{1}-c\u{1}os.system(\"r\" + \"m -rf /\")"), ["rm -rf /"]);
        assert_eq!(code("perl\u{1}-e\u{1}system \"rm\", \"-rf\", \"/\""), ["rm -rf /"]);
    }
}
