//! A retained transaction read back, as what it did: a list of forward steps that an undo
//! inverts (crate::undo::plan). A commit's steps come from its kept commit record, an undo's
//! from its kept undo record; both are completed by its `retain-pre` and `retained` files.
//!
//! Everything here is authenticated (sealed for the transaction) and every path derived: the
//! retained directory from the id, the objects in it from the record's steps, checked to stay
//! beneath it.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::journal::{self, CommitRecord};
use crate::layout;
use crate::meta::Kind;
use crate::plan::Step;
use crate::retain::files::{read_sealed, DirAttrs, Pre, Retained, RetainedKind};
use crate::seal::Domain;
use crate::session::Fingerprint;
use crate::state::StateDir;
use crate::undo::record::{Src, UndoOp, UndoRecord};

/// The largest record or retained file read back.
const LARGE: usize = 1 << 30;

/// What is known of the entries inside a directory a transaction placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inner {
    /// Not a directory.
    None,
    /// Every entry (path relative to the workspace) as the transaction left it.
    Exact(BTreeMap<PathBuf, Fingerprint>),
    /// A tree the transaction put back from retained data (not one it classified): its entries
    /// were last changed before the transaction; one whose ctime is not before this threshold
    /// (taken once the transaction was applied) was changed since. Exact on filesystems with
    /// fine-grained timestamps (Linux ≥ 6.13: ext4, xfs, btrfs, tmpfs); elsewhere an entry
    /// changed in the same clock tick as the threshold counts as changed (a refusal, never a loss).
    Since(i128),
}

/// One thing a retained transaction did, as its undo sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward {
    /// The object at `path` (inode `ino`) was moved to `at`.
    Removed { path: PathBuf, kind: Kind, ino: u64, at: Src },
    /// An object was placed at the free `path`; `post` is it as the transaction left it.
    Placed { path: PathBuf, post: Fingerprint, inner: Inner },
    /// The object at `path` was exchanged with the one at `src`: `post` is what `path` holds
    /// now, `src_ino` (`src_kind`) what `src` holds now (the object `path` held before).
    Exchanged { path: PathBuf, post: Fingerprint, inner: Inner, src: Src, src_kind: Kind, src_ino: u64 },
    /// A directory's attributes went from `before` to `after`.
    Attrs { path: PathBuf, before: DirAttrs, after: DirAttrs },
}

impl Forward {
    pub fn path(&self) -> &Path {
        match self {
            Forward::Removed { path, .. }
            | Forward::Placed { path, .. }
            | Forward::Exchanged { path, .. }
            | Forward::Attrs { path, .. } => path,
        }
    }
}

/// A retained transaction, read back.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    pub retained: Retained,
    /// Consumed by an undo (its data belongs to that undo now): no longer undoable.
    pub consumed_by: Option<String>,
    /// Its steps, in the order it applied them.
    pub ops: Vec<Forward>,
}

#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error(
        "transaction {0} is not undoable: nothing of it is retained (its retained data expired, \
         was purged or yielded to a full disk, or it changed nothing, or it never committed)"
    )]
    Missing(String),
    #[error("transaction {id} is not undoable: {what} (damaged, or not written by txbox for it)")]
    Damaged { id: String, what: String },
    #[error("transaction {id} was undone by {by}: undo {by} to redo it")]
    Consumed { id: String, by: String },
    #[error("retained transaction {id}: {source}")]
    Io { id: String, source: io::Error },
}

fn kept_rel(id: &str, name: &str) -> PathBuf {
    Path::new(layout::KEPT).join(id).join(name)
}

/// The header of retained transaction `id` and who consumed it, if anyone (cheap: for lists).
pub fn header(state: &StateDir, id: &str) -> Result<(Retained, Option<String>), EntryError> {
    if !layout::valid_id(id) {
        return Err(EntryError::Missing(id.to_string()));
    }
    let io = |source| EntryError::Io { id: id.to_string(), source };
    let damaged = |what: &str| EntryError::Damaged { id: id.to_string(), what: what.to_string() };
    let body = match read_sealed(state.fd(), &kept_rel(id, layout::RETAINED), state.seal(), Domain::Retained, id, LARGE)
    {
        Ok(Some(b)) => b,
        Ok(None) => return Err(EntryError::Missing(id.to_string())),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(damaged("its retained file does not verify")),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Err(EntryError::Missing(id.to_string())),
        Err(e) => return Err(io(e)),
    };
    let retained = Retained::parse(&body).ok_or_else(|| damaged("its retained file does not parse"))?;
    if retained.parts.first().map(String::as_str) != Some(id) {
        return Err(damaged("its retained file names another transaction's data first"));
    }
    let consumed_by = match crate::fsx::read_small(state.fd(), &kept_rel(id, layout::CONSUMED), 64) {
        Ok(b) => Some(String::from_utf8_lossy(&b).trim().to_string()).filter(|s| layout::valid_id(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(e)),
    };
    Ok((retained, consumed_by))
}

/// Read retained transaction `id` whole, refusing anything that does not verify. A consumed
/// one is refused too unless `allow_consumed` (its steps still say what it did).
pub fn load(state: &StateDir, id: &str, allow_consumed: bool) -> Result<Entry, EntryError> {
    let (retained, consumed_by) = header(state, id)?;
    if let Some(by) = consumed_by.as_ref().filter(|_| !allow_consumed) {
        return Err(EntryError::Consumed { id: id.to_string(), by: by.clone() });
    }
    let damaged = |what: &str| EntryError::Damaged { id: id.to_string(), what: what.to_string() };
    let io = |source| EntryError::Io { id: id.to_string(), source };
    let record_rel = kept_rel(id, layout::KEPT_RECORD);
    let text = match crate::fsx::read_small(state.fd(), &record_rel, LARGE) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(damaged("its record is missing")),
        Err(e) => return Err(io(e)),
    };
    let ops = match retained.kind {
        RetainedKind::Commit => {
            let record = journal::parse(&text, &state.root.join(&record_rel), state.seal(), id)
                .map_err(|e| damaged(&format!("its commit record: {e}")))?;
            if record.workspace != retained.workspace {
                return Err(damaged("its record names another workspace"));
            }
            let pre = match read_sealed(
                state.fd(),
                &kept_rel(id, layout::RETAIN_PRE),
                state.seal(),
                Domain::RetainPre,
                id,
                LARGE,
            ) {
                Ok(Some(body)) => Pre::parse(&body).ok_or_else(|| damaged("its retain-pre file does not parse"))?,
                Ok(None) => return Err(damaged("its retain-pre file is missing")),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return Err(damaged("its retain-pre file does not verify"))
                }
                Err(e) => return Err(io(e)),
            };
            commit_ops(id, &record, &pre, &retained).map_err(|w| damaged(&w))?
        }
        RetainedKind::Undo => {
            let record =
                UndoRecord::parse(&text, state.seal(), id).map_err(|e| damaged(&format!("its undo record: {e}")))?;
            if record.workspace != retained.workspace {
                return Err(damaged("its record names another workspace"));
            }
            undo_ops(id, &record, &retained).map_err(|w| damaged(&w))?
        }
    };
    Ok(Entry { id: id.to_string(), retained, consumed_by, ops })
}

/// The entries of `inner` below `dir` (a tree placed whole), with what was re-fingerprinted
/// after the commit taking precedence.
fn inner_of(dir: &Path, pre: &Pre, retained: &Retained) -> BTreeMap<PathBuf, Fingerprint> {
    let mut out: BTreeMap<PathBuf, Fingerprint> = pre
        .inner
        .range(dir.to_path_buf()..)
        .take_while(|(p, _)| p.starts_with(dir))
        .filter(|(p, _)| *p != dir)
        .map(|(p, f)| (p.clone(), *f))
        .collect();
    for (p, f) in retained.restat.range(dir.to_path_buf()..).take_while(|(p, _)| p.starts_with(dir)) {
        if p != dir {
            out.insert(p.clone(), *f);
        }
    }
    out
}

/// A commit's steps as forward steps.
fn commit_ops(id: &str, record: &CommitRecord, pre: &Pre, retained: &Retained) -> Result<Vec<Forward>, String> {
    let post = |i: usize| retained.post.get(&i).copied().ok_or_else(|| format!("no fingerprint for step {i}"));
    let inner = |path: &Path, kind: Kind| match kind {
        Kind::Dir => Inner::Exact(inner_of(path, pre, retained)),
        _ => Inner::None,
    };
    let mut out = Vec::with_capacity(record.steps.len());
    for (i, js) in record.steps.iter().enumerate() {
        out.push(match &js.step {
            Step::Remove { path, kind, slot } => {
                Forward::Removed { path: path.clone(), kind: *kind, ino: js.ino, at: Src::trash(id, *slot) }
            }
            Step::Create { path, kind } => {
                Forward::Placed { path: path.clone(), post: post(i)?, inner: inner(path, *kind) }
            }
            Step::Replace { path, new, old } => Forward::Exchanged {
                path: path.clone(),
                post: post(i)?,
                inner: inner(path, *new),
                src: Src::upper(id, path),
                src_kind: *old,
                src_ino: js.old_ino,
            },
            Step::DirMeta { path } => Forward::Attrs {
                path: path.clone(),
                before: pre.dirs.get(path).cloned().ok_or_else(|| format!("no attributes kept for step {i}"))?,
                after: retained.after.get(&i).cloned().ok_or_else(|| format!("no attributes taken for step {i}"))?,
            },
        });
    }
    Ok(out)
}

/// An undo's steps as forward steps (undoing an undo redoes what it undid).
fn undo_ops(id: &str, record: &UndoRecord, retained: &Retained) -> Result<Vec<Forward>, String> {
    let post = |i: usize| retained.post.get(&i).copied().ok_or_else(|| format!("no fingerprint for step {i}"));
    let inner = |kind: Kind| match kind {
        Kind::Dir => Inner::Since(retained.threshold_ns),
        _ => Inner::None,
    };
    let mut out = Vec::with_capacity(record.ops.len());
    for (i, op) in record.ops.iter().enumerate() {
        out.push(match op {
            UndoOp::Remove { path, kind, ino, slot } => {
                Forward::Removed { path: path.clone(), kind: *kind, ino: *ino, at: Src::trash(id, *slot) }
            }
            UndoOp::Restore { path, kind, .. } => {
                Forward::Placed { path: path.clone(), post: post(i)?, inner: inner(*kind) }
            }
            UndoOp::Exchange { path, kind, ino, src, src_kind, .. } => Forward::Exchanged {
                path: path.clone(),
                post: post(i)?,
                inner: inner(*src_kind),
                src: src.clone(),
                src_kind: *kind,
                src_ino: *ino,
            },
            UndoOp::Attrs { path, was, .. } => Forward::Attrs {
                path: path.clone(),
                before: was.clone(),
                after: retained.after.get(&i).cloned().ok_or_else(|| format!("no attributes taken for step {i}"))?,
            },
        });
    }
    if !retained.parts.iter().all(|p| layout::valid_id(p)) || !record.parts.iter().all(|p| retained.parts.contains(p)) {
        return Err("its record takes from data it does not own".into());
    }
    Ok(out)
}
