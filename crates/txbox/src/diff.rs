//! `txbox diff`: a `git diff`-like view of a change set — unified diffs for text, a one-line
//! note for binary files, a `--stat` summary.

use std::fmt::Write as _;
use std::path::Path;

use similar::TextDiff;
use txbox_txn::changeset::{ChangeOp, ChangeSet};
use txbox_txn::meta::{display_rel, join};

/// Content of a path for diffing: None when absent or not a regular file.
fn content(p: &Path) -> Option<Vec<u8>> {
    let md = std::fs::symlink_metadata(p).ok()?;
    if md.is_file() {
        std::fs::read(p).ok()
    } else if md.file_type().is_symlink() {
        std::fs::read_link(p).ok().map(|t| format!("-> {}\n", t.display()).into_bytes())
    } else {
        None
    }
}

fn is_binary(b: &[u8]) -> bool {
    b.iter().take(8192).any(|c| *c == 0) || std::str::from_utf8(b).is_err()
}

/// A file-level change: path, old content, new content.
type FileChange = (String, Option<Vec<u8>>, Option<Vec<u8>>);

/// Every file-level change; directories expand to the files they add or remove.
fn file_changes(cs: &ChangeSet, workspace: &Path, upper: &Path) -> Vec<FileChange> {
    let mut out = Vec::new();
    for p in cs.added.iter().chain(&cs.modified) {
        let old = content(&join(workspace, p));
        let new = content(&join(upper, p));
        if old.is_some() || new.is_some() {
            out.push((display_rel(p), old, new));
        }
    }
    for c in &cs.changes {
        if let ChangeOp::Delete { .. } = c.op {
            let old = content(&join(workspace, &c.path));
            if old.is_some() {
                out.push((display_rel(&c.path), old, None));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

pub fn unified(cs: &ChangeSet, workspace: &Path, upper: &Path) -> String {
    let mut s = String::new();
    for (path, old, new) in file_changes(cs, workspace, upper) {
        let (a, b) = (old.unwrap_or_default(), new.unwrap_or_default());
        if is_binary(&a) || is_binary(&b) {
            let _ = writeln!(s, "Binary file {path} changed ({} -> {} bytes)", a.len(), b.len());
            continue;
        }
        let (a, b) = (String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
        let d = TextDiff::from_lines(a.as_ref(), b.as_ref());
        let _ = write!(s, "{}", d.unified_diff().context_radius(3).header(&format!("a/{path}"), &format!("b/{path}")));
    }
    for p in &cs.skipped {
        let _ = writeln!(s, "Skipped special file {} (devices, FIFOs and sockets are not committed)", display_rel(p));
    }
    s
}

pub fn stat(cs: &ChangeSet, workspace: &Path, upper: &Path) -> String {
    let mut s = String::new();
    let (mut files, mut ins, mut del) = (0, 0, 0);
    for (path, old, new) in file_changes(cs, workspace, upper) {
        files += 1;
        let (a, b) = (old.unwrap_or_default(), new.unwrap_or_default());
        if is_binary(&a) || is_binary(&b) {
            let _ = writeln!(s, " {path} | Bin {} -> {} bytes", a.len(), b.len());
            continue;
        }
        let (a, b) = (String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
        let d = TextDiff::from_lines(a.as_ref(), b.as_ref());
        let (mut plus, mut minus) = (0, 0);
        for c in d.iter_all_changes() {
            match c.tag() {
                similar::ChangeTag::Insert => plus += 1,
                similar::ChangeTag::Delete => minus += 1,
                similar::ChangeTag::Equal => {}
            }
        }
        ins += plus;
        del += minus;
        let _ = writeln!(s, " {path} | {} {}{}", plus + minus, "+".repeat(plus.min(40)), "-".repeat(minus.min(40)));
    }
    let _ = writeln!(s, " {files} files changed, {ins} insertions(+), {del} deletions(-)");
    s
}
