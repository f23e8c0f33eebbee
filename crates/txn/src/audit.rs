//! The audit log: one JSON object per line, each carrying the SHA-256 of the previous line, so
//! an edited, removed or reordered entry breaks the chain and `verify` names where.
//!
//! The log lives in the state directory, which the sandbox cannot see; appends are serialized
//! with an flock on the log itself.

use std::fs::OpenOptions;
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::state::hex;

pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
}

/// One audited event. `seq` and `prev` are filled in by [`append`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub tx: String,
    pub workspace: String,
    pub command: String,
    pub action: String,
    pub rule: Option<String>,
    pub reason: String,
    pub outcome: String,
    pub rollback_reason: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub changes: Counts,
    pub duration_ms: f64,
    /// What the command did with the network (txbox's `network` result object), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<serde_json::Value>,
    pub prev: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("audit log {path}, line {line}: {what}")]
    Broken { path: PathBuf, line: usize, what: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> AuditError + '_ {
    move |source| AuditError::Io { path: path.to_path_buf(), source }
}

fn line_hash(line: &str) -> String {
    hex(&Sha256::digest(line.as_bytes()))
}

/// The last complete line of the file (the log is append-only; reading the tail is enough).
fn last_line(f: &mut std::fs::File) -> io::Result<Option<String>> {
    let len = f.seek(SeekFrom::End(0))?;
    if len == 0 {
        return Ok(None);
    }
    let mut start = len.saturating_sub(64 * 1024);
    loop {
        f.seek(SeekFrom::Start(start))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        let trimmed = buf.strip_suffix(b"\n").unwrap_or(&buf);
        if let Some(pos) = trimmed.iter().rposition(|b| *b == b'\n') {
            return Ok(Some(String::from_utf8_lossy(&trimmed[pos + 1..]).into_owned()));
        }
        if start == 0 {
            return Ok(Some(String::from_utf8_lossy(trimmed).into_owned()));
        }
        start = start.saturating_sub(1024 * 1024);
    }
}

/// Append `entry` to the log at `path`, chaining it to the last entry. Returns the entry as
/// written. `durable` fsyncs the log (used for outcomes that changed the workspace).
pub fn append(path: &Path, mut entry: Entry, durable: bool) -> Result<Entry, AuditError> {
    let mut f = OpenOptions::new().create(true).read(true).append(true).open(path).map_err(io_err(path))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).map_err(|e| io_err(path)(e.into()))?;
    let (seq, prev) = match last_line(&mut f).map_err(io_err(path))? {
        None => (0, GENESIS.to_string()),
        Some(line) => {
            let seq = serde_json::from_str::<Entry>(&line).map(|e| e.seq + 1).unwrap_or(0);
            (seq, line_hash(&line))
        }
    };
    entry.seq = seq;
    entry.prev = prev;
    let mut line = serde_json::to_string(&entry).map_err(|e| io_err(path)(e.into()))?;
    line.push('\n');
    f.write_all(line.as_bytes()).map_err(io_err(path))?;
    if durable {
        f.sync_data().map_err(io_err(path))?;
    }
    Ok(entry)
}

/// Read every entry (for `txbox log`). A missing log is empty.
pub fn read_all(path: &Path) -> Result<Vec<Entry>, AuditError> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(path)(e)),
    };
    let mut out = Vec::new();
    for (i, line) in io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(io_err(path))?;
        let e = serde_json::from_str(&line).map_err(|e| AuditError::Broken {
            path: path.to_path_buf(),
            line: i + 1,
            what: e.to_string(),
        })?;
        out.push(e);
    }
    Ok(out)
}

/// Check the hash chain and the sequence numbers. Returns the number of entries.
pub fn verify(path: &Path) -> Result<usize, AuditError> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err(path)(e)),
    };
    let mut prev = GENESIS.to_string();
    let mut n = 0;
    for (i, line) in io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(io_err(path))?;
        let broken = |what: String| AuditError::Broken { path: path.to_path_buf(), line: i + 1, what };
        let e: Entry = serde_json::from_str(&line).map_err(|e| broken(format!("not an entry: {e}")))?;
        if e.prev != prev {
            return Err(broken("hash chain broken: the previous entry was changed, removed or reordered".into()));
        }
        if e.seq != i as u64 {
            return Err(broken(format!("sequence number {} where {} was expected", e.seq, i)));
        }
        prev = line_hash(&line);
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("txbox-audit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::create_dir_all(&d);
        d.join("audit.log")
    }

    fn entry(outcome: &str) -> Entry {
        Entry { tx: "t".into(), command: "echo".into(), outcome: outcome.into(), ..Entry::default() }
    }

    #[test]
    fn chain_verifies_and_detects_edits_and_removals() -> Result<(), AuditError> {
        let p = tmp("chain");
        for o in ["committed", "rolled_back", "denied"] {
            append(&p, entry(o), false)?;
        }
        assert_eq!(verify(&p)?, 3);
        assert_eq!(read_all(&p)?.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![0, 1, 2]);
        let text = std::fs::read_to_string(&p).map_err(io_err(&p))?;
        std::fs::write(&p, text.replacen("rolled_back", "committed__", 1)).map_err(io_err(&p))?;
        assert!(verify(&p).is_err(), "an edited entry went unnoticed");
        let lines: Vec<&str> = text.lines().collect();
        std::fs::write(&p, format!("{}\n{}\n", lines[0], lines[2])).map_err(io_err(&p))?;
        assert!(verify(&p).is_err(), "a removed entry went unnoticed");
        Ok(())
    }
}
