//! The planner against a fake workspace: the steps it plans and every conflict class.

use super::*;
use crate::retain::files::{Retained, RetainedKind};

const A: &str = "00000000000000aa";
const B: &str = "00000000000000bb";

#[derive(Default)]
struct Fake {
    ws: BTreeMap<PathBuf, Fingerprint>,
    attrs: BTreeMap<PathBuf, DirAttrs>,
    kept: BTreeMap<Src, Fingerprint>,
}

impl View for Fake {
    fn stat(&mut self, rel: &Path) -> io::Result<Option<Fingerprint>> {
        Ok(self.ws.get(rel).copied())
    }
    fn list_stat(&mut self, rel: &Path) -> io::Result<Vec<(OsString, Fingerprint)>> {
        Ok(self
            .ws
            .iter()
            .filter(|(p, _)| p.parent() == Some(rel) && !p.as_os_str().is_empty())
            .map(|(p, f)| (p.file_name().map(|n| n.to_os_string()).unwrap_or_default(), *f))
            .collect())
    }
    fn attrs(&mut self, rel: &Path) -> io::Result<DirAttrs> {
        self.attrs.get(rel).cloned().ok_or_else(|| io::ErrorKind::NotFound.into())
    }
    fn stat_kept(&mut self, src: &Src) -> io::Result<Option<Fingerprint>> {
        Ok(self.kept.get(src).copied())
    }
    fn attrs_kept(&mut self, _src: &Src) -> io::Result<DirAttrs> {
        Err(io::ErrorKind::NotFound.into())
    }
}

fn fp(kind: Kind, ino: u64, ctime: i128) -> Fingerprint {
    Fingerprint::Present { kind, ino, mtime_ns: 1, ctime_ns: ctime, size: 3 }
}

fn dir_attrs(ino: u64, mode: u32, mtime: i64) -> DirAttrs {
    DirAttrs { ino, mode, uid: 0, gid: 0, atime: (1, 0), mtime: (mtime, 0), xattrs: Vec::new() }
}

fn entry(id: &str, ops: Vec<Forward>) -> Entry {
    Entry {
        id: id.into(),
        retained: Retained {
            kind: RetainedKind::Commit,
            workspace: "/w".into(),
            generation: 1,
            time_ms: 0,
            threshold_ns: 100,
            kept_only: false,
            parts: vec![id.into()],
            undoes: Vec::new(),
            post: BTreeMap::new(),
            after: BTreeMap::new(),
            restat: BTreeMap::new(),
        },
        consumed_by: None,
        ops,
    }
}

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn base() -> Fake {
    let mut f = Fake::default();
    f.ws.insert(p(""), fp(Kind::Dir, 1, 0));
    f.attrs.insert(p(""), dir_attrs(1, 0o755, 50));
    f
}

fn run(entries: &[&Entry], view: &mut Fake) -> Plan {
    plan(entries, &BTreeMap::new(), view).unwrap_or_default()
}

fn whats(plan: &Plan) -> Vec<(String, String)> {
    plan.conflicts.iter().map(|c| (c.path.display().to_string(), c.what.clone())).collect()
}

#[test]
fn each_step_inverts_and_attributes_come_last() {
    let mut v = base();
    v.ws.insert(p("new.txt"), fp(Kind::File, 10, 5));
    v.ws.insert(p("mod.txt"), fp(Kind::File, 11, 5));
    v.kept.insert(Src::trash(A, 0), fp(Kind::File, 12, 1));
    v.kept.insert(Src::upper(A, Path::new("mod.txt")), fp(Kind::File, 13, 1));
    let e = entry(
        A,
        vec![
            Forward::Removed { path: p("gone.txt"), kind: Kind::File, ino: 12, at: Src::trash(A, 0) },
            Forward::Exchanged {
                path: p("mod.txt"),
                post: fp(Kind::File, 11, 5),
                inner: Inner::None,
                src: Src::upper(A, Path::new("mod.txt")),
                src_kind: Kind::File,
                src_ino: 13,
            },
            Forward::Placed { path: p("new.txt"), post: fp(Kind::File, 10, 5), inner: Inner::None },
            Forward::Attrs { path: p(""), before: dir_attrs(1, 0o700, 40), after: dir_attrs(1, 0o755, 50) },
        ],
    );
    let plan = run(&[&e], &mut v);
    assert!(plan.conflicts.is_empty(), "{:?}", whats(&plan));
    let kinds: Vec<&str> = plan
        .ops
        .iter()
        .map(|o| match o {
            UndoOp::Remove { .. } => "remove",
            UndoOp::Restore { .. } => "restore",
            UndoOp::Exchange { .. } => "exchange",
            UndoOp::Attrs { .. } => "attrs",
        })
        .collect();
    assert_eq!(kinds, ["remove", "exchange", "restore", "attrs"]);
    match &plan.ops[3] {
        UndoOp::Attrs { set, .. } => {
            assert_eq!(set.mode, Some(0o700));
            assert_eq!(set.times, Some(((1, 0), (40, 0))), "mtime unchanged since: restored");
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(plan.changes.added, vec![p("gone.txt")]);
    assert_eq!(plan.changes.deleted, vec![p("new.txt")]);
    assert_eq!(plan.changes.modified, vec![p("mod.txt")]);
}

#[test]
fn every_conflict_class_is_refused_with_its_path() {
    let mut v = base();
    // A file the transaction made, changed since (its ctime moved).
    v.ws.insert(p("edited"), fp(Kind::File, 10, 99));
    // A file it made, replaced by another object since.
    v.ws.insert(p("replaced"), fp(Kind::Symlink, 77, 5));
    // A path it removed, created again since.
    v.ws.insert(p("recreated"), fp(Kind::File, 78, 5));
    v.kept.insert(Src::trash(A, 0), fp(Kind::File, 12, 1));
    v.kept.insert(Src::trash(A, 1), fp(Kind::File, 13, 1));
    // A directory it made that gained an entry, and lost one.
    v.ws.insert(p("d"), fp(Kind::Dir, 20, 5));
    v.ws.insert(p("d/kept"), fp(Kind::File, 21, 5));
    v.ws.insert(p("d/intruder"), fp(Kind::File, 22, 5));
    let mut inner = BTreeMap::new();
    inner.insert(p("d/kept"), fp(Kind::File, 21, 5));
    inner.insert(p("d/lost"), fp(Kind::File, 23, 5));
    // A directory whose mode it set, changed again since.
    v.ws.insert(p("m"), fp(Kind::Dir, 30, 5));
    v.attrs.insert(p("m"), dir_attrs(30, 0o750, 9));
    let e = entry(
        A,
        vec![
            Forward::Removed { path: p("recreated"), kind: Kind::File, ino: 12, at: Src::trash(A, 0) },
            Forward::Removed { path: p("nodir/x"), kind: Kind::File, ino: 13, at: Src::trash(A, 1) },
            Forward::Placed { path: p("d"), post: fp(Kind::Dir, 20, 5), inner: Inner::Exact(inner) },
            Forward::Placed { path: p("deleted"), post: fp(Kind::File, 40, 5), inner: Inner::None },
            Forward::Placed { path: p("edited"), post: fp(Kind::File, 10, 5), inner: Inner::None },
            Forward::Placed { path: p("replaced"), post: fp(Kind::File, 11, 5), inner: Inner::None },
            Forward::Attrs { path: p("m"), before: dir_attrs(30, 0o755, 1), after: dir_attrs(30, 0o700, 9) },
        ],
    );
    let plan = run(&[&e], &mut v);
    let got = whats(&plan);
    let has = |path: &str, what: &str| got.iter().any(|(p, w)| p == path && w.contains(what));
    assert!(has("recreated", "created since"), "{got:?}");
    assert!(has("nodir/x", "directory was removed"), "{got:?}");
    assert!(has("d/intruder", "created since inside"), "{got:?}");
    assert!(has("d/lost", "deleted since"), "{got:?}");
    assert!(has("deleted", "deleted since"), "{got:?}");
    assert!(has("edited", "changed since"), "{got:?}");
    assert!(has("replaced", "replaced since"), "{got:?}");
    assert!(has("m", "mode changed since"), "{got:?}");
    assert!(!has("d/kept", ""), "an untouched entry is no conflict: {got:?}");
}

#[test]
fn a_directory_is_compared_by_identity_and_its_entries() {
    let mut v = base();
    // The directory's own times moved (an entry was changed back and forth), its entries did not.
    v.ws.insert(p("d"), fp(Kind::Dir, 20, 999));
    v.ws.insert(p("d/x"), fp(Kind::File, 21, 5));
    let mut inner = BTreeMap::new();
    inner.insert(p("d/x"), fp(Kind::File, 21, 5));
    let e = entry(A, vec![Forward::Placed { path: p("d"), post: fp(Kind::Dir, 20, 5), inner: Inner::Exact(inner) }]);
    assert!(run(&[&e], &mut v).conflicts.is_empty());
    // A tree put back by an undo: entries older than its threshold are unchanged.
    let mut v = base();
    v.ws.insert(p("t"), fp(Kind::Dir, 20, 50));
    v.ws.insert(p("t/old"), fp(Kind::File, 21, 50));
    v.ws.insert(p("t/new"), fp(Kind::File, 22, 100));
    let e = entry(A, vec![Forward::Placed { path: p("t"), post: fp(Kind::Dir, 20, 50), inner: Inner::Since(100) }]);
    let got = whats(&run(&[&e], &mut v));
    assert_eq!(got, vec![("t/new".to_string(), "changed since".to_string())]);
}

#[test]
fn an_object_a_later_undo_put_back_is_what_was_left() {
    // The transaction left f (inode 10, ctime 5); a later transaction replaced it and an undo
    // of that one put it back: same object, newer ctime.
    let mut v = base();
    v.ws.insert(p("f"), fp(Kind::File, 10, 70));
    let e = entry(A, vec![Forward::Placed { path: p("f"), post: fp(Kind::File, 10, 5), inner: Inner::None }]);
    assert_eq!(run(&[&e], &mut v).conflicts.len(), 1, "without the later placement it looks changed");
    let mut later = BTreeMap::new();
    later.insert(p("f"), fp(Kind::File, 10, 70));
    assert!(matches!(plan(&[&e], &later, &mut v), Ok(p) if p.conflicts.is_empty()));
    // But not if the later placement was another object.
    later.insert(p("f"), fp(Kind::File, 11, 70));
    assert!(matches!(plan(&[&e], &later, &mut v), Ok(p) if p.conflicts.len() == 1));
}

#[test]
fn several_transactions_compose_newest_first() {
    // A created d/ with d/x; B then created d/e and removed f, which A had created.
    let mut v = base();
    v.ws.insert(p("d"), fp(Kind::Dir, 20, 60));
    v.ws.insert(p("d/x"), fp(Kind::File, 21, 5));
    v.ws.insert(p("d/e"), fp(Kind::File, 22, 60));
    v.kept.insert(Src::trash(B, 0), fp(Kind::File, 30, 6));
    let mut inner = BTreeMap::new();
    inner.insert(p("d/x"), fp(Kind::File, 21, 5));
    let a = entry(
        A,
        vec![
            Forward::Placed { path: p("d"), post: fp(Kind::Dir, 20, 5), inner: Inner::Exact(inner) },
            Forward::Placed { path: p("f"), post: fp(Kind::File, 30, 6), inner: Inner::None },
        ],
    );
    let b = entry(
        B,
        vec![
            Forward::Removed { path: p("f"), kind: Kind::File, ino: 30, at: Src::trash(B, 0) },
            Forward::Placed { path: p("d/e"), post: fp(Kind::File, 22, 60), inner: Inner::None },
        ],
    );
    let plan = run(&[&b, &a], &mut v);
    assert!(plan.conflicts.is_empty(), "{:?}", whats(&plan));
    let steps: Vec<(String, &str)> = plan
        .ops
        .iter()
        .map(|o| {
            let k = match o {
                UndoOp::Remove { .. } => "remove",
                UndoOp::Restore { .. } => "restore",
                UndoOp::Exchange { .. } => "exchange",
                UndoOp::Attrs { .. } => "attrs",
            };
            (o.path().display().to_string(), k)
        })
        .collect();
    assert_eq!(
        steps,
        [("d/e".to_string(), "remove"), ("f".into(), "restore"), ("f".into(), "remove"), ("d".into(), "remove")]
    );
    // Slots are distinct; f was absent and is absent again: no change reported for it.
    assert!(matches!(plan.ops[2], UndoOp::Remove { slot: 1, .. }));
    assert!(!plan.changes.added.contains(&p("f")) && !plan.changes.deleted.contains(&p("f")));
    assert!(plan.changes.deleted.contains(&p("d")));
}
