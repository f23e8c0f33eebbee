//! The undo plan: the steps that invert retained transactions, and the conflicts that refuse
//! them. Pure but for what it asks its [`View`] (the workspace and the retained data, read
//! only), so it is unit-tested with a fake.
//!
//! Inverting a transaction inverts each of its steps: what it placed is removed (into the
//! undo's trash), what it exchanged is exchanged back, what it removed is restored, attributes
//! it set are set back. Renames go first, the transactions newest first and each one's steps
//! in reverse; attributes last (a rename into a directory changes its times), newest first, so
//! the oldest transaction's attributes are what remains.
//!
//! Before each step, the path must hold exactly what the transaction left there (a file or
//! symlink by fingerprint: kind, inode, mtime, ctime, size; a directory by identity and every
//! entry inside it), or be free for a restore with its directory present; otherwise the undo
//! is refused with the path and why. Where a later transaction put the same object back (an
//! undo and its redo, which change only its ctime), what that one left is what is expected
//! (`later`). Several transactions undone at once (`--to`) are checked against a
//! simulation of the steps before: a path an earlier step of this undo changes is compared with
//! what that step puts there (by inode: it comes from retained data), and a directory an earlier
//! step changed inside or set attributes of is compared by identity only.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use crate::meta::Kind;
use crate::retain::entry::{Entry, Forward, Inner};
use crate::retain::files::{AttrSet, DirAttrs};
use crate::session::Fingerprint;
use crate::undo::record::{Src, UndoOp};

/// At most this many conflicts are reported (and looked for) in one plan.
const MAX_CONFLICTS: usize = 100;

/// What the planner may look at: the workspace and the retained data, never following a
/// symlink.
pub trait View {
    /// The workspace object at `rel` (None: absent).
    fn stat(&mut self, rel: &Path) -> io::Result<Option<Fingerprint>>;
    /// The entries of the workspace directory `rel`, each with its fingerprint.
    fn list_stat(&mut self, rel: &Path) -> io::Result<Vec<(OsString, Fingerprint)>>;
    /// The attributes of the workspace directory `rel`.
    fn attrs(&mut self, rel: &Path) -> io::Result<DirAttrs>;
    /// The retained object `src` (None: absent).
    fn stat_kept(&mut self, src: &Src) -> io::Result<Option<Fingerprint>>;
    /// The attributes of the retained directory `src`.
    fn attrs_kept(&mut self, src: &Src) -> io::Result<DirAttrs>;
}

/// A path the undo would change that changed since the transaction (or cannot be undone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub path: PathBuf,
    pub what: String,
}

/// What the undo changes in the workspace, as `run` reports changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<PathBuf>,
    pub modified: Vec<PathBuf>,
    pub deleted: Vec<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub ops: Vec<UndoOp>,
    pub conflicts: Vec<Conflict>,
    pub changes: Changes,
}

/// A path's state as the steps planned so far leave it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sim {
    Absent,
    /// An object this undo puts there, now at `from` in the retained data.
    Present {
        ino: u64,
        kind: Kind,
        from: Src,
    },
}

/// Where the object at a path is, for the steps planned so far.
enum Loc {
    /// In the workspace, untouched by this undo.
    Ws,
    /// Put or freed by this undo.
    Sim(Sim),
    /// Inside an object this undo puts back: still in the retained data, here.
    Kept(Src),
    /// Inside an object this undo removes.
    Gone,
}

struct Planner<'v> {
    view: &'v mut dyn View,
    /// Path → the object the newest later transaction placed there, as it left it.
    later: &'v BTreeMap<PathBuf, Fingerprint>,
    sim: BTreeMap<PathBuf, Sim>,
    /// Directories a step planned so far changed the entries or attributes of.
    touched: BTreeSet<PathBuf>,
    /// Attributes as the steps planned so far leave them.
    attrs: BTreeMap<PathBuf, DirAttrs>,
    /// Whether each path the undo renames held an object before it.
    initially: BTreeMap<PathBuf, bool>,
    /// Workspace directories known to exist untouched (a restore checks its directory: many
    /// restores into one directory look once).
    dirs_seen: BTreeSet<PathBuf>,
    out: Plan,
    slot: u64,
}

/// Plan the undo of `entries` (newest first, each with its steps). `later`: for each path, the
/// object the newest transaction after them (retained, undone or not) placed there, as it left
/// it (see [`later_placements`]).
pub fn plan(entries: &[&Entry], later: &BTreeMap<PathBuf, Fingerprint>, view: &mut dyn View) -> io::Result<Plan> {
    let mut p = Planner {
        view,
        later,
        sim: BTreeMap::new(),
        touched: BTreeSet::new(),
        attrs: BTreeMap::new(),
        initially: BTreeMap::new(),
        dirs_seen: BTreeSet::new(),
        out: Plan::default(),
        slot: 0,
    };
    for e in entries {
        for f in e.ops.iter().rev() {
            if p.out.conflicts.len() >= MAX_CONFLICTS {
                break;
            }
            p.rename(f)?;
        }
    }
    for e in entries {
        for f in &e.ops {
            if let Forward::Attrs { path, before, after } = f {
                p.set_attrs(path, before, after)?;
            }
        }
    }
    p.finish_changes();
    Ok(p.out)
}

impl Planner<'_> {
    fn conflict(&mut self, path: &Path, what: impl Into<String>) {
        if self.out.conflicts.len() < MAX_CONFLICTS {
            self.out.conflicts.push(Conflict { path: path.to_path_buf(), what: what.into() });
        }
    }

    fn locate(&self, path: &Path) -> Loc {
        if let Some(s) = self.sim.get(path) {
            return Loc::Sim(s.clone());
        }
        for anc in path.ancestors().skip(1) {
            match self.sim.get(anc) {
                None => continue,
                Some(Sim::Absent) => return Loc::Gone,
                Some(Sim::Present { from, .. }) => {
                    let rest = path.strip_prefix(anc).unwrap_or(path);
                    return Loc::Kept(Src { part: from.part.clone(), rel: from.rel.join(rest) });
                }
            }
        }
        Loc::Ws
    }

    /// Record that this undo changes `path`: its directories' entries change.
    fn touch(&mut self, path: &Path, present: bool) {
        self.initially.entry(path.to_path_buf()).or_insert(present);
        for anc in path.ancestors().skip(1) {
            self.touched.insert(anc.to_path_buf());
        }
        // What was simulated inside the old object is no longer there.
        let below: Vec<PathBuf> = self
            .sim
            .range(path.to_path_buf()..)
            .take_while(|(k, _)| k.starts_with(path))
            .map(|(k, _)| k.clone())
            .filter(|k| k != path)
            .collect();
        for k in below {
            self.sim.remove(&k);
        }
    }

    fn rename(&mut self, f: &Forward) -> io::Result<()> {
        match f {
            Forward::Removed { path, kind, ino, at } => {
                let present = self.expect_absent(path)?;
                self.expect_kept(path, at, *ino)?;
                self.touch(path, present);
                self.out.ops.push(UndoOp::Restore { path: path.clone(), kind: *kind, ino: *ino, src: at.clone() });
                self.sim.insert(path.clone(), Sim::Present { ino: *ino, kind: *kind, from: at.clone() });
            }
            Forward::Placed { path, post, inner } => {
                self.expect_object(path, post, inner)?;
                let Fingerprint::Present { kind, ino, .. } = *post else { return Ok(()) };
                self.touch(path, true);
                self.out.ops.push(UndoOp::Remove { path: path.clone(), kind, ino, slot: self.slot });
                self.slot += 1;
                self.sim.insert(path.clone(), Sim::Absent);
            }
            Forward::Exchanged { path, post, inner, src, src_kind, src_ino } => {
                self.expect_object(path, post, inner)?;
                self.expect_kept(path, src, *src_ino)?;
                let Fingerprint::Present { kind, ino, .. } = *post else { return Ok(()) };
                self.touch(path, true);
                self.out.ops.push(UndoOp::Exchange {
                    path: path.clone(),
                    kind,
                    ino,
                    src: src.clone(),
                    src_kind: *src_kind,
                    src_ino: *src_ino,
                });
                self.sim.insert(path.clone(), Sim::Present { ino: *src_ino, kind: *src_kind, from: src.clone() });
            }
            Forward::Attrs { .. } => {}
        }
        Ok(())
    }

    /// The retained object `src` that `path` gets back must be there.
    fn expect_kept(&mut self, path: &Path, src: &Src, ino: u64) -> io::Result<()> {
        match self.view.stat_kept(src)? {
            Some(Fingerprint::Present { ino: i, .. }) if i == ino => {}
            _ => self.conflict(path, "its retained copy is missing or damaged"),
        }
        Ok(())
    }

    /// `path` must be free and its directory present; returns whether it was (for changes).
    fn expect_absent(&mut self, path: &Path) -> io::Result<bool> {
        match self.locate(path) {
            Loc::Sim(Sim::Absent) => return Ok(true),
            Loc::Sim(Sim::Present { .. }) => {
                self.conflict(path, "an earlier step of this undo puts something there");
                return Ok(true);
            }
            Loc::Gone => {
                self.conflict(path, "its directory is removed by this undo");
                return Ok(false);
            }
            Loc::Kept(src) => {
                if self.view.stat_kept(&src)?.is_some() {
                    self.conflict(path, "created since");
                }
                return Ok(false);
            }
            Loc::Ws => {}
        }
        if let Some(fp) = self.view.stat(path)? {
            let what = match fp {
                Fingerprint::Present { kind, .. } => format!("created since (a {} is there now)", kind.as_str()),
                Fingerprint::Absent => "created since".to_string(),
            };
            self.conflict(path, what);
            return Ok(false);
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        let parent_is_dir = match self.locate(parent) {
            Loc::Sim(Sim::Present { kind, .. }) => kind == Kind::Dir,
            Loc::Sim(Sim::Absent) | Loc::Gone => false,
            Loc::Kept(src) => matches!(self.view.stat_kept(&src)?, Some(Fingerprint::Present { kind: Kind::Dir, .. })),
            Loc::Ws if self.dirs_seen.contains(parent) => true,
            Loc::Ws => {
                let dir = matches!(self.view.stat(parent)?, Some(Fingerprint::Present { kind: Kind::Dir, .. }));
                if dir {
                    self.dirs_seen.insert(parent.to_path_buf());
                }
                dir
            }
        };
        if !parent_is_dir {
            self.conflict(path, "its directory was removed or replaced since");
        }
        Ok(false)
    }

    /// `path` must hold what the transaction left there (`post`, and inside it `inner`).
    fn expect_object(&mut self, path: &Path, post: &Fingerprint, inner: &Inner) -> io::Result<()> {
        let Fingerprint::Present { kind, ino, .. } = *post else {
            self.conflict(path, "nothing was recorded for it");
            return Ok(());
        };
        let now = match self.locate(path) {
            Loc::Sim(Sim::Present { ino: i, .. }) => {
                if i != ino {
                    self.conflict(path, "an earlier step of this undo puts another object there");
                }
                return Ok(());
            }
            Loc::Sim(Sim::Absent) | Loc::Gone => {
                self.conflict(path, "an earlier step of this undo removes it");
                return Ok(());
            }
            Loc::Kept(src) => {
                if !matches!(self.view.stat_kept(&src)?, Some(Fingerprint::Present { ino: i, .. }) if i == ino) {
                    self.conflict(path, "not what the transaction left there");
                }
                return Ok(());
            }
            Loc::Ws => self.view.stat(path)?,
        };
        match now {
            None | Some(Fingerprint::Absent) => {
                self.conflict(path, "deleted since");
                return Ok(());
            }
            Some(Fingerprint::Present { kind: k, ino: i, .. }) if (k, i) != (kind, ino) => {
                self.conflict(path, format!("replaced since (a {} is there now)", k.as_str()));
                return Ok(());
            }
            Some(fp) => {
                if kind != Kind::Dir && !self.same_as_left(path, post, &fp) {
                    self.conflict(path, "changed since (content or attributes)");
                    return Ok(());
                }
            }
        }
        match inner {
            Inner::None => Ok(()),
            Inner::Exact(map) => self.check_exact(path, map),
            Inner::Since(threshold) => self.check_since(path, *threshold),
        }
    }

    /// Whether `now` is the object `left` as the transaction left it, or as the newest later
    /// transaction that put it back left it.
    fn same_as_left(&self, path: &Path, left: &Fingerprint, now: &Fingerprint) -> bool {
        if now == left {
            return true;
        }
        let same_object = |a: &Fingerprint, b: &Fingerprint| matches!((a, b), (Fingerprint::Present { kind: k1, ino: i1, .. }, Fingerprint::Present { kind: k2, ino: i2, .. }) if (k1, i1) == (k2, i2));
        self.later.get(path).is_some_and(|l| same_object(l, left) && l == now)
    }

    /// The entries of the workspace directory `dir` not simulated by an earlier step, with
    /// their fingerprints, visited depth first. `visit` returns whether to descend.
    fn walk(&mut self, dir: &Path, mut visit: impl FnMut(&mut Self, &Path, &Fingerprint) -> bool) -> io::Result<()> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            if self.out.conflicts.len() >= MAX_CONFLICTS {
                break;
            }
            for (name, fp) in self.view.list_stat(&d)? {
                let q = d.join(&name);
                if !matches!(self.locate(&q), Loc::Ws) {
                    continue;
                }
                let descend = visit(self, &q, &fp);
                if descend && matches!(fp, Fingerprint::Present { kind: Kind::Dir, .. }) {
                    stack.push(q);
                }
            }
        }
        Ok(())
    }

    fn check_exact(&mut self, dir: &Path, map: &BTreeMap<PathBuf, Fingerprint>) -> io::Result<()> {
        let mut seen = BTreeSet::new();
        self.walk(dir, |p, q, fp| {
            seen.insert(q.to_path_buf());
            match map.get(q) {
                None => {
                    p.conflict(q, "created since inside a directory the transaction created");
                    false
                }
                Some(want) => {
                    let same_object = matches!((want, fp),
                        (Fingerprint::Present { kind: a, ino: b, .. }, Fingerprint::Present { kind: c, ino: d, .. }) if (a, b) == (c, d));
                    let is_dir = matches!(fp, Fingerprint::Present { kind: Kind::Dir, .. });
                    if !same_object {
                        p.conflict(q, "replaced since");
                        false
                    } else if !is_dir && !p.same_as_left(q, want, fp) {
                        p.conflict(q, "changed since");
                        true
                    } else {
                        true
                    }
                }
            }
        })?;
        for q in map.keys() {
            if !seen.contains(q) && matches!(self.locate(q), Loc::Ws) && self.out.conflicts.len() < MAX_CONFLICTS {
                // Below a directory already reported as replaced nothing more is said.
                let under_reported = self.out.conflicts.iter().any(|c| q.starts_with(&c.path) && q != &c.path);
                if !under_reported {
                    self.conflict(q, "deleted since");
                }
            }
        }
        Ok(())
    }

    fn check_since(&mut self, dir: &Path, threshold: i128) -> io::Result<()> {
        // The directory itself: an entry removed from it shows only in its ctime.
        if let Some(Fingerprint::Present { ctime_ns, .. }) = self.view.stat(dir)? {
            if ctime_ns >= threshold && !self.touched.contains(dir) && !self.later.contains_key(dir) {
                self.conflict(dir, "its entries changed since");
            }
        }
        self.walk(dir, |p, q, fp| {
            if let Fingerprint::Present { ctime_ns, .. } = fp {
                let put_back_later = p.later.get(q).is_some_and(|l| l == fp);
                if *ctime_ns >= threshold && !p.touched.contains(q) && !put_back_later {
                    p.conflict(q, "changed since");
                }
            }
            true
        })
    }

    fn set_attrs(&mut self, path: &Path, before: &DirAttrs, after: &DirAttrs) -> io::Result<()> {
        let cur = match self.locate(path) {
            Loc::Gone | Loc::Sim(Sim::Absent) => return Ok(()),
            Loc::Sim(Sim::Present { ino, from, .. }) => {
                if ino != after.ino {
                    self.conflict(path, "replaced since");
                    return Ok(());
                }
                match self.attrs.get(path) {
                    Some(a) => a.clone(),
                    None => self.view.attrs_kept(&from)?,
                }
            }
            Loc::Kept(src) => match self.attrs.get(path) {
                Some(a) => a.clone(),
                None => self.view.attrs_kept(&src)?,
            },
            Loc::Ws => match self.attrs.get(path) {
                Some(a) => a.clone(),
                None => match self.view.stat(path)? {
                    Some(Fingerprint::Present { kind: Kind::Dir, .. }) => self.view.attrs(path)?,
                    _ => {
                        self.conflict(path, "no longer a directory");
                        return Ok(());
                    }
                },
            },
        };
        if cur.ino != after.ino {
            self.conflict(path, "replaced since");
            return Ok(());
        }
        let mut set = AttrSet::default();
        let mut visible = false;
        if before.mode != after.mode {
            if cur.mode != after.mode {
                self.conflict(path, format!("its mode changed since ({:o})", cur.mode));
            }
            set.mode = Some(before.mode);
            visible = true;
        }
        if (before.uid, before.gid) != (after.uid, after.gid) {
            if (cur.uid, cur.gid) != (after.uid, after.gid) {
                self.conflict(path, "its owner changed since");
            }
            set.owner = Some((before.uid, before.gid));
            visible = true;
        }
        if before.xattrs != after.xattrs {
            if cur.xattrs != after.xattrs {
                self.conflict(path, "its extended attributes changed since");
            }
            set.xattrs = Some(before.xattrs.clone());
            visible = true;
        }
        // Times only if nothing outside this undo changed the directory's entries since.
        if cur.mtime == after.mtime {
            set.times = Some((before.atime, before.mtime));
        }
        if set.is_empty() {
            return Ok(());
        }
        if visible && !path.as_os_str().is_empty() {
            self.out.changes.modified.push(path.to_path_buf());
        }
        let mut next = cur.clone();
        if let Some(m) = set.mode {
            next.mode = m;
        }
        if let Some((u, g)) = set.owner {
            (next.uid, next.gid) = (u, g);
        }
        if let Some(x) = &set.xattrs {
            next.xattrs = x.clone();
        }
        if let Some((a, m)) = set.times {
            (next.atime, next.mtime) = (a, m);
        }
        self.attrs.insert(path.to_path_buf(), next);
        self.touched.insert(path.to_path_buf());
        self.out.ops.push(UndoOp::Attrs { path: path.to_path_buf(), ino: after.ino, set, was: cur });
        Ok(())
    }

    fn finish_changes(&mut self) {
        let mut added = Vec::new();
        let mut modified = Vec::new();
        let mut deleted = Vec::new();
        for (path, before) in &self.initially {
            let after = matches!(self.sim.get(path), Some(Sim::Present { .. }));
            match (before, after) {
                (false, true) => added.push(path.clone()),
                (true, true) => modified.push(path.clone()),
                (true, false) => deleted.push(path.clone()),
                (false, false) => {}
            }
        }
        modified.append(&mut self.out.changes.modified);
        modified.sort();
        modified.dedup();
        self.out.changes = Changes { added, modified, deleted };
    }
}

/// For [`plan`]'s `later`: the newest placement at each path among `entries` (oldest first).
pub fn later_placements(entries: &[&Entry]) -> BTreeMap<PathBuf, Fingerprint> {
    let mut out = BTreeMap::new();
    for e in entries {
        for f in &e.ops {
            match f {
                Forward::Placed { path, post, .. } | Forward::Exchanged { path, post, .. } => {
                    out.insert(path.clone(), *post);
                }
                Forward::Removed { path, .. } => {
                    out.remove(path);
                }
                Forward::Attrs { .. } => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
