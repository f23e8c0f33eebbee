//! The redo journal's commit record: the one durable write that is the commit point.
//!
//! A record names the workspace, the transaction's upper layer and trash, and every step with
//! the inode numbers that let a step tell whether it already happened. That makes applying a
//! record idempotent, so recovery after a crash is simply "apply it again".
//!
//! Format: text lines; paths are hex-encoded bytes (names may hold newlines or non-UTF-8); the
//! last line is a SHA-256 of everything before it, so a damaged record is refused, never guessed.

use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::meta::Kind;
use crate::plan::Step;

const MAGIC: &str = "txbox-commit v1";

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
    #[error("journal record {path} is damaged ({what}); refusing to guess: inspect it by hand")]
    Damaged { path: PathBuf, what: String },
}

use crate::state::hex;

/// Bytes back from `hex`; None for anything that is not an even run of hex digits.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// A path stored as hex (names may hold any byte, newlines included).
pub(crate) fn path_from_hex(s: &str) -> Option<PathBuf> {
    unhex(s).map(|b| PathBuf::from(std::ffi::OsString::from_vec(b)))
}

fn hex_path(p: &Path) -> String {
    // An empty path (the workspace root) is written as "-".
    if p.as_os_str().is_empty() {
        "-".to_string()
    } else {
        hex(p.as_os_str().as_bytes())
    }
}

fn unhex_path(s: &str) -> Option<PathBuf> {
    if s == "-" {
        return Some(PathBuf::new());
    }
    path_from_hex(s)
}

impl CommitRecord {
    pub fn render(&self) -> String {
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
        let sum = hex(&Sha256::digest(body.as_bytes()));
        body.push_str(&format!("end {sum}\n"));
        body
    }

    pub fn parse(text: &str, origin: &Path) -> Result<CommitRecord, JournalError> {
        let damaged = |what: &str| JournalError::Damaged { path: origin.to_path_buf(), what: what.to_string() };
        let body_end = text.rfind("end ").ok_or_else(|| damaged("no end line"))?;
        let (body, end) = text.split_at(body_end);
        if end != format!("end {}\n", hex(&Sha256::digest(body.as_bytes()))) {
            return Err(damaged("checksum mismatch"));
        }
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
        let workspace = unhex_path(&field("workspace")?).ok_or_else(|| damaged("workspace path"))?;
        let upper = unhex_path(&field("upper")?).ok_or_else(|| damaged("upper path"))?;
        let trash = unhex_path(&field("trash")?).ok_or_else(|| damaged("trash path"))?;
        let mut steps = Vec::new();
        for line in lines {
            let w: Vec<&str> = line.split(' ').collect();
            let kind = |s: &str| Kind::parse(s).ok_or_else(|| damaged("unknown kind"));
            let num = |s: &str| s.parse::<u64>().map_err(|_| damaged("bad number"));
            let path = |s: &str| unhex_path(s).ok_or_else(|| damaged("bad path"));
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
}

/// Write `record` durably at `path`: temporary file, fsync, rename, fsync of the directory.
/// When this returns Ok the transaction is committed, whatever happens next.
pub fn write_durably(path: &Path, record: &CommitRecord) -> Result<(), JournalError> {
    let io = |source| JournalError::Io { path: path.to_path_buf(), source };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(record.render().as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    Ok(())
}

pub fn read(path: &Path) -> Result<CommitRecord, JournalError> {
    let text = std::fs::read_to_string(path).map_err(|source| JournalError::Io { path: path.to_path_buf(), source })?;
    CommitRecord::parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CommitRecord {
        CommitRecord {
            tx: "abc123".into(),
            workspace: PathBuf::from("/w s"),
            upper: PathBuf::from("/st/tx/abc123/upper"),
            trash: PathBuf::from("/st/tx/abc123/trash"),
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
        assert_eq!(CommitRecord::parse(&r.render(), Path::new("x")).ok(), Some(r));
    }

    #[test]
    fn any_flipped_byte_is_detected() {
        let text = sample().render();
        for i in 0..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[i] ^= 0x01;
            if let Ok(t) = String::from_utf8(bytes) {
                assert!(CommitRecord::parse(&t, Path::new("x")).is_err(), "flip at {i} went unnoticed");
            }
        }
    }
}
