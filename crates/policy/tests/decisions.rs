//! Every decision on every corpus, held to a recorded snapshot: action and rule of each command
//! of `agent_sessions.jsonl`, `agent_commands.tsv`, NL2Bash, dcg, Atomic Red Team and the
//! crate's own class files (`tests/sets`), one line each in `tests/snapshot/decisions.txt`.
//!
//! A change in the engine (a fast path, fewer allocations, a narrowed rule) changes no decision
//! unless it means to. When it means to, regenerate the snapshot with
//! `TXBOX_BLESS=1 cargo test -p txbox-policy --test decisions`: the test then prints each
//! changed decision with its command, for the commit message, and the snapshot's diff shows
//! which lines moved.

mod sets;

use std::fmt::Write as _;
use std::path::PathBuf;

use txbox_policy::{Action, Policy};

fn snapshot_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshot/decisions.txt")
}

/// One decision as the snapshot writes it: `d`, `t` or `a`, and the rule (`-` for none).
fn line(action: Action, rule: Option<&str>) -> String {
    let a = match action {
        Action::Deny => "d",
        Action::Transact => "t",
        Action::Allow => "a",
    };
    format!("{a} {}", rule.unwrap_or("-"))
}

/// The snapshot text of the current engine, and the command of each of its lines (none for the
/// header lines).
fn current() -> (String, Vec<Option<String>>) {
    let policy = Policy::builtin();
    let mut text = String::from(
        "# Decisions of the built-in policy on every corpus (tests/decisions.rs): per set, one line per\n\
         # command in corpus order, `d`/`t`/`a` (deny, transact, allow) and the rule (`-` for none).\n",
    );
    let mut commands = vec![None, None];
    for (set, cases) in sets::all_cases() {
        let _ = writeln!(text, "## {set} ({} commands)", cases.len());
        commands.push(None);
        for (ctx, cmd) in cases {
            let e = policy.evaluate_str(&cmd, &ctx);
            let _ = writeln!(text, "{}", line(e.decision.action, e.decision.rule.as_deref()));
            commands.push(Some(cmd));
        }
    }
    (text, commands)
}

#[test]
fn decisions_match_the_snapshot() {
    let (now, commands) = current();
    let path = snapshot_path();
    let recorded = std::fs::read_to_string(&path).unwrap_or_default();
    let was: Vec<&str> = recorded.lines().collect();
    let changed: Vec<String> = now
        .lines()
        .zip(commands.iter())
        .enumerate()
        .filter(|(k, (l, _))| was.get(*k) != Some(l))
        .map(|(k, (l, c))| {
            let was = was.get(k).copied().unwrap_or("(none)");
            let cmd: String = c.as_deref().unwrap_or("").chars().take(160).collect();
            format!("line {}: {was} -> {l}: {cmd:?}", k + 1)
        })
        .collect();
    if std::env::var_os("TXBOX_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap_or(&path)).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&path, &now).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("{} decisions changed:\n{}", changed.len(), changed.join("\n"));
        return;
    }
    assert!(
        changed.is_empty() && was.len() == now.lines().count(),
        "{} decisions differ from {} (regenerate with TXBOX_BLESS=1 if meant):\n{}",
        changed.len(),
        path.display(),
        changed.iter().take(200).cloned().collect::<Vec<_>>().join("\n")
    );
}
