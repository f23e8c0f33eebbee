//! The wrapper table: programs that run another command given as their arguments (`sudo`,
//! `env`, `timeout`, `nice`, …) and where that command starts. Pure lookups over words; the
//! extractor (`dispatch`) decides what to do with the inner command.

use crate::words::EWord;

pub(super) enum Inner<'w> {
    /// The inner command starts at this index of the arguments.
    Words(usize),
    /// The wrapper runs this shell code (`su -c CODE`).
    Shell(&'w EWord),
    /// No inner command (e.g. `sudo -l`, `command -v x`).
    None,
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
        // su [opts] [user] [-c CODE]
        let mut k = 0;
        while k < rest.len() {
            let a = rest[k].text.as_str();
            if a == "-c" || a == "--command" {
                return Some(rest.get(k + 1).map(Inner::Shell).unwrap_or(Inner::None));
            }
            if a.starts_with("--command=") {
                return Some(Inner::None);
            }
            k += 1;
        }
        return Some(Inner::None);
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
