//! Sizes on the command line: `512M`, `2G`, `4GiB`, `100k`, plain bytes.

/// Parse a size. Decimal and binary suffixes both mean powers of 1024, as users of `--memory`
/// expect (`2G` is 2 GiB).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("`{s}` is not a size (try 512M, 2G, 4GiB)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        "p" | "pb" | "pib" => 1 << 50,
        _ => return Err(format!("`{s}`: unknown size suffix (use K, M, G, T, optionally with iB)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("`{s}` is too large"))
}

/// A size as the largest suffix that writes it exactly (`4M`, `1P`, `1536K`, `100`).
pub fn show_size(v: u64) -> String {
    for (shift, suffix) in [(50, "P"), (40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if v >= 1 << shift && v.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", v >> shift);
        }
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(show_size(4 << 20), "4M");
        assert_eq!(show_size(1 << 50), "1P");
        assert_eq!(show_size(1536 << 10), "1536K");
        assert_eq!(show_size(100), "100");
    }
}
