//! txbox transactions: from an overlay upper layer to a durable, atomic change of the workspace.
//!
//! - [`changeset`] classifies an upper layer against the workspace (reads only);
//! - [`plan`] orders the steps of a commit (pure);
//! - [`journal`] writes the commit record, the single durable commit point;
//! - [`commit`] prepares, commits and applies, idempotently; recovery re-applies records;
//! - [`state`] lays out the state directory; [`audit`] keeps the hash-chained log;
//! - [`writeback`] flushes a long command's layer while it runs, ahead of the commit's flush.

pub mod audit;
pub mod beneath;
pub mod changeset;
pub mod commit;
pub mod journal;
pub mod meta;
pub mod plan;
pub mod session;
pub mod state;
pub mod writeback;

use std::path::{Path, PathBuf};

pub use changeset::{classify, ChangeSet};
pub use commit::{CommitError, CrashHook};
pub use state::{StateDir, StateError, TxDir};

/// What recovery did with one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    /// A commit record was found and applied to the end.
    RolledForward { tx: String, workspace: PathBuf },
    /// A transaction without commit record whose process is gone: discarded.
    Discarded { tx: String },
}

#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
}

/// How long a retired transaction directory is left to the collector that was to delete it
/// (the `txbox __gc` helper, a warm server) before recovery deletes it itself.
pub const RETIRED_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Finish or undo interrupted commits. With `workspace`, only records of that workspace are
/// touched and the caller must already hold its lock; without, each record's workspace is
/// locked in turn.
pub fn recover(
    state: &StateDir,
    workspace: Option<&Path>,
    hook: &mut CrashHook,
) -> Result<Vec<Recovered>, RecoverError> {
    let mut out = Vec::new();
    for record_path in state.pending_records()? {
        let record = journal::read(&record_path)?;
        if workspace.is_some_and(|w| w != record.workspace) {
            continue;
        }
        let _lock = match workspace {
            Some(_) => None,
            None => Some(state.lock_workspace(&record.workspace)?),
        };
        commit::apply_record(&record, hook)?;
        commit::finish(&record_path, hook)?;
        state.remove_tx(&record.tx)?;
        out.push(Recovered::RolledForward { tx: record.tx, workspace: record.workspace });
    }
    for tx in state.abandoned()? {
        state.remove_tx(&tx)?;
        out.push(Recovered::Discarded { tx });
    }
    // Retired layers (best effort: a background collector may be on them right now, and
    // those retired in the last minute are left to it).
    state.collect_garbage(RETIRED_GRACE)?;
    Ok(out)
}
