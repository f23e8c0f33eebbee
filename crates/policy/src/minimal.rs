//! The minimal built-in rules: enough to refuse the obvious (`rm -rf /`, `mkfs`, fork bombs)
//! through the real [`Decision`] type. A full parser-based engine replaces the splitting here.

use std::path::{Component, Path, PathBuf};

use crate::{Action, Context, Decision, Evaluation};

/// Split a shell string into simple commands on `;`, `&`, `|`, newlines, with quote removal.
/// Deliberately naive; anything it cannot read stays a transaction, never an allow.
pub(crate) fn split_commands(s: &str) -> Vec<Vec<String>> {
    let mut cmds = Vec::new();
    let mut cur: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = s.chars().peekable();
    let flush_word = |word: &mut String, in_word: &mut bool, cur: &mut Vec<String>| {
        if *in_word {
            cur.push(std::mem::take(word));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(n) = chars.next() {
                                word.push(n);
                            }
                        }
                        _ => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            ';' | '&' | '|' | '\n' | '(' | ')' | '{' | '}' | '`' => {
                flush_word(&mut word, &mut in_word, &mut cur);
                if !cur.is_empty() {
                    cmds.push(std::mem::take(&mut cur));
                }
            }
            c if c.is_whitespace() => flush_word(&mut word, &mut in_word, &mut cur),
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    flush_word(&mut word, &mut in_word, &mut cur);
    if !cur.is_empty() {
        cmds.push(cur);
    }
    cmds
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Lexically resolve `arg` against the context (no filesystem access).
fn resolve(arg: &str, ctx: &Context) -> PathBuf {
    let expanded: PathBuf = if arg == "~" || arg == "$HOME" || arg == "${HOME}" {
        ctx.home.clone().unwrap_or_else(|| PathBuf::from("/root"))
    } else if let Some(rest) = arg.strip_prefix("~/").or_else(|| arg.strip_prefix("$HOME/")) {
        ctx.home.clone().unwrap_or_else(|| PathBuf::from("/root")).join(rest)
    } else {
        ctx.cwd.join(arg)
    };
    let mut out = PathBuf::from("/");
    for comp in expanded.components() {
        match comp {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

fn is_dangerous_delete_target(path: &Path, ctx: &Context) -> bool {
    // The workspace itself and anything in it are what a transaction protects.
    if path.starts_with(&ctx.workspace) && path != ctx.workspace {
        return false;
    }
    true
}

fn deny(rule: &str, reason: String) -> Decision {
    Decision { action: Action::Deny, rule: Some(rule.to_string()), reason }
}

fn judge(argv: &[String], ctx: &Context) -> Option<Decision> {
    let prog = basename(argv.first()?);
    // Wrappers run their argument as a command.
    if matches!(prog, "sudo" | "doas" | "env" | "nice" | "nohup" | "timeout" | "command" | "exec") {
        let rest: Vec<String> =
            argv[1..].iter().skip_while(|a| a.starts_with('-') || a.contains('=')).cloned().collect();
        let rest = if prog == "timeout" { rest.into_iter().skip(1).collect() } else { rest };
        if prog == "sudo" || prog == "doas" {
            return Some(deny("priv.escalation", format!("{prog} would run a command as another user")));
        }
        return judge(&rest, ctx);
    }
    match prog {
        "rm" => {
            let recursive = argv[1..].iter().any(|a| {
                a == "--recursive" || (a.starts_with('-') && !a.starts_with("--") && (a.contains('r') || a.contains('R')))
            });
            for a in argv[1..].iter().filter(|a| !a.starts_with('-')) {
                let base = match a.strip_suffix("/*") {
                    Some("") => "/",
                    Some(b) => b,
                    None => a.as_str(),
                };
                let target = resolve(base, ctx);
                let children_only = a.ends_with("/*");
                let whole = children_only || recursive;
                // `rm -rf ./*` empties the workspace: a transaction undoes that.
                let empties_workspace = children_only && target == ctx.workspace;
                if whole && !empties_workspace && is_dangerous_delete_target(&target, ctx) {
                    return Some(deny(
                        "fs.delete-outside-workspace",
                        format!("rm would delete {}", target.display()),
                    ));
                }
                if !target.starts_with(&ctx.workspace) {
                    return Some(deny(
                        "fs.delete-outside-workspace",
                        format!("rm would delete {} outside the workspace", target.display()),
                    ));
                }
            }
            None
        }
        p if p.starts_with("mkfs") => Some(deny("system.mkfs", format!("{p} would format a device"))),
        "shutdown" | "reboot" | "poweroff" | "halt" => {
            Some(deny("system.power", format!("{prog} would stop or restart the machine")))
        }
        ":" if argv.len() == 1 => None,
        _ => None,
    }
}

pub(crate) fn evaluate(commands: &[Vec<String>], ctx: &Context) -> Evaluation {
    let mut decision = Decision::default_transact();
    for argv in commands {
        if let Some(d) = judge(argv, ctx) {
            if d.action > decision.action {
                decision = d;
            }
        }
    }
    Evaluation { decision, commands: commands.to_vec() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Context {
        Context {
            workspace: PathBuf::from("/work/ws"),
            cwd: PathBuf::from("/work/ws"),
            home: Some(PathBuf::from("/home/dev")),
        }
    }

    fn action(s: &str) -> Action {
        evaluate(&split_commands(s), &ctx()).decision.action
    }

    #[test]
    fn denies_the_obvious() {
        for s in ["rm -rf /", "rm -fr ~", "cd x && rm -rf /", "sudo rm -rf /tmp/x", "rm -rf '/'",
                  "rm --recursive --force /home", "rm -rf ../..", "mkfs.ext4 /dev/sda", "reboot",
                  "rm -rf /*", "timeout 5 rm -rf /"] {
            assert_eq!(action(s), Action::Deny, "{s}");
        }
    }

    #[test]
    fn workspace_destruction_is_a_transaction() {
        for s in ["rm -rf target", "rm -rf ./*", "rm a b", "echo hi > x", "rm -r src/old"] {
            assert_eq!(action(s), Action::Transact, "{s}");
        }
    }

    #[test]
    fn splitting_removes_quotes() {
        assert_eq!(split_commands("r''m -rf 'a b' && echo \"x\""),
                   vec![vec!["rm".to_string(), "-rf".into(), "a b".into()], vec!["echo".into(), "x".into()]]);
    }
}
