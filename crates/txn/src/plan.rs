//! The commit planner: a change set in, an ordered list of rename steps out. Pure.
//!
//! Order matters for correctness, not just tidiness:
//! 1. removals first, so a path freed by a deletion never blocks anything after it;
//! 2. puts (creations and exchanges) in path order: a put never lands inside another put's
//!    subtree (a new directory moves whole, with its content), and every parent of a put is a
//!    directory present on both sides, so it already exists in the workspace;
//! 3. directory attributes last and deepest first, because each rename into a directory bumps
//!    its mtime, and a parent's mtime must be set after its children's.

use std::path::PathBuf;

use crate::changeset::{ChangeOp, ChangeSet};
use crate::meta::Kind;

/// One step of a commit. Inode numbers are not part of the plan; the journal adds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Move the workspace object at `path` into the transaction's trash, slot `slot`.
    Remove { path: PathBuf, kind: Kind, slot: u64 },
    /// Move the upper object into a free workspace path (`RENAME_NOREPLACE`).
    Create { path: PathBuf, kind: Kind },
    /// Exchange the upper object with the workspace object (`RENAME_EXCHANGE`): the old object
    /// lands in the upper layer, a free backup until cleanup.
    Replace { path: PathBuf, new: Kind, old: Kind },
    /// Copy mode, xattrs and mtime of the upper directory onto the workspace directory.
    DirMeta { path: PathBuf },
}

impl Step {
    pub fn path(&self) -> &PathBuf {
        match self {
            Step::Remove { path, .. }
            | Step::Create { path, .. }
            | Step::Replace { path, .. }
            | Step::DirMeta { path } => path,
        }
    }
}

/// Build the ordered steps for a change set.
pub fn plan(cs: &ChangeSet) -> Vec<Step> {
    let mut removes = Vec::new();
    let mut puts = Vec::new();
    let mut metas = Vec::new();
    for change in &cs.changes {
        let path = change.path.clone();
        match change.op {
            ChangeOp::Delete { old } => removes.push((path, old)),
            ChangeOp::Put { new, old: None } => puts.push(Step::Create { path, kind: new }),
            ChangeOp::Put { new, old: Some(old) } => puts.push(Step::Replace { path, new, old }),
            ChangeOp::DirMeta { .. } => metas.push(path),
        }
    }
    removes.sort();
    puts.sort_by(|a, b| a.path().cmp(b.path()));
    // Deepest first: more components sort earlier; ties broken by path for determinism.
    metas.sort_by(|a, b| b.components().count().cmp(&a.components().count()).then_with(|| a.cmp(b)));
    let mut steps: Vec<Step> = removes
        .into_iter()
        .enumerate()
        .map(|(slot, (path, kind))| Step::Remove { path, kind, slot: slot as u64 })
        .collect();
    steps.extend(puts);
    steps.extend(metas.into_iter().map(|path| Step::DirMeta { path }));
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changeset::Change;

    fn ch(p: &str, op: ChangeOp) -> Change {
        Change { path: PathBuf::from(p), op }
    }

    #[test]
    fn removals_then_puts_then_deepest_dir_attributes() {
        let cs = ChangeSet {
            changes: vec![
                ch("", ChangeOp::DirMeta { visible: false }),
                ch("src/new.rs", ChangeOp::Put { new: Kind::File, old: None }),
                ch("src", ChangeOp::DirMeta { visible: false }),
                ch("old", ChangeOp::Delete { old: Kind::Dir }),
                ch("empty", ChangeOp::Put { new: Kind::File, old: Some(Kind::Dir) }),
                ch("a/b", ChangeOp::DirMeta { visible: true }),
                ch("build.sh", ChangeOp::Delete { old: Kind::File }),
            ],
            ..ChangeSet::default()
        };
        let steps = plan(&cs);
        assert_eq!(
            steps,
            vec![
                Step::Remove { path: "build.sh".into(), kind: Kind::File, slot: 0 },
                Step::Remove { path: "old".into(), kind: Kind::Dir, slot: 1 },
                Step::Replace { path: "empty".into(), new: Kind::File, old: Kind::Dir },
                Step::Create { path: "src/new.rs".into(), kind: Kind::File },
                Step::DirMeta { path: "a/b".into() },
                Step::DirMeta { path: "src".into() },
                Step::DirMeta { path: "".into() },
            ]
        );
    }

    #[test]
    fn empty_change_set_plans_nothing() {
        assert!(plan(&ChangeSet::default()).is_empty());
    }
}
