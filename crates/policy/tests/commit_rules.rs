//! The commit-time rule language through the public API: user files merged over the built-in
//! commit rules, weakening only when said, examples checked at load, `show` and `lint`, and
//! the judge on hostile file content.

use std::path::Path;

use proptest::prelude::*;
use txbox_policy::{ChangeKind, CommitAction, CommitChange, CommitFiles, FileContent, ObjectKind, Policy};

fn err(text: &str) -> String {
    match Policy::from_toml_str(text, "p.toml") {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

fn load(text: &str) -> Policy {
    Policy::from_toml_str(text, "p.toml").unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// One changed file, read from memory.
struct One {
    path: &'static str,
    old: FileContent,
    new: FileContent,
}

impl CommitFiles for One {
    fn workspace(&self) -> &Path {
        Path::new("/w")
    }
    fn kind_after(&self, _: &str) -> ObjectKind {
        ObjectKind::File
    }
    fn before(&self, p: &str) -> FileContent {
        if p == self.path {
            self.old.clone()
        } else {
            FileContent::Absent
        }
    }
    fn after(&self, p: &str) -> FileContent {
        if p == self.path {
            self.new.clone()
        } else {
            FileContent::Absent
        }
    }
}

fn judge(p: &Policy, path: &'static str, new: &[u8]) -> Vec<(String, CommitAction)> {
    let files = One { path, old: FileContent::Absent, new: FileContent::Regular(new.to_vec()) };
    let changes = [CommitChange { path: path.to_string(), change: ChangeKind::Added }];
    p.judge_commit(&changes, &files).into_iter().map(|f| (f.rule, f.action)).collect()
}

#[test]
fn weakening_a_builtin_commit_rule_must_be_explicit() {
    for (body, how) in [
        ("enabled = false", "disables it"),
        ("action = \"allow\"", "lowers its action from hold to allow"),
        ("[[commit.when]]\npaths = [\"nothing/here\"]", "replaces what it matches"),
    ] {
        let silent = format!("version = 1\n[[commit]]\nid = \"commit.git-hooks\"\n{body}\n");
        let e = err(&silent);
        assert!(e.contains("commit.git-hooks") && e.contains(how) && e.contains("override = \"weaken\""), "{e}");
        let explicit =
            silent.replace("id = \"commit.git-hooks\"\n", "id = \"commit.git-hooks\"\noverride = \"weaken\"\n");
        let p = load(&explicit);
        assert_eq!(p.weakened().len(), 1);
        assert!(p.weakened()[0].how.contains(how));
        assert!(judge(&p, ".git/hooks/pre-commit", b"x").is_empty(), "{explicit}");
        let shown = p.to_toml();
        assert!(shown.starts_with("# WEAKENED built-in rule `commit.git-hooks`"), "{shown}");
        assert_eq!(load(&shown).to_toml(), shown);
    }
    // Strengthening needs no override; the built-in policy restated weakens nothing.
    let p = load("version = 1\n[[commit]]\nid = \"commit.git-hooks\"\naction = \"deny\"\n");
    assert!(p.weakened().is_empty());
    assert_eq!(judge(&p, ".git/hooks/pre-commit", b"x"), [("commit.git-hooks".to_string(), CommitAction::Deny)]);
    let shown = Policy::builtin().to_toml();
    assert!(shown.contains("[[commit]]") && shown.contains("commit.git-config"), "show lists commit rules");
    assert!(load(&shown).weakened().is_empty());
}

#[test]
fn user_commit_rules_are_checked_at_load() {
    let rule = |examples: &str| {
        format!(
            "version = 1\n[[commit]]\nid = \"team.makefile\"\naction = \"hold\"\nreason = \"{{path}} changed\"\n\
             {examples}\n[[commit.when]]\npaths = [\"**/Makefile\"]\n"
        )
    };
    let p = load(&rule("examples.match = [\"Makefile\", \"sub/Makefile\"]\nexamples.no_match = [\"Makefile.am\"]"));
    assert_eq!(judge(&p, "Makefile", b"all:"), [("team.makefile".to_string(), CommitAction::Hold)]);
    assert!(p.commit_rule_ids().contains(&"team.makefile".to_string()));
    let e = err(&rule("examples.match = [\"GNUmakefile\"]"));
    assert!(e.contains("team.makefile") && e.contains("should match but does not"), "{e}");
    let e = err(&rule("examples.no_match = [\"a/Makefile\"]"));
    assert!(e.contains("should not match but does"), "{e}");
    let e = err(
        "version = 1\n[[commit]]\nid = \"x\"\naction = \"keep\"\nreason = \"r\"\n[[commit.when]]\npaths = [\"a\"]\n",
    );
    assert!(e.contains("unknown commit action"), "{e}");
    let e = err(
        "version = 1\n[[commit]]\nid = \"x\"\naction = \"hold\"\nreason = \"r\"\n[[commit.when]]\nglobs = [\"a\"]\n",
    );
    assert!(e.contains("globs"), "{e}");
    let twice =
        "version = 1\n[[commit]]\nid = \"x\"\naction = \"hold\"\nreason = \"r\"\n[[commit.when]]\npaths = [\"a\"]\n";
    assert!(err(&format!("{twice}{}", &twice["version = 1\n".len()..])).contains("duplicate"));
}

#[test]
fn lint_covers_commit_rules() {
    let dir = std::env::temp_dir().join(format!("txbox-commit-lint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let f = dir.join("p.toml");
    let text = "version = 1\n[[commit]]\nid = \"commit.envrc-x\"\noverride = \"weaken\"\naction = \"allow\"\nreason = \"r\"\n[[commit.when]]\npaths = [\".envrc\"]\n[[commit]]\nid = \"commit.shell-environment\"\noverride = \"weaken\"\nenabled = false\n[[commit]]\nid = \"loose\"\naction = \"hold\"\nreason = \"r\"\n[[commit.when]]\npaths = [\"x\"]\n";
    std::fs::write(&f, text).unwrap_or_else(|e| panic!("{e}"));
    let w = txbox_policy::lint(&f).unwrap_or_else(|e| panic!("{e}"));
    let has = |a: &str, b: &str| w.iter().any(|w| w.contains(a) && w.contains(b));
    assert!(has("commit.shell-environment", "WEAKENS the built-in hold commit rule"), "{w:?}");
    assert!(has("commit.envrc-x", "is not a built-in commit rule"), "{w:?}");
    assert!(has("commit.envrc-x", "exempts nothing"), "{w:?}");
    assert!(has("`loose`", "no `examples.match`") && has("`loose`", "not namespaced"), "{w:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Hostile git configuration and JSON never panic the judge, and what it cannot read is
    /// held, never let through.
    #[test]
    fn hostile_settings_never_panic_and_fail_closed(parts in proptest::collection::vec(prop_oneof![
        Just("["), Just("]"), Just("\""), Just("\\"), Just("\n"), Just("="), Just(" "), Just("#"), Just(";"),
        Just("core"), Just("fsmonitor"), Just("include"), Just("path"), Just("alias"), Just("!"), Just("x"),
        Just("{"), Just("}"), Just(":"), Just(","), Just("//"), Just("/*"), Just("*/"), Just("\\u0068"),
        Just("hooks"), Just("\u{feff}"), Just("é"), Just("\0"), Just("\r"), Just("1e9"), Just("[[[[[["),
    ], 0..40)) {
        let text: String = parts.concat();
        let p = Policy::builtin();
        for path in [".git/config", ".claude/settings.json"] {
            let got = judge(&p, path, text.as_bytes());
            prop_assert!(got.iter().all(|(_, a)| *a == CommitAction::Hold));
        }
    }
}
