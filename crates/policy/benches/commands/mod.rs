//! The representative command strings of `commands.txt`, shared by the policy micro-benchmark
//! (`benches/policy.rs`) and the latency example (`examples/policy_latency.rs`).

const TEXT: &str = include_str!("commands.txt");

/// `(label, command)` pairs in file order; `\n` in a command stands for a newline.
pub fn cases() -> Vec<(&'static str, String)> {
    TEXT.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('\t'))
        .map(|(label, cmd)| (label, cmd.replace("\\n", "\n")))
        .collect()
}
