//! The wrapper table: programs that run another command given as their arguments (`sudo`,
//! `env`, `timeout`, `nice`, …) and where that command starts. Pure lookups over words; the
//! extractor (`dispatch`) decides what to do with the inner command.

use crate::words::EWord;

pub(super) enum Inner<'w> {
    /// The inner command starts at this index of the arguments.
    Words(usize),
    /// The wrapper runs shell code: this word from this byte on (`su -c CODE`, `su -cCODE`,
    /// `su --command=CODE`).
    Shell(&'w EWord, usize),
    /// A shell runs the arguments from this index on (`su USER ARGS…` hands them to the user's
    /// shell: `su - bob ./job.sh` runs `sh ./job.sh` as bob).
    ShellArgs(usize),
    /// No inner command (e.g. `sudo -l`, `command -v x`).
    None,
}

/// Whom a wrapper runs its command as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// Root: no user named, or `root`, `0`, `#0`, `toor`.
    Root,
    /// A user named literally who is not root (`su - postgres`, `sudo -u www-data -i`).
    Named,
    /// A user the engine cannot read (`su "$U"`, `sudo -u $(id -un)`): possibly root.
    Unknown,
}

/// The target of a user word: root's names and uid 0, a literal name, or something dynamic.
fn target_of(w: &EWord, at: usize) -> Target {
    let text = w.text.get(at..).unwrap_or_default();
    if w.dyn_at.is_some() || text.is_empty() {
        return Target::Unknown;
    }
    let uid = text.strip_prefix('#').unwrap_or(text);
    if matches!(text, "root" | "toor")
        || (!uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()) && uid.bytes().all(|b| b == b'0'))
    {
        return Target::Root;
    }
    Target::Named
}

/// What `su [OPTIONS] [-] [USER [ARGS…]]` runs, read as util-linux's getopt does
/// (`c:fg:G:lmpPs:hVw:`, bundles like `-lc CODE`, `--command=CODE`), and as whom. Options after
/// the user are read too: whether su or the user's shell takes `-c CODE` there, CODE runs.
fn su(rest: &[EWord]) -> (Inner<'_>, Target) {
    const VALUED: &[u8] = b"cgGsw";
    const LONG_VALUED: &[&str] = &["--shell", "--group", "--supp-group", "--whitelist-environment"];
    let mut code: Option<(&EWord, usize)> = None;
    let mut user: Option<usize> = None;
    let mut k = 0;
    let mut options = true;
    while k < rest.len() {
        let w = &rest[k];
        let a = w.text.as_str();
        if !options || a == "-" || !a.starts_with('-') {
            // The first operand is the user; later ones go to the user's shell.
            if (a != "-" || !options) && user.is_none() {
                user = Some(k);
            }
            k += 1;
            continue;
        }
        if a == "--" {
            options = false;
            k += 1;
            continue;
        }
        if let Some(long) = a.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, _)) => (n, Some(2 + n.len() + 1)),
                None => (long, None),
            };
            if matches!(name, "command" | "session-command") {
                code = match value {
                    Some(at) => Some((w, at)),
                    None => rest.get(k + 1).map(|v| (v, 0)),
                };
                k += if value.is_some() { 1 } else { 2 };
                continue;
            }
            k += if value.is_none() && LONG_VALUED.contains(&a) { 2 } else { 1 };
            continue;
        }
        // A bundle of short options: the first that takes a value takes the rest of the word,
        // or the next word.
        let mut next = k + 1;
        for (j, c) in a.bytes().enumerate().skip(1) {
            if VALUED.contains(&c) {
                let glued = j + 1 < a.len();
                if c == b'c' {
                    code = if glued { Some((w, j + 1)) } else { rest.get(k + 1).map(|v| (v, 0)) };
                }
                if !glued {
                    next = k + 2;
                }
                break;
            }
        }
        k = next;
    }
    let target = user.map_or(Target::Root, |u| target_of(&rest[u], 0));
    let inner = match (code, user) {
        (Some((w, at)), _) => Inner::Shell(w, at),
        (None, Some(u)) if u + 1 < rest.len() => Inner::ShellArgs(u + 1),
        _ => Inner::None,
    };
    (inner, target)
}

/// Whom `sudo`/`doas` runs the command as: the last `-u USER` (`-uUSER`, `--user USER`,
/// `--user=USER`, or `u` closing a bundle like `-iu USER`) among its options (`before` words).
fn sudo_target(rest: &[EWord], before: usize) -> Target {
    // Short options of sudo that take a value (doas: -u, -C).
    const VALUED: &[u8] = b"ugCDhprtUTR";
    let mut target = Target::Root;
    let mut k = 0;
    while k < before.min(rest.len()) {
        let w = &rest[k];
        let a = w.text.as_str();
        if a == "--user" {
            target = rest.get(k + 1).map_or(Target::Unknown, |v| target_of(v, 0));
            k += 2;
            continue;
        }
        if a.starts_with("--user=") {
            target = target_of(w, "--user=".len());
        } else if a.starts_with('-') && !a.starts_with("--") {
            for (j, c) in a.bytes().enumerate().skip(1) {
                if VALUED.contains(&c) {
                    let glued = j + 1 < a.len();
                    if c == b'u' {
                        target = if glued {
                            target_of(w, j + 1)
                        } else {
                            rest.get(k + 1).map_or(Target::Unknown, |v| target_of(v, 0))
                        };
                    }
                    if !glued {
                        k += 1;
                    }
                    break;
                }
            }
        }
        k += 1;
    }
    target
}

/// Whom a wrapper runs its command as, for the wrappers that change user (`None` otherwise).
pub(super) fn wrapper_target(prog: &str, rest: &[EWord]) -> Option<Target> {
    match prog {
        "su" => Some(su(rest).1),
        "sudo" | "doas" => {
            let before = match wrapper_inner(prog, rest) {
                Some(Inner::Words(k)) => k,
                _ => rest.len(),
            };
            Some(sudo_target(rest, before))
        }
        _ => None,
    }
}

/// Where a wrapper's inner command starts.
pub(super) fn wrapper_inner<'w>(prog: &str, rest: &'w [EWord]) -> Option<Inner<'w>> {
    // (options taking a value, positional operands before the command)
    let (valued, skip): (&[&str], usize) = match prog {
        "sudo" => (
            &[
                "-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "-R", "--user", "--group", "--chdir",
                "--prompt",
            ],
            0,
        ),
        "doas" => (&["-u", "-C"], 0),
        "run0" | "pkexec" => (&["--user", "-u"], 0),
        "runuser" => (&["-u", "-g", "-G", "--user", "--group"], 0),
        "env" => (&["-u", "-C", "-S", "--unset", "--chdir", "--split-string"], 0),
        "nice" => (&["-n", "--adjustment"], 0),
        "ionice" => (&["-c", "-n", "-p", "-P", "-u", "--class", "--classdata"], 0),
        "timeout" => (&["-s", "-k", "--signal", "--kill-after"], 1),
        "nohup" | "builtin" | "busybox" | "setsid" | "unbuffer" | "torsocks" | "proxychains" | "proxychains4"
        | "caffeinate" | "tsocks" | "catchsegv" => (&[], 0),
        "command" => (&[], 0),
        "exec" => (&["-a"], 0),
        "stdbuf" => (&["-i", "-o", "-e", "--input", "--output", "--error"], 0),
        "chroot" => (&["--userspec", "--groups"], 1),
        "time" => (&["-f", "-o", "--format", "--output"], 0),
        "watch" => (&["-n", "-d", "--interval", "-q", "--chgexit"], 0),
        "flock" => (&["-w", "-E", "--timeout", "--conflict-exit-code"], 1),
        "strace" | "ltrace" => (&["-e", "-o", "-p", "-s", "-u", "-E"], 0),
        "su" => (&[], 0),
        "firejail" | "bwrap" | "unshare" | "nsenter" | "systemd-run" | "faketime" => (&[], 0),
        "sg" => (&[], 1),
        _ => return None,
    };
    if prog == "su" {
        return Some(su(rest).0);
    }
    let mut k = 0;
    let mut skipped = 0;
    while k < rest.len() {
        let a = rest[k].text.as_str();
        if a == "--" {
            k += 1;
            break;
        }
        if prog == "command" && (a == "-v" || a == "-V") {
            return Some(Inner::None);
        }
        if a.starts_with('-') && a.len() > 1 {
            if valued.contains(&a) {
                k += 2;
            } else {
                k += 1;
            }
            continue;
        }
        if matches!(prog, "env" | "sudo" | "doas") && a.contains('=') {
            k += 1;
            continue;
        }
        if skipped < skip {
            skipped += 1;
            k += 1;
            continue;
        }
        break;
    }
    if prog == "time" && k == 0 && rest.is_empty() {
        return Some(Inner::None);
    }
    if k >= rest.len() {
        return Some(Inner::None);
    }
    Some(Inner::Words(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<EWord> {
        s.split(' ').filter(|w| !w.is_empty()).map(EWord::lit).collect()
    }

    /// What `su ARGS` runs (`code:…`, `args:…` or `none`) and as whom.
    fn su_of(args: &str) -> (String, Target) {
        let rest = words(args);
        let (inner, target) = su(&rest);
        let what = match inner {
            Inner::Shell(w, at) => format!("code:{}", &w.text[at..]),
            Inner::ShellArgs(k) => {
                format!("args:{}", rest[k..].iter().map(|w| w.text.as_str()).collect::<Vec<_>>().join(" "))
            }
            Inner::Words(_) => "words".into(),
            Inner::None => "none".into(),
        };
        (what, target)
    }

    #[test]
    fn su_reads_options_as_getopt_does() {
        assert_eq!(su_of(""), ("none".into(), Target::Root));
        assert_eq!(su_of("-"), ("none".into(), Target::Root));
        assert_eq!(su_of("- root"), ("none".into(), Target::Root));
        assert_eq!(su_of("-l postgres"), ("none".into(), Target::Named));
        assert_eq!(su_of("-s /bin/sh"), ("none".into(), Target::Root));
        assert_eq!(su_of("-s /bin/sh bob"), ("none".into(), Target::Named));
        assert_eq!(su_of("-c id"), ("code:id".into(), Target::Root));
        assert_eq!(su_of("-lc id"), ("code:id".into(), Target::Root));
        assert_eq!(su_of("-cid"), ("code:id".into(), Target::Root));
        // `-s` takes the rest of the word (`c`) as its value: no code, and `/bin/sh` is the user.
        assert_eq!(su_of("-lsc /bin/sh"), ("none".into(), Target::Named));
        assert_eq!(su_of("--command=id bob"), ("code:id".into(), Target::Named));
        assert_eq!(su_of("--command id"), ("code:id".into(), Target::Root));
        assert_eq!(su_of("--session-command=id bob"), ("code:id".into(), Target::Named));
        assert_eq!(su_of("- bob -c id"), ("code:id".into(), Target::Named));
        assert_eq!(su_of("- jetty ./run.sh x"), ("args:./run.sh x".into(), Target::Named));
        assert_eq!(su_of("-- -"), ("none".into(), Target::Named), "after `--`, `-` is a user name");
        assert_eq!(su_of("toor"), ("none".into(), Target::Root));
        let dynamic = [EWord { text: "$U".into(), dyn_at: Some(0), sources: Vec::new() }];
        assert_eq!(su(&dynamic).1, Target::Unknown);
    }

    #[test]
    fn sudo_target_is_the_last_user_option() {
        let t = |s: &str| wrapper_target("sudo", &words(s));
        assert_eq!(t("-i"), Some(Target::Root));
        assert_eq!(t("-u postgres -i"), Some(Target::Named));
        assert_eq!(t("-iu postgres"), Some(Target::Named));
        assert_eq!(t("-upostgres -s"), Some(Target::Named));
        assert_eq!(t("--user=www-data bash"), Some(Target::Named));
        assert_eq!(t("--user www-data bash"), Some(Target::Named));
        assert_eq!(t("-u bob -u root -i"), Some(Target::Root));
        assert_eq!(t("-u #0 -s"), Some(Target::Root));
        assert_eq!(t("-u 0 -s"), Some(Target::Root));
        assert_eq!(t("-u #1000 -s"), Some(Target::Named));
        assert_eq!(t("-g wheel -s"), Some(Target::Root));
        assert_eq!(t("-u"), Some(Target::Unknown));
        // Words of the inner command are not sudo's: `sudo bash -u x` runs bash as root.
        assert_eq!(t("bash -u x"), Some(Target::Root));
        assert_eq!(wrapper_target("env", &words("-u X bash")), None);
    }
}
