//! Test support for integration tests of the real `txbox` binary: scratch workspaces, running
//! as root or as an unprivileged user, and exact tree digests to compare workspaces.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub const TEST_USER: &str = "txbox-test";

/// A scratch area under /var/tmp (a real disk filesystem, like a user's workspace) with a
/// workspace and a state directory side by side.
pub struct Scratch {
    pub root: PathBuf,
    pub ws: PathBuf,
    pub state: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let root = PathBuf::from(format!("/var/tmp/txbox-it-{}-{name}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("ws")).unwrap();
        std::fs::create_dir_all(root.join("state")).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch { ws: root.join("ws"), state: root.join("state"), root }
    }

    /// A scratch area for runs as `who`: handed to the user when it is not this process's.
    pub fn for_who(who: As, name: &str) -> Scratch {
        let s = Scratch::new(name);
        if let As::User(uid) = who {
            s.chown(uid);
        }
        s
    }

    /// Hand the whole scratch area to `uid` (for unprivileged runs).
    /// A collector of an earlier run may still be deleting retired directories in the state
    /// directory, so a file can vanish under `chown -R`: tried again, a few times.
    pub fn chown(&self, uid: u32) {
        let ok = (0..5).any(|_| {
            Command::new("chown").arg("-R").arg(format!("{uid}:{uid}")).arg(&self.root).status().unwrap().success()
        });
        assert!(ok, "chown -R {uid} {}", self.root.display());
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The binary under test, copied where an unprivileged user can execute it. One copy per
/// build (named by the binary's size and mtime), shared by every test process, and a hard link
/// where it can be: a copy per process left ~150 MB behind for each test binary run and filled
/// the disk.
pub fn binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_BIN_EXE_txbox"));
        let md = std::fs::metadata(&src).unwrap();
        let top = PathBuf::from("/var/tmp/txbox-it-bin");
        let dir = top.join(format!("{}-{}.{}", md.len(), md.mtime(), md.mtime_nsec()));
        let dst = dir.join("txbox");
        if !dst.exists() {
            for d in [&top, &dir] {
                std::fs::create_dir_all(d).unwrap();
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            // Link (or copy, across filesystems) aside, then rename: another test process may
            // be doing the same.
            let tmp = dir.join(format!(".txbox-{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            if std::fs::hard_link(&src, &tmp).is_err() {
                std::fs::copy(&src, &tmp).unwrap();
            }
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::rename(&tmp, &dst).unwrap();
            // Copies of builds older than a day are of no use to anyone.
            let old = |e: &std::fs::DirEntry| {
                e.metadata().is_ok_and(|m| m.modified().is_ok_and(|t| t.elapsed().is_ok_and(|a| a.as_secs() > 86400)))
            };
            for e in std::fs::read_dir(&top).unwrap().flatten() {
                if e.path() != dir && old(&e) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        dst
    })
    .clone()
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The uid of an unprivileged test user, created on first use (needs root).
pub fn test_user() -> Option<u32> {
    static UID: OnceLock<Option<u32>> = OnceLock::new();
    *UID.get_or_init(|| {
        if !is_root() {
            return None;
        }
        let id = |_: ()| Command::new("id").args(["-u", TEST_USER]).output().ok().filter(|o| o.status.success());
        let out = id(()).or_else(|| {
            let _ = Command::new("useradd").args(["--no-create-home", "--shell", "/bin/sh", TEST_USER]).status();
            id(())
        })?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    })
}

/// Who runs the binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum As {
    /// Whoever runs the tests (root in CI).
    Me,
    /// The unprivileged test user, through setpriv.
    User(u32),
}

/// The identities every behavioural test runs under: the current user, and an unprivileged
/// user when we are root. When not root, says clearly that the unprivileged variant is skipped.
pub fn identities() -> Vec<As> {
    let mut v = vec![As::Me];
    match test_user() {
        Some(uid) => v.push(As::User(uid)),
        None => eprintln!("SKIP unprivileged variant: tests are not running as root, cannot create a test user"),
    }
    v
}

pub fn txbox(who: As, s: &Scratch, args: &[&str]) -> Output {
    txbox_os(who, s, &args.iter().map(OsString::from).collect::<Vec<_>>())
}

/// A `Command` for the binary under test, run as `who` (through setpriv for the test user).
pub fn txbox_command(who: As) -> Command {
    match who {
        As::Me => Command::new(binary()),
        As::User(uid) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}")).arg("--clear-groups").arg("--").arg(binary());
            c
        }
    }
}

pub fn txbox_os(who: As, s: &Scratch, args: &[OsString]) -> Output {
    let mut cmd = txbox_command(who);
    if who != As::Me {
        cmd.env("HOME", &s.root);
    }
    cmd.arg("--state-dir").arg(&s.state).args(args).current_dir(&s.ws);
    cmd.output().unwrap()
}

/// `txbox --json run -C WS -c SCRIPT`, parsed.
pub fn run_json(who: As, s: &Scratch, script: &str) -> (Output, serde_json::Value) {
    let ws = s.ws.to_str().unwrap().to_string();
    let out = txbox(who, s, &["--json", "run", "-C", &ws, "-c", script]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {}", describe(&out)));
    (out, v)
}

pub fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Run a shell script natively (the reference behaviour) in `dir`, as `who`.
pub fn native(who: As, dir: &Path, script: &str) {
    let mut cmd = match who {
        As::Me => Command::new("bash"),
        As::User(uid) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}")).arg("--clear-groups").arg("--").arg("bash");
            c
        }
    };
    let out = cmd.arg("-c").arg(script).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "native script failed: {}", describe(&out));
}

/// Copy a tree exactly (cp -a keeps modes, owners, times, links, xattrs).
pub fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(st.success());
}

/// One entry of a tree digest: everything a commit must reproduce, except times.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// File content (or its length and a hash for big files), or symlink target.
    pub data: Vec<u8>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Index of the hard-link group (0 = not linked).
    pub link_group: usize,
}

/// A map from relative path bytes to entries, excluding the names in `skip` at the top level.
pub fn digest(root: &Path, skip: &[&str]) -> BTreeMap<Vec<u8>, Entry> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    walk(root, root, skip, &mut out, &mut inodes);
    // Number hard-link groups by their sorted member names, so numbering is stable.
    let mut groups: Vec<Vec<Vec<u8>>> = inodes.into_values().filter(|g| g.len() > 1).collect();
    for g in &mut groups {
        g.sort();
    }
    groups.sort();
    for (i, g) in groups.iter().enumerate() {
        for name in g {
            if let Some(e) = out.get_mut(name) {
                e.link_group = i + 1;
            }
        }
    }
    out
}

fn walk(
    root: &Path,
    dir: &Path,
    skip: &[&str],
    out: &mut BTreeMap<Vec<u8>, Entry>,
    inodes: &mut BTreeMap<u64, Vec<Vec<u8>>>,
) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        let rel = p.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec();
        if dir == root && skip.iter().any(|s| s.as_bytes() == rel.as_slice()) {
            continue;
        }
        let md = std::fs::symlink_metadata(&p).unwrap();
        let ft = md.file_type();
        let (kind, data) = if ft.is_dir() {
            ("dir", Vec::new())
        } else if ft.is_symlink() {
            ("symlink", std::fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec())
        } else if ft.is_file() {
            let bytes = std::fs::read(&p).unwrap();
            if md.nlink() > 1 {
                inodes.entry(md.ino()).or_default().push(rel.clone());
            }
            ("file", if bytes.len() > 4096 { summarize(&bytes) } else { bytes })
        } else if ft.is_char_device() {
            ("chardev", Vec::new())
        } else {
            ("other", Vec::new())
        };
        let mut xattrs = Vec::new();
        if kind != "symlink" {
            let mut buf = vec![0u8; 4096];
            if let Ok(n) = rustix::fs::llistxattr(&p, &mut buf) {
                for name in buf[..n].split(|b| *b == 0).filter(|s| !s.is_empty()) {
                    let mut v = vec![0u8; 4096];
                    let name_os = std::ffi::OsStr::from_bytes(name);
                    if let Ok(k) = rustix::fs::lgetxattr(&p, name_os, &mut v) {
                        xattrs.push((name.to_vec(), v[..k].to_vec()));
                    }
                }
            }
            xattrs.sort();
        }
        out.insert(
            rel,
            Entry { kind, mode: md.mode() & 0o7777, uid: md.uid(), gid: md.gid(), data, xattrs, link_group: 0 },
        );
        if ft.is_dir() {
            walk(root, &p, skip, out, inodes);
        }
    }
}

fn summarize(bytes: &[u8]) -> Vec<u8> {
    // FNV-1a is plenty to tell two test files apart.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("len={} fnv={h:016x}", bytes.len()).into_bytes()
}

/// Describe how two digests differ (first few differences), for assertion messages.
pub fn diff(a: &BTreeMap<Vec<u8>, Entry>, b: &BTreeMap<Vec<u8>, Entry>) -> String {
    let mut out = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            None => out.push(format!("only in left: {}", String::from_utf8_lossy(k))),
            Some(w) if w != v => out.push(format!("differs: {}: {v:?} vs {w:?}", String::from_utf8_lossy(k))),
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            out.push(format!("only in right: {}", String::from_utf8_lossy(k)));
        }
    }
    out.truncate(12);
    out.join("\n")
}
