//! The policy evaluation report: scores the engine on the labelled public corpora and on the
//! repo's own evasion corpus, per category, with latency, and writes it as Markdown.
//!
//! `cargo run --release -p txbox-policy --example corpus_eval -- ../shared/corpus [--out docs/POLICY.md] [-v]
//! [--dump FILE]`; `--dump` writes every evaluated string with its action and rule, one per line,
//! so two builds can be compared decision by decision (a refactoring must leave it unchanged).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use txbox_policy::{example_context, Action, Evaluation, Policy};

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some('\\') => out.push('\\'),
                Some(o) => {
                    out.push('\\');
                    out.push(o);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Rows of a TSV with a header line: the columns of each row.
fn tsv(path: &Path) -> Vec<Vec<String>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("skipping {}: unreadable", path.display());
        return Vec::new();
    };
    text.lines().skip(1).map(|l| l.split('\t').map(str::to_string).collect()).collect()
}

#[derive(Default)]
struct Tally {
    n: usize,
    deny: usize,
    transact: usize,
    allow: usize,
    opaque: usize,
}

impl Tally {
    fn add(&mut self, e: &Evaluation) {
        self.n += 1;
        match e.decision.action {
            Action::Deny => self.deny += 1,
            Action::Transact => self.transact += 1,
            Action::Allow => self.allow += 1,
        }
        if e.decision.rule.as_deref().is_some_and(|r| r.starts_with("engine.")) {
            self.opaque += 1;
        }
    }

    fn row(&self, name: &str) -> String {
        let pct = |a: usize| if self.n == 0 { 0.0 } else { 100.0 * a as f64 / self.n as f64 };
        format!(
            "| {name} | {} | {} ({:.1}%) | {} ({:.1}%) | {} ({:.1}%) | {} ({:.1}%) |\n",
            self.n,
            self.deny,
            pct(self.deny),
            self.transact,
            pct(self.transact),
            self.allow,
            pct(self.allow),
            self.opaque,
            pct(self.opaque)
        )
    }
}

const HEADER: &str = "| set | lines | deny | transact | allow | opaque |\n|---|---|---|---|---|---|\n";

struct Eval {
    policy: Policy,
    ctx: txbox_policy::Context,
    latencies: Vec<u64>,
    dump: Option<String>,
}

impl Eval {
    fn eval(&mut self, cmd: &str) -> Evaluation {
        let t = Instant::now();
        let e = self.policy.evaluate_str(cmd, &self.ctx);
        self.latencies.push(t.elapsed().as_nanos() as u64);
        if let Some(d) = &mut self.dump {
            let _ = writeln!(
                d,
                "{}\t{}\t{}",
                e.decision.action.as_str(),
                e.decision.rule.as_deref().unwrap_or("-"),
                cmd.replace('\\', "\\\\").replace('\n', "\\n").replace('\t', "\\t")
            );
        }
        e
    }
}

/// The directory a benchmark's task runs in, where its README or set-up says so: Terminal-Bench
/// tasks in `/app` (some multi-turn ones in `/workdir`: the one the task names more often),
/// InterCode's prepared file systems 1–3 in `/testbed`, `/system`, `/workspace`, OpenHands'
/// Multi-SWE-bench in `/workspace`. `None`: the default context.
fn task_workspace(source: &str, task: &str, (app, workdir): (usize, usize)) -> Option<&'static str> {
    match source {
        "terminal-bench-core" | "mmtb-core" => Some("/app"),
        "tbench-multiturn" => Some(if workdir > app { "/workdir" } else { "/app" }),
        "openhands/multi-swe-bench-example" => Some("/workspace"),
        _ if source.starts_with("intercode-bash") => match task.split('/').next() {
            Some("nl2bash_fs_1") => Some("/testbed"),
            Some("nl2bash_fs_2") => Some("/system"),
            Some("nl2bash_fs_3") => Some("/workspace"),
            _ => None,
        },
        _ => None,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .filter(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("../shared/corpus"));
    let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    let verbose = args.iter().any(|a| a == "-v");
    let dump = args.iter().position(|a| a == "--dump").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    let mut ev = Eval {
        policy: Policy::builtin(),
        ctx: example_context(),
        latencies: Vec::new(),
        dump: dump.as_ref().map(|_| String::new()),
    };
    let mut head = String::new();
    let _ = writeln!(head, "# Policy evaluation\n");
    let _ = writeln!(
        head,
        "Generated by `cargo run --release -p txbox-policy --example corpus_eval -- ../shared/corpus --out docs/POLICY.md`.\n\
         Workspace context: `{}` unless a section says otherwise. *opaque* = the engine could not resolve the \
         command statically (`engine.*`), which is always at least `transact`. Privilege escalation: `su` \
         and `sudo -i/-s`, `sudo bash` and the like (a shell as another user) are denied; `sudo CMD`, \
         `su USER -c CMD` and `sudo sh -c CMD` are judged by `CMD` (denying every `sudo` would put NL2Bash \
         false positives near 1.8%).\n",
        ev.ctx.workspace.display()
    );
    let mut md = String::new();

    // NL2Bash: labelled deny / ok; deny lines broken down by the review notes' reason.
    let nl = tsv(&dir.join("nl2bash_labels.tsv"));
    let notes: BTreeMap<String, String> = tsv(&dir.join("nl2bash_review_notes.tsv"))
        .into_iter()
        .filter(|r| r.len() >= 4)
        .map(|r| (r[3].clone(), r[2].clone()))
        .collect();
    let (mut deny_t, mut ok_t) = (Tally::default(), Tally::default());
    let mut by_reason: BTreeMap<String, Tally> = BTreeMap::new();
    let mut fp_rules: BTreeMap<String, usize> = BTreeMap::new();
    for r in nl.iter().filter(|r| r.len() >= 2) {
        let e = ev.eval(&r[1]);
        if r[0] == "deny" {
            deny_t.add(&e);
            let reason =
                notes.get(&r[1]).map(|s| s.split('-').next().unwrap_or(s).to_string()).unwrap_or_else(|| "?".into());
            by_reason.entry(reason).or_default().add(&e);
            if verbose && e.decision.action != Action::Deny {
                println!("MISS\t{}", r[1]);
            }
        } else {
            ok_t.add(&e);
            if e.decision.action == Action::Deny {
                *fp_rules.entry(e.decision.rule.clone().unwrap_or_default()).or_default() += 1;
                if verbose {
                    println!("FP\t{}\t{:?}", r[1], e.decision.rule);
                }
            }
        }
    }
    let _ = writeln!(
        md,
        "## NL2Bash (`nl2bash_labels.tsv`)\n\n{HEADER}{}{}",
        deny_t.row("labelled deny"),
        ok_t.row("labelled ok")
    );
    let _ = write!(md, "Deny lines by review reason (`nl2bash_review_notes.tsv`):\n\n{HEADER}");
    for (k, t) in &by_reason {
        md.push_str(&t.row(k));
    }
    let _ = writeln!(
        md,
        "\nFalse positives by rule: {}\n",
        fp_rules.iter().map(|(r, n)| format!("`{r}` {n}")).collect::<Vec<_>>().join(", ")
    );

    // dcg: upstream labels and categories; the deny cases not denied are listed.
    let mut dcg_cat: BTreeMap<String, (Tally, Tally)> = BTreeMap::new();
    let mut missed = Vec::new();
    if let Ok(text) = std::fs::read_to_string(dir.join("dcg_cases.jsonl")) {
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            if v["duplicate_of_earlier"].as_bool() == Some(true) {
                continue;
            }
            let (Some(cmd), Some(exp)) = (v["command"].as_str(), v["expected"].as_str()) else { continue };
            let cat = v["category"].as_str().unwrap_or("?").to_string();
            let e = ev.eval(cmd);
            let entry = dcg_cat.entry(cat).or_default();
            if exp == "deny" {
                entry.0.add(&e);
                if e.decision.action != Action::Deny {
                    missed.push((
                        cmd.to_string(),
                        e.decision.action.as_str(),
                        e.decision.rule.clone().unwrap_or_default(),
                    ));
                }
            } else {
                entry.1.add(&e);
            }
        }
    }
    let _ = write!(md, "## destructive_command_guard cases (`dcg_cases.jsonl`, duplicates skipped)\n\n{HEADER}");
    for (cat, (d, a)) in &dcg_cat {
        if d.n > 0 {
            md.push_str(&d.row(&format!("{cat}: expected deny")));
        }
        if a.n > 0 {
            md.push_str(&a.row(&format!("{cat}: expected allow")));
        }
    }
    let _ = writeln!(
        md,
        "\nExpected-deny cases that are not denied ({}): each should be workspace-local destruction, \
         which runs as a transaction and is undone by rollback. Review this list when rules change.\n",
        missed.len()
    );
    for (cmd, action, rule) in &missed {
        let _ = writeln!(
            md,
            "- `{}` → {action} {}",
            cmd.replace('`', "'").replace('\n', "⏎"),
            if rule.is_empty() { String::new() } else { format!("(`{rule}`)") }
        );
    }

    // Atomic Red Team: every line is attacker behaviour; per technique family.
    let mut atomic: BTreeMap<String, Tally> = BTreeMap::new();
    let mut atomic_all = Tally::default();
    for r in tsv(&dir.join("atomic_linux_resolved.tsv")).iter().filter(|r| r.len() >= 3) {
        let e = ev.eval(&unescape(&r[2]));
        atomic_all.add(&e);
        let family = r[0].split('.').next().unwrap_or(&r[0]).to_string();
        atomic.entry(family).or_default().add(&e);
    }
    let _ = write!(
        md,
        "\n## Atomic Red Team Linux tests (`atomic_linux_resolved.tsv`)\n\nAttacker behaviour; much of it only \
         acts inside the sandbox (it is contained by the kernel, not the policy), so `transact` is expected for \
         a large share.\n\n{HEADER}{}",
        atomic_all.row("all")
    );
    for (fam, t) in atomic.iter().filter(|(_, t)| t.n >= 5) {
        md.push_str(&t.row(fam));
    }

    // Real agent commands (unlabelled): what share a policy would refuse, and by which rule.
    let mut agent: BTreeMap<String, Tally> = BTreeMap::new();
    let mut agent_all = Tally::default();
    let mut agent_fp: BTreeMap<String, usize> = BTreeMap::new();
    let mut agent_denied = Vec::new();
    // Each session runs in the directory its benchmark prepares for it, which is what txbox
    // would be given as the workspace: see `task_workspace`.
    let default_ctx = ev.ctx.clone();
    let agent_rows = tsv(&dir.join("agent_commands.tsv"));
    let mut workdir_tasks: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
    for r in agent_rows.iter().filter(|r| r.len() >= 3) {
        let n = workdir_tasks.entry((r[0].clone(), r[1].clone())).or_default();
        n.0 += r[2].matches("/app").count();
        n.1 += r[2].matches("/workdir").count();
    }
    for r in agent_rows.iter().filter(|r| r.len() >= 3) {
        let cmd = unescape(&r[2]);
        let counts = workdir_tasks.get(&(r[0].clone(), r[1].clone())).copied().unwrap_or_default();
        ev.ctx = match task_workspace(&r[0], &r[1], counts) {
            Some(ws) => txbox_policy::Context {
                workspace: PathBuf::from(ws),
                cwd: PathBuf::from(ws),
                home: Some(PathBuf::from("/root")),
            },
            None => default_ctx.clone(),
        };
        let e = ev.eval(&cmd);
        agent_all.add(&e);
        let source = r[0].split('/').next().unwrap_or(&r[0]).to_string();
        agent.entry(source).or_default().add(&e);
        if e.decision.action == Action::Deny {
            *agent_fp.entry(e.decision.rule.clone().unwrap_or_default()).or_default() += 1;
            agent_denied.push((cmd, e.decision.rule.clone().unwrap_or_default()));
        }
    }
    let _ = write!(
        md,
        "\n## Real agent commands (`agent_commands.tsv`)\n\nUnlabelled commands that coding agents ran, or that \
         benchmarks ship as solutions, in throw-away containers as root: a deny here is a refusal an agent \
         would meet (target ≤ 1%).\n\n{HEADER}{}",
        agent_all.row("all")
    );
    for (src, t) in &agent {
        md.push_str(&t.row(src));
    }
    let _ = writeln!(
        md,
        "\nDenied by rule: {}\n",
        agent_fp.iter().map(|(r, n)| format!("`{r}` {n}")).collect::<Vec<_>>().join(", ")
    );
    for (cmd, rule) in &agent_denied {
        let one: String = cmd.replace('`', "'").replace('\n', "⏎").chars().take(110).collect();
        let _ = writeln!(md, "- `{one}` (`{rule}`)");
    }

    ev.ctx = default_ctx;

    // The repo's own corpus of evasion classes.
    let own = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let _ = write!(md, "\n## txbox's own corpus (`crates/policy/tests/corpus`)\n\n{HEADER}");
    for f in ["deny.txt", "transact.txt"] {
        let mut t = Tally::default();
        for l in std::fs::read_to_string(own.join(f)).unwrap_or_default().lines() {
            if !l.trim().is_empty() && !l.starts_with('#') {
                // Same convention as tests/corpus.rs: `\n` stands for a newline.
                let e = ev.eval(&l.replace("\\n", "\n"));
                if verbose && ((f == "deny.txt") != (e.decision.action == Action::Deny)) {
                    println!("OWN-MISS\t{f}\t{l}\t{:?}", e.decision.action);
                }
                t.add(&e);
            }
        }
        md.push_str(&t.row(f));
    }

    // Deny-worthy commands by class (issue #13: "refuse early what it can see"); `ok.txt` holds
    // their near misses, which must not be denied.
    let early = own.join("early");
    let mut classes: Vec<PathBuf> = std::fs::read_dir(&early)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "txt")).collect()
        })
        .unwrap_or_default();
    classes.sort();
    let _ = write!(
        md,
        "\n### Deny-worthy commands by class (`crates/policy/tests/corpus/early`)\n\nWritten as an attacker would, \
         many variants per class; every line of a class must be denied, no line of `ok.txt` (their near \
         misses).\n\n{HEADER}"
    );
    let (mut all_deny, mut misses) = (Tally::default(), Vec::new());
    for f in &classes {
        let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let mut t = Tally::default();
        for l in std::fs::read_to_string(f).unwrap_or_default().lines() {
            if l.trim().is_empty() || l.starts_with('#') {
                continue;
            }
            let e = ev.eval(&l.replace("\\n", "\n"));
            t.add(&e);
            if name != "ok" {
                all_deny.add(&e);
            }
            if (name == "ok") == (e.decision.action == Action::Deny) {
                misses.push(format!("{name}\t{l}\t{} {:?}", e.decision.action.as_str(), e.decision.rule));
            }
        }
        md.push_str(&t.row(&name));
    }
    md.push_str(&all_deny.row("all deny-worthy"));
    let pct = |t: &Tally| if t.n == 0 { 0.0 } else { 100.0 * t.deny as f64 / t.n as f64 };
    let _ = writeln!(
        head,
        "## Summary (issue #13's targets)\n\n| set | denied | target |\n|---|---|---|\n\
         | deny-worthy commands by class (own set, {} lines) | {:.1}% | ≥ 99% |\n\
         | real agent commands (`agent_commands.tsv`, {} lines) | {:.1}% | ≤ 1% |\n\
         | NL2Bash lines labelled ok ({} lines) | {:.1}% | ≤ 1% |\n\
         | NL2Bash lines labelled deny ({} lines) | {:.1}% | 100% |\n",
        all_deny.n,
        pct(&all_deny),
        agent_all.n,
        pct(&agent_all),
        ok_t.n,
        pct(&ok_t),
        deny_t.n,
        pct(&deny_t)
    );
    let _ = writeln!(
        head,
        "NL2Bash's labels ask whether a line does irreversible harm outside the workspace; its review \
         deliberately labels `ok` some lines in the classes issue #13 asks to refuse early (replacing a \
         crontab, `tee` into `/etc/apt/sources.list`, remounting `/`, a root shell with `su`): those are \
         most of the NL2Bash lines denied (see *False positives by rule* below), and each is refused on \
         purpose. The agent commands are evaluated in the workspace each benchmark prepares (`/app`, \
         InterCode's `/testbed`, `/system`, `/workspace`): most of those still denied write to `/etc`, \
         `/usr/local/bin` or `/`, or move the workspace's files out of it.\n\n\
         The deny-worthy set grew in rounds: five rounds of new variants, written before looking at the \
         rules, were denied at 88%, 87%, 91%, 88% and 72% (the last one reaching for exotic forms) before \
         the rules were generalized to cover them (the few left uncovered are listed as comments in the \
         class files); expect a \
         held-out set nearer those figures than 100%.\n"
    );
    if verbose {
        for m in &misses {
            println!("EARLY-MISS\t{m}");
        }
    }

    let mut lat = std::mem::take(&mut ev.latencies);
    lat.sort_unstable();
    if !lat.is_empty() {
        let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
        let _ = writeln!(
            md,
            "\n## Latency\n\nOne `evaluate_str` per command string, release build, {} strings: median {:.1} µs, \
             p99 {:.1} µs, max {:.1} µs (DESIGN §8 target: p99 ≤ 50 µs).",
            lat.len(),
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
    if let (Some(p), Some(d)) = (&dump, &ev.dump) {
        if let Err(e) = std::fs::write(p, d) {
            eprintln!("writing {}: {e}", p.display());
            std::process::exit(1);
        }
    }
    let md = head + &md;
    match out {
        Some(p) => {
            if let Err(e) = std::fs::write(&p, &md) {
                eprintln!("writing {}: {e}", p.display());
                std::process::exit(1);
            }
            eprintln!("wrote {}", p.display());
        }
        None => print!("{md}"),
    }
}
