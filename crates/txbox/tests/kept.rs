//! Kept build output (#15): what a failed command wrote in kept directories (`target/`,
//! `__pycache__/`, ...) is committed anyway, through the same classification, commit-time
//! policy and journal as any commit, and listed as `kept`; nothing else of it is. The variants
//! an attacker would try: a symlink named `target`, setuid bits and file capabilities in it, a
//! hard link to a setuid file outside it, git hooks dressed as a cache directory, a hooks path
//! pointing into `target/`. As root and unprivileged, warm and cold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Output;

use common::*;

/// `txbox --json run -C WS [EXTRA] -- bash -c SCRIPT` as `who`, cold when asked.
fn run(who: As, s: &Scratch, extra: &[&str], script: &str, cold: bool) -> (Output, serde_json::Value) {
    run_at(who, &s.root, &s.ws, &s.state, extra, script, cold)
}

fn run_at(
    who: As,
    root: &Path,
    ws: &Path,
    state: &Path,
    extra: &[&str],
    script: &str,
    cold: bool,
) -> (Output, serde_json::Value) {
    let mut cmd = txbox_command(who);
    if who != As::Me {
        cmd.env("HOME", root);
    }
    if cold {
        cmd.env("TXBOX_WARM", "0");
    }
    // No configuration of the caller's changes what is kept here.
    let cfg = root.join("no-config.toml");
    std::fs::write(&cfg, "").unwrap();
    let out = cmd
        .env("TXBOX_CONFIG", &cfg)
        .arg("--state-dir")
        .arg(state)
        .args(["--json", "run", "-C"])
        .arg(ws)
        .args(extra)
        .args(["--", "bash", "-c", script])
        .current_dir(ws)
        .output()
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    (out, v)
}

/// Wait until a run has begun in `state` (its transaction directory exists).
fn wait_for_a_transaction(state: &Path) {
    let open = || {
        std::fs::read_dir(state.join("tx"))
            .map(|d| d.filter_map(Result::ok).any(|e| !e.file_name().to_string_lossy().starts_with('.')))
            .unwrap_or(false)
    };
    while !open() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Start `script` in the background; it may go on once the file `go` exists.
fn start_waiting(who: As, s: &Scratch, go: &Path, then: &str) -> std::thread::JoinHandle<(Output, serde_json::Value)> {
    let script = format!("until [ -e {} ]; do sleep 0.05; done; {then}", go.display());
    let (root, ws, state) = (s.root.clone(), s.ws.clone(), s.state.clone());
    let h = std::thread::spawn(move || run_at(who, &root, &ws, &state, &[], &script, true));
    wait_for_a_transaction(&s.state);
    h
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn last_audit(who: As, s: &Scratch) -> serde_json::Value {
    let out = txbox(who, s, &["--json", "log", "-n", "1"]);
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    v[0].clone()
}

#[test]
fn a_failed_command_keeps_build_output_and_nothing_else() {
    for who in identities() {
        for cold in [false, true] {
            let s = Scratch::for_who(who, "kept-basic");
            native(who, &s.ws, "mkdir -p src pkg web/node_modules && echo old > src/a.txt && echo 'x = 1' > pkg/m.py");
            let script =
                "mkdir -p target/debug pkg/__pycache__ web/node_modules/.cache/b && echo bin > target/debug/app \
                 && echo pyc > pkg/__pycache__/m.pyc && echo c > web/node_modules/.cache/b/x \
                 && echo other > notes.txt && mkdir -p gen/target && echo g > gen/target/x && exit 3";
            let (out, j) = run(who, &s, &[], script, cold);
            let at = format!("{who:?} cold={cold}: {}", describe(&out));
            assert_eq!(out.status.code(), Some(3), "the command's status stands: {at}");
            assert_eq!(j["outcome"], "rolled_back", "{at}");
            assert_eq!(strings(&j["kept"]), ["pkg/__pycache__", "target", "web/node_modules/.cache"], "{at}");
            assert_eq!(std::fs::read_to_string(s.ws.join("target/debug/app")).unwrap(), "bin\n", "{at}");
            assert_eq!(std::fs::read_to_string(s.ws.join("pkg/__pycache__/m.pyc")).unwrap(), "pyc\n", "{at}");
            assert!(s.ws.join("web/node_modules/.cache/b/x").exists(), "{at}");
            // Everything else is rolled back: the new file, and a kept name inside a new
            // directory (gen/ is new: keeping gen/target would make gen/ too).
            assert!(!s.ws.join("notes.txt").exists() && !s.ws.join("gen").exists(), "{at}");
            let added = strings(&j["changes"]["added"]);
            assert!(added.contains(&"target/debug/app".to_string()) && !added.contains(&"notes.txt".into()), "{at}");
            let e = last_audit(who, &s);
            assert_eq!(e["outcome"], "rolled_back", "{at}: {e}");
            assert_eq!(e["kept_only"], true, "{at}: {e}");
            assert_eq!(strings(&e["kept"]).len(), 3, "{at}: {e}");
            let verify = txbox(who, &s, &["log", "--verify"]);
            assert!(verify.status.success(), "{at}: {}", describe(&verify));
            // A failed command that also changed an existing file keeps nothing: rolled back,
            // the file is older than output built from its new content.
            let (out, j) = run(who, &s, &[], "echo new > src/a.txt && echo bin2 > target/debug/app; exit 1", cold);
            assert!(j.get("kept").is_none(), "{at}: {}", describe(&out));
            assert!(j["kept_error"].as_str().is_some_and(|e| e.contains("src/a.txt")), "{j}");
            assert!(String::from_utf8_lossy(&out.stderr).contains("not kept"), "{}", describe(&out));
            assert_eq!(std::fs::read_to_string(s.ws.join("target/debug/app")).unwrap(), "bin\n", "{at}");
            assert_eq!(std::fs::read_to_string(s.ws.join("src/a.txt")).unwrap(), "old\n", "{at}");
        }
    }
}

#[test]
fn no_keep_and_an_empty_configuration_keep_nothing() {
    for who in identities() {
        let s = Scratch::for_who(who, "kept-off");
        let (out, j) = run(who, &s, &["--no-keep"], "mkdir target && echo x > target/x; exit 1", false);
        assert_eq!(j["outcome"], "rolled_back", "{}", describe(&out));
        assert!(j.get("kept").is_none(), "{j}");
        assert!(!s.ws.join("target").exists(), "{who:?}: --no-keep kept target/");
        // `keep = []` in the configuration: the same.
        let cfg = s.root.join("keep-off.toml");
        std::fs::write(&cfg, "keep = []\n").unwrap();
        let mut cmd = txbox_command(who);
        if who != As::Me {
            cmd.env("HOME", &s.root);
        }
        let out = cmd
            .env("TXBOX_CONFIG", &cfg)
            .arg("--state-dir")
            .arg(&s.state)
            .args(["run", "-C"])
            .arg(&s.ws)
            .args(["-c", "mkdir target && echo x > target/x; exit 1"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
        assert!(!s.ws.join("target").exists(), "{who:?}: keep = [] kept target/");
    }
}

#[test]
fn a_symlink_named_like_a_kept_directory_keeps_nothing() {
    for who in identities() {
        let s = Scratch::for_who(who, "kept-symlink");
        // Made by the failed command: a symlink out of the workspace, and one inside it.
        native(who, &s.ws, "mkdir real");
        let script = "ln -s /etc target && mkdir -p pkg && ln -s ../real pkg/__pycache__ && echo x > real/y; exit 1";
        let (out, j) = run(who, &s, &[], script, false);
        assert!(j.get("kept").is_none(), "{who:?}: {}", describe(&out));
        assert!(std::fs::symlink_metadata(s.ws.join("target")).is_err(), "{who:?}: a symlink target/ was kept");
        assert!(!s.ws.join("real/y").exists(), "{who:?}: written through a kept-looking symlink");
        // Already in the workspace: writing through it changes the directory it points to,
        // which is not kept.
        native(who, &s.ws, "ln -s real target");
        let (out, j) = run(who, &s, &[], "echo x > target/through; exit 1", false);
        assert!(j.get("kept").is_none(), "{who:?}: {}", describe(&out));
        assert!(!s.ws.join("real/through").exists(), "{who:?}: written through the workspace's symlink");
        // Replaced by a real directory in a failed command: the symlink is not kept away.
        let (out, j) = run(who, &s, &[], "rm target && mkdir target && echo x > target/x; exit 1", false);
        assert!(j.get("kept").is_none(), "{who:?}: {}", describe(&out));
        assert!(std::fs::symlink_metadata(s.ws.join("target")).unwrap().file_type().is_symlink());
    }
}

#[test]
fn kept_files_lose_setuid_and_capabilities_as_any_commit() {
    for who in identities() {
        let s = Scratch::for_who(who, "kept-suid");
        let script = r#"
mkdir -p target && cp /bin/true target/su && cp /bin/true outside && cp /bin/true target/cap
python3 - <<'PY'
import os
# Set by a program, not spelled in the command: the string policy cannot see these.
os.chmod('target/su', 0o4755)
os.chmod('outside', 0o6755)
os.link('outside', 'target/linked')
try:
    os.setxattr('target/cap', 'security.capability', bytes([1, 0, 0, 2, 0, 0x20, 0, 0] + [0] * 12))
except OSError:
    pass
PY
exit 1"#;
        let (out, j) = run(who, &s, &[], script, false);
        let at = format!("{who:?}: {}", describe(&out));
        assert_eq!(strings(&j["kept"]), ["target"], "{at}");
        for f in ["target/su", "target/linked", "target/cap"] {
            let md = std::fs::metadata(s.ws.join(f)).unwrap_or_else(|e| panic!("{f}: {e}: {at}"));
            assert_eq!(md.mode() & 0o7000, 0, "{f} kept a setuid/setgid bit: {at}");
        }
        assert!(!s.ws.join("outside").exists(), "{at}");
        let mut buf = [0u8; 64];
        assert!(
            rustix::fs::getxattr(s.ws.join("target/cap"), "security.capability", &mut buf).is_err(),
            "a file capability was kept: {at}"
        );
        // The kept directory itself is an ordinary directory of the committing user.
        let md = std::fs::symlink_metadata(s.ws.join("target")).unwrap();
        assert!(md.is_dir() && md.permissions().mode() & 0o7000 == 0, "{at}");
    }
}

#[test]
fn hooks_dressed_as_build_output_are_never_kept() {
    for who in identities() {
        let s = Scratch::for_who(who, "kept-hooks");
        native(who, &s.ws, "git init -q . && mkdir -p target");
        let hooks_before = std::fs::read_dir(s.ws.join(".git/hooks")).unwrap().count();
        // Inside .git: a cache directory's name does not make it build output.
        let script = "mkdir -p .git/hooks/__pycache__ .git/target && echo evil > .git/hooks/__pycache__/x \
                      && echo evil > .git/target/x && printf '#!/bin/sh\\necho pwned\\n' > .git/hooks/pre-commit \
                      && chmod +x .git/hooks/pre-commit; exit 1";
        let (out, j) = run(who, &s, &[], script, false);
        assert!(j.get("kept").is_none(), "{who:?}: {}", describe(&out));
        assert!(!s.ws.join(".git/hooks/pre-commit").exists() && !s.ws.join(".git/hooks/__pycache__").exists());
        assert_eq!(std::fs::read_dir(s.ws.join(".git/hooks")).unwrap().count(), hooks_before);
        // A repository inside a kept directory: its hooks are judged as hooks and hold the
        // kept content, so nothing is kept.
        let script = "mkdir -p target/sub.git/hooks target/debug && echo bin > target/debug/app \
                      && printf '#!/bin/sh\\n' > target/sub.git/hooks/update; exit 1";
        let (out, j) = run(who, &s, &[], script, false);
        assert!(j.get("kept").is_none(), "{who:?}: {}", describe(&out));
        assert!(j["kept_error"].as_str().is_some_and(|e| e.contains("hook")), "{who:?}: {j}");
        assert!(!s.ws.join("target/debug/app").exists(), "{who:?}: kept despite a hook in it");
        // The repository's hooks path points into target/: what lands there is a hook.
        native(who, &s.ws, "git config core.hooksPath target/hooks");
        let script = "mkdir -p target/hooks && printf '#!/bin/sh\\n' > target/hooks/pre-commit; exit 1";
        let (out, j) = run(who, &s, &[], script, false);
        assert!(j.get("kept").is_none(), "{who:?}: {}", describe(&out));
        assert!(!s.ws.join("target/hooks").exists(), "{who:?}: a hook landed through the hooks path");
    }
}

#[test]
fn kept_directories_are_last_writer_wins() {
    for who in identities() {
        let s = Scratch::for_who(who, "kept-lww");
        native(who, &s.ws, "mkdir -p target && echo base > target/x && echo base > src.txt");
        let go = s.root.join("go");
        // The first run begins, then writes only once a second has committed the same path.
        let first = start_waiting(who, &s, &go, "echo first > target/x");
        let (out, j) = run(who, &s, &[], "echo second > target/x", true);
        assert_eq!(j["outcome"], "committed", "{}", describe(&out));
        std::fs::write(&go, "").unwrap();
        let (out, j) = first.join().unwrap();
        assert_eq!(j["outcome"], "committed", "{who:?}: kept paths must not conflict: {}", describe(&out));
        assert_eq!(std::fs::read_to_string(s.ws.join("target/x")).unwrap(), "first\n");
        assert_eq!(strings(&j["kept"]), ["target"]);
        let e = last_audit(who, &s);
        assert_eq!((e["outcome"].as_str(), e["kept_only"].as_bool()), (Some("committed"), Some(true)), "{e}");
        // The same race on an ordinary path is still a conflict.
        std::fs::remove_file(&go).unwrap();
        let first = start_waiting(who, &s, &go, "echo first > src.txt");
        let (_, j) = run(who, &s, &[], "echo second > src.txt", true);
        assert_eq!(j["outcome"], "committed");
        std::fs::write(&go, "").unwrap();
        let (_, j) = first.join().unwrap();
        assert_eq!(j["outcome"], "conflict", "{who:?}: {j}");
        // A commit of both: not kept only.
        let (_, j) = run(who, &s, &[], "echo third > target/x && echo third > src.txt", true);
        assert_eq!(j["outcome"], "committed");
        assert_eq!(last_audit(who, &s).get("kept_only"), None, "{j}");
    }
}

/// A tiny crate whose test fails.
fn tiny_crate(who: As, s: &Scratch) {
    native(
        who,
        &s.ws,
        "mkdir -p src && printf '[package]\\nname = \"tiny\"\\nversion = \"0.1.0\"\\nedition = \"2021\"\\n' > Cargo.toml \
         && printf 'pub fn two() -> u32 { 2 }\\n#[test]\\nfn fails() { assert_eq!(two(), 3); }\\n' > src/lib.rs",
    );
}

#[test]
fn a_failing_cargo_test_run_twice_compiles_once() {
    // The toolchain of the user running the tests (root's is not readable by the test user,
    // whose variant below uses a stand-in build tool with the same freshness rule).
    let Ok(cargo) = std::env::var("CARGO") else { panic!("CARGO is not set: run the tests with cargo") };
    let s = Scratch::new("kept-cargo");
    tiny_crate(As::Me, &s);
    let script = format!("unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR; {cargo} test --offline 2>&1");
    let compiles = |j: &serde_json::Value| j["stdout"].as_str().unwrap().matches("Compiling tiny").count();
    let (out, j) = run(As::Me, &s, &[], &script, false);
    assert_ne!(out.status.code(), Some(0), "the test must fail: {}", describe(&out));
    assert_eq!(j["outcome"], "rolled_back", "{j}");
    assert_eq!(compiles(&j), 1, "{j}");
    assert_eq!(strings(&j["kept"]), ["target"], "{j}");
    let (out, j) = run(As::Me, &s, &[], &script, false);
    assert_ne!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(compiles(&j), 0, "the second run compiled again: {j}");
    assert!(j["stdout"].as_str().unwrap().contains("test result: FAILED"), "{j}");
    // Without kept output, every run compiles.
    let (_, j) = run(As::Me, &s, &["--no-keep"], &format!("rm -rf target; {script}"), false);
    assert_eq!(compiles(&j), 1, "{j}");
    assert!(s.ws.join("target").exists(), "--no-keep rolled back the deletion of target/ too");
}

/// A build tool that compiles `target/out` only when it is missing or older than its source,
/// then runs a test that fails: the shape of `cargo test`, for an identity without a toolchain.
const STAND_IN: &str = r#"
mkdir -p target
if [ ! target/out -nt src/lib.rs ]; then echo "Compiling tiny" >&2; cp src/lib.rs target/out; fi
echo "test result: FAILED" >&2; exit 101
"#;

#[test]
fn a_failing_build_run_twice_builds_once_unprivileged_too() {
    for who in identities() {
        for cold in [false, true] {
            let s = Scratch::for_who(who, "kept-standin");
            tiny_crate(who, &s);
            let compiles = |j: &serde_json::Value| j["stderr"].as_str().unwrap().matches("Compiling tiny").count();
            let (out, j) = run(who, &s, &[], STAND_IN, cold);
            assert_eq!(out.status.code(), Some(101), "{who:?}: {}", describe(&out));
            assert_eq!(compiles(&j), 1, "{j}");
            let (out, j) = run(who, &s, &[], STAND_IN, cold);
            assert_eq!(out.status.code(), Some(101), "{}", describe(&out));
            assert_eq!(compiles(&j), 0, "{who:?} cold={cold}: built again: {j}");
            // A failed run that edits the source builds from the edit, and keeps nothing: kept,
            // that output would look newer than the restored source, and be used.
            let (_, j) = run(who, &s, &[], &format!("echo '// edit' >> src/lib.rs; {STAND_IN}"), cold);
            assert_eq!(compiles(&j), 1, "{j}");
            assert!(j.get("kept").is_none(), "{j}");
            assert!(!std::fs::read_to_string(s.ws.join("src/lib.rs")).unwrap().contains("edit"));
            assert!(!std::fs::read_to_string(s.ws.join("target/out")).unwrap().contains("edit"), "stale output kept");
        }
    }
}

/// A failed command that only kept build output is not the last commit for `txbox undo`: the
/// undo takes back the real commit before it, and the kept output stays (#15, #16).
#[test]
fn undo_passes_over_a_transaction_that_only_kept_build_output() {
    for who in identities() {
        for cold in [false, true] {
            let at = format!("{who:?} cold={cold}");
            let s = Scratch::for_who(who, "kept-undo");
            let (_, first) = run(who, &s, &[], "echo v1 > src.txt", cold);
            assert_eq!(first["outcome"], "committed", "{at}: {first}");
            let (_, real) = run(who, &s, &[], "echo v2 > src.txt", cold);
            assert_eq!(real["outcome"], "committed", "{at}: {real}");
            let (_, failed) = run(who, &s, &[], "mkdir -p target && echo obj > target/out.o; exit 1", cold);
            assert_eq!(failed["outcome"], "rolled_back", "{at}: {failed}");
            assert_eq!(failed["kept"], serde_json::json!(["target"]), "{at}: {failed}");
            let mut cmd = txbox_command(who);
            if who != As::Me {
                cmd.env("HOME", &s.root);
            }
            let out = cmd
                .arg("--state-dir")
                .arg(&s.state)
                .args(["--json", "undo", "-C"])
                .arg(&s.ws)
                .current_dir(&s.ws)
                .output()
                .unwrap();
            let u: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{at}: {e}: {}", describe(&out)));
            assert_eq!(u["outcome"], "committed", "{at}: {u}");
            assert_eq!(std::fs::read_to_string(s.ws.join("src.txt")).unwrap(), "v1\n", "{at}: the real commit undone");
            assert_eq!(
                std::fs::read_to_string(s.ws.join("target/out.o")).unwrap(),
                "obj\n",
                "{at}: the kept output is not what undo took back"
            );
        }
    }
}
