//! What a commit carries of extended attributes (issue #13, finding 3): only an allowlist,
//! `user.*` but overlay's own and POSIX ACLs. File capabilities, `trusted.*`, other
//! `security.*` labels and the command's own `user.overlay.*` names are dropped and reported,
//! on new files, modified files, directories and whole new trees; as root and unprivileged,
//! warm and cold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::*;

/// `txbox --json run -C WS -- bash -c SCRIPT`, cold when asked.
fn run(who: As, s: &Scratch, script: &str, cold: bool) -> (std::process::Output, serde_json::Value) {
    let mut cmd = txbox_command(who);
    if who != As::Me {
        cmd.env("HOME", &s.root);
    }
    if cold {
        cmd.env("TXBOX_WARM", "0");
    }
    let out = cmd
        .arg("--state-dir")
        .arg(&s.state)
        .args(["--json", "run", "-C"])
        .arg(&s.ws)
        .args(["--", "bash", "-c", script])
        .current_dir(&s.ws)
        .output()
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    (out, v)
}

/// Every xattr name in the tree (not following symlinks).
fn all_names(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let mut buf = vec![0u8; 8192];
            let n = rustix::fs::llistxattr(&p, &mut buf).unwrap_or(0);
            for name in buf[..n].split(|b| *b == 0).filter(|x| !x.is_empty()) {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.push((rel, String::from_utf8_lossy(name).into_owned()));
            }
            if md.is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

fn dropped(j: &serde_json::Value) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = j["dropped_xattrs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| (x["path"].as_str().unwrap().to_string(), x["name"].as_str().unwrap().to_string()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Sets what it can and prints `set PATH NAME` for each success, so the test knows which
/// attributes the kernel let this identity set (an unprivileged user cannot set capabilities
/// or `trusted.*`; root in the sandbox cannot set `trusted.*`).
const SET_PRIVILEGED: &str = r#"
set -e
printf 'more' >> modified
cp /bin/true new
mkdir -p tree/sub && printf 'deep' > tree/sub/deep
python3 - <<'PY'
import os
# A file capability for cap_net_raw, effective (VFS_CAP_REVISION_2).
cap = bytes([1, 0, 0, 2, 0, 0x20, 0, 0] + [0] * 12)
names = [("security.capability", cap), ("trusted.x", b"t"), ("trusted.overlay.opaque", b"y"),
         ("security.selinux", b"system_u:object_r:shadow_t:s0"), ("security.SMACK64", b"_"),
         ("security.ima", b"\x03\x02"), ("security.evm", b"\x05")]
for f in ["new", "modified", "untouched", "dir", "tree", "tree/sub/deep"]:
    for n, v in names:
        try:
            os.setxattr(f, n, v)
            print("set", f, n)
        except OSError:
            pass
    os.setxattr(f, "user.kept", f.encode())
PY
"#;

#[test]
fn only_allowlisted_attributes_are_committed() {
    for who in identities() {
        for cold in [false, true] {
            let s = Scratch::new("xattr-allowlist");
            std::fs::write(s.ws.join("modified"), "m").unwrap();
            std::fs::write(s.ws.join("untouched"), "u").unwrap();
            std::fs::create_dir(s.ws.join("dir")).unwrap();
            if let As::User(uid) = who {
                s.chown(uid);
            }
            let (out, j) = run(who, &s, SET_PRIVILEGED, cold);
            assert_eq!(j["outcome"], "committed", "{who:?} cold={cold}: {}", describe(&out));
            let set: Vec<(String, String)> = j["stdout"]
                .as_str()
                .unwrap()
                .lines()
                .filter_map(|l| l.strip_prefix("set ")?.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
                .collect();
            if who == As::Me && is_root() {
                // The escape this pins: root inside can give a file capabilities.
                assert!(set.contains(&("new".into(), "security.capability".into())), "{set:?}");
                assert!(set.contains(&("modified".into(), "security.capability".into())), "{set:?}");
            }
            // Nothing off the allowlist is in the workspace, and every name set is reported.
            let names = all_names(&s.ws);
            assert!(
                names.iter().all(|(_, n)| n.starts_with("user.") && !n.starts_with("user.overlay.")),
                "{who:?} cold={cold}: {names:?}"
            );
            let got = dropped(&j);
            for x in &set {
                assert!(got.contains(x), "{who:?} cold={cold}: {x:?} not reported in {got:?}");
            }
            // The allowlisted one is committed exactly, on every kind of object.
            for f in ["new", "modified", "untouched", "dir", "tree", "tree/sub/deep"] {
                let mut v = vec![0u8; 64];
                let n = rustix::fs::lgetxattr(s.ws.join(f).as_path(), "user.kept", &mut v)
                    .unwrap_or_else(|e| panic!("{who:?} cold={cold}: {f}: {e}"));
                assert_eq!(&v[..n], f.as_bytes());
            }
        }
    }
}

/// overlayfs's own names (`user.overlay.redirect`, `.opaque`, `.origin`, `.metacopy`,
/// `.whiteout`) set by a command on files and directories would be interpreted by every later
/// overlay of the workspace: never committed, so a second transaction reads, modifies and
/// deletes those objects normally.
#[test]
fn overlay_names_set_inside_never_reach_a_later_overlay() {
    const SET: &str = r#"
set -e
printf 'old' > existing_seen_before 2>/dev/null || true
mkdir -p newdir && printf 'in' > newdir/inner
printf 'n' > newfile
python3 - <<'PY'
import os
for f in ["newfile", "newdir", "newdir/inner", "existing", "existing_dir"]:
    for n in ["redirect", "opaque", "origin", "metacopy", "whiteout", "impure", "nlink", "upper"]:
        v = b"y" if n != "redirect" else b"/etc"
        os.setxattr(f, "user.overlay." + n, v)
    os.setxattr(f, "user.plain", b"exact\x00value")
PY
"#;
    const USE: &str = r#"
set -e
cat newfile newdir/inner existing existing_dir/k > /dev/null
ls newdir existing_dir > /dev/null
printf 'changed' > newfile && printf 'changed' > existing && printf 'changed' > newdir/inner
mv existing_dir renamed_dir
rm -r newfile newdir existing renamed_dir existing_seen_before
"#;
    for who in identities() {
        for cold in [false, true] {
            let s = Scratch::new("xattr-overlay");
            std::fs::write(s.ws.join("existing"), "e").unwrap();
            std::fs::create_dir(s.ws.join("existing_dir")).unwrap();
            std::fs::write(s.ws.join("existing_dir/k"), "k").unwrap();
            if let As::User(uid) = who {
                s.chown(uid);
            }
            let (out, j) = run(who, &s, SET, cold);
            assert_eq!(j["outcome"], "committed", "{who:?} cold={cold}: {}", describe(&out));
            let got = dropped(&j);
            for f in ["newfile", "newdir", "newdir/inner", "existing", "existing_dir"] {
                assert!(got.contains(&(f.into(), "user.overlay.redirect".into())), "{f}: {got:?}");
            }
            let names = all_names(&s.ws);
            assert!(names.iter().all(|(_, n)| n == "user.plain"), "{who:?} cold={cold}: {names:?}");
            let mut v = vec![0u8; 64];
            let n = rustix::fs::lgetxattr(s.ws.join("newdir/inner").as_path(), "user.plain", &mut v).unwrap();
            assert_eq!(&v[..n], b"exact\0value");
            // A later transaction sees ordinary files and directories.
            let (out, j) = run(who, &s, USE, cold);
            assert_eq!(j["outcome"], "committed", "{who:?} cold={cold}: {}", describe(&out));
            let left: Vec<OsString> = std::fs::read_dir(&s.ws).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert!(
                left.is_empty(),
                "{who:?} cold={cold}: left {:?}",
                left.iter().map(|x| x.as_bytes()).collect::<Vec<_>>()
            );
        }
    }
}

/// A workspace root's own extended attributes (a `user.*` name, a default POSIX ACL, as shared
/// project directories carry) stay through runs that do not touch them. Before, `begin` gave
/// the run's upper root none of them, so the root looked changed: the first run, `true`
/// included, committed the root's attributes and removed them from the workspace.
#[test]
fn a_workspace_roots_own_attributes_survive_runs_that_leave_them() {
    // A default ACL: user::rwx, group::r-x, other::r-x.
    let acl: &[u8] = &[
        2, 0, 0, 0, 1, 0, 7, 0, 255, 255, 255, 255, 4, 0, 5, 0, 255, 255, 255, 255, 0x20, 0, 5, 0, 255, 255, 255, 255,
    ];
    for who in identities() {
        for cold in [false, true] {
            let what = format!("{who:?} cold={cold}");
            let s = Scratch::new("xattr-root");
            std::fs::write(s.ws.join("a"), "a").unwrap();
            if let As::User(uid) = who {
                s.chown(uid);
            }
            let flags = rustix::fs::XattrFlags::empty();
            rustix::fs::lsetxattr(s.ws.as_path(), "user.project", b"kept", flags).unwrap();
            rustix::fs::lsetxattr(s.ws.as_path(), "system.posix_acl_default", acl, flags).unwrap();
            let attrs = || {
                let get = |n: &str| {
                    let mut v = vec![0u8; 256];
                    rustix::fs::lgetxattr(s.ws.as_path(), n, &mut v).map(|k| v[..k].to_vec()).ok()
                };
                (get("user.project"), get("system.posix_acl_default"))
            };
            let kept = || {
                std::fs::read_dir(s.state.join("kept")).map_or(0, |d| d.flatten().filter(|e| e.path().is_dir()).count())
            };
            for script in ["true", "cat a", "ls -la"] {
                let (out, j) = run(who, &s, script, cold);
                assert_eq!(j["outcome"], "committed", "{what} `{script}`: {}", describe(&out));
                assert_eq!(attrs(), (Some(b"kept".to_vec()), Some(acl.to_vec())), "{what} `{script}`");
            }
            assert_eq!(kept(), 0, "{what}: a read was committed and kept for undo");
            // A change of entries commits the root's mtime, and its attributes stay.
            let (out, j) = run(who, &s, "echo b > b", cold);
            assert_eq!(j["outcome"], "committed", "{what}: {}", describe(&out));
            assert_eq!(attrs(), (Some(b"kept".to_vec()), Some(acl.to_vec())), "{what}: after a write");
            // A command that changes them is committed as it did.
            let (out, j) = run(who, &s, "python3 -c \"import os; os.setxattr('.', 'user.project', b'new')\"", cold);
            assert_eq!(j["outcome"], "committed", "{what}: {}", describe(&out));
            assert_eq!(attrs().0, Some(b"new".to_vec()), "{what}: the command's change");
        }
    }
}
