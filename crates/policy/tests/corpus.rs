//! Labelled corpus tests, TOML error tests and property tests of the policy engine.

use std::path::PathBuf;

use proptest::prelude::*;
use txbox_policy::{example_context, Action, Context, Policy};

fn ctx() -> Context {
    example_context()
}

fn lines(file: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).map(|l| l.replace("\\n", "\n")).collect()
}

fn check(file: &str, want: Action) {
    let p = Policy::builtin();
    let mut bad = Vec::new();
    let all = lines(file);
    for l in &all {
        let e = p.evaluate_str(l, &ctx());
        if e.decision.action != want || (want == Action::Deny && e.decision.rule.is_none()) {
            bad.push(format!(
                "{l:?} => {} ({:?}: {}) {:?}",
                e.decision.action.as_str(),
                e.decision.rule,
                e.decision.reason,
                e.commands
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} lines in {file} are not {}:\n{}",
        bad.len(),
        all.len(),
        want.as_str(),
        bad.join("\n")
    );
}

#[test]
fn corpus_deny() {
    check("deny.txt", Action::Deny);
}

#[test]
fn corpus_transact() {
    check("transact.txt", Action::Transact);
}

/// Deny-worthy commands by class (`tests/corpus/early/*.txt`): every line denied, with a reason
/// from a rule; their near misses (`early/ok.txt`) never denied.
#[test]
fn corpus_early_refusals() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/early");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().and_then(|e| e.file_name().into_string().ok()))
        .filter(|n| n.ends_with(".txt") && n != "ok.txt")
        .collect();
    files.sort();
    assert!(files.len() >= 7, "{files:?}");
    for f in files {
        check(&format!("early/{f}"), Action::Deny);
    }
    let p = Policy::builtin();
    let bad: Vec<String> = lines("early/ok.txt")
        .into_iter()
        .filter_map(|l| {
            let e = p.evaluate_str(&l, &ctx());
            (e.decision.action == Action::Deny)
                .then(|| format!("{l:?} => {:?}: {}", e.decision.rule, e.decision.reason))
        })
        .collect();
    assert!(bad.is_empty(), "near misses denied:\n{}", bad.join("\n"));
}

#[test]
fn allow_read_only() {
    let p = Policy::builtin();
    for s in [
        "ls -la",
        "cat README.md | grep foo",
        "git status",
        "git log --oneline | head",
        "echo hi",
        "find . -name '*.rs'",
        "wc -l src/*.rs",
        "cd src && ls",
        "grep -rn TODO . 2>/dev/null",
    ] {
        let e = p.evaluate_str(s, &ctx());
        assert_eq!(e.decision.action, Action::Allow, "{s}: {:?}", e.decision);
    }
}

#[test]
fn deny_reason_names_path() {
    let p = Policy::builtin();
    let e = p.evaluate_str("cd x && rm -rf ~", &ctx());
    assert_eq!(e.decision.rule.as_deref(), Some("fs.delete-outside-workspace"));
    assert_eq!(e.decision.reason, "rm would delete /home/dev");
    assert!(e.commands.contains(&vec!["rm".to_string(), "-r".into(), "-f".into(), "~".into()]));
}

#[test]
fn argv_form() {
    let p = Policy::builtin();
    let argv: Vec<String> = ["rm", "-rf", "/"].iter().map(|s| s.to_string()).collect();
    assert_eq!(p.evaluate_argv(&argv, &ctx()).decision.action, Action::Deny);
    // Arguments are literal: no shell expansion of `$(…)`.
    let argv: Vec<String> = ["echo", "$(rm -rf /)"].iter().map(|s| s.to_string()).collect();
    assert_eq!(p.evaluate_argv(&argv, &ctx()).decision.action, Action::Allow);
    let argv: Vec<String> = ["bash", "-c", "rm -rf /"].iter().map(|s| s.to_string()).collect();
    assert_eq!(p.evaluate_argv(&argv, &ctx()).decision.action, Action::Deny);
}

#[test]
fn user_policy_merge() {
    let text = r#"
version = 1

[[rule]]
id = "remote.force-push"
enabled = false
override = "weaken"

[[rule]]
id = "team.no-make-deploy"
action = "deny"
reason = "deploys go through CI"
examples.match = ["make deploy"]
examples.no_match = ["make test"]
[[rule.when]]
program = ["make"]
subcommand = ["deploy"]
"#;
    let p = Policy::from_toml_str(text, "team.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.evaluate_str("git push -f", &ctx()).decision.action, Action::Transact);
    let e = p.evaluate_str("make deploy", &ctx());
    assert_eq!(e.decision.rule.as_deref(), Some("team.no-make-deploy"));
    // The effective policy round-trips.
    let again = Policy::from_toml_str(&p.to_toml(), "shown.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.to_toml(), p.to_toml());
    assert_eq!(again.evaluate_str("git push -f", &ctx()).decision.action, Action::Transact);
    let b = Policy::builtin();
    let again = Policy::from_toml_str(&b.to_toml(), "shown.toml").unwrap_or_else(|e| panic!("{e}"));
    assert!(again == b);
}

fn err(text: &str) -> String {
    match Policy::from_toml_str(text, "p.toml") {
        Ok(_) => panic!("expected an error for {text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn toml_errors_have_positions() {
    assert_eq!(err("version = 2\n"), "p.toml:1:11: unsupported version 2 (expected 1)");
    let e = err("version = 1\n[[rule]]\nid = \"x.y\"\nactoin = \"deny\"\n");
    assert!(e.starts_with("p.toml:4:1: "), "{e}");
    let e = err("version = 1\n[[rule]]\nid = \"x.y\"\naction = \"deny\"\nreason = \"r\"\nexamples.match = [\"ls\"]\n[[rule.when]]\nprogram = [\"rm\"]\n");
    assert_eq!(e, "p.toml:3:6: rule `x.y`: example `ls` should match but does not");
    let e = err("version = 1\n\n[[rule]]\nid = \"x.z\"\naction = \"forbid\"\nreason = \"r\"\n[[rule.when]]\nprogram = [\"rm\"]\n");
    assert_eq!(e, "p.toml:4:6: rule `x.z`: unknown action `forbid` (deny, transact, allow)");
    let e =
        err("version = 1\n[[rule]]\nid = \"x.r\"\naction = \"deny\"\nreason = \"r\"\n[[rule.when]]\nregex = \"(\"\n");
    assert!(e.starts_with("p.toml:3:6: rule `x.r`: `regex`"), "{e}");
    let e = err("version = 1\n[[rule]]\nid = \"x.p\"\naction = \"deny\"\nreason = \"r\"\n[[rule.when]]\npaths_any = [\"moon\"]\n");
    assert!(e.contains("unknown path class `moon`"), "{e}");
    let e = err("version = 1\nrule = [\n");
    assert!(e.starts_with("p.toml:"), "{e}");
}

#[test]
fn lint_warns() {
    let dir = std::env::temp_dir().join(format!("txbox-policy-lint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let f = dir.join("p.toml");
    std::fs::write(&f, "version = 1\n[[rule]]\nid = \"fs.delete-outside-workspace\"\nenabled = false\noverride = \"weaken\"\n[[rule]]\nid = \"mine\"\naction = \"transact\"\nreason = \"r\"\n[[rule.when]]\nprogram = [\"make\"]\n").unwrap_or_else(|e| panic!("{e}"));
    let w = txbox_policy::lint(&f).unwrap_or_else(|e| panic!("{e}"));
    assert!(w.iter().any(|w| w.contains("WEAKENS the built-in deny rule: disables it")), "{w:?}");
    assert!(w.iter().any(|w| w.contains("no `examples.match`")), "{w:?}");
    assert!(w.iter().any(|w| w.contains("not namespaced")), "{w:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

const DENY_CORE: &[&str] = &[
    "rm -rf /",
    "rm -rf ~",
    "chmod -R 777 /",
    "dd if=/dev/zero of=/dev/sda",
    "git push --force",
    "curl x | sh",
    "shutdown -h now",
    "kill -9 -1",
    "mkfs.ext4 /dev/sda1",
    "npm publish",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn benign_words_never_deny(words in proptest::collection::vec("[a-z][a-z0-9_.]{0,8}", 1..6)) {
        let p = Policy::builtin();
        let s = words.join(" ");
        let e = p.evaluate_str(&s, &ctx());
        // Plain lowercase words can only spell a dangerous command by naming one.
        let dangerous = ["reboot", "halt", "poweroff", "shutdown", "su", "killall5", "insmod", "rmmod", "modprobe", "dropdb",
            "wipefs", "fdisk", "sfdisk", "cfdisk", "gdisk", "sgdisk", "parted", "mkswap", "mke2fs", "pkexec", "userdel", "deluser",
            "groupdel", "delgroup", "passwd", "chpasswd", "visudo", "vipw", "setcap", "kexec", "depmod", "kmod", "run0", "sudoedit",
            "cryptsetup", "zpool", "pvcreate", "vgremove", "lvremove", "blkdiscard", "badblocks", "dropuser", "telinit", "init",
            "pm-suspend", "pm-hibernate",
            // Administration and accounts: these change the host whatever their plain-word arguments.
            "at", "batch", "atrm", "crontab", "hostname", "mount", "umount", "swapon", "swapoff", "losetup", "setenforce",
            "setsebool", "ldconfig", "systemctl", "service", "chkconfig", "insserv", "sv", "initctl", "launchctl",
            "ip", "route", "ifconfig", "iwconfig", "tc", "nmcli", "useradd", "adduser", "usermod", "groupadd", "addgroup",
            "groupmod", "gpasswd", "chsh", "chfn", "newusers", "newgrp", "vigr", "pwconv", "pwunconv", "grpconv",
            "grpunconv", "pw", "lusermod", "luseradd", "chage", "faillock", "auditctl", "timedatectl", "hostnamectl"];
        let first = words[0].as_str();
        if !dangerous.contains(&first) && !first.starts_with("mkfs") {
            prop_assert_ne!(e.decision.action, Action::Deny, "{} => {:?}", s, e.decision);
        }
    }

    #[test]
    fn wrapping_keeps_deny(k in 0usize..DENY_CORE.len(), w in 0usize..7) {
        let p = Policy::builtin();
        let c = DENY_CORE[k];
        let wrapped = match w {
            0 => format!("bash -c '{c}'"),
            1 => format!("sudo {c}"),
            2 => format!("echo $({c})"),
            3 => format!("eval '{c}'"),
            4 => format!("({c})"),
            5 => format!("true && {{ {c}; }}"),
            _ => format!("sh -c \"bash -c '{c}'\""),
        };
        let e = p.evaluate_str(&wrapped, &ctx());
        prop_assert_eq!(e.decision.action, Action::Deny, "{} => {:?}", wrapped, e.decision);
    }

    /// su and sudo in every option spelling: the code they run is judged (a deny-worthy command
    /// stays denied whoever runs it), and a shell as root, or as a user the engine cannot read,
    /// is denied (issue #13: su -lc CODE and su --command=CODE once ran CODE unseen).
    #[test]
    fn su_and_sudo_spellings_keep_deny(
        k in 0usize..DENY_CORE.len(),
        opts in prop_oneof![Just(""), Just("-"), Just("-l"), Just("-m"), Just("-p"), Just("-s /bin/sh"), Just("--login"), Just("-f"), Just("--shell=/bin/bash")],
        user in prop_oneof![Just(""), Just("root"), Just("bob"), Just("\"$U\""), Just("0")],
        form in 0usize..6,
    ) {
        let p = Policy::builtin();
        let c = DENY_CORE[k];
        let code = match form {
            0 => format!("su {opts} {user} -c '{c}'"),
            1 => format!("su {opts} --command='{c}' {user}"),
            2 => format!("su -lc '{c}' {user}"),
            3 => format!("sudo su {opts} {user} -c '{c}'"),
            4 => format!("su {opts} --session-command '{c}' {user}"),
            _ => format!("sudo -u {} sh -c '{c}'", if user.is_empty() { "root" } else { user }),
        };
        let e = p.evaluate_str(&code, &ctx());
        prop_assert_eq!(e.decision.action, Action::Deny, "{} => {:?}", code, e.decision);
        let root = matches!(user, "" | "root" | "0" | "\"$U\"");
        let shells = [format!("su {opts} {user}"), format!("sudo su {opts} {user}"), format!("sudo -u {} -i", if user.is_empty() { "root" } else { user })];
        for s in shells {
            let e = p.evaluate_str(&s, &ctx());
            prop_assert_eq!(e.decision.action == Action::Deny, root, "{} => {:?}", s, e.decision);
        }
    }

    #[test]
    fn never_panics(s in "\\PC{0,60}") {
        let p = Policy::builtin();
        let _ = p.evaluate_str(&s, &ctx());
    }

    #[test]
    fn shell_ish_text_never_panics(s in "[a-z $'\"`(){};|&<>\\\\*~/=-]{0,40}") {
        let p = Policy::builtin();
        let e = p.evaluate_str(&s, &ctx());
        // Anything opaque or unparseable is never allowed.
        if s.contains('$') || s.contains('`') {
            prop_assert!(e.decision.action != Action::Allow || !e.commands.iter().any(|c| c.first().is_some_and(|p| p.starts_with('$'))));
        }
    }

    #[test]
    fn equivalent_spellings_agree(flags in prop_oneof![Just("-rf"), Just("-fr"), Just("-r -f"), Just("-f -r"), Just("--recursive --force"), Just("-R -f"), Just("--force -r")],
                                  prog in prop_oneof![Just("rm"), Just("/bin/rm"), Just("r''m"), Just("\\rm"), Just("\"rm\""), Just("$'\\x72m'")],
                                  target in prop_oneof![Just("/"), Just("~"), Just("/usr"), Just("$HOME"), Just("/home/dev")]) {
        let p = Policy::builtin();
        let s = format!("{prog} {flags} {target}");
        prop_assert_eq!(p.evaluate_str(&s, &ctx()).decision.action, Action::Deny, "{}", s);
    }
}

/// A workspace below a scratch directory: its ancestors there are still its ancestors.
#[test]
fn ancestors_of_a_workspace_below_tmp_are_protected() {
    let ctx = Context {
        workspace: PathBuf::from("/var/tmp/proj/ws"),
        cwd: PathBuf::from("/var/tmp/proj/ws"),
        home: Some(PathBuf::from("/var/tmp/proj")),
        writable: Vec::new(),
    };
    let p = Policy::builtin();
    for s in ["rm -rf /var/tmp/proj", "rm -rf ~", "rm -rf ..", "rm -rf /var/tmp"] {
        assert_eq!(p.evaluate_str(s, &ctx).decision.action, Action::Deny, "{s}");
    }
    for s in ["rm -rf /var/tmp/other-build", "rm -rf build", "rm -rf /tmp/x"] {
        assert_eq!(p.evaluate_str(s, &ctx).decision.action, Action::Transact, "{s}");
    }
}

/// A reused built-in id can only weaken that rule when the file says so (issue #13, finding 11):
/// every way of weakening is refused without `override = "weaken"`, accepted with it, and then
/// reported by `weakened()`, `to_toml()` (what `policy show` prints) and `lint`.
#[test]
fn weakening_a_builtin_rule_must_be_explicit() {
    let weaken = [
        ("enabled = false", "disables it"),
        ("action = \"transact\"", "lowers its action from deny to transact"),
        ("action = \"allow\"", "lowers its action from deny to allow"),
        (
            "[[rule.when]]\nprogram = [\"git\"]\nsubcommand = [\"push\"]\nargs_any = [\"--never\"]",
            "replaces what it matches",
        ),
    ];
    for (body, how) in weaken {
        let silent = format!("version = 1\n[[rule]]\nid = \"remote.force-push\"\n{body}\n");
        let e = err(&silent);
        assert!(
            e.contains("rule `remote.force-push`") && e.contains(how) && e.contains("override = \"weaken\""),
            "{e}"
        );
        let explicit = silent.replace(
            "\n[[rule]]\nid = \"remote.force-push\"\n",
            "\n[[rule]]\nid = \"remote.force-push\"\noverride = \"weaken\"\n",
        );
        let p = Policy::from_toml_str(&explicit, "p.toml").unwrap_or_else(|e| panic!("{explicit}: {e}"));
        assert_eq!(p.weakened().len(), 1, "{explicit}");
        assert_eq!(p.weakened()[0].rule, "remote.force-push");
        assert!(p.weakened()[0].how.contains(how), "{:?}", p.weakened());
        assert_ne!(p.evaluate_str("git push -f", &ctx()).decision.action, Action::Deny, "{explicit}");
        let shown = p.to_toml();
        assert!(shown.starts_with("# WEAKENED built-in rule `remote.force-push`"), "{shown}");
        // What `show` prints loads back to the same policy, weakening still reported.
        let again = Policy::from_toml_str(&shown, "shown.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.to_toml(), shown);
    }
    // An allow rule weakens when what it allows is replaced; disabling it does not.
    let e = err("version = 1\n[[rule]]\nid = \"read-only\"\n[[rule.when]]\nprogram = [\"rm\"]\n");
    assert!(e.contains("replaces what it matches"), "{e}");
    let text = "version = 1\n[[rule]]\nid = \"read-only\"\nenabled = false\n";
    let p = Policy::from_toml_str(text, "p.toml").unwrap_or_else(|e| panic!("{text}: {e}"));
    assert!(p.weakened().is_empty(), "{text}");
    // Strengthening or rewording needs no override.
    for body in ["reason = \"ask the team first\"", "action = \"deny\""] {
        let text = format!("version = 1\n[[rule]]\nid = \"fs.workspace-destruction\"\n{body}\n");
        let p = Policy::from_toml_str(&text, "p.toml").unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!(p.weakened().is_empty() && !p.to_toml().starts_with('#'), "{text}");
    }
    // The unmodified built-in policy weakens nothing, even when every rule is restated.
    let b = Policy::builtin();
    let again = Policy::from_toml_str(&b.to_toml(), "shown.toml").unwrap_or_else(|e| panic!("{e}"));
    assert!(again.weakened().is_empty());
}

#[test]
fn lint_reports_pointless_overrides() {
    let dir = std::env::temp_dir().join(format!("txbox-policy-lint-override-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let f = dir.join("p.toml");
    let text = "version = 1\n[[rule]]\nid = \"remote.publish\"\noverride = \"weaken\"\nreason = \"r\"\n[[rule]]\nid = \"team.x\"\noverride = \"weaken\"\naction = \"deny\"\nreason = \"r\"\nexamples.match = [\"make x\"]\n[[rule.when]]\nprogram = [\"make\"]\nsubcommand = [\"x\"]\n";
    std::fs::write(&f, text).unwrap_or_else(|e| panic!("{e}"));
    let w = txbox_policy::lint(&f).unwrap_or_else(|e| panic!("{e}"));
    assert!(w.iter().any(|w| w.contains("`remote.publish`") && w.contains("weakens nothing")), "{w:?}");
    assert!(w.iter().any(|w| w.contains("`team.x`") && w.contains("is not a built-in rule")), "{w:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Text built from the pieces the here-document pre-scan, the static evaluator and the
    /// word splitter look at (including multi-byte characters next to them) never panics, and
    /// what does not parse is never allowed.
    #[test]
    fn heredoc_and_static_pieces_never_panic(parts in proptest::collection::vec(prop_oneof![
        Just("<<"), Just("<<-"), Just("<<<"), Just("'EOF'"), Just("\"EOF\""), Just("\\EOF"), Just("EOF"), Just("\n"),
        Just("\t"), Just("'"), Just("\""), Just("$("), Just(")"), Just("`"), Just("${"), Just("}"), Just("$(("), Just("#"),
        Just("é"), Just("日本"), Just("cat "), Just("echo "), Just("| sh"), Just("| base64 -d"), Just("| rev"),
        Just("IFS=,;"), Just("a=(x y);"), Just("${a[@]}"), Just("$@"), Just("set -- rm -rf /;"), Just("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
        Just("tr a-z b-za"), Just("printf '%s\\x72' "), Just("xargs -0 "), Just(">(sh)"), Just("<(echo rm)"),
    ], 0..24)) {
        let s: String = parts.concat();
        let p = Policy::builtin();
        let e = p.evaluate_str(&s, &ctx());
        if e.decision.rule.as_deref() == Some("engine.parse-error") {
            prop_assert_ne!(e.decision.action, Action::Allow);
        }
    }
}

/// brush-parser panics on some unterminated constructs (its tokenizer unwraps the next
/// character at the end of the text): found by `heredoc_and_static_pieces_never_panic` in CI.
/// The judge survives them and refuses the string (nothing says what bash would run of it),
/// whether it is the whole string, a line after a denied command, or a string a command runs.
#[test]
fn a_parser_that_fails_on_a_string_refuses_it_and_survives() {
    let p = Policy::builtin();
    let crash = "<<'<(echo rm)'>(sh)$((>(sh)\n<(echo rm)";
    for s in [
        crash.to_string(),
        format!("git push --force origin main\n{crash}"),
        format!("bash -c $'{}'", crash.replace('\'', "\\'").replace('\n', "\\n")),
        format!("echo ok; {crash}"),
    ] {
        let e = p.evaluate_str(&s, &ctx());
        assert_eq!(e.decision.action, Action::Deny, "{s:?}: {:?}", e.decision);
        assert_eq!(e.decision.rule.as_deref(), Some("engine.unjudgeable"), "{s:?}: {:?}", e.decision);
    }
    // And judging goes on as before afterwards, on this thread and others.
    assert_eq!(p.evaluate_str("ls -la", &ctx()).decision.action, Action::Allow);
    let q = p.clone();
    let other = std::thread::spawn(move || q.evaluate_str(crash, &ctx()).decision.action);
    assert!(matches!(other.join(), Ok(Action::Deny)));
}

/// Whatever bash would run of a string must have been judged: where the extraction stops short
/// of it, the string is refused, never let through because the rest was harmless. Each variant
/// hides a command a rule denies behind the point where judging stopped.
#[test]
fn what_the_engine_cannot_judge_is_refused() {
    let p = Policy::builtin();
    let push = "git push --force origin main";
    let variants = [
        // Bash runs each line before the one in error; the string as a whole does not parse.
        format!("{push}\necho 'x"),
        format!("{push}\nif then\n"),
        // The same inside a string a command runs.
        format!("bash -c $'{push}\\necho \\'x'"),
        // Past the nesting bound, counted in quoted text too (bash runs it all).
        format!("echo '{}'; {push}", "(".repeat(300)),
        format!("echo {}; {push}", "\"$(\"".repeat(300)),
        // A here-document delimiter the parser is kept from (bash reads it fine).
        format!("cat <<''; {push}\nx\n\n"),
        // More commands than are extracted.
        format!("{}{push}", "true; ".repeat(600)),
        // Strings run by strings, deeper than followed.
        format!("{}{push}", "eval ".repeat(14)),
    ];
    for v in &variants {
        let e = p.evaluate_str(v, &ctx());
        assert_eq!(e.decision.action, Action::Deny, "{:?}: {e:?}", v.chars().take(120).collect::<String>());
        assert!(
            matches!(e.decision.rule.as_deref(), Some("engine.unjudgeable" | "remote.force-push")),
            "{:?}: {e:?}",
            v.chars().take(120).collect::<String>()
        );
    }
    // What bash cannot run any of stays a transaction (bash fails it whole), and a trailing
    // newline is not a second line.
    for v in ["echo 'x", "if then", "echo 'x\n", "for in; do"] {
        let e = p.evaluate_str(v, &ctx());
        assert_eq!(e.decision.action, Action::Transact, "{v:?}: {e:?}");
        assert_eq!(e.decision.rule.as_deref(), Some("engine.parse-error"), "{v:?}: {e:?}");
    }
    // A long string of many harmless commands, under the bounds, is judged as before.
    let e = p.evaluate_str(&"true; ".repeat(400), &ctx());
    assert_eq!(e.decision.action, Action::Allow, "{e:?}");
}
