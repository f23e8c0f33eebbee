//! The audit log: one JSON object per line, each carrying the SHA-256 of the previous line, so
//! an edited, removed or reordered entry breaks the chain and `verify` names where.
//!
//! The log lives in the state directory, which the sandbox cannot see; appends are serialized
//! with an flock on the log itself. What the chain alone cannot show, it is helped with
//! (#14.4):
//!
//! - **A torn line** (an append cut by a crash or a full disk) is terminated by the next
//!   append, which chains to it as to any line: the log stays readable, the chain goes on, and
//!   `verify` reports the torn line.
//! - **Removal of the newest entries, or of the whole log**: the *head record*
//!   (`audit.head`, sealed with the user's key like every state file) holds the number of
//!   lines, the length and the last line's hash, rewritten in place by every append. A log
//!   shorter than its head says is reported by `verify`, and an append that finds one records
//!   the loss in the log itself (an entry with action `audit`, outcome `damaged`) before it
//!   goes on.
//! - **Append-only**: where the process may (`CAP_LINUX_IMMUTABLE`) and `TXBOX_AUDIT_APPEND_ONLY=1`
//!   asks for it, the log is given the append-only attribute, which even its owner must remove
//!   before truncating or deleting it.
//!
//! What the same user can still do, outside the sandbox, is in docs/RELIABILITY.md: it can read
//! the key and rewrite the log and its head consistently.

use std::fs::File;
use std::io::{self, BufRead, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::seal::{Domain, Seal};
use crate::state::hex;

pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The action of the entries the log writes about itself.
pub const SELF: &str = "audit";
/// Their outcome when entries were lost (the log was cut short or removed).
pub const DAMAGED: &str = "damaged";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
}

/// One audited event. `seq` and `prev` are filled in by [`Log::append`].
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
    /// Kept directories (build output, `txbox_txn::keep`) this transaction changed in the
    /// workspace: committed even when the command failed (`outcome` then says `rolled_back`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    /// The transaction changed nothing in the workspace but kept directories: not what undo
    /// calls the last commit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept_only: bool,
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

fn line_hash(line: &[u8]) -> String {
    hex(&Sha256::digest(line))
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Where the log ended at the last append: lines, bytes, and the hash of the last line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    lines: u64,
    len: u64,
    hash: String,
}

const HEAD_MAGIC: &str = "txbox-audit-head v1";

impl Head {
    /// Always the same length, so that it is rewritten in place.
    fn render(&self, seal: &Seal) -> String {
        let body = format!("{HEAD_MAGIC}\nlines {:020}\nlen {:020}\nhash {}\n", self.lines, self.len, self.hash);
        seal.seal(Domain::AuditHead, "", &body)
    }

    fn parse(bytes: &[u8], seal: &Seal) -> Option<Head> {
        let body = seal.open(Domain::AuditHead, "", bytes)?;
        let mut l = body.lines();
        (l.next()? == HEAD_MAGIC).then_some(())?;
        let lines = l.next()?.strip_prefix("lines ")?.parse().ok()?;
        let len = l.next()?.strip_prefix("len ")?.parse().ok()?;
        let hash = l.next()?.strip_prefix("hash ")?.to_string();
        Some(Head { lines, len, hash })
    }
}

/// What the head file holds.
enum HeadState {
    /// None yet (a new log, or one written before head records).
    Absent,
    Valid(Head),
    /// Something that does not verify.
    Damaged,
}

fn read_head(f: &File, seal: &Seal) -> io::Result<HeadState> {
    let mut buf = vec![0u8; 1024];
    let mut n = 0;
    loop {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                if n == buf.len() {
                    return Ok(HeadState::Damaged);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(match n {
        0 => HeadState::Absent,
        _ => Head::parse(&buf[..n], seal).map_or(HeadState::Damaged, HeadState::Valid),
    })
}

/// The audit log of one state directory, opened for appending. Opening it is the check that
/// it can be written: a commit opens it before its commit point and refuses if it cannot.
#[derive(Debug)]
pub struct Log {
    path: PathBuf,
    head_path: PathBuf,
    file: File,
    head: File,
    seal: Seal,
}

impl Log {
    pub fn open(path: &Path, head_path: &Path, seal: &Seal) -> Result<Log, AuditError> {
        let open = |p: &Path, append: bool| {
            std::fs::OpenOptions::new()
                .create(true)
                .read(true)
                .append(append)
                .write(!append)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(p)
                .map_err(io_err(p))
        };
        let file = open(path, true)?;
        let head = open(head_path, false)?;
        if std::env::var_os("TXBOX_AUDIT_APPEND_ONLY").is_some_and(|v| v == "1") {
            append_only(&file);
        }
        Ok(Log { path: path.to_path_buf(), head_path: head_path.to_path_buf(), file, head, seal: seal.clone() })
    }

    /// Append `entry`, chaining it to the last line, and move the head record on. Returns the
    /// entry as written. `durable` fsyncs both (a commit does not ask: its flush after applying
    /// holds them, `durable::after_apply`).
    pub fn append(&mut self, mut entry: Entry, durable: bool) -> Result<Entry, AuditError> {
        let path = self.path.clone();
        let err = io_err(&path);
        rustix::fs::flock(&self.file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io_err(&path)(e.into()))?;
        let size = self.file.metadata().map_err(io_err(&path))?.len();
        let head = read_head(&self.head, &self.seal).map_err(io_err(&self.head_path))?;
        let mut notes = Vec::new();
        let (mut seq, mut prev, mut len) = match head {
            HeadState::Valid(h) if h.len == size => (h.lines, h.hash, size),
            head => {
                // The slow path: the head is behind (a crash between the two writes), ahead (the
                // log lost its end), missing or damaged; or the log ends in a torn line.
                let (seq, prev, len) = tail_state(&mut self.file).map_err(err)?;
                match head {
                    HeadState::Valid(h) if h.len > size => notes.push(format!(
                        "the audit log was cut short or removed: it holds {size} bytes, but its head record \
                         says {} lines and {} bytes were written; the entries after line {seq} are lost",
                        h.lines, h.len
                    )),
                    HeadState::Damaged => notes.push(
                        "the audit log's head record did not verify (damaged or forged); it was rebuilt from \
                         the log, whose end can therefore not be vouched for"
                            .to_string(),
                    ),
                    _ => {}
                }
                (seq, prev, len)
            }
        };
        for reason in notes {
            let note = Entry {
                time_ms: now_ms(),
                action: SELF.to_string(),
                outcome: DAMAGED.to_string(),
                reason,
                ..Entry::default()
            };
            let (line, hash) = render_line(note, seq, &prev).map_err(io_err(&self.path))?;
            self.file.write_all(line.as_bytes()).map_err(io_err(&self.path))?;
            (seq, prev, len) = (seq + 1, hash, len + line.len() as u64);
        }
        entry.seq = seq;
        entry.prev = prev;
        let (line, hash) = render_line(entry.clone(), seq, &entry.prev).map_err(io_err(&self.path))?;
        // One write: appends by others cannot interleave with it (and they hold the lock).
        self.file.write_all(line.as_bytes()).map_err(io_err(&self.path))?;
        let head = Head { lines: seq + 1, len: len + line.len() as u64, hash };
        let text = head.render(&self.seal);
        self.head.write_all_at(text.as_bytes(), 0).map_err(io_err(&self.head_path))?;
        if durable {
            self.file.sync_data().map_err(io_err(&self.path))?;
            self.head.sync_data().map_err(io_err(&self.head_path))?;
        }
        // A head longer than its record (damaged, or an earlier format) would not verify.
        if self.head.metadata().map_err(io_err(&self.head_path))?.len() != text.len() as u64 {
            self.head.set_len(text.len() as u64).map_err(io_err(&self.head_path))?;
        }
        Ok(entry)
    }
}

/// `entry` as the log line number `seq` chained to `prev`, and that line's hash.
fn render_line(mut entry: Entry, seq: u64, prev: &str) -> io::Result<(String, String)> {
    entry.seq = seq;
    entry.prev = prev.to_string();
    let mut line = serde_json::to_string(&entry)?;
    let hash = line_hash(line.as_bytes());
    line.push('\n');
    Ok((line, hash))
}

/// Give the log the append-only attribute, where this process may (`CAP_LINUX_IMMUTABLE`).
fn append_only(f: &File) {
    use rustix::fs::IFlags;
    if let Ok(flags) = rustix::fs::ioctl_getflags(f) {
        if !flags.contains(IFlags::APPEND) {
            let _ = rustix::fs::ioctl_setflags(f, flags | IFlags::APPEND);
        }
    }
}

/// Where the log stands, read from its end: the next sequence number, the last line's hash and
/// the length. A last line without its newline (a torn append) is terminated first, so the
/// next entry starts a line of its own and chains to the torn one.
fn tail_state(f: &mut File) -> io::Result<(u64, String, u64)> {
    let mut len = f.seek(SeekFrom::End(0))?;
    if len == 0 {
        return Ok((0, GENESIS.to_string(), 0));
    }
    let mut last = [0u8; 1];
    f.read_exact_at(&mut last, len - 1)?;
    if last[0] != b'\n' {
        f.write_all(b"\n")?;
        len += 1;
    }
    let mut window = 64 * 1024u64;
    loop {
        let start = len.saturating_sub(window);
        let mut buf = vec![0u8; (len - start) as usize];
        f.read_exact_at(&mut buf, start)?;
        let body = buf.strip_suffix(b"\n").unwrap_or(&buf);
        // Complete lines only: the first one of a window that does not start the file may be cut.
        let mut lines: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
        if start > 0 {
            lines.remove(0);
        }
        let Some(last_line) = lines.last() else {
            window = window.saturating_mul(4);
            continue;
        };
        let prev = line_hash(last_line);
        // The next number: one past the last entry that parses, plus the torn lines after it.
        for (k, line) in lines.iter().rev().enumerate() {
            if let Ok(e) = serde_json::from_slice::<Entry>(line) {
                return Ok((e.seq + 1 + k as u64, prev, len));
            }
        }
        if start == 0 {
            return Ok((lines.len() as u64, prev, len));
        }
        window = window.saturating_mul(4);
    }
}

/// Read every entry (for `txbox log`). A missing log is empty; torn lines (appends a crash cut
/// short) are skipped.
pub fn read_all(path: &Path) -> Result<Vec<Entry>, AuditError> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(path)(e)),
    };
    let mut out = Vec::new();
    for line in io::BufReader::new(f).split(b'\n') {
        let line = line.map_err(io_err(path))?;
        if let Ok(e) = serde_json::from_slice(&line) {
            out.push(e);
        }
    }
    Ok(out)
}

/// What `verify` found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Entries in the log.
    pub entries: usize,
    /// Line numbers (from 1) of torn lines: appends cut short by a crash, full disk or kill.
    pub torn: Vec<usize>,
    /// Losses the log recorded about itself (line number, what): entries removed or cut off.
    pub damage: Vec<(usize, String)>,
    /// Whether a head record vouched for the end of the log.
    pub head: bool,
    /// What does not verify: the log was edited, reordered, cut or removed.
    pub problems: Vec<String>,
}

impl Report {
    /// True when nothing was changed, removed or lost (torn lines alone are no loss of a
    /// completed entry).
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.damage.is_empty()
    }
}

/// Check the hash chain, the sequence numbers and the head record.
pub fn verify(path: &Path, head_path: &Path, seal: &Seal) -> Result<Report, AuditError> {
    let head = match File::open(head_path) {
        Ok(f) => read_head(&f, seal).map_err(io_err(head_path))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => HeadState::Absent,
        Err(e) => return Err(io_err(head_path)(e)),
    };
    let mut report = Report::default();
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(path)(e)),
    };
    let mut prev = GENESIS.to_string();
    let (mut index, mut offset) = (0u64, 0u64);
    let mut at_head = None;
    // The complete lines; what follows the last newline is a torn append not yet terminated.
    let whole = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let lines = if whole == 0 { None } else { Some(text[..whole - 1].split(|b| *b == b'\n')) };
    for line in lines.into_iter().flatten() {
        let n = index as usize + 1;
        match serde_json::from_slice::<Entry>(line) {
            Ok(e) => {
                if e.prev != prev {
                    report.problems.push(format!(
                        "line {n}: hash chain broken: the previous entry was changed, removed or reordered"
                    ));
                    return Ok(report);
                }
                if e.seq != index {
                    report.problems.push(format!("line {n}: sequence number {} where {index} was expected", e.seq));
                    return Ok(report);
                }
                if e.action == SELF && e.outcome == DAMAGED {
                    report.damage.push((n, e.reason.clone()));
                }
                report.entries += 1;
            }
            Err(_) => report.torn.push(n),
        }
        prev = line_hash(line);
        index += 1;
        offset += line.len() as u64 + 1;
        if let HeadState::Valid(h) = &head {
            if h.lines == index {
                at_head = Some((offset, prev.clone()));
            }
        }
    }
    if whole < text.len() {
        report.torn.push(index as usize + 1);
    }
    match head {
        HeadState::Absent => {}
        HeadState::Damaged => report.problems.push("its head record does not verify (damaged or forged)".into()),
        HeadState::Valid(h) => {
            report.head = true;
            match at_head {
                _ if h.lines == 0 => {}
                None => report.problems.push(format!(
                    "it holds {index} lines where its head record says {} were written: the newest entries \
                     were removed, or the log was cut short or deleted",
                    h.lines
                )),
                Some((end, hash)) if end != h.len || hash != h.hash => report.problems.push(format!(
                    "line {} is not the one its head record vouches for: the log was rewritten",
                    h.lines
                )),
                Some(_) => {}
            }
        }
    }
    Ok(report)
}

/// Whether the log holds a `committed` entry of transaction `tx` (not one of recovery's),
/// looking back from its end only as far as entries written at `not_before_ms` or later (minus
/// a minute for clocks that step): recovery asks this for transactions that died around their
/// commit, so it reads only what was appended since.
pub fn has_committed(path: &Path, tx: &str, not_before_ms: u64) -> Result<bool, AuditError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(path)(e)),
    };
    let horizon = not_before_ms.saturating_sub(60_000);
    let len = f.seek(SeekFrom::End(0)).map_err(io_err(path))?;
    let mut end = len;
    let mut carry: Vec<u8> = Vec::new();
    while end > 0 {
        let start = end.saturating_sub(64 * 1024);
        let mut buf = vec![0u8; (end - start) as usize];
        f.read_exact_at(&mut buf, start).map_err(io_err(path))?;
        buf.extend_from_slice(&carry);
        // The first piece may be cut (unless the file starts here): keep it for the next round.
        let cut = if start == 0 { 0 } else { buf.iter().position(|b| *b == b'\n').map_or(buf.len(), |i| i + 1) };
        carry = buf[..cut].to_vec();
        for line in buf[cut..].split(|b| *b == b'\n').rev().filter(|l| !l.is_empty()) {
            let Ok(e) = serde_json::from_slice::<Entry>(line) else { continue };
            // A failed command's kept directories were committed too (`kept`).
            if e.tx == tx && (e.outcome == "committed" || !e.kept.is_empty()) && e.action != "recover" {
                return Ok(true);
            }
            if e.time_ms < horizon {
                return Ok(false);
            }
        }
        end = start;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::Key;

    fn tmp(name: &str) -> (PathBuf, PathBuf) {
        let d = std::env::temp_dir().join(format!("txbox-audit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::create_dir_all(&d);
        (d.join("audit.log"), d.join("audit.head"))
    }

    fn seal() -> Seal {
        Seal::new(Key::from_bytes([5; 32]), b"state")
    }

    fn entry(outcome: &str) -> Entry {
        Entry { tx: "t".into(), command: "echo".into(), outcome: outcome.into(), time_ms: now_ms(), ..Entry::default() }
    }

    fn log(p: &(PathBuf, PathBuf)) -> Result<Log, AuditError> {
        Log::open(&p.0, &p.1, &seal())
    }

    fn write(p: &Path, bytes: &[u8]) -> Result<(), AuditError> {
        std::fs::write(p, bytes).map_err(io_err(p))
    }

    #[test]
    fn chain_verifies_and_detects_edits_and_removals() -> Result<(), AuditError> {
        let p = tmp("chain");
        for o in ["committed", "rolled_back", "denied"] {
            log(&p)?.append(entry(o), false)?;
        }
        let r = verify(&p.0, &p.1, &seal())?;
        assert!(r.ok() && r.head && r.entries == 3, "{r:?}");
        assert_eq!(read_all(&p.0)?.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![0, 1, 2]);
        let text = std::fs::read_to_string(&p.0).map_err(io_err(&p.0))?;
        write(&p.0, text.replacen("rolled_back", "committed__", 1).as_bytes())?;
        assert!(!verify(&p.0, &p.1, &seal())?.ok(), "an edited entry went unnoticed");
        let lines: Vec<&str> = text.lines().collect();
        write(&p.0, format!("{}\n{}\n", lines[0], lines[2]).as_bytes())?;
        assert!(!verify(&p.0, &p.1, &seal())?.ok(), "a removed entry went unnoticed");
        Ok(())
    }

    #[test]
    fn removing_the_newest_entries_or_the_log_is_noticed_and_recorded() -> Result<(), AuditError> {
        let p = tmp("cut");
        for o in ["committed", "rolled_back", "denied"] {
            log(&p)?.append(entry(o), false)?;
        }
        let text = std::fs::read_to_string(&p.0).map_err(io_err(&p.0))?;
        let first_two: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
        write(&p.0, first_two.as_bytes())?;
        let r = verify(&p.0, &p.1, &seal())?;
        assert!(!r.ok() && r.problems[0].contains("removed"), "{r:?}");
        // The next append records the loss in the log, and verify keeps reporting it.
        log(&p)?.append(entry("committed"), false)?;
        let r = verify(&p.0, &p.1, &seal())?;
        assert!(r.problems.is_empty() && r.damage.len() == 1 && !r.ok(), "{r:?}");
        // The whole log removed.
        std::fs::remove_file(&p.0).map_err(io_err(&p.0))?;
        assert!(!verify(&p.0, &p.1, &seal())?.ok());
        log(&p)?.append(entry("committed"), false)?;
        let r = verify(&p.0, &p.1, &seal())?;
        assert_eq!((r.entries, r.damage.len()), (2, 1), "{r:?}");
        // A forged or damaged head.
        write(&p.1, b"txbox-audit-head v1\nlines 00000000000000000001\n")?;
        assert!(!verify(&p.0, &p.1, &seal())?.ok());
        Ok(())
    }

    #[test]
    fn a_torn_tail_is_terminated_reported_and_the_chain_goes_on() -> Result<(), AuditError> {
        let p = tmp("torn");
        log(&p)?.append(entry("committed"), false)?;
        log(&p)?.append(entry("committed"), false)?;
        // A crash cut the next append short; then the same again with zeros (a power loss).
        for torn in [&b"{\"seq\":2,\"time_ms\":17"[..], &[0u8; 40][..]] {
            let mut f = std::fs::OpenOptions::new().append(true).open(&p.0).map_err(io_err(&p.0))?;
            f.write_all(torn).map_err(io_err(&p.0))?;
            let r = verify(&p.0, &p.1, &seal())?;
            assert!(r.ok() && r.torn.len() == 1 + usize::from(torn[0] == 0), "{r:?}");
            let e = log(&p)?.append(entry("rolled_back"), false)?;
            assert_eq!(read_all(&p.0)?.last().map(|l| l.seq), Some(e.seq));
        }
        let r = verify(&p.0, &p.1, &seal())?;
        assert!(r.ok() && r.problems.is_empty(), "{r:?}");
        assert_eq!((r.entries, r.torn.clone()), (4, vec![3, 5]), "{r:?}");
        // The seq of an entry is its line number: the torn lines keep theirs.
        assert_eq!(read_all(&p.0)?.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![0, 1, 3, 5]);
        Ok(())
    }

    #[test]
    fn a_log_without_head_record_is_adopted() -> Result<(), AuditError> {
        let p = tmp("legacy");
        log(&p)?.append(entry("committed"), false)?;
        std::fs::remove_file(&p.1).map_err(io_err(&p.1))?;
        let r = verify(&p.0, &p.1, &seal())?;
        assert!(r.ok() && !r.head, "{r:?}");
        log(&p)?.append(entry("committed"), false)?;
        let r = verify(&p.0, &p.1, &seal())?;
        assert!(r.ok() && r.head && r.entries == 2, "{r:?}");
        Ok(())
    }

    #[test]
    fn committed_entries_are_found_looking_back_from_the_end() -> Result<(), AuditError> {
        let p = tmp("find");
        let mut l = log(&p)?;
        let mut e = entry("committed");
        e.tx = "aaaa".into();
        l.append(e, false)?;
        for _ in 0..2000 {
            l.append(entry("rolled_back"), false)?;
        }
        assert!(has_committed(&p.0, "aaaa", 0)?);
        assert!(!has_committed(&p.0, "bbbb", 0)?);
        // Entries older than the horizon are not looked at.
        assert!(!has_committed(&p.0, "aaaa", now_ms() + 3_600_000)?);
        Ok(())
    }
}
