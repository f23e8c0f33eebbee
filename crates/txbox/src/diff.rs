//! `txbox diff`: a `git diff`-like view of a change set — unified diffs for text, a one-line
//! note for binary files, a `--stat` summary.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use similar::TextDiff;
use txbox_txn::beneath::Beneath;
use txbox_txn::changeset::{ChangeOp, ChangeSet};
use txbox_txn::meta::display_rel;

/// The largest file whose content is diffed; a larger one is shown by its size only, so a diff
/// asked for over the API cannot make the server hold gigabytes.
const MAX_DIFFED: u64 = 8 << 20;

/// What a path holds, for diffing.
enum Content {
    Bytes(Vec<u8>),
    /// A regular file over [`MAX_DIFFED`], by its size.
    Large(u64),
}

impl Content {
    fn len(&self) -> u64 {
        match self {
            Content::Bytes(b) => b.len() as u64,
            Content::Large(n) => *n,
        }
    }
}

/// Content of `rel` beneath `root` for diffing: None when absent, not a regular file or a
/// symlink, or reached through a symlink. Nothing on the way is followed (the workspace is
/// the agent's: a directory it swapped for a link to `/etc` must not show `/etc` in a diff
/// made by a process that sees more than the sandbox does), nor is the last component.
/// `root` is the directory the change set's paths are relative to (the workspace or the upper
/// layer), its handles on their directories kept for the siblings that follow.
fn content(root: Option<&mut Beneath>, rel: &Path) -> Option<Content> {
    let (dir, name) = root?.parent(rel).ok()?;
    let st = rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok()?;
    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::Symlink => {
            let target = rustix::fs::readlinkat(dir, name, Vec::new()).ok()?;
            Some(Content::Bytes(format!("-> {}\n", target.to_string_lossy()).into_bytes()))
        }
        rustix::fs::FileType::RegularFile => {
            let fd = rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()?;
            let mut f = std::fs::File::from(fd);
            let md = f.metadata().ok().filter(std::fs::Metadata::is_file)?;
            if md.len() > MAX_DIFFED {
                return Some(Content::Large(md.len()));
            }
            let mut bytes = Vec::new();
            f.by_ref().take(MAX_DIFFED + 1).read_to_end(&mut bytes).ok()?;
            if bytes.len() as u64 > MAX_DIFFED {
                return Some(Content::Large(bytes.len() as u64));
            }
            Some(Content::Bytes(bytes))
        }
        _ => None,
    }
}

fn is_binary(b: &[u8]) -> bool {
    b.iter().take(8192).any(|c| *c == 0) || std::str::from_utf8(b).is_err()
}

/// A file-level change: path, old content, new content.
type FileChange = (String, Option<Content>, Option<Content>);

/// Every file-level change; directories expand to the files they add or remove.
fn file_changes(cs: &ChangeSet, workspace: &Path, upper: &Path) -> Vec<FileChange> {
    let (mut ws, mut up) = (Beneath::open(workspace).ok(), Beneath::open(upper).ok());
    let mut out = Vec::new();
    for p in cs.added.iter().chain(&cs.modified) {
        let old = content(ws.as_mut(), p);
        let new = content(up.as_mut(), p);
        if old.is_some() || new.is_some() {
            out.push((display_rel(p), old, new));
        }
    }
    for c in &cs.changes {
        if let ChangeOp::Delete { .. } = c.op {
            let old = content(ws.as_mut(), &c.path);
            if old.is_some() {
                out.push((display_rel(&c.path), old, None));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Both sides as bytes, or None when either is too large to diff.
fn both(old: Option<Content>, new: Option<Content>) -> Result<(Vec<u8>, Vec<u8>), (u64, u64)> {
    let size = |c: &Option<Content>| c.as_ref().map_or(0, Content::len);
    let (a, b) = (size(&old), size(&new));
    match (old, new) {
        (Some(Content::Large(_)), _) | (_, Some(Content::Large(_))) => Err((a, b)),
        (old, new) => {
            let bytes = |c: Option<Content>| match c {
                Some(Content::Bytes(b)) => b,
                _ => Vec::new(),
            };
            Ok((bytes(old), bytes(new)))
        }
    }
}

pub fn unified(cs: &ChangeSet, workspace: &Path, upper: &Path) -> String {
    let mut s = String::new();
    for (path, old, new) in file_changes(cs, workspace, upper) {
        let (a, b) = match both(old, new) {
            Ok(ab) => ab,
            Err((a, b)) => {
                let _ = writeln!(s, "Large file {path} changed ({a} -> {b} bytes, not diffed)");
                continue;
            }
        };
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
        let (a, b) = match both(old, new) {
            Ok(ab) => ab,
            Err((a, b)) => {
                let _ = writeln!(s, " {path} | Large {a} -> {b} bytes");
                continue;
            }
        };
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
