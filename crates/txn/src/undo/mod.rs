//! Undo: a transaction that inverts committed ones, from what retention kept (crate::retain).
//!
//! `undo` of a transaction T is itself a transaction U: its steps ([`record::UndoOp`]) are T's
//! inverted ([`plan`]): what T placed is moved into U's trash, what T replaced is exchanged
//! back with the old object T kept, what T removed is moved back from T's trash, directory
//! attributes T set are set back. U is committed like a commit, through the journal: its undo
//! record ([`record`]) is the commit point, every step checks on the private side whether it
//! already happened, and recovery finishes it ([`apply::recover_pending`]). What U displaces is
//! kept as U's own undo data, and T's data becomes U's: undoing U redoes T.
//!
//! Conflicts refuse the undo before anything changes (exit 3): a path it would touch that does
//! not hold what T left there (by fingerprint), or that a later commit still in effect changed
//! (the workspace's commit log, ancestors and descendants included). Undoing an older
//! transaction whose paths were not touched since leaves later ones in place.
//!
//! Targets ([`Target`]): the workspace's last commit; a given transaction; or, with `--to T`,
//! every commit after T, newest first, in one transaction. For `--to`, an undo and what it
//! undid that both lie after T cancel out and are left alone.

pub mod apply;
pub mod plan;
pub mod record;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

use crate::commit::CrashHook;
use crate::layout::{self, TxKind};
use crate::retain::entry::{self, Entry, EntryError};
use crate::retain::files::{Retained, RetainedKind};
use crate::retain::index::Index;
use crate::retain::{self, Budget, Eviction, RetainError, Retention};
use crate::state::{Logged, StateDir, StateError, TxDir};
use plan::{Changes, Conflict};
use record::UndoRecord;

/// What to undo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The workspace's last commit (one that only kept build output does not count).
    Last,
    /// This transaction.
    Tx(String),
    /// Every commit after this one, newest first, as one transaction.
    To(String),
}

#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Entry(#[from] EntryError),
    #[error(transparent)]
    Retain(#[from] RetainError),
    #[error("undo step `{step}` on {path}: {source}")]
    Io { step: &'static str, path: PathBuf, source: io::Error },
    #[error("{path} changed in the workspace during the undo ({what})")]
    Conflict { path: PathBuf, what: String },
    #[error("retained data is damaged: {0}")]
    Damaged(String),
    #[error("undo stopped by the crash-injection hook after {0} mutating calls")]
    Injected(usize),
    #[error("{0}")]
    NotUndoable(String),
    /// The caller's vetting of what the undo would put in place refused it (nothing changed).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Journal(String),
}

impl From<crate::fsx::PathError> for UndoError {
    fn from(e: crate::fsx::PathError) -> UndoError {
        UndoError::State(e.into())
    }
}

impl From<crate::RecoverError> for UndoError {
    fn from(e: crate::RecoverError) -> UndoError {
        UndoError::NotUndoable(format!("recovery before the undo failed: {e}"))
    }
}

/// How an undo runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct UndoOptions {
    pub budget: Budget,
}

/// What an undo did.
#[derive(Debug, Clone)]
pub struct Undone {
    /// The undo's own transaction id (undo it to redo).
    pub tx: String,
    /// The transactions it undid (or would have), newest first.
    pub undone: Vec<String>,
    /// Empty when it committed; else why nothing changed.
    pub conflicts: Vec<Conflict>,
    pub changes: Changes,
    /// Transactions no longer undoable because their data was evicted.
    pub evicted: Vec<String>,
    /// A collector is wanted.
    pub collector: bool,
}

/// What an undo would change in the workspace, for a caller to vet before anything changes
/// ([`undo_vetted`]): every path it would put an object at (each entry inside a directory it
/// puts back included), with where that object is now, and every path it would remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    /// The state directory's `kept/`, which holds every object placed.
    pub kept: PathBuf,
    /// (workspace path, the object's path beneath `kept`).
    pub placed: Vec<(PathBuf, PathBuf)>,
    pub removed: Vec<PathBuf>,
}

/// A caller's verdict on [`Touched`]: `Err(why)` refuses the undo ([`UndoError::Refused`]).
pub type Vet<'a> = &'a dyn Fn(&Touched) -> Result<(), String>;

/// Undo `target` in `workspace` (a real absolute path). Takes the workspace's lock, finishes
/// what a crash left first, and holds the retention index from planning to the end.
pub fn undo(
    state: &StateDir,
    workspace: &Path,
    target: &Target,
    opts: &UndoOptions,
    hook: &mut CrashHook,
) -> Result<Undone, UndoError> {
    undo_vetted(state, workspace, target, opts, None, hook)
}

/// [`undo`], with `vet` asked, once the undo is planned and free of conflicts and before its
/// commit point, whether what it would change may be changed.
pub fn undo_vetted(
    state: &StateDir,
    workspace: &Path,
    target: &Target,
    opts: &UndoOptions,
    vet: Option<Vet<'_>>,
    hook: &mut CrashHook,
) -> Result<Undone, UndoError> {
    let _lock = state.lock_workspace(workspace)?;
    crate::recover(state, Some(workspace), &mut CrashHook::default())?;
    let idx = Index::lock(state)?;
    let resolved = resolve(state, workspace, target)?;
    let undo_refs: Vec<&Entry> = resolved.undo.iter().collect();
    let later_refs: Vec<&Entry> = resolved.later.iter().collect();
    let later = plan::later_placements(&later_refs);
    let mut view = apply::RealView::open(state, workspace)?;
    let mut plan = plan::plan(&undo_refs, &later, &mut view).map_err(|e| UndoError::Io {
        step: "look at the workspace",
        path: workspace.to_path_buf(),
        source: e,
    })?;
    drop(view);
    let renamed: Vec<PathBuf> = plan.ops.iter().filter(|o| o.is_rename()).map(|o| o.path().to_path_buf()).collect();
    for (path, by) in overlapping(&renamed, &resolved.log_paths) {
        plan.conflicts.push(Conflict { path, what: format!("changed since by a later commit ({by})") });
    }
    let undone: Vec<String> = resolved.undo.iter().map(|e| e.id.clone()).collect();
    if !plan.conflicts.is_empty() {
        plan.conflicts.sort_by(|a, b| a.path.cmp(&b.path));
        plan.conflicts.dedup_by(|a, b| a.path == b.path);
        return Ok(Undone {
            tx: crate::state::new_tx_id(),
            undone,
            conflicts: plan.conflicts,
            changes: Changes::default(),
            evicted: Vec::new(),
            collector: false,
        });
    }
    if let Some(vet) = vet {
        vet(&touched(state, &plan.ops)?).map_err(UndoError::Refused)?;
    }
    let tx = TxDir::create(state, workspace, TxKind::Undo)?;
    let mut parts = Vec::new();
    for e in &resolved.undo {
        for p in &e.retained.parts {
            if !parts.contains(p) {
                parts.push(p.clone());
            }
        }
    }
    let rec = UndoRecord {
        tx: tx.id.clone(),
        workspace: workspace.to_path_buf(),
        undoes: undone.clone(),
        parts,
        ops: plan.ops,
    };
    let generation = state.log_commit_of(workspace, Some(&tx.id), &renamed)?;
    let committed = (|| -> Result<(), UndoError> {
        std::fs::create_dir(&tx.trash).map_err(|e| UndoError::Io {
            step: "create trash",
            path: tx.trash.clone(),
            source: e,
        })?;
        // What earlier commits moved into `kept/` must be durable before a record points at it.
        let root = rustix::fs::openat(
            state.fd(),
            ".",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| UndoError::Io {
            step: "open state directory",
            path: state.root.clone(),
            source: e.into(),
        })?;
        rustix::fs::syncfs(&root).map_err(|e| UndoError::Io {
            step: "syncfs",
            path: state.root.clone(),
            source: e.into(),
        })?;
        apply::tick(hook)?;
        apply::write_record(state, &rec)
    })();
    if let Err(e) = committed {
        let past_point = state.root.join(layout::JOURNAL).join(layout::undo_record_name(&tx.id)).exists();
        if !past_point {
            let _ = state.cancel_commit(workspace, generation, &tx.id);
            let id = tx.id.clone();
            drop(tx);
            let _ = state.remove_tx(&id);
        }
        return Err(e);
    }
    apply::finish(state, &idx, &rec, Some(generation), hook, false)?;
    drop(tx);
    let mut r = Retention::default();
    // The budget is applied after: an undo needs the data it consumes until it is done.
    retain::apply_budget(state, &idx, &opts.budget, Eviction::Retire, &mut r)?;
    Ok(Undone {
        tx: rec.tx,
        undone,
        conflicts: Vec::new(),
        changes: plan.changes,
        collector: r.collector() || rec.ops.iter().any(|o| matches!(o, record::UndoOp::Remove { .. })),
        evicted: r.evicted,
    })
}

/// What `ops` would change: the paths they place (a directory put back with every entry inside
/// it, read from the retained data without following anything) and remove.
fn touched(state: &StateDir, ops: &[record::UndoOp]) -> Result<Touched, UndoError> {
    use record::UndoOp;
    let kept = state.root.join(layout::KEPT);
    let mut out = Touched { kept: kept.clone(), ..Touched::default() };
    for op in ops {
        let (path, kind, src) = match op {
            UndoOp::Remove { path, .. } => {
                out.removed.push(path.clone());
                continue;
            }
            UndoOp::Restore { path, kind, src, .. } => (path, *kind, src),
            UndoOp::Exchange { path, src, src_kind, .. } => (path, *src_kind, src),
            UndoOp::Attrs { .. } => continue,
        };
        out.placed.push((path.clone(), src.beneath_kept()));
        if kind == crate::meta::Kind::Dir {
            let mut stack = vec![(src.beneath_kept(), path.clone())];
            while let Some((rel, at)) = stack.pop() {
                let dir = kept.join(&rel);
                let io = |e| UndoError::Io { step: "list retained directory", path: dir.clone(), source: e };
                for e in std::fs::read_dir(&dir).map_err(io)? {
                    let e = e.map_err(io)?;
                    let (inner, inner_rel) = (at.join(e.file_name()), rel.join(e.file_name()));
                    // The entry's own type: a symlink is never followed.
                    if e.file_type().map_err(io)?.is_dir() {
                        stack.push((inner_rel.clone(), inner.clone()));
                    }
                    out.placed.push((inner, inner_rel));
                }
            }
        }
    }
    Ok(out)
}

/// What to undo and what to check it against.
struct Resolved {
    /// The entries to undo, newest first.
    undo: Vec<Entry>,
    /// Retained transactions after them not undone now (oldest first): what they put back is
    /// what is expected where they did.
    later: Vec<Entry>,
    /// Paths changed by commits after them that are still in effect, with the transaction.
    log_paths: Vec<(PathBuf, String)>,
}

fn not_undoable(msg: impl Into<String>) -> UndoError {
    UndoError::NotUndoable(msg.into())
}

/// Whether the transactions after a point, taken together, still have an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Net {
    /// Not in the range.
    Outside,
    /// Its effect is in force.
    Active,
    /// It and what it undid cancel out within the range.
    Identity,
    /// An undo some of whose undone transactions lie inside the range and some outside.
    Partial,
}

/// The retained transactions of a range: id → (is an undo, what it undid).
type Chains = HashMap<String, (bool, Vec<String>)>;

/// Whether a retained transaction is one of the workspace's commits as undo sees history: what
/// `txbox undo` with no id calls the last commit, what `--to` undoes, and what is in force for
/// undo's commit-log conflicts. The one place that rule lives (issue #15: a transaction that
/// only kept build output, committed although its command failed, is not; it stays undoable
/// by its id).
fn is_commit(r: &Retained) -> bool {
    !r.kept_only
}

/// A transaction of a range: live (not consumed), one of the workspace's commits ([`is_commit`]).
struct Row {
    id: String,
    live: bool,
    commit: bool,
}

/// The net effect, over the range, of each transaction in `range`.
fn net(id: &str, range: &Chains, memo: &mut HashMap<String, Net>) -> Net {
    if let Some(n) = memo.get(id) {
        return *n;
    }
    let n = match range.get(id) {
        None => Net::Outside,
        Some((false, _)) => Net::Active,
        Some((true, undid)) => {
            let undid = undid.clone();
            let inner: Vec<Net> = undid.iter().map(|u| net(u, range, memo)).collect();
            let active = inner.iter().filter(|n| **n == Net::Active).count();
            if inner.contains(&Net::Partial) {
                Net::Partial
            } else if active == inner.len() && active > 0 {
                Net::Identity
            } else if active == 0 {
                Net::Active
            } else {
                Net::Partial
            }
        }
    };
    memo.insert(id.to_string(), n);
    n
}

/// Whether the audit log says `id` committed. A transaction logged in the commit log (before its
/// commit point) that has no retained data either expired or never committed (a crash before its
/// commit point leaves its line uncancelled): the audit log tells the two apart. Read once.
struct Audited<'s> {
    state: &'s StateDir,
    committed: Option<std::collections::HashSet<String>>,
}

impl Audited<'_> {
    fn committed(&mut self, id: &str) -> bool {
        let state = self.state;
        self.committed
            .get_or_insert_with(|| {
                crate::audit::read_all(&state.audit_path())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|e| matches!(e.outcome.as_str(), "committed" | "rolled_forward"))
                    .map(|e| e.tx)
                    .collect()
            })
            .contains(id)
    }
}

fn resolve(state: &StateDir, workspace: &Path, target: &Target) -> Result<Resolved, UndoError> {
    let mut audited = Audited { state, committed: None };
    let history: Vec<Logged> = state.commit_history(workspace)?.into_iter().filter(|l| !l.cancelled).collect();
    // Logged, never committed (cut before its commit point): not history. Asked only of the
    // lines an undo looks at (those after what it undoes).
    let mut real = |l: &Logged| match &l.tx {
        Some(id) => entry::header(state, id).is_ok() || audited.committed(id) || pending(state, id),
        None => true,
    };
    match target {
        Target::Last => {
            for l in history.iter().rev().filter(|l| real(l)) {
                let Some(id) = &l.tx else {
                    return Err(not_undoable(format!(
                        "the workspace's last commit (generation {}) was made by a txbox that kept no undo data",
                        l.generation
                    )));
                };
                match entry::header(state, id) {
                    Ok((r, None)) if !is_commit(&r) => continue,
                    Ok((_, _)) => return single(state, &history, &mut real, entry::load(state, id, false)?),
                    Err(EntryError::Missing(_)) => {
                        return Err(not_undoable(format!(
                            "the workspace's last commit {id} is not undoable: its retained data expired \
                             (retention budget), was purged, or yielded to a full disk; `txbox log` shows \
                             which transactions are undoable"
                        )))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(not_undoable("nothing was committed to this workspace yet"))
        }
        Target::Tx(id) => {
            let e = entry::load(state, id, false)?;
            if e.retained.workspace != workspace {
                return Err(not_undoable(format!(
                    "transaction {id} belongs to workspace {}, not {}",
                    e.retained.workspace.display(),
                    workspace.display()
                )));
            }
            single(state, &history, &mut real, e)
        }
        Target::To(id) => to(state, workspace, &history, &mut real, id),
    }
}

/// Headers of every transaction logged after generation `after`: id → (header, consumed by).
/// A transaction without undo data is an error (`what` says what for).
fn range_of(
    state: &StateDir,
    history: &[Logged],
    real: &mut dyn FnMut(&Logged) -> bool,
    after: u64,
    strict: bool,
) -> Result<(Chains, Vec<Row>), UndoError> {
    let mut range = HashMap::new();
    let mut rows = Vec::new();
    for l in history.iter().filter(|l| l.generation > after) {
        if !real(l) {
            continue;
        }
        let Some(id) = &l.tx else {
            if strict {
                return Err(not_undoable(format!(
                    "the commit at generation {} was made by a txbox that kept no undo data; cannot go back past it",
                    l.generation
                )));
            }
            continue;
        };
        match entry::header(state, id) {
            Ok((r, by)) => {
                range.insert(id.clone(), (r.kind == RetainedKind::Undo, r.undoes.clone()));
                rows.push(Row { id: id.clone(), live: by.is_none(), commit: is_commit(&r) });
            }
            Err(EntryError::Missing(_)) if !strict => {}
            Err(EntryError::Missing(_)) => {
                return Err(not_undoable(format!(
                    "transaction {id} (generation {}) is no longer undoable (its retained data expired, was \
                     purged or yielded to a full disk); cannot go back past it",
                    l.generation
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((range, rows))
}

/// Undo one transaction `e`: later commits stay, and must not have changed its paths.
fn single(
    state: &StateDir,
    history: &[Logged],
    real: &mut dyn FnMut(&Logged) -> bool,
    e: Entry,
) -> Result<Resolved, UndoError> {
    let g = e.retained.generation;
    let (range, rows) = range_of(state, history, real, g, false)?;
    let mut memo = HashMap::new();
    let mut log_paths = Vec::new();
    let mut later = Vec::new();
    for l in history.iter().filter(|l| l.generation > g) {
        if !real(l) {
            continue;
        }
        let Some(id) = &l.tx else {
            log_paths.extend(l.paths.iter().map(|p| (p.clone(), format!("generation {}", l.generation))));
            continue;
        };
        if *id == e.id {
            continue;
        }
        match rows.iter().find(|r| r.id == *id) {
            // Not retained: in force as far as anyone can tell.
            None => log_paths.extend(l.paths.iter().map(|p| (p.clone(), id.clone()))),
            Some(row) => {
                let in_force =
                    row.live && row.commit && matches!(net(id, &range, &mut memo), Net::Active | Net::Partial);
                if in_force {
                    log_paths.extend(l.paths.iter().map(|p| (p.clone(), id.clone())));
                }
                if let Ok(x) = entry::load(state, id, true) {
                    later.push(x);
                }
            }
        }
    }
    Ok(Resolved { undo: vec![e], later, log_paths })
}

/// Undo every commit after `id`.
fn to(
    state: &StateDir,
    workspace: &Path,
    history: &[Logged],
    real: &mut dyn FnMut(&Logged) -> bool,
    id: &str,
) -> Result<Resolved, UndoError> {
    let Some(g) = history.iter().find(|l| l.tx.as_deref() == Some(id)).map(|l| l.generation) else {
        return Err(not_undoable(format!(
            "transaction {id} is not a commit of {} (see `txbox log`)",
            workspace.display()
        )));
    };
    let (range, rows) = range_of(state, history, real, g, true)?;
    let mut memo = HashMap::new();
    let mut undo = Vec::new();
    let mut later = Vec::new();
    for row in rows.iter().rev() {
        let n = net(&row.id, &range, &mut memo);
        if row.live && n == Net::Partial {
            return Err(not_undoable(format!(
                "undo {} undid transactions both before and after {id}; undo it on its own first",
                row.id
            )));
        }
        if row.live && row.commit && n == Net::Active {
            undo.push(entry::load(state, &row.id, false)?);
        } else {
            later.push(entry::load(state, &row.id, true)?);
        }
    }
    later.reverse();
    if undo.is_empty() {
        return Err(not_undoable(format!("nothing to undo: the workspace is as {id} left it")));
    }
    Ok(Resolved { undo, later, log_paths: Vec::new() })
}

/// Whether transaction `id` is in flight or waiting for recovery (a directory in `tx/`).
fn pending(state: &StateDir, id: &str) -> bool {
    layout::valid_id(id) && crate::fsx::dir_beneath(state.fd(), &Path::new(layout::TX).join(id)).is_ok()
}

/// Paths of `ours` that are, or are ancestors or descendants of, a path of `theirs`.
fn overlapping(ours: &[PathBuf], theirs: &[(PathBuf, String)]) -> Vec<(PathBuf, String)> {
    let mut out = BTreeMap::new();
    for p in ours {
        if let Some((_, by)) = theirs.iter().find(|(q, _)| p.starts_with(q) || q.starts_with(p)) {
            out.entry(p.clone()).or_insert_with(|| by.clone());
        }
    }
    out.into_iter().collect()
}

/// The transactions `undo` would pick for `target` now, newest first (for front ends that
/// want to say what they are about to undo, and for tests). Takes no lock.
pub fn targets(state: &StateDir, workspace: &Path, target: &Target) -> Result<Vec<String>, UndoError> {
    Ok(resolve(state, workspace, target)?.undo.into_iter().map(|e| e.id).collect())
}
