//! Shell-style globs of the rule language (`*`, `?`, `[abc]`, `[a-z]`, `[!…]`), matched
//! directly. Compiling each glob to a regex on first use cost ~0.3 ms per process (the regex
//! builder, its thread pool sizing), more than evaluating a whole command.
//!
//! Semantics are those of the regex the engine used to build (`^` + translation + `$`): `*`
//! is any run of characters but a newline, `?` one character but a newline, a class one
//! character of its set (a negated class also matches a newline); everything else is literal.

/// One piece of a glob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Char(char),
    /// `?`
    One,
    /// `*`
    Star,
    /// `[…]`: ranges (a single character is a range of one), negated with `!` or `^`.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Tok {
    fn matches(&self, c: char) -> bool {
        match self {
            Tok::Char(x) => *x == c,
            Tok::One | Tok::Star => c != '\n',
            Tok::Class { negated, ranges } => ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    toks: Vec<Tok>,
    /// The literal characters the glob starts with (`mkfs.` of `mkfs.*`): a string that does
    /// not start with them cannot match, which settles most tests without the automaton.
    prefix: String,
}

impl Glob {
    /// Parse a glob; an unclosed or empty class, or a range whose ends are reversed, is an error.
    pub fn new(glob: &str) -> Result<Glob, String> {
        let mut toks = Vec::new();
        let mut chars = glob.chars().peekable();
        while let Some(c) = chars.next() {
            toks.push(match c {
                '*' => Tok::Star,
                '?' => Tok::One,
                '[' => {
                    let negated = chars.next_if(|d| *d == '!' || *d == '^').is_some();
                    let mut members = Vec::new();
                    let mut closed = false;
                    for d in chars.by_ref() {
                        if d == ']' {
                            closed = true;
                            break;
                        }
                        members.push(d);
                    }
                    if !closed {
                        return Err(format!("unclosed `[` in glob `{glob}`"));
                    }
                    Tok::Class { negated, ranges: ranges(&members, glob)? }
                }
                other => Tok::Char(other),
            });
        }
        let prefix = toks
            .iter()
            .map_while(|t| match t {
                Tok::Char(c) => Some(*c),
                _ => None,
            })
            .collect();
        Ok(Glob { toks, prefix })
    }

    /// Whether the whole of `s` matches: a set of glob positions reached so far, advanced one
    /// character at a time (a bitmask; no allocation on the path every command takes).
    pub fn matches(&self, s: &str) -> bool {
        if !s.starts_with(&self.prefix) {
            return false;
        }
        let n = self.toks.len();
        if n >= 64 {
            return self.matches_long(s);
        }
        let mut at: u64 = self.closure(1);
        for c in s.chars() {
            let mut next: u64 = 0;
            let mut live = at;
            while live != 0 {
                let i = live.trailing_zeros() as usize;
                live &= live - 1;
                if i < n && self.toks[i].matches(c) {
                    // A star stays where it is; anything else moves past itself.
                    next |= if self.toks[i] == Tok::Star { 1 << i } else { 1 << (i + 1) };
                }
            }
            at = self.closure(next);
            if at == 0 {
                return false;
            }
        }
        at & (1 << n) != 0
    }

    /// Positions reachable from `set` without reading a character (a star may match nothing).
    fn closure(&self, mut set: u64) -> u64 {
        for (i, t) in self.toks.iter().enumerate() {
            if set & (1 << i) != 0 && *t == Tok::Star {
                set |= 1 << (i + 1);
            }
        }
        set
    }

    /// The same for globs of 64 tokens or more: a table over the whole string.
    fn matches_long(&self, s: &str) -> bool {
        let chars: Vec<char> = s.chars().collect();
        // can[j]: the tokens so far match the first j characters.
        let mut can = vec![false; chars.len() + 1];
        can[0] = true;
        for t in &self.toks {
            let mut next = vec![false; chars.len() + 1];
            for j in 0..=chars.len() {
                next[j] = match t {
                    Tok::Star => can[j] || (j > 0 && next[j - 1] && t.matches(chars[j - 1])),
                    _ => j > 0 && can[j - 1] && t.matches(chars[j - 1]),
                };
            }
            can = next;
        }
        can[chars.len()]
    }
}

/// The members of a class: `a-z` is a range, `-` first or last is itself.
fn ranges(members: &[char], glob: &str) -> Result<Vec<(char, char)>, String> {
    if members.is_empty() {
        return Err(format!("empty `[]` in glob `{glob}`"));
    }
    // Regex set operators: globs have none, and the regexes globs used to become read these as
    // intersection, difference and symmetric difference; refused rather than guessed.
    if let Some(w) = members.windows(2).find(|w| w[0] == w[1] && matches!(w[0], '&' | '-' | '~')) {
        return Err(format!("`{}{}` inside `[]` in glob `{glob}`: not a glob class; list the characters", w[0], w[1]));
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < members.len() {
        let lo = members[i];
        if i + 2 < members.len() && members[i + 1] == '-' {
            let hi = members[i + 2];
            if hi < lo {
                return Err(format!("range `{lo}-{hi}` is reversed in glob `{glob}`"));
            }
            out.push((lo, hi));
            i += 3;
        } else {
            out.push((lo, lo));
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The regex the engine used to build from a glob: the reference these globs must agree with.
    fn as_regex(glob: &str) -> regex::Regex {
        let mut re = String::from("^");
        let mut chars = glob.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '*' => re.push_str(".*"),
                '?' => re.push('.'),
                '[' => {
                    re.push('[');
                    if chars.next_if(|d| *d == '!' || *d == '^').is_some() {
                        re.push('^');
                    }
                    for d in chars.by_ref() {
                        if d == ']' {
                            break;
                        }
                        if d == '\\' || d == '[' {
                            re.push('\\');
                        }
                        re.push(d);
                    }
                    re.push(']');
                }
                other => re.push_str(&regex::escape(&other.to_string())),
            }
        }
        re.push('$');
        regex::Regex::new(&re).unwrap()
    }

    #[test]
    fn globs_of_the_builtin_policy_kinds() {
        let g = |p: &str| Glob::new(p).unwrap();
        assert!(g("mkfs*").matches("mkfs.ext4") && g("mkfs*").matches("mkfs") && !g("mkfs*").matches("xmkfs"));
        assert!(g("--delete*").matches("--delete-after") && !g("--delete*").matches("-delete"));
        assert!(
            g("python?").matches("python3") && !g("python?").matches("python") && !g("python?").matches("python3.11")
        );
        assert!(g("python[23]*").matches("python3.11") && !g("python[23]*").matches("python4"));
        assert!(g("[!-]*").matches("file") && !g("[!-]*").matches("-f"));
        assert!(g("*{*").matches("a{b}") && !g("*{*").matches("ab"));
        assert!(g("/etc/*").matches("/etc/passwd") && !g("/etc/*").matches("/etc"));
        assert!(!g("*").matches("two\nlines") && g("*\n*").matches("two\nlines"));
        assert!(g("[a-c-]").matches("-") && g("[a-c-]").matches("b") && !g("[a-c-]").matches("d"));
        assert!(Glob::new("[abc").is_err() && Glob::new("[z-a]").is_err() && Glob::new("[]").is_err());
        for set_op in ["[a&&b]", "[a--b]", "[--a]", "[a~~b]"] {
            assert!(Glob::new(set_op).is_err(), "{set_op} would have been a regex set operation");
        }
    }

    fn glob_piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("*".to_string()),
            Just("?".to_string()),
            "[a-e0-3.-]".prop_map(|c| c.to_string()),
            "\\[!?[a-d]{1,3}\\]",
            "\\[!?[a-c]-[d-f]\\]",
        ]
    }

    #[test]
    fn long_globs_match_like_short_ones() {
        let long = format!("{}x*", "?*".repeat(40));
        let g = Glob::new(&long).unwrap();
        assert!(g.toks.len() >= 64);
        let s = format!("{}x", "ab".repeat(30));
        assert_eq!(g.matches(&s), as_regex(&long).is_match(&s));
        assert!(!g.matches("short"));
    }

    proptest! {
        #[test]
        fn globs_agree_with_the_regex_they_replace(
            pieces in prop::collection::vec(glob_piece(), 0..6),
            s in "[a-f0-3.\\-\n]{0,10}",
        ) {
            let glob: String = pieces.concat();
            let g = Glob::new(&glob).unwrap();
            prop_assert_eq!(g.matches(&s), as_regex(&glob).is_match(&s), "glob {:?} on {:?}", glob, s);
            prop_assert_eq!(g.matches(&s), g.matches_long(&s), "glob {:?} on {:?}", glob, s);
            // The prefix test only rejects what the automaton rejects.
            let literal = format!("{}{glob}", s.chars().take(2).collect::<String>());
            if let Ok(g) = Glob::new(&literal) {
                prop_assert_eq!(g.matches(&s), as_regex(&literal).is_match(&s), "glob {:?} on {:?}", literal, s);
            }
        }
    }
}
