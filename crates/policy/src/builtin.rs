//! The built-in policy as build.rs compiled it from `builtin.toml` (less its inline examples),
//! read on first use (#18): a process that judges one command compiles the ten or so rules
//! its programs meet, not all of them.
//!
//! - `RULES`: the enabled rules in policy order, `(id, the rule as JSON)`;
//! - `BY_PROGRAM`: rule indexes by literal program name, sorted by name, the generic rules
//!   merged in, each list in policy order; `GENERIC`: the rules that may match any program;
//!   `BY_PATTERN`: `(program pattern or path, rule index)`;
//! - `COMMIT`: the commit rules as one JSON array.
//!
//! Owns reading these tables; may not decide anything (`Policy::decide` does). A rule that
//! fails to load here (which `builtin_tables_are_the_policy` makes unreachable in a tested
//! build) fails closed: it denies what it was a candidate for, and commit rules that fail to
//! load hold every commit for review.

use crate::commit::{CommitRule, CommitRuleSpec, CommitRules};
use crate::rules::{Matcher, Pat, Rule, RuleSpec};
use crate::{placed, Action};

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));

/// Rule `id` compiled from its JSON; a rule that would deny every command it is a candidate
/// for if the JSON does not compile.
pub(crate) fn compile_rule(id: &str, json: &str) -> Rule {
    let spec = placed::unplaced(|| serde_json::from_str::<RuleSpec>(json)).map_err(|e| e.to_string());
    match spec.and_then(|s| Rule::compile(&s)) {
        Ok(rule) => rule,
        Err(e) => Rule {
            id: id.to_string(),
            action: Action::Deny,
            reason: format!("the built-in rule `{id}` did not load ({e}); txbox refuses rather than judge without it"),
            when: vec![Matcher::default()],
        },
    }
}

/// The rules that may match `program` (a basename), in policy order.
pub(crate) fn candidates(program: &str) -> &'static [u32] {
    match BY_PROGRAM.binary_search_by(|(name, _)| (*name).cmp(program)) {
        Ok(i) => BY_PROGRAM.get(i).map_or(GENERIC, |(_, v)| *v),
        Err(_) => GENERIC,
    }
}

/// The rules whose program is a pattern or a path, with that pattern compiled. A pattern that
/// does not compile makes its rule a candidate for every command.
pub(crate) fn patterns() -> Vec<(Pat, u32)> {
    BY_PATTERN.iter().filter_map(|(p, i)| Some((Pat::new(p).or_else(|_| Pat::new("*")).ok()?, *i))).collect()
}

/// The commit rules; if they do not load, one rule that holds every commit for review.
pub(crate) fn commit_rules() -> CommitRules {
    commit_rules_from(COMMIT)
}

fn commit_rules_from(json: &str) -> CommitRules {
    let specs = placed::unplaced(|| serde_json::from_str::<Vec<CommitRuleSpec>>(json)).map_err(|e| e.to_string());
    let compiled = specs.and_then(|specs| {
        specs.iter().filter(|s| s.enabled != Some(false)).map(CommitRule::compile).collect::<Result<Vec<_>, _>>()
    });
    match compiled {
        Ok(rules) => CommitRules::new(rules),
        Err(e) => {
            let spec = serde_json::json!({
                "id": "engine.builtin-commit-rules",
                "action": "hold",
                "reason": format!("the built-in commit rules did not load ({e}); every commit is held for review"),
                "when": [{ "paths": ["**"] }],
            });
            let rule = placed::unplaced(|| serde_json::from_value::<CommitRuleSpec>(spec))
                .map_err(|e| e.to_string())
                .and_then(|s| CommitRule::compile(&s));
            CommitRules::new(rule.into_iter().collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit::CommitAction;

    #[test]
    fn a_rule_that_does_not_load_denies_what_it_meets() {
        for json in ["{", r#"{"id": "x", "action": "deny"}"#, r#"{"id": "x", "action": "maybe", "when": [{}]}"#] {
            let r = compile_rule("x", json);
            assert_eq!(r.action, Action::Deny, "{json}");
            assert!(r.reason.contains("did not load"), "{}", r.reason);
            assert!(crate::rule_matches_str(&r, "ls -la", &crate::example_context()), "{json}");
        }
    }

    #[test]
    fn commit_rules_that_do_not_load_hold_every_commit() {
        for json in [
            "[",
            r#"[{"id": "x", "action": "hold"}]"#,
            r#"[{"id": "x", "action": "keep", "when": [{"paths": ["a"]}]}]"#,
        ] {
            let c = commit_rules_from(json);
            let ids: Vec<(&str, CommitAction)> = c.rules().iter().map(|r| (r.id.as_str(), r.action)).collect();
            assert_eq!(ids, [("engine.builtin-commit-rules", CommitAction::Hold)], "{json}");
        }
    }

    #[test]
    fn candidates_of_an_unknown_program_are_the_generic_rules() {
        assert_eq!(candidates("no-such-program-anywhere"), GENERIC);
        assert_eq!(candidates(""), GENERIC);
        assert!(BY_PROGRAM.windows(2).all(|w| matches!(w, [a, b] if a.0 < b.0)), "BY_PROGRAM is not sorted");
    }
}
