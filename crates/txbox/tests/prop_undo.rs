//! Property: for a random workspace (files, empty and nested directories, symlinks, extended
//! attributes, odd names) and a random sequence of commands (with hard links made in the
//! transaction), `txbox run` commits, `txbox undo` gives back the tree exactly as before (names,
//! kinds, modes, owners, contents, symlink targets, xattrs, hard-link groups, and the mtime of
//! every non-directory: the same objects come back), and undoing the undo gives back the tree
//! exactly as the commit left it. Root and unprivileged, warm and cold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;
use proptest::prelude::*;

const NAMES: [&str; 9] = ["a", "b", "c", "d/e", "d/f", "g/h/i", "sp ace", "nl\\nx", "hi\\377bit"];

fn name() -> impl Strategy<Value = String> {
    proptest::sample::select(NAMES.to_vec()).prop_map(|n| format!("\"$(printf '{n}')\""))
}

fn xattr(p: &str, value: &str) -> String {
    format!("python3 -c \"import os,sys; os.setxattr(sys.argv[1], 'user.t', b'{value}')\" {p}")
}

/// One shell operation; `|| true` keeps a script going when it does not apply.
fn op(links: bool) -> impl Strategy<Value = String> {
    let link = (name(), name())
        .prop_map(|(a, b)| format!("test -f {a} && mkdir -p \"$(dirname {b})\" && ln -f {a} {b}"))
        .prop_map(move |s| if links { s } else { ":".to_string() });
    prop_oneof![
        (name(), "[a-z]{0,12}").prop_map(|(p, t)| format!("mkdir -p \"$(dirname {p})\" && echo {t} > {p}")),
        (name(), "[a-z]{1,8}").prop_map(|(p, t)| format!("echo {t} >> {p}")),
        name().prop_map(|p| format!("rm -f {p}")),
        name().prop_map(|p| format!("rm -rf \"$(dirname {p})\"")),
        name().prop_map(|p| format!("rm -rf {p} && mkdir -p {p}")),
        name().prop_map(|p| format!("mkdir -p {p}/empty/nested")),
        (name(), name()).prop_map(|(a, b)| format!("mkdir -p \"$(dirname {b})\" && mv {a} {b}")),
        // Modes keep the owner's search bit: a directory made unsearchable cannot be classified by
        // an unprivileged user, so such a command fails to commit (a limit of commit, not undo).
        (name(), proptest::sample::select(vec!["755", "700", "750", "711"]))
            .prop_map(|(p, m)| format!("chmod {m} {p}")),
        (name(), name()).prop_map(|(a, b)| format!("mkdir -p \"$(dirname {b})\" && ln -sfn {a} {b}")),
        (name(), "[a-z]{1,6}").prop_map(|(p, v)| xattr(&p, &v)),
        link,
    ]
    .prop_map(|s| format!("{{ {s}; }} 2>/dev/null || true"))
}

fn script() -> impl Strategy<Value = (Vec<String>, Vec<String>, u8)> {
    (proptest::collection::vec(op(false), 0..10), proptest::collection::vec(op(true), 1..12), 0u8..4)
}

/// The digest of `common` plus every non-directory's mtime.
fn exact(root: &Path) -> (BTreeMap<Vec<u8>, Entry>, BTreeMap<Vec<u8>, i64>) {
    fn times(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, i64>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                times(root, &p, out);
            } else {
                out.insert(
                    p.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec(),
                    md.mtime() * 1_000_000_000 + md.mtime_nsec(),
                );
            }
        }
    }
    let mut t = BTreeMap::new();
    times(root, root, &mut t);
    (digest(root, &[]), t)
}

fn undo(who: As, s: &Scratch, warm: &str) -> serde_json::Value {
    let mut cmd = txbox_command(who);
    if who != As::Me {
        cmd.env("HOME", &s.root);
    }
    let out = cmd
        .env("TXBOX_RETAIN_MIN_FREE", "0")
        .env("TXBOX_WARM", warm)
        .env("TXBOX_WARM_IDLE", "5")
        .arg("--state-dir")
        .arg(&s.state)
        .args(["--json", "undo", "-C"])
        .arg(&s.ws)
        .current_dir(&s.ws)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("TXBOX_PROP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn commit_undo_redo_is_exact((setup, ops, variant) in script()) {
        let who = match test_user() { Some(uid) if variant & 1 == 1 => As::User(uid), _ => As::Me };
        let warm = if variant & 2 == 2 { "1" } else { "0" };
        let s = Scratch::new("prop-undo");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        native(who, &s.ws, &setup.join("\n"));
        let before = exact(&s.ws);
        let body = ops.join("\n");
        let ws = s.ws.to_str().unwrap().to_string();
        let mut cmd = txbox_command(who);
        if who != As::Me {
            cmd.env("HOME", &s.root);
        }
        // A shared disk may run low meanwhile: no yielding here (tests/undo.rs tests that).
        let out = cmd.env("TXBOX_RETAIN_MIN_FREE", "0").env("TXBOX_WARM", warm).env("TXBOX_WARM_IDLE", "5").arg("--state-dir").arg(&s.state)
            .args(["--json", "run", "-C", &ws, "-c", &body]).current_dir(&s.ws).output().unwrap();
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
        prop_assert_eq!(&j["outcome"], "committed", "{}", describe(&out));
        let after = exact(&s.ws);
        let changed = j["changes"].as_object().map(|c| c.values().any(|v| v.as_array().is_some_and(|a| !a.is_empty()))).unwrap_or(false);
        if !changed && before == after {
            // Nothing committed: nothing to undo (the undo says so and changes nothing).
            let u = undo(who, &s, warm);
            prop_assert!(u["outcome"] != "committed" || exact(&s.ws) == before, "{}", u);
            return Ok(());
        }
        let u = undo(who, &s, warm);
        prop_assert_eq!(&u["outcome"], "committed", "{:?} warm={}: {}\n{}\n---\n{}", who, warm, u, setup.join("\n"), body);
        let got = exact(&s.ws);
        prop_assert!(got.0 == before.0, "{:?} warm={}: undo differs\n{}\n---\n{}\n{}", who, warm, setup.join("\n"), body, diff(&got.0, &before.0));
        prop_assert!(got.1 == before.1, "{:?} warm={}: mtimes differ after undo\n{}\n---\n{}", who, warm, setup.join("\n"), body);
        let r = undo(who, &s, warm);
        prop_assert_eq!(&r["outcome"], "committed", "{}", r);
        let got = exact(&s.ws);
        prop_assert!(got.0 == after.0, "{:?} warm={}: redo differs\n{}\n---\n{}\n{}", who, warm, setup.join("\n"), body, diff(&got.0, &after.0));
        prop_assert!(got.1 == after.1, "{:?} warm={}: mtimes differ after redo", who, warm);
    }
}
