//! The environment a command gets: the caller's, minus credentials. The caller is trusted, but
//! what its environment carries (a token exported for another tool, an agent socket) must not
//! reach the command unasked. A variable is removed when its *name* says it holds a credential
//! or a way to one, or its *value* has the shape of a well-known token ([`crate::redact`]);
//! `--pass-env NAME` (or `pass_env` in the configuration, `TXBOX_PASS_ENV` for `txbox sh`)
//! passes one anyway.
//!
//! Owns: which variables are credentials. Touches nothing but the process environment, read.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// Words (`_`-separated parts of a name, upper-cased) that mark a credential wherever they
/// stand: `GITHUB_TOKEN`, `TOKEN_GITHUB`, `AWS_SECRET_ACCESS_KEY`, `SSH_AUTH_SOCK`.
const SECRET_WORDS: &[&str] = &[
    "TOKEN",
    "TOKENS",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWORDS",
    "PASSWD",
    "PASSPHRASE",
    "PWD",
    "KEY",
    "KEYS",
    "APIKEY",
    "PRIVATE",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "AUTH",
    "COOKIE",
    "COOKIES",
    "SESSIONID",
    "JWT",
    "BEARER",
];

/// Endings that mark a credential even glued to the word before: `PGPASSWORD`, `MYAPITOKEN`.
const SECRET_SUFFIXES: &[&str] = &["TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "APIKEY", "CREDENTIALS"];

/// Whole families: every variable of these prefixes configures access to a cloud account.
const SECRET_PREFIXES: &[&str] = &["AWS_", "AZURE_", "ARM_CLIENT", "GOOGLE_CREDENTIALS", "VAULT_", "OP_SESSION_"];

/// Names that point at a live credential (an agent, a ticket cache, a session bus) rather
/// than hold one.
const SECRET_NAMES: &[&str] = &[
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "KRB5CCNAME",
    "DBUS_SESSION_BUS_ADDRESS",
    "NETRC",
    "DOCKER_CONFIG",
];

/// Names that look like credentials by the rules above but are not: the working directory.
const NOT_SECRET: &[&str] = &["PWD", "OLDPWD"];

/// Whether a variable of this name holds (or leads to) a credential.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if NOT_SECRET.contains(&upper.as_str()) {
        return false;
    }
    SECRET_NAMES.contains(&upper.as_str())
        || SECRET_PREFIXES.iter().any(|p| upper.starts_with(p))
        || SECRET_SUFFIXES.iter().any(|s| upper.ends_with(s))
        || upper.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| SECRET_WORDS.contains(&w))
}

/// Why a variable is withheld, if it is: by name, or by a value shaped like a token.
pub fn withheld(name: &OsStr, value: &OsStr) -> bool {
    let name = String::from_utf8_lossy(name.as_bytes());
    is_secret_name(&name) || crate::redact::holds_secret(&String::from_utf8_lossy(value.as_bytes()))
}

/// The environment for a command, as `KEY=VALUE` entries: this process's, minus credentials,
/// plus those named in `pass` (by exact name) that are set.
///
/// In a process that serves many runs ([`remember`]), the filter's answer for the last
/// environment is kept (the token shapes' checks of every value are most of its cost, paid
/// again for every run of a server whose environment does not change): the environment is
/// read each time and compared whole. A one-run process filters once and keeps nothing.
pub fn for_command(pass: &[String]) -> Vec<OsString> {
    if !REMEMBER.load(std::sync::atomic::Ordering::Relaxed) {
        return filter(std::env::vars_os(), pass);
    }
    static LAST: Last = std::sync::Mutex::new(None);
    remembered(&LAST, std::env::vars_os().collect(), pass)
}

static REMEMBER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Keep the filter's last answer from now on (a front end that serves many runs).
pub fn remember() {
    REMEMBER.store(true, std::sync::atomic::Ordering::Relaxed);
}

type Vars = Vec<(OsString, OsString)>;
type Last = std::sync::Mutex<Option<(Vars, Vec<String>, Vec<OsString>)>>;

/// [`filter`] of `vars` and `pass`, or what it gave for exactly these last time (`last`).
fn remembered(last: &Last, vars: Vars, pass: &[String]) -> Vec<OsString> {
    if let Ok(kept) = last.lock() {
        if let Some((_, _, out)) = kept.as_ref().filter(|(v, p, _)| *v == vars && p == pass) {
            return out.clone();
        }
    }
    let out = filter(vars.clone(), pass);
    if let Ok(mut kept) = last.lock() {
        *kept = Some((vars, pass.to_vec(), out.clone()));
    }
    out
}

/// [`for_command`] over any list of variables (pure, for tests).
pub fn filter(vars: impl IntoIterator<Item = (OsString, OsString)>, pass: &[String]) -> Vec<OsString> {
    vars.into_iter()
        .filter(|(k, v)| pass.iter().any(|p| p.as_bytes() == k.as_bytes()) || !withheld(k, v))
        .map(|(k, v)| {
            let mut e = k.into_vec();
            e.push(b'=');
            e.extend(v.into_vec());
            OsString::from_vec(e)
        })
        .collect()
}

/// Names in `TXBOX_PASS_ENV` (comma- or space-separated), for `txbox sh`, which takes no flags.
pub fn pass_from_env() -> Vec<String> {
    std::env::var("TXBOX_PASS_ENV")
        .map(|v| v.split([',', ' ']).filter(|s| !s.is_empty()).map(str::to_string).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept answer is for exactly the environment and names it was made for: a variable
    /// added, a value changed, another name passed, each gives the filter's answer anew.
    #[test]
    fn the_kept_answer_follows_every_change_of_the_environment() {
        let last: Last = std::sync::Mutex::new(None);
        let var = |k: &str, v: &str| (OsString::from(k), OsString::from(v));
        let token = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB";
        let mut vars = vec![var("PATH", "/usr/bin"), var("LANG", "C")];
        let steps: Vec<(Vars, Vec<String>)> = vec![
            (vars.clone(), vec![]),
            (vars.clone(), vec![]),
            (
                {
                    vars.push(var("GITHUB_TOKEN", token));
                    vars.clone()
                },
                vec![],
            ),
            (vars.clone(), vec!["GITHUB_TOKEN".into()]),
            (vars.clone(), vec![]),
            (
                {
                    vars[1] = var("LANG", token);
                    vars.clone()
                },
                vec![],
            ),
            (
                {
                    vars.truncate(1);
                    vars.clone()
                },
                vec![],
            ),
        ];
        for (vars, pass) in steps {
            assert_eq!(remembered(&last, vars.clone(), &pass), filter(vars.clone(), &pass), "{vars:?} {pass:?}");
        }
    }

    #[test]
    fn credential_names_are_withheld() {
        for n in [
            "GITHUB_TOKEN",
            "GH_TOKEN",
            "NPM_TOKEN",
            "TXBOX_TOKEN",
            "CI_JOB_TOKEN",
            "HF_TOKEN",
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AZURE_CLIENT_SECRET",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "DB_PASSWORD",
            "PGPASSWORD",
            "MYSQL_PWD",
            "SSH_AUTH_SOCK",
            "GPG_AGENT_INFO",
            "KRB5CCNAME",
            "STRIPE_SECRET",
            "django_secret_key",
            "NPM_CONFIG__AUTH",
            "VAULT_ADDR",
            "DBUS_SESSION_BUS_ADDRESS",
            "SENTRY_AUTH_TOKEN",
            "SLACK_BOT_TOKEN",
            "REGISTRY_CREDENTIALS",
            "SIGNING_KEY",
        ] {
            assert!(is_secret_name(n), "{n}");
        }
    }

    #[test]
    fn ordinary_names_pass() {
        for n in [
            "PATH",
            "HOME",
            "USER",
            "LANG",
            "LC_ALL",
            "TERM",
            "PWD",
            "OLDPWD",
            "SHELL",
            "EDITOR",
            "CARGO_HOME",
            "RUSTFLAGS",
            "PYTHONPATH",
            "NODE_ENV",
            "KEYTIMEOUT",
            "GIT_AUTHOR_NAME",
            "TZ",
            "TMPDIR",
            "XDG_CONFIG_HOME",
            "MONKEY",
            "TOKENIZERS_PARALLELISM",
        ] {
            assert!(!is_secret_name(n), "{n}");
        }
    }

    #[test]
    fn filter_removes_secrets_by_name_and_value_unless_passed() {
        let vars = [
            ("PATH", "/usr/bin"),
            ("GITHUB_TOKEN", "x"),
            ("DEPLOY", "ghp_0123456789abcdefghijABCDEFGHIJ012345"),
            ("DATABASE_URL", "postgres://app:hunter2@db/x"),
            ("HARMLESS_URL", "https://example.org/x"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let names = |e: Vec<OsString>| -> Vec<String> {
            e.iter().map(|s| s.to_string_lossy().split('=').next().unwrap_or("").to_string()).collect()
        };
        assert_eq!(names(filter(vars.clone(), &[])), ["PATH", "HARMLESS_URL"]);
        assert_eq!(names(filter(vars, &["GITHUB_TOKEN".into()])), ["PATH", "GITHUB_TOKEN", "HARMLESS_URL"]);
    }
}
