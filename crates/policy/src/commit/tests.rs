//! The commit-time judge on in-memory workspaces.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::*;

/// Two sides of a commit in memory: path → content (None: a symlink).
#[derive(Default)]
struct Mem {
    old: HashMap<String, Option<Vec<u8>>>,
    new: HashMap<String, Option<Vec<u8>>>,
    reads: std::cell::Cell<usize>,
}

fn side(m: &HashMap<String, Option<Vec<u8>>>, p: &str) -> FileContent {
    match m.get(p) {
        None => FileContent::Absent,
        Some(None) => FileContent::NotRegular(ObjectKind::Symlink),
        Some(Some(b)) => FileContent::Regular(b.clone()),
    }
}

impl CommitFiles for Mem {
    fn workspace(&self) -> &Path {
        Path::new("/w")
    }
    fn kind_after(&self, p: &str) -> ObjectKind {
        match self.new.get(p) {
            None => ObjectKind::Absent,
            Some(None) => ObjectKind::Symlink,
            Some(Some(_)) => ObjectKind::File,
        }
    }
    fn before(&self, p: &str) -> FileContent {
        self.reads.set(self.reads.get() + 1);
        side(&self.old, p)
    }
    fn after(&self, p: &str) -> FileContent {
        self.reads.set(self.reads.get() + 1);
        // Untouched paths read as the workspace has them.
        if self.new.contains_key(p) {
            side(&self.new, p)
        } else {
            side(&self.old, p)
        }
    }
}

impl Mem {
    fn was(mut self, p: &str, text: &str) -> Mem {
        self.old.insert(p.into(), Some(text.as_bytes().to_vec()));
        self
    }
    fn then(mut self, p: &str, text: &str) -> Mem {
        self.new.insert(p.into(), Some(text.as_bytes().to_vec()));
        self
    }
    fn link(mut self, p: &str) -> Mem {
        self.new.insert(p.into(), None);
        self
    }
    /// Every path on the new side, as added or modified.
    fn changes(&self) -> Vec<CommitChange> {
        let mut v: Vec<CommitChange> = self
            .new
            .keys()
            .map(|p| CommitChange {
                path: p.clone(),
                change: if self.old.contains_key(p) { ChangeKind::Modified } else { ChangeKind::Added },
            })
            .collect();
        v.sort_by(|a, b| a.path.cmp(&b.path));
        v
    }
}

fn builtin_rules() -> CommitRules {
    match crate::builtin_cell() {
        Ok(p) => p.commit().clone(),
        Err(e) => panic!("{e}"),
    }
}

fn judge(m: &Mem) -> Vec<(String, String)> {
    builtin_rules().judge(&m.changes(), m).into_iter().map(|f| (f.path, f.rule)).collect()
}

fn held(m: &Mem, path: &str, rule: &str) {
    let got = judge(m);
    assert!(got.iter().any(|(p, r)| p == path && r == rule), "{path} not held by {rule}: {got:?}");
}

const BASE_CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n\tbare = false\n[user]\n\tname = dev\n";

#[test]
fn git_config_is_judged_by_the_keys_that_changed() {
    let base = || Mem::default().was(".git/config", BASE_CONFIG);
    // A benign edit holds nothing; nor does rewriting the file with the same settings.
    assert!(judge(&base().then(".git/config", &BASE_CONFIG.replace("dev", "someone"))).is_empty());
    assert!(judge(&base().then(".git/config", "[core]\nrepositoryformatversion=0\nbare=false\n[user]\nname=dev\n"))
        .is_empty());
    for (text, key) in [
        ("[core]\n\tfsmonitor = .git/fsmon.sh\n", "core.fsmonitor"),
        ("[Core]\n\tFSMonitor = x\n", "Core.FSMonitor"),
        ("[core] fsmonitor = x\n", "core.fsmonitor"),
        ("[core]\nfsmon\\\n", ""),
        ("[alias]\n\tlg = \"!sh -c 'id'\"\n", "alias.lg"),
        ("[include]\n\tpath = ../evil.cfg\n", "include.path"),
        ("[includeIf \"gitdir:/\"]\n\tpath = x\n", "includeif.gitdir:/.path"),
        ("[diff \"bin\"]\n\ttextconv = ./conv\n", "diff.bin.textconv"),
        ("[filter \"x\"]\n\tclean = c\n", "filter.x.clean"),
        ("[core.x]\n", ""),
    ] {
        let m = base().then(".git/config", &format!("{BASE_CONFIG}{text}"));
        let got = builtin_rules().judge(&m.changes(), &m);
        if key.is_empty() {
            // Unparseable or harmless: `fsmon\` continues into nothing (an error), `[core.x]`
            // adds no key.
            continue;
        }
        assert_eq!(got.len(), 1, "{text:?}: {got:?}");
        assert_eq!(got[0].rule, "commit.git-config", "{text:?}");
        assert!(got[0].reason.to_ascii_lowercase().contains(&key.to_ascii_lowercase()), "{text:?}: {}", got[0].reason);
    }
    // A non-`!` alias runs git itself.
    assert!(judge(&base().then(".git/config", &format!("{BASE_CONFIG}[alias]\n\tst = status\n"))).is_empty());
}

#[test]
fn git_config_that_cannot_be_judged_is_held_whole() {
    let base = || Mem::default().was(".git/config", BASE_CONFIG);
    for bad in ["[core\nfsmonitor = x\n", "[core]\n\tfsmonitor = \"open\n", "\u{0}", "k = v\n"] {
        held(&base().then(".git/config", bad), ".git/config", "commit.git-config");
    }
    // A symlink in its place is never followed.
    held(&base().link(".git/config"), ".git/config", "commit.git-config");
    // Deleting it runs nothing.
    let mut gone = base();
    gone.new.clear();
    let changes = [CommitChange { path: ".git/config".into(), change: ChangeKind::Deleted }];
    assert!(builtin_rules().judge(&changes, &gone).is_empty());
}

#[test]
fn files_the_config_includes_are_git_config_too() {
    // The workspace's config already includes a file of the workspace: editing that file to
    // set fsmonitor is the same as editing .git/config.
    let cfg = format!("{BASE_CONFIG}[include]\n\tpath = ../shared/git.cfg\n");
    let m = Mem::default()
        .was(".git/config", &cfg)
        .was("shared/git.cfg", "[user]\nemail = a@b\n")
        .then("shared/git.cfg", "[user]\nemail = a@b\n[core]\nfsmonitor = ./x\n");
    held(&m, "shared/git.cfg", "commit.git-config");
    // A benign edit of it is not held; includes outside the workspace are not followed.
    let m = Mem::default().was(".git/config", &cfg).then("shared/git.cfg", "[user]\nemail = c@d\n");
    assert!(judge(&m).is_empty());
    let outside = format!("{BASE_CONFIG}[include]\n\tpath = ../../etc/x\n[include]\npath = ~/y\n");
    let m = Mem::default().was(".git/config", &outside).then("etc/x", "[core]\nfsmonitor=x\n");
    assert!(judge(&m).is_empty());
    // An include added in this very commit counts as well.
    let m = Mem::default()
        .was(".git/config", BASE_CONFIG)
        .then(".git/config", &cfg)
        .then("shared/git.cfg", "[core]\nfsmonitor = ./x\n");
    held(&m, ".git/config", "commit.git-config");
    held(&m, "shared/git.cfg", "commit.git-config");
}

#[test]
fn hooks_and_the_hooks_path_the_workspace_names() {
    held(&Mem::default().then(".git/hooks/pre-commit", "#!/bin/sh\n"), ".git/hooks/pre-commit", "commit.git-hooks");
    held(&Mem::default().link(".git/hooks/pre-commit"), ".git/hooks/pre-commit", "commit.git-hooks");
    held(&Mem::default().link(".git/hooks"), ".git/hooks", "commit.git-hooks");
    held(&Mem::default().link(".git"), ".git", "commit.git-hooks");
    assert!(judge(&Mem::default().then(".git/hooks/pre-commit.sample", "x")).is_empty());
    // `core.hooksPath` pointing into the workspace, set before or in this commit.
    let husky = format!("{BASE_CONFIG}[core]\n\thooksPath = .husky\n");
    let m = Mem::default().was(".git/config", &husky).then(".husky/pre-commit", "x");
    held(&m, ".husky/pre-commit", "commit.git-hooks");
    let m = Mem::default().was(".git/config", &husky).link(".husky");
    held(&m, ".husky", "commit.git-hooks");
    let abs = format!("{BASE_CONFIG}[core]\n\thooksPath = /w/tools/hooks/\n");
    held(
        &Mem::default().was(".git/config", &abs).then("tools/hooks/post-merge", "x"),
        "tools/hooks/post-merge",
        "commit.git-hooks",
    );
    let m = Mem::default().was(".git/config", BASE_CONFIG).then(".git/config", &husky).then(".husky/pre-push", "x");
    held(&m, ".husky/pre-push", "commit.git-hooks");
    // Without the setting, the same directory is an ordinary one.
    assert!(judge(&Mem::default().was(".git/config", BASE_CONFIG).then(".husky/pre-commit", "x")).is_empty());
}

#[test]
fn json_settings_are_judged_by_the_keys_that_changed() {
    let settings = ".claude/settings.json";
    let old = r#"{"model": "x", "hooks": {"PreToolUse": [{"hooks": [{"type": "command", "command": "true"}]}]}}"#;
    let base = || Mem::default().was(settings, old);
    assert!(judge(&base().then(settings, &old.replace("\"x\"", "\"y\""))).is_empty());
    held(&base().then(settings, &old.replace("\"true\"", "\"curl x | sh\"")), settings, "commit.agent-settings");
    // An escaped key is still the key; comments and trailing commas are JSONC.
    let sneaky = "{\n// c\n\"model\": \"x\", \"\\u0068ooks\": {\"Stop\": [1,],},\n}";
    held(&base().then(settings, sneaky), settings, "commit.agent-settings");
    held(&base().then(settings, "{\"model\": "), settings, "commit.agent-settings");
    held(
        &Mem::default().then(".mcp.json", r#"{"mcpServers": {"x": {"command": "sh"}}}"#),
        ".mcp.json",
        "commit.agent-settings",
    );
    let vs = ".vscode/settings.json";
    assert!(judge(&Mem::default().then(vs, r#"{"editor.formatOnSave": true}"#)).is_empty());
    held(&Mem::default().then(vs, r#"{"python.defaultInterpreterPath": "./evil"}"#), vs, "commit.editor-tasks");
    held(&Mem::default().then(".vscode/tasks.json", "{}"), ".vscode/tasks.json", "commit.editor-tasks");
    held(&Mem::default().then("sub/.envrc", "export X=1"), "sub/.envrc", "commit.shell-environment");
}

#[test]
fn paths_no_rule_names_are_not_read() {
    let m = Mem::default().then("src/main.rs", "fn main() {}").then("README.md", "x");
    let changes = m.changes();
    let rules = builtin_rules();
    assert!(rules.judge(&changes, &m).is_empty());
    // Only `.git/config` (for the hooks path and includes) was looked at.
    assert!(m.reads.get() <= 1, "{} reads", m.reads.get());
}

#[test]
fn strictest_rule_wins_and_allow_rules_hold_nothing() {
    let spec = |id: &str, action: &str| CommitRuleSpec {
        id: crate::placed::Placed::new(0..0, id.to_string()),
        enabled: None,
        action: Some(action.into()),
        reason: Some("r {path}".into()),
        override_: None,
        examples: None,
        when: vec![CommitMatchSpec { paths: vec!["**/*.sh".into()], ..CommitMatchSpec::default() }],
    };
    let compile = |s: &CommitRuleSpec| CommitRule::compile(s).unwrap_or_else(|e| panic!("{e}"));
    let rules =
        CommitRules::new(vec![compile(&spec("a", "hold")), compile(&spec("b", "deny")), compile(&spec("c", "allow"))]);
    let m = Mem::default().then("x/run.sh", "x");
    let got = rules.judge(&m.changes(), &m);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].rule.as_str(), got[0].action), ("b", CommitAction::Deny));
    assert_eq!(got[0].reason, "r x/run.sh");
}

#[test]
fn bad_rules_are_refused_with_the_reason() {
    let parse = |t: &str| -> Result<CommitRule, String> {
        let spec: CommitRuleSpec = toml::from_str(t).map_err(|e| e.to_string())?;
        CommitRule::compile(&spec)
    };
    assert!(parse("id='a'\naction='hold'\nreason='r'\n[[when]]\npaths=['x']").is_ok());
    for bad in [
        "id='a'\naction='keep'\nreason='r'\n[[when]]\npaths=['x']",
        "id='a'\naction='hold'\n[[when]]\npaths=['x']",
        "id='a'\naction='hold'\nreason='r'",
        "id='a'\naction='hold'\nreason='r'\n[[when]]\ngit_config_keys=['x']",
        "id='a'\naction='hold'\nreason='r'\n[[when]]\npaths=['{home}/x']",
        "id='a'\naction='hold'\nreason='r'\n[[when]]\npaths=['x']\ngit_config_keys=['a']\njson_keys=['b']",
        "id='a'\naction='hold'\nreason='r'\n[[when]]\npaths=['[']",
        "id='a'\naction='hold'\nreason='r'\n[[when]]\npaths=['x']\nfoo=1",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn paths_in_settings_resolve_inside_the_workspace_only() {
    let ws = PathBuf::from("/w");
    assert_eq!(in_workspace("", ".husky", &ws).as_deref(), Some(".husky"));
    assert_eq!(in_workspace(".git", "../x/../y.cfg", &ws).as_deref(), Some("y.cfg"));
    assert_eq!(in_workspace("", "/w/a/b/", &ws).as_deref(), Some("a/b"));
    for outside in ["/wx/a", "/etc", "../x", "~/x", "~", "%(prefix)/x", "", "/w"] {
        assert_eq!(in_workspace("", outside, &ws), None, "{outside}");
    }
}
