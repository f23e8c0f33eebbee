//! Downloaded code run later: files written with what a network client fetched (`curl -o f`,
//! `wget URL`, `curl … > f`, `curl … | tee f`), and the commands that then run one of them
//! (`sh f`, `python3 f`, `. f`, `./f`), which get the downloader in [`Cmd::code_from`] as if
//! the code had been piped into them. Owns that bookkeeping; the rule that refuses it is
//! `net.pipe-to-shell`.

use std::path::PathBuf;

use super::programs::{is_interp, is_shell};
use super::walk::passes_through;
use super::{Cmd, Extractor};
use crate::paths;

/// Programs that fetch data from the network.
const DOWNLOADERS: &[&str] = &[
    "curl", "wget", "fetch", "aria2c", "http", "https", "xh", "lynx", "links", "elinks", "nc", "ncat", "netcat",
    "socat", "ftp", "tftp",
];

/// The file name `wget URL` / `curl -O URL` saves to.
fn remote_name(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let path = rest.split(['?', '#']).next()?;
    let name = path.split_once('/').map(|(_, p)| p.rsplit('/').next().unwrap_or(""))?;
    (!name.is_empty()).then_some(name)
}

impl super::statics::Files for Extractor<'_> {
    fn text(&self, file: &str) -> Option<String> {
        self.script_text(file, self.cwd.as_deref())
    }
}

impl Extractor<'_> {
    /// Mark the arguments of `c` that name a copy of a secret; when `c` reads a secret and
    /// writes files, remember them as copies.
    pub(super) fn follow_secrets(&mut self, c: &mut Cmd) {
        let operands = || c.argv.iter().enumerate().skip(1).filter(|(_, a)| !a.starts_with('-'));
        if !self.secret_copies.is_empty() {
            let marked: Vec<usize> = operands()
                .filter(|(_, a)| {
                    let (text, _) = crate::rules::path_candidate(a);
                    self.resolve(text, c.cwd.as_deref()).is_some_and(|p| self.secret_copies.contains(&p))
                })
                .map(|(k, _)| k)
                .collect();
            c.secret_args.extend(marked);
        }
        let written: Vec<String> = c
            .redirects
            .iter()
            .filter(|r| r.write && r.dyn_at.is_none())
            .map(|r| r.target.clone())
            .chain(
                crate::writes::written(&c.argv)
                    .iter()
                    .filter_map(|o| c.argv.get(o.index).and_then(|a| a.get(o.offset..)).map(str::to_string)),
            )
            .collect();
        if written.is_empty() {
            return;
        }
        let secret = |text: &str, d: Option<usize>| {
            paths::classify(text, d, c.cwd.as_deref(), self.ctx).classes.contains(paths::PathClass::Secret)
        };
        let reads_secret = !c.secret_args.is_empty()
            || operands().any(|(k, a)| {
                let (text, off) = crate::rules::path_candidate(a);
                secret(text, c.dyn_at.get(k).copied().flatten().map(|d| d.saturating_sub(off)))
            })
            || c.redirects.iter().any(|r| !r.write && secret(&r.target, r.dyn_at));
        if reads_secret {
            for f in written {
                if let Some(p) = self.resolve(&f, c.cwd.as_deref()) {
                    self.secret_copies.push(p);
                }
            }
        }
    }
}

impl Extractor<'_> {
    /// `tar xf fetched.tgz -C DIR`, `unzip fetched.zip -d DIR`: DIR now holds downloaded files.
    fn follow_unpacking(&mut self, c: &Cmd) {
        let prog = c.program();
        if !matches!(prog, "tar" | "bsdtar" | "gtar" | "unzip" | "7z" | "7za" | "bunzip2" | "gunzip" | "unxz") {
            return;
        }
        let from = c.argv.iter().skip(1).find_map(|a| {
            let p = self.resolve(a.strip_prefix("--file=").unwrap_or(a), c.cwd.as_deref())?;
            self.downloads.iter().find(|(d, _)| *d == p).map(|(_, by)| by.clone())
        });
        let Some(by) = from else { return };
        let dir_flag = if prog == "unzip" { ["-d", "-d"] } else { ["-C", "--directory"] };
        let dir = c
            .argv
            .windows(2)
            .find(|w| dir_flag.contains(&w[0].as_str()))
            .map(|w| w[1].clone())
            .or_else(|| c.cwd.as_ref().map(|p| p.to_string_lossy().into_owned()));
        if let Some(p) = dir.and_then(|d| self.resolve(&d, c.cwd.as_deref())) {
            self.download_trees.push((p, by));
        }
    }
}

/// Longest script content kept for later runs.
const MAX_SCRIPT: usize = 64 * 1024;

impl Extractor<'_> {
    /// Forget what `file` held (it is written anew).
    pub(super) fn forget_script(&mut self, file: &str) {
        self.scripts.retain(|(p, _)| p.as_os_str() != file);
    }

    /// The known content of `file`, if any.
    pub(super) fn script_text(&self, file: &str, cwd: Option<&std::path::Path>) -> Option<String> {
        let p = self.resolve(file, cwd)?;
        self.scripts.iter().find(|(q, _)| *q == p).map(|(_, t)| t.clone())
    }

    /// Remember that `file` now holds `text` (appended to what it held, to stay conservative).
    pub(super) fn note_script(&mut self, file: &str, cwd: Option<&std::path::Path>, text: &str) {
        let Some(p) = self.resolve(file, cwd) else { return };
        match self.scripts.iter_mut().find(|(q, _)| *q == p) {
            Some((_, old)) if old.len() + text.len() <= MAX_SCRIPT => old.push_str(text),
            Some(_) => {}
            None if text.len() <= MAX_SCRIPT => self.scripts.push((p, text.to_string())),
            None => {}
        }
    }

    /// The content and arguments when `c` runs, as shell code, a file whose content is known:
    /// `sh f ARGS`, `. f`, `./f` (unless its `#!` names something other than a shell).
    pub(super) fn script_run(&self, c: &Cmd) -> Option<(String, Vec<String>)> {
        if self.scripts.is_empty() {
            return None;
        }
        let prog = c.program();
        let stdin_file = c.redirects.iter().find(|r| !r.write && r.dyn_at.is_none()).map(|r| r.target.as_str());
        let operand = c.argv.iter().skip(1).position(|a| !a.starts_with('-'));
        let (file, args): (&str, Vec<String>) = if is_shell(prog) && operand.is_none() && stdin_file.is_some() {
            (stdin_file?, Vec::new())
        } else if is_shell(prog) || prog == "source" || prog == "." {
            let k = operand? + 1;
            if c.dyn_at.get(k).copied().flatten().is_some() || c.argv.iter().any(|a| a == "-c") {
                return None;
            }
            (c.argv.get(k)?, c.argv[k + 1..].to_vec())
        } else if c.path.contains('/') {
            (&c.path, c.argv[1..].to_vec())
        } else {
            return None;
        };
        let p = self.resolve(file, c.cwd.as_deref())?;
        let text = &self.scripts.iter().find(|(q, _)| *q == p)?.1;
        let shebang = text.lines().next().filter(|l| l.starts_with("#!")).unwrap_or("#!/bin/sh");
        let interp = shebang.trim_start_matches("#!").split_whitespace().map(|w| w.rsplit('/').next().unwrap_or(w));
        let runs_shell = interp.take(2).any(is_shell);
        runs_shell.then(|| (text.clone(), args))
    }

    /// The normalised path a static word names, from the command's working directory.
    fn resolve(&self, text: &str, cwd: Option<&std::path::Path>) -> Option<PathBuf> {
        let p = if text == "~" || text.starts_with("~/") {
            self.ctx.home.as_ref()?.join(text.trim_start_matches('~').trim_start_matches('/'))
        } else if text.starts_with('/') {
            PathBuf::from(text)
        } else {
            cwd?.join(text)
        };
        Some(paths::normalize(&p))
    }

    /// Record the files `c` writes with downloaded content, and mark `c` when it runs one.
    pub(super) fn follow_downloads(&mut self, c: &mut Cmd) {
        if !self.downloads.is_empty() || !self.download_trees.is_empty() {
            let prog = c.program().to_string();
            let mut run: Vec<&str> = Vec::new();
            if c.path.contains('/') {
                run.push(&c.path);
            }
            // A shell reading its program from a file on stdin (`bash < f`).
            if is_shell(&prog) || is_interp(&prog) {
                run.extend(c.redirects.iter().filter(|r| !r.write && r.dyn_at.is_none()).map(|r| r.target.as_str()));
            }
            // The script is the first operand; later ones are its arguments (data).
            if is_shell(&prog) || is_interp(&prog) || prog == "source" || prog == "." {
                let script = c.argv.iter().enumerate().skip(1).find(|(_, a)| !a.starts_with('-'));
                if let Some((_, a)) = script.filter(|(k, _)| c.dyn_at.get(*k).copied().flatten().is_none()) {
                    run.push(a);
                }
            }
            let hits: Vec<String> = run
                .iter()
                .filter_map(|t| self.resolve(t, c.cwd.as_deref()))
                .filter_map(|p| {
                    self.downloads
                        .iter()
                        .find(|(d, _)| *d == p)
                        .or_else(|| self.download_trees.iter().find(|(d, _)| p.starts_with(d)))
                        .map(|(_, by)| by.clone())
                })
                .collect();
            for by in hits {
                if !c.code_from.contains(&by) {
                    c.code_from.push(by);
                }
            }
        }
        self.follow_unpacking(c);
        let prog = c.program();
        let fetched = if DOWNLOADERS.contains(&prog) {
            Some(prog.to_string())
        } else if passes_through(prog) {
            c.stdin_from.iter().find(|p| DOWNLOADERS.contains(&p.as_str())).cloned()
        } else {
            None
        };
        let Some(by) = fetched else { return };
        let prog = c.program().to_string();
        let mut files: Vec<String> =
            c.redirects.iter().filter(|r| r.write && r.dyn_at.is_none()).map(|r| r.target.clone()).collect();
        for o in crate::writes::written(&c.argv) {
            if c.dyn_at.get(o.index).copied().flatten().is_none() {
                if let Some(t) = c.argv.get(o.index).and_then(|a| a.get(o.offset..)) {
                    files.push(t.to_string());
                }
            }
        }
        let saves_remote_name = match prog.as_str() {
            "wget" => !c.argv.iter().any(|a| a == "-O" || a == "--output-document" || a.starts_with("-O")),
            "curl" => c.argv.iter().any(|a| a == "-O" || a == "--remote-name" || a == "--remote-name-all"),
            "aria2c" => !c.argv.iter().any(|a| a == "-o" || a == "--out"),
            "fetch" => !c.argv.iter().any(|a| a == "-o"),
            _ => false,
        };
        if saves_remote_name {
            let dir = crate::writes::written(&c.argv)
                .first()
                .filter(|_| prog == "wget")
                .and_then(|o| c.argv.get(o.index).and_then(|a| a.get(o.offset..)))
                .map(str::to_string);
            for a in c.argv.iter().skip(1).filter(|a| a.contains("://")) {
                if let Some(name) = remote_name(a) {
                    files.push(match &dir {
                        Some(d) => format!("{d}/{name}"),
                        None => name.to_string(),
                    });
                }
            }
        }
        for f in files {
            if let Some(p) = self.resolve(&f, c.cwd.as_deref()) {
                self.downloads.push((p, by.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_names() {
        assert_eq!(remote_name("https://x.org/a/b/install.sh?x=1"), Some("install.sh"));
        assert_eq!(remote_name("https://x.org/"), None);
        assert_eq!(remote_name("https://x.org"), None);
        assert_eq!(remote_name("install.sh"), None);
    }
}
