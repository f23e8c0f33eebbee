//! Output for people and for programs. Human summaries go to stderr, so the command's own
//! stdout stays exactly what it printed.

use crate::result::{Outcome, RollbackReason, RunResult};

/// A short transaction id for humans: the first 8 hex digits and an ellipsis.
pub fn short(tx: &str) -> String {
    if tx.len() > 8 {
        format!("{}…", &tx[..8])
    } else {
        tx.to_string()
    }
}

/// Milliseconds with one decimal below 100 ms, whole above.
pub fn ms(v: f64) -> String {
    if v < 100.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.0} ms")
    }
}

/// The lines a result adds to its summary: a commit left to recovery, an outcome that could not
/// be audited.
pub fn warnings(r: &RunResult) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = &r.pending_recovery {
        out.push(format!("txbox: tx {} is committed but not yet applied in full: {p}", short(&r.tx)));
    }
    if let Some(k) = &r.kept_error {
        out.push(format!("txbox: tx {}'s build output was not kept: {k}", short(&r.tx)));
    }
    if let Some(a) = &r.audit_error {
        out.push(format!("txbox: the outcome of tx {} could not be written to the audit log: {a}", short(&r.tx)));
    }
    out
}

/// The one-line summary of docs/DESIGN.md §3, e.g.
/// `txbox: committed tx 7f3a… (+3 ~1 -2) in 4.1 ms`, followed by [`warnings`] if any. Each
/// line is [`printable`]: it quotes paths, commands and reasons an agent chose.
pub fn summary(r: &RunResult) -> String {
    let mut lines = vec![outcome_line(r)];
    lines.extend(warnings(r));
    lines.iter().map(|l| printable(l)).collect::<Vec<_>>().join("\n")
}

/// `s` safe to print on a person's terminal as one line: control characters (C0, DEL, C1: the
/// escape sequences that set a window's title, write the clipboard, move the cursor or erase
/// the line a person is reading) and the bidirectional overrides that reorder what is shown
/// become visible escapes (`\x1b`, `\u{202e}`); a newline becomes `⏎`. Text an agent wrote (a
/// command line, a file name, a reason quoting them) reaches the operator's terminal only so.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push('⏎'),
            c if unsafe_char(c) && (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

fn outcome_line(r: &RunResult) -> String {
    let c = &r.changes;
    match r.outcome {
        Outcome::Committed => format!(
            "txbox: committed tx {} (+{} ~{} -{}) in {}{}",
            short(&r.tx),
            c.added.len(),
            c.modified.len(),
            c.deleted.len(),
            ms(r.duration_ms),
            dropped(r)
        ),
        Outcome::RolledBack => {
            let why = match (r.rollback_reason, r.signal) {
                (Some(RollbackReason::Timeout), _) => "timed out".to_string(),
                (Some(RollbackReason::Limit), _) => {
                    format!("{} limit exceeded", r.limit_exceeded.as_deref().unwrap_or("resource"))
                }
                (Some(RollbackReason::Validation), _) => "validation failed".to_string(),
                (_, Some(sig)) => format!("killed by signal {sig}"),
                _ => format!("exit status {}", r.exit_code),
            };
            match r.step {
                // A session's failed step: only the step is undone.
                Some(n) => format!(
                    "txbox: step {n} of tx {} undone: {why}; the transaction is still open (exec, diff, commit or rollback {})",
                    short(&r.tx),
                    r.tx
                ),
                None if r.kept.is_empty() => format!("txbox: rolled back tx {}: {why}", short(&r.tx)),
                // Build output survives the failure (docs/DEVIATIONS.md).
                None => format!("txbox: rolled back tx {}: {why}; kept {}", short(&r.tx), r.kept.join(", ")),
            }
        }
        Outcome::Denied => {
            format!("txbox: denied by rule {}: {}", r.decision.rule.as_deref().unwrap_or("policy"), r.decision.reason)
        }
        Outcome::Pending => format!("txbox: tx {} pending; review with `txbox diff {}`", short(&r.tx), r.tx),
        Outcome::Conflict => format!(
            "txbox: conflict, nothing applied in tx {}: {}",
            short(&r.tx),
            r.error.as_deref().unwrap_or("a changed path was changed in the workspace too")
        ),
        Outcome::Error => format!("txbox: error, nothing changed: {}", r.error.as_deref().unwrap_or("unknown error")),
        Outcome::Held => {
            let why: Vec<String> = r.held.iter().map(|h| format!("{} [{}]", h.reason, h.rule)).collect();
            format!(
                "txbox: held tx {} for a person, nothing applied: {}; review with `txbox diff {}`, then a person \
                 runs `txbox approve {}` or `txbox rollback {}`",
                short(&r.tx),
                why.join("; "),
                r.tx,
                r.tx,
                r.tx
            )
        }
    }
}

/// What a commit left out of the extended attributes, in a few words (the JSON lists all).
fn dropped(r: &RunResult) -> String {
    let Some(first) = r.dropped_xattrs.first() else { return String::new() };
    let more = match r.dropped_xattrs.len() {
        1 => String::new(),
        n => format!(" and {} more", n - 1),
    };
    format!("; not committed (off the xattr allowlist): {} on {}{more}", first.name, first.path)
}

pub fn json(r: &RunResult) -> String {
    serde_json::to_string(r).unwrap_or_else(|e| format!("{{\"error\": \"rendering the result: {e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_what_a_terminal_would_act_on() {
        assert_eq!(printable("make test"), "make test");
        assert_eq!(printable("é ⏎ ok"), "é ⏎ ok");
        assert_eq!(printable("a\nb"), "a⏎b");
        assert_eq!(printable("\u{1b}]52;c;eA==\u{7}x"), "\\x1b]52;c;eA==\\x07x");
        assert_eq!(printable("\r\t\u{7f}\u{9b}2J"), "\\x0d\\x09\\x7f\\x9b2J");
        assert_eq!(printable("txt.\u{202e}exe"), "txt.\\u{202e}exe");
    }
}
