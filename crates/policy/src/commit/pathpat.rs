//! Path patterns of commit rules: workspace-relative paths matched component by component,
//! with gitignore's `**` (any number of components, none included). `*`, `?` and `[…]` stay
//! within one component. A leading `**/` makes a pattern match at any depth.
//!
//! Besides matching a path, a pattern says whether an object at a path could stand in front of
//! what it protects ([`PathPat::guards`]): a symlink or file named `.git` or `.git/hooks`
//! redirects git to hooks elsewhere, so it is judged like the hooks themselves.

use crate::glob::Glob;

/// One component of a pattern.
#[derive(Debug, Clone)]
enum Comp {
    /// `**`: any number of components, none included.
    AnyDepth,
    /// A literal component.
    Lit(String),
    /// A component with glob syntax.
    Glob(Glob),
}

impl Comp {
    fn matches(&self, c: &str) -> bool {
        match self {
            Comp::AnyDepth => true,
            Comp::Lit(l) => l == c,
            Comp::Glob(g) => g.matches(c),
        }
    }
}

/// A compiled path pattern.
#[derive(Debug, Clone)]
pub(crate) struct PathPat {
    comps: Vec<Comp>,
}

impl PathPat {
    /// The pattern of no components: the rest of a literal path that names a file itself.
    pub const EMPTY: PathPat = PathPat { comps: Vec::new() };

    /// Compile `src`. Empty components (`a//b`, a leading or trailing `/`) are ignored.
    pub fn new(src: &str) -> Result<PathPat, String> {
        let mut comps = Vec::new();
        for part in src.split('/').filter(|p| !p.is_empty() && *p != ".") {
            comps.push(if part == "**" {
                Comp::AnyDepth
            } else if part.contains(['*', '?', '[']) {
                Comp::Glob(Glob::new(part)?)
            } else {
                Comp::Lit(part.to_string())
            });
        }
        if comps.is_empty() {
            return Err(format!("path pattern `{src}` names no path"));
        }
        Ok(PathPat { comps })
    }

    /// A pattern for a path taken literally (a directory a git setting names): glob syntax in
    /// it is not syntax.
    pub fn literal_prefix(path: &str, rest: &PathPat) -> PathPat {
        let mut comps: Vec<Comp> =
            path.split('/').filter(|p| !p.is_empty() && *p != ".").map(|p| Comp::Lit(p.to_string())).collect();
        comps.extend(rest.comps.iter().cloned());
        PathPat { comps }
    }

    /// The literal components every match contains: a path lacking one is no candidate.
    pub fn literals(&self) -> impl Iterator<Item = &str> {
        self.comps.iter().filter_map(|c| match c {
            Comp::Lit(l) => Some(l.as_str()),
            _ => None,
        })
    }

    /// Whether the whole path matches. Every literal component of the pattern matches one
    /// component of the path, so a path lacking one is refused before the walk (most changed
    /// paths of a commit lack `.git`, `.vscode`, … and are refused here).
    pub fn matches(&self, path: &[&str]) -> bool {
        self.literals().all(|l| path.contains(&l)) && match_from(&self.comps, path)
    }

    /// Whether an object at `path` stands where a directory on the way to a match would be:
    /// some path strictly below it would match, with `path`'s last component matched by a
    /// component of the pattern (`.git`, `.git/hooks`, or inside a `**` within the pattern).
    /// A leading `**` never counts, or every path anywhere would be a guard.
    pub fn guards(&self, path: &[&str]) -> bool {
        let Some((last, init)) = path.split_last() else { return false };
        // Try every position of the pattern for the last component: the pattern before it
        // must match the components before it, and something must remain after it.
        for (i, comp) in self.comps.iter().enumerate() {
            // The pattern before `i` matches `init` only if each of its literal components is
            // one of `init`'s, and so does every longer one: a literal missing from `init`
            // ends the search before any glob or walk (most changed paths of a commit lack
            // `.git`, `hooks`, …, and every one of them is asked).
            if let Some(Comp::Lit(l)) = i.checked_sub(1).map(|j| &self.comps[j]) {
                if !init.contains(&l.as_str()) {
                    return false;
                }
            }
            if self.guards_at(i, comp, last, init) {
                return true;
            }
        }
        false
    }

    /// Whether the last component `last` can stand at position `i` (component `comp`) of a
    /// match below it, `init` matching the pattern before it.
    fn guards_at(&self, i: usize, comp: &Comp, last: &str, init: &[&str]) -> bool {
        let any = matches!(comp, Comp::AnyDepth);
        !(i == 0 && any)
            && comp.matches(last)
            && (any || !self.comps[i + 1..].is_empty())
            // `**` matching the last component may also have begun before it.
            && (match_from(&self.comps[..i], init) || (any && match_from(&self.comps[..=i], init)))
    }
}

/// Match pattern components against path components (iterative over `**`, bounded by the
/// product of the lengths: paths and patterns are short). The positions reached in the path
/// after each pattern component are a set of bits: every changed path of every commit meets
/// every commit rule's patterns, so this allocates nothing (a path deeper than [`MAX_BITS`]
/// components takes the same walk over a vector).
fn match_from(pat: &[Comp], path: &[&str]) -> bool {
    if path.len() < MAX_BITS {
        match_bits(pat, path)
    } else {
        match_vec(pat, path)
    }
}

/// Paths of fewer components than this are matched in a `u128` (positions 0..=len).
const MAX_BITS: usize = 127;

fn match_bits(pat: &[Comp], path: &[&str]) -> bool {
    let n = path.len();
    // Bits 0..=n: the positions a match may have reached.
    let all: u128 = (1u128 << (n + 1)) - 1;
    let mut at: u128 = 1;
    for comp in pat {
        let mut next: u128 = 0;
        for i in 0..=n {
            if at & (1u128 << i) == 0 {
                continue;
            }
            match comp {
                Comp::AnyDepth => {
                    next |= all & (!0u128 << i);
                    break;
                }
                c => {
                    if path.get(i).is_some_and(|p| c.matches(p)) {
                        next |= 1u128 << (i + 1);
                    }
                }
            }
        }
        at = next;
        if at == 0 {
            return false;
        }
    }
    at & (1u128 << n) != 0
}

/// [`match_bits`] over a vector: any depth (and the model the bits are tested against).
fn match_vec(pat: &[Comp], path: &[&str]) -> bool {
    let n = path.len();
    let mut at = vec![false; n + 1];
    at[0] = true;
    for comp in pat {
        let mut next = vec![false; n + 1];
        for i in 0..=n {
            if !at[i] {
                continue;
            }
            match comp {
                Comp::AnyDepth => {
                    for slot in next.iter_mut().skip(i) {
                        *slot = true;
                    }
                    break;
                }
                c => {
                    if i < n && c.matches(path[i]) {
                        next[i + 1] = true;
                    }
                }
            }
        }
        at = next;
        if !at.iter().any(|b| *b) {
            return false;
        }
    }
    at[n]
}

/// The components of a workspace-relative path as the patterns see them.
pub(crate) fn components(path: &str) -> Vec<&str> {
    path.split('/').filter(|p| !p.is_empty() && *p != ".").collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, path: &str) -> bool {
        PathPat::new(p).map(|p| p.matches(&components(path))).unwrap_or(false)
    }

    fn g(p: &str, path: &str) -> bool {
        PathPat::new(p).map(|p| p.guards(&components(path))).unwrap_or(false)
    }

    #[test]
    fn components_match_like_gitignore() {
        assert!(m("**/.git/hooks/**/*", ".git/hooks/pre-commit"));
        assert!(m("**/.git/hooks/**/*", "vendor/x/.git/hooks/pre-commit"));
        assert!(m("**/.git/hooks/**/*", ".git/hooks/lib/helper.sh"));
        assert!(!m("**/.git/hooks/**/*", ".git/hooks"));
        assert!(!m("**/.git/hooks/**/*", ".git/hookshot/x"));
        assert!(!m("**/.git/hooks/**/*", "src/hooks/x"));
        assert!(m("**/.envrc", ".envrc") && m("**/.envrc", "a/b/.envrc") && !m("**/.envrc", ".envrc.bak"));
        assert!(m(".vscode/tasks.json", ".vscode/tasks.json") && !m(".vscode/tasks.json", "x/.vscode/tasks.json"));
        assert!(m("**/*.git/config", "repo.git/config") && m("**/*.git/config", ".git/config"));
        assert!(m("*.sample", "pre-commit.sample") && !m("*.sample", ".git/hooks/pre-commit.sample"));
        assert!(m("**/*.sample", ".git/hooks/pre-commit.sample"));
        assert!(m(".claude/settings*.json", ".claude/settings.local.json"));
        assert!(m("**/.git/modules/**/config", ".git/modules/a/b/config"));
        assert!(m("a//b/", "a/b") && m("./a", "a"));
        assert!(PathPat::new("").is_err() && PathPat::new("[").is_err());
    }

    #[test]
    fn guards_are_objects_in_front_of_what_a_pattern_protects() {
        let hooks = "**/.git/hooks/**/*";
        assert!(g(hooks, ".git") && g(hooks, ".git/hooks") && g(hooks, "sub/.git/hooks"));
        assert!(g(hooks, ".git/hooks/lib"));
        // A leading `**` does not make every path a guard, nor does the match itself.
        assert!(!g(hooks, "src") && !g(hooks, "a/b/c") && !g(hooks, "hooks"));
        assert!(!g("**/.envrc", ".envrc") && !g("**/.envrc", "x"));
        assert!(g(".claude/settings*.json", ".claude") && !g(".claude/settings*.json", ".claude/settings.json"));
        assert!(g("**/.git/config", ".git") && !g("**/.git/config", ".gitignore"));
        assert!(g("**/.git/modules/**/config", ".git/modules/x") && g("**/.git/modules/**/config", ".git/modules"));
    }

    proptest::proptest! {
        /// The bit set and the vector walk agree, and so does `matches` with its literal
        /// pre-check, on patterns and paths built from a small alphabet (so that they meet).
        #[test]
        fn bits_agree_with_the_vector_walk(
            pat in proptest::collection::vec(proptest::sample::select(vec!["**", "*", "a", "b", ".git", "*.git", "h?", "[ab]"]), 1..6),
            path in proptest::collection::vec(proptest::sample::select(vec!["a", "b", ".git", "x.git", "hk", "h"]), 0..9),
        ) {
            let p = PathPat::new(&pat.join("/")).unwrap_or_else(|e| panic!("{e}"));
            let model = match_vec(&p.comps, &path);
            proptest::prop_assert_eq!(match_bits(&p.comps, &path), model);
            proptest::prop_assert_eq!(p.matches(&path), model);
        }

        /// `guards` with its literal pre-check says what trying every position says.
        #[test]
        fn guards_agree_with_trying_every_position(
            pat in proptest::collection::vec(proptest::sample::select(vec!["**", "*", "a", "b", ".git", "*.git", "hooks", "h?"]), 1..7),
            path in proptest::collection::vec(proptest::sample::select(vec!["a", "b", ".git", "x.git", "hooks", "h"]), 0..7),
        ) {
            let p = PathPat::new(&pat.join("/")).unwrap_or_else(|e| panic!("{e}"));
            let model = path.split_last().is_some_and(|(last, init)| {
                p.comps.iter().enumerate().any(|(i, comp)| p.guards_at(i, comp, last, init))
            });
            proptest::prop_assert_eq!(p.guards(&path), model);
        }
    }

    #[test]
    fn deep_paths_take_the_vector_walk_and_agree() {
        let p = PathPat::new("**/.git/hooks/**/*").unwrap_or_else(|e| panic!("{e}"));
        for depth in [100, MAX_BITS - 4, MAX_BITS - 3, MAX_BITS, 300] {
            let mut path = vec!["d"; depth];
            path.extend([".git", "hooks", "pre-commit"]);
            assert!(p.matches(&path), "depth {depth}");
            path.pop();
            assert!(!p.matches(&path), "depth {depth}");
        }
    }

    #[test]
    fn literal_prefixes_are_not_globs() {
        let rest = PathPat::new("**/*").unwrap_or_else(|e| panic!("{e}"));
        let p = PathPat::literal_prefix("hooks[1]/*", &rest);
        assert!(p.matches(&components("hooks[1]/*/pre-commit")));
        assert!(!p.matches(&components("hooks1/a/pre-commit")));
    }
}
