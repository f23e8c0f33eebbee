//! Print the decision and extracted commands for each argument: `cargo run --example why -- 'rm -rf /'`.
use txbox_policy::{example_context, Policy};

fn main() {
    let policy = Policy::builtin();
    let ctx = example_context();
    for a in std::env::args().skip(1) {
        let e = policy.evaluate_str(&a, &ctx);
        println!("{a}\n  => {} {:?}: {}\n  {:?}", e.decision.action.as_str(), e.decision.rule, e.decision.reason, e.commands);
    }
}
