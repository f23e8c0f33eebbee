//! Sessions, savepoints, conflicts and crash recovery, through the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::MetadataExt;

use common::*;
use proptest::prelude::*;

fn begin(who: As, s: &Scratch) -> String {
    let ws = s.ws.to_str().unwrap().to_string();
    let out = txbox(who, s, &["begin", "-C", &ws]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(id.len(), 16, "begin must print the id alone: {id:?}");
    id
}

fn exec(who: As, s: &Scratch, tx: &str, script: &str) -> i32 {
    txbox(who, s, &["exec", tx, "-c", script]).status.code().unwrap_or(-1)
}

#[test]
fn steps_are_savepoints_and_failed_steps_are_undone_alone() {
    for who in identities() {
        let s = Scratch::new("steps");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        native(who, &s.ws, "echo base > keep.txt; mkdir d; echo x > d/x");
        let before = digest(&s.ws, &[]);
        let tx = begin(who, &s);
        assert_eq!(exec(who, &s, &tx, "echo one > one.txt"), 0);
        assert_eq!(exec(who, &s, &tx, "echo two > two.txt; rm keep.txt; exit 4"), 4);
        assert_eq!(
            exec(
                who,
                &s,
                &tx,
                "test -f one.txt && test ! -f two.txt && test -f keep.txt && echo three > three.txt && rm -r d"
            ),
            0
        );
        assert!(digest(&s.ws, &[]) == before, "{who:?}: an open transaction touched the workspace");
        let out = txbox(who, &s, &["--json", "diff", &tx]);
        let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
        assert_eq!(d["added"], serde_json::json!(["one.txt", "three.txt"]), "{d}");
        assert_eq!(d["deleted"], serde_json::json!(["d"]), "{d}");
        // Back to the savepoint after step 1: step 3 is gone, step 1 stays.
        let out = txbox(who, &s, &["rollback", &tx, "--to", "1"]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let out = txbox(who, &s, &["diff", &tx]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("+++ b/one.txt") && text.contains("+one") && !text.contains("three"), "{text}");
        let out = txbox(who, &s, &["commit", &tx]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert_eq!(std::fs::read_to_string(s.ws.join("one.txt")).unwrap(), "one\n");
        assert!(!s.ws.join("three.txt").exists() && s.ws.join("d/x").exists());
        let out = txbox(who, &s, &["commit", &tx]);
        assert_ne!(out.status.code(), Some(0), "a committed transaction cannot commit again");
        assert!(String::from_utf8_lossy(&out.stderr).contains("unknown transaction"), "{}", describe(&out));
    }
}

/// What a step did to directories' own attributes is seen by the next step and committed: the
/// workspace root's mode and extended attributes, and a directory's extended attributes set in
/// a later step than the one that made it. Before, each step's upper root mirrored the
/// workspace root (the next step saw the root as it was before the session), and joining the
/// steps' layers copied a directory's mode and times but not its extended attributes: both
/// changes were lost at commit.
#[test]
fn directory_attributes_a_step_sets_are_seen_by_the_next_and_committed() {
    for who in identities() {
        let s = Scratch::new("step-attrs");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        std::fs::set_permissions(&s.ws, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let tx = begin(who, &s);
        assert_eq!(exec(who, &s, &tx, "chmod 750 . && mkdir d"), 0);
        let set = "python3 -c \"import os; [os.setxattr(p, 'user.step', b'2') for p in ('.', 'd')]\"";
        assert_eq!(exec(who, &s, &tx, set), 0);
        let check = "test \"$(stat -c %a .)\" = 750 && python3 -c \"import os, sys; \
                     sys.exit(any(os.getxattr(p, 'user.step') != b'2' for p in ('.', 'd')))\"";
        assert_eq!(exec(who, &s, &tx, check), 0, "{who:?}: the next step does not see what the last two did");
        // Root gives the directory away in a later step too.
        let owner = (who == As::Me && is_root()).then_some((4321, 4321));
        if owner.is_some() {
            assert_eq!(exec(who, &s, &tx, "chown 4321:4321 d"), 0);
        }
        let out = txbox(who, &s, &["commit", &tx]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let mode = std::fs::metadata(&s.ws).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o750, "{who:?}: the root's mode");
        if let Some(o) = owner {
            let md = std::fs::metadata(s.ws.join("d")).unwrap();
            assert_eq!((md.uid(), md.gid()), o, "d's owner");
        }
        for p in [s.ws.clone(), s.ws.join("d")] {
            let mut v = vec![0u8; 16];
            let n = rustix::fs::lgetxattr(p.as_path(), "user.step", &mut v)
                .unwrap_or_else(|e| panic!("{who:?} {p:?}: {e}"));
            assert_eq!(&v[..n], b"2", "{who:?} {p:?}");
        }
    }
}

/// Set the user.* name `name` to `value` on `path` (as the caller of the test: the test user's
/// own files are set through `native`).
fn set_name(who: As, dir: &std::path::Path, path: &str, name: &str, value: &str) {
    native(who, dir, &format!("python3 -c \"import os; os.setxattr('{path}', '{name}', b'{value}')\""));
}

fn name_of(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let mut v = vec![0u8; 64];
    rustix::fs::lgetxattr(path, name, &mut v).ok().map(|n| v[..n].to_vec())
}

/// A directory whose mode takes away its owner's write permission and which carries a user.*
/// name: an ordinary user can set such a name only while the directory is writable, so every
/// copy of the directory's attributes (the run's upper root, a session's next step, the squash
/// at commit) sets the names first and the mode last. Before, as the unprivileged user, every
/// run in such a workspace failed (125), and the session's commit failed after its status said
/// "committing", so the next command discarded the whole session.
#[test]
fn directories_without_owner_write_keep_their_names_through_runs_and_sessions() {
    for who in identities() {
        let s = Scratch::new("ro-named");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        native(who, &s.ws, "echo a > f");
        set_name(who, &s.ws, ".", "user.x", "root");
        native(who, &s.ws, "chmod 555 .");
        let ws = s.ws.to_str().unwrap().to_string();
        let out = txbox(who, &s, &["run", "-C", &ws, "--", "cat", "f"]);
        assert_eq!((out.status.code(), out.stdout.as_slice()), (Some(0), &b"a\n"[..]), "{who:?}: {}", describe(&out));
        assert_eq!(std::fs::metadata(&s.ws).unwrap().mode() & 0o7777, 0o555);
        assert_eq!(name_of(&s.ws, "user.x").as_deref(), Some(&b"root"[..]), "{who:?}");
        native(who, &s.ws, "chmod 755 . && mkdir d e");
        // A run names a directory and takes its owner's write permission away: committed
        // whole. Before, as the unprivileged user, the commit stopped after its commit point
        // (the mode set, the name refused) and recovery could never finish it: every later
        // command on the workspace failed.
        let named = "python3 -c \"import os; os.setxattr('d', 'user.x', b'run')\" && chmod 555 d";
        let out = txbox(who, &s, &["run", "-C", &ws, "-c", named]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        let d = s.ws.join("d");
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o7777, 0o555, "{who:?}");
        assert_eq!(name_of(&d, "user.x").as_deref(), Some(&b"run"[..]), "{who:?}");
        let out = txbox(who, &s, &["recover", "-C", &ws]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        native(who, &s.ws, "chmod 755 d");
        // The same in a session's later step, beside other work; then the root left without
        // owner write and with a name of its own: the next step works, and the commit lands.
        let tx = begin(who, &s);
        assert_eq!(exec(who, &s, &tx, "echo keep > e/work.txt"), 0);
        let named = "python3 -c \"import os; os.setxattr('d', 'user.x', b'd')\" && chmod 555 d";
        assert_eq!(exec(who, &s, &tx, named), 0, "{who:?}");
        let root = "python3 -c \"import os; os.setxattr('.', 'user.x', b'step')\" && chmod 555 .";
        assert_eq!(exec(who, &s, &tx, root), 0, "{who:?}");
        assert_eq!(exec(who, &s, &tx, "test \"$(cat e/work.txt)\" = keep"), 0, "{who:?}: the next step");
        let out = txbox(who, &s, &["commit", &tx]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert_eq!(std::fs::read_to_string(s.ws.join("e/work.txt")).unwrap(), "keep\n");
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o7777, 0o555, "{who:?}");
        assert_eq!(name_of(&d, "user.x").as_deref(), Some(&b"d"[..]), "{who:?}");
        assert_eq!(std::fs::metadata(&s.ws).unwrap().mode() & 0o7777, 0o555, "{who:?}");
        assert_eq!(name_of(&s.ws, "user.x").as_deref(), Some(&b"step"[..]), "{who:?}");
        native(who, &s.ws, "chmod 755 . d");
    }
}

/// An access ACL sets the owner's mode bits from its owner entry: one that gives the owner no
/// write, set before a `user.*` name, took away the write permission the name needs. The names
/// go first and the ACLs last, at commit (after the commit point, where this stopped the commit
/// and wedged recovery) and in a session's layers (where it failed the squash and lost the
/// session). The ACL is the one an attacking command would set: owner r-x, itself rwx by name,
/// mask r-x.
#[test]
fn an_acl_that_takes_owner_write_away_does_not_stop_a_commit() {
    let acl = "import os, struct\n\
               os.setxattr('src', 'user.x', b'1')\n\
               ents = [(1, 5, 2**32 - 1), (2, 7, os.getuid()), (4, 5, 2**32 - 1), (0x10, 5, 2**32 - 1), (0x20, 5, 2**32 - 1)]\n\
               os.setxattr('src', 'system.posix_acl_access', struct.pack('<I', 2) + b''.join(struct.pack('<HHI', *e) for e in ents))\n";
    for who in identities() {
        let s = Scratch::new("acl-order");
        std::fs::create_dir_all(s.ws.join("src")).unwrap();
        std::fs::create_dir_all(s.ws.join("e")).unwrap();
        std::fs::write(s.root.join("acl.py"), acl).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let ws = s.ws.to_str().unwrap().to_string();
        let script = s.root.join("acl.py").to_str().unwrap().to_string();
        let out = txbox(who, &s, &["run", "-C", &ws, "--", "python3", &script]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        let out = txbox(who, &s, &["recover", "-C", &ws]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: recovery is stuck: {}", describe(&out));
        let src = s.ws.join("src");
        assert_eq!(std::fs::metadata(&src).unwrap().mode() & 0o777, 0o555, "{who:?}");
        assert_eq!(name_of(&src, "user.x").as_deref(), Some(&b"1"[..]), "{who:?}");
        assert!(name_of(&src, "system.posix_acl_access").is_some(), "{who:?}");
        // The same in a session's step, between others.
        native(
            who,
            &s.ws,
            "chmod 755 src && python3 -c \"import os; os.removexattr('src', 'system.posix_acl_access'); \
                               os.removexattr('src', 'user.x')\"",
        );
        let tx = begin(who, &s);
        assert_eq!(exec(who, &s, &tx, "echo a > e/a"), 0);
        assert_eq!(txbox(who, &s, &["exec", &tx, "--", "python3", &script]).status.code(), Some(0), "{who:?}");
        assert_eq!(exec(who, &s, &tx, "echo b > e/b"), 0);
        let out = txbox(who, &s, &["commit", &tx]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert_eq!(std::fs::metadata(&src).unwrap().mode() & 0o777, 0o555, "{who:?}");
        assert_eq!(name_of(&src, "user.x").as_deref(), Some(&b"1"[..]), "{who:?}");
        assert!(s.ws.join("e/a").exists() && s.ws.join("e/b").exists());
        native(who, &s.ws, "chmod 755 src");
    }
}

/// A directory a step left without owner write holds entries a later step changes: the squash
/// moves entries into and out of such directories (it failed there, after the session's status
/// said committing, and the next command discarded the session). Root commits it; an ordinary
/// user's commit cannot move entries out of such a directory (docs/DEVIATIONS.md) and is
/// refused before anything changes, the workspace left usable.
#[test]
fn a_step_may_change_entries_of_a_directory_an_earlier_step_made_read_only() {
    for who in identities() {
        let s = Scratch::new("ro-below");
        std::fs::create_dir_all(s.ws.join("d")).unwrap();
        std::fs::write(s.ws.join("d/x"), "0\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let tx = begin(who, &s);
        assert_eq!(exec(who, &s, &tx, "echo 1 > d/x && chmod 555 d"), 0);
        assert_eq!(exec(who, &s, &tx, "echo 2 > d/x"), 0);
        let out = txbox(who, &s, &["commit", &tx]);
        let mode = std::fs::metadata(s.ws.join("d")).unwrap().mode() & 0o777;
        let x = std::fs::read_to_string(s.ws.join("d/x")).unwrap();
        if who == As::Me && is_root() {
            assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
            assert_eq!((mode, x.as_str()), (0o555, "2\n"));
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("nothing was applied") && err.contains("cannot be written"), "{}", describe(&out));
            assert_eq!((mode, x.as_str()), (0o755, "0\n"), "{who:?}: the refused commit changed the workspace");
        }
        let ws = s.ws.to_str().unwrap().to_string();
        let out = txbox(who, &s, &["run", "-C", &ws, "-c", "cat d/x"]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: the workspace is not usable after: {}", describe(&out));
        native(who, &s.ws, "chmod 755 d");
    }
}

/// The workspace root's attributes changed on the host while a session is open are the host's:
/// a later step sees them, and the commit keeps them, when no step changed the root. Before,
/// every step copied the root from the first, so the commit put the first step's attributes
/// back: a `chmod 750` of the workspace made meanwhile was reopened to 755, a name removed,
/// and the result did not even list the root as changed. A root both sides changed is a
/// conflict (exit 3, nothing applied).
#[test]
fn the_workspace_roots_attributes_changed_meanwhile_are_not_undone() {
    for who in identities() {
        let s = Scratch::new("root-meanwhile");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        std::fs::set_permissions(&s.ws, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let tx = begin(who, &s);
        assert_eq!(exec(who, &s, &tx, "echo x > new1"), 0);
        native(who, &s.ws, "chmod 750 .");
        set_name(who, &s.ws, ".", "user.team", "a");
        let sees = "test \"$(stat -c %a .)\" = 750 && python3 -c \"import os, sys; \
                    sys.exit(os.getxattr('.', 'user.team') != b'a')\" && echo y > new2";
        assert_eq!(exec(who, &s, &tx, sees), 0, "{who:?}: the next step does not see the host's change");
        // And again after it: the base moved with the workspace root.
        native(who, &s.ws, "chmod 770 .");
        assert_eq!(exec(who, &s, &tx, "test \"$(stat -c %a .)\" = 770"), 0, "{who:?}");
        let out = txbox(who, &s, &["--json", "diff", &tx]);
        let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
        assert_eq!(d["modified"], serde_json::json!([]), "{who:?}: {d}");
        let out = txbox(who, &s, &["commit", &tx]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert_eq!(std::fs::metadata(&s.ws).unwrap().mode() & 0o7777, 0o770, "{who:?}: the host's mode was undone");
        assert_eq!(name_of(&s.ws, "user.team").as_deref(), Some(&b"a"[..]), "{who:?}: the host's name was removed");
        assert!(s.ws.join("new1").exists() && s.ws.join("new2").exists());

        // Back to a savepoint from before the host's change: the steps after it see the
        // workspace root as it is, and the commit keeps it (the base in effect for that step).
        native(who, &s.ws, "chmod 755 .");
        let tx = begin(who, &s);
        assert_eq!(exec(who, &s, &tx, "echo a > a1"), 0);
        native(who, &s.ws, "chmod 750 .");
        assert_eq!(exec(who, &s, &tx, "echo b > b1"), 0);
        let out = txbox(who, &s, &["rollback", &tx, "--to", "1"]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert_eq!(exec(who, &s, &tx, "test \"$(stat -c %a .)\" = 750 && echo c > c1"), 0, "{who:?}");
        let out = txbox(who, &s, &["commit", &tx]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert_eq!(std::fs::metadata(&s.ws).unwrap().mode() & 0o7777, 0o750, "{who:?}: undone after rollback --to");
        assert!(s.ws.join("a1").exists() && !s.ws.join("b1").exists() && s.ws.join("c1").exists());

        // Both changed the root: refused, nothing applied.
        native(who, &s.ws, "chmod 755 .");
        let tx = begin(who, &s);
        assert_eq!(exec(who, &s, &tx, "chmod 700 . && echo z > new3"), 0);
        assert_eq!(exec(who, &s, &tx, "test \"$(stat -c %a .)\" = 700"), 0, "{who:?}: the step's own change");
        native(who, &s.ws, "chmod 750 .");
        let before = digest(&s.ws, &[]);
        let out = txbox(who, &s, &["--json", "commit", &tx]);
        assert_eq!(out.status.code(), Some(3), "{who:?}: {}", describe(&out));
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["conflicts"], serde_json::json!(["."]), "{who:?}: {j}");
        assert!(digest(&s.ws, &[]) == before, "{who:?}: a refused commit changed the workspace");
        assert_eq!(std::fs::metadata(&s.ws).unwrap().mode() & 0o7777, 0o750);

        // The session changed the root and the host did not: the session's change lands.
        let tx = begin(who, &s);
        assert_eq!(exec(who, &s, &tx, "chmod 710 ."), 0);
        assert_eq!(exec(who, &s, &tx, "echo w > new4"), 0);
        let out = txbox(who, &s, &["commit", &tx]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert_eq!(std::fs::metadata(&s.ws).unwrap().mode() & 0o7777, 0o710, "{who:?}");
        native(who, &s.ws, "chmod 755 .");
    }
}

#[test]
fn first_committer_wins_and_disjoint_transactions_land() {
    let s = Scratch::new("conflict");
    native(As::Me, &s.ws, "mkdir src; echo base > src/main.rs; echo keep > other");
    let (a, b, c) = (begin(As::Me, &s), begin(As::Me, &s), begin(As::Me, &s));
    assert_eq!(exec(As::Me, &s, &a, "echo a > src/main.rs"), 0);
    assert_eq!(exec(As::Me, &s, &b, "echo b > src/main.rs; echo b > b-only"), 0);
    assert_eq!(exec(As::Me, &s, &c, "echo c > c-only"), 0);
    let list = txbox(As::Me, &s, &["--json", "list"]);
    let l: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(l.as_array().map(Vec::len), Some(3), "{l}");
    assert_eq!(txbox(As::Me, &s, &["commit", &a]).status.code(), Some(0));
    let mid = digest(&s.ws, &[]);
    let out = txbox(As::Me, &s, &["--json", "commit", &b]);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["outcome"], "conflict");
    assert_eq!(j["conflicts"], serde_json::json!(["src/main.rs"]));
    assert!(digest(&s.ws, &[]) == mid, "a refused commit changed the workspace");
    assert_eq!(txbox(As::Me, &s, &["commit", &c]).status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(s.ws.join("src/main.rs")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(s.ws.join("c-only")).unwrap(), "c\n");
}

#[test]
fn a_killed_commit_recovers_to_old_or_new_at_every_point() {
    let s = Scratch::new("kill");
    native(As::Me, &s.ws, "for i in $(seq 40); do mkdir -p d$((i % 5)); echo old $i > d$((i % 5))/f$i; done");
    let script = "for f in d*/f*; do echo new >> $f; done; mkdir gen; echo g > gen/g; rm -r d3";
    let old = digest(&s.ws, &[]);
    let reference = s.root.join("ref");
    copy_tree(&s.ws, &reference);
    native(As::Me, &reference, script);
    let new = digest(&reference, &[]);
    let mut seen = (0, 0);
    for n in 1..60 {
        let tx = begin(As::Me, &s);
        assert_eq!(exec(As::Me, &s, &tx, script), 0);
        let out = std::process::Command::new(binary())
            .args(["--state-dir", s.state.to_str().unwrap(), "commit", &tx])
            .env("TXBOX_CRASH_AFTER", n.to_string())
            .output()
            .unwrap();
        let crashed = out.status.code() == Some(137);
        let rec = txbox(As::Me, &s, &["recover"]);
        assert_eq!(rec.status.code(), Some(0), "{}", describe(&rec));
        let got = digest(&s.ws, &[]);
        if got == old {
            seen.0 += 1;
        } else if got == new {
            seen.1 += 1;
        } else {
            panic!("killed after {n} mutating calls: neither old nor new:\n{}", diff(&got, &new));
        }
        if !crashed {
            break;
        }
        // Back to the old state for the next round.
        std::fs::remove_dir_all(&s.ws).unwrap();
        std::fs::create_dir(&s.ws).unwrap();
        native(As::Me, &s.ws, "for i in $(seq 40); do mkdir -p d$((i % 5)); echo old $i > d$((i % 5))/f$i; done");
    }
    assert!(seen.0 >= 1 && seen.1 >= 1, "old/new outcomes seen: {seen:?}");
    let log = txbox(As::Me, &s, &["--json", "log"]);
    assert!(String::from_utf8_lossy(&log.stdout).contains("rolled_forward"), "crash recovery must be audited");
}

#[test]
fn run_validate_and_no_commit() {
    let s = Scratch::new("validate");
    let ws = s.ws.to_str().unwrap().to_string();
    let out = txbox(As::Me, &s, &["--json", "run", "-C", &ws, "--validate", "test -f ok", "-c", "echo x > made"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
    assert_eq!(
        (j["outcome"].as_str(), j["rollback_reason"].as_str()),
        (Some("rolled_back"), Some("validation")),
        "{j}"
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(!s.ws.join("made").exists());
    let out = txbox(As::Me, &s, &["--json", "run", "-C", &ws, "--validate", "test -f made", "-c", "echo x > made"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(s.ws.join("made").exists());
    let out = txbox(As::Me, &s, &["--json", "run", "-C", &ws, "--no-commit", "-c", "echo y > later"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["outcome"], "pending");
    assert!(!s.ws.join("later").exists());
    let tx = j["tx"].as_str().unwrap().to_string();
    assert_eq!(txbox(As::Me, &s, &["commit", &tx]).status.code(), Some(0));
    assert!(s.ws.join("later").exists());
}

/// One step of a random session: a script and whether it fails at the end.
fn step() -> impl Strategy<Value = (String, bool)> {
    let name = proptest::sample::select(vec!["a", "b", "d/c", "d/e", "f/g/h"]);
    let op = prop_oneof![
        (name.clone(), "[a-z]{1,6}").prop_map(|(p, t)| format!("mkdir -p \"$(dirname {p})\" && echo {t} >> {p}")),
        name.clone().prop_map(|p| format!("rm -rf {p}")),
        name.clone().prop_map(|p| format!("rm -rf \"$(dirname {p})\"")),
        (name.clone(), name).prop_map(|(a, b)| format!("mkdir -p \"$(dirname {b})\" && mv {a} {b}")),
    ]
    .prop_map(|s| format!("{{ {s}; }} 2>/dev/null || true"));
    (proptest::collection::vec(op, 1..5).prop_map(|v| v.join("\n")), proptest::bool::weighted(0.3))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("TXBOX_PROP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12), failure_persistence: None, ..ProptestConfig::default() })]

    /// Random multi-step sessions with failing steps and a rollback to a random savepoint,
    /// against a model: the same scripts applied natively, keeping only steps that succeeded.
    #[test]
    fn sessions_match_a_native_model(steps in proptest::collection::vec(step(), 1..6), back in 0usize..6) {
        let s = Scratch::new("model");
        native(As::Me, &s.ws, "mkdir -p d f/g; echo 1 > a; echo 2 > d/c; echo 3 > f/g/h");
        // Model: a copy per savepoint.
        let mut snapshots = vec![s.root.join("snap0")];
        copy_tree(&s.ws, &snapshots[0]);
        let tx = begin(As::Me, &s);
        let mut kept_numbers = vec![0u32];
        for (i, (script, fail)) in steps.iter().enumerate() {
            let body = if *fail { format!("{script}\nexit 1") } else { script.clone() };
            let code = exec(As::Me, &s, &tx, &body);
            prop_assert_eq!(code, if *fail { 1 } else { 0 });
            if !fail {
                let next = s.root.join(format!("snap{}", snapshots.len()));
                copy_tree(snapshots.last().unwrap(), &next);
                native(As::Me, &next, script);
                snapshots.push(next);
                kept_numbers.push(i as u32 + 1);
            }
        }
        let k = back % kept_numbers.len();
        if k + 1 < kept_numbers.len() {
            let out = txbox(As::Me, &s, &["rollback", &tx, "--to", &kept_numbers[k].to_string()]);
            prop_assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
            snapshots.truncate(k + 1);
        }
        let out = txbox(As::Me, &s, &["commit", &tx]);
        prop_assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let got = digest(&s.ws, &[]);
        let want = digest(snapshots.last().unwrap(), &[]);
        prop_assert!(got == want, "session result differs from the model:\n{}", diff(&got, &want));
    }
}

#[test]
fn parallel_runs_disjoint_all_land_overlapping_lose_no_update() {
    let s = Scratch::new("parallel");
    std::fs::write(s.ws.join("shared.txt"), "").unwrap();
    let ws = s.ws.to_str().unwrap().to_string();
    // Disjoint: eight runs at once, each its own file; all must commit.
    let children: Vec<_> = (0..8)
        .map(|i| {
            std::process::Command::new(binary())
                .args(["--state-dir", s.state.to_str().unwrap(), "--json", "run", "-C", &ws, "-c"])
                .arg(format!("sleep 0.2; echo {i} > own{i}.txt"))
                .output()
        })
        .collect();
    for c in children {
        let out = c.unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    }
    for i in 0..8 {
        assert_eq!(std::fs::read_to_string(s.ws.join(format!("own{i}.txt"))).unwrap(), format!("{i}\n"));
    }
    // Overlapping: every run appends to one file at the same time. Each either commits or is
    // refused with a conflict; the file holds exactly the lines of the committed ones.
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let (bin, state, ws) = (binary(), s.state.clone(), ws.clone());
            std::thread::spawn(move || {
                std::process::Command::new(bin)
                    .args(["--state-dir", state.to_str().unwrap(), "--json", "run", "-C", &ws, "-c"])
                    .arg(format!("echo line{i} >> shared.txt; sleep 0.3"))
                    .output()
                    .unwrap()
            })
        })
        .collect();
    let mut committed = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        let out = h.join().unwrap();
        match out.status.code() {
            Some(0) => committed.push(format!("line{i}\n")),
            Some(3) => {}
            other => panic!("run {i}: unexpected status {other:?}: {}", describe(&out)),
        }
    }
    assert!(!committed.is_empty(), "at least the first committer wins");
    // Runs that began after another committed see its line and may commit too; what must never
    // happen is a committed line going missing (a lost update) or a refused one showing up.
    let content = std::fs::read_to_string(s.ws.join("shared.txt")).unwrap();
    let mut lines: Vec<String> = content.lines().map(|l| format!("{l}\n")).collect();
    lines.sort();
    committed.sort();
    assert_eq!(lines, committed, "a lost or mixed update");
}

#[test]
fn a_directory_swapped_for_a_symlink_or_a_file_is_refused_never_followed() {
    for swap in ["symlink", "file"] {
        let s = Scratch::new("swap");
        let outside = s.root.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        native(As::Me, &s.ws, "mkdir d; echo keep > d/keep");
        let tx = begin(As::Me, &s);
        assert_eq!(exec(As::Me, &s, &tx, "echo new > d/new; echo more >> d/keep"), 0);
        // Between exec and commit, someone swaps the directory.
        std::fs::rename(s.ws.join("d"), s.root.join("d-moved")).unwrap();
        if swap == "symlink" {
            std::os::unix::fs::symlink(&outside, s.ws.join("d")).unwrap();
        } else {
            std::fs::write(s.ws.join("d"), "a file now").unwrap();
        }
        let out = txbox(As::Me, &s, &["--json", "commit", &tx]);
        assert!(matches!(out.status.code(), Some(3) | Some(125)), "{swap}: commit went through: {}", describe(&out));
        assert!(
            std::fs::read_dir(&outside).unwrap().next().is_none(),
            "{swap}: a write was redirected outside the workspace"
        );
        let md = std::fs::symlink_metadata(s.ws.join("d")).unwrap();
        assert_eq!(md.file_type().is_symlink(), swap == "symlink", "{swap}: the swapped object was replaced");
    }
}

#[test]
fn sessions_work_with_the_default_state_dir_inside_the_workspace() {
    // overlayfs refuses a lower layer nested in another (ELOOP): with the state directory
    // inside the workspace (here: $HOME is, and the default state directory is in it), a
    // second step used to fail. Layers then live next to the workspace.
    for who in identities() {
        let s = Scratch::new("default-state");
        let home = s.ws.join("home");
        std::fs::create_dir_all(&home).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let run = |args: &[&str]| {
            let mut c = txbox_command(who);
            c.args(args)
                .current_dir(&s.ws)
                .env("HOME", &home)
                .env_remove("TXBOX_STATE_DIR")
                .env_remove("XDG_STATE_HOME");
            c.output().unwrap()
        };
        let out = run(&["begin"]);
        let tx = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        for (i, script) in ["echo 1 > one", "echo 2 > two", "cat one two > three"].iter().enumerate() {
            let out = run(&["exec", &tx, "-c", script]);
            assert_eq!(out.status.code(), Some(0), "{who:?} step {}: {}", i + 1, describe(&out));
        }
        let out = run(&["commit", &tx]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert_eq!(std::fs::read_to_string(s.ws.join("three")).unwrap(), "1\n2\n");
        let leftovers: Vec<_> = std::fs::read_dir(&s.root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains("txbox-layers"))
            .collect();
        assert!(leftovers.is_empty(), "{who:?}: session layers left next to the workspace: {leftovers:?}");
    }
}
