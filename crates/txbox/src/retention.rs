//! The retention budget in force (how much undo data is kept): the environment
//! (`TXBOX_RETAIN_COUNT`, `TXBOX_RETAIN_SIZE`, `TXBOX_RETAIN_MIN_FREE`) over the configuration
//! file's keys (`retain_count`, `retain_size`, `retain_min_free`, in the file `crate::config`
//! reads, and only from one no sandboxed command could have written) over the defaults ([`Budget::DEFAULT`]: 500 transactions,
//! 1 GiB, and 1 GiB or 5% of the filesystem, whichever is less, kept free). The free share is a
//! size (`2G`) or a percentage (`5%`). A count or size of 0 turns retention off.

use std::sync::OnceLock;

use txbox_txn::retain::{Budget, MinFree};

/// The retention keys of the configuration file.
#[derive(Debug, Default)]
struct Keys {
    retain_count: Option<u64>,
    retain_size: Option<String>,
    retain_min_free: Option<String>,
}

/// The retention keys of the configuration file (`crate::config`), refused from a file a
/// sandboxed command could have written (as every key that widens confinement is).
fn config_keys() -> Result<Keys, String> {
    let Some((src, text)) = crate::config::default_text()? else { return Ok(Keys::default()) };
    let c = crate::config::Config::parse(text, &src.path).map_err(|e| e.message)?;
    let set = c.retain_keys();
    if !set.is_empty() {
        if let Some(why) = crate::config::Untrusted::default().reason(&src.path) {
            return Err(format!(
                "configuration {} refused: it lies {why}, where a sandboxed command can write, and sets {}; \
                 move it outside every workspace and txbox's state directory, or remove those keys",
                src.path.display(),
                set.join(", ")
            ));
        }
    }
    Ok(Keys { retain_count: c.retain_count, retain_size: c.retain_size, retain_min_free: c.retain_min_free })
}

/// What to leave free: a percentage (`5%`) or a size (`2G`, `0`).
fn parse_min_free(s: &str) -> Result<MinFree, String> {
    match s.trim().strip_suffix('%') {
        Some(p) => match p.trim().parse::<u8>() {
            Ok(n) if n <= 100 => Ok(MinFree::Percent(n)),
            _ => Err(format!("`{s}` is not a percentage from 0 to 100")),
        },
        None => crate::size::parse_size(s).map(MinFree::Bytes),
    }
}

/// Resolve the budget from `env` (a lookup, for tests) and the file's keys.
fn resolve(env: impl Fn(&str) -> Option<String>, keys: Keys) -> Result<Budget, String> {
    let mut b = Budget::DEFAULT;
    let count = env("TXBOX_RETAIN_COUNT")
        .map(|v| v.trim().parse::<u64>().map_err(|_| format!("TXBOX_RETAIN_COUNT: `{v}` is not a number")));
    match count {
        Some(c) => b.count = c?,
        None => b.count = keys.retain_count.unwrap_or(b.count),
    }
    let size = env("TXBOX_RETAIN_SIZE").or(keys.retain_size);
    if let Some(s) = size {
        b.bytes = crate::size::parse_size(&s).map_err(|e| format!("retain size: {e}"))?;
    }
    let free = env("TXBOX_RETAIN_MIN_FREE").or(keys.retain_min_free);
    if let Some(f) = free {
        b.min_free = parse_min_free(&f).map_err(|e| format!("retain min free: {e}"))?;
    }
    Ok(b)
}

/// The budget in force for this process (read once).
pub fn budget() -> Result<Budget, String> {
    static BUDGET: OnceLock<Result<Budget, String>> = OnceLock::new();
    BUDGET.get_or_init(|| resolve(|k| std::env::var(k).ok().filter(|v| !v.is_empty()), config_keys()?)).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_over_file_over_defaults() {
        let none = |_: &str| None;
        assert_eq!(resolve(none, Keys::default()), Ok(Budget::DEFAULT));
        let keys =
            || Keys { retain_count: Some(3), retain_size: Some("10M".into()), retain_min_free: Some("2%".into()) };
        assert_eq!(resolve(none, keys()), Ok(Budget { count: 3, bytes: 10 << 20, min_free: MinFree::Percent(2) }));
        let env = |k: &str| (k == "TXBOX_RETAIN_COUNT").then(|| "0".to_string());
        let b = resolve(env, keys());
        assert!(matches!(b, Ok(b) if b.count == 0 && !b.enabled()));
        assert!(resolve(|k: &str| (k == "TXBOX_RETAIN_SIZE").then(|| "lots".to_string()), Keys::default()).is_err());
        assert!(resolve(|k: &str| (k == "TXBOX_RETAIN_MIN_FREE").then(|| "101%".to_string()), Keys::default()).is_err());
        let free = |v: &str| resolve(|k: &str| (k == "TXBOX_RETAIN_MIN_FREE").then(|| v.to_string()), Keys::default());
        assert_eq!(free("2G").map(|b| b.min_free), Ok(MinFree::Bytes(2 << 30)));
        assert_eq!(free("0").map(|b| b.min_free), Ok(MinFree::Bytes(0)));
        assert_eq!(MinFree::Default.bytes(100 << 30), 1 << 30);
        assert_eq!(MinFree::Default.bytes(10 << 20), (10 << 20) / 20, "a small filesystem keeps 5%");
    }
}
