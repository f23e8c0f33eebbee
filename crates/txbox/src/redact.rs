//! Secret-looking values in command lines that txbox writes down (the audit log, `txbox log`),
//! replaced by `***`. What runs is never changed: only the text that is logged or shown.
//!
//! Redacted: passwords and tokens in URLs (`https://user:pw@host`, `https://TOKEN@host`),
//! `Authorization:`-style headers, options named like credentials (`--password=x`,
//! `--token x`), assignments to variables named like credentials (`GITHUB_TOKEN=x cmd`), and
//! values of well-known token shapes anywhere (GitHub, GitLab, npm, Slack, AWS access keys, API
//! keys of the `sk-` kind, Google API keys, JSON web tokens, PEM private keys).
//!
//! Owns: what a secret looks like in text. Touches nothing.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::{Captures, Regex};

const MASK: &str = "***";

/// Tokens recognisable by their shape alone.
static TOKEN_SHAPES: LazyLock<Regex> = LazyLock::new(|| {
    regex(concat!(
        r"(?:",
        r"\bgh[pousr]_[A-Za-z0-9]{30,}",
        r"|\bgithub_pat_[A-Za-z0-9_]{30,}",
        r"|\bglpat-[A-Za-z0-9_\-]{20,}",
        r"|\bnpm_[A-Za-z0-9]{30,}",
        r"|\bxox[abposr]-[A-Za-z0-9\-]{10,}",
        r"|\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b",
        r"|\bsk-[A-Za-z0-9_\-]{20,}",
        r"|\bAIza[0-9A-Za-z_\-]{35}",
        r"|\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
        r"|-----BEGIN [A-Z ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
        r")"
    ))
});

/// `scheme://user:password@` and `scheme://token@`: the credential part.
static URL_USERINFO: LazyLock<Regex> =
    LazyLock::new(|| regex(r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^\s/@'\x22]+)@"));

/// `Authorization: Bearer x`, `Proxy-Authorization: Basic x`, `X-Api-Key: x`, `Cookie: x`…
static HEADERS: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?i)(?P<pre>\b(?:proxy-)?authorization\s*:\s*|\b(?:x-)?(?:api|auth|access)[-_]?(?:key|token)\s*:\s*|\bprivate-token\s*:\s*|\bcookie\s*:\s*)(?P<val>[^'\x22\r\n]+)",
    )
});

/// `--password=x`, `--api-key x`, `--token x`, `-password x` (the option's name says it).
static OPTIONS: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?i)(?P<pre>(?:^|\s)--?(?:[a-z0-9][a-z0-9\-_]*)?(?:password|passwd|passphrase|secret|token|api[-_]?key|access[-_]?key|private[-_]?key|credentials?|auth)(?:=|\s+))(?P<val>'[^']*'|\x22[^\x22]*\x22|[^\s'\x22]+)",
    )
});

/// `NAME=value` where NAME names a credential (`export AWS_SECRET_ACCESS_KEY=…`, `env T=…`).
static ASSIGNMENTS: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?P<pre>(?:^|[\s;&|(`])(?P<name>[A-Za-z_][A-Za-z0-9_]*)=)(?P<val>'[^']*'|\x22[^\x22]*\x22|[^\s;&|)'\x22`]+)",
    )
});

fn regex(pattern: &str) -> Regex {
    // The patterns are constants checked by the tests below; an invalid one would match nothing
    // rather than panic at run time.
    Regex::new(pattern).unwrap_or_else(|_| Regex::new(r"[^\s\S]").unwrap_or_else(|_| unreachable!()))
}

/// Fragments (lower-cased) without one of which no pattern here can match. Checked first, so
/// that an ordinary command line or environment value costs a few substring searches, not the
/// compilation of the patterns (every `txbox run` is a new process).
const HINTS: &[&str] = &[
    "://",
    "auth",
    "cookie",
    "api",
    "token",
    "pass",
    "secret",
    "key",
    "cred",
    "pwd",
    "private",
    "jwt",
    "bearer",
    "gh",
    "glpat-",
    "npm_",
    "xox",
    "akia",
    "asia",
    "agpa",
    "aida",
    "aroa",
    "anpa",
    "sk-",
    "aiza",
    "eyj",
    "-----begin",
    // Credential variable names (crate::environ) in assignments.
    "aws_",
    "azure_",
    "arm_client",
    "vault_",
    "op_session_",
    "sessionid",
    "agent",
    "krb5",
    "dbus",
    "netrc",
    "docker_config",
];

fn may_hold_secret(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    HINTS.iter().any(|h| lower.contains(h))
}

/// Whether `text` holds a value shaped like a well-known token or a password in a URL.
pub fn holds_secret(text: &str) -> bool {
    if !may_hold_secret(text) {
        return false;
    }
    TOKEN_SHAPES.is_match(text)
        || URL_USERINFO.captures_iter(text).any(|c| c.name("info").is_some_and(|i| userinfo_is_secret(i.as_str())))
}

/// `user:password` always; a lone name only if it is long enough to be a token.
fn userinfo_is_secret(info: &str) -> bool {
    info.contains(':') || (info.len() >= 20 && info.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)))
}

/// `text` with every secret-looking value replaced by `***`.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out: Cow<'_, str> = Cow::Borrowed(text);
    if !may_hold_secret(text) {
        return out;
    }
    let mut apply = |re: &Regex, f: &dyn Fn(&Captures<'_>) -> String| {
        if re.is_match(&out) {
            out = Cow::Owned(re.replace_all(&out, |c: &Captures<'_>| f(c)).into_owned());
        }
    };
    apply(&TOKEN_SHAPES, &|_| MASK.to_string());
    apply(&URL_USERINFO, &|c| {
        let info = &c["info"];
        if !userinfo_is_secret(info) || info == MASK {
            return c[0].to_string();
        }
        match info.split_once(':') {
            Some((user, _)) => format!("{}{user}:{MASK}@", &c["pre"]),
            None => format!("{}{MASK}@", &c["pre"]),
        }
    });
    apply(&HEADERS, &|c| format!("{}{MASK}", &c["pre"]));
    apply(&OPTIONS, &|c| format!("{}{MASK}", &c["pre"]));
    apply(&ASSIGNMENTS, &|c| {
        // Only names written as environment variables are (`make key=v` is an argument).
        let name = &c["name"];
        if !name.bytes().any(|b| b.is_ascii_lowercase()) && crate::environ::is_secret_name(name) {
            format!("{}{MASK}", &c["pre"])
        } else {
            c[0].to_string()
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked() {
        let cases = [
            ("git clone https://ghp_0123456789abcdefghijABCDEFGHIJ012345@github.com/o/r", "ghp_0123"),
            ("git clone https://oauth2:glpat-abcdefghij0123456789@gitlab.example/x", "glpat-"),
            ("curl https://alice:hunter2@example.org/f", "hunter2"),
            ("curl -H 'Authorization: Bearer abc.def.ghi' https://api", "abc.def"),
            ("curl -H \"authorization: token 123456\" x", "123456"),
            ("curl -H 'X-Api-Key: k3y' x", "k3y"),
            ("mysql --password=hunter2 db", "hunter2"),
            ("tool --token s3cr3t run", "s3cr3t"),
            ("tool --api-key 'a b c' run", "a b c"),
            ("GITHUB_TOKEN=abc123 gh pr list", "abc123"),
            ("export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI; aws s3 ls", "wJalrXUtnFEMI"),
            ("echo AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
            ("npm config set //r/:_authToken npm_abcdefghijklmnopqrstuvwxyz0123456789", "npm_abcdefghij"),
            ("curl -d sk-ant-api03-abcdefghijklmnopqrstuvwxyz x", "sk-ant-api03"),
            ("echo 'xoxb-123456789012-abcdefghij'", "xoxb-1234"),
            ("echo '-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaA\n-----END OPENSSH PRIVATE KEY-----'", "b3BlbnNzaA"),
        ];
        for (cmd, secret) in cases {
            let r = redact(cmd);
            assert!(!r.contains(secret), "{cmd:?} → {r:?}");
            assert!(r.contains(MASK), "{cmd:?} → {r:?}");
        }
    }

    #[test]
    fn ordinary_commands_are_unchanged() {
        for cmd in [
            "make test",
            "cargo build --release",
            "git clone https://github.com/o/r",
            "ssh git@github.com",
            "scp f user@host:/tmp",
            "FOO=bar make",
            "sed -i s/a/b/ f.txt",
            "echo key=value",
            "ls --sort=time",
            "npm install --save-dev x",
            "python3 -m http.server --bind 127.0.0.1",
        ] {
            assert_eq!(redact(cmd), cmd);
        }
    }

    #[test]
    fn every_pattern_has_a_hint() {
        // A secret the hints would miss would skip the patterns: each case above has one.
        for t in ["https://u:p@h", "Authorization: x", "--password=x", "A_TOKEN=x", "AKIAIOSFODNN7EXAMPLE", "ghp_x"] {
            assert!(may_hold_secret(t), "{t}");
        }
        assert!(!may_hold_secret("make test && cargo build --release"));
        for a in [
            "AWS_PROFILE=x",
            "VAULT_ADDR=y",
            "SSH_AGENT_PID=3",
            "KRB5CCNAME=z",
            "NETRC=n",
            "DOCKER_CONFIG=d",
            "DBUS_SESSION_BUS_ADDRESS=u",
            "OP_SESSION_X=v",
            "ARM_CLIENT_ID=w",
            "PGPASSWORD=p",
            "MY_COOKIE=c",
        ] {
            assert!(redact(&format!("env {a} cmd")).contains(MASK), "{a}");
        }
    }

    #[test]
    fn redaction_is_idempotent() {
        let once = redact("curl https://u:p@h -H 'Authorization: Bearer t' --password=x T_TOKEN=y").into_owned();
        assert_eq!(redact(&once), once);
    }
}
