//! Retention: what a committed transaction keeps so that it can be undone, within a budget.
//!
//! A commit already moves what it removes into its trash and swaps what it replaces into its
//! upper layer; retention keeps them instead of deleting them: the transaction directory is
//! renamed to `kept/<id>` (O(1)), with its commit record (moved into it as `applied` by
//! [`crate::commit::finish`]) and two sealed files of its own:
//! `retain-pre`, taken before the commit point ([`prepare`]: the attributes of directories the
//! commit sets, the entries of trees it moves in whole as classified), and `retained`, taken
//! once it is applied ([`keep_commit`]: fingerprints of what it placed, a ctime threshold, its
//! generation). Undo (crate::undo) reads them back as [`entry::Entry`].
//!
//! The budget ([`Budget`]: a count and a size, whichever is reached first, and a share of the
//! filesystem kept free) is applied oldest first through the index ([`index`]), at each commit
//! (evicted data is retired to `gone/`, O(1)) and by the collector and `txbox gc` (deleted).
//! When the filesystem is nearly full, retained data is deleted at once, oldest first
//! ([`yield_space`]), and the caller reports what is no longer undoable.
//!
//! Owns: `kept/` and the `retain-pre`, `retained`, `bytes`, `consumed` files. May not touch: the
//! workspace (it only looks at it), commit records in the journal.

pub mod entry;
pub mod files;
pub mod index;

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

use crate::beneath::Beneath;
use crate::changeset::{ChangeOp, ChangeSet, Fixup};
use crate::fsx::{self, PathError};
use crate::journal::{self, CommitRecord};
use crate::layout;
use crate::plan::Step;
use crate::seal::Domain;
use crate::session::Fingerprint;
use crate::state::{StateDir, StateError};
use files::{read_sealed, write_sealed, DirAttrs, Pre, Retained, RetainedKind};
use index::{Index, Totals};

/// How much is retained: `count` transactions and `bytes` of data at most, whichever limit is
/// reached first, and never while the filesystem has less than `min_free` available. A count or
/// size of 0 turns retention off (nothing is undoable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub count: u64,
    pub bytes: u64,
    pub min_free: MinFree,
}

/// How much of the filesystem retained data leaves available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinFree {
    /// 1 GiB, or 5% of the filesystem if that is less (a small filesystem is not all reserve).
    Default,
    /// This share of the filesystem.
    Percent(u8),
    /// This many bytes.
    Bytes(u64),
}

impl MinFree {
    /// The bytes to keep available on a filesystem of `total` bytes.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            MinFree::Default => (1u64 << 30).min(total / 20),
            MinFree::Percent(p) => total / 100 * u64::from(p.min(100)),
            MinFree::Bytes(b) => b,
        }
    }
}

impl std::fmt::Display for MinFree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MinFree::Default => f.write_str("1 GiB or 5% of the filesystem, whichever is less"),
            MinFree::Percent(p) => write!(f, "{p}% of the filesystem"),
            MinFree::Bytes(b) => write!(f, "{b} bytes"),
        }
    }
}

impl Budget {
    /// 500 transactions, 1 GiB of data, and 1 GiB (at most 5%) of the filesystem left free.
    pub const DEFAULT: Budget = Budget { count: 500, bytes: 1 << 30, min_free: MinFree::Default };
    /// Evicts nothing (recovery, which does not know the budget in force: the next commit or
    /// collector applies it).
    pub const KEEP_ALL: Budget = Budget { count: u64::MAX, bytes: u64::MAX, min_free: MinFree::Bytes(0) };

    pub fn enabled(&self) -> bool {
        self.count > 0 && self.bytes > 0
    }

    fn over(&self, t: Totals) -> bool {
        t.count > self.count || t.bytes > self.bytes
    }
}

impl Default for Budget {
    fn default() -> Budget {
        Budget::DEFAULT
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RetainError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("retaining transaction {tx} for undo: {what}")]
    Refused { tx: String, what: String },
    #[error(transparent)]
    Entry(#[from] entry::EntryError),
}

impl From<PathError> for RetainError {
    fn from(e: PathError) -> RetainError {
        RetainError::State(e.into())
    }
}

/// What keeping a transaction did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Its directory was moved to `kept/` (it is retention's now). It is undoable unless it is
    /// also in `evicted` (a nearly full disk took it back at once).
    pub retained: bool,
    /// Why it could not be retained, if it was to be.
    pub error: Option<String>,
    /// Transactions no longer undoable because their data was evicted (budget, full disk).
    pub evicted: Vec<String>,
    /// Data to measure, or a recount: the collector's own work.
    pub measure: bool,
    /// Evicted data was retired to `gone/`: garbage like a retired directory, which a warm
    /// server deletes when idle.
    pub retired: bool,
}

impl Retention {
    /// Whether a collector is wanted (data to measure, or evicted data retired to `gone/`).
    pub fn collector(&self) -> bool {
        self.measure || self.retired
    }
}

/// How to keep a committed transaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeepOptions {
    pub budget: Budget,
    /// It only kept build output (issue #15): see [`files::Retained::kept_only`].
    pub kept_only: bool,
}

/// Where a committed transaction's applied record is kept (`tx/<id>/applied`).
pub fn record_keep_path(state: &StateDir, id: &str) -> PathBuf {
    state.tx_dir(id).join(layout::KEPT_RECORD)
}

/// Whether transaction `id` was prepared for retention (its `retain-pre` exists): recovery
/// keeps such a transaction once it has rolled it forward.
pub fn prepared(state: &StateDir, id: &str) -> bool {
    layout::valid_id(id)
        && rustix::fs::statat(
            state.fd(),
            Path::new(layout::TX).join(id).join(layout::RETAIN_PRE).as_path(),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .is_ok()
}

fn refused(tx: &str, what: impl Into<String>) -> RetainError {
    RetainError::Refused { tx: tx.to_string(), what: what.into() }
}

/// Before a commit's commit point: keep what its undo needs that its record will not say (the
/// attributes of every directory it sets, as they are now; the entries of every tree it moves
/// in whole, as classified). Made durable by the commit's own flush before its record.
pub fn prepare(state: &StateDir, id: &str, workspace: &Path, cs: &ChangeSet) -> Result<(), RetainError> {
    let ws = rustix::fs::open(workspace, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(fsx::at(workspace, "open workspace"))?;
    let mut pre = Pre { displaced_bytes: cs.displaced_bytes, displaced_dirs: cs.displaced_dirs, ..Pre::default() };
    for c in &cs.changes {
        if let ChangeOp::DirMeta { .. } = c.op {
            let fd = fsx::open_beneath(ws.as_fd(), &c.path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .map_err(fsx::at(&c.path, "open directory"))?;
            pre.dirs.insert(c.path.clone(), DirAttrs::of(fd.as_fd()).map_err(fsx::at(&c.path, "read attributes"))?);
        }
    }
    pre.inner = cs.placed_inner.iter().cloned().collect();
    pre.restat.extend(cs.placed_linked.iter().cloned());
    for f in &cs.fixups {
        let p = match f {
            // Removing a node changes its directory.
            Fixup::RemoveNode(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
            Fixup::RemoveXattr(p, _) | Fixup::Chmod(p, _) => p.clone(),
        };
        if pre.inner.contains_key(&p) && !pre.restat.contains(&p) {
            pre.restat.push(p);
        }
    }
    let dir = state.dir(&format!("{}/{id}", layout::TX))?;
    write_sealed(&dir, layout::RETAIN_PRE, state.seal(), Domain::RetainPre, id, &pre.render(), false)
        .map_err(fsx::at(&state.tx_dir(id).join(layout::RETAIN_PRE), "write"))?;
    Ok(())
}

/// The fingerprint of `rel` in the workspace (no symlink followed), None if absent.
fn fingerprint_at(ws: &mut Beneath, rel: &Path) -> io::Result<Option<Fingerprint>> {
    let st = if rel.as_os_str().is_empty() {
        rustix::fs::fstat(ws.root())?
    } else {
        let (dir, name) = ws.parent(rel)?;
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    };
    Ok(Some(fingerprint_of_stat(&st)))
}

pub(crate) fn fingerprint_of_stat(st: &rustix::fs::Stat) -> Fingerprint {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => crate::meta::Kind::Dir,
        libc::S_IFREG => crate::meta::Kind::File,
        libc::S_IFLNK => crate::meta::Kind::Symlink,
        _ => crate::meta::Kind::Special,
    };
    Fingerprint::Present {
        kind,
        ino: st.st_ino,
        mtime_ns: i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec),
        ctime_ns: i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec),
        size: st.st_size as u64,
    }
}

/// The attributes of directory `rel` in the workspace.
pub(crate) fn attrs_at(ws: &Beneath, rel: &Path) -> io::Result<DirAttrs> {
    let fd = fsx::open_beneath(ws.root(), rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    DirAttrs::of(fd.as_fd())
}

/// Write the transaction's `bytes` file (`estimate` bytes, marked as an estimate when
/// `pending`) and return a ctime taken right after: the threshold of [`entry::Inner::Since`].
/// The file's ctime is read first, so that on filesystems with fine-grained timestamps the
/// change that follows gets a fresh one, later than every ctime handed out before it.
pub(crate) fn stamp(dir: BorrowedFd<'_>, estimate: u64, pending: bool) -> io::Result<i128> {
    let text = format!("{}{estimate}\n", if pending { "~" } else { "" });
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, layout::BYTES, flags, Mode::from_raw_mode(0o600))?;
    fsx::write_all(&fd, text.as_bytes())?;
    rustix::fs::fstat(&fd)?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o600))?;
    let st = rustix::fs::fstat(&fd)?;
    Ok(i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The generation transaction `id` logged in its workspace's commit log (0 if it did not say).
pub(crate) fn generation_of(state: &StateDir, workspace: &Path, id: &str) -> u64 {
    state
        .commit_history(workspace)
        .ok()
        .and_then(|h| h.into_iter().rev().find(|l| l.tx.as_deref() == Some(id)).map(|l| l.generation))
        .unwrap_or(0)
}

/// After a commit of transaction `id` was applied with its record kept
/// ([`record_keep_path`]): take what its undo needs and move its directory to `kept/`. Under
/// the workspace's lock, before anything else commits to it. `generation` is the one it logged
/// (looked up when None: recovery). Then the budget is applied.
pub fn keep_commit(
    state: &StateDir,
    id: &str,
    generation: Option<u64>,
    opts: &KeepOptions,
) -> Result<Retention, RetainError> {
    let tx_rel = PathBuf::from(layout::TX).join(id);
    let tx = fsx::dir_beneath(state.fd(), &tx_rel).map_err(fsx::at(&state.tx_dir(id), "open"))?;
    let record_path = record_keep_path(state, id);
    let text = fsx::read_small(tx.as_fd(), Path::new(layout::KEPT_RECORD), 1 << 30)
        .map_err(fsx::at(&record_path, "read kept record"))?;
    let record = journal::parse(&text, &record_path, state.seal(), id).map_err(|e| refused(id, e.to_string()))?;
    if !layout::is_normal_absolute(&record.workspace) {
        return Err(refused(id, "its record's workspace is not a plain absolute path"));
    }
    let pre = match read_sealed(tx.as_fd(), Path::new(layout::RETAIN_PRE), state.seal(), Domain::RetainPre, id, 1 << 30)
    {
        Ok(Some(body)) => Pre::parse(&body).ok_or_else(|| refused(id, "its retain-pre file does not parse"))?,
        Ok(None) => return Err(refused(id, "it was not prepared for retention")),
        Err(e) => return Err(fsx::PathError::new(&state.tx_dir(id), "read retain-pre", e).into()),
    };
    normalize_upper(state, id, &record)?;
    let mut ws = Beneath::open(&record.workspace).map_err(fsx::at(&record.workspace, "open workspace"))?;
    let mut post = BTreeMap::new();
    let mut after = BTreeMap::new();
    for (i, js) in record.steps.iter().enumerate() {
        let path = js.step.path();
        match &js.step {
            Step::Create { .. } | Step::Replace { .. } => {
                let fp = fingerprint_at(&mut ws, path)
                    .map_err(fsx::at(path, "fingerprint"))?
                    .ok_or_else(|| refused(id, format!("{} is not where the commit put it", path.display())))?;
                post.insert(i, fp);
            }
            Step::DirMeta { .. } => {
                after.insert(i, attrs_at(&ws, path).map_err(fsx::at(path, "read attributes"))?);
            }
            Step::Remove { .. } => {}
        }
    }
    let mut restat = BTreeMap::new();
    for p in &pre.restat {
        if let Some(fp) = fingerprint_at(&mut ws, p).map_err(fsx::at(p, "fingerprint"))? {
            restat.insert(p.clone(), fp);
        }
    }
    drop(ws);
    let pending = pre.displaced_dirs > 0;
    let threshold_ns =
        stamp(tx.as_fd(), pre.displaced_bytes, pending).map_err(fsx::at(&state.tx_dir(id), "write bytes"))?;
    let retained = Retained {
        kind: RetainedKind::Commit,
        generation: generation.unwrap_or_else(|| generation_of(state, &record.workspace, id)),
        workspace: record.workspace.clone(),
        time_ms: now_ms(),
        threshold_ns,
        kept_only: opts.kept_only,
        parts: vec![id.to_string()],
        undoes: Vec::new(),
        post,
        after,
        restat,
    };
    let tx_rw = state.dir(&format!("{}/{id}", layout::TX))?;
    write_sealed(&tx_rw, layout::RETAINED, state.seal(), Domain::Retained, id, &retained.render(), false)
        .map_err(fsx::at(&state.tx_dir(id).join(layout::RETAINED), "write"))?;
    drop((tx, tx_rw));
    let idx = Index::lock(state)?;
    idx.append(id)?;
    let txs = state.dir(layout::TX)?;
    fsx::rename_noreplace(txs.as_fd(), OsStr::new(id), idx.kept(), OsStr::new(id))
        .map_err(fsx::at(&state.tx_dir(id), "move to kept"))?;
    // From here it is retained: what fails now is bookkeeping, repaired by a recount.
    let mut out = Retention { retained: true, measure: pending, ..Retention::default() };
    let booked = idx.adjust(1, pre.displaced_bytes as i64).and_then(|()| match pending {
        true => idx.add_pending(id),
        false => Ok(()),
    });
    if let Err(e) = booked {
        let _ = idx.flag_recount();
        out.error = Some(e.to_string());
        out.measure = true;
    }
    if let Err(e) = apply_budget(state, &idx, &opts.budget, Eviction::Retire, &mut out) {
        out.error = Some(e.to_string());
    }
    Ok(out)
}

/// A session's squashed layer lives in `steps/<n>/upper` (or next to the workspace): move it to
/// `upper`, where a run's is, so that retained data has one shape.
fn normalize_upper(state: &StateDir, id: &str, record: &CommitRecord) -> Result<(), RetainError> {
    let run_upper = state.tx_dir(id).join(layout::UPPER);
    if record.upper == run_upper {
        return Ok(());
    }
    let here = rustix::fs::statat(
        state.fd(),
        Path::new(layout::TX).join(id).join(layout::UPPER).as_path(),
        AtFlags::SYMLINK_NOFOLLOW,
    );
    if here.is_ok() {
        return Ok(());
    }
    // The same check as when the record was read: `<steps root>/<n>/upper`, the steps root
    // derived from the id and checked to be a plain directory.
    let steps = state.steps_root(id, &record.workspace)?;
    let rest = record.upper.strip_prefix(&steps).map_err(|_| refused(id, "its upper layer is not its own"))?;
    let mut c = rest.components();
    let ok = matches!(
        (c.next(), c.next(), c.next()),
        (Some(std::path::Component::Normal(n)), Some(std::path::Component::Normal(u)), None)
            if n.to_str().is_some_and(|n| n.parse::<u32>().is_ok()) && u == layout::UPPER
    );
    if !ok {
        return Err(refused(id, "its upper layer is not its own"));
    }
    std::fs::rename(&record.upper, &run_upper).map_err(fsx::at(&record.upper, "keep upper layer"))?;
    state.drop_outside_layers(id);
    Ok(())
}

/// How evicted data goes: renamed to `gone/` for a collector (the commit path), or deleted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Eviction {
    Retire,
    Delete,
}

/// Drop live entry `id` and all the data it owns; returns the bytes it was counted for.
fn evict(idx: &Index<'_>, state: &StateDir, id: &str, how: Eviction) -> Result<u64, RetainError> {
    let parts = match entry::header(state, id) {
        Ok((r, _)) => r.parts,
        Err(_) => vec![id.to_string()],
    };
    let mut bytes = 0u64;
    for part in &parts {
        bytes = bytes.saturating_add(idx.part_bytes(part).0);
    }
    // Its own directory first: once that is gone it is no longer undoable, whatever follows.
    for part in &parts {
        match how {
            Eviction::Retire => idx.retire_part(part)?,
            Eviction::Delete => idx.delete_part(part)?,
        }
    }
    Ok(bytes)
}

/// [`evict`] one transaction for a walk of the index: true if it went (the totals say so),
/// false if it failed (the first failure kept in `err`, the walk stops).
fn evict_counted(
    idx: &Index<'_>,
    state: &StateDir,
    id: &str,
    how: Eviction,
    totals: &mut Totals,
    err: &mut Option<RetainError>,
) -> bool {
    match evict(idx, state, id, how) {
        Ok(bytes) => {
            totals.count = totals.count.saturating_sub(1);
            totals.bytes = totals.bytes.saturating_sub(bytes);
            true
        }
        Err(e) => {
            err.get_or_insert(e);
            false
        }
    }
}

/// Retained transactions an undo past its commit point still takes data from (its record in
/// the journal names them): never evicted until that undo is finished.
fn protected(state: &StateDir) -> HashSet<String> {
    let mut out = HashSet::new();
    let Ok(journal) = state.dir(layout::JOURNAL) else { return out };
    let Ok(names) = fsx::list(journal.as_fd()) else { return out };
    for name in names {
        let Some((id, false)) = layout::undo_record_id(&name) else { continue };
        let Ok(text) = fsx::read_small(journal.as_fd(), Path::new(&name), 1 << 30) else { continue };
        if let Ok(r) = crate::undo::record::UndoRecord::parse(&text, state.seal(), id) {
            out.extend(r.parts);
            out.extend(r.undoes);
        }
    }
    out
}

/// The filesystem's available and total bytes.
fn space(state: &StateDir) -> Option<(u64, u64)> {
    let s = rustix::fs::fstatvfs(state.fd()).ok()?;
    let frag = s.f_frsize.max(1);
    Some((s.f_bavail.saturating_mul(frag), s.f_blocks.saturating_mul(frag)))
}

fn low_on_space(state: &StateDir, budget: &Budget) -> bool {
    match space(state) {
        // The reserve is looked for only when it could matter (one `statvfs` when there is room).
        Some((avail, total)) if total > 0 => {
            avail < budget.min_free.bytes(total).saturating_add(layout::RESERVE_BYTES)
                && avail < wanted_free(state, budget, total)
        }
        _ => false,
    }
}

/// What retained data leaves free on a filesystem of `total` bytes: the budget's free share,
/// and room to make the state directory's space reserve again if it was given up (so that the
/// next commit on a full disk has it: a deletion that had to take the reserve is not kept at
/// the cost of it). A free share of 0 asks for nothing.
fn wanted_free(state: &StateDir, budget: &Budget, total: u64) -> u64 {
    let share = budget.min_free.bytes(total);
    let reserve_gone = rustix::fs::statat(state.fd(), layout::RESERVE, AtFlags::SYMLINK_NOFOLLOW).is_err();
    if share > 0 && reserve_gone {
        share.saturating_add(layout::RESERVE_BYTES)
    } else {
        share
    }
}

/// Apply `budget`: evict the oldest live entries while over the count or the size; then, if the
/// filesystem is nearly full, delete the oldest until it is not (whatever `how` says: retiring
/// frees nothing).
pub(crate) fn apply_budget(
    state: &StateDir,
    idx: &Index<'_>,
    budget: &Budget,
    how: Eviction,
    out: &mut Retention,
) -> Result<(), RetainError> {
    let mut totals = idx.totals();
    if !budget.over(totals) && !low_on_space(state, budget) {
        return Ok(());
    }
    let keep = protected(state);
    let mut err = None;
    let dropped = idx.drop_oldest(|id| {
        if keep.contains(id) {
            return Ok(false);
        }
        let low = low_on_space(state, budget);
        if !budget.over(totals) && !low {
            return Ok(false);
        }
        Ok(evict_counted(idx, state, id, if low { Eviction::Delete } else { how }, &mut totals, &mut err))
    })?;
    idx.set_totals(totals)?;
    if how == Eviction::Retire && !dropped.is_empty() {
        out.retired = true;
    }
    out.evicted.extend(dropped);
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Free space by deleting retained data, oldest first, until at least `want` bytes are
/// available on the state directory's filesystem or nothing is retained. For the commit path
/// when it runs out of space (issue #14): returns the transactions no longer undoable. Takes
/// the index lock; call it under a workspace lock or none.
pub fn yield_space(state: &StateDir, want: u64) -> Result<Vec<String>, RetainError> {
    let idx = Index::lock(state)?;
    let keep = protected(state);
    let mut totals = idx.totals();
    let mut err = None;
    let dropped = idx.drop_oldest(|id| {
        if keep.contains(id) || space(state).is_some_and(|(avail, _)| avail >= want) {
            return Ok(false);
        }
        Ok(evict_counted(&idx, state, id, Eviction::Delete, &mut totals, &mut err))
    })?;
    idx.set_totals(totals)?;
    match err {
        Some(e) => Err(e),
        None => Ok(dropped),
    }
}

/// If the filesystem has less than the budget's free share available, delete retained data,
/// oldest first, until it has (or nothing is retained): before a transaction, so that a nearly
/// full disk is freed by what undo kept before anything else fails. One `statvfs` when there is
/// room. Returns the transactions no longer undoable.
pub fn yield_if_low(state: &StateDir, budget: &Budget) -> Result<Vec<String>, RetainError> {
    if !low_on_space(state, budget) {
        return Ok(Vec::new());
    }
    let want = space(state).map_or(0, |(_, total)| wanted_free(state, budget, total));
    yield_space(state, want)
}

/// What a collection did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Collected {
    /// Retained transactions whose size was measured.
    pub measured: usize,
    /// Retained transactions evicted by the budget (no longer undoable).
    pub evicted: Vec<String>,
    pub recounted: bool,
    /// What is retained afterwards.
    pub count: u64,
    pub bytes: u64,
}

/// The collector's part (background `txbox __gc`, and `txbox gc`): measure what waits to be
/// measured, recount if a recovery asked, apply the budget deleting what it evicts.
pub fn collect(state: &StateDir, budget: &Budget) -> Result<Collected, RetainError> {
    let pending = Index::lock(state)?.take_pending()?;
    // Measured without the lock (a large tree takes a while), recorded with it.
    let mut sizes = Vec::with_capacity(pending.len());
    for id in pending {
        if let Some(bytes) = index::measure(state, &id)? {
            sizes.push((id, bytes));
        }
    }
    let idx = Index::lock(state)?;
    let mut out = Collected::default();
    for (id, bytes) in sizes {
        let delta = idx.record_measured(&id, bytes)?;
        idx.adjust(0, delta)?;
        out.measured += 1;
    }
    if idx.totals().recount {
        idx.recount()?;
        out.recounted = true;
    }
    let mut r = Retention::default();
    apply_budget(state, &idx, budget, Eviction::Delete, &mut r)?;
    out.evicted = r.evicted;
    let t = idx.totals();
    (out.count, out.bytes) = (t.count, t.bytes);
    Ok(out)
}

/// Delete the retained data of `ids` now (undo data can hold deleted secrets), or of every
/// retained transaction with `all`. A transaction whose data an undo consumed is purged by
/// purging that undo. Returns the transactions purged.
pub fn purge(state: &StateDir, ids: &[String], all: bool) -> Result<Vec<String>, RetainError> {
    let idx = Index::lock(state)?;
    let keep = protected(state);
    let targets = if all { idx.live_ids()? } else { ids.to_vec() };
    let mut out = Vec::new();
    for id in targets {
        match entry::header(state, &id) {
            Ok((_, Some(by))) => return Err(entry::EntryError::Consumed { id, by }.into()),
            Ok(_) => {}
            Err(entry::EntryError::Missing(_)) if all => continue,
            Err(e) => return Err(e.into()),
        }
        if keep.contains(&id) {
            return Err(refused(&id, "an interrupted undo still uses it; run `txbox recover` first"));
        }
        let bytes = evict(&idx, state, &id, Eviction::Delete)?;
        idx.adjust(-1, -(bytes as i64))?;
        out.push(id);
    }
    // Retired data (evicted earlier, waiting for a collector) may hold the same secrets.
    state.collect_retired()?;
    Ok(out)
}

/// Whether a committed transaction can be undone, for `txbox log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undoability {
    /// Undoable; its data holds `bytes` (at least, if `estimate`).
    Undoable { bytes: u64, estimate: bool, kept_only: bool },
    /// Undone by this transaction (undo that to redo it).
    UndoneBy(String),
    /// Nothing retained.
    Gone,
}

/// See [`Undoability`]. Reads a few small files; takes no lock.
pub fn undoability(state: &StateDir, id: &str) -> Undoability {
    match entry::header(state, id) {
        Ok((_, Some(by))) => Undoability::UndoneBy(by),
        Ok((r, None)) => {
            let Ok(kept) = state.dir(layout::KEPT) else { return Undoability::Gone };
            let (mut bytes, mut estimate) = (0u64, false);
            for part in &r.parts {
                let (b, e) = part_bytes(kept.as_fd(), part);
                bytes = bytes.saturating_add(b);
                estimate |= e;
            }
            Undoability::Undoable { bytes, estimate, kept_only: r.kept_only }
        }
        Err(_) => Undoability::Gone,
    }
}

fn part_bytes(kept: BorrowedFd<'_>, id: &str) -> (u64, bool) {
    let Ok(b) = fsx::read_small(kept, &Path::new(id).join(layout::BYTES), 64) else { return (0, true) };
    let text = String::from_utf8_lossy(&b);
    match text.trim().strip_prefix('~') {
        Some(n) => (n.parse().unwrap_or(0), true),
        None => (text.trim().parse().unwrap_or(0), false),
    }
}

/// How much is retained now (from the totals; a recount pending is said).
pub fn totals(state: &StateDir) -> Result<Totals, RetainError> {
    Ok(Index::lock(state)?.totals())
}

/// Open `kept/` (for callers that only look).
pub(crate) fn kept_dir(state: &StateDir) -> Result<OwnedFd, StateError> {
    state.dir(layout::KEPT)
}
