//! Network targets visible in a command line: the `http(s)://` and `ws(s)://` URLs in the words
//! of a program that connects to what its arguments name ([`connects_to_its_urls`]: download
//! tools, package managers, git's network subcommands, and interpreters, whose inline code may
//! fetch what it names: `python -c "urlopen('https://x/')"` counts), anywhere in a word. A URL
//! given to anything else (`echo`, `sed`, `git commit -m`) is text, not a target. The engine
//! denies a command whose visible target is outside its allowlist before anything runs, saying
//! which `--allow-host` would allow it; what a program computes at run time, or a target this
//! misses, is the proxy's to refuse. Pure.

use crate::allow::{Host, Via};

/// A host a command names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub port: u16,
    pub via: Via,
    /// The URL as written, up to its authority, without credentials (`user:password@` is
    /// never repeated in a reason or a log).
    pub url: String,
}

/// Whether `host` is the sandbox's own loopback (reached directly: `NO_PROXY`).
pub fn is_loopback(host: &Host) -> bool {
    match host {
        Host::Ip(ip) => ip.is_loopback() || ip.is_unspecified(),
        Host::Name(n) => n == "localhost" || n.ends_with(".localhost"),
    }
}

/// The targets in one word.
pub fn in_word(word: &str) -> Vec<Target> {
    let lower = word.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = lower[from..].find("://").map(|i| i + from) {
        from = i + 3;
        // The scheme is whatever ends right before `://` (`git+https`, `x=https`).
        let before = &lower[..i];
        let Some((scheme, via, port)) =
            [("https", Via::Tunnel, 443), ("wss", Via::Tunnel, 443), ("http", Via::Http, 80), ("ws", Via::Http, 80)]
                .into_iter()
                .find(|(s, _, _)| before.ends_with(s))
        else {
            continue;
        };
        let scheme_start = i - scheme.len();
        let rest = &word[from..];
        // Brackets are not delimiters: an IPv6 literal keeps them.
        let end = rest.find(|c: char| "/?#\\'\"`()<>{},;|&$".contains(c) || c.is_whitespace()).unwrap_or(rest.len());
        let authority = &rest[..end];
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = split(hostport, port);
        if let (Ok(host), Some(port)) = (Host::parse(host), port) {
            out.push(Target { host, port, via, url: format!("{}://{hostport}", &word[scheme_start..i]) });
        }
    }
    out
}

fn split(hostport: &str, default: u16) -> (&str, Option<u16>) {
    if hostport.starts_with('[') {
        return match hostport.find(']') {
            Some(e) => match hostport[e + 1..].strip_prefix(':') {
                Some(p) => (&hostport[..=e], p.parse().ok().filter(|p| *p > 0)),
                None => (&hostport[..=e], Some(default)),
            },
            None => (hostport, None),
        };
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() => (h, p.parse().ok().filter(|p| *p > 0)),
        Some((h, _)) => (h, Some(default)),
        None => (hostport, Some(default)),
    }
}

/// Whether `argv`'s program connects to the URLs its arguments name: download tools, package
/// managers, git's network subcommands, and interpreters (inline code, or a script given a
/// URL). Anything else that mentions a URL (`echo`, `printf`, `sed`, `grep`, `git commit -m`)
/// only handles text.
pub fn connects_to_its_urls(argv: &[String]) -> bool {
    let Some(first) = argv.first() else { return false };
    let name = first.rsplit('/').next().unwrap_or(first);
    // `python3.12`, `pip3`: the name without its version.
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-');
    match base {
        "curl" | "wget" | "http" | "https" | "xh" | "aria2c" | "pip" | "uv" | "pipx" | "poetry" | "npm" | "npx"
        | "pnpm" | "yarn" | "bun" | "cargo" | "go" | "gem" | "bundle" | "composer" => true,
        "python" | "node" | "nodejs" | "deno" | "ruby" | "perl" | "php" => true,
        "git" => git_connects(&argv[1..]),
        _ => false,
    }
}

/// git's subcommand (after its global options) is one that talks to a remote.
fn git_connects(args: &[String]) -> bool {
    let mut words = args.iter();
    while let Some(w) = words.next() {
        match w.as_str() {
            "-C" | "-c" | "--git-dir" | "--work-tree" | "--namespace" | "--exec-path" | "--config-env" => {
                words.next();
            }
            w if w.starts_with('-') => {}
            sub => return matches!(sub, "clone" | "fetch" | "pull" | "push" | "ls-remote" | "submodule" | "archive"),
        }
    }
    false
}

/// The targets of every command (argv lists) that connects to its URLs, loopback left out,
/// each once.
pub fn in_commands(commands: &[Vec<String>]) -> Vec<Target> {
    let mut out: Vec<Target> = Vec::new();
    for argv in commands.iter().filter(|a| connects_to_its_urls(a)) {
        for word in argv.iter().skip(1) {
            for t in in_word(word) {
                if !is_loopback(&t.host) && !out.iter().any(|o| o.host == t.host && o.port == t.port && o.via == t.via)
                {
                    out.push(t);
                }
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hp(word: &str) -> Vec<String> {
        in_word(word).iter().map(|t| format!("{}:{}:{}", t.host, t.port, t.via.as_str())).collect()
    }

    #[test]
    fn urls_anywhere_in_a_word() {
        assert_eq!(hp("https://Reg.Example/simple"), ["reg.example:443:tunnel"]);
        assert_eq!(hp("http://reg.example:8080"), ["reg.example:8080:http"]);
        assert_eq!(hp("--index-url=https://user:pw@mirror.example:8443/x"), ["mirror.example:8443:tunnel"]);
        assert_eq!(
            hp("urlopen('https://a.example/x');urlopen(\"http://b.example\")"),
            ["a.example:443:tunnel", "b.example:80:http"]
        );
        assert_eq!(hp("git+https://git.example/r.git"), ["git.example:443:tunnel"]);
        assert_eq!(hp("wss://[2001:db8::1]:9000/s"), ["[2001:db8::1]:9000:tunnel"]);
        assert_eq!(hp("HTTPS://x.example?q"), ["x.example:443:tunnel"]);
        assert!(hp("ftp://x.example/").is_empty());
        assert!(hp("file:///etc/passwd").is_empty());
        assert!(hp("https://").is_empty());
        assert!(hp("https://x.example:0/").is_empty());
        assert!(hp("see a.example/x").is_empty());
    }

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_programs_that_connect_name_targets() {
        let url = "https://a.example/x";
        for yes in [
            &["curl", "-fsS", url][..],
            &["/usr/bin/wget", url],
            &["git", "clone", url],
            &["git", "-C", "dir", "-c", "http.x=1", "fetch", url],
            &["pip3", "install", "--index-url", url, "x"],
            &["python3.12", "-c", "import urllib.request as u; u.urlopen('https://a.example/x')"],
            &["npm", "install", "--registry", url],
        ] {
            assert_eq!(in_commands(&[words(yes)]).len(), 1, "{yes:?}");
        }
        for no in [
            &["echo", url][..],
            &["printf", "%s\n", url],
            &["sed", "-i", "s|http://old.example|https://a.example|", "f"],
            &["grep", "-r", url, "."],
            &["git", "commit", "-m", "see https://a.example/x"],
            &["git", "remote", "add", "origin", url],
            &["git", "-C", "clone", "log", url],
        ] {
            assert!(in_commands(&[words(no)]).is_empty(), "{no:?}");
        }
    }

    #[test]
    fn credentials_are_not_repeated() {
        let t = in_word("https://alice:hunter2@a.example:8443/x");
        assert_eq!(t[0].url, "https://a.example:8443");
    }

    #[test]
    fn loopback_is_the_sandbox_s_own() {
        let cmds = vec![
            vec!["curl".into(), "http://localhost:8000/".into(), "http://127.0.0.1:9/".into(), "http://[::1]/".into()],
            vec!["curl".into(), "https://a.example/".into(), "https://a.example/other".into()],
            vec!["https://not-an-argument.example/".into()],
        ];
        let t = in_commands(&cmds);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].url, "https://a.example");
    }

    proptest! {
        #[test]
        fn any_word_is_scanned_without_panicking(word in "\\PC{0,120}") {
            let _ = in_word(&word);
        }

        #[test]
        fn a_url_with_any_prefix_and_suffix_is_found(pre in "[a-z ('=]{0,8}", host in "[a-z]{1,10}\\.example", post in "([/?#'\")][a-z]{0,5})?") {
            let word = format!("{pre}https://{host}{post}");
            let found = in_word(&word);
            prop_assert!(found.iter().any(|t| t.host == Host::Name(host.clone()) && t.port == 443), "{word}");
        }
    }
}
