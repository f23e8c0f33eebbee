//! Extraction: parse a shell string with brush-parser and list every command it would run, in
//! canonical form, recursively through substitutions, `sh -c`, `eval`, wrappers, `xargs`,
//! `find -exec`, functions, loops and here-documents.
//!
//! This module owns the extractor's state ([`Extractor`]: variables, cwd, functions, depth) and
//! its output types ([`Cmd`], [`Extraction`]); its children own one concern each:
//! `walk` the AST, `dispatch` what one command is (wrapper, shell, builtin), `programs` the
//! per-program models (shells and interpreters, `xargs`, `find`), `wrappers` the wrapper
//! table, `flags` canonical flags, `feature` the facts rules can match. Extraction decides
//! nothing: it may not know a rule or an action (that is `rules` and `lib`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;

use brush_parser::ast;

use crate::paths;
use crate::words::{EWord, Vars};
use crate::Context;

mod dispatch;
mod downloads;
mod feature;
mod flags;
pub(crate) mod heredoc;
mod hooks;
mod programs;
mod statics;
mod walk;
mod wrappers;

pub(crate) use feature::Feature;

const MAX_DEPTH: usize = 12;
/// The most nesting tokens ([`nesting_tokens`]) in the texts being parsed and walked at once
/// (a string and the strings it runs): a bound on how deep the parser and the walker recurse,
/// so a hostile command cannot overflow the stack and kill the process judging it (with 256
/// the deepest input takes a few MiB of stack in a debug build; servers' threads have 16 MiB).
pub(crate) const MAX_NESTING: usize = 256;
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
    /// Facts only the extractor sees (see [`Feature`]).
    pub features: Vec<Feature>,
    /// Why the command is opaque to the engine (it cannot see what would run).
    pub opaque: Option<String>,
    /// Here-document / here-string text fed to stdin.
    pub input: Option<String>,
    /// Indices (in the extraction) of the commands whose output reaches this one: the previous
    /// pipeline stage, substitutions in its words and redirections, and the substitutions a
    /// variable it expands was assigned from. Rules follow them to see what data it receives.
    pub feeds: Vec<usize>,
    /// Indices of arguments naming a file an earlier command copied a secret into.
    pub secret_args: Vec<usize>,
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
    /// Why the extraction may miss commands bash would run, if it may: it stopped where bash
    /// goes on. The engine refuses such a string (`engine.unjudgeable`).
    pub unjudged: Option<String>,
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
    features: Vec<Feature>,
    /// See [`Cmd::feeds`].
    feeds: Vec<usize>,
}

impl Raw {
    /// A command the extractor makes up from another (`find -exec`, `xargs`): no
    /// redirections of its own, input from elsewhere.
    fn derived(words: Vec<EWord>, features: Vec<Feature>, feeds: Vec<usize>) -> Raw {
        Raw { words, redirects: Vec::new(), stdin_from: Vec::new(), input: None, stdin_other: true, features, feeds }
    }
}

pub(crate) struct Extractor<'a> {
    ctx: &'a Context,
    vars: Vars,
    cwd: Option<PathBuf>,
    /// Functions defined so far, with their bodies (a call with arguments runs the body again
    /// with those as positional parameters).
    funcs: HashMap<String, ast::CompoundCommand>,
    defining: Vec<String>,
    depth: usize,
    /// Nesting tokens of the texts being walked now (see [`MAX_NESTING`]).
    nesting: usize,
    out: Vec<Cmd>,
    in_pipeline_or_bg: bool,
    /// Commands run by the substitutions met since the current simple command began.
    feeds_acc: Vec<usize>,
    /// Variables assigned from substitutions, and the commands those ran.
    var_feeds: HashMap<String, Vec<usize>>,
    /// Files written with downloaded content (normalised path, downloading program).
    downloads: Vec<(PathBuf, String)>,
    /// Directories a downloaded archive was unpacked into (everything below came from it).
    download_trees: Vec<(PathBuf, String)>,
    /// Files written with content known statically (`echo … > f`, `cat > f <<EOF`).
    scripts: Vec<(PathBuf, String)>,
    /// Files a command wrote while reading a secret (`cp ~/.ssh/id_rsa /tmp/k`).
    secret_copies: Vec<PathBuf>,
    /// The first reason the extraction stopped short of what bash would run (see
    /// [`Extraction::unjudged`]).
    unjudged: Option<String>,
    /// Here-document bodies taken out before parsing, by marker number (`heredoc`).
    bodies: Vec<String>,
    /// Whether to take here-document bodies out before parsing (off only to compare).
    elide: bool,
    /// Substitution bodies the static evaluation parsed, with their parse, for the extraction
    /// of the same bodies that follows ([`Kept`]).
    kept: Kept,
}

/// Parses of substitution bodies kept for a second use: the static evaluation of `$(…)`
/// (`statics::substitution`) parses a body, and the extractor then parses the same body again
/// to extract it. [`parse`] is a function of the text alone, so the kept parse is that parse.
/// The last few only (a body is extracted right after its word is expanded); interior
/// mutability because the static evaluation runs inside `expand_with`, which holds the
/// extractor's variables borrowed.
#[derive(Default)]
pub(crate) struct Kept(RefCell<Vec<(String, ast::Program)>>);

impl Kept {
    const MAX: usize = 8;

    pub(crate) fn keep(&self, text: &str, program: ast::Program) {
        let mut kept = self.0.borrow_mut();
        if kept.len() >= Self::MAX {
            kept.remove(0);
        }
        kept.push((text.to_string(), program));
    }

    /// [`parse`] of `text`, taken from the kept parses when it is one of them.
    fn parse(&self, text: &str) -> Result<ast::Program, Unparsed> {
        let found = {
            let mut kept = self.0.borrow_mut();
            kept.iter().position(|(t, _)| t == text).map(|k| kept.remove(k).1)
        };
        match found {
            Some(p) => Ok(p),
            None => parse(text),
        }
    }
}

impl Extractor<'_> {
    /// Parse `text`, its large top-level here-document bodies taken out first when the
    /// pre-scan can (the parse is checked to agree, else the text is parsed whole).
    /// The program, and the nesting tokens of the text parsed (the caller holds them in
    /// `self.nesting` while it walks the program).
    fn parse_eliding(&mut self, text: &str) -> Result<(ast::Program, usize), ParseFail> {
        if self.elide {
            if let Some(e) = heredoc::elide(text, self.bodies.len()) {
                // Bodies are data: the traps are looked for in the text without them.
                if parser_trap(&e.text).is_none() {
                    if let Ok(tokens) = self.nesting_room(&e.text) {
                        if let Some(p) = parse(&e.text).ok().filter(|p| e.verify(p)) {
                            self.bodies.extend(e.bodies.into_iter().map(|(_, v)| v));
                            return Ok((p, tokens));
                        }
                    }
                }
            }
        }
        if let Some(e) = parser_trap(text) {
            return Err(ParseFail { why: e, ours: true });
        }
        let tokens = self.nesting_room(text).map_err(|why| ParseFail { why, ours: true })?;
        // A parser that failed on the text says nothing of what bash would run of it: refused,
        // as the extractor's own bounds are.
        Ok((self.kept.parse(text).map_err(|u| ParseFail { why: u.why, ours: u.crashed })?, tokens))
    }

    /// Note that the extraction stops short of what bash would run (the first reason kept).
    fn unjudge(&mut self, why: String) {
        self.unjudged.get_or_insert(why);
    }

    /// The nesting tokens of `text`, if they fit under [`MAX_NESTING`] with those of the texts
    /// being walked; else the error that refuses to parse it.
    /// Without elision (the tests' comparison only) here-document bodies count, and a large
    /// body of C would pass the bound; that mode parses everything, as before the bound.
    fn nesting_room(&self, text: &str) -> Result<usize, String> {
        let tokens = nesting_tokens(text);
        if !self.elide {
            return Ok(0);
        }
        if self.nesting + tokens > MAX_NESTING {
            return Err(format!("nested too deeply to judge: more than {MAX_NESTING} nesting tokens"));
        }
        Ok(tokens)
    }
}

/// Why a text was not parsed: brush-parser's error (`ours: false`), or a bound or trap of this
/// extractor that refused it before parsing, or brush-parser failing on it (`ours: true`: bash
/// would run it, or some of it).
struct ParseFail {
    why: String,
    ours: bool,
}

/// Whether bash could run part of a text that does not parse as a whole: it parses and runs
/// one line's complete commands at a time, so every line before the one in error has run
/// when the error is found. Only a text of one line (a trailing newline aside) runs nothing.
fn runs_in_part(text: &str) -> bool {
    text.trim_end_matches('\n').contains('\n')
}

/// A here-document operator not followed by a word (`<< (`, `<<- <(x)`, `<<` at the end): bash
/// rejects it, and brush-parser 0.4 can exhaust memory on it inside a substitution
/// (`$(<< ($(`), so it is refused before parsing.
pub(crate) fn parser_trap(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let (mut opens, mut closes) = (PairCount::new(b, *b"(("), PairCount::new(b, *b"))"));
    parser_trap_by(text, |i| opens.upto(i) > closes.upto(i))
}

/// [`parser_trap`], told by `in_arithmetic(i)` whether the `<<` at byte `i` is a shift inside
/// `$(( ))` / `(( ))` (more `((` than `))` before it).
fn parser_trap_by(text: &str, mut in_arithmetic: impl FnMut(usize) -> bool) -> Option<String> {
    let b = text.as_bytes();
    let mut from = 0;
    while let Some(k) = text[from..].find("<<") {
        let i = from + k;
        // Operators are read greedily: `<<<` is a here-string, what follows it starts anew.
        if b.get(i + 2) == Some(&b'<') {
            from = i + 3;
            continue;
        }
        from = i + 2;
        if in_arithmetic(i) {
            continue;
        }
        let mut j = i + 2;
        while matches!(b.get(j), Some(b'-' | b' ' | b'\t')) {
            j += 1;
        }
        if b.get(j).is_none_or(|c| matches!(c, b'(' | b')' | b'<' | b'>' | b'|' | b';' | b'&' | b'\n')) {
            return Some("a here-document operator must be followed by its delimiter word".into());
        }
        // An empty delimiter (`<<""`, `<<''`) or one holding an expansion (`<<$(x)`): valid for
        // bash, but brush-parser 0.4 can exhaust memory on them; refused (so: a transaction).
        // The delimiter word: unquoted bytes and quoted runs, up to a metacharacter.
        let mut end = j;
        while let Some(&c) = b.get(end) {
            match c {
                b' ' | b'\t' | b'\n' | b';' | b'|' | b'&' | b'<' | b'>' => break,
                b'"' | b'\'' => match b[end + 1..].iter().position(|x| *x == c) {
                    Some(k) => end += k + 2,
                    None => return Some("an unterminated here-document delimiter".into()),
                },
                b'\\' => end += 2,
                _ => end += 1,
            }
        }
        let word = &b[j..end.min(b.len())];
        if word.starts_with(b"\"\"")
            || word.starts_with(b"''")
            || word.windows(2).any(|w| matches!(w, b"$(" | b"${"))
            || word.contains(&b'`')
        {
            return Some("an empty or expanding here-document delimiter is not supported".into());
        }
    }
    None
}

/// The occurrences of a two-byte pattern in growing prefixes of one text, counted as
/// `str::matches` counts them (left to right, not overlapping): each byte is looked at once
/// however many prefixes are asked for, where counting each prefix anew is quadratic in a text
/// with many `<<` (a C++ here-document body full of `cout <<`).
struct PairCount<'a> {
    b: &'a [u8],
    pat: [u8; 2],
    /// Where the count stopped: every occurrence that ends at or before it is counted.
    at: usize,
    n: usize,
}

impl<'a> PairCount<'a> {
    fn new(b: &'a [u8], pat: [u8; 2]) -> Self {
        PairCount { b, pat, at: 0, n: 0 }
    }

    /// The count in `b[..end]` (`end` never smaller than at the call before).
    fn upto(&mut self, end: usize) -> usize {
        while self.at + 2 <= end {
            if self.b[self.at..self.at + 2] == self.pat {
                self.n += 1;
                self.at += 2;
            } else {
                self.at += 1;
            }
        }
        self.n
    }
}

/// An upper bound on how deep the parser (and the walker after it) can nest on `text`: every
/// token that can open a level (`(`, `{`, a backquote, `[[`'s `!`, the compound commands'
/// keywords), counted wherever it is, quoted or not, never taken back by a closing one (a
/// closing token can be spoofed: `)` ends a `case` pattern, `}` may be a plain argument).
/// `&&` and `||` nest only inside `[[ ]]` and cost little there: one token per 16.
pub(crate) fn nesting_tokens(text: &str) -> usize {
    let b = text.as_bytes();
    let mut openers = 0usize;
    let mut and_or = 0usize;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match BYTE_CLASS[c as usize] {
            WORD => {
                // A whole word at once (the loop is always at a word's start here): a keyword
                // opens a level. Nothing inside a word can.
                let start = i;
                i += 1;
                while i < b.len() && BYTE_CLASS[b[i] as usize] == WORD {
                    i += 1;
                }
                if matches!(c, b'i' | b'w' | b'u' | b'f' | b'c' | b's')
                    && matches!(&b[start..i], b"if" | b"while" | b"until" | b"for" | b"case" | b"select" | b"function")
                {
                    openers += 1;
                }
                continue;
            }
            OPENER => openers += 1,
            AND_OR if b.get(i + 1) == Some(&c) => {
                and_or += 1;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    openers + and_or / 16
}

const OTHER: u8 = 0;
const WORD: u8 = 1;
const OPENER: u8 = 2;
const AND_OR: u8 = 3;

/// What each byte is to [`nesting_tokens`]: part of a word, a token that
/// opens a level, half of `&&` / `||`, or nothing. Word bytes: ASCII letters, digits, `_`.
static BYTE_CLASS: [u8; 256] = {
    let mut t = [OTHER; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = if b.is_ascii_alphanumeric() || b == b'_' {
            WORD
        } else if matches!(b, b'(' | b'{' | b'`' | b'!') {
            OPENER
        } else if matches!(b, b'&' | b'|') {
            AND_OR
        } else {
            OTHER
        };
        c += 1;
    }
    t
};

/// Why a text gave no program: brush-parser's syntax error, or brush-parser itself failing
/// (`crashed`: it panicked, as its tokenizer does on some unterminated constructs), where
/// nothing says what bash would make of the text.
pub(crate) struct Unparsed {
    pub(crate) why: String,
    pub(crate) crashed: bool,
}

/// Parse a shell string into a program (callers check [`parser_trap`] first). A panic inside
/// brush-parser is caught and returned (`Unparsed::crashed`): a hostile string must not take
/// down the process judging it (the CLI, or a server's judging thread), and its message is
/// kept off the caller's terminal.
pub(crate) fn parse(text: &str) -> Result<ast::Program, Unparsed> {
    #[cfg(test)]
    tests::PARSES.with(|n| n.set(n.get() + 1));
    quiet_parser_panics();
    let opts = brush_parser::ParserOptions::default();
    PARSING.with(|p| p.set(true));
    let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        brush_parser::Parser::new(std::io::Cursor::new(text), &opts).parse_program()
    }));
    PARSING.with(|p| p.set(false));
    match parsed {
        Ok(Ok(program)) => Ok(program),
        Ok(Err(e)) => Err(Unparsed { why: e.to_string(), crashed: false }),
        Err(_) => Err(Unparsed { why: "the shell parser failed on this string".into(), crashed: true }),
    }
}

thread_local! {
    /// Whether this thread is inside brush-parser (its panics are caught and reported).
    static PARSING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Install, once, a panic hook that says nothing for a panic inside brush-parser (caught by
/// [`parse`]) and hands every other panic to the hook that was there.
fn quiet_parser_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let earlier = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !PARSING.with(std::cell::Cell::get) {
                earlier(info);
            }
        }));
    });
}

/// Extract every command of a shell string.
pub(crate) fn extract_str(text: &str, ctx: &Context) -> Extraction {
    extract_str_with(text, ctx, true)
}

/// [`extract_str`], with here-document elision on or off (the tests compare both).
pub(crate) fn extract_str_with(text: &str, ctx: &Context, elide: bool) -> Extraction {
    let mut ex = Extractor::new(ctx);
    ex.elide = elide;
    let err = ex.run_str(text);
    Extraction { cmds: ex.out, parse_error: err, unjudged: ex.unjudged }
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
        feeds: Vec::new(),
    };
    ex.command(raw);
    Extraction { cmds: ex.out, parse_error: None, unjudged: ex.unjudged }
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
            funcs: HashMap::new(),
            defining: Vec::new(),
            depth: 0,
            nesting: 0,
            out: Vec::new(),
            in_pipeline_or_bg: false,
            feeds_acc: Vec::new(),
            var_feeds: HashMap::new(),
            downloads: Vec::new(),
            download_trees: Vec::new(),
            scripts: Vec::new(),
            secret_copies: Vec::new(),
            unjudged: None,
            bodies: Vec::new(),
            elide: true,
            kept: Kept::default(),
        }
    }

    pub(super) fn push(&mut self, mut c: Cmd) {
        self.follow_downloads(&mut c);
        self.follow_secrets(&mut c);
        let script = self.script_run(&c);
        if self.out.len() < MAX_CMDS {
            self.out.push(c);
        } else {
            // Bash runs every command; the rules would see only the first ones.
            self.unjudge(format!("more than {MAX_CMDS} commands"));
        }
        // A shell running a file whose content is known runs that content.
        if let Some((code, args)) = script {
            self.shell_code(&EWord::lit(&code), args);
        }
    }

    pub(super) fn opaque(&mut self, argv: Vec<String>, why: String) {
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
    pub(super) fn run_str(&mut self, text: &str) -> Option<String> {
        if self.depth >= MAX_DEPTH {
            self.opaque(vec![], "nesting too deep".into());
            self.unjudge(format!("strings run by strings more than {MAX_DEPTH} deep"));
            return None;
        }
        self.depth += 1;
        let res = match self.parse_eliding(text) {
            Ok((p, tokens)) => {
                self.nesting += tokens;
                for cc in &p.complete_commands {
                    self.list(cc);
                }
                self.nesting -= tokens;
                None
            }
            Err(ParseFail { why, ours }) => {
                self.opaque(vec![], format!("the string does not parse ({why})"));
                // What txbox refused to parse, bash would run; of a text bash cannot parse
                // either, it runs the lines before the error. Neither is judged.
                if ours {
                    self.unjudge(format!("it cannot be judged ({why})"));
                } else if runs_in_part(text) {
                    self.unjudge(format!("bash would run the lines before its error ({why})"));
                }
                Some(why)
            }
        };
        self.depth -= 1;
        res
    }

    /// Extract a nested string.
    pub(super) fn sub(&mut self, text: &str) {
        self.sub_from(text);
    }

    /// Extract a nested string and return the programs it runs.
    pub(super) fn sub_programs(&mut self, text: &str) -> Vec<String> {
        let start = self.sub_from(text);
        self.programs_since(start)
    }

    /// Extract a nested string; the index of its first command in `out`.
    fn sub_from(&mut self, text: &str) -> usize {
        let start = self.out.len();
        let saved_cwd = self.cwd.clone();
        let saved_vars = self.vars.map.clone();
        let saved_pipe = self.in_pipeline_or_bg;
        self.in_pipeline_or_bg = false;
        self.run_str(text);
        self.in_pipeline_or_bg = saved_pipe;
        self.cwd = saved_cwd;
        self.vars.map = saved_vars;
        let end = self.out.len();
        self.feeds_acc.extend(start..end);
        start
    }

    pub(super) fn programs_since(&self, start: usize) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for c in &self.out[start..] {
            let p = c.program().to_string();
            if !p.is_empty() && !v.contains(&p) {
                v.push(p);
            }
        }
        v
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    thread_local! {
        /// How many texts this thread parsed (`parse`).
        pub(super) static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    fn ctx() -> Context {
        crate::example_context()
    }

    /// A substitution body the static evaluation parsed is not parsed again to be extracted:
    /// the string and its two bodies, three parses (five without the kept parses).
    #[test]
    fn a_statically_evaluated_body_is_parsed_once() {
        PARSES.with(|n| n.set(0));
        let e = extract_str("echo $(echo rm) \"`printf x`\"", &ctx());
        assert_eq!(PARSES.with(std::cell::Cell::get), 3);
        let argvs: Vec<Vec<String>> = e.cmds.into_iter().map(|c| c.argv).collect();
        assert_eq!(argvs, [vec!["echo", "rm"], vec!["printf", "x"], vec!["echo", "rm", "x"]]);
    }

    fn argvs(s: &str) -> Vec<Vec<String>> {
        extract_str(s, &ctx()).cmds.into_iter().map(|c| c.argv).collect()
    }

    fn has(s: &str, want: &[&str]) -> bool {
        argvs(s).iter().any(|a| a == want)
    }

    /// Nesting beyond MAX_NESTING tokens (in one string, or summed over a string and the
    /// strings it runs) is not parsed: a parse error (the command runs as a transaction), never
    /// a stack overflow. Closing tokens cannot buy room back.
    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let nest = |open: &str, close: &str, n: usize| format!("{}true{}", open.repeat(n), close.repeat(n));
        assert_eq!(nesting_tokens("if [ ! -f a ]; then echo \"${x}\" && (cd b); fi"), 4);
        assert_eq!(nesting_tokens("iffy fortune selection"), 0);
        let deep = [
            nest("(", ")", MAX_NESTING + 1),
            nest("$(", ")", 10_000),
            nest("{ ", "; }", 10_000),
            nest("if true; then ", "; fi", 10_000),
            nest("( case x in x) ", ";; esac )", 10_000),
            format!("[[ {}-n x ]]", "! ".repeat(10_000)),
            format!("[[ {}-n x ]]", "-n x && ".repeat(100_000)),
            format!("bash -c '{}'; {}", nest("(", ")", 200), nest("(", ")", 100)),
            format!("{}bash -c '{}'{}", "$(".repeat(100), nest("(", ")", 200), ")".repeat(100)),
        ];
        for s in deep {
            let e = std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(move || extract_str(&s, &ctx()).parse_error)
                .unwrap()
                .join()
                .unwrap();
            assert!(e.is_some_and(|m| m.contains("nested too deeply")));
        }
        assert!(extract_str(&nest("(", ")", 100), &ctx()).parse_error.is_none());
    }

    fn is_word_byte(c: u8) -> bool {
        c.is_ascii_alphanumeric() || c == b'_'
    }

    /// The count as first written, byte by byte: [`nesting_tokens`] must agree with it.
    fn nesting_tokens_reference(text: &str) -> usize {
        const KEYWORDS: [&[u8]; 7] = [b"if", b"while", b"until", b"for", b"case", b"select", b"function"];
        let b = text.as_bytes();
        let mut openers = 0usize;
        let mut and_or = 0usize;
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'(' | b'{' | b'`' | b'!' => openers += 1,
                b'&' | b'|' if b.get(i + 1) == Some(&b[i]) => {
                    and_or += 1;
                    i += 1;
                }
                c if c.is_ascii_lowercase() && (i == 0 || !is_word_byte(b[i - 1])) => {
                    let end = b[i..].iter().position(|c| !is_word_byte(*c)).map_or(b.len(), |n| i + n);
                    if KEYWORDS.contains(&&b[i..end]) {
                        openers += 1;
                    }
                    i = end;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        openers + and_or / 16
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// Word by word counts what byte by byte counted, on texts made of the bytes that
        /// matter (keywords glued to words, digits and `_`, pairs and singles of `&` and `|`,
        /// non-ASCII).
        #[test]
        fn nesting_tokens_agrees_with_the_reference(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(vec![
                        "if", "while", "until", "for", "case", "select", "function", "fi", "done",
                        "If", "_if", "if_", "9if", "if9", "xif", "ifx", "é", "éif", "&", "&&", "|", "||",
                        "(", ")", "{", "}", "`", "!", " ", "\n", ";", "$", "\"", "'", "-", "=",
                    ]).prop_map(str::to_string),
                    "[a-zA-Z0-9_&|(){}` !;\n-]{0,6}",
                ],
                0..40,
            )
        ) {
            let text: String = parts.concat();
            proptest::prop_assert_eq!(nesting_tokens(&text), nesting_tokens_reference(&text));
        }
    }

    /// [`parser_trap`] as first written, each prefix's `((` and `))` counted anew.
    fn parser_trap_reference(text: &str) -> Option<String> {
        parser_trap_by(text, |i| text[..i].matches("((").count() > text[..i].matches("))").count())
    }

    proptest::proptest! {
        /// Counting the parentheses once agrees with counting them per `<<`.
        #[test]
        fn parser_trap_agrees_with_the_reference(
            parts in proptest::collection::vec(
                proptest::sample::select(vec![
                    "<<", "<<<", "<<-", "((", "))", "(", ")", "$((", "x", "EOF", " ", "\t", "\n",
                    "\"\"", "''", "\"", "'", "$(", "`", "\\", ";", "|", "&", ">", "é",
                ]),
                0..40,
            )
        ) {
            let text: String = parts.concat();
            proptest::prop_assert_eq!(parser_trap(&text), parser_trap_reference(&text));
        }
    }

    #[test]
    fn prescans_agree_with_their_references_on_the_corpus() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/corpus/agent_sessions.jsonl");
        // The corpus is required, as by the decisions snapshot: a test that skips proves nothing.
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("the shared corpus beside the repository ({path}): {e}"));
        for line in text.lines() {
            assert_eq!(nesting_tokens(line), nesting_tokens_reference(line));
            assert_eq!(parser_trap(line), parser_trap_reference(line));
        }
    }

    #[test]
    fn parser_traps_are_refused_before_parsing() {
        for s in [
            "$(<<\t($(",
            "$(<< ($(",
            "cat <<(x",
            "x=$(cat <<- (\n)",
            "$(<<-\t<(echo rm)",
            "cat <<",
            "cat <<\"\"|$(",
            "cat <<''|$(",
            "<<$(\t(#",
            "cat <<`x`",
            "<<\"&$(''\t",
            "<<\"&\"$(''\t",
            "<<<<<'')#",
        ] {
            let e = extract_str(s, &ctx());
            assert!(e.parse_error.is_some_and(|m| m.contains("delimiter")), "{s:?}");
        }
        for s in ["cat <<< \"(x)\"", "cat <<EOF\n(x)\nEOF", "echo $((1 << 2))"] {
            assert!(extract_str(s, &ctx()).parse_error.is_none(), "{s:?}");
        }
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
        assert!(e.cmds.iter().any(|c| c.features.contains(&Feature::ForkBomb)), "{:?}", e.cmds);
        let e = extract_str("bomb() { bomb | bomb & }; bomb", &ctx());
        assert!(e.cmds.iter().any(|c| c.features.contains(&Feature::ForkBomb)));
        let e = extract_str("f() { echo hi; }; f | f", &ctx());
        assert!(!e.cmds.iter().any(|c| c.features.contains(&Feature::ForkBomb)));
    }
}
