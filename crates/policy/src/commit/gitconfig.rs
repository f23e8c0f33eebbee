//! A git configuration file (`.git/config` and the files it includes) as the list of its
//! settings, so that a commit is judged by the keys it changes, not by the file as a whole.
//!
//! The syntax is git's own (`config.c`): `[section]`, `[section "subsection"]` (quoted, with
//! `\"` and `\\`), the legacy `[section.subsection]` (lowercased); `name = value` or `name`
//! alone (true); values with `"…"` quoting, the escapes `\n \t \b \\ \"`, a backslash before
//! the newline continuing the line, `#` and `;` comments outside quotes; whitespace trimmed;
//! a UTF-8 byte-order mark at the start; a setting on the same line as its section header.
//! Section and variable names are case-insensitive (lowercased here), subsections are not.
//!
//! The input is hostile: anything git would reject, or that this parser does not understand
//! exactly as git does, is an error, and the caller fails closed (holds the change).

/// One setting: the canonical key (`section.name` or `section.subsection.name`, section and
/// name lowercased) and its value (`None` for a bare `name`, which git reads as true).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Setting {
    pub key: String,
    pub value: Option<String>,
}

/// Parse a whole file. Errors say where (line) and what.
pub(crate) fn parse(text: &[u8]) -> Result<Vec<Setting>, String> {
    let text = text.strip_prefix(b"\xef\xbb\xbf").unwrap_or(text);
    if text.contains(&0) {
        return Err("a NUL byte".into());
    }
    let text = std::str::from_utf8(text).map_err(|_| "not UTF-8".to_string())?;
    let mut p = Parser { s: text.as_bytes(), i: 0, line: 1, section: None, out: Vec::new() };
    p.file()?;
    Ok(p.out)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    line: usize,
    /// The current `section` or `section.subsection` prefix.
    section: Option<String>,
    out: Vec<Setting>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        if c == b'\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn err(&self, what: &str) -> String {
        format!("line {}: {what}", self.line)
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r' | 0x0b | 0x0c)) {
            self.bump();
        }
    }

    fn skip_comment(&mut self) {
        if matches!(self.peek(), Some(b'#' | b';')) {
            while !matches!(self.peek(), None | Some(b'\n')) {
                self.bump();
            }
        }
    }

    fn file(&mut self) -> Result<(), String> {
        loop {
            self.skip_blanks();
            match self.peek() {
                None => return Ok(()),
                Some(b'\n') => {
                    self.bump();
                }
                Some(b'#' | b';') => self.skip_comment(),
                Some(b'[') => {
                    self.bump();
                    self.section = Some(self.header()?);
                    // git reads a setting on the rest of the header's line.
                }
                Some(c) if c.is_ascii_alphabetic() => self.setting()?,
                Some(_) => return Err(self.err("not a section, setting or comment")),
            }
        }
    }

    /// After `[`: the section's canonical prefix.
    fn header(&mut self) -> Result<String, String> {
        let mut name = String::new();
        loop {
            match self.bump() {
                Some(b']') => {
                    if name.is_empty() {
                        return Err(self.err("empty section name"));
                    }
                    // Legacy `[section.Sub]`: the subsection is lowercased too.
                    return Ok(name.to_ascii_lowercase());
                }
                Some(c) if c.is_ascii_alphanumeric() || c == b'-' || c == b'.' => name.push(char::from(c)),
                Some(b' ' | b'\t') if !name.is_empty() => break,
                _ => return Err(self.err("bad section header")),
            }
        }
        // `[section "subsection"]`
        self.skip_blanks();
        if self.bump() != Some(b'"') || name.contains('.') {
            return Err(self.err("bad section header"));
        }
        let mut sub = Vec::new();
        loop {
            match self.bump() {
                None | Some(b'\n') => return Err(self.err("unterminated subsection")),
                Some(b'"') => break,
                Some(b'\\') => match self.bump() {
                    None | Some(b'\n') => return Err(self.err("unterminated subsection")),
                    Some(c) => sub.push(c),
                },
                Some(c) => sub.push(c),
            }
        }
        if self.bump() != Some(b']') {
            return Err(self.err("bad section header"));
        }
        let sub = String::from_utf8(sub).map_err(|_| self.err("not UTF-8"))?;
        Ok(format!("{}.{sub}", name.to_ascii_lowercase()))
    }

    fn setting(&mut self) -> Result<(), String> {
        let Some(section) = self.section.clone() else {
            return Err(self.err("a setting before any section"));
        };
        let mut name = String::new();
        while let Some(c) = self.peek().filter(|c| c.is_ascii_alphanumeric() || *c == b'-') {
            name.push(char::from(c.to_ascii_lowercase()));
            self.bump();
        }
        self.skip_blanks();
        let value = match self.peek() {
            None | Some(b'\n') => None,
            Some(b'#' | b';') => {
                self.skip_comment();
                None
            }
            Some(b'=') => {
                self.bump();
                Some(self.value()?)
            }
            Some(_) => return Err(self.err("bad setting")),
        };
        self.out.push(Setting { key: format!("{section}.{name}"), value });
        Ok(())
    }

    /// After `=`: the value up to the end of its (possibly continued) line.
    fn value(&mut self) -> Result<String, String> {
        let mut out = Vec::new();
        // Bytes of trailing whitespace outside quotes, dropped if nothing follows them.
        let mut pending_space = 0usize;
        let mut quoted = false;
        self.skip_blanks();
        while let Some(c) = self.bump() {
            match c {
                b'\n' => {
                    if quoted {
                        return Err(self.err("unterminated quote"));
                    }
                    break;
                }
                b'#' | b';' if !quoted => {
                    self.i -= 1;
                    self.skip_comment();
                    break;
                }
                b'"' => {
                    quoted = !quoted;
                    pending_space = 0;
                }
                b'\\' => {
                    let e = self.bump().ok_or_else(|| self.err("a backslash at the end"))?;
                    match e {
                        b'\n' => {}
                        b'\r' if self.peek() == Some(b'\n') => {
                            self.bump();
                        }
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'b' => out.push(0x08),
                        b'\\' => out.push(b'\\'),
                        b'"' => out.push(b'"'),
                        _ => return Err(self.err("bad escape")),
                    }
                    pending_space = 0;
                }
                b' ' | b'\t' | b'\r' | 0x0b | 0x0c if !quoted => {
                    out.push(c);
                    pending_space += 1;
                }
                _ => {
                    out.push(c);
                    pending_space = 0;
                }
            }
        }
        if quoted {
            return Err(self.err("unterminated quote"));
        }
        out.truncate(out.len() - pending_space);
        String::from_utf8(out).map_err(|_| self.err("not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(text: &str) -> Vec<(String, Option<String>)> {
        match parse(text.as_bytes()) {
            Ok(v) => v.into_iter().map(|s| (s.key, s.value)).collect(),
            Err(e) => panic!("{e}: {text:?}"),
        }
    }

    fn one(text: &str) -> (String, Option<String>) {
        let v = kv(text);
        assert_eq!(v.len(), 1, "{v:?}");
        v.into_iter().next().unwrap_or_default()
    }

    #[test]
    fn sections_subsections_and_names() {
        assert_eq!(one("[Core]\n\tFSMonitor = x\n").0, "core.fsmonitor");
        assert_eq!(one("[diff \"Tool\"]\ntextconv = a").0, "diff.Tool.textconv");
        assert_eq!(one("[diff.Tool]\ntextconv = a").0, "diff.tool.textconv");
        assert_eq!(one("[includeIf \"gitdir:~/w/\"]\npath = x").0, "includeif.gitdir:~/w/.path");
        assert_eq!(one("[sub \"a\\\"b\\\\c\\d\"]\nk").0, "sub.a\"b\\cd.k");
        assert_eq!(one("[core] editor = vim").0, "core.editor");
        assert_eq!(one("\u{feff}[core]\nbare").1, None);
    }

    #[test]
    fn values_are_read_as_git_reads_them() {
        assert_eq!(one("[a]\nk =   spaced value   \n").1.as_deref(), Some("spaced value"));
        assert_eq!(one("[a]\nk = \"  quoted  \" # c\n").1.as_deref(), Some("  quoted  "));
        assert_eq!(one("[a]\nk = a\\\nb\n").1.as_deref(), Some("ab"));
        assert_eq!(one("[a]\nk = x;y").1.as_deref(), Some("x"));
        assert_eq!(one("[a]\nk = \"x;y\"").1.as_deref(), Some("x;y"));
        assert_eq!(one("[a]\nk = a\\tb\\n").1.as_deref(), Some("a\tb\n"));
        assert_eq!(one("[a]\nk = !sh -c \"echo hi\"").1.as_deref(), Some("!sh -c echo hi"));
        assert_eq!(one("[a]\nk =\n").1.as_deref(), Some(""));
        assert_eq!(kv("# c\n; c\n[a]\n\n  k=1\n  j=2 ; c\n").len(), 2);
    }

    #[test]
    fn what_git_rejects_is_an_error() {
        for bad in [
            "k = v\n",
            "[a\nk=v",
            "[]\n",
            "[a \"b]\n",
            "[a.b \"c\"]\n",
            "[a]\nk = \"open\n",
            "[a]\nk = \\q\n",
            "[a]\n1k = v\n",
            "[a]\nk v\n",
            "[a]\nk = v\\",
            "[a]\0k=v",
            "[a]\n=v\n",
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(parse(b"[a]\nk = \xff").is_err());
    }
}
