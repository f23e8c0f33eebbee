//! JSON with comments and trailing commas (what VS Code, Claude Code and dev containers read)
//! flattened to leaves, so that a commit is judged by the keys it changes.
//!
//! A leaf is a scalar, an empty object or an empty array, named by the path of keys and array
//! indexes leading to it, joined with `.` (`hooks.PreToolUse.0.hooks.0.command`); keys are
//! decoded (`\u0068ooks` is `hooks`), so escapes cannot hide a key. Values are kept in a
//! canonical form to compare old and new. Hostile input is bounded: nesting deeper than
//! [`MAX_DEPTH`] is an error, as is anything that is not JSON(C); the caller holds the change.

/// Deeper nesting than this is refused (no recursion on the stack: an explicit stack).
pub(crate) const MAX_DEPTH: usize = 64;

/// Parse `text` into (path, canonical value) leaves, in document order.
pub(crate) fn leaves(text: &[u8]) -> Result<Vec<(String, String)>, String> {
    let text = text.strip_prefix(b"\xef\xbb\xbf").unwrap_or(text);
    let s = std::str::from_utf8(text).map_err(|_| "not UTF-8".to_string())?;
    let mut p = Lexer { s: s.as_bytes(), i: 0 };
    let mut out = Vec::new();
    // Each open container: its path, whether it is an array, the next index, and whether it
    // has had a member yet.
    struct Open {
        path: String,
        array: bool,
        next: usize,
        members: usize,
    }
    let mut stack: Vec<Open> = Vec::new();
    let join = |base: &str, seg: &str| if base.is_empty() { seg.to_string() } else { format!("{base}.{seg}") };
    // The path of the value about to be read.
    let mut here = String::new();
    loop {
        p.blank()?;
        // A value.
        match p.peek() {
            Some(b'{') | Some(b'[') => {
                if stack.len() >= MAX_DEPTH {
                    return Err("nested too deeply".into());
                }
                let array = p.bump() == Some(b'[');
                stack.push(Open { path: here.clone(), array, next: 0, members: 0 });
                // An empty container, or its first member.
                p.blank()?;
                let close = if array { b']' } else { b'}' };
                if p.peek() == Some(close) {
                    p.bump();
                    let Some(o) = stack.pop() else { return Err("internal".into()) };
                    out.push((o.path, if array { "[]".into() } else { "{}".into() }));
                } else {
                    here = member(&mut p, stack.last_mut(), &join)?;
                    continue;
                }
            }
            Some(_) => {
                let v = p.scalar()?;
                out.push((here.clone(), v));
            }
            None => return Err("unexpected end".into()),
        }
        // After a value: `,` and the next member, or the end of containers.
        loop {
            let Some(top) = stack.last_mut() else {
                p.blank()?;
                return if p.peek().is_none() { Ok(out) } else { Err("text after the value".into()) };
            };
            top.members += 1;
            p.blank()?;
            let close = if top.array { b']' } else { b'}' };
            match p.bump() {
                Some(b',') => {
                    p.blank()?;
                    // A trailing comma.
                    if p.peek() == Some(close) {
                        p.bump();
                        stack.pop();
                        continue;
                    }
                    here = member(&mut p, stack.last_mut(), &join)?;
                    break;
                }
                Some(c) if c == close => {
                    stack.pop();
                }
                _ => return Err(format!("expected `,` or `{}` at byte {}", char::from(close), p.i)),
            }
        }
    }

    /// The path of the next member of `top`: its index, or its key (read with its colon).
    fn member(
        p: &mut Lexer<'_>,
        top: Option<&mut Open>,
        join: &dyn Fn(&str, &str) -> String,
    ) -> Result<String, String> {
        let Some(top) = top else { return Err("internal".into()) };
        if top.array {
            let i = top.next;
            top.next += 1;
            return Ok(join(&top.path, &i.to_string()));
        }
        if p.peek() != Some(b'"') {
            return Err(format!("expected a key at byte {}", p.i));
        }
        let key = p.string()?;
        p.blank()?;
        if p.bump() != Some(b':') {
            return Err(format!("expected `:` at byte {}", p.i));
        }
        Ok(join(&top.path, &key))
    }
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    /// Whitespace and comments.
    fn blank(&mut self) -> Result<(), String> {
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\n' | b'\r') => self.i += 1,
                Some(b'/') if self.s.get(self.i + 1) == Some(&b'/') => {
                    while !matches!(self.peek(), None | Some(b'\n')) {
                        self.i += 1;
                    }
                }
                Some(b'/') if self.s.get(self.i + 1) == Some(&b'*') => {
                    let rest = &self.s[self.i + 2..];
                    let end = rest.windows(2).position(|w| w == b"*/").ok_or("unterminated comment")?;
                    self.i += 2 + end + 2;
                }
                _ => return Ok(()),
            }
        }
    }

    /// A string, a number, `true`, `false` or `null`, in canonical form.
    fn scalar(&mut self) -> Result<String, String> {
        match self.peek() {
            Some(b'"') => Ok(format!("{:?}", self.string()?)),
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                while self.peek().is_some_and(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E')) {
                    self.i += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).map_err(|_| "bad number")?;
                t.parse::<f64>().map_err(|_| format!("bad number `{t}`"))?;
                Ok(t.to_string())
            }
            _ => {
                for word in ["true", "false", "null"] {
                    if self.s[self.i..].starts_with(word.as_bytes()) {
                        self.i += word.len();
                        return Ok(word.to_string());
                    }
                }
                Err(format!("unexpected input at byte {}", self.i))
            }
        }
    }

    /// A string literal, decoded.
    fn string(&mut self) -> Result<String, String> {
        self.bump();
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.peek().is_some_and(|c| c != b'"' && c != b'\\' && c >= 0x20) {
                self.i += 1;
            }
            out.push_str(std::str::from_utf8(&self.s[start..self.i]).map_err(|_| "bad string")?);
            match self.bump() {
                Some(b'"') => return Ok(out),
                Some(b'\\') => {
                    let c = match self.bump() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => self.unicode()?,
                        _ => return Err(format!("bad escape at byte {}", self.i)),
                    };
                    out.push(c);
                }
                _ => return Err("unterminated string".into()),
            }
        }
    }

    /// After `\u`: one code point (a surrogate pair when it takes two escapes).
    fn unicode(&mut self) -> Result<char, String> {
        let hex4 = |l: &mut Self| -> Result<u32, String> {
            let h = l.s.get(l.i..l.i + 4).ok_or("short \\u escape")?;
            l.i += 4;
            u32::from_str_radix(std::str::from_utf8(h).map_err(|_| "bad \\u escape")?, 16)
                .map_err(|_| "bad \\u escape".to_string())
        };
        let hi = hex4(self)?;
        if (0xd800..0xdc00).contains(&hi) {
            if self.bump() != Some(b'\\') || self.bump() != Some(b'u') {
                return Err("lone surrogate".into());
            }
            let lo = hex4(self)?;
            if !(0xdc00..0xe000).contains(&lo) {
                return Err("lone surrogate".into());
            }
            return char::from_u32(0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)).ok_or("bad surrogate".into());
        }
        char::from_u32(hi).ok_or_else(|| "lone surrogate".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(text: &str) -> Vec<(String, String)> {
        leaves(text.as_bytes()).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    #[test]
    fn leaves_are_named_by_their_path() {
        let got = l(
            r#"{"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [{"type": "command", "command": "x"}]}]}, "n": 1.5e3, "e": {}, "a": []}"#,
        );
        let names: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "hooks.PreToolUse.0.matcher",
                "hooks.PreToolUse.0.hooks.0.type",
                "hooks.PreToolUse.0.hooks.0.command",
                "n",
                "e",
                "a"
            ]
        );
        assert_eq!(got[2].1, "\"x\"");
        assert_eq!(l("3"), [(String::new(), "3".to_string())]);
    }

    #[test]
    fn comments_trailing_commas_and_escapes() {
        let got = l("// c\n{\n /* c */ \"\\u0068ooks\": [1, 2,], // c\n \"k\\\"\": \"\\ud83d\\ude00\",\n}");
        assert_eq!(got[0].0, "hooks.0");
        assert_eq!(got[1].0, "hooks.1");
        assert_eq!(got[2], ("k\"".to_string(), format!("{:?}", "\u{1f600}")));
    }

    #[test]
    fn what_is_not_jsonc_is_an_error() {
        for bad in [
            "",
            "{",
            "{\"a\" 1}",
            "{\"a\": }",
            "[1 2]",
            "{a: 1}",
            "\"\\q\"",
            "\"\\ud800\"",
            "/* open",
            "{} x",
            "tru",
            "\"a\nb\"",
            "{\"a\":1,,}",
            "01x",
        ] {
            assert!(leaves(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(leaves(deep.as_bytes()).is_err());
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(leaves(ok.as_bytes()).is_ok());
    }
}
