//! Canonical flags: one spelling per flag (`--recursive` → `-r`, `-rf` → `-r -f`), so rules name
//! a flag once. Owns the per-program flag tables; it may not look at anything but one argv.

/// Programs whose single-letter flags must not be unbundled.
const NO_BUNDLE: &[&str] = &[
    "find",
    "kill",
    "java",
    "gcc",
    "g++",
    "cc",
    "clang",
    "ld",
    "ffmpeg",
    "dd",
    "tar",
    "ps",
    "iptables",
    "ip6tables",
    "xargs",
    "awk",
    "gawk",
    "sed",
    "nft",
    "openssl",
    "pkill",
    "killall",
    "terraform",
    "tofu",
    "go",
    "mongo",
    "mongosh",
    "date",
    "hostname",
    "mount",
];

fn long_equiv(prog: &str, flag: &str) -> Option<&'static str> {
    let v = match (prog, flag) {
        ("rm", "--recursive") | ("rm", "-R") => "-r",
        ("rm", "--force") => "-f",
        ("rm", "--interactive") => "-i",
        ("rm", "--dir") => "-d",
        ("rm", "--verbose") => "-v",
        ("cp" | "mv", "--force") => "-f",
        ("cp", "--recursive") | ("cp", "-R") => "-r",
        ("cp" | "mv", "--interactive") => "-i",
        ("chmod" | "chown" | "chgrp" | "setfacl" | "chattr", "--recursive") => "-R",
        ("git", "--force") => "-f",
        ("git", "--delete") => "-d",
        ("git", "--hard") => "--hard",
        ("shred", "--remove") => "-u",
        ("shred", "--zero") => "-z",
        ("curl", "--upload-file") => "-T",
        ("curl", "--data") | ("curl", "--data-binary") | ("curl", "--data-raw") | ("curl", "--data-urlencode") => "-d",
        ("curl", "--form") => "-F",
        ("nc" | "ncat" | "netcat", "--exec") => "-e",
        ("nc" | "ncat" | "netcat", "--sh-exec") => "-c",
        ("sysctl", "--write") => "-w",
        ("kill", "-s") => "-s",
        _ => return None,
    };
    Some(v)
}

/// Canonicalise flags of an argv in place (program already a basename).
pub(super) fn canon_argv(argv: &mut Vec<String>, dyn_at: &mut Vec<Option<usize>>) {
    let Some(prog) = argv.first().cloned() else { return };
    // Without a flag there is nothing to rewrite (and no allocation for the common case).
    if !argv.iter().skip(1).any(|a| a.starts_with('-')) {
        return;
    }
    let bundle = !NO_BUNDLE.contains(&prog.as_str());
    let mut out = Vec::with_capacity(argv.len());
    let mut dout = Vec::with_capacity(argv.len());
    let mut ended = false;
    let dyn_at_in = std::mem::take(dyn_at);
    for (k, a) in std::mem::take(argv).into_iter().enumerate() {
        let d = dyn_at_in.get(k).copied().flatten();
        if k == 0 || ended || d.is_some() {
            out.push(a);
            dout.push(d);
            continue;
        }
        if a == "--" {
            ended = true;
            out.push(a);
            dout.push(None);
            continue;
        }
        if let Some(long) = a.strip_prefix("--") {
            let (name, val) = match long.split_once('=') {
                Some((n, v)) => (format!("--{n}"), Some(v)),
                None => (a.clone(), None),
            };
            let canon = long_equiv(&prog, &name).map(str::to_string).unwrap_or(name);
            out.push(canon);
            dout.push(None);
            if let Some(v) = val {
                out.push(v.to_string());
                dout.push(None);
            }
            continue;
        }
        if bundle && a.len() > 2 && a.starts_with('-') && a[1..].chars().all(|c| c.is_ascii_alphabetic()) {
            for c in a[1..].chars() {
                let f = format!("-{c}");
                let f = long_equiv(&prog, &f).map(str::to_string).unwrap_or(f);
                out.push(f);
                dout.push(None);
            }
            continue;
        }
        if a.starts_with('-') && a.len() == 2 {
            if let Some(e) = long_equiv(&prog, &a) {
                out.push(e.to_string());
                dout.push(None);
                continue;
            }
        }
        out.push(a);
        dout.push(d);
    }
    *argv = out;
    *dyn_at = dout;
}

pub(super) fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}
