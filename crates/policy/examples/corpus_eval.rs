//! Score the engine on the labelled corpora in `../shared/corpus` (or the directory given as the
//! first argument): interception of `deny` lines, false positives on benign ones, the opaque rate,
//! and evaluation latency (median, p99).
//!
//! `cargo run --release -p txbox-policy --example corpus_eval -- /work/shared/corpus`

use std::path::{Path, PathBuf};
use std::time::Instant;

use txbox_policy::{example_context, Action, Policy};

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some('\\') => out.push('\\'),
                Some(o) => {
                    out.push('\\');
                    out.push(o);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn load(path: &Path, escaped: bool) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("skipping {}: unreadable", path.display());
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_once('\t'))
        .map(|(label, cmd)| (label.to_string(), if escaped { unescape(cmd) } else { cmd.to_string() }))
        .collect()
}

fn main() {
    let dir = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("../shared/corpus"));
    let verbose = std::env::args().any(|a| a == "-v");
    let policy = Policy::builtin();
    let ctx = example_context();
    let mut lat = Vec::new();
    for (name, escaped, deny_label) in [("nl2bash_labels.tsv", false, "deny"), ("dcg_cases.tsv", true, "deny")] {
        let rows = load(&dir.join(name), escaped);
        if rows.is_empty() {
            continue;
        }
        let (mut deny_n, mut deny_hit, mut ok_n, mut ok_fp, mut opaque) = (0, 0, 0, 0, 0);
        for (label, cmd) in &rows {
            let t = Instant::now();
            let e = policy.evaluate_str(cmd, &ctx);
            lat.push(t.elapsed().as_nanos() as u64);
            let denied = e.decision.action == Action::Deny;
            if e.decision.rule.as_deref().is_some_and(|r| r.starts_with("engine.")) {
                opaque += 1;
            }
            if label == deny_label {
                deny_n += 1;
                if denied {
                    deny_hit += 1;
                } else if verbose {
                    println!("MISS\t{cmd}\t{} {:?}", e.decision.action.as_str(), e.decision.rule);
                }
            } else {
                ok_n += 1;
                if denied {
                    ok_fp += 1;
                    if verbose {
                        println!("FP\t{cmd}\t{:?}: {}", e.decision.rule, e.decision.reason);
                    }
                }
            }
        }
        let pct = |a: usize, b: usize| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
        println!(
            "{name}: deny {deny_hit}/{deny_n} intercepted ({:.1}%), benign denied {ok_fp}/{ok_n} ({:.2}%), opaque {opaque}/{} ({:.1}%)",
            pct(deny_hit, deny_n),
            pct(ok_fp, ok_n),
            rows.len(),
            pct(opaque, rows.len())
        );
    }
    // Latency: a second, warm pass over everything measured above.
    lat.sort_unstable();
    if !lat.is_empty() {
        let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
        println!("latency per command string: median {:.1} µs, p99 {:.1} µs, max {:.1} µs (n = {})", q(0.5), q(0.99), q(1.0), lat.len());
    }
}
