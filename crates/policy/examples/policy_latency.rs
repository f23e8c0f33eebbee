//! Policy evaluation latency, one `evaluate_str` at a time, as JSON on stdout: median, p99 and
//! max in µs over all evaluations, and the median and p99 over strings of each string's fastest
//! round (free of the preemptions of a loaded machine), for the representative strings of `benches/commands/commands.txt` and, when given,
//! for every command of an agent-session corpus (`agent_sessions.jsonl`, one JSON object per
//! line with a `commands` list). Read by `bench/run.py`.
//!
//! `cargo run --release -p txbox-policy --example policy_latency -- [--rounds N] [SESSIONS.jsonl]`
//!
//! `--once` evaluates every string of the corpus once more after a warm-up round, untimed, and
//! prints nothing: for counting instructions (`valgrind --tool=callgrind
//! --toggle-collect='*counted_one*'`), which stay
//! repeatable on a loaded machine where wall-clock times do not. `--slowest N FILE` writes the N
//! strings whose fastest evaluation was slowest, one JSON string per line, and `--strings FILE`
//! reads the strings from such a file instead of a session corpus (the tail of the latency
//! distribution, measured on its own).

use std::time::Instant;

use txbox_policy::{example_context, Policy};

#[path = "../benches/commands/mod.rs"]
mod commands;

/// Every command of every session of an `agent_sessions.jsonl` file, in order.
fn session_commands(path: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("{path}:{}: {e}", i + 1))?;
        let cmds = v["commands"].as_array().map(Vec::as_slice).unwrap_or_default();
        out.extend(cmds.iter().filter_map(|c| c.as_str()).map(str::to_string));
    }
    Ok(out)
}

/// Latency of each evaluation of each string over `rounds` rounds (after one untimed warm-up
/// round, so lazily compiled rules do not count), summarised as JSON, with the five strings
/// whose fastest evaluation was slowest (the cause of a high p99, free of preemption noise).
fn measure(
    policy: &Policy,
    set: &str,
    cmds: &[String],
    rounds: usize,
    slowest_out: Option<(usize, &str)>,
) -> serde_json::Value {
    let ctx = example_context();
    for c in cmds {
        std::hint::black_box(policy.evaluate_str(c, &ctx));
    }
    let mut ns: Vec<u64> = Vec::with_capacity(cmds.len() * rounds);
    let mut fastest = vec![u64::MAX; cmds.len()];
    for _ in 0..rounds {
        for (i, c) in cmds.iter().enumerate() {
            let t = Instant::now();
            std::hint::black_box(policy.evaluate_str(c, &ctx));
            let d = t.elapsed().as_nanos() as u64;
            ns.push(d);
            fastest[i] = fastest[i].min(d);
        }
    }
    ns.sort_unstable();
    let q = |p: f64| ns.get(((ns.len().saturating_sub(1)) as f64 * p) as usize).map_or(0.0, |&v| v as f64 / 1e3);
    let mut order: Vec<usize> = (0..cmds.len()).collect();
    order.sort_unstable_by_key(|&i| std::cmp::Reverse(fastest[i]));
    if let Some((n, path)) = slowest_out {
        let lines: String = order.iter().take(n).map(|&i| format!("{}\n", serde_json::json!(cmds[i]))).collect();
        if let Err(e) = std::fs::write(path, lines) {
            eprintln!("policy_latency: {path}: {e}");
        }
    }
    let slowest: Vec<serde_json::Value> = order
        .iter()
        .take(5)
        .map(|&i| {
            let first: String = cmds[i].lines().next().unwrap_or_default().chars().take(60).collect();
            serde_json::json!({ "us": fastest[i] as f64 / 1e3, "bytes": cmds[i].len(), "start": first })
        })
        .collect();
    // Per string, its fastest round: what the code costs without the preemptions a loaded
    // machine adds (those land in the percentiles of all evaluations above).
    let mut best: Vec<u64> = fastest.clone();
    best.sort_unstable();
    let qb = |p: f64| best.get(((best.len().saturating_sub(1)) as f64 * p) as usize).map_or(0.0, |&v| v as f64 / 1e3);
    serde_json::json!({
        "set": set, "strings": cmds.len(), "evaluations": ns.len(),
        "median_us": q(0.5), "p99_us": q(0.99), "max_us": q(1.0),
        "fastest_median_us": qb(0.5), "fastest_p99_us": qb(0.99),
        "slowest": slowest,
    })
}

fn evaluate_all(policy: &Policy, cmds: &[String]) {
    let ctx = example_context();
    for c in cmds {
        std::hint::black_box(policy.evaluate_str(c, &ctx));
    }
}

/// The round `--once` measures: `valgrind --tool=callgrind --toggle-collect='*counted_one*'`
/// counts it; with `--dump-after='*counted_one*'` too, each string gets a profile of its own (its
/// instruction count: a latency distribution that load on the machine does not blur).
fn counted_round(policy: &Policy, cmds: &[String]) {
    let ctx = example_context();
    for c in cmds {
        counted_one(policy, c, &ctx);
    }
}

#[inline(never)]
fn counted_one(policy: &Policy, command: &str, ctx: &txbox_policy::Context) {
    std::hint::black_box(policy.evaluate_str(command, ctx));
}

/// One JSON string per line (what `--slowest` writes).
fn string_lines(path: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str::<String>(l).map_err(|e| format!("{path}:{}: {e}", i + 1)))
        .collect()
}

fn main() {
    let (mut rounds, mut corpus, mut strings, mut once, mut slowest) = (5, None, None, false, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|n| n.parse().ok()).unwrap_or(rounds),
            "--once" => once = true,
            "--strings" => strings = args.next(),
            "--slowest" => {
                let n = args.next().and_then(|n| n.parse::<usize>().ok()).unwrap_or(100);
                slowest = args.next().map(|f| (n, f));
            }
            _ => corpus = Some(a),
        }
    }
    let policy = Policy::builtin();
    let loaded = match (&strings, &corpus) {
        (Some(f), _) => Some(string_lines(f).map(|c| (f.clone(), c))),
        (None, Some(f)) => Some(session_commands(f).map(|c| (f.clone(), c))),
        (None, None) => None,
    };
    let loaded = match loaded.transpose() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("policy_latency: {e}");
            std::process::exit(1);
        }
    };
    if once {
        let cmds: &[String] = loaded.as_ref().map(|(_, c)| c.as_slice()).unwrap_or_default();
        // An untimed round first, so regexes compiled on first use are not counted.
        evaluate_all(&policy, cmds);
        counted_round(&policy, cmds);
        return;
    }
    let representative: Vec<String> = commands::cases().into_iter().map(|(_, c)| c).collect();
    let mut sets =
        vec![measure(&policy, "representative (benches/commands/commands.txt)", &representative, rounds * 100, None)];
    if let Some((path, cmds)) = loaded {
        let out = slowest.as_ref().map(|(n, f)| (*n, f.as_str()));
        sets.push(measure(&policy, &path, &cmds, rounds, out));
    }
    println!("{}", serde_json::json!({ "rounds": rounds, "sets": sets }));
}
