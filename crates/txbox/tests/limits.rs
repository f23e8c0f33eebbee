//! The write limit cannot be bypassed, and runs get default limits (issue #13, finding 9):
//! whatever the command's exit status, a change set over the limit is rolled back and the
//! workspace is unchanged; what counts is the blocks a commit would add (a sparse file's data,
//! `fallocate`d space in full); defaults apply without options. Root and unprivileged, warm
//! and cold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::MetadataExt;

use common::*;

fn run(who: As, s: &Scratch, opts: &[&str], script: &str, cold: bool) -> serde_json::Value {
    let mut cmd = txbox_command(who);
    if who != As::Me {
        cmd.env("HOME", &s.root);
    }
    if cold {
        cmd.env("TXBOX_WARM", "0");
    }
    let out = cmd
        .arg("--state-dir")
        .arg(&s.state)
        .args(["--json", "run", "-C"])
        .arg(&s.ws)
        .args(opts)
        .args(["-c", script])
        .current_dir(&s.ws)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)))
}

fn scratch(who: As, name: &str) -> Scratch {
    let s = Scratch::new(name);
    std::fs::write(s.ws.join("keep"), "k").unwrap();
    if let As::User(uid) = who {
        s.chown(uid);
    }
    s
}

/// Twice the limit, written fast, in one file or in pieces, then `exit 0`: the change set is
/// over the limit and nothing is committed.
#[test]
fn a_change_set_over_the_write_limit_is_rolled_back_whatever_the_exit_status() {
    let variants = [
        ("one fallocate", "fallocate -l 30M big; exit 0"),
        ("one dd", "dd if=/dev/zero of=big bs=1M count=30 status=none; exit 0"),
        ("fallocate", "for i in 1 2 3 4 5; do fallocate -l 7M f$i; done; exit 0"),
        ("dd", "for i in 1 2 3 4 5; do dd if=/dev/zero of=d$i bs=1M count=7 status=none; done; exit 0"),
        ("small files", "mkdir many; for i in $(seq 1 4000); do echo $i > many/$i; done; exit 0"),
        ("new tree", "mkdir -p t/a/b; for i in 1 2 3; do head -c 12M /dev/zero > t/a/b/x$i; done; true"),
        ("replaced file", "head -c 12M /dev/zero > keep; head -c 12M /dev/zero > keep2; head -c 12M /dev/zero > keep3"),
    ];
    for who in identities() {
        for cold in [false, true] {
            for (what, script) in variants {
                let s = scratch(who, "write-limit");
                let before = digest(&s.ws, &[]);
                let j = run(who, &s, &["--max-write", "15M"], script, cold);
                let ctx = format!("{who:?} cold={cold} {what}: {j}");
                assert_eq!(j["outcome"], "rolled_back", "{ctx}");
                assert_eq!(j["limit_exceeded"], "write", "{ctx}");
                assert_eq!(j["rollback_reason"], "limit", "{ctx}");
                assert_ne!(j["exit_code"], 0, "{ctx}");
                let after = digest(&s.ws, &[]);
                assert!(before == after, "{ctx}: workspace changed:\n{}", diff(&before, &after));
            }
        }
    }
}

/// What counts is what a commit allocates: sparse files whose lengths add up to far more than
/// the limit, or one far longer than it, with little data, are committed and stay sparse.
#[test]
fn sparse_files_count_the_blocks_they_allocate() {
    for who in identities() {
        for cold in [false, true] {
            let s = scratch(who, "sparse");
            let script = "for i in 1 2 3 4 5; do truncate -s 60M s$i; dd if=/dev/zero of=s$i bs=64K count=1 seek=100 \
                          conv=notrunc status=none; done";
            let j = run(who, &s, &["--max-write", "64M"], script, cold);
            assert_eq!(j["outcome"], "committed", "{who:?} cold={cold}: {j}");
            let md = std::fs::metadata(s.ws.join("s3")).unwrap();
            assert_eq!(md.len(), 60 << 20);
            assert!(md.blocks() * 512 < 1 << 20, "filled in: {}", md.blocks());
            let j = run(
                who,
                &s,
                &["--max-write", "64M"],
                "truncate -s 200G huge && dd if=/dev/zero of=huge bs=4K count=1 conv=notrunc status=none",
                cold,
            );
            assert_eq!(j["outcome"], "committed", "{who:?} cold={cold}: {j}");
            assert_eq!(std::fs::metadata(s.ws.join("huge")).unwrap().len(), 200 << 30);
        }
    }
}

/// A step of a session over the limit is rolled back alone, even when it exits 0 and even
/// with `--on-failure keep`.
#[test]
fn a_session_step_over_the_write_limit_is_not_kept() {
    for who in identities() {
        let s = scratch(who, "step-limit");
        let ws = s.ws.to_str().unwrap().to_string();
        let out = txbox(who, &s, &["begin", "-C", &ws]);
        let tx = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(out.status.success(), "{}", describe(&out));
        for keep in ["rollback", "keep"] {
            let out = txbox(
                who,
                &s,
                &[
                    "--json",
                    "exec",
                    &tx,
                    "--max-write",
                    "10M",
                    "--on-failure",
                    keep,
                    "-c",
                    "for i in 1 2 3; do fallocate -l 8M f$i; done",
                ],
            );
            let j: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
            assert_eq!(j["outcome"], "rolled_back", "{who:?} {keep}: {j}");
            assert_eq!(j["limit_exceeded"], "write", "{who:?} {keep}: {j}");
        }
        let out = txbox(who, &s, &["--json", "diff", &tx]);
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["added"], serde_json::json!([]), "{j}");
        let _ = txbox(who, &s, &["rollback", &tx]);
    }
}

/// Without options a run still has limits the host can enforce without cgroups: a process
/// limit (RLIMIT_NPROC) and the OOM killer's first choice; and a run is never refused for a
/// default.
#[test]
fn default_limits_apply_without_options() {
    for who in identities() {
        for cold in [false, true] {
            let s = scratch(who, "defaults");
            let j = run(who, &s, &[], "ulimit -u; cat /proc/self/oom_score_adj; ulimit -f", cold);
            assert_eq!(j["outcome"], "committed", "{who:?} cold={cold}: {j}");
            let out: Vec<&str> = j["stdout"].as_str().unwrap().lines().collect();
            let procs: u64 = out[0].parse().unwrap_or_else(|_| panic!("{j}"));
            assert!((4096..=1 << 20).contains(&procs), "{who:?} cold={cold}: {j}");
            assert_eq!(out[1], "1000", "{who:?} cold={cold}: {j}");
            // No per-file limit: the write limit counts blocks, not lengths.
            assert_eq!(out[2], "unlimited", "{who:?} cold={cold}: {j}");
            let j = run(who, &s, &["--max-write", "1M"], "ulimit -f", cold);
            assert_eq!(j["stdout"], "unlimited\n", "{who:?} cold={cold}: {j}");
            // A cgroup process limit replaces the rlimit (where cgroups can be made).
            let j = run(who, &s, &["--pids", "64"], "ulimit -u", cold);
            if j["outcome"] == "committed" {
                assert_ne!(j["stdout"].as_str().unwrap().trim(), procs.to_string(), "{j}");
            }
        }
    }
}
