//! Static evaluation of what a pipeline prints when everything it reads is literal: `echo` and
//! `printf` of static words, then text transforms of that text (`base64 -d`, `xxd -r -p`,
//! `rev`, `tr`, `sed s///`, `cat`, `tee`). The extractor uses it for `… | sh` and for command
//! substitutions (`$(echo cm0= | base64 -d)`), so a command rebuilt from literals is judged as
//! what it becomes. Owns only these models; anything it cannot compute is `None` (the caller
//! then treats the text as unknown, which is never less than a transaction).

use brush_parser::ast;

use crate::words::{expand, Vars};

/// Longest text evaluated: beyond it the result is treated as unknown.
const MAX_TEXT: usize = 64 * 1024;

/// What the extractor knows besides the AST: here-document bodies the parser was handed as
/// markers (see `heredoc`), and files whose content it knows (`echo … > f`).
pub(super) struct Known<'a> {
    pub bodies: &'a [String],
    pub files: &'a dyn Files,
}

/// Files whose content is known.
pub(super) trait Files {
    fn text(&self, file: &str) -> Option<String>;
}

struct NoFiles;

impl Files for NoFiles {
    fn text(&self, _: &str) -> Option<String> {
        None
    }
}

/// What the command `c` prints, given its stdin `input` when known.
pub(super) fn output(c: &ast::Command, vars: &Vars, input: Option<&str>, known: &Known<'_>) -> Option<String> {
    let ast::Command::Simple(s) = c else { return None };
    let prog = s.word_or_name.as_ref()?;
    let p = expand(&prog.value, vars).words.into_iter().next()?;
    let name = p.text.rsplit('/').next().unwrap_or(&p.text);
    const MODELLED: &[&str] =
        &["echo", "printf", "cat", "tee", "base64", "b64decode", "basenc", "openssl", "xxd", "rev", "tr", "sed"];
    if !p.is_static() || !MODELLED.contains(&name) {
        return None;
    }
    let mut args = Vec::new();
    let mut here: Option<String> = None;
    for it in s.suffix.iter().flat_map(|x| x.0.iter()) {
        match it {
            // `echo a=b`: an argument that looks like an assignment is still a word.
            ast::CommandPrefixOrSuffixItem::Word(w) | ast::CommandPrefixOrSuffixItem::AssignmentWord(_, w) => {
                let e = expand(&w.value, vars);
                if !e.subs.is_empty() {
                    return None;
                }
                for w in e.words {
                    if !w.is_static() {
                        return None;
                    }
                    args.push(w.text);
                }
            }
            ast::CommandPrefixOrSuffixItem::IoRedirect(ast::IoRedirect::HereString(_, w)) => {
                let e = expand(&w.value, vars);
                let w = e.words.into_iter().next().filter(|w| w.is_static() && e.subs.is_empty())?;
                here = Some(format!("{}\n", w.text));
            }
            ast::CommandPrefixOrSuffixItem::IoRedirect(ast::IoRedirect::HereDocument(_, doc)) => {
                let value = super::heredoc::body(&doc.doc.value, known.bodies);
                if doc.requires_expansion && (value.contains('$') || value.contains('`')) {
                    return None;
                }
                here = Some(value.to_string());
            }
            ast::CommandPrefixOrSuffixItem::IoRedirect(_) => {}
            _ => return None,
        }
    }
    let prog = p.text.rsplit('/').next().unwrap_or(&p.text).to_string();
    // `base64 -d FILE` of a file whose content is known reads that content.
    let mut from_file = None;
    if here.is_none() && input.is_none() && matches!(prog.as_str(), "cat" | "base64" | "b64decode" | "xxd" | "rev") {
        let ops: Vec<usize> = (0..args.len()).filter(|k| !args[*k].starts_with('-')).collect();
        if let [k] = ops.as_slice() {
            from_file = known.files.text(&args[*k]);
            if from_file.is_some() {
                args.remove(*k);
            }
        }
    }
    let input = here.as_deref().or(from_file.as_deref()).or(input);
    let out = program_output(&prog, &args, input)?;
    (out.len() <= MAX_TEXT).then_some(out)
}

/// What `prog ARGS` prints from `input`, for the programs modelled here.
fn program_output(prog: &str, args: &[String], input: Option<&str>) -> Option<String> {
    let flags: Vec<&str> = args.iter().map(String::as_str).filter(|a| a.starts_with('-') && a.len() > 1).collect();
    let operands: Vec<&str> = args.iter().map(String::as_str).filter(|a| !a.starts_with('-') || a.len() == 1).collect();
    match prog {
        "echo" => Some(echo(args)),
        "printf" => printf(args),
        "cat" if operands.iter().all(|o| *o == "-") => input.map(str::to_string),
        // tee prints its input whatever files it also writes.
        "tee" => input.map(str::to_string),
        "base64" | "b64decode" | "basenc"
            if flags.iter().any(|f| matches!(*f, "-d" | "--decode" | "-D" | "-r")) && operands.is_empty() =>
        {
            base64_decode(input?)
        }
        "openssl" if args.iter().any(|a| a == "base64" || a == "-base64" || a == "-a") && flags.contains(&"-d") => {
            base64_decode(input?)
        }
        "xxd" if flags.iter().any(|f| f.starts_with("-r")) && flags.iter().any(|f| f.contains('p')) => {
            hex_decode(input?)
        }
        "rev" if operands.is_empty() => {
            Some(input?.lines().map(|l| l.chars().rev().collect::<String>() + "\n").collect())
        }
        "tr" => tr(&flags, &operands, input?),
        "sed" if operands.len() == 1 && flags.iter().all(|f| *f == "-e") => sed(operands[0], input?),
        _ => None,
    }
}

/// `echo [-neE] WORDS`: escapes are decoded with `-e`, and `\n` always (dash's echo, what
/// `sh` runs, decodes them by default).
fn echo(args: &[String]) -> String {
    let mut k = 0;
    let (mut newline, mut escapes) = (true, false);
    while let Some(a) = args.get(k) {
        if a.len() > 1 && a.starts_with('-') && a[1..].chars().all(|c| matches!(c, 'n' | 'e' | 'E')) {
            newline &= !a.contains('n');
            escapes |= a.contains('e');
            k += 1;
        } else {
            break;
        }
    }
    let text = args[k..].join(" ");
    let mut out = if escapes { unescape(&text) } else { text.replace("\\n", "\n") };
    if newline {
        out.push('\n');
    }
    out
}

/// Backslash escapes as `echo -e` and `printf` decode them.
fn unescape(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '\\' || i + 1 >= chars.len() {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let n = chars[i + 1];
        i += 2;
        let radix_digits = |i: &mut usize, radix: u32, max: usize| {
            let mut v = 0u32;
            let mut k = 0;
            while k < max && *i < chars.len() && chars[*i].is_digit(radix) {
                v = v * radix + chars[*i].to_digit(radix).unwrap_or(0);
                *i += 1;
                k += 1;
            }
            (v, k)
        };
        match n {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '\\' => out.push('\\'),
            'a' => out.push('\x07'),
            'e' => out.push('\x1b'),
            'x' => {
                let (v, k) = radix_digits(&mut i, 16, 2);
                if k == 0 {
                    out.push_str("\\x");
                } else if let Some(c) = char::from_u32(v) {
                    out.push(c);
                }
            }
            '0'..='7' => {
                i -= 1;
                if n == '0' {
                    i += 1;
                }
                let (v, _) = radix_digits(&mut i, 8, 3);
                if let Some(c) = char::from_u32(v) {
                    out.push(c);
                }
            }
            other => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    out
}

/// `printf FORMAT ARGS…`: `%s`, `%b`, `%d`, `%c`, `%%` and escapes; the format is reused
/// while arguments remain, as printf does.
pub(super) fn printf(args: &[String]) -> Option<String> {
    let (fmt, rest) = args.split_first()?;
    let fmt = unescape(fmt);
    let mut out = String::new();
    let mut next = 0;
    loop {
        let mut chars = fmt.chars().peekable();
        let mut used = false;
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            // Flags and width are ignored.
            while chars.peek().is_some_and(|c| c.is_ascii_digit() || matches!(c, '-' | '.' | ' ' | '+' | '#')) {
                chars.next();
            }
            let arg = rest.get(next).map(String::as_str).unwrap_or("");
            match chars.next() {
                Some('%') => out.push('%'),
                Some('s') | Some('d') | Some('i') | Some('u') => {
                    out.push_str(arg);
                    next += 1;
                    used = true;
                }
                Some('b') => {
                    out.push_str(&unescape(arg));
                    next += 1;
                    used = true;
                }
                Some('c') => {
                    out.extend(arg.chars().next());
                    next += 1;
                    used = true;
                }
                _ => return None,
            }
        }
        if !used || next >= rest.len() {
            break;
        }
    }
    Some(out)
}

fn base64_decode(input: &str) -> Option<String> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut bytes = Vec::new();
    for c in input.bytes() {
        if c.is_ascii_whitespace() || c == b'=' {
            continue;
        }
        let v = match c {
            b'-' => 62,
            b'_' => 63,
            _ => ALPHABET.iter().position(|&a| a == c)? as u32,
        };
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            bytes.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    String::from_utf8(bytes).ok()
}

fn hex_decode(input: &str) -> Option<String> {
    let digits: Vec<u8> = input.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let mut bytes = Vec::with_capacity(digits.len() / 2);
    for pair in digits.chunks(2) {
        let s = std::str::from_utf8(pair).ok()?;
        bytes.push(u8::from_str_radix(s, 16).ok()?);
    }
    String::from_utf8(bytes).ok()
}

/// A `tr` set: ranges (`a-z`) and the classes `[:lower:]`, `[:upper:]`, `[:digit:]`.
fn tr_set(s: &str) -> Option<Vec<char>> {
    let s = s.replace("[:lower:]", "a-z").replace("[:upper:]", "A-Z").replace("[:digit:]", "0-9");
    let chars: Vec<char> = unescape(&s).chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if i + 2 < chars.len() && chars[i + 1] == '-' {
            let (a, b) = (chars[i] as u32, chars[i + 2] as u32);
            if a > b {
                return None;
            }
            out.extend((a..=b).filter_map(char::from_u32));
            i += 3;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    Some(out)
}

fn tr(flags: &[&str], operands: &[&str], input: &str) -> Option<String> {
    match (flags, operands) {
        ([], [from, to]) => {
            let (from, to) = (tr_set(from)?, tr_set(to)?);
            let last = *to.last()?;
            Some(
                input
                    .chars()
                    .map(|c| match from.iter().position(|f| *f == c) {
                        Some(k) => to.get(k).copied().unwrap_or(last),
                        None => c,
                    })
                    .collect(),
            )
        }
        (["-d"], [set]) => {
            let set = tr_set(set)?;
            Some(input.chars().filter(|c| !set.contains(c)).collect())
        }
        _ => None,
    }
}

/// `sed 's/RE/REPLACEMENT/[g]'` with any delimiter, applied per line, for a literal RE, `^`
/// or `$` (a regex would be compiled per evaluation: this runs for every literal pipeline).
fn sed(script: &str, input: &str) -> Option<String> {
    let rest = script.strip_prefix('s')?;
    let delim = rest.chars().next()?;
    let parts: Vec<&str> = rest[delim.len_utf8()..].split(delim).collect();
    let [re, rep, flags] = parts.as_slice() else { return None };
    if !flags.chars().all(|c| c == 'g') || rep.contains(['\\', '&']) {
        return None;
    }
    let literal =
        |s: &str| !s.is_empty() && !s.contains(['\\', '.', '*', '[', ']', '^', '$', '+', '?', '(', ')', '{', '}', '|']);
    let mut out = String::new();
    for line in input.lines() {
        match *re {
            "^" => out.push_str(&format!("{rep}{line}")),
            "$" => out.push_str(&format!("{line}{rep}")),
            _ if literal(re) && flags.contains('g') => out.push_str(&line.replace(*re, rep)),
            _ if literal(re) => out.push_str(&line.replacen(*re, rep, 1)),
            _ => return None,
        }
        out.push('\n');
    }
    Some(out)
}

/// The output of a command substitution's body when the whole body is one pipeline of
/// modelled commands over literals (`echo …`, `echo … | base64 -d`, `base64 -d <<< …`).
/// Its parse is kept in `kept`, for the extraction of the same body.
pub(super) fn substitution(body: &str, vars: &Vars, kept: &super::Kept) -> Option<String> {
    let t = body.trim_start();
    let plausible =
        ["echo", "printf", "base64", "xxd", "rev", "tr", "openssl", "cat", "sed"].iter().any(|p| t.starts_with(p));
    // Modelled bodies are flat pipelines: a nested one is not (and would parse deeper still
    // inside the walk of the text holding it, `super::MAX_NESTING`).
    if !plausible || body.len() > MAX_TEXT || super::parser_trap(body).is_some() || super::nesting_tokens(body) > 16 {
        return None;
    }
    let prog = super::parse(body).ok()?;
    let out = prog.complete_commands.iter().try_fold(String::new(), |mut out, cc| {
        out.push_str(&list_output(cc, vars, &Known { bodies: &[], files: &NoFiles })?);
        Some(out)
    });
    kept.keep(body, prog);
    out
}

/// What a list prints when every pipeline in it is modelled (`echo -n r; echo -n m`,
/// `echo a && echo b`): the outputs one after the other (the modelled commands succeed).
pub(super) fn list_output(list: &ast::CompoundList, vars: &Vars, known: &Known<'_>) -> Option<String> {
    let mut out = String::new();
    for item in &list.0 {
        if matches!(item.1, ast::SeparatorOperator::Async) {
            return None;
        }
        let pipelines = std::iter::once(&item.0.first).chain(item.0.additional.iter().map(|x| match x {
            ast::AndOr::And(p) | ast::AndOr::Or(p) => p,
        }));
        for p in pipelines {
            let mut text: Option<String> = None;
            for c in &p.seq {
                text = Some(output(c, vars, text.as_deref(), known)?);
            }
            out.push_str(&text?);
            if out.len() > MAX_TEXT {
                return None;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(s: &str) -> Option<String> {
        substitution(s, &Vars::default(), &crate::extract::Kept::default())
    }

    #[test]
    fn literal_pipelines() {
        assert_eq!(sub("echo rm").as_deref(), Some("rm\n"));
        assert_eq!(sub("printf rm").as_deref(), Some("rm"));
        assert_eq!(sub("printf '\\x72\\x6d -rf %s' /").as_deref(), Some("rm -rf /"));
        assert_eq!(sub("echo -e '\\x72m'").as_deref(), Some("rm\n"));
        assert_eq!(sub("echo -n x").as_deref(), Some("x"));
        assert_eq!(sub("echo cm0gLXJmIC8= | base64 -d").as_deref(), Some("rm -rf /"));
        assert_eq!(sub("base64 --decode <<< cm0gLXJmIC8=").as_deref(), Some("rm -rf /"));
        assert_eq!(sub("echo 726d202d7266202f | xxd -r -p").as_deref(), Some("rm -rf /"));
        assert_eq!(sub("echo '/ fr- mr' | rev").as_deref(), Some("rm -rf /\n"));
        assert_eq!(sub("echo 'ql -qe /' | tr 'a-z' 'b-za'").as_deref(), Some("rm -rf /\n"));
        assert_eq!(sub("echo RM | tr A-Z a-z").as_deref(), Some("rm\n"));
        assert_eq!(sub("echo RM | tr '[:upper:]' '[:lower:]'").as_deref(), Some("rm\n"));
        assert_eq!(sub("echo / | sed 's/^/rm -rf /'").as_deref(), Some("rm -rf /\n"));
        assert_eq!(sub("echo x | cat | tee").as_deref(), Some("x\n"));
    }

    #[test]
    fn unknowns_stay_unknown() {
        assert_eq!(sub("echo $X"), None);
        assert_eq!(sub("echo $(id)"), None);
        assert_eq!(sub("cat file"), None);
        assert_eq!(sub("echo a && echo b").as_deref(), Some("a\nb\n"));
        assert_eq!(sub("echo -n r; echo -n m").as_deref(), Some("rm"));
        assert_eq!(sub("echo a & echo b"), None);
        assert_eq!(sub("echo x | sed 's/[a-z]/y/'"), None);
        assert_eq!(sub("echo xax | sed s/a/b/g").as_deref(), Some("xbx\n"));
        assert_eq!(sub("echo a | sort"), None);
        assert_eq!(sub("echo !!! | base64 -d"), None);
        assert_eq!(sub("id"), None);
    }
}
