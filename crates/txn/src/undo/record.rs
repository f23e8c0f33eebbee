//! The undo record: an undo's commit point, as a commit record is a commit's.
//!
//! ```text
//! txbox-undo v1
//! tx ID
//! workspace HEXPATH
//! undoes ID,ID…                 the retained transactions it undoes (and consumes)
//! parts ID,ID…                  the retained directories its steps take objects from
//! remove KIND INO SLOT PATH     move the workspace object (inode INO) into this undo's trash
//! restore KIND INO PART REL PATH      move the retained object kept/PART/REL into the workspace
//! exchange KIND INO SKIND SINO PART REL PATH   exchange the two
//! attrs INO SET… WAS… PATH      set a directory's attributes (WAS: what they were, for redo)
//! mac HMAC
//! ```
//!
//! Paths hex, `-` the root; REL is `trash/N` or `upper/…` beneath a retained directory. Sealed
//! for the undo's own id (crate::seal, its own domain): a commit record cannot stand in for it.
//! Every path a step names is derived: the workspace's from the record (authenticated), the
//! retained ones from ids and checked to stay beneath `kept/` (`Src::check`).
//!
//! Owns: the format. May not touch: anything.

use std::path::{Component, Path, PathBuf};

use crate::hex::path_to_hex;
use crate::meta::Kind;
use crate::retain::files::{hex_path, unhex_rel, AttrSet, DirAttrs};
use crate::seal::{Domain, Seal};

const MAGIC: &str = "txbox-undo v1";

/// A retained object: `kept/<part>/<rel>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Src {
    pub part: String,
    /// `trash/<slot>` or `upper/<path>`.
    pub rel: PathBuf,
}

impl Src {
    /// Where a commit's removal left its object.
    pub fn trash(part: &str, slot: u64) -> Src {
        Src { part: part.to_string(), rel: Path::new(crate::layout::TRASH).join(slot.to_string()) }
    }

    /// Where a commit's replacement left the old object (swapped into its upper layer).
    pub fn upper(part: &str, path: &Path) -> Src {
        Src { part: part.to_string(), rel: Path::new(crate::layout::UPPER).join(path) }
    }

    /// A valid part id and a rel that is `trash/<number>` or `upper/<plain path>`.
    pub fn check(&self) -> bool {
        if !crate::layout::valid_id(&self.part) {
            return false;
        }
        let mut c = self.rel.components();
        match (c.next(), c.next()) {
            (Some(Component::Normal(t)), Some(Component::Normal(n))) if t == crate::layout::TRASH => {
                c.next().is_none() && n.to_str().is_some_and(|n| n.parse::<u64>().is_ok())
            }
            (Some(Component::Normal(u)), Some(_)) if u == crate::layout::UPPER => {
                self.rel.components().all(|c| matches!(c, Component::Normal(_)))
            }
            _ => false,
        }
    }

    /// The path beneath `kept/`.
    pub fn beneath_kept(&self) -> PathBuf {
        Path::new(&self.part).join(&self.rel)
    }
}

/// One step of an undo, applied in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UndoOp {
    /// Move the workspace object at `path` (inode `ino`) into this undo's trash, slot `slot`.
    Remove { path: PathBuf, kind: Kind, ino: u64, slot: u64 },
    /// Move the retained object `src` (inode `ino`) to the free workspace path `path`.
    Restore { path: PathBuf, kind: Kind, ino: u64, src: Src },
    /// Exchange the workspace object at `path` (`kind`, `ino`) with the retained `src`
    /// (`src_kind`, `src_ino`).
    Exchange { path: PathBuf, kind: Kind, ino: u64, src: Src, src_kind: Kind, src_ino: u64 },
    /// Set `set` on the workspace directory `path` (inode `ino`); `was` is what it had.
    Attrs { path: PathBuf, ino: u64, set: AttrSet, was: DirAttrs },
}

impl UndoOp {
    pub fn path(&self) -> &Path {
        match self {
            UndoOp::Remove { path, .. }
            | UndoOp::Restore { path, .. }
            | UndoOp::Exchange { path, .. }
            | UndoOp::Attrs { path, .. } => path,
        }
    }

    /// Whether the step moves an object (as opposed to setting attributes).
    pub fn is_rename(&self) -> bool {
        !matches!(self, UndoOp::Attrs { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoRecord {
    pub tx: String,
    pub workspace: PathBuf,
    pub undoes: Vec<String>,
    pub parts: Vec<String>,
    pub ops: Vec<UndoOp>,
}

fn ids(list: &[String]) -> String {
    if list.is_empty() {
        "-".into()
    } else {
        list.join(",")
    }
}

impl UndoRecord {
    /// What the undo changes in the workspace, counted by step (for the audit entry recovery
    /// writes; directory attributes are not counted).
    pub fn counts(&self) -> crate::audit::Counts {
        let mut c = crate::audit::Counts::default();
        for op in &self.ops {
            match op {
                UndoOp::Restore { .. } => c.added += 1,
                UndoOp::Exchange { .. } => c.modified += 1,
                UndoOp::Remove { .. } => c.deleted += 1,
                UndoOp::Attrs { .. } => {}
            }
        }
        c
    }

    /// The record's text, sealed for its transaction.
    pub fn render(&self, seal: &Seal) -> String {
        let mut b = format!("{MAGIC}\ntx {}\nworkspace {}\n", self.tx, path_to_hex(&self.workspace));
        b.push_str(&format!("undoes {}\nparts {}\n", ids(&self.undoes), ids(&self.parts)));
        for op in &self.ops {
            let line = match op {
                UndoOp::Remove { path, kind, ino, slot } => {
                    format!("remove {} {ino} {slot} {}", kind.as_str(), hex_path(path))
                }
                UndoOp::Restore { path, kind, ino, src } => {
                    format!("restore {} {ino} {} {} {}", kind.as_str(), src.part, hex_path(&src.rel), hex_path(path))
                }
                UndoOp::Exchange { path, kind, ino, src, src_kind, src_ino } => format!(
                    "exchange {} {ino} {} {src_ino} {} {} {}",
                    kind.as_str(),
                    src_kind.as_str(),
                    src.part,
                    hex_path(&src.rel),
                    hex_path(path)
                ),
                UndoOp::Attrs { path, ino, set, was } => {
                    format!("attrs {ino} {} {} {}", set.render(), was.render(), hex_path(path))
                }
            };
            b.push_str(&line);
            b.push('\n');
        }
        seal.seal(Domain::UndoRecord, &self.tx, &b)
    }

    /// Parse a record found as undo `id`'s, refusing it unless its MAC verifies for that
    /// transaction and every path in it is relative and every source one of its parts.
    pub fn parse(text: &[u8], seal: &Seal, id: &str) -> Result<UndoRecord, String> {
        let body = seal.open(Domain::UndoRecord, id, text).ok_or("MAC mismatch")?;
        let mut lines = body.lines();
        if lines.next() != Some(MAGIC) {
            return Err("unknown format".into());
        }
        let mut field = |name: &str| -> Result<String, String> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(name))
                .and_then(|r| r.strip_prefix(' '))
                .map(str::to_string)
                .ok_or_else(|| format!("expected {name}"))
        };
        let tx = field("tx")?;
        if tx != id {
            return Err("names another transaction".into());
        }
        let workspace = crate::hex::path_from_hex(&field("workspace")?)
            .filter(|p| crate::layout::is_normal_absolute(p))
            .ok_or("workspace path")?;
        let list = |s: String| -> Result<Vec<String>, String> {
            if s == "-" {
                return Ok(Vec::new());
            }
            s.split(',')
                .map(|i| crate::layout::valid_id(i).then(|| i.to_string()).ok_or_else(|| "bad id".to_string()))
                .collect()
        };
        let undoes = list(field("undoes")?)?;
        let parts = list(field("parts")?)?;
        let mut ops = Vec::new();
        for line in lines {
            let w: Vec<&str> = line.split(' ').collect();
            let bad = || "bad step".to_string();
            let kind = |s: &str| Kind::parse(s).ok_or_else(bad);
            let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
            let path = |s: &str| unhex_rel(s).ok_or_else(bad);
            let moved = |s: &str| unhex_rel(s).filter(|p| !p.as_os_str().is_empty()).ok_or_else(bad);
            let src = |part: &str, rel: &str| {
                let s = Src { part: part.to_string(), rel: unhex_rel(rel).ok_or_else(bad)? };
                (s.check() && parts.contains(&s.part)).then_some(s).ok_or_else(bad)
            };
            let op = match w.as_slice() {
                ["remove", k, ino, slot, p] => {
                    UndoOp::Remove { kind: kind(k)?, ino: num(ino)?, slot: num(slot)?, path: moved(p)? }
                }
                ["restore", k, ino, part, rel, p] => {
                    UndoOp::Restore { kind: kind(k)?, ino: num(ino)?, src: src(part, rel)?, path: moved(p)? }
                }
                ["exchange", k, ino, sk, sino, part, rel, p] => UndoOp::Exchange {
                    kind: kind(k)?,
                    ino: num(ino)?,
                    src_kind: kind(sk)?,
                    src_ino: num(sino)?,
                    src: src(part, rel)?,
                    path: moved(p)?,
                },
                ["attrs", ino, rest @ ..] if rest.len() == 4 + 7 + 1 => UndoOp::Attrs {
                    ino: num(ino)?,
                    set: AttrSet::parse(&rest[..4]).ok_or_else(bad)?,
                    was: DirAttrs::parse(&rest[4..11]).ok_or_else(bad)?,
                    path: path(rest[11])?,
                },
                _ => return Err(bad()),
            };
            ops.push(op);
        }
        Ok(UndoRecord { tx, workspace, undoes, parts, ops })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::Key;

    fn seal() -> Seal {
        Seal::new(Key::from_bytes([5; 32]), b"state")
    }

    fn sample() -> UndoRecord {
        let was = DirAttrs { ino: 3, mode: 0o755, uid: 0, gid: 0, atime: (1, 0), mtime: (2, 0), xattrs: Vec::new() };
        UndoRecord {
            tx: "00000000000000aa".into(),
            workspace: "/w".into(),
            undoes: vec!["00000000000000bb".into()],
            parts: vec!["00000000000000bb".into()],
            ops: vec![
                UndoOp::Remove { path: "new dir".into(), kind: Kind::Dir, ino: 9, slot: 0 },
                UndoOp::Restore {
                    path: "gone\nx".into(),
                    kind: Kind::File,
                    ino: 8,
                    src: Src::trash("00000000000000bb", 3),
                },
                UndoOp::Exchange {
                    path: "a/f".into(),
                    kind: Kind::File,
                    ino: 7,
                    src: Src::upper("00000000000000bb", Path::new("a/f")),
                    src_kind: Kind::Symlink,
                    src_ino: 6,
                },
                UndoOp::Attrs {
                    path: "".into(),
                    ino: 2,
                    set: AttrSet { mode: Some(0o700), ..AttrSet::default() },
                    was,
                },
            ],
        }
    }

    #[test]
    fn round_trips_and_any_flip_is_refused() {
        let r = sample();
        let text = r.render(&seal());
        assert_eq!(UndoRecord::parse(text.as_bytes(), &seal(), &r.tx), Ok(r.clone()));
        for i in (0..text.len()).step_by(7) {
            let mut b = text.clone().into_bytes();
            b[i] ^= 1;
            assert!(UndoRecord::parse(&b, &seal(), &r.tx).is_err(), "flip at {i}");
        }
        assert!(UndoRecord::parse(text.as_bytes(), &seal(), "00000000000000bb").is_err(), "renamed");
    }

    #[test]
    fn sources_stay_in_their_parts() {
        for (part, rel) in [
            ("00000000000000bb", "../x"),
            ("00000000000000bb", "upper/../../etc"),
            ("00000000000000bb", "trash/x"),
            ("00000000000000bb", "work/x"),
            ("00000000000000cc", "trash/1"),
            ("../../etc/00000", "trash/1"),
        ] {
            let mut r = sample();
            r.ops = vec![UndoOp::Restore {
                path: "p".into(),
                kind: Kind::File,
                ino: 1,
                src: Src { part: part.into(), rel: rel.into() },
            }];
            let text = r.render(&seal());
            assert!(UndoRecord::parse(text.as_bytes(), &seal(), &r.tx).is_err(), "{part} {rel}");
        }
    }
}
