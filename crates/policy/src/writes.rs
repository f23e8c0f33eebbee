//! Which operands of a command it writes: `tee FILE…`, the destination of `cp`/`mv`/`install`/
//! `ln`/`rsync`/`scp`, `dd of=`, `sed -i FILE…`, `truncate FILE…`, `curl -o`, `wget -O`. Owns
//! these per-program models and nothing else: it looks at one canonical argv and returns where
//! the written paths are; classifying them is `paths`', matching them `rules`'.

/// Where a written path sits in an argv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Operand {
    /// Index in the argv.
    pub index: usize,
    /// Byte offset of the path inside that argument (`of=/x` → 3).
    pub offset: usize,
}

fn at(index: usize) -> Operand {
    Operand { index, offset: 0 }
}

/// Options of `prog` that take a value as the next argument (so the value is no operand).
fn valued(prog: &str) -> &'static [&'static str] {
    match prog {
        "cp" | "mv" | "ln" => &["-S", "--suffix", "-t", "--target-directory"],
        "install" => &["-m", "--mode", "-o", "--owner", "-g", "--group", "-S", "--suffix", "-t", "--target-directory"],
        "rsync" => &[
            "-e",
            "--rsh",
            "--exclude",
            "--include",
            "--filter",
            "-f",
            "--files-from",
            "--rsync-path",
            "-T",
            "--temp-dir",
            "--chmod",
            "--chown",
            "--log-file",
            "--password-file",
            "--port",
        ],
        "scp" => &["-P", "-i", "-o", "-F", "-c", "-l", "-S", "-J"],
        "sed" => &["-e", "--expression", "-f", "--file", "-l", "--line-length"],
        "perl" => &["-e", "-E", "-M", "-I"],
        "touch" => &["-d", "--date", "-t", "-r", "--reference"],
        "truncate" => &["-s", "--size", "-r", "--reference"],
        "tee" => &[],
        _ => &[],
    }
}

/// The operands (non-option arguments) of an argv, after skipping option values.
fn operands(argv: &[String], prog: &str) -> Vec<usize> {
    let vals = valued(prog);
    let mut out = Vec::new();
    let mut k = 1;
    let mut ended = false;
    while k < argv.len() {
        let a = argv[k].as_str();
        if !ended && a == "--" {
            ended = true;
        } else if !ended && a.starts_with('-') && a.len() > 1 {
            if vals.contains(&a) {
                k += 1;
            }
        } else {
            out.push(k);
        }
        k += 1;
    }
    out
}

/// The value of an option given as `-o VALUE`, `--output VALUE` or `--output=VALUE`.
fn option_values(argv: &[String], names: &[&str]) -> Vec<Operand> {
    let mut out = Vec::new();
    for (k, a) in argv.iter().enumerate().skip(1) {
        if names.contains(&a.as_str()) && k + 1 < argv.len() {
            out.push(at(k + 1));
        }
        for n in names.iter().filter(|n| n.starts_with("--")) {
            if a.strip_prefix(n).is_some_and(|r| r.starts_with('=')) {
                out.push(Operand { index: k, offset: n.len() + 1 });
            }
        }
    }
    out
}

/// The operands `argv` (canonical, program by basename) writes to.
pub(crate) fn written(argv: &[String]) -> Vec<Operand> {
    let Some(prog) = argv.first().map(String::as_str) else { return Vec::new() };
    match prog {
        "tee" | "truncate" => operands(argv, prog).into_iter().map(at).collect(),
        "cp" | "mv" | "install" | "ln" | "rsync" | "scp" => {
            let target = option_values(argv, &["-t", "--target-directory"]);
            if !target.is_empty() {
                return target;
            }
            let ops = operands(argv, prog);
            let dir_mode = prog == "install" && argv.iter().any(|a| a == "-d" || a == "--directory");
            if dir_mode {
                return ops.into_iter().map(at).collect();
            }
            // `ln -s TARGET` alone links into the current directory: nothing outside.
            match ops.as_slice() {
                [.., last] if ops.len() >= 2 => {
                    let t = &argv[*last];
                    // A remote destination (`host:path`) is not a local write.
                    let remote = t.find(':').is_some_and(|c| !t[..c].contains('/'));
                    if remote {
                        Vec::new()
                    } else {
                        vec![at(*last)]
                    }
                }
                _ => Vec::new(),
            }
        }
        "dd" => argv
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, a)| a.starts_with("of="))
            .map(|(k, _)| Operand { index: k, offset: 3 })
            .collect(),
        "sed" => {
            let in_place = argv.iter().skip(1).any(|a| a == "-i" || a.starts_with("-i") || a.starts_with("--in-place"));
            if !in_place {
                return Vec::new();
            }
            let ops = operands(argv, prog);
            // Without -e/-f the first operand is the script.
            let scripted = argv.iter().any(|a| matches!(a.as_str(), "-e" | "--expression" | "-f" | "--file"));
            ops.into_iter().skip(if scripted { 0 } else { 1 }).map(at).collect()
        }
        "curl" | "sort" | "fetch" => option_values(argv, &["-o", "--output"]),
        "touch" => operands(argv, prog).into_iter().map(at).collect(),
        // In-place edits: `perl -pi -e CODE FILE…`, `awk -i inplace PROG FILE…`.
        "perl" if argv.iter().any(|a| a == "-i" || a.starts_with("-i")) => {
            let ops = operands(argv, prog);
            let coded = argv.iter().any(|a| a == "-e" || a == "-E");
            ops.into_iter().skip(if coded { 0 } else { 1 }).map(at).collect()
        }
        "awk" | "gawk" if argv.windows(2).any(|w| w[0] == "-i" && w[1] == "inplace") => {
            let ops: Vec<usize> = operands(argv, prog).into_iter().filter(|k| argv[*k] != "inplace").collect();
            ops.into_iter().skip(1).map(at).collect()
        }
        "wget" => {
            let mut v = option_values(argv, &["-O", "--output-document", "-P", "--directory-prefix"]);
            v.retain(|o| argv[o.index].get(o.offset..) != Some("-"));
            v
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> Vec<String> {
        let argv: Vec<String> = s.split(' ').map(str::to_string).collect();
        written(&argv).iter().map(|o| argv[o.index][o.offset..].to_string()).collect()
    }

    #[test]
    fn destinations() {
        assert_eq!(w("tee -a /etc/hosts x"), ["/etc/hosts", "x"]);
        assert_eq!(w("cp -r a b /usr/lib/"), ["/usr/lib/"]);
        assert_eq!(w("cp -t /usr/bin a b"), ["/usr/bin"]);
        assert_eq!(w("cp --target-directory=/opt a"), ["/opt"]);
        assert_eq!(w("install -m 755 tool /usr/bin/tool"), ["/usr/bin/tool"]);
        assert_eq!(w("install -d /opt/a /opt/b"), ["/opt/a", "/opt/b"]);
        assert_eq!(w("ln -s x"), Vec::<String>::new());
        assert_eq!(w("scp a host:/tmp"), Vec::<String>::new());
        assert_eq!(w("scp host:/tmp/a /etc/x"), ["/etc/x"]);
        assert_eq!(w("dd if=a of=/dev/sda bs=1M"), ["/dev/sda"]);
        assert_eq!(w("sed -i s/a/b/ f g"), ["f", "g"]);
        assert_eq!(w("sed -i -e s/a/b/ f"), ["f"]);
        assert_eq!(w("sed s/a/b/ f"), Vec::<String>::new());
        assert_eq!(w("curl -o /tmp/x https://x"), ["/tmp/x"]);
        assert_eq!(w("curl --output=out https://x"), ["out"]);
        assert_eq!(w("wget -O - https://x"), Vec::<String>::new());
        assert_eq!(w("truncate -s 0 /var/log/wtmp"), ["/var/log/wtmp"]);
        assert_eq!(w("touch -d 2020-01-01 /etc/nologin"), ["/etc/nologin"]);
        assert_eq!(w("perl -p -i -e s/a/b/ /etc/hosts"), ["/etc/hosts"]);
        assert_eq!(w("perl -e print"), Vec::<String>::new());
        assert_eq!(w("awk -i inplace {print} /etc/hosts"), ["/etc/hosts"]);
        assert_eq!(w("fetch -o /tmp/x https://x"), ["/tmp/x"]);
    }
}
