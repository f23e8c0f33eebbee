//! In-process micro-benchmarks of the policy engine: one `evaluate_str` per representative
//! command string (the `engine` share of `txbox run`'s `policy` phase), and loading a small user
//! policy merged over the built-in one (what `--policy FILE` adds to every run).
//!
//! `cargo bench -p txbox-policy` measures; `cargo bench -p txbox-policy -- --test` runs each
//! benchmark once (CI). The end-to-end latency of the same evaluations, with median and p99,
//! comes from `cargo run --release -p txbox-policy --example policy_latency` (bench/run.py).

use txbox_policy::{example_context, Policy};

mod commands;

fn main() {
    divan::main();
}

fn labels() -> impl Iterator<Item = &'static str> {
    commands::cases().into_iter().map(|(label, _)| label)
}

fn command(label: &str) -> String {
    commands::cases().into_iter().find(|(l, _)| *l == label).map(|(_, c)| c).unwrap_or_default()
}

/// Evaluate one command string with the built-in policy (already loaded, as in a running txbox).
#[divan::bench(args = labels())]
fn evaluate(bencher: divan::Bencher, label: &str) {
    let policy = Policy::builtin();
    let ctx = example_context();
    let cmd = command(label);
    bencher.bench_local(|| policy.evaluate_str(divan::black_box(&cmd), &ctx));
}

/// Evaluate every representative string once: the cost of a mixed batch.
#[divan::bench]
fn evaluate_all(bencher: divan::Bencher) {
    let policy = Policy::builtin();
    let ctx = example_context();
    let cmds: Vec<String> = commands::cases().into_iter().map(|(_, c)| c).collect();
    bencher.counter(cmds.len()).bench_local(|| {
        for c in &cmds {
            divan::black_box(policy.evaluate_str(c, &ctx));
        }
    });
}

const USER_POLICY: &str = r#"
version = 1

[[rule]]
id = "team.release-builds"
action = "transact"
reason = "release builds run as transactions"
examples.match = ["cargo build --release"]
examples.no_match = ["cargo fmt"]
[[rule.when]]
program = ["cargo"]
subcommand = ["build"]
"#;

/// Parse a one-rule user policy and merge it over the built-in policy (rules compiled, examples
/// checked): paid once per `txbox run --policy FILE`.
#[divan::bench]
fn load_user_policy() -> Policy {
    match Policy::from_toml_str(divan::black_box(USER_POLICY), "team.toml") {
        Ok(p) => p,
        Err(e) => panic!("the benchmark's user policy does not load: {e}"),
    }
}
