//! txbox transactions: from an overlay upper layer to a durable, atomic change of the workspace.
//!
//! - [`changeset`] classifies an upper layer against the workspace (reads only);
//! - [`plan`] orders the steps of a commit (pure);
//! - [`journal`] writes the commit record, the single durable commit point;
//! - [`check`] says, before the commit point, whether applying will be permitted and has room;
//! - [`commit`] prepares, commits and applies, idempotently; recovery re-applies records;
//! - [`durable`] says what each commit flushes and when (the plan), and flushes it (the seam);
//! - [`layout`] names everything in the state directory and chooses where it lives;
//!   [`state`] keeps it (nothing read back is trusted: [`seal`] authenticates it);
//!   [`session`] keeps a session's layers; [`audit`] keeps the hash-chained log;
//! - [`retain`] keeps what a commit displaced, within a budget, so that [`undo`] can invert it
//!   (as a transaction of its own, through the journal);
//! - [`writeback`] flushes a long command's layer while it runs, ahead of the commit's flush;
//! - [`fsx`] and [`hex`]: the crate's shared helpers (errors at a path, no-follow opens and
//!   removal, hex encoding).

pub mod audit;
pub mod beneath;
pub mod changeset;
pub mod check;
pub mod commit;
pub mod durable;
pub mod fsx;
pub mod hex;
pub mod journal;
pub mod keep;
pub mod layout;
pub mod meta;
pub mod plan;
pub mod retain;
pub mod seal;
pub mod session;
pub mod state;
pub mod undo;
pub mod writeback;

use std::path::{Path, PathBuf};

pub use changeset::{classify, ChangeSet};
pub use commit::{CommitError, CrashHook};
pub use state::{StateDir, StateError, TxDir};

/// What recovery did with one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    /// A commit record was found and applied to the end. `committed_ms`: when it was written.
    RolledForward { tx: String, workspace: PathBuf, changes: audit::Counts, committed_ms: u64 },
    /// A transaction whose commit had been applied but whose process died before cleaning up
    /// (perhaps before its audit entry): removed, and known to have landed.
    Landed { tx: String, workspace: PathBuf, changes: audit::Counts, committed_ms: u64 },
    /// A transaction without commit record whose process is gone: discarded.
    Discarded { tx: String },
}

#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(
        "recovery cannot apply transaction {tx} (commit record {}): {source}. Until it is applied the \
         workspace {} holds part of it{}; once that is fixed, `txbox recover` (or any txbox command on \
         the workspace) finishes it",
        record.display(),
        workspace.display(),
        commit::needs(source)
    )]
    Apply { tx: String, record: PathBuf, workspace: PathBuf, source: Box<CommitError> },
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error(transparent)]
    Undo(#[from] Box<undo::UndoError>),
}

/// How much recovery looked at: the entries of `journal` and `tx` it examined. It must not grow
/// with history (retired directories are a collector's, and not even listed here).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecoverStats {
    pub looked_at: usize,
}

/// Finish or undo interrupted commits. With `workspace`, only records of that workspace are
/// applied and the caller must already hold its lock; without, each record's workspace is
/// locked in turn, and retired directories are deleted too (`txbox recover`).
pub fn recover(
    state: &StateDir,
    workspace: Option<&Path>,
    hook: &mut CrashHook,
) -> Result<Vec<Recovered>, RecoverError> {
    recover_counting(state, workspace, hook, &mut RecoverStats::default())
}

/// [`recover`], counting what it looked at into `stats`.
pub fn recover_counting(
    state: &StateDir,
    workspace: Option<&Path>,
    hook: &mut CrashHook,
    stats: &mut RecoverStats,
) -> Result<Vec<Recovered>, RecoverError> {
    let mut out = Vec::new();
    for record_path in state.pending_records()? {
        stats.looked_at += 1;
        // A record vanishes when its commit finishes (another workspace's, applied right now).
        let Some(record) = state.read_record(&record_path)? else { continue };
        if workspace.is_some_and(|w| w != record.workspace) {
            continue;
        }
        let (_lock, record) = match workspace {
            Some(_) => (None, record),
            None => {
                let lock = state.lock_workspace(&record.workspace)?;
                // Its committer may have finished while we waited for the lock.
                match state.read_record(&record_path)? {
                    Some(r) => (Some(lock), r),
                    None => continue,
                }
            }
        };
        let committed_ms = mtime_ms(&record_path);
        let failed = |source| RecoverError::Apply {
            tx: record.tx.clone(),
            record: record_path.clone(),
            workspace: record.workspace.clone(),
            source: Box::new(source),
        };
        commit::apply_record(&record, hook).map_err(failed)?;
        commit::finish(&record_path, hook).map_err(failed)?;
        // A transaction prepared for undo keeps its directory, with the record `finish` moved
        // into it (crate::retain); one that cannot be kept is removed, committed all the same.
        let opts = retain::KeepOptions { budget: retain::Budget::KEEP_ALL, kept_only: false };
        if !retain::prepared(state, &record.tx) || retain::keep_commit(state, &record.tx, None, &opts).is_err() {
            state.remove_tx(&record.tx)?;
        }
        let changes = record.counts();
        out.push(Recovered::RolledForward { tx: record.tx, workspace: record.workspace, changes, committed_ms });
    }
    // Undos past their commit point (their records in the journal), before discarding
    // anything: an undo's trash holds what it took from the workspace.
    for done in undo::apply::recover_pending(state, workspace, hook, &mut stats.looked_at).map_err(Box::new)? {
        out.push(Recovered::RolledForward {
            tx: done.tx,
            workspace: done.workspace,
            changes: done.changes,
            committed_ms: done.committed_ms,
        });
    }
    for a in state.discard_abandoned(&mut stats.looked_at)? {
        out.push(match a.landed {
            Some((record, committed_ms)) => {
                Recovered::Landed { changes: record.counts(), tx: a.id, workspace: record.workspace, committed_ms }
            }
            None => Recovered::Discarded { tx: a.id },
        });
    }
    if workspace.is_none() {
        state.collect_retired()?;
    }
    Ok(out)
}

/// A file's mtime in ms since the epoch (0 if unknown).
fn mtime_ms(path: &Path) -> u64 {
    std::fs::symlink_metadata(path)
        .ok()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}
