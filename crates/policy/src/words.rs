//! Word expansion done statically: quote removal, ANSI-C `$'..'` decoding, parameter expansion
//! from tracked variables and arrays, field splitting of unquoted expansions (with the tracked
//! `IFS`), and collection of command substitutions (which the extractor parses and evaluates
//! separately; a substitution whose output it can compute from literals is substituted).

use std::collections::HashMap;

/// One word after static expansion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EWord {
    pub text: String,
    /// Byte offset in `text` of the first part that could not be resolved statically.
    pub dyn_at: Option<usize>,
    /// Programs whose output makes up (part of) this word (`$(curl …)`, `<(curl …)`).
    pub sources: Vec<String>,
}

impl EWord {
    pub fn lit(s: &str) -> Self {
        EWord { text: s.to_string(), dyn_at: None, sources: Vec::new() }
    }
    pub fn is_static(&self) -> bool {
        self.dyn_at.is_none()
    }
}

/// What a variable is known to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Var {
    Static(String),
    /// An indexed array of known elements (`a=(x y)`, `a[1]=y`).
    Array(Vec<String>),
    Dynamic,
}

/// The output of a command substitution's body, when it is known statically.
pub(crate) type Eval<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Prefixes, inside `expand`, a substitution body whose output was computed (a NUL never
/// occurs in shell text).
const STATIC_MARK: &str = "\0static\0";

fn no_eval(_: &str) -> Option<String> {
    None
}

/// Variables known at a point of the script.
#[derive(Debug, Clone, Default)]
pub(crate) struct Vars {
    pub map: HashMap<String, Var>,
    pub positional: Vec<String>,
    /// `$0`, when a `sh -c CODE NAME …` names it.
    pub arg0: Option<String>,
    pub home: Option<String>,
    pub pwd: Option<String>,
}

impl Vars {
    /// The field separators: a tracked `IFS`, else space, tab and newline.
    pub fn ifs(&self) -> String {
        match self.map.get("IFS") {
            Some(Var::Static(s)) => s.clone(),
            _ => " \t\n".to_string(),
        }
    }
}

/// Result of expanding a raw word.
#[derive(Debug, Default)]
pub(crate) struct Expansion {
    /// One raw word can become several (brace expansion).
    pub words: Vec<EWord>,
    /// Bodies of command substitutions found in the word, in order, whose output is unknown.
    pub subs: Vec<String>,
    /// Bodies of command substitutions whose output was computed statically and substituted:
    /// they still run, but the word does not come from them.
    pub static_subs: Vec<String>,
}

struct Out {
    text: String,
    dyn_at: Option<usize>,
    /// Byte offsets of unquoted `{`, `,`, `}` (for brace expansion).
    braces: Vec<usize>,
    /// Byte ranges that undergo field splitting: on `IFS` (unquoted expansions), or on NUL
    /// (`"$@"`, `"${a[@]}"`: one field per element).
    splits: Vec<(usize, usize, Split)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Split {
    Ifs,
    Nul,
}

impl Out {
    fn mark_dyn(&mut self) {
        if self.dyn_at.is_none() {
            self.dyn_at = Some(self.text.len());
        }
    }
}

/// Expand a raw word as written in the source.
pub(crate) fn expand(raw: &str, vars: &Vars) -> Expansion {
    expand_with(raw, vars, &no_eval)
}

/// Expand a raw word, substituting the output of command substitutions `eval` can compute.
pub(crate) fn expand_with(raw: &str, vars: &Vars, eval: Eval<'_>) -> Expansion {
    // Most words have nothing to expand: no quote, escape, expansion or brace, so the loop
    // below would copy them as they are (`ls`, `-la`, `/tmp/x.txt`, `~/src`).
    if !raw.bytes().any(|b| matches!(b, b'\'' | b'"' | b'\\' | b'$' | b'`' | b'{' | b',' | b'}')) {
        return Expansion { words: vec![EWord::lit(raw)], subs: Vec::new(), static_subs: Vec::new() };
    }
    let mut out = Out { text: String::with_capacity(raw.len()), dyn_at: None, braces: Vec::new(), splits: Vec::new() };
    let mut subs = Vec::new();
    let mut static_subs = Vec::new();
    let chars: Vec<char> = raw.chars().collect();
    let mut i = 0;
    // Tilde at start stays literal `~` (path classification resolves it).
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' => {
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    out.text.push(chars[i]);
                    i += 1;
                }
                i += 1;
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    match chars[i] {
                        '\\' if i + 1 < chars.len() && matches!(chars[i + 1], '$' | '`' | '"' | '\\') => {
                            out.text.push(chars[i + 1]);
                            i += 2;
                        }
                        '\\' if i + 1 < chars.len() && chars[i + 1] == '\n' => i += 2,
                        '$' => i = dollar(&chars, i, &mut out, &mut subs, vars, eval, true),
                        '`' => i = backtick(&chars, i, &mut out, &mut subs, eval, true),
                        ch => {
                            out.text.push(ch);
                            i += 1;
                        }
                    }
                }
                i += 1;
            }
            '\\' => {
                if i + 1 < chars.len() {
                    if chars[i + 1] != '\n' {
                        out.text.push(chars[i + 1]);
                    }
                    i += 2;
                } else {
                    i += 1;
                }
            }
            '$' if i + 1 < chars.len() && chars[i + 1] == '\'' => {
                i = ansi_c(&chars, i + 2, &mut out.text);
            }
            '$' if i + 1 < chars.len() && chars[i + 1] == '"' => {
                // Locale string: treat like "..." by skipping the `$`.
                i += 1;
            }
            '$' => i = dollar(&chars, i, &mut out, &mut subs, vars, eval, false),
            '`' => i = backtick(&chars, i, &mut out, &mut subs, eval, false),
            '{' | ',' | '}' => {
                out.braces.push(out.text.len());
                out.text.push(c);
                i += 1;
            }
            _ => {
                out.text.push(c);
                i += 1;
            }
        }
    }
    let words = if out.splits.is_empty() { brace_expand(out) } else { split_fields(out, &vars.ifs()) };
    // Substituted bodies were pushed to `subs` with a marker: move them.
    subs.retain(|s: &String| match s.strip_prefix(STATIC_MARK) {
        Some(body) => {
            static_subs.push(body.to_string());
            false
        }
        None => true,
    });
    Expansion { words, subs, static_subs }
}

/// Field splitting: separators inside the split ranges end a field; empty fields are dropped.
fn split_fields(out: Out, ifs: &str) -> Vec<EWord> {
    let mut words = Vec::new();
    let mut start: Option<usize> = None;
    let mut field = String::new();
    let push = |field: &mut String, s: usize, e: usize, words: &mut Vec<EWord>| {
        if !field.is_empty() {
            let dyn_at = out.dyn_at.filter(|d| *d < e).map(|d| d.saturating_sub(s));
            words.push(EWord { text: std::mem::take(field), dyn_at, sources: Vec::new() });
        }
    };
    for (p, c) in out.text.char_indices() {
        let sep = out.splits.iter().any(|&(a, b, k)| {
            p >= a
                && p < b
                && match k {
                    Split::Nul => c == '\0',
                    Split::Ifs => ifs.contains(c),
                }
        });
        if sep {
            push(&mut field, start.unwrap_or(p), p, &mut words);
            start = None;
        } else {
            start.get_or_insert(p);
            field.push(c);
        }
    }
    push(&mut field, start.unwrap_or(out.text.len()), out.text.len(), &mut words);
    words
}

/// The most words one word's brace expansion yields: `{a,b}` repeated n times is 2^n words,
/// and a hostile command must not make the judge run out of memory or time. A word whose
/// expansion would yield more is expanded as far as the room allows, the rest left unknown
/// (dynamic from the first group not expanded), which the rules treat as anything.
const MAX_BRACE_WORDS: usize = 256;
/// The longest word expanded (each of its words is a copy of most of it).
const MAX_BRACE_TEXT: usize = 4096;

/// Brace expansion of unquoted `{a,b}` groups, at most [`MAX_BRACE_WORDS`] words.
fn brace_expand(out: Out) -> Vec<EWord> {
    let mut res = Vec::new();
    brace_expand_into(out, MAX_BRACE_WORDS, &mut res);
    res
}

/// Simple one-level brace expansion of the first unquoted `{a,b}` group (recursively), into
/// at most `room` words: each of the k alternatives gets `room / k`, so the recursion is at
/// most log2(room) deep.
fn brace_expand_into(out: Out, room: usize, res: &mut Vec<EWord>) {
    let single = |o: Out| EWord { text: o.text, dyn_at: o.dyn_at, sources: Vec::new() };
    if out.braces.len() < 3 {
        return res.push(single(out));
    }
    // Find first `{` with a matching `}` and at least one `,` between, no nested `{`.
    let b = &out.braces;
    let bytes = out.text.as_bytes();
    let mut start = None;
    let mut commas = Vec::new();
    let mut end = None;
    for &p in b {
        match bytes.get(p) {
            Some(b'{') => {
                start = Some(p);
                commas.clear();
            }
            Some(b',') if start.is_some() => commas.push(p),
            Some(b'}') if start.is_some() && !commas.is_empty() => {
                end = Some(p);
                break;
            }
            _ => {}
        }
    }
    let (Some(s), Some(e)) = (start, end) else { return res.push(single(out)) };
    if out.dyn_at.is_some_and(|d| d <= e) {
        return res.push(single(out));
    }
    let alternatives = (commas.len() + 1).min(16);
    if alternatives > room || out.text.len() > MAX_BRACE_TEXT {
        let dyn_at = Some(out.dyn_at.map_or(s, |d| d.min(s)));
        return res.push(EWord { text: out.text, dyn_at, sources: Vec::new() });
    }
    let prefix = &out.text[..s];
    let suffix = &out.text[e + 1..];
    let mut pieces = Vec::new();
    let mut last = s + 1;
    for &c in &commas {
        pieces.push(&out.text[last..c]);
        last = c + 1;
    }
    pieces.push(&out.text[last..e]);
    for p in pieces.iter().take(alternatives) {
        let text = format!("{prefix}{p}{suffix}");
        let shift = text.len() as isize - out.text.len() as isize;
        let braces: Vec<usize> =
            out.braces.iter().filter(|&&x| x > e).map(|&x| (x as isize + shift) as usize).collect();
        let dyn_at = out.dyn_at.map(|d| (d as isize + shift).max(0) as usize);
        brace_expand_into(Out { text, dyn_at, braces, splits: Vec::new() }, room / alternatives, res);
    }
}

/// Decode `$'…'` starting after the opening quote; returns the index after the closing quote.
fn ansi_c(chars: &[char], mut i: usize, text: &mut String) -> usize {
    while i < chars.len() && chars[i] != '\'' {
        if chars[i] == '\\' && i + 1 < chars.len() {
            let n = chars[i + 1];
            i += 2;
            match n {
                'n' => text.push('\n'),
                't' => text.push('\t'),
                'r' => text.push('\r'),
                'a' => text.push('\x07'),
                'b' => text.push('\x08'),
                'e' | 'E' => text.push('\x1b'),
                'f' => text.push('\x0c'),
                'v' => text.push('\x0b'),
                'x' | 'u' | 'U' => {
                    let max = match n {
                        'x' => 2,
                        'u' => 4,
                        _ => 8,
                    };
                    let mut v = 0u32;
                    let mut k = 0;
                    while k < max && i < chars.len() && chars[i].is_ascii_hexdigit() {
                        v = v * 16 + chars[i].to_digit(16).unwrap_or(0);
                        i += 1;
                        k += 1;
                    }
                    if let Some(ch) = char::from_u32(v) {
                        text.push(ch);
                    }
                }
                '0'..='7' => {
                    let mut v = n.to_digit(8).unwrap_or(0);
                    let mut k = 1;
                    while k < 3 && i < chars.len() && chars[i].is_digit(8) {
                        v = v * 8 + chars[i].to_digit(8).unwrap_or(0);
                        i += 1;
                        k += 1;
                    }
                    if let Some(ch) = char::from_u32(v) {
                        text.push(ch);
                    }
                }
                'c' => {
                    if i < chars.len() {
                        i += 1;
                    }
                }
                other => text.push(other),
            }
        } else {
            text.push(chars[i]);
            i += 1;
        }
    }
    i + 1
}

/// Index of the `)` closing a `(` at `open`, honouring quotes and nesting.
pub(crate) fn matching_paren(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '\'' => {
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            '(' => depth += 1,
            ')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Insert the output of a substitution computed statically: trailing newlines removed, split
/// unless quoted.
fn substituted(out: &mut Out, text: &str, quoted: bool) {
    let start = out.text.len();
    out.text.push_str(text.trim_end_matches('\n'));
    if !quoted {
        out.splits.push((start, out.text.len(), Split::Ifs));
    }
}

/// A command substitution: its output when `eval` computes it (the body still runs), else a
/// dynamic part.
fn substitution(out: &mut Out, subs: &mut Vec<String>, eval: Eval<'_>, body: String, quoted: bool) {
    match eval(&body) {
        Some(text) => {
            substituted(out, &text, quoted);
            subs.push(format!("{STATIC_MARK}{body}"));
        }
        None => {
            out.mark_dyn();
            subs.push(body);
        }
    }
}

/// Insert a known value; unquoted, it is split into fields.
fn value(out: &mut Out, v: &str, quoted: bool) {
    let start = out.text.len();
    out.text.push_str(v);
    if !quoted {
        out.splits.push((start, out.text.len(), Split::Ifs));
    }
}

/// Insert the elements of a list (`$@`, `${a[@]}`): quoted, one field each; unquoted, split.
fn elements(out: &mut Out, items: &[String], quoted: bool) {
    let start = out.text.len();
    out.text.push_str(&items.join(if quoted { "\0" } else { " " }));
    out.splits.push((start, out.text.len(), if quoted { Split::Nul } else { Split::Ifs }));
}

fn backtick(chars: &[char], i: usize, out: &mut Out, subs: &mut Vec<String>, eval: Eval<'_>, quoted: bool) -> usize {
    let mut j = i + 1;
    let mut body = String::new();
    while j < chars.len() && chars[j] != '`' {
        if chars[j] == '\\' && j + 1 < chars.len() && matches!(chars[j + 1], '`' | '\\' | '$') {
            body.push(chars[j + 1]);
            j += 2;
        } else {
            body.push(chars[j]);
            j += 1;
        }
    }
    substitution(out, subs, eval, body, quoted);
    j + 1
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn lookup(name: &str, vars: &Vars) -> Option<String> {
    match vars.map.get(name) {
        Some(Var::Static(v)) => return Some(v.clone()),
        Some(Var::Array(a)) => return Some(a.first().cloned().unwrap_or_default()),
        Some(Var::Dynamic) => return None,
        None => {}
    }
    match name {
        "HOME" => vars.home.clone(),
        "PWD" => vars.pwd.clone(),
        _ => {
            if let Ok(n) = name.parse::<usize>() {
                if n >= 1 {
                    return vars.positional.get(n - 1).cloned();
                }
                return vars.arg0.clone();
            }
            None
        }
    }
}

/// Expand `$…` at `i`; returns the index after it.
fn dollar(
    chars: &[char],
    i: usize,
    out: &mut Out,
    subs: &mut Vec<String>,
    vars: &Vars,
    eval: Eval<'_>,
    quoted: bool,
) -> usize {
    let next = chars.get(i + 1).copied();
    match next {
        Some('(') => {
            if chars.get(i + 2) == Some(&'(') {
                // Arithmetic: dynamic, no commands (nested $( ) inside is rare; still scanned).
                let end = matching_paren(chars, i + 1).unwrap_or(chars.len());
                let inner: String =
                    chars[(i + 3).min(end)..end.saturating_sub(1).max(i + 3).min(chars.len())].iter().collect();
                if inner.contains("$(") || inner.contains('`') {
                    subs.push(inner);
                }
                out.mark_dyn();
                return end + 1;
            }
            let end = matching_paren(chars, i + 1).unwrap_or(chars.len());
            let body: String = chars[(i + 2).min(end)..end].iter().collect();
            substitution(out, subs, eval, body, quoted);
            end + 1
        }
        Some('{') => {
            let mut j = i + 2;
            let mut depth = 1;
            while j < chars.len() {
                match chars[j] {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            let inner: String = chars[(i + 2).min(j)..j.min(chars.len())].iter().collect();
            param(&inner, out, subs, vars, eval, quoted);
            j + 1
        }
        Some(c) if is_name_start(c) => {
            let mut j = i + 1;
            while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            let name: String = chars[i + 1..j].iter().collect();
            match lookup(&name, vars) {
                Some(v) => value(out, &v, quoted),
                None => {
                    out.mark_dyn();
                    out.text.push('$');
                    out.text.push_str(&name);
                }
            }
            j
        }
        Some(c) if c.is_ascii_digit() => {
            let name = c.to_string();
            match lookup(&name, vars) {
                Some(v) => value(out, &v, quoted),
                None => {
                    out.mark_dyn();
                    out.text.push('$');
                    out.text.push(c);
                }
            }
            i + 2
        }
        Some(c @ ('@' | '*')) => {
            if vars.positional.is_empty() {
                out.mark_dyn();
                out.text.push('$');
                out.text.push(c);
            } else if c == '*' && quoted {
                out.text.push_str(&vars.positional.join(" "));
            } else {
                elements(out, &vars.positional, quoted);
            }
            i + 2
        }
        Some(c @ ('#' | '?' | '$' | '!' | '-')) => {
            out.mark_dyn();
            out.text.push('$');
            out.text.push(c);
            i + 2
        }
        _ => {
            out.text.push('$');
            i + 1
        }
    }
}

/// `${…}` forms.
fn param(inner: &str, out: &mut Out, subs: &mut Vec<String>, vars: &Vars, eval: Eval<'_>, quoted: bool) {
    // Arrays: `${a[@]}`, `${a[*]}`, `${a[N]}`.
    if let Some((name, idx)) = inner.strip_suffix(']').and_then(|s| s.split_once('[')) {
        let items = match vars.map.get(name) {
            Some(Var::Array(a)) => Some(a.clone()),
            Some(Var::Static(v)) => Some(vec![v.clone()]),
            _ => None,
        };
        if let Some(items) = items {
            match idx {
                "@" => return elements(out, &items, quoted),
                "*" if quoted => return out.text.push_str(&items.join(" ")),
                "*" => return elements(out, &items, false),
                n => {
                    if let Ok(k) = n.parse::<usize>() {
                        return value(out, items.get(k).map(String::as_str).unwrap_or(""), quoted);
                    }
                }
            }
        }
    }
    let name_len = inner
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
        .map(|(k, _)| k)
        .unwrap_or(inner.len());
    let name = &inner[..name_len];
    let rest = &inner[name_len..];
    let val = if name.is_empty() { None } else { lookup(name, vars) };
    let known = !name.is_empty() && vars.map.contains_key(name);
    let default_op = ["-", ":-", "=", ":="].iter().find(|op| rest.starts_with(**op));
    if let Some(op) = default_op {
        let word = &rest[op.len()..];
        let use_default = match &val {
            Some(v) => op.starts_with(':') && v.is_empty(),
            // Unknown to us: assume unset, the default is what a careless script would hit.
            None => !known,
        };
        if use_default {
            let e = expand_with(word, vars, eval);
            subs.extend(e.subs);
            subs.extend(e.static_subs.iter().map(|s| format!("{STATIC_MARK}{s}")));
            if let Some(w) = e.words.into_iter().next() {
                if let Some(d) = w.dyn_at {
                    if out.dyn_at.is_none() {
                        out.dyn_at = Some(out.text.len() + d);
                    }
                }
                out.text.push_str(&w.text);
            }
            return;
        }
        if let Some(v) = val {
            return value(out, &v, quoted);
        }
    } else if rest.is_empty() {
        if let Some(v) = val {
            return value(out, &v, quoted);
        }
    }
    if rest.contains("$(") || rest.contains('`') {
        let e = expand(rest, vars);
        subs.extend(e.subs);
    }
    out.mark_dyn();
    out.text.push_str("${");
    out.text.push_str(inner);
    out.text.push('}');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ex(s: &str) -> Vec<String> {
        expand(s, &Vars::default()).words.into_iter().map(|w| w.text).collect()
    }

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(ex("r''m"), ["rm"]);
        assert_eq!(ex("\"r\"m"), ["rm"]);
        assert_eq!(ex("\\r\\m"), ["rm"]);
        assert_eq!(ex("$'\\x72\\x6d'"), ["rm"]);
        assert_eq!(ex("$'\\162\\155'"), ["rm"]);
        assert_eq!(ex("'a b'"), ["a b"]);
    }

    #[test]
    fn variables() {
        let mut v = Vars::default();
        v.map.insert("X".into(), Var::Static("/".into()));
        v.home = Some("/home/dev".into());
        let e = expand("$X", &v);
        assert_eq!(e.words[0].text, "/");
        assert!(e.words[0].is_static());
        assert_eq!(expand("${HOME}/x", &v).words[0].text, "/home/dev/x");
        assert_eq!(expand("${Y:-/}", &v).words[0].text, "/");
        let e = expand("/$Y", &v);
        assert_eq!(e.words[0].dyn_at, Some(1));
        let e = expand("$(echo hi)x", &v);
        assert_eq!(e.subs, ["echo hi"]);
        assert_eq!(e.words[0].dyn_at, Some(0));
        let e = expand("\"`rm -rf /`\"", &v);
        assert_eq!(e.subs, ["rm -rf /"]);
    }

    #[test]
    fn braces() {
        assert_eq!(ex("/{etc,usr}"), ["/etc", "/usr"]);
        assert_eq!(ex("'{a,b}'"), ["{a,b}"]);
        assert_eq!(ex("{}"), ["{}"]);
    }

    /// A word of 2^40 expansions yields at most MAX_BRACE_WORDS words, the rest unknown (so
    /// judged as anything), on a small stack; a long word is not copied per alternative.
    #[test]
    fn brace_bombs_stay_bounded_and_unknown() {
        let run = |raw: String| {
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || expand(&raw, &Vars::default()).words)
                .unwrap()
                .join()
                .unwrap()
        };
        let words = run(format!("/x{}", "{a,b}".repeat(40)));
        assert!(words.len() <= MAX_BRACE_WORDS && words.len() >= 128, "{}", words.len());
        assert!(words.iter().all(|w| w.dyn_at.is_some()), "the unexpanded rest is unknown");
        assert!(words.iter().all(|w| w.text.starts_with("/x")));
        let words = run(format!("/{}", "{a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p}".repeat(20_000)));
        assert!(words.len() <= MAX_BRACE_WORDS, "{}", words.len());
        let words = run(format!("/{{etc,usr}}/{}", "x".repeat(MAX_BRACE_TEXT)));
        assert_eq!(words.len(), 1);
        assert_eq!(words[0].dyn_at, Some(1));
        assert_eq!(ex("/{a,b}{c,d}"), ["/ac", "/ad", "/bc", "/bd"]);
    }
}
