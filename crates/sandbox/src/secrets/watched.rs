//! The hidden paths of a front end that lives long (`txbox serve`, `txbox mcp`), kept from one
//! run to the next while nothing they were made from can have changed: [`Watched`].
//!
//! [`super::hidden`] and [`Host::gather`] look at the host's filesystem (a hundred `lstat`s, a
//! listing of `/home`, a few `readlink`s and listings of the caller's hidden directories); every
//! answer they get depends only on the entries of the directories on the way to each path
//! looked at (past symlinks), on those directories' permissions, and on what is mounted where.
//! So the directories are watched (inotify: an entry made, removed, renamed or its attributes
//! changed, the directory itself removed or moved) and so is the mount table
//! (`/proc/self/mountinfo` polls `PRI` when it changes): while neither stirred, the same
//! inputs give the same list. Anything stirring drops every kept list, and the next run looks
//! again; what may have moved a watched directory (a directory made, removed or renamed where
//! one is watched or was missing, a watched one moved or removed itself, a mount, lost events)
//! drops the watches too, and they are made anew. A change is queued by the kernel before the
//! call that made it returns, so a link the last command committed into the workspace is seen
//! by the next run. The real paths of the operator's own secrets ([`Watched::real`]) are kept
//! the same way.
//!
//! Kept only where inotify sees every change: directories on a local filesystem (a network
//! filesystem's other clients change it unseen), each one watched (none failed for lack of
//! watches or permission). The first that cannot be turns keeping off: each run looks, as
//! without this.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::inotify;

use super::{hidden, resolve, Host, HostFs, Kind, Look};

/// What the kept list was made for, besides the filesystem: the caller's environment and
/// identity as `Host::gather` reads them, and the run's places.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    home: Option<OsString>,
    runtime_dir: Option<OsString>,
    root: bool,
    states: Vec<PathBuf>,
    workspace: PathBuf,
    writable: Vec<PathBuf>,
}

impl Key {
    fn now(states: &[PathBuf], workspace: &Path, writable: &[PathBuf]) -> Key {
        Key {
            home: std::env::var_os("HOME"),
            runtime_dir: std::env::var_os("XDG_RUNTIME_DIR"),
            root: rustix::process::geteuid().is_root(),
            states: states.to_vec(),
            workspace: workspace.to_path_buf(),
            writable: writable.to_vec(),
        }
    }
}

/// The hidden paths of earlier runs, and what tells when they may have changed.
pub struct Watched {
    inner: Mutex<Inner>,
}

struct Inner {
    /// One instance for the server's life (closing one waits for the kernel's grace period,
    /// milliseconds): its watches are removed instead.
    notify: OwnedFd,
    mounts: OwnedFd,
    /// The directories watched, as looked at (real paths, each with every directory above
    /// it), and those that did not exist (the watch on their parent sees them appear).
    watched: HashSet<PathBuf>,
    /// Each watch's directories, to tell which entry an event is about.
    wds: HashMap<i32, Vec<PathBuf>>,
    lists: HashMap<Kept, Vec<PathBuf>>,
    /// Lists made (for tests and measurements: how often the filesystem was looked at).
    fills: u64,
    /// A directory could not be watched (on a filesystem inotify may not see whole, or not
    /// readable): every run looks, as without this, for the rest of the server's life.
    off: bool,
}

/// What is kept: a run's hidden paths, or one path's real place.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Kept {
    Hidden(Key),
    Real(PathBuf),
}

/// What changed since the kept lists were made.
enum Stir {
    Calm,
    Entries,
    Reset,
}

/// The events that can change what a lookup in a directory finds.
fn watch_flags() -> inotify::WatchFlags {
    use inotify::WatchFlags as W;
    W::CREATE
        | W::DELETE
        | W::MOVED_FROM
        | W::MOVED_TO
        | W::DELETE_SELF
        | W::MOVE_SELF
        | W::ATTRIB
        | W::ONLYDIR
        | W::DONT_FOLLOW
}

fn new_notify() -> Option<OwnedFd> {
    inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).ok()
}

impl Watched {
    /// None without inotify or the mount table (then every run looks).
    pub fn new() -> Option<Watched> {
        let mounts = rustix::fs::open(
            "/proc/self/mountinfo",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()?;
        let inner = Inner {
            notify: new_notify()?,
            mounts,
            watched: HashSet::new(),
            wds: HashMap::new(),
            lists: HashMap::new(),
            fills: 0,
            off: false,
        };
        Some(Watched { inner: Mutex::new(inner) })
    }

    /// What [`super::hidden`] gives for the host as [`Host::gather`] finds it (with `states`),
    /// `workspace` and `writable`: the kept list while nothing it was made from stirred.
    pub fn hidden(&self, states: Vec<PathBuf>, workspace: &Path, writable: &[PathBuf]) -> Vec<PathBuf> {
        let key = Kept::Hidden(Key::now(&states, workspace, writable));
        self.kept(key, |seen| walk(states.clone(), workspace, writable, seen))
    }

    /// Where `p` really is (`std::fs::canonicalize`), kept as the lists are: the operator's
    /// own secrets (the server's token file) and the policy file, hidden where they are.
    pub fn real(&self, p: &Path) -> Option<PathBuf> {
        self.kept(Kept::Real(p.to_path_buf()), |seen| real_of(p, seen)).pop()
    }

    /// `look`'s answer (given where to note the directories it goes through, or nothing),
    /// kept under `key` while nothing it went through stirred.
    fn kept(&self, key: Kept, look: impl Fn(Option<&mut HashSet<PathBuf>>) -> Vec<PathBuf>) -> Vec<PathBuf> {
        let Ok(mut inner) = self.inner.lock() else {
            // A run that panicked while holding it: look, as without this.
            return look(None);
        };
        if inner.off {
            drop(inner);
            return look(None);
        }
        match inner.stirred() {
            Stir::Calm => {}
            Stir::Entries => inner.lists.clear(),
            Stir::Reset => {
                inner.lists.clear();
                if !inner.unwatch() {
                    return look(None);
                }
            }
        }
        if let Some(v) = inner.lists.get(&key) {
            return v.clone();
        }
        inner.fills += 1;
        let mut seen = HashSet::new();
        let v = look(Some(&mut seen));
        // Every directory it went through was watched all along: whatever changes from the
        // start of this look on stirs the watch.
        if seen.iter().all(|d| inner.watched.contains(d)) {
            inner.lists.insert(key, v.clone());
            return v;
        }
        // Watching what the first look went through, then looking again: whatever changed
        // before a watch was in place is seen by the second look, whatever changes after it
        // stirs the watch. Kept only if the second look went nowhere unwatched.
        if !inner.watch(&seen) {
            inner.off = true;
            inner.lists.clear();
            let _ = inner.unwatch();
            return v;
        }
        let mut again = HashSet::new();
        let v = look(Some(&mut again));
        if again.iter().all(|d| inner.watched.contains(d)) {
            inner.lists.insert(key, v.clone());
        }
        v
    }

    /// How many times the filesystem was looked at for a list.
    pub fn fills(&self) -> u64 {
        self.inner.lock().map_or(0, |i| i.fills)
    }
}

impl Inner {
    /// What changed since the last call: nothing, only entries that are not directories (a
    /// file or link made, removed, renamed; attributes), or what may have moved a watched
    /// directory or one that was missing (a directory made, removed or renamed, a watched one
    /// itself, the mounts, events lost): then every watch starts anew.
    fn stirred(&self) -> Stir {
        use rustix::event::{PollFd, PollFlags};
        use rustix::fs::inotify::{ReadFlags, Reader};
        let mut fds = [PollFd::new(&self.notify, PollFlags::IN), PollFd::new(&self.mounts, PollFlags::PRI)];
        // Polling the mount table takes its change as seen.
        match rustix::event::poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })) {
            Ok(0) => return Stir::Calm,
            Ok(_) if fds[1].revents().intersects(PollFlags::PRI | PollFlags::ERR) => return Stir::Reset,
            Ok(_) if fds[0].revents().is_empty() => return Stir::Calm,
            Ok(_) => {}
            Err(_) => return Stir::Reset,
        }
        let moved = ReadFlags::DELETE_SELF
            | ReadFlags::MOVE_SELF
            | ReadFlags::IGNORED
            | ReadFlags::QUEUE_OVERFLOW
            | ReadFlags::UNMOUNT;
        let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
        let mut reader = Reader::new(&self.notify, &mut buf);
        let mut stir = Stir::Entries;
        loop {
            match reader.next() {
                Ok(ev) => {
                    let e = ev.events();
                    // A directory made, removed or renamed where one is watched, or was missing.
                    let dir_moved = e.contains(ReadFlags::ISDIR)
                        && !(e - ReadFlags::ISDIR).eq(&ReadFlags::ATTRIB)
                        && ev.file_name().is_none_or(|n| self.watches_entry(ev.wd(), n.to_bytes()));
                    if e.intersects(moved) || dir_moved {
                        stir = Stir::Reset;
                    }
                }
                Err(rustix::io::Errno::AGAIN) => return stir,
                Err(_) => return Stir::Reset,
            }
        }
    }

    /// Whether the entry `name` of the directory watched as `wd` is (or is above) a watched
    /// directory.
    fn watches_entry(&self, wd: i32, name: &[u8]) -> bool {
        let name = std::ffi::OsStr::from_bytes(name);
        self.wds.get(&wd).is_none_or(|dirs| dirs.iter().any(|d| self.watched.contains(&d.join(name))))
    }

    /// Remove every watch, and the events they left (each removal queues one); false if the
    /// instance failed.
    fn unwatch(&mut self) -> bool {
        for wd in std::mem::take(&mut self.wds).into_keys() {
            // Gone already if the kernel removed it (its directory was deleted).
            let _ = inotify::remove_watch(&self.notify, wd);
        }
        self.watched.clear();
        let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
        let mut reader = inotify::Reader::new(&self.notify, &mut buf);
        loop {
            match reader.next() {
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN) => return true,
                Err(_) => return false,
            }
        }
    }

    /// Watch every directory of `dirs` not watched yet (parents first); false if one could not
    /// be, or is on a filesystem whose changes inotify may not see.
    fn watch(&mut self, dirs: &HashSet<PathBuf>) -> bool {
        // Parents first: a directory that did not exist is left to its parent's watch.
        let mut new: Vec<&PathBuf> = dirs.iter().filter(|d| !self.watched.contains(*d)).collect();
        new.sort_unstable_by_key(|d| d.components().count());
        for d in new {
            match inotify::add_watch(&self.notify, d, watch_flags()) {
                Ok(wd) if local(d) => self.wds.entry(wd).or_default().push(d.clone()),
                Ok(_) => return false,
                // Not there (or no longer a directory): its parent's watch sees it appear.
                Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {}
                Err(_) => return false,
            }
            self.watched.insert(d.clone());
        }
        true
    }
}

/// Whether `dir` is on a filesystem whose every change goes through this kernel (so inotify
/// sees it): local disks' and memory's, and an overlay (a container's root) over them.
fn local(dir: &Path) -> bool {
    const LOCAL: &[i64] = &[
        0xEF53,      // ext2/3/4
        0x5846_5342, // xfs
        0x9123_683E, // btrfs
        0x0102_1994, // tmpfs
        0x8584_58f6, // ramfs
        0xF2F5_2010, // f2fs
        0x794c_7630, // overlayfs
        0x2fc1_2fc1, // zfs
    ];
    // The field's type differs between architectures; the magic numbers fit in 32 bits.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(dir).is_ok_and(|st| LOCAL.contains(&(st.f_type as i64)))
}

/// The host as `Host::gather` finds it and the list `hidden` makes, the directories every
/// lookup went through noted in `seen`.
fn walk(
    states: Vec<PathBuf>,
    workspace: &Path,
    writable: &[PathBuf],
    seen: Option<&mut HashSet<PathBuf>>,
) -> Vec<PathBuf> {
    let Some(seen) = seen else {
        let host = Host::gather(states);
        return hidden(&host, workspace, writable, &HostFs);
    };
    let rec = Recorder(std::cell::RefCell::new(std::mem::take(seen)), Default::default(), Default::default());
    let host = Host::gather(states);
    // What `gather` looked at: `/home`'s entries and each one's real path, `$HOME`'s.
    rec.looking_in(Path::new("/home"));
    if let Ok(d) = std::fs::read_dir("/home") {
        for e in d.flatten() {
            rec.resolving(&e.path());
        }
    }
    if let Some(h) = std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute()) {
        rec.resolving(&h);
    }
    let v = hidden(&host, workspace, writable, &rec);
    *seen = rec.0.into_inner();
    v
}

/// `std::fs::canonicalize(p)`, the directories it goes through noted in `seen`.
fn real_of(p: &Path, seen: Option<&mut HashSet<PathBuf>>) -> Vec<PathBuf> {
    let real = std::fs::canonicalize(p).ok().into_iter().collect();
    if let Some(seen) = seen {
        let rec = Recorder(std::cell::RefCell::new(std::mem::take(seen)), Default::default(), Default::default());
        rec.resolving(p);
        *seen = rec.0.into_inner();
    }
    real
}

/// The host's filesystem, noting the real directories each lookup goes through.
struct Recorder(
    std::cell::RefCell<HashSet<PathBuf>>,
    std::cell::RefCell<HashMap<PathBuf, Option<Kind>>>,
    /// Each directory looked into, resolved (the names share a few dozen).
    std::cell::RefCell<HashMap<PathBuf, Option<PathBuf>>>,
);

impl Recorder {
    /// `lstat`, each path once in a look (as `Memo` does for the rule, and for those that do
    /// not exist too: resolving a hundred names goes through the same few directories).
    fn lstat(&self, p: &Path) -> Option<Kind> {
        if let Some(k) = self.1.borrow().get(p) {
            return *k;
        }
        let k = HostFs.kind(p);
        self.1.borrow_mut().insert(p.to_path_buf(), k);
        k
    }

    /// `dir` and every directory above it.
    fn note(&self, dir: &Path) {
        let mut seen = self.0.borrow_mut();
        for a in dir.ancestors() {
            if seen.contains(a) {
                break;
            }
            seen.insert(a.to_path_buf());
        }
    }

    /// What finding an entry of `dir` goes through: `dir` resolved (once per look), and
    /// where it really is.
    fn looking_in(&self, dir: &Path) {
        let known = self.2.borrow().get(dir).cloned();
        let real = match known {
            Some(real) => real,
            None => {
                let real = self.resolving(dir);
                self.2.borrow_mut().insert(dir.to_path_buf(), real.clone());
                real
            }
        };
        if let Some(real) = real {
            self.note(&real);
        }
    }

    /// The directories the kernel goes through to find `p` (and past it, if it is a link).
    fn resolving(&self, p: &Path) -> Option<PathBuf> {
        resolve(&Tap(self), p).map(|r| r.path)
    }
}

impl Look for Recorder {
    fn kind(&self, p: &Path) -> Option<Kind> {
        if let Some(dir) = p.parent() {
            self.looking_in(dir);
        }
        self.lstat(p)
    }

    fn link(&self, p: &Path) -> Option<PathBuf> {
        if let Some(dir) = p.parent() {
            self.looking_in(dir);
        }
        HostFs.link(p)
    }

    fn links_in(&self, dir: &Path) -> Vec<PathBuf> {
        self.looking_in(dir);
        HostFs.links_in(dir)
    }
}

/// `resolve`'s lookups, each in a real directory (`resolve` walks component by component):
/// noted with the directories above it.
struct Tap<'a>(&'a Recorder);

impl Look for Tap<'_> {
    fn kind(&self, p: &Path) -> Option<Kind> {
        if let Some(dir) = p.parent() {
            self.0.note(dir);
        }
        self.0.lstat(p)
    }

    fn link(&self, p: &Path) -> Option<PathBuf> {
        HostFs.link(p)
    }

    fn links_in(&self, dir: &Path) -> Vec<PathBuf> {
        HostFs.links_in(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procfs_is_not_local_and_a_disk_is() {
        assert!(!local(Path::new("/proc/self")));
        // (The root is a disk here; elsewhere it may be anything.)
        #[allow(clippy::unnecessary_cast)]
        let ext4 = rustix::fs::statfs("/").is_ok_and(|st| st.f_type as i64 == 0xEF53);
        assert!(!ext4 || local(Path::new("/")));
    }

    /// The point of it: a second run with the same inputs, nothing changed, looks at nothing.
    /// (Other tests of this process may mount in theirs meanwhile: one run in a row that did
    /// not look is enough.)
    #[test]
    fn the_same_inputs_again_look_at_nothing_and_give_the_same_list() {
        let Some(w) = Watched::new() else { panic!("no inotify or /proc/self/mountinfo here") };
        let ws = std::env::temp_dir().join(format!("txbox-watched-{}", std::process::id()));
        std::fs::create_dir_all(&ws).unwrap_or_else(|e| panic!("{e}"));
        let first = w.hidden(Vec::new(), &ws, &[]);
        assert_eq!(first, walk(Vec::new(), &ws, &[], None), "not what the rule gives");
        let kept = (0..20).any(|_| {
            let before = w.fills();
            let again = w.hidden(Vec::new(), &ws, &[]);
            assert_eq!(again, first);
            w.fills() == before
        });
        // Another workspace is another list.
        let other = w.hidden(Vec::new(), &ws.join("sub"), &[]);
        let _ = std::fs::remove_dir_all(&ws);
        assert!(kept || !local(&ws), "every run looked again");
        assert_eq!(other, walk(Vec::new(), &ws.join("sub"), &[], None));
    }
}
