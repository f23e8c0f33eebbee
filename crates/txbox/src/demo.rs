//! `txbox demo`: a guided tour on a scratch workspace — a command committed with its changes,
//! a failing command rolled back, a destructive one refused, a committed deletion undone — using
//! the same engine as `run` and `undo`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use txbox::engine;
use txbox::render;
use txbox::request::{self, Command, RunRequest};
use txbox::request::{Io, Limits};
use txbox::result::{Outcome, RunResult};
use txbox_policy::Policy;

/// The scratch workspace: inside `dir` (`demo -C DIR`), else $TMPDIR, else /var/tmp.
fn scratch_root(dir: Option<&Path>) -> PathBuf {
    // /var/tmp rather than /tmp: on many hosts /tmp is a tmpfs, and the demo should show the
    // workspace's own filesystem at work.
    let base = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(|| std::env::var_os("TMPDIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp")));
    base.join(format!("txbox-demo-{}", std::process::id()))
}

fn step(ws: &Path, title: &str, script: &str) -> Result<RunResult> {
    println!("\n== {title}\n$ txbox run -c '{script}'");
    let req = RunRequest {
        workspace: ws.to_path_buf(),
        state_dir: None,
        cwd: ws.to_path_buf(),
        command: Command::Shell(script.to_string()),
        policy: Policy::builtin(),
        policy_file: None,
        io: Io::Inherit,
        limits: Limits { timeout: Some(std::time::Duration::from_secs(30)), ..Limits::default() },
        validate: None,
        no_commit: false,
        keep_on_failure: false,
        isolation: Default::default(),
        pass_env: Vec::new(),
        keep: Default::default(),
    };
    let r = engine::run(&req)?;
    println!("{}", render::summary(&r));
    Ok(r)
}

fn listing(ws: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(ws)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != txbox_txn::layout::IN_WORKSPACE)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.join("  ")
}

pub fn run(dir: Option<&Path>) -> Result<i32> {
    if let Some(d) = dir {
        if !d.is_dir() {
            anyhow::bail!("{}: not a directory (demo -C names where its scratch workspace is made)", d.display());
        }
    }
    let ws = scratch_root(dir);
    std::fs::create_dir_all(ws.join("src")).with_context(|| format!("creating {}", ws.display()))?;
    std::fs::write(ws.join("README.md"), "# scratch project\n")?;
    std::fs::write(ws.join("src/main.rs"), "fn main() { println!(\"hello\"); }\n")?;
    println!("txbox demo: a scratch workspace at {}", ws.display());
    println!("workspace: {}", listing(&ws));

    let r = step(
        &ws,
        "1. a command that succeeds is committed",
        "echo \"## usage\" >> README.md && mkdir -p build && echo ok > build/out.txt",
    )?;
    let c = &r.changes;
    println!("   added {:?}, modified {:?}, deleted {:?}", c.added, c.modified, c.deleted);
    println!("workspace: {}", listing(&ws));

    let r2 = step(
        &ws,
        "2. a command that fails is rolled back, as if it never ran",
        "rm -rf src && echo half-done > notes.txt && exit 3",
    )?;
    println!("   exit status {} passed through; src/ still there: {}", r2.exit_code, ws.join("src/main.rs").exists());
    println!("workspace: {}", listing(&ws));

    let r3 = step(&ws, "3. a destructive command is refused before anything runs", "rm -rf /")?;
    println!("   exit status {} (126 = denied by policy)", r3.exit_code);

    let r4 = step(&ws, "4. a deletion inside the workspace succeeds, so it commits ...", "rm -rf src")?;
    println!("   src/ still there: {}", ws.join("src/main.rs").exists());
    println!("\n== 5. ... and is undone: the undo is a transaction too (undo it to redo)\n$ txbox undo");
    let real = request::resolve_workspace(&ws)?;
    let u = txbox::undo::undo(&txbox::undo::UndoRequest {
        workspace: real.clone(),
        state_dir: None,
        target: txbox_txn::undo::Target::Last,
        judged_by: None,
    })?;
    println!("{}", render::summary(&u));
    println!(
        "   undid {:?}; src/main.rs back, byte for byte: {}",
        u.undone.iter().map(|t| render::short(t)).collect::<Vec<_>>(),
        std::fs::read_to_string(ws.join("src/main.rs")).is_ok_and(|t| t.contains("hello"))
    );
    println!("workspace: {}", listing(&ws));

    println!("\nThe audit log (txbox log -C {}):", ws.display());
    let state = txbox_txn::StateDir::existing_for_workspace(None, &real)?;
    if let Some(state) = &state {
        let name = real.to_string_lossy();
        for e in txbox_txn::audit::read_all(&state.audit_path())?.iter().filter(|e| e.workspace == name) {
            let mark = if e.outcome == "committed" { txbox::undo::undo_mark_text(state, &e.tx) } else { String::new() };
            println!("   {} {:<11} {:<20} {}", render::short(&e.tx), e.outcome, mark, e.command);
        }
    }
    let ok = r.outcome == Outcome::Committed
        && r2.outcome == Outcome::RolledBack
        && r3.outcome == Outcome::Denied
        && r4.outcome == Outcome::Committed
        && u.outcome == Outcome::Committed
        && ws.join("src/main.rs").exists();
    // The demo's retained data goes with its scratch workspace.
    if let Some(state) = &state {
        for id in [&r.tx, &u.tx] {
            let _ = txbox_txn::retain::purge(state, std::slice::from_ref(id), false);
        }
    }
    let _ = txbox_txn::state::remove_tree(&ws);
    println!(
        "\n{}",
        if ok {
            "demo finished: commit, rollback, refusal and undo all behaved."
        } else {
            "demo: something did not behave as expected (see above)."
        }
    );
    Ok(if ok { 0 } else { 1 })
}
