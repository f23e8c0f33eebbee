//! Property: for a random workspace and a random sequence of file operations, `txbox run`
//! leaves the workspace exactly as running the same operations natively on a copy does
//! (names, types, modes, contents, symlink targets, hard-link groups).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use proptest::prelude::*;

const NAMES: [&str; 8] = ["a", "b", "c", "d/e", "d/f", "g/h/i", "sp ace", "nl\\nx"];

fn name() -> impl Strategy<Value = String> {
    proptest::sample::select(NAMES.to_vec()).prop_map(|n| format!("\"$(printf '{n}')\""))
}

/// One shell operation; `|| true` keeps a script going when an op does not apply (both sides
/// see the same failure, so they stay comparable). `links`: whether hard links may be made.
/// The workspace before the transaction has none: overlayfs copy-up breaks a hard link to a
/// lower file when one name is written (see docs/DEVIATIONS.md), so only links created inside
/// the transaction are part of the contract.
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
        (name(), name()).prop_map(|(a, b)| format!("mkdir -p \"$(dirname {b})\" && mv {a} {b}")),
        (name(), proptest::sample::select(vec!["755", "700", "750", "775"]))
            .prop_map(|(p, m)| format!("chmod {m} {p}")),
        (name(), name()).prop_map(|(a, b)| format!("mkdir -p \"$(dirname {b})\" && ln -sfn {a} {b}")),
        link,
        name().prop_map(|p| format!("test -f {p} && truncate -s 100000 {p}")),
    ]
    .prop_map(|s| format!("{{ {s}; }} 2>/dev/null || true"))
}

fn script() -> impl Strategy<Value = (Vec<String>, Vec<String>)> {
    (proptest::collection::vec(op(false), 0..10), proptest::collection::vec(op(true), 1..12))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("TXBOX_PROP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn txbox_run_equals_native_execution((setup, ops) in script()) {
        let who = match test_user() { Some(uid) if setup.len() % 2 == 1 => As::User(uid), _ => As::Me };
        let s = Scratch::new("prop");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        native(who, &s.ws, &setup.join("\n"));
        let reference = s.root.join("ref");
        copy_tree(&s.ws, &reference);
        let body = ops.join("\n");
        native(who, &reference, &body);
        let (out, j) = run_json(who, &s, &body);
        prop_assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        prop_assert_eq!(&j["outcome"], "committed");
        let got = digest(&s.ws, &[]);
        let want = digest(&reference, &[]);
        prop_assert!(got == want, "{:?}: after\n{}\n---\n{}\ntree differs:\n{}", who, setup.join("\n"), body, diff(&got, &want));
    }
}
