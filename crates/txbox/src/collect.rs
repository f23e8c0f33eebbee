//! What becomes of a finished transaction's directory, and the background collector. An empty
//! one is a spare for the next run; any other is retired (renamed aside, O(1)) and deleted by a
//! detached `txbox __gc` ([`main`], which the binary dispatches to), or by the warm server that
//! ran it when idle; `__gc` also measures retained undo data and applies the retention budget.
//!
//! Owns what becomes of a directory its run is done with (recycled, retired or removed) and when
//! a collector starts; may not decide a transaction's outcome, nor be given a directory still
//! needed (held, retained for undo, or committed but not applied in full: the callers keep those,
//! and `StateDir::retire_tx` refuses one that has a commit record).

use std::ffi::OsString;
use std::path::Path;

use txbox_txn::{StateDir, TxDir};

/// Discard a transaction's directory. Failure to clean up leaves garbage for `recover`, never
/// a wrong workspace, so it is not an error of the run.
/// `collected`: a warm server ran the transaction, and deletes retired directories itself
/// when idle, so retiring it is all there is to do here, unless so many wait that a
/// collector is wanted now (under sustained load the server is never idle).
pub(crate) fn drop_tx(state: &StateDir, tx: TxDir, collected: bool) {
    let id = tx.id.clone();
    let wrote_something = wrote_something(&tx.upper);
    // A run that left nothing in its directory gives it to the next one (the lock held in
    // `tx` goes with it and is released below); one that wrote cannot, so is not examined.
    if !wrote_something && state.recycle_tx(&id) {
        return;
    }
    // The owner lock is let go only once the directory has left `tx`: a finished run's
    // directory without its lock is what another run's recovery takes for abandoned (and
    // audits as discarded).
    if collected && state.retire_tx(&id).is_ok() {
        drop(tx);
        start_collector(state, false);
        return;
    }
    if !wrote_something {
        // An empty layer is gone in a few syscalls.
        let _ = state.remove_tx(&id);
        drop(tx);
        return;
    }
    // A rollback returns as soon as the layer is retired; a detached collector deletes it
    // (docs/DESIGN.md §9: rollback ≤ 50 ms, cleanup may continue in the background). Should it die,
    // the next collector finishes the job.
    let retired = state.retire_tx(&id);
    drop(tx);
    if retired.is_err() {
        let _ = state.remove_tx(&id);
        return;
    }
    start_collector(state, true);
}

/// Whether a layer holds anything (unreadable: assume it does).
fn wrote_something(upper: &Path) -> bool {
    std::fs::read_dir(upper).map(|mut d| d.next().is_some()).unwrap_or(true)
}

/// Start a detached `txbox __gc` for the state directory's retired directories if one is
/// wanted (see `StateDir::collector_wanted`).
fn start_collector(state: &StateDir, cold: bool) {
    if !state.collector_wanted(cold) {
        return;
    }
    spawn_collector(state);
}

/// Start a detached `txbox __gc` for retained data to measure or evicted (unless a collector
/// is at work already).
pub(crate) fn start_retention_collector(state: &StateDir) {
    if state.collector_idle() {
        spawn_collector(state);
    }
}

/// After a run's commit was retained: a collector for what retention left. Data to measure
/// wants one now; evicted data alone waits in `gone/` with the retired directories, which the
/// warm server that ran the transaction deletes when idle (`collected`), as [`drop_tx`] leaves
/// them: a collector only once more than `RETIRED_BOUND` wait. At the retention budget every
/// commit evicts one transaction, and a process started per commit for it cost every warm
/// run a `vfork` and `exec` and a core's worth of work beside the next command.
pub(crate) fn after_retention(state: &StateDir, r: &txbox_txn::retain::Retention, collected: bool) {
    match retention_collector(r, collected) {
        Some(Want::Now) => start_retention_collector(state),
        Some(Want::AsRetired { cold }) => start_collector(state, cold),
        None => {}
    }
}

/// What retention's outcome asks of a collector.
#[derive(Debug, PartialEq, Eq)]
enum Want {
    /// Data to measure (or a recount): start one unless one is at work.
    Now,
    /// Only evicted data in `gone/`: the rule of retired directories ([`start_collector`]).
    AsRetired { cold: bool },
}

fn retention_collector(r: &txbox_txn::retain::Retention, collected: bool) -> Option<Want> {
    match (r.measure, r.retired) {
        (true, _) => Some(Want::Now),
        (false, true) => Some(Want::AsRetired { cold: !collected }),
        (false, false) => None,
    }
}

fn spawn_collector(state: &StateDir) {
    let started = std::process::Command::new("/proc/self/exe")
        .arg(SUBCOMMAND)
        .arg(&state.root)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Ok(child) = started {
        let mut unreaped = UNREAPED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        track(child, &mut unreaped);
    }
}

/// Collectors this process started that it has not seen exit. Nobody waits for a collector,
/// but a process that lives on (`txbox serve`, `txbox mcp`) must reap them, or each one it
/// ever started stays a zombie (a slot in the process table and under the pids limit) for as
/// long as it runs. A one-shot command exits first and leaves them to init.
static UNREAPED: std::sync::Mutex<Vec<std::process::Child>> = std::sync::Mutex::new(Vec::new());

/// Reap the collectors of `unreaped` that have exited, then keep `child` among them: at most
/// the collectors still running and the last one started are left unreaped.
fn track(child: std::process::Child, unreaped: &mut Vec<std::process::Child>) {
    unreaped.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
    unreaped.push(child);
}

/// The hidden subcommand of the background collector: `txbox __gc STATE`.
pub const SUBCOMMAND: &str = "__gc";

/// `txbox __gc STATE` (`args`: what follows the subcommand): delete the state directory's retired
/// transaction directories, and measure retained undo data and apply the retention budget to it,
/// in a state directory txbox made (anything else is refused by opening it). Exits 0 whatever
/// happened: nobody waits for it, and what it leaves is the next collector's.
pub fn main(args: &[OsString]) -> ! {
    // Nothing the caller left open lives on here (a pipe would never see its end).
    txbox_sandbox::fds::close_from_except(3, &[]);
    if let Some(root) = args.first() {
        // Detach from the caller's session so its terminal signals do not stop us.
        let _ = rustix::process::setsid();
        if let Ok(Some(state)) = StateDir::open_existing(Path::new(root)) {
            let _ = state.collect_retired();
            // Retained undo data: measure what waits, apply the budget (crate txn::retain).
            if let Ok(budget) = crate::retention::budget() {
                let _ = txbox_txn::retain::collect(&state, &budget);
            }
            let _ = state.collect_retired();
        }
    }
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The state letter of process `pid` in /proc (`Z`: a zombie), or None if it is gone.
    fn state_of(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next())
    }

    #[test]
    fn evicted_data_alone_waits_for_the_warm_server() {
        use txbox_txn::retain::Retention;
        let r = |measure, retired| Retention { measure, retired, ..Retention::default() };
        assert_eq!(retention_collector(&r(false, false), true), None);
        assert_eq!(retention_collector(&r(true, true), true), Some(Want::Now), "data to measure");
        assert_eq!(retention_collector(&r(true, false), true), Some(Want::Now), "data to measure");
        assert_eq!(retention_collector(&r(false, true), true), Some(Want::AsRetired { cold: false }));
        assert_eq!(retention_collector(&r(false, true), false), Some(Want::AsRetired { cold: true }));
    }

    #[test]
    fn collectors_that_exited_are_reaped_when_the_next_starts() -> std::io::Result<()> {
        let mut unreaped = Vec::new();
        let first = std::process::Command::new("true").spawn()?;
        let pid = first.id();
        // Wait (untimed: the deadline only bounds a hang) until it has exited unreaped.
        let deadline = Instant::now() + Duration::from_secs(20);
        while state_of(pid) != Some('Z') {
            assert!(Instant::now() < deadline, "`true` did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
        track(first, &mut unreaped);
        assert_eq!(state_of(pid), Some('Z'), "the last started is kept, not reaped");
        let running = std::process::Command::new("sleep").arg("30").spawn()?;
        let second = running.id();
        track(running, &mut unreaped);
        assert_eq!(state_of(pid), None, "an exited collector is still a zombie");
        assert_eq!(unreaped.len(), 1);
        // One still running is kept, not waited for.
        track(std::process::Command::new("true").spawn()?, &mut unreaped);
        assert_eq!(unreaped.len(), 2);
        assert!(state_of(second).is_some_and(|s| s != 'Z'));
        for mut c in unreaped {
            let _ = c.kill();
            let _ = c.wait();
        }
        Ok(())
    }
}
