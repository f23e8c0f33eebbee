//! Integration tests of `txbox run` with the real binary in real namespaces, as root and as an
//! unprivileged user: what a commit must reproduce, rollback, exit statuses, JSON, audit log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;

/// A workspace with every kind of entry a commit must get right.
const POPULATE: &str = r#"
set -e
mkdir -p src docs old/deep empty keepdir/sub
printf '# demo\n' > README.md
printf 'fn main() {}\n' > src/main.rs
printf 'pub fn f() {}\n' > src/lib.rs
printf '#!/bin/sh\necho build\n' > build.sh && chmod 755 build.sh
printf 'x\n' > old/deep/x.txt
printf 'keep\n' > old/keep.txt
printf 'space\n' > 'docs/a b.txt'
printf 'k\n' > keepdir/sub/k.txt
ln -s src/main.rs link-to-main
ln -s does/not/exist dangling
printf 'odd\n' > "$(printf 'odd-\377-name')"
ln README.md README.hardlink
python3 -c "import os; os.setxattr('src/lib.rs', 'user.note', b'lib')"
"#;

/// Every kind of change: content, creation, deletion, dir replaced, type changes, symlinks,
/// modes, renames, odd names, hard links, xattrs, empty dirs, an 8 MB file, a 64 MiB sparse file.
const CHANGES: &str = r#"
set -e
printf 'fn main() { println!("changed"); }\n' > src/main.rs
printf 'pub fn g() {}\n' >> src/lib.rs
echo new > new.txt
mkdir -p gen/a/b && echo deep > gen/a/b/c.txt
rm build.sh
rm -r old && mkdir old && echo 'dir replaced' > old/fresh.txt
rm link-to-main && ln -s src/lib.rs link-to-main
ln -s new.txt link-new
rm -r empty && echo 'file where a dir was' > empty
rm README.md.missing 2>/dev/null || true
rm -f dangling && mkdir dangling
chmod 600 src/lib.rs
chmod 700 keepdir
mv 'docs/a b.txt' 'docs/renamed file.txt'
printf 'line\nwith newline\n' > "$(printf 'nl\nname')"
printf 'bytes\n' > "$(printf 'new-\376\377')"
ln gen/a/b/c.txt gen/hard
mkdir emptynew
seq 1 1200000 > data.bin
truncate -s 64M sparse.bin
python3 -c "import os; os.setxattr('new.txt', 'user.origin', b'agent'); os.setxattr('src/main.rs', 'user.mine', b'kept')"
python3 -c "import os; os.removexattr('src/lib.rs', 'user.note')"
"#;

#[test]
fn commit_reproduces_native_execution_exactly() {
    for who in identities() {
        let s = Scratch::new("exact");
        let reference = s.root.join("ref");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        native(who, &s.ws, POPULATE);
        copy_tree(&s.ws, &reference);
        native(who, &reference, CHANGES);
        let (out, j) = run_json(who, &s, CHANGES);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert_eq!(j["outcome"], "committed", "{who:?}: {j}");
        let got = digest(&s.ws, &[]);
        let want = digest(&reference, &[]);
        assert!(got == want, "{who:?}: committed tree differs from native execution:\n{}", diff(&got, &want));
        let added: Vec<&str> = j["changes"]["added"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        let modified: Vec<&str> =
            j["changes"]["modified"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        let deleted: Vec<&str> =
            j["changes"]["deleted"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        assert!(added.contains(&"new.txt") && added.contains(&"gen/a/b/c.txt") && added.contains(&"emptynew"), "{j}");
        assert!(
            modified.contains(&"src/main.rs") && modified.contains(&"empty") && modified.contains(&"keepdir"),
            "{j}"
        );
        assert!(deleted.contains(&"build.sh") && deleted.contains(&"old/keep.txt"), "{j}");
        for untouched in ["README.md", "README.hardlink", "src", "docs/a b.txt.missing", "keepdir/sub/k.txt"] {
            assert!(!added.contains(&untouched) && !modified.contains(&untouched), "{untouched} reported: {j}");
        }
        // Sparse stays sparse: 64 MiB of holes must not turn into 64 MiB of blocks.
        let md = std::fs::metadata(s.ws.join("sparse.bin")).unwrap();
        assert_eq!(md.len(), 64 << 20);
        assert!(md.blocks() * 512 < 1 << 20, "sparse file was filled in: {} blocks", md.blocks());
        if let As::User(uid) = who {
            assert_eq!(
                std::fs::metadata(s.ws.join("new.txt")).unwrap().uid(),
                uid,
                "committed file not owned by the user"
            );
        }
        // No overlay bookkeeping reaches the workspace.
        let listing = format!("{:?}", digest(&s.ws, &[]));
        assert!(
            !listing.contains("user.overlay.overlay") && !listing.contains("\"user.overlay.opaque"),
            "overlay xattrs committed"
        );
    }
}

#[test]
fn failure_rolls_back_everything_and_passes_the_status_through() {
    for who in identities() {
        let s = Scratch::new("rollback");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        native(who, &s.ws, POPULATE);
        let before = digest(&s.ws, &[]);
        let (out, j) = run_json(who, &s, &format!("{CHANGES}\necho visible; echo err >&2; exit 7"));
        assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
        assert_eq!(j["outcome"], "rolled_back");
        assert_eq!(j["rollback_reason"], "exit_status");
        assert_eq!(j["exit_code"], 7);
        assert_eq!(j["stdout"], "visible\n");
        assert_eq!(j["stderr"], "err\n");
        let after = digest(&s.ws, &[]);
        assert!(before == after, "{who:?}: rollback left traces:\n{}", diff(&before, &after));
        // Nothing of the transaction is left in the state directory.
        // The layer is deleted in the background after the run returns; give it a moment.
        let mut leftovers = Vec::new();
        for _ in 0..100 {
            leftovers = std::fs::read_dir(s.state.join("tx")).unwrap().map(|e| e.unwrap().file_name()).collect();
            if leftovers.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(leftovers.is_empty(), "transaction directory left behind: {leftovers:?}");
    }
}

#[test]
fn exit_statuses_follow_the_contract() {
    let s = Scratch::new("status");
    let (out, j) = run_json(As::Me, &s, "kill -TERM $$");
    assert_eq!(out.status.code(), Some(128 + 15), "{}", describe(&out));
    assert_eq!(j["signal"], 15);
    assert_eq!(j["outcome"], "rolled_back");
    let ws = s.ws.to_str().unwrap();
    let out = txbox(As::Me, &s, &["--json", "run", "-C", ws, "--timeout", "0.5", "--", "sleep", "30"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(124), "{}", describe(&out));
    assert_eq!((j["timed_out"].as_bool(), j["rollback_reason"].as_str()), (Some(true), Some("timeout")));
    let out = txbox(As::Me, &s, &["run", "-C", ws, "--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(127), "{}", describe(&out));
    let out = txbox(As::Me, &s, &["run", "-C", ws]);
    // A usage error (docs/DESIGN.md §3: exit 2), nothing ran; 125 is for txbox failing.
    assert_eq!(out.status.code(), Some(2), "nothing to run is a usage error: {}", describe(&out));
}

#[test]
fn timeout_leaves_no_process_behind() {
    let s = Scratch::new("timeout");
    let marker = format!("txbox-orphan-{}", std::process::id());
    let ws = s.ws.to_str().unwrap();
    let script = format!("(exec -a {marker} sleep 300) & (exec -a {marker} sleep 300) & wait");
    let out = txbox(As::Me, &s, &["run", "-C", ws, "--timeout", "0.5", "-c", &script]);
    assert_eq!(out.status.code(), Some(124), "{}", describe(&out));
    std::thread::sleep(std::time::Duration::from_millis(200));
    let ps = std::process::Command::new("pgrep").args(["-f", &marker]).output().unwrap();
    assert!(ps.stdout.is_empty(), "processes survived the transaction: {}", String::from_utf8_lossy(&ps.stdout));
}

#[test]
fn argv_form_and_human_output() {
    let s = Scratch::new("argv");
    let ws = s.ws.to_str().unwrap();
    // Arguments are taken literally: no shell expansion in the argv form.
    let out = txbox(As::Me, &s, &["run", "-C", ws, "--", "sh", "-c", "echo \"$0\" > out.txt; echo to-stdout", "$HOME"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "to-stdout\n", "command output must stream through unchanged");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("txbox: committed tx ") && err.contains("(+1 ~0 -0)"), "summary line: {err}");
    assert_eq!(std::fs::read_to_string(s.ws.join("out.txt")).unwrap(), "$HOME\n");
}

#[test]
fn denied_commands_run_nothing_and_are_logged() {
    let s = Scratch::new("deny");
    let marker = s.root.join("ran");
    let (out, j) = run_json(As::Me, &s, &format!("touch {}; rm -rf /", marker.display()));
    assert_eq!(out.status.code(), Some(126), "{}", describe(&out));
    assert_eq!(j["outcome"], "denied");
    assert_eq!(j["decision"]["action"], "deny");
    assert!(j["decision"]["rule"].as_str().is_some_and(|r| !r.is_empty()), "{j}");
    assert!(!marker.exists(), "a denied command ran");
    let log = txbox(As::Me, &s, &["--json", "log"]);
    let entries: serde_json::Value = serde_json::from_slice(&log.stdout).unwrap();
    assert_eq!(entries[0]["outcome"], "denied");
    assert_eq!(entries[0]["rule"], j["decision"]["rule"]);
}

#[test]
fn audit_log_chains_and_detects_tampering() {
    let s = Scratch::new("audit");
    run_json(As::Me, &s, "echo a > a");
    run_json(As::Me, &s, "echo b > b; exit 2");
    run_json(As::Me, &s, "rm -rf /");
    let log = txbox(As::Me, &s, &["--json", "log", "-n", "2"]);
    let entries: serde_json::Value = serde_json::from_slice(&log.stdout).unwrap();
    let outcomes: Vec<&str> = entries.as_array().unwrap().iter().filter_map(|e| e["outcome"].as_str()).collect();
    assert_eq!(outcomes, ["rolled_back", "denied"]);
    assert_eq!(entries[0]["exit_code"], 2);
    let ok = txbox(As::Me, &s, &["log", "--verify"]);
    assert_eq!(ok.status.code(), Some(0), "{}", describe(&ok));
    let path = s.state.join("audit.log");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("\"rolled_back\"", "\"committed\"", 1)).unwrap();
    let bad = txbox(As::Me, &s, &["log", "--verify"]);
    assert_eq!(bad.status.code(), Some(1), "tampering went unnoticed: {}", describe(&bad));
}

#[test]
fn default_state_dir_is_invisible_and_never_committed() {
    for who in identities() {
        let s = Scratch::new("hidden");
        let home = s.root.join("home");
        std::fs::create_dir_all(&home).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let ws = s.ws.to_str().unwrap().to_string();
        // No --state-dir: the state lives in $HOME/.local/state/txbox, which the command must
        // not see, and nothing of it appears in the workspace.
        let mut cmd = txbox_command(who);
        let script = "ls -A ~/.local/state/txbox; echo x > ~/.local/state/txbox/evil || echo refused; echo ok > f";
        let out = cmd
            .args(["--json", "run", "-C", &ws, "-c", script])
            .current_dir(&s.ws)
            .env("HOME", &home)
            .env_remove("TXBOX_STATE_DIR")
            .env_remove("XDG_STATE_HOME")
            .output()
            .unwrap();
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
        assert_eq!(j["outcome"], "committed", "{who:?}: {j}");
        assert_eq!(j["stdout"], "refused\n", "{who:?}: the state directory was visible or writable: {j}");
        let state = home.join(".local/state/txbox");
        assert!(!state.join("evil").exists());
        assert!(state.join("audit.log").exists());
        assert!(!s.ws.join(".txbox").exists(), "{who:?}: state in the workspace");
        assert_eq!(std::fs::read_to_string(s.ws.join("f")).unwrap(), "ok\n");
    }
}

#[test]
fn setuid_bits_and_special_files_are_not_committed() {
    let s = Scratch::new("special");
    // Through Python, so the policy (which refuses `chmod u+s`) does not see it: the commit
    // itself must strip the bits.
    let (out, j) = run_json(
        As::Me,
        &s,
        "echo x > tool; mkfifo pipe; mkdir d; python3 -c \"import os; os.chmod('tool', 0o4755); os.chmod('d', 0o1777)\"",
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(std::fs::metadata(s.ws.join("tool")).unwrap().permissions().mode() & 0o7777, 0o755);
    assert_eq!(std::fs::metadata(s.ws.join("d")).unwrap().permissions().mode() & 0o7777, 0o777);
    assert!(!s.ws.join("pipe").exists(), "a FIFO was committed");
    assert_eq!(j["skipped"][0], "pipe", "{j}");
}

#[test]
fn workspace_below_tmp_and_with_odd_path() {
    let mut name = format!("/tmp/txbox it,{}:", std::process::id()).into_bytes();
    name.push(0xff);
    let base = std::path::PathBuf::from(std::ffi::OsString::from_vec(name));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let out = std::process::Command::new(binary())
        .arg("--json")
        .arg("run")
        .arg("-C")
        .arg(&base)
        .args(["-c", "echo hi > made"])
        .output()
        .unwrap();
    let ok = out.status.code() == Some(0) && std::fs::read_to_string(base.join("made")).ok().as_deref() == Some("hi\n");
    let _ = std::fs::remove_dir_all(&base);
    assert!(ok, "{}", describe(&out));
}
