//! Here-document bodies taken out before parsing. Tokenizing a body char by char is most of
//! what a `cat > file <<'EOF' … EOF` costs, and its text is data for the shell's lexer. A
//! pre-scan finds the bodies of top-level here-documents, replaces each with a one-line marker
//! and keeps the text, which the extractor puts back wherever the body is read (stdin text,
//! `bash <<EOF`, rules' regexes): nothing is hidden from rules.
//!
//! The pre-scan elides only where it can follow the shell's lexer exactly: here-documents at
//! top level (not inside quotes, substitutions, subshells or arithmetic), one per line, with a
//! plain delimiter (`EOF`, `'EOF'`, `"EOF"`, `\EOF`) and nothing after it on the line that could
//! carry a quote or substitution across lines. Anything else: no elision. After parsing,
//! [`Elided::verify`] checks that each marker became exactly one here-document body; if not, the
//! caller parses the original text. `tests/heredoc.rs` compares the result with brush-parser's
//! own on the agent corpus and on generated scripts.

use brush_parser::ast;

/// Bodies shorter than this are left in place (eliding them saves nothing).
const MIN_BODY: usize = 64;

/// A text with some here-document bodies replaced by markers.
#[derive(Debug)]
pub(crate) struct Elided {
    /// The text to parse.
    pub text: String,
    /// The bodies, in order, as brush-parser would give them (`doc.value`), with the global
    /// index of their marker.
    pub bodies: Vec<(usize, String)>,
}

/// The marker line standing for body number `n` (U+0001 never occurs in shell text).
pub(crate) fn marker(n: usize) -> String {
    format!("\u{1}txbox-heredoc-{n}\u{1}\n")
}

/// The body number a here-document value stands for, if it is a marker.
pub(crate) fn marker_index(value: &str) -> Option<usize> {
    value.strip_prefix("\u{1}txbox-heredoc-")?.strip_suffix("\u{1}\n")?.parse().ok()
}

/// The text of a here-document whose parsed value is `value`: its body when a marker.
pub(crate) fn body<'a>(value: &'a str, bodies: &'a [String]) -> &'a str {
    match marker_index(value).and_then(|n| bodies.get(n)) {
        Some(b) => b,
        None => value,
    }
}

/// Lexical contexts the scanner tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// `$( … )` or `( … )`.
    Sub,
    /// `"…"`.
    Dq,
    /// `${…}`.
    Brace,
    /// `` `…` ``.
    Tick,
    /// `$(( … ))`; the count of open parentheses inside.
    Arith(u32),
}

/// Take out the bodies of top-level here-documents of `src`, numbering markers from `first`.
/// `None`: nothing elided (no body worth it, or a construct the scanner does not follow).
pub(crate) fn elide(src: &str, first: usize) -> Option<Elided> {
    if !src.contains("<<") {
        return None;
    }
    let b = src.as_bytes();
    let mut stack: Vec<Ctx> = Vec::new();
    let mut out = String::with_capacity(src.len());
    let mut bodies = Vec::new();
    let mut copied = 0; // bytes of `src` already copied to `out`
    let mut i = 0;
    let mut word_start = true;
    while i < b.len() {
        let c = b[i];
        let top = stack.last().copied();
        match top {
            None | Some(Ctx::Sub) => match c {
                b'\\' => i += 1,
                b'\'' => i = src[i + 1..].find('\'').map(|k| i + 1 + k)?,
                b'"' => stack.push(Ctx::Dq),
                b'`' => stack.push(Ctx::Tick),
                b'$' if b.get(i + 1) == Some(&b'\'') => i = ansi_end(b, i + 2)?,
                b'$' if matches!(b.get(i + 1), Some(b'(' | b'{')) => i = open_dollar(b, i, &mut stack),
                b'(' => stack.push(Ctx::Sub),
                b')' => {
                    if top != Some(Ctx::Sub) {
                        return None;
                    }
                    stack.pop();
                }
                b'#' if word_start => {
                    i = src[i..].find('\n').map(|k| i + k).unwrap_or(b.len()) - 1;
                }
                b'<' if b.get(i + 1) == Some(&b'<') && b.get(i + 2) == Some(&b'<') => i += 2,
                b'<' if b.get(i + 1) == Some(&b'<') => {
                    // A here-document inside a nested context: its body lies inside that
                    // context's text; not followed.
                    if top.is_some() {
                        return None;
                    }
                    let h = heredoc_at(src, i)?;
                    if h.value.len() >= MIN_BODY {
                        out.push_str(&src[copied..h.body_start]);
                        let n = first + bodies.len();
                        out.push_str(&marker(n));
                        bodies.push((n, h.value));
                        copied = h.body_end;
                    }
                    i = h.body_end;
                    word_start = true;
                    continue;
                }
                _ => {}
            },
            Some(Ctx::Dq) => match c {
                b'\\' => i += 1,
                b'"' => {
                    stack.pop();
                }
                b'`' => stack.push(Ctx::Tick),
                b'$' if matches!(b.get(i + 1), Some(b'(' | b'{')) => i = open_dollar(b, i, &mut stack),
                _ => {}
            },
            Some(Ctx::Brace) => match c {
                b'\\' => i += 1,
                b'\'' => i = src[i + 1..].find('\'').map(|k| i + 1 + k)?,
                b'"' => stack.push(Ctx::Dq),
                b'{' => stack.push(Ctx::Brace),
                b'}' => {
                    stack.pop();
                }
                b'$' if b.get(i + 1) == Some(&b'(') => {
                    stack.push(Ctx::Sub);
                    i += 1;
                }
                _ => {}
            },
            Some(Ctx::Tick) => match c {
                b'\\' => i += 1,
                b'`' => {
                    stack.pop();
                }
                _ => {}
            },
            Some(Ctx::Arith(open)) => match c {
                b'(' => {
                    stack.pop();
                    stack.push(Ctx::Arith(open + 1));
                }
                b')' if open > 0 => {
                    stack.pop();
                    stack.push(Ctx::Arith(open - 1));
                }
                b')' => {
                    if b.get(i + 1) != Some(&b')') {
                        return None;
                    }
                    stack.pop();
                    i += 1;
                }
                _ => {}
            },
        }
        word_start = matches!(c, b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'(' | b')');
        i += 1;
    }
    if !stack.is_empty() || bodies.is_empty() {
        return None;
    }
    out.push_str(&src[copied..]);
    Some(Elided { text: out, bodies })
}

/// Enter the context a `$(`, `$((` or `${` at `i` opens; returns the index of its last byte.
fn open_dollar(b: &[u8], i: usize, stack: &mut Vec<Ctx>) -> usize {
    match (b.get(i + 1), b.get(i + 2)) {
        (Some(b'('), Some(b'(')) => {
            stack.push(Ctx::Arith(0));
            i + 2
        }
        (Some(b'('), _) => {
            stack.push(Ctx::Sub);
            i + 1
        }
        _ => {
            stack.push(Ctx::Brace);
            i + 1
        }
    }
}

/// Index after the `'` closing a `$'…'` whose content starts at `i` (backslash escapes).
fn ansi_end(b: &[u8], mut i: usize) -> Option<usize> {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'\'' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// One here-document found by the scanner.
struct Found {
    /// Byte range of the body in the source (after the operator's line, before the end line).
    body_start: usize,
    body_end: usize,
    /// What brush-parser gives as the document (leading tabs removed for `<<-`).
    value: String,
}

/// The here-document whose operator `<<` is at `i`, if the scanner can follow it exactly.
fn heredoc_at(src: &str, i: usize) -> Option<Found> {
    let b = src.as_bytes();
    let mut j = i + 2;
    let dash = b.get(j) == Some(&b'-');
    if dash {
        j += 1;
    }
    while matches!(b.get(j), Some(b' ' | b'\t')) {
        j += 1;
    }
    let plain = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.');
    let (tag, after) = match b.get(j)? {
        q @ (b'\'' | b'"') => {
            let end = src[j + 1..].find(*q as char)? + j + 1;
            let t = &src[j + 1..end];
            (t, end + 1)
        }
        b'\\' => {
            let s = j + 1;
            let e = s + b[s..].iter().take_while(|c| plain(**c)).count();
            (&src[s..e], e)
        }
        _ => {
            let e = j + b[j..].iter().take_while(|c| plain(**c)).count();
            (&src[j..e], e)
        }
    };
    if tag.is_empty() || !tag.bytes().all(plain) {
        return None;
    }
    // The tag must end the word, and the rest of the line must not carry anything across
    // lines (quotes, escapes, substitutions) nor start another here-document.
    if after < b.len() && !matches!(b[after], b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'>' | b'<') {
        return None;
    }
    let eol = src[after..].find('\n').map(|k| after + k)?;
    let rest = &src[after..eol];
    if rest.contains(['\'', '"', '\\', '`', '$', '(', ')', '#', '{', '}']) || rest.contains("<<") {
        return None;
    }
    let body_start = eol + 1;
    let mut value = String::new();
    let mut k = body_start;
    loop {
        let line_end = src[k..].find('\n').map(|e| k + e + 1);
        let line = &src[k..line_end.unwrap_or(src.len())];
        let stripped = if dash { line.trim_start_matches('\t') } else { line };
        let content = stripped.strip_suffix('\n').unwrap_or(stripped);
        if content == tag {
            return Some(Found { body_start, body_end: k, value });
        }
        // A line that almost ends the document: the shells may disagree; not followed.
        if content.trim_end() == tag || content.trim_start() == tag {
            return None;
        }
        value.push_str(stripped);
        k = line_end?;
    }
}

impl Elided {
    /// Whether every marker became exactly one here-document body of `program`.
    pub(crate) fn verify(&self, program: &ast::Program) -> bool {
        let mut seen = vec![0u32; self.bodies.len()];
        let first = self.bodies.first().map(|b| b.0).unwrap_or(0);
        let mut ok = true;
        let mut visit = |doc: &ast::IoHereDocument| match marker_index(&doc.doc.value) {
            Some(n) if n >= first && n - first < seen.len() => seen[n - first] += 1,
            Some(_) => ok = false,
            None => {}
        };
        for cc in &program.complete_commands {
            visit_list(cc, &mut visit);
        }
        ok && seen.iter().all(|n| *n == 1)
    }
}

/// Call `f` on every here-document of a list, in order.
pub(crate) fn visit_list(l: &ast::CompoundList, f: &mut dyn FnMut(&ast::IoHereDocument)) {
    for item in &l.0 {
        let pipelines = std::iter::once(&item.0.first).chain(item.0.additional.iter().map(|x| match x {
            ast::AndOr::And(p) | ast::AndOr::Or(p) => p,
        }));
        for p in pipelines {
            for c in &p.seq {
                visit_command(c, f);
            }
        }
    }
}

fn visit_redirects(r: Option<&ast::RedirectList>, f: &mut dyn FnMut(&ast::IoHereDocument)) {
    for io in r.iter().flat_map(|r| r.0.iter()) {
        visit_redirect(io, f);
    }
}

fn visit_redirect(io: &ast::IoRedirect, f: &mut dyn FnMut(&ast::IoHereDocument)) {
    match io {
        ast::IoRedirect::HereDocument(_, doc) => f(doc),
        ast::IoRedirect::File(_, _, ast::IoFileRedirectTarget::ProcessSubstitution(_, s)) => visit_list(&s.list, f),
        _ => {}
    }
}

fn visit_command(c: &ast::Command, f: &mut dyn FnMut(&ast::IoHereDocument)) {
    match c {
        ast::Command::Simple(s) => {
            for it in s.prefix.iter().flat_map(|p| p.0.iter()).chain(s.suffix.iter().flat_map(|x| x.0.iter())) {
                match it {
                    ast::CommandPrefixOrSuffixItem::IoRedirect(io) => visit_redirect(io, f),
                    ast::CommandPrefixOrSuffixItem::ProcessSubstitution(_, s) => visit_list(&s.list, f),
                    _ => {}
                }
            }
        }
        ast::Command::Compound(cc, r) => {
            visit_compound(cc, f);
            visit_redirects(r.as_ref(), f);
        }
        ast::Command::Function(fd) => {
            visit_compound(&fd.body.0, f);
            visit_redirects(fd.body.1.as_ref(), f);
        }
        ast::Command::ExtendedTest(..) => {}
    }
}

fn visit_compound(cc: &ast::CompoundCommand, f: &mut dyn FnMut(&ast::IoHereDocument)) {
    match cc {
        ast::CompoundCommand::BraceGroup(b) => visit_list(&b.list, f),
        ast::CompoundCommand::Subshell(s) => visit_list(&s.list, f),
        ast::CompoundCommand::ForClause(x) => visit_list(&x.body.list, f),
        ast::CompoundCommand::ArithmeticForClause(x) => visit_list(&x.body.list, f),
        ast::CompoundCommand::CaseClause(x) => {
            for item in &x.cases {
                if let Some(l) = &item.cmd {
                    visit_list(l, f);
                }
            }
        }
        ast::CompoundCommand::IfClause(x) => {
            visit_list(&x.condition, f);
            visit_list(&x.then, f);
            for e in x.elses.iter().flatten() {
                if let Some(c) = &e.condition {
                    visit_list(c, f);
                }
                visit_list(&e.body, f);
            }
        }
        ast::CompoundCommand::WhileClause(w) | ast::CompoundCommand::UntilClause(w) => {
            visit_list(&w.0, f);
            visit_list(&w.1.list, f);
        }
        ast::CompoundCommand::Arithmetic(_) => {}
        ast::CompoundCommand::Coprocess(c) => visit_command(&c.body, f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elides_plain_bodies_only() {
        let body = "x\n".repeat(40);
        let s = format!("cat > f <<'EOF'\n{body}EOF\necho done");
        let e = elide(&s, 0).unwrap_or_else(|| panic!("not elided"));
        assert_eq!(e.text, format!("cat > f <<'EOF'\n{}EOF\necho done", marker(0)));
        assert_eq!(e.bodies, vec![(0, body.clone())]);
        // Short bodies, here-strings, quoted `<<` and nested here-documents: untouched.
        assert!(elide("cat <<EOF\nx\nEOF", 0).is_none());
        assert!(elide(&format!("echo '<<EOF'\n{body}EOF"), 0).is_none());
        assert!(elide(&format!("cat <<< x\n{body}"), 0).is_none());
        assert!(elide(&format!("x=$(cat <<EOF\n{body}EOF\n)"), 0).is_none());
        // Something after the tag that could continue across lines.
        assert!(elide(&format!("cat <<EOF \"a\nb\"\n{body}EOF"), 0).is_none());
        // `<<-` strips leading tabs, as brush-parser does.
        let tabbed = "\tx\n".repeat(40);
        let e = elide(&format!("cat <<-EOF\n{tabbed}\tEOF\n"), 5).unwrap_or_else(|| panic!("not elided"));
        assert_eq!(e.bodies, vec![(5, body)]);
        assert_eq!(marker_index(&marker(5)), Some(5));
    }
}

/// The elided parse agrees with brush-parser's parse of the whole text: same here-documents
/// (bodies, flags, delimiters) and the same extraction, on the agent corpus and on generated
/// scripts built to confuse a pre-scan.
#[cfg(test)]
mod agreement_tests {
    use proptest::prelude::*;

    use super::*;

    type Doc = (String, bool, bool, String);

    fn parse(text: &str) -> Option<ast::Program> {
        let opts = brush_parser::ParserOptions::default();
        brush_parser::Parser::new(std::io::Cursor::new(text), &opts).parse_program().ok()
    }

    fn docs(p: &ast::Program, bodies: &[(usize, String)]) -> Vec<Doc> {
        let mut v = Vec::new();
        for cc in &p.complete_commands {
            visit_list(cc, &mut |d: &ast::IoHereDocument| {
                let value = match marker_index(&d.doc.value) {
                    Some(n) => bodies.iter().find(|b| b.0 == n).map(|b| b.1.clone()).unwrap_or_default(),
                    None => d.doc.value.clone(),
                };
                v.push((value, d.requires_expansion, d.remove_tabs, d.here_end.value.clone()));
            });
        }
        v
    }

    /// `Err` describes a disagreement; `Ok(true)` when something was elided. Texts with a
    /// parser trap in their code (see `extract::parser_trap`) never reach brush-parser whole,
    /// so there is nothing to compare.
    fn agree(text: &str) -> Result<bool, String> {
        if super::super::parser_trap(text).is_some() {
            return Ok(false);
        }
        let Some(e) = elide(text, 0) else { return Ok(false) };
        let Some(elided) = parse(&e.text).filter(|p| e.verify(p)) else { return Ok(false) };
        let Some(whole) = parse(text) else { return Err(format!("only the elided text parses: {text:?}")) };
        let (a, b) = (docs(&whole, &[]), docs(&elided, &e.bodies));
        if a != b {
            return Err(format!("{text:?}\nwhole:  {a:?}\nelided: {b:?}"));
        }
        let ctx = crate::example_context();
        let (x, y) =
            (super::super::extract_str_with(text, &ctx, false), super::super::extract_str_with(text, &ctx, true));
        if format!("{:?}", x.cmds) != format!("{:?}", y.cmds) {
            return Err(format!("extractions differ for {text:?}"));
        }
        Ok(true)
    }

    #[test]
    fn agrees_on_the_agent_corpus() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/agent_sessions.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (mut elided, mut bad) = (0, Vec::new());
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}"));
            for c in v["commands"].as_array().into_iter().flatten().filter_map(|c| c.as_str()) {
                match agree(c) {
                    Ok(true) => elided += 1,
                    Ok(false) => {}
                    Err(e) => bad.push(e),
                }
            }
        }
        assert!(bad.is_empty(), "{} disagreements:\n{}", bad.len(), bad.join("\n\n"));
        // The corpus has ~400 here-documents; most are elided (the point of the pre-scan).
        assert!(elided > 200, "only {elided} commands elided");
    }

    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("echo hi".to_string()),
            Just("echo '<<EOF'".to_string()),
            Just("echo \"a <<EOF b\"".to_string()),
            Just("x=$(( 1 << 2 ))".to_string()),
            Just("(( y = 1 << 3 ))".to_string()),
            Just("# cat <<EOF".to_string()),
            Just("cat <<< EOF".to_string()),
            Just("echo \"$(echo ')')\"".to_string()),
            Just("echo 'multi\nline'".to_string()),
            Just("echo \"multi\nline\"".to_string()),
            Just("f() { cat; }".to_string()),
            Just("{ echo a; }".to_string()),
            Just("echo `echo x`".to_string()),
            Just("echo ${x:-'}'}".to_string()),
            Just("echo $'it\\'s'".to_string()),
        ]
    }

    fn body_line() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z ]{0,30}",
            Just("EOF ".to_string()),
            Just(" EOF".to_string()),
            Just("\tEOF".to_string()),
            Just("EOFX".to_string()),
            Just("'".to_string()),
            Just("\"".to_string()),
            Just("$(rm -rf /)".to_string()),
            Just("`id`".to_string()),
            Just("\\".to_string()),
            Just("\tindented".to_string()),
            Just("PY".to_string()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn agrees_on_generated_scripts(
            before in proptest::collection::vec(piece(), 0..3),
            op in prop_oneof![Just("<<"), Just("<<-"), Just("<< ")],
            tag in prop_oneof![Just("EOF"), Just("'EOF'"), Just("\"EOF\""), Just("\\EOF"), Just("E_1")],
            rest in prop_oneof![Just(""), Just(" > out.txt"), Just(" | sh"), Just(" && echo ok"), Just(" \"x"), Just(" # c")],
            lines in proptest::collection::vec(body_line(), 0..12),
            end_tabs in prop_oneof![Just(""), Just("\t")],
            after in proptest::collection::vec(piece(), 0..3),
        ) {
            let plain = tag.trim_matches(['\'', '"', '\\']);
            let mut s = before.join("\n");
            if !s.is_empty() {
                s.push('\n');
            }
            // Long enough to be elided.
            let filler = "filler line of the document body\n".repeat(3);
            s.push_str(&format!("cat {op}{tag}{rest}\n{filler}{}\n{end_tabs}{plain}\n{}", lines.join("\n"), after.join("\n")));
            if let Err(e) = agree(&s) {
                prop_assert!(false, "{}", e);
            }
        }
    }
}
