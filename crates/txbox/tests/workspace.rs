//! The workspace looks like itself (issue #15): with the default state directory, nothing of
//! txbox appears in the workspace, so `git status`, `git clean -fdx`, `find` and `grep -r`
//! behave as without txbox, inside a transaction and on the host afterwards. Root and
//! unprivileged, warm and cold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

/// `txbox [--json] run -C WS -c SCRIPT` with no `--state-dir`: the default place, for a user
/// whose home is beside (not inside) the workspace.
fn txbox_default(who: As, s: &Scratch, json: bool, script: &str, cold: bool) -> Output {
    let mut cmd = txbox_command(who);
    cmd.env("HOME", &s.root).env_remove("XDG_STATE_HOME").env_remove("TXBOX_STATE_DIR");
    if cold {
        cmd.env("TXBOX_WARM", "0");
    }
    if json {
        cmd.arg("--json");
    }
    cmd.args(["run", "-C"]).arg(&s.ws).args(["-c", script]).current_dir(&s.ws);
    cmd.output().unwrap()
}

/// A native command in the workspace, as `who`, with its output.
fn host(who: As, dir: &Path, script: &str) -> String {
    let mut cmd = match who {
        As::Me => Command::new("sh"),
        As::User(uid) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}")).arg("--clear-groups").arg("--").arg("sh");
            c
        }
    };
    let out = cmd.args(["-c", script]).current_dir(dir).env("HOME", dir.parent().unwrap()).output().unwrap();
    assert!(out.status.success(), "{script}: {}", describe(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// A small repository: a tracked file, an ignored build directory, a committed `.gitignore`.
fn repository(who: As, name: &str) -> Scratch {
    let s = Scratch::new(name);
    if let As::User(uid) = who {
        s.chown(uid);
    }
    host(
        who,
        &s.ws,
        "git init -q . && git config user.email t@example.invalid && git config user.name t \
         && printf 'build/\\n' > .gitignore && echo one > tracked && git add . && git commit -qm init \
         && mkdir build && echo obj > build/out.o",
    );
    s
}

#[test]
fn git_find_and_grep_see_only_the_workspace_inside_and_out() {
    for who in identities() {
        for cold in [false, true] {
            let s = repository(who, "looks-like-itself");
            let out = txbox_default(
                who,
                &s,
                true,
                "echo two > tracked; echo new > untracked; git status --porcelain --ignored; echo ---; \
                 find . -path ./.git -prune -o -print | sort; echo ---; grep -rl two --exclude-dir=.git .",
                cold,
            );
            let j: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
            assert_eq!(j["outcome"], "committed", "{who:?} cold={cold}: {j}");
            assert_eq!(
                j["stdout"],
                " M tracked\n?? untracked\n!! build/\n---\n.\n./.gitignore\n./build\n./build/out.o\n./tracked\n\
                 ./untracked\n---\n./tracked\n",
                "{who:?} cold={cold}: inside, git, find and grep see exactly the workspace: {j}"
            );
            // On the host afterwards: the same view, nothing of txbox in or beside the workspace.
            assert_eq!(
                host(who, &s.ws, "git status --porcelain --ignored"),
                " M tracked\n?? untracked\n!! build/\n",
                "{who:?} cold={cold}"
            );
            assert_eq!(
                host(who, &s.root, "find . -path ./.local -prune -o -name '*txbox*' -print"),
                "",
                "{who:?} cold={cold}"
            );
        }
    }
}

/// `git reset --hard` then `git clean -fdx`, each its own transaction: both commit, and the
/// second does not trip over txbox's state or undo the first.
#[test]
fn git_clean_fdx_inside_cleans_like_native_and_keeps_what_came_before() {
    for who in identities() {
        for cold in [false, true] {
            let s = repository(who, "clean-fdx");
            host(who, &s.ws, "echo changed > tracked && echo stray > untracked");
            let reset = txbox_default(who, &s, false, "git reset -q --hard", cold);
            assert!(reset.status.success(), "{who:?} cold={cold}: {}", describe(&reset));
            let clean = txbox_default(who, &s, false, "git clean -qfdx", cold);
            assert!(clean.status.success(), "{who:?} cold={cold}: {}", describe(&clean));
            assert_eq!(
                host(who, &s.ws, "cat tracked; git status --porcelain --ignored"),
                "one\n",
                "{who:?} cold={cold}"
            );
            assert!(!s.ws.join("build").exists(), "{who:?} cold={cold}: git clean -x removes ignored files");
        }
    }
}

/// `-C` on every subcommand (#15): `doctor -C` says whether the directory can be a workspace
/// and where its state lives, and refuses an unreasonable one; `demo -C` makes its scratch
/// workspace inside the directory named and leaves nothing there.
#[test]
fn doctor_and_demo_take_a_directory() {
    let s = Scratch::new("doctor-c");
    let doctor = |dir: &Path| {
        let out = Command::new(binary())
            .arg("--state-dir")
            .arg(&s.state)
            .args(["--json", "doctor", "-C"])
            .arg(dir)
            .output()
            .unwrap();
        let j: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
        let check = j["checks"].as_array().unwrap().iter().find(|c| c["name"] == "workspace").cloned();
        (out.status.code(), j, check.unwrap_or_else(|| panic!("no workspace check: {}", describe(&out))))
    };
    let (_, _, ws) = doctor(&s.ws);
    assert_eq!(ws["ok"], true, "{ws}");
    assert!(ws["detail"].as_str().unwrap().contains(s.ws.to_str().unwrap()), "{ws}");
    let (code, j, root) = doctor(Path::new("/"));
    assert_eq!((code, &j["ok"], &root["ok"]), (Some(1), &serde_json::json!(false), &serde_json::json!(false)), "{j}");

    let out = Command::new(binary()).args(["demo", "-C"]).arg(&s.root).output().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("{}/txbox-demo-", s.root.display())), "{stdout}");
    let left: Vec<_> = std::fs::read_dir(&s.root)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("txbox-demo-"))
        .collect();
    assert!(left.is_empty(), "the demo's scratch workspace is removed");
    let bad = Command::new(binary()).args(["demo", "-C"]).arg(s.root.join("missing")).output().unwrap();
    assert!(!bad.status.success(), "{}", describe(&bad));
}
