//! The redo journal's commit record: the one durable write that is the commit point.
//!
//! A record names the workspace, the transaction's upper layer and trash, and every step with
//! the inode numbers that let a step tell whether it already happened. That makes applying a
//! record idempotent, so recovery after a crash is simply "apply it again".
//!
//! Format: text lines; paths are hex-encoded bytes (names may hold newlines or non-UTF-8); the
//! last line is a MAC (crate::seal) of everything before it, keyed by the user's key and bound
//! to the state directory and the transaction, so a damaged, forged, replayed-from-elsewhere or
//! renamed record is refused, never guessed. The paths in a record are also checked against
//! the ones derived from its transaction id before anything is applied (`StateDir::read_record`).
//!
//! Owns: the record's format. May not touch: anything but the record file it is given.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::hex::{path_from_hex, path_to_hex};
use crate::meta::Kind;
use crate::plan::Step;
use crate::seal::{Domain, Seal};

const MAGIC: &str = "txbox-commit v2";

/// A step with the inode numbers recorded when the commit was prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalStep {
    pub step: Step,
    /// The upper object's inode for Create/Replace; the workspace object's for Remove.
    pub ino: u64,
    /// For Replace: the inode of the workspace object being replaced.
    pub old_ino: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    pub tx: String,
    pub workspace: PathBuf,
    pub upper: PathBuf,
    pub trash: PathBuf,
    pub steps: Vec<JournalStep>,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal record {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "journal record {path} does not verify ({what}): damaged, forged, or not written by txbox for \
         this transaction of this state directory; refusing to guess: inspect it, and delete it if \
         you did not expect it"
    )]
    Damaged { path: PathBuf, what: String },
    #[error("journal record {path} is refused: {why}")]
    Refused { path: PathBuf, why: String },
    /// Written and in place, but syncing its directory failed: it may or may not be durable,
    /// and recovery will apply it if it is there.
    #[error("journal record {path} is in place but its directory could not be synced: {source}")]
    InPlace { path: PathBuf, source: std::io::Error },
}

fn hex_path(p: &Path) -> String {
    // An empty path (the workspace root) is written as "-".
    if p.as_os_str().is_empty() {
        "-".to_string()
    } else {
        path_to_hex(p)
    }
}

fn unhex_path(s: &str) -> Option<PathBuf> {
    if s == "-" {
        return Some(PathBuf::new());
    }
    path_from_hex(s)
}

impl CommitRecord {
    /// What the record changes, counted by step: creations, replacements, removals (for the
    /// audit entry recovery writes; directory attributes are not counted).
    pub fn counts(&self) -> crate::audit::Counts {
        let mut c = crate::audit::Counts::default();
        for js in &self.steps {
            match js.step {
                Step::Create { .. } => c.added += 1,
                Step::Replace { .. } => c.modified += 1,
                Step::Remove { .. } => c.deleted += 1,
                Step::DirMeta { .. } => {}
            }
        }
        c
    }

    /// The record's text, sealed with `seal` for its transaction.
    pub fn render(&self, seal: &Seal) -> String {
        let mut body = String::new();
        body.push_str(MAGIC);
        body.push('\n');
        body.push_str(&format!("tx {}\n", self.tx));
        body.push_str(&format!("workspace {}\n", hex_path(&self.workspace)));
        body.push_str(&format!("upper {}\n", hex_path(&self.upper)));
        body.push_str(&format!("trash {}\n", hex_path(&self.trash)));
        for js in &self.steps {
            let line = match &js.step {
                Step::Remove { path, kind, slot } => {
                    format!("remove {} {} {} {}", kind.as_str(), js.ino, slot, hex_path(path))
                }
                Step::Create { path, kind } => format!("create {} {} {}", kind.as_str(), js.ino, hex_path(path)),
                Step::Replace { path, new, old } => {
                    format!("replace {} {} {} {} {}", new.as_str(), old.as_str(), js.ino, js.old_ino, hex_path(path))
                }
                Step::DirMeta { path } => format!("dirmeta {}", hex_path(path)),
            };
            body.push_str(&line);
            body.push('\n');
        }
        seal.seal(Domain::Record, &self.tx, &body)
    }
}

/// Parse a record found as transaction `id`'s, refusing it unless its MAC verifies for that
/// transaction and it says it is that transaction's.
pub fn parse(text: &[u8], origin: &Path, seal: &Seal, id: &str) -> Result<CommitRecord, JournalError> {
    let damaged = |what: &str| JournalError::Damaged { path: origin.to_path_buf(), what: what.to_string() };
    let body = seal.open(Domain::Record, id, text).ok_or_else(|| damaged("MAC mismatch"))?;
    let mut lines = body.lines();
    if lines.next() != Some(MAGIC) {
        return Err(damaged("unknown format"));
    }
    let mut field = |name: &str| -> Result<String, JournalError> {
        let line = lines.next().ok_or_else(|| damaged("truncated header"))?;
        line.strip_prefix(name)
            .and_then(|r| r.strip_prefix(' '))
            .map(str::to_string)
            .ok_or_else(|| damaged(&format!("expected {name}")))
    };
    let tx = field("tx")?;
    if tx != id {
        return Err(damaged("names another transaction"));
    }
    let workspace = unhex_path(&field("workspace")?).ok_or_else(|| damaged("workspace path"))?;
    let upper = unhex_path(&field("upper")?).ok_or_else(|| damaged("upper path"))?;
    let trash = unhex_path(&field("trash")?).ok_or_else(|| damaged("trash path"))?;
    let mut steps = Vec::new();
    for line in lines {
        let w: Vec<&str> = line.split(' ').collect();
        let kind = |s: &str| Kind::parse(s).ok_or_else(|| damaged("unknown kind"));
        let num = |s: &str| s.parse::<u64>().map_err(|_| damaged("bad number"));
        // Step paths are relative to the workspace; `commit` resolves them beneath it.
        let path = |s: &str| {
            unhex_path(s)
                .filter(|p| p.components().all(|c| matches!(c, std::path::Component::Normal(_))))
                .ok_or_else(|| damaged("bad path"))
        };
        let js = match w.as_slice() {
            ["remove", k, ino, slot, p] => JournalStep {
                step: Step::Remove { path: path(p)?, kind: kind(k)?, slot: num(slot)? },
                ino: num(ino)?,
                old_ino: 0,
            },
            ["create", k, ino, p] => {
                JournalStep { step: Step::Create { path: path(p)?, kind: kind(k)? }, ino: num(ino)?, old_ino: 0 }
            }
            ["replace", n, o, ino, old_ino, p] => JournalStep {
                step: Step::Replace { path: path(p)?, new: kind(n)?, old: kind(o)? },
                ino: num(ino)?,
                old_ino: num(old_ino)?,
            },
            ["dirmeta", p] => JournalStep { step: Step::DirMeta { path: path(p)? }, ino: 0, old_ino: 0 },
            _ => return Err(damaged("unknown step")),
        };
        steps.push(js);
    }
    Ok(CommitRecord { tx, workspace, upper, trash, steps })
}

/// Write `record` durably at `path`: temporary file, fsync, rename, fsync of the directory.
/// When this returns Ok the transaction is committed, whatever happens next.
pub fn write_durably(path: &Path, record: &CommitRecord, seal: &Seal) -> Result<(), JournalError> {
    write_text_durably(path, &record.render(seal))
}

/// [`write_durably`] for a record already rendered ([`CommitRecord::render`]).
pub fn write_text_durably(path: &Path, text: &str) -> Result<(), JournalError> {
    let tmp = write_pending(path, text)?;
    if let Err(e) = std::fs::File::open(&tmp).and_then(|f| f.sync_all()) {
        discard_pending(&tmp);
        return Err(JournalError::Io { path: path.to_path_buf(), source: e });
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    publish(&tmp, path, || std::fs::File::open(dir).and_then(|d| d.sync_all()))
}

/// The temporary name the record for `path` is written under until it is whole and durable.
pub fn pending_path(path: &Path) -> PathBuf {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(crate::layout::TMP_SUFFIX);
    PathBuf::from(tmp_name)
}

/// The first half of a durable write: `text` under the temporary name ([`pending_path`]), not
/// synced yet (a commit flushes it together with the content it points at). Returns that name.
pub fn write_pending(path: &Path, text: &str) -> Result<PathBuf, JournalError> {
    let tmp = pending_path(path);
    let written = std::fs::File::create(&tmp).and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        // Not committed: leave no half-written record behind (a full disk, say).
        discard_pending(&tmp);
        return Err(JournalError::Io { path: path.to_path_buf(), source: e });
    }
    Ok(tmp)
}

/// Remove a pending record that will not be published (the commit is refused).
pub fn discard_pending(tmp: &Path) {
    let _ = std::fs::remove_file(tmp);
}

/// The second half: the pending record `tmp`, durable by now, renamed to `path`, and
/// `sync_dir` (a flush of the journal directory) making the new name durable. When this
/// returns Ok the transaction is committed, whatever happens next.
pub fn publish(tmp: &Path, path: &Path, sync_dir: impl FnOnce() -> std::io::Result<()>) -> Result<(), JournalError> {
    let io = |source| JournalError::Io { path: path.to_path_buf(), source };
    if let Err(e) = std::fs::rename(tmp, path) {
        discard_pending(tmp);
        return Err(io(e));
    }
    if let Err(e) = sync_dir() {
        // In place but maybe not durable: take it back if we can, so that "not committed" stays
        // true; if not even that works, recovery will find it and apply it.
        return Err(match std::fs::remove_file(path) {
            Ok(()) => io(e),
            Err(_) => JournalError::InPlace { path: path.to_path_buf(), source: e },
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::Key;
    use std::os::unix::ffi::OsStringExt;

    fn seal() -> Seal {
        Seal::new(Key::from_bytes([3; 32]), b"a state directory")
    }

    fn sample() -> CommitRecord {
        CommitRecord {
            tx: "00000000000abc12".into(),
            workspace: PathBuf::from("/w s"),
            upper: PathBuf::from("/st/tx/00000000000abc12/upper"),
            trash: PathBuf::from("/st/tx/00000000000abc12/trash"),
            steps: vec![
                JournalStep {
                    step: Step::Remove { path: "old dir".into(), kind: Kind::Dir, slot: 0 },
                    ino: 7,
                    old_ino: 0,
                },
                JournalStep {
                    step: Step::Create {
                        path: PathBuf::from(std::ffi::OsString::from_vec(b"nl\nname\xff".to_vec())),
                        kind: Kind::File,
                    },
                    ino: 9,
                    old_ino: 0,
                },
                JournalStep {
                    step: Step::Replace { path: "empty".into(), new: Kind::File, old: Kind::Dir },
                    ino: 11,
                    old_ino: 12,
                },
                JournalStep { step: Step::DirMeta { path: "".into() }, ino: 0, old_ino: 0 },
            ],
        }
    }

    #[test]
    fn round_trips_odd_names() {
        let r = sample();
        assert_eq!(parse(r.render(&seal()).as_bytes(), Path::new("x"), &seal(), &r.tx).ok(), Some(r));
    }

    #[test]
    fn any_flipped_byte_is_detected() {
        let r = sample();
        let text = r.render(&seal());
        for i in 0..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[i] ^= 0x01;
            assert!(parse(&bytes, Path::new("x"), &seal(), &r.tx).is_err(), "flip at {i} went unnoticed");
        }
    }

    #[test]
    fn a_record_is_valid_only_for_its_transaction_state_and_key() {
        let r = sample();
        let text = r.render(&seal());
        assert!(parse(text.as_bytes(), Path::new("x"), &seal(), "00000000000abc13").is_err(), "renamed");
        let elsewhere = Seal::new(Key::from_bytes([3; 32]), b"another state directory");
        assert!(parse(text.as_bytes(), Path::new("x"), &elsewhere, &r.tx).is_err(), "another state dir");
        let other_key = Seal::new(Key::from_bytes([4; 32]), b"a state directory");
        assert!(parse(text.as_bytes(), Path::new("x"), &other_key, &r.tx).is_err(), "another key");
        // A version-1 record (checksummed, not keyed), as an earlier txbox or a forger wrote it.
        let v1 = "txbox-commit v1\ntx 00000000000abc12\nworkspace 2f\nupper 2f657463\ntrash 2f746d70\nend 00\n";
        assert!(parse(v1.as_bytes(), Path::new("x"), &seal(), &r.tx).is_err());
    }

    #[test]
    fn step_paths_must_stay_relative() {
        for bad in ["/etc/passwd", "../x", "a/../../b"] {
            let mut r = sample();
            r.steps = vec![JournalStep { step: Step::DirMeta { path: bad.into() }, ino: 0, old_ino: 0 }];
            let text = r.render(&seal());
            assert!(parse(text.as_bytes(), Path::new("x"), &seal(), &r.tx).is_err(), "{bad}");
        }
    }
}
