//! Which rules may match which program: the one definition of a policy's program index, for
//! `Policy::build` (a policy file's, at load) and for build.rs (the built-in policy's tables,
//! which includes this file by path: std only, no crate types).
//!
//! Owns the classification of a rule's `program` entries (a literal name, or a pattern or
//! path) and the index built from it; may not compile or match anything.

use std::collections::BTreeMap;

/// Whether a `program` entry is a literal (no glob syntax; a lone `[` is literal too). A
/// literal with a `/` is a path, matched as written, not a name.
pub(crate) fn is_literal(p: &str) -> bool {
    p == "[" || !p.contains(['*', '?', '['])
}

/// A policy's program index, rules numbered in policy order (enabled ones only).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ProgramIndex<'a> {
    /// By literal program name: the rules naming it, the generic ones merged in, in order.
    pub by_program: BTreeMap<&'a str, Vec<u32>>,
    /// Program patterns and paths, with the rule naming each.
    pub by_pattern: Vec<(&'a str, u32)>,
    /// The rules with an alternative for any program: candidates for every command.
    pub generic: Vec<u32>,
}

/// The index of `rules`: for each enabled rule, in order, the `program` lists of its
/// alternatives. None if there are more rules than a `u32` numbers.
pub(crate) fn index<'a>(rules: &[Vec<Vec<&'a str>>]) -> Option<ProgramIndex<'a>> {
    let mut out = ProgramIndex::default();
    for (i, alternatives) in rules.iter().enumerate() {
        let i = u32::try_from(i).ok()?;
        // A rule with an alternative for any program is a candidate for every command;
        // else for the programs it names, literally or by a pattern.
        if alternatives.iter().any(Vec::is_empty) {
            out.generic.push(i);
            continue;
        }
        for p in alternatives.iter().flatten() {
            if is_literal(p) && !p.contains('/') {
                let v = out.by_program.entry(p).or_default();
                if !v.contains(&i) {
                    v.push(i);
                }
            } else {
                out.by_pattern.push((p, i));
            }
        }
    }
    for v in out.by_program.values_mut() {
        v.extend(out.generic.iter().copied());
        v.sort_unstable();
        v.dedup();
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_patterns_and_generic_rules() {
        let rules = vec![
            vec![vec!["rm", "shred"]],
            vec![vec!["mkfs.*", "/etc/init.d/x", "rm"]],
            vec![vec!["dd"], vec![]],
            vec![vec!["["], vec!["rm"]],
        ];
        let Some(ix) = index(&rules) else { panic!("indexed") };
        assert_eq!(ix.generic, [2]);
        let names: Vec<(&str, Vec<u32>)> = ix.by_program.into_iter().collect();
        assert_eq!(names, [("[", vec![2, 3]), ("rm", vec![0, 1, 2, 3]), ("shred", vec![0, 2])]);
        assert_eq!(ix.by_pattern, [("mkfs.*", 1), ("/etc/init.d/x", 1)]);
        assert!(is_literal("[") && is_literal("git") && !is_literal("a[bc]") && !is_literal("x?"));
    }
}
