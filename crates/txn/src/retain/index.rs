//! The retention index: which transactions are retained, oldest first, and how much they hold,
//! so that applying the budget costs what it evicts, not what is retained.
//!
//! ```text
//! kept/index    one id a line, in the order transactions were retained (append-only)
//! kept/head     the byte offset of the first line that may still name a live entry
//! kept/totals   COUNT BYTES [recount]: live entries and the bytes their data holds
//! kept/pending  ids whose data holds directories not measured yet (the collector's work)
//! ```
//!
//! An entry is live while `kept/<id>/retained` exists and `kept/<id>/consumed` does not; dead
//! lines (consumed, purged, evicted, or a line written twice by a recovery) are skipped and the
//! head moves past them. The index is compacted (its live tail copied) once its dead head is
//! large, so each line is read a bounded number of times. Totals are kept by every change; a
//! recovery, which may repeat a change, asks for a recount (`recount`), which the collector
//! does from the head (O(live)).
//!
//! Everything here happens under `locks/kept.lock` ([`Index::lock`]), which an undo also holds
//! from planning to consuming what it undid, so that no entry it uses is evicted meanwhile.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, BufRead, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};

use crate::fsx;
use crate::layout;
use crate::state::{Lock, StateDir, StateError};

/// Compact once this many bytes of the index lie before the head (and they are half of it).
const COMPACT_AFTER: u64 = 64 << 10;

/// Live entries and the bytes their retained data holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub count: u64,
    pub bytes: u64,
    /// A recovery may have counted a change twice (or not at all): recount before trusting.
    pub recount: bool,
}

/// The index, locked.
pub struct Index<'a> {
    state: &'a StateDir,
    kept: OwnedFd,
    _lock: Lock,
}

fn io_err<'s>(state: &'s StateDir, what: &'static str) -> impl FnOnce(io::Error) -> StateError + 's {
    move |e| fsx::PathError::new(&state.root.join(layout::KEPT), what, e).into()
}

impl<'a> Index<'a> {
    /// Take `locks/kept.lock` (blocking) and open `kept/`.
    pub fn lock(state: &'a StateDir) -> Result<Index<'a>, StateError> {
        let lock = state.lock_named(layout::KEPT_LOCK)?;
        let kept = state.dir(layout::KEPT)?;
        Ok(Index { state, kept, _lock: lock })
    }

    pub fn kept(&self) -> std::os::fd::BorrowedFd<'_> {
        self.kept.as_fd()
    }

    pub fn totals(&self) -> Totals {
        let Ok(b) = fsx::read_small(self.kept.as_fd(), Path::new(layout::KEPT_TOTALS), 256) else {
            return Totals::default();
        };
        let text = String::from_utf8_lossy(&b);
        let w: Vec<&str> = text.split_whitespace().collect();
        match w.as_slice() {
            [c, b, rest @ ..] => match (c.parse(), b.parse()) {
                (Ok(count), Ok(bytes)) => Totals { count, bytes, recount: rest.contains(&"recount") },
                _ => Totals { recount: true, ..Totals::default() },
            },
            _ => Totals { recount: true, ..Totals::default() },
        }
    }

    pub fn set_totals(&self, t: Totals) -> Result<(), StateError> {
        let text = format!("{} {}{}\n", t.count, t.bytes, if t.recount { " recount" } else { "" });
        fsx::overwrite(self.kept.as_fd(), layout::KEPT_TOTALS, text.as_bytes())
            .map_err(io_err(self.state, "write totals"))
    }

    /// Change the totals by a live entry more or less and `bytes` more or less.
    pub fn adjust(&self, count: i64, bytes: i64) -> Result<(), StateError> {
        let mut t = self.totals();
        t.count = t.count.saturating_add_signed(count);
        t.bytes = t.bytes.saturating_add_signed(bytes);
        self.set_totals(t)
    }

    pub fn flag_recount(&self) -> Result<(), StateError> {
        let mut t = self.totals();
        t.recount = true;
        self.set_totals(t)
    }

    fn append_line(&self, name: &str, line: &str) -> Result<(), StateError> {
        // Read-write: the last byte is read back (pread) before appending.
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.kept, name, flags, Mode::from_raw_mode(0o600))
            .map_err(|e| io_err(self.state, "open index")(e.into()))?;
        // A torn last line (a crash mid-append) is ended first, so the next id stands alone.
        let len = rustix::fs::fstat(&fd).map_err(|e| io_err(self.state, "stat index")(e.into()))?.st_size;
        let mut text = String::new();
        if len > 0 {
            let mut last = [0u8; 1];
            let got = rustix::io::pread(&fd, &mut last, (len - 1) as u64).unwrap_or(0);
            if got == 1 && last[0] != b'\n' {
                text.push('\n');
            }
        }
        text.push_str(line);
        text.push('\n');
        fsx::write_all(&fd, text.as_bytes()).map_err(io_err(self.state, "append index"))
    }

    /// Add a retained transaction at the young end.
    pub fn append(&self, id: &str) -> Result<(), StateError> {
        self.append_line(layout::KEPT_INDEX, id)
    }

    /// Note that `id` holds directories to measure.
    pub fn add_pending(&self, id: &str) -> Result<(), StateError> {
        self.append_line(layout::KEPT_PENDING, id)
    }

    /// The ids waiting to be measured, emptied.
    pub fn take_pending(&self) -> Result<Vec<String>, StateError> {
        let ids: Vec<String> = match fsx::read_small(self.kept.as_fd(), Path::new(layout::KEPT_PENDING), 16 << 20) {
            Ok(b) => String::from_utf8_lossy(&b).lines().filter(|l| layout::valid_id(l)).map(str::to_string).collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(self.state, "read pending")(e)),
        };
        match rustix::fs::unlinkat(&self.kept, layout::KEPT_PENDING, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(io_err(self.state, "clear pending")(e.into())),
        }
        let mut seen = HashSet::new();
        Ok(ids.into_iter().filter(|i: &String| seen.insert(i.clone())).collect())
    }

    /// Whether `id` is a live entry (retained and not consumed).
    pub fn live(&self, id: &str) -> bool {
        let at = |name: &str| {
            rustix::fs::statat(&self.kept, Path::new(id).join(name).as_path(), AtFlags::SYMLINK_NOFOLLOW).is_ok()
        };
        layout::valid_id(id) && at(layout::RETAINED) && !at(layout::CONSUMED)
    }

    fn head(&self) -> u64 {
        fsx::read_small(self.kept.as_fd(), Path::new(layout::KEPT_HEAD), 64)
            .ok()
            .and_then(|b| String::from_utf8_lossy(&b).trim().parse().ok())
            .unwrap_or(0)
    }

    fn set_head(&self, head: u64) -> Result<(), StateError> {
        fsx::overwrite(self.kept.as_fd(), layout::KEPT_HEAD, format!("{head}\n").as_bytes())
            .map_err(io_err(self.state, "write head"))
    }

    fn open_index(&self) -> Result<Option<std::fs::File>, StateError> {
        match fsx::open_beneath(self.kept.as_fd(), Path::new(layout::KEPT_INDEX), OFlags::RDONLY, Mode::empty()) {
            Ok(fd) => Ok(Some(std::fs::File::from(fd))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(self.state, "open index")(e)),
        }
    }

    /// Walk the live entries from the oldest: `decide(id)` says whether to drop it (it is then
    /// dropped by the caller and the walk goes on) or to stop there. Returns the ids dropped.
    /// Costs the lines it passes: dead ones and dropped ones move the head.
    pub fn drop_oldest(
        &self,
        mut decide: impl FnMut(&str) -> Result<bool, StateError>,
    ) -> Result<Vec<String>, StateError> {
        let Some(mut f) = self.open_index()? else { return Ok(Vec::new()) };
        let len = f.seek(SeekFrom::End(0)).map_err(io_err(self.state, "read index"))?;
        let mut head = self.head().min(len);
        f.seek(SeekFrom::Start(head)).map_err(io_err(self.state, "read index"))?;
        let mut reader = io::BufReader::new(f);
        let mut dropped = Vec::new();
        let mut seen = HashSet::new();
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line).map_err(io_err(self.state, "read index"))?;
            if n == 0 || !line.ends_with('\n') {
                break;
            }
            let id = line.trim_end();
            if !self.live(id) || !seen.insert(id.to_string()) {
                head += n as u64;
                continue;
            }
            if !decide(id)? {
                break;
            }
            dropped.push(id.to_string());
            head += n as u64;
        }
        self.set_head(head)?;
        if head >= COMPACT_AFTER && head * 2 >= len {
            self.compact(head)?;
        }
        Ok(dropped)
    }

    /// The live ids from the oldest (for a recount and for purging everything): O(live).
    pub fn live_ids(&self) -> Result<Vec<String>, StateError> {
        let Some(mut f) = self.open_index()? else { return Ok(Vec::new()) };
        f.seek(SeekFrom::Start(self.head())).map_err(io_err(self.state, "read index"))?;
        let mut text = String::new();
        f.read_to_string(&mut text).map_err(io_err(self.state, "read index"))?;
        let mut seen = HashSet::new();
        Ok(text.lines().filter(|id| self.live(id) && seen.insert(id.to_string())).map(str::to_string).collect())
    }

    /// Rewrite the index without its first `head` bytes.
    fn compact(&self, head: u64) -> Result<(), StateError> {
        let Some(mut f) = self.open_index()? else { return Ok(()) };
        f.seek(SeekFrom::Start(head)).map_err(io_err(self.state, "read index"))?;
        let mut rest = Vec::new();
        f.read_to_end(&mut rest).map_err(io_err(self.state, "read index"))?;
        fsx::replace(self.kept.as_fd(), layout::KEPT_INDEX, &rest, false)
            .map_err(io_err(self.state, "compact index"))?;
        self.set_head(0)
    }

    /// Rename the retained directory `id` to `gone/` (O(1); a collector deletes it).
    pub fn retire_part(&self, id: &str) -> Result<(), StateError> {
        let gone = self.state.dir(layout::RETIRED)?;
        match fsx::rename_noreplace(self.kept.as_fd(), OsStr::new(id), gone.as_fd(), OsStr::new(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            // A retired directory of that name waits already: delete ours now.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self.delete_part(id),
            Err(e) => Err(io_err(self.state, "retire retained data")(e)),
        }
    }

    /// Delete the retained directory `id` now (what it holds may be a deleted secret).
    pub fn delete_part(&self, id: &str) -> Result<(), StateError> {
        if !layout::valid_id(id) {
            return Ok(());
        }
        // Moved aside first, so a half-deleted directory never looks like retained data.
        let gone = self.state.dir(layout::RETIRED)?;
        let aside = format!("{id}.purge");
        let target: &OsStr =
            match fsx::rename_noreplace(self.kept.as_fd(), OsStr::new(id), gone.as_fd(), OsStr::new(&aside)) {
                Ok(()) => OsStr::new(&aside),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io_err(self.state, "purge retained data")(e)),
            };
        fsx::remove_tree_at(gone.as_fd(), target).map_err(io_err(self.state, "purge retained data"))
    }

    /// The bytes part `id`'s data holds as last counted, and whether that is an estimate.
    pub fn part_bytes(&self, id: &str) -> (u64, bool) {
        let Ok(b) = fsx::read_small(self.kept.as_fd(), &Path::new(id).join(layout::BYTES), 64) else {
            return (0, true);
        };
        let text = String::from_utf8_lossy(&b);
        let t = text.trim();
        match t.strip_prefix('~') {
            Some(n) => (n.parse().unwrap_or(0), true),
            None => (t.parse().unwrap_or(0), false),
        }
    }

    pub fn set_part_bytes(&self, id: &str, bytes: u64, estimate: bool) -> Result<(), StateError> {
        let dir =
            fsx::dir_beneath(self.kept.as_fd(), Path::new(id)).map_err(io_err(self.state, "open retained data"))?;
        let text = format!("{}{bytes}\n", if estimate { "~" } else { "" });
        fsx::overwrite(dir.as_fd(), layout::BYTES, text.as_bytes()).map_err(io_err(self.state, "write bytes"))
    }

    /// Record that part `id` holds `bytes` (measured by [`measure`]); returns the change from
    /// what was counted before. Nothing if the part is gone meanwhile.
    pub fn record_measured(&self, id: &str, bytes: u64) -> Result<i64, StateError> {
        if fsx::dir_beneath(self.kept.as_fd(), Path::new(id)).is_err() {
            return Ok(0);
        }
        let (before, _) = self.part_bytes(id);
        self.set_part_bytes(id, bytes, false)?;
        Ok(bytes as i64 - before as i64)
    }

    /// Count totals again from the live entries (O(live)).
    pub fn recount(&self) -> Result<Totals, StateError> {
        let mut t = Totals::default();
        for id in self.live_ids()? {
            t.count += 1;
            if let Ok((retained, _)) = crate::retain::entry::header(self.state, &id) {
                for part in &retained.parts {
                    t.bytes = t.bytes.saturating_add(self.part_bytes(part).0);
                }
            }
        }
        self.set_totals(t)?;
        Ok(t)
    }
}

/// Count the bytes retained part `id` holds (every inode once). Takes no lock: a walk of a
/// large tree must not hold up commits; a part evicted meanwhile measures as whatever was left.
pub fn measure(state: &StateDir, id: &str) -> Result<Option<u64>, StateError> {
    if !layout::valid_id(id) {
        return Ok(None);
    }
    let dir = match fsx::dir_beneath(state.fd(), &Path::new(layout::KEPT).join(id)) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(state, "open retained data")(e)),
    };
    Ok(Some(du(dir.as_fd()).map_err(io_err(state, "measure retained data"))?))
}

/// The bytes a tree holds (blocks of every inode, once), without following symlinks; two
/// descriptors at most, whatever the tree's width or depth.
fn du(dir: std::os::fd::BorrowedFd<'_>) -> io::Result<u64> {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack: Vec<std::path::PathBuf> = vec![std::path::PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let d = match fsx::open_beneath(dir, &rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()) {
            Ok(d) => d,
            // Gone meanwhile, or closed to us (a command's chmod 000): its own blocks were
            // counted, its content is not.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EACCES)) => continue,
            Err(e) => return Err(e),
        };
        for name in fsx::list(d.as_fd())? {
            let st = match rustix::fs::statat(&d, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            if seen.insert((st.st_dev, st.st_ino)) {
                total = total.saturating_add((st.st_blocks as u64).saturating_mul(512));
            }
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                stack.push(rel.join(&name));
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::Key;

    fn state(name: &str) -> Result<(StateDir, std::path::PathBuf), StateError> {
        let d = std::env::temp_dir().join(format!("txbox-index-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Ok((StateDir::open_with_key(&d, Key::from_bytes([1; 32]))?, d))
    }

    fn fake_entry(idx: &Index<'_>, id: &str) -> Result<(), StateError> {
        let dir = idx.state.root.join(layout::KEPT).join(id);
        std::fs::create_dir(&dir).map_err(fsx::at(&dir, "mkdir"))?;
        std::fs::write(dir.join(layout::RETAINED), "x").map_err(fsx::at(&dir, "write"))?;
        idx.append(id)
    }

    #[test]
    fn eviction_reads_from_the_head_and_the_index_stays_bounded() -> Result<(), StateError> {
        let (state, dir) = state("bounded")?;
        let idx = Index::lock(&state)?;
        let ids: Vec<String> = (0..5000u64).map(|i| format!("{i:016x}")).collect();
        for id in &ids {
            fake_entry(&idx, id)?;
        }
        // One in ten was consumed by an undo: dead, skipped, never evicted.
        for id in ids.iter().step_by(10) {
            std::fs::write(dir.join(layout::KEPT).join(id).join(layout::CONSUMED), "0123456789abcdef\n")
                .map_err(fsx::at(&dir, "write"))?;
        }
        let mut live = 4500u64;
        let dropped = idx.drop_oldest(|id| {
            if live <= 10 {
                return Ok(false);
            }
            idx.delete_part(id)?;
            live -= 1;
            Ok(true)
        })?;
        assert_eq!(dropped.len(), 4490);
        assert!(dropped.iter().all(|id| !ids.iter().step_by(10).any(|c| c == id)), "a dead entry was evicted");
        assert_eq!(dropped.first().map(String::as_str), Some("0000000000000001"), "oldest first");
        let alive: Vec<String> =
            ids.iter().enumerate().filter(|(i, _)| i % 10 != 0).map(|(_, id)| id.clone()).collect();
        assert_eq!(idx.live_ids()?, alive[alive.len() - 10..].to_vec());
        // Compacted: what is left of the index is about the live tail.
        let len =
            std::fs::metadata(dir.join(layout::KEPT).join(layout::KEPT_INDEX)).map_err(fsx::at(&dir, "stat"))?.len();
        assert!(len < 1024, "index not compacted: {len} bytes");
        // A second pass over a budget that holds looks at one line and stops.
        let mut asked = 0;
        idx.drop_oldest(|_| {
            asked += 1;
            Ok(false)
        })?;
        assert_eq!(asked, 1);
        drop(idx);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn a_torn_line_is_ended_and_totals_recount() -> Result<(), StateError> {
        let (state, dir) = state("torn")?;
        let idx = Index::lock(&state)?;
        fake_entry(&idx, "00000000000000a1")?;
        // A crash mid-append left half an id.
        let index = dir.join(layout::KEPT).join(layout::KEPT_INDEX);
        let mut text = std::fs::read_to_string(&index).map_err(fsx::at(&index, "read"))?;
        text.push_str("00000000");
        std::fs::write(&index, text).map_err(fsx::at(&index, "write"))?;
        fake_entry(&idx, "00000000000000a2")?;
        assert_eq!(idx.live_ids()?, vec!["00000000000000a1".to_string(), "00000000000000a2".to_string()]);
        idx.set_totals(Totals { count: 7, bytes: 9, recount: true })?;
        let t = idx.recount()?;
        assert_eq!((t.count, t.recount), (2, false));
        drop(idx);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
