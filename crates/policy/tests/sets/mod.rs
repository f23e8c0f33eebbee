//! The evaluation corpora as (set, context, command) cases, in a fixed order: shared by the
//! decision snapshot test (`tests/decisions.rs`) and the report generator
//! (`examples/corpus_eval.rs`), so both read every corpus the same way and judge each command in
//! the same workspace.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use txbox_policy::{example_context, Context};

/// The public corpora (`../shared/corpus` next to the repository).
pub fn shared_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
}

/// The crate's own corpus (`tests/corpus`).
pub fn own_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// `\n`, `\t`, `\r` and `\\` escapes, as the TSV corpora write them.
pub fn unescape(s: &str) -> String {
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

/// Rows of a TSV with a header line: the columns of each row (none if unreadable).
pub fn tsv(path: &Path) -> Vec<Vec<String>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("skipping {}: unreadable", path.display());
        return Vec::new();
    };
    text.lines().skip(1).map(|l| l.split('\t').map(str::to_string).collect()).collect()
}

/// The directory a benchmark's task runs in, where its README or set-up says so: Terminal-Bench
/// tasks in `/app` (some multi-turn ones in `/workdir`: the one the task names more often),
/// InterCode's prepared file systems 1–3 in `/testbed`, `/system`, `/workspace`, OpenHands'
/// Multi-SWE-bench in `/workspace`. `None`: the default context.
pub fn task_workspace(source: &str, task: &str, (app, workdir): (usize, usize)) -> Option<&'static str> {
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

/// One real agent command (`agent_commands.tsv`) with the workspace its task runs in.
pub struct AgentCommand {
    pub source: String,
    pub command: String,
    pub ctx: Context,
}

/// Every row of `agent_commands.tsv`, each in the workspace its benchmark prepares: what txbox
/// would be given as the workspace (see [`task_workspace`]).
pub fn agent_commands(dir: &Path) -> Vec<AgentCommand> {
    let rows = tsv(&dir.join("agent_commands.tsv"));
    let mut workdir_tasks: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.len() >= 3) {
        let n = workdir_tasks.entry((r[0].clone(), r[1].clone())).or_default();
        n.0 += r[2].matches("/app").count();
        n.1 += r[2].matches("/workdir").count();
    }
    rows.iter()
        .filter(|r| r.len() >= 3)
        .map(|r| {
            let counts = workdir_tasks.get(&(r[0].clone(), r[1].clone())).copied().unwrap_or_default();
            let ctx = match task_workspace(&r[0], &r[1], counts) {
                Some(ws) => Context {
                    workspace: PathBuf::from(ws),
                    cwd: PathBuf::from(ws),
                    home: Some(PathBuf::from("/root")),
                    writable: Vec::new(),
                },
                None => example_context(),
            };
            AgentCommand { source: r[0].clone(), command: unescape(&r[2]), ctx }
        })
        .collect()
}

/// Every command of every session of `agent_sessions.jsonl`, in order.
pub fn agent_sessions(dir: &Path) -> Vec<String> {
    let path = dir.join("agent_sessions.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out.extend(v["commands"].as_array().into_iter().flatten().filter_map(|c| c.as_str()).map(str::to_string));
    }
    out
}

/// The lines of one of the crate's own corpus files (`#` comments and blank lines skipped, `\n`
/// standing for a newline), as `tests/corpus.rs` reads them.
pub fn own_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).map(|l| l.replace("\\n", "\n")).collect()
}

/// The class files of `tests/corpus/early`, sorted (`ok.txt` among them).
pub fn early_files() -> Vec<PathBuf> {
    let dir = own_dir().join("early");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    files
}

/// Every command of every corpus, grouped by set, each with the context it is judged in.
pub fn all_cases() -> Vec<(String, Vec<(Context, String)>)> {
    let dir = shared_dir();
    let plain = |cmds: Vec<String>| cmds.into_iter().map(|c| (example_context(), c)).collect::<Vec<_>>();
    let mut sets = vec![
        ("agent_sessions.jsonl".to_string(), plain(agent_sessions(&dir))),
        ("agent_commands.tsv".to_string(), agent_commands(&dir).into_iter().map(|a| (a.ctx, a.command)).collect()),
        (
            "nl2bash_labels.tsv".to_string(),
            plain(
                tsv(&dir.join("nl2bash_labels.tsv"))
                    .into_iter()
                    .filter(|r| r.len() >= 2)
                    .map(|r| r[1].clone())
                    .collect(),
            ),
        ),
    ];
    let dcg = std::fs::read_to_string(dir.join("dcg_cases.jsonl")).unwrap_or_default();
    let dcg = dcg
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["command"].as_str().map(str::to_string))
        .collect();
    sets.push(("dcg_cases.jsonl".to_string(), plain(dcg)));
    let atomic = tsv(&dir.join("atomic_linux_resolved.tsv"));
    let atomic = atomic.iter().filter(|r| r.len() >= 3).map(|r| unescape(&r[2])).collect();
    sets.push(("atomic_linux_resolved.tsv".to_string(), plain(atomic)));
    for f in ["deny.txt", "transact.txt"] {
        sets.push((format!("tests/corpus/{f}"), plain(own_lines(&own_dir().join(f)))));
    }
    for f in early_files() {
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        sets.push((format!("tests/corpus/early/{name}"), plain(own_lines(&f))));
    }
    sets
}
