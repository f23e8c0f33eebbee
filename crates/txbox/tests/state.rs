//! The state directory through the real binary, as root and as an unprivileged user: where it
//! lives by default, that nothing read from one steers txbox outside it and the workspace
//! (#13.1), parallel runs (#14.5), damaged session fingerprints (#14.6) and retired
//! directories under sustained load (#14.7).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

const ID: &str = "0123456789abcdef";

/// `txbox` as `who` with HOME at `home` (so the default state directory and its key are
/// under it), no state directory named unless `args` name one, in `cwd`.
fn txbox_in(who: As, home: &Path, cwd: &Path, args: &[&OsStr]) -> Output {
    let mut cmd = txbox_command(who);
    cmd.env("HOME", home).env_remove("XDG_STATE_HOME").env_remove("TXBOX_STATE_DIR");
    cmd.args(args).current_dir(cwd).output().unwrap()
}

fn os<'a>(args: &'a [&'a str]) -> Vec<&'a OsStr> {
    args.iter().map(OsStr::new).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|c| format!("{c:02x}")).collect()
}

fn hexp(p: &Path) -> String {
    hex(p.as_os_str().as_bytes())
}

/// A decoy tree outside every workspace and state directory, shaped like what crafted state
/// points at: a workspace, an upper layer, a trash, session steps.
fn decoy(root: &Path) -> PathBuf {
    let d = root.join("decoy");
    for (p, text) in [("ws/i", "victim"), ("upper/f", "planted"), ("trash/g", "x"), ("steps/1/upper/h", "x")] {
        std::fs::create_dir_all(d.join(p).parent().unwrap()).unwrap();
        std::fs::write(d.join(p), text).unwrap();
    }
    d
}

/// An earlier txbox version's commit record (checksummed, not keyed) whose paths point at the
/// decoy: applied, it would move the decoy's `upper/f` into the decoy's workspace.
fn v1_record(decoy: &Path) -> String {
    let body = format!(
        "txbox-commit v1\ntx {ID}\nworkspace {}\nupper {}\ntrash {}\ncreate file 1 {}\n",
        hexp(&decoy.join("ws")),
        hexp(&decoy.join("upper")),
        hexp(&decoy.join("trash")),
        hex(b"f")
    );
    let mut sum = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(sum.stdin.as_mut().unwrap(), body.as_bytes()).unwrap();
    let out = sum.wait_with_output().unwrap();
    let digest = String::from_utf8_lossy(&out.stdout).split(' ').next().unwrap().to_string();
    format!("{body}end {digest}\n")
}

/// Plant, in `state`, what the issue lists: crafted records, `steps_root`, `meta`, `status`,
/// a symlinked transaction, symlinked journal entries and retired directories.
fn plant(state: &Path, decoy: &Path) {
    let tx = state.join("tx").join(ID);
    std::fs::create_dir_all(&tx).unwrap();
    std::fs::create_dir_all(state.join("journal")).unwrap();
    std::fs::create_dir_all(state.join("gone")).unwrap();
    std::fs::write(tx.join("meta"), format!("workspace {}\nkind session\n", hexp(&decoy.join("ws")))).unwrap();
    std::fs::write(tx.join("status"), "committing\n").unwrap();
    std::fs::write(tx.join("steps_root"), hexp(&decoy.join("steps"))).unwrap();
    std::fs::write(state.join("journal").join(format!("{ID}.commit")), v1_record(decoy)).unwrap();
    std::os::unix::fs::symlink(decoy.join("ws/i"), state.join("journal/x.commit")).unwrap();
    std::os::unix::fs::symlink(decoy, state.join("tx/00000000000000aa")).unwrap();
    std::os::unix::fs::symlink(decoy, state.join("tx/.gone-00000000000000ab")).unwrap();
    std::os::unix::fs::symlink(decoy, state.join("gone/00000000000000ac")).unwrap();
}

fn code(o: &Output) -> Option<i32> {
    o.status.code()
}

/// A repository that ships `.txbox/` with crafted state: the default state directory is
/// elsewhere, `.txbox` is plain content, and naming it as the state directory is refused.
/// Whatever is run on it, nothing outside the workspace changes and the workspace itself
/// (`.txbox` included) stays as it was.
#[test]
fn a_repository_shipping_txbox_state_is_never_trusted() {
    for who in identities() {
        let s = Scratch::new("shipped");
        let home = s.root.join("home");
        std::fs::create_dir_all(&home).unwrap();
        let d = decoy(&s.root);
        let shipped = s.ws.join(".txbox");
        plant(&shipped, &d);
        std::fs::write(s.ws.join("README"), "a cloned repository\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let (before_decoy, before_ws) = (digest(&d, &[]), digest(&s.ws, &[]));
        let ws = s.ws.to_str().unwrap();
        let named = shipped.to_str().unwrap();

        // The default state directory: `.txbox` is just content; the note says what it is.
        let out = txbox_in(who, &home, &s.ws, &os(&["run", "-C", ws, "--", "true"]));
        assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("unfinished commit record") && err.contains("delete"), "{who:?}: {err}");
        for args in [
            vec!["recover", "-C", ws],
            vec!["list", "-C", ws],
            vec!["--json", "run", "-C", ws, "-c", "cat .txbox/tx/0123456789abcdef/status"],
        ] {
            let out = txbox_in(who, &home, &s.ws, &os(&args));
            assert_eq!(code(&out), Some(0), "{who:?} {args:?}: {}", describe(&out));
        }
        // Its transaction ids are not ours, from inside the workspace or named.
        for args in [vec!["rollback", ID], vec!["commit", ID], vec!["exec", ID, "--", "true"], vec!["diff", ID]] {
            let out = txbox_in(who, &home, &s.ws, &os(&args));
            assert_eq!(code(&out), Some(125), "{who:?} {args:?}: {}", describe(&out));
            assert!(String::from_utf8_lossy(&out.stderr).contains("unknown transaction"), "{}", describe(&out));
        }
        // Named as the state directory: refused, saying what to do.
        for args in [
            vec!["--state-dir", named, "run", "-C", ws, "--", "true"],
            vec!["--state-dir", named, "recover"],
            vec!["--state-dir", named, "list"],
            vec!["--state-dir", named, "rollback", ID],
            vec!["--state-dir", named, "log"],
        ] {
            let out = txbox_in(who, &home, &s.ws, &os(&args));
            assert_eq!(code(&out), Some(125), "{who:?} {args:?}: {}", describe(&out));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("not a txbox state directory") && err.contains("move it aside"), "{err}");
        }
        // The background collector, pointed at it.
        let out = txbox_in(who, &home, &s.ws, &[OsStr::new("__gc"), shipped.as_os_str()]);
        assert_eq!(code(&out), Some(0));

        assert!(
            digest(&d, &[]) == before_decoy,
            "{who:?}: the decoy changed:\n{}",
            diff(&before_decoy, &digest(&d, &[]))
        );
        assert!(digest(&s.ws, &[]) == before_ws, "{who:?}: the workspace changed");
        // Nothing of txbox's went into the workspace either.
        assert_eq!(std::fs::read_dir(&s.ws).unwrap().count(), 2);
    }
}

/// A command that writes a `.txbox` (or tries the key's directory, with `$HOME` inside the
/// workspace) plants nothing a later run trusts, and the key never becomes content.
#[test]
fn a_command_cannot_plant_state_or_reach_the_key() {
    for who in identities() {
        let s = Scratch::new("plant");
        let home = s.ws.join("home");
        std::fs::create_dir_all(home.join(".local/state")).unwrap();
        let d = decoy(&s.root);
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let before_decoy = digest(&d, &[]);
        let ws = s.ws.to_str().unwrap();
        // The first run makes the key (inside the workspace, since $HOME is).
        let out = txbox_in(who, &home, &s.ws, &os(&["run", "-C", ws, "--", "true"]));
        assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
        let base = home.join(".local/state/txbox");
        let key = std::fs::read(base.join("key")).unwrap();
        let script = format!(
            "mkdir -p sub/.txbox/tx/{ID} sub/.txbox/journal; \
             printf '%s' '{}' > sub/.txbox/journal/{ID}.commit; \
             printf 'workspace {}\\nkind session\\n' > sub/.txbox/tx/{ID}/meta; \
             cat home/.local/state/txbox/key && echo READ-KEY; \
             ls home/.local/state/txbox/tx >/dev/null 2>&1 && echo SAW-STATE; \
             echo x > home/.local/state/txbox/key 2>/dev/null && echo WROTE-KEY; \
             echo x > home/.local/state/txbox/new 2>/dev/null && echo WROTE-STATE; \
             echo fine > home/.local/state/other",
            v1_record(&d).replace('\n', "\\n"),
            hexp(&d.join("ws"))
        );
        let out = txbox_in(who, &home, &s.ws, &os(&["--json", "run", "-C", ws, "-c", &script]));
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
        assert_eq!(j["outcome"], "committed", "{who:?}: {j}");
        let printed = j["stdout"].as_str().unwrap();
        for bad in ["READ-KEY", "SAW-STATE", "WROTE-KEY", "WROTE-STATE"] {
            assert!(!printed.contains(bad), "{who:?}: {bad}: {j}");
        }
        let changed: Vec<String> = serde_json::from_value(j["changes"]["added"].clone()).unwrap();
        assert!(changed.iter().all(|p| !p.contains("state/txbox")), "{who:?}: the base directory was committed: {j}");
        assert_eq!(std::fs::read_to_string(home.join(".local/state/other")).unwrap(), "fine\n");
        assert_eq!(std::fs::read(base.join("key")).unwrap(), key, "{who:?}: the key changed");
        assert!(!base.join("new").exists());
        // The planted `.txbox` is content of `sub`, never its state directory.
        let sub = s.ws.join("sub");
        for args in [
            vec!["run", "-C", sub.to_str().unwrap(), "--", "true"],
            vec!["recover", "-C", sub.to_str().unwrap()],
            vec!["rollback", ID],
        ] {
            let out = txbox_in(who, &home, &sub, &os(&args));
            let want = if args[0] == "rollback" { Some(125) } else { Some(0) };
            assert_eq!(code(&out), want, "{who:?} {args:?}: {}", describe(&out));
        }
        assert!(digest(&d, &[]) == before_decoy, "{who:?}: the decoy changed");
    }
}

/// A genuine commit record left by a crash in one state directory, `(state, workspace, id)`.
fn crashed_commit(who: As, s: &Scratch, name: &str) -> (PathBuf, PathBuf, String) {
    let state = s.root.join(format!("{name}-state"));
    let ws = s.root.join(format!("{name}-ws"));
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("old"), "old\n").unwrap();
    if let As::User(uid) = who {
        s.chown(uid);
    }
    let mut cmd = txbox_command(who);
    cmd.env("HOME", &s.root).env("TXBOX_CRASH_AFTER", "2");
    let out = cmd
        .arg("--state-dir")
        .arg(&state)
        .args(["run", "-C", ws.to_str().unwrap(), "-c", "echo new > new; rm old"])
        .output()
        .unwrap();
    assert_eq!(code(&out), Some(137), "{who:?}: the crash hook did not stop the commit: {}", describe(&out));
    let record = std::fs::read_dir(state.join("journal")).unwrap().next().unwrap().unwrap().path();
    let id = record.file_stem().unwrap().to_str().unwrap().to_string();
    (state, ws, id)
}

/// State planted in a real state directory by someone with access to it: symlinked and
/// hard-linked records of another state directory, a replayed record, a symlinked
/// transaction, forged meta, status and steps_root, symlinks among retired directories.
#[test]
fn state_planted_in_a_real_state_directory_is_refused() {
    for who in identities() {
        let s = Scratch::new("planted");
        let d = decoy(&s.root);
        let (other_state, other_ws, other_id) = crashed_commit(who, &s, "other");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let ws = s.ws.to_str().unwrap().to_string();
        let out = txbox(who, &s, &["run", "-C", &ws, "-c", "echo a > a"]);
        assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
        let (before_decoy, before_other, before_ws) = (digest(&d, &[]), digest(&other_ws, &[]), digest(&s.ws, &[]));
        let their_record = other_state.join("journal").join(format!("{other_id}.commit"));
        let ours = s.state.join("journal").join(format!("{other_id}.commit"));
        // Another state directory's record, linked or copied in: refused, never applied.
        for how in ["symlink", "hard link", "copy"] {
            match how {
                "symlink" => std::os::unix::fs::symlink(&their_record, &ours).unwrap(),
                "hard link" => std::fs::hard_link(&their_record, &ours).unwrap(),
                _ => drop(std::fs::copy(&their_record, &ours).unwrap()),
            }
            let out = txbox(who, &s, &["recover"]);
            assert_eq!(code(&out), Some(125), "{who:?} {how}: {}", describe(&out));
            let out = txbox(who, &s, &["run", "-C", &ws, "--", "true"]);
            assert_eq!(code(&out), Some(125), "{who:?} {how}: a run went on beside it: {}", describe(&out));
            std::fs::remove_file(&ours).unwrap();
        }
        assert!(digest(&other_ws, &[]) == before_other, "{who:?}: the other workspace changed");

        // A replayed record: applied once by its own state directory, then put back.
        let recover_other = || {
            txbox_command(who)
                .env("HOME", &s.root)
                .arg("--state-dir")
                .arg(&other_state)
                .arg("recover")
                .output()
                .unwrap()
        };
        let saved = std::fs::read(&their_record).unwrap();
        let out = recover_other();
        assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
        let applied = digest(&other_ws, &[]);
        assert!(other_ws.join("new").exists() && !other_ws.join("old").exists(), "{who:?}: not rolled forward");
        std::fs::write(&their_record, &saved).unwrap();
        let out = recover_other();
        assert_eq!(code(&out), Some(125), "{who:?}: a replayed record was accepted: {}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("no longer exists"), "{}", describe(&out));
        assert!(digest(&other_ws, &[]) == applied, "{who:?}: the replay changed the workspace");
        std::fs::remove_file(&their_record).unwrap();

        // Forged transactions in our own state directory.
        plant(&s.state, &d);
        std::fs::remove_file(s.state.join("journal").join(format!("{ID}.commit"))).unwrap();
        std::os::unix::fs::symlink(&d, s.state.join("tx/00000000000000ad")).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        for args in [
            vec!["recover"],
            vec!["list"],
            vec!["rollback", ID],
            vec!["commit", ID],
            vec!["rollback", "00000000000000ad"],
            vec!["exec", "00000000000000ad", "--", "true"],
            vec!["run", "-C", &ws, "--", "true"],
        ] {
            let out = txbox(who, &s, &args);
            // What names a forged transaction is refused; the rest works around it.
            let want = if matches!(args[0], "recover" | "list" | "run") { Some(0) } else { Some(125) };
            assert_eq!(code(&out), want, "{who:?} {args:?}: {}", describe(&out));
        }
        let out = txbox_command(who).env("HOME", &s.root).arg("__gc").arg(&s.state).output().unwrap();
        assert_eq!(code(&out), Some(0));
        assert!(!s.state.join("gone/00000000000000ac").exists(), "{who:?}: a retired symlink stayed");
        assert!(
            digest(&d, &[]) == before_decoy,
            "{who:?}: the decoy changed:\n{}",
            diff(&before_decoy, &digest(&d, &[]))
        );
        assert!(digest(&s.ws, &[]) == before_ws, "{who:?}: the workspace changed");
    }
}

/// By default the state directory is `$HOME/.local/state/txbox`: nothing appears in the
/// workspace, the key and the directory are private, and transaction ids resolve from any
/// directory. A planted key or an open directory is refused with what to do.
#[test]
fn the_default_state_directory_is_outside_the_workspace() {
    for who in identities() {
        let s = Scratch::new("default");
        let home = s.root.join("home");
        std::fs::create_dir_all(&home).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let ws = s.ws.to_str().unwrap();
        let out = txbox_in(who, &home, &s.ws, &os(&["run", "-C", ws, "-c", "echo one > one"]));
        assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
        let names: Vec<_> = std::fs::read_dir(&s.ws).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["one"], "{who:?}: the workspace holds more than the command made");
        let base = home.join(".local/state/txbox");
        assert_eq!(std::fs::metadata(&base).unwrap().mode() & 0o777, 0o700);
        let key = std::fs::metadata(base.join("key")).unwrap();
        assert_eq!((key.mode() & 0o777, key.len()), (0o600, 32));
        assert!(base.join("txbox-state").is_file() && base.join("audit.log").is_file());

        // A session begun in the workspace, driven from elsewhere by its id.
        let out = txbox_in(who, &home, &s.ws, &os(&["begin", "--name", "from afar"]));
        assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(base.join("tx").join(&id).join("steps").is_dir(), "{who:?}: session layers not in the state dir");
        let elsewhere = s.root.as_path();
        for args in [vec!["exec", &id, "-c", "echo two > two"], vec!["diff", &id], vec!["commit", &id]] {
            let out = txbox_in(who, &home, elsewhere, &os(&args));
            assert_eq!(code(&out), Some(0), "{who:?} {args:?}: {}", describe(&out));
        }
        assert_eq!(std::fs::read_to_string(s.ws.join("two")).unwrap(), "two\n");
        let out = txbox_in(who, &home, &s.ws, &os(&["--json", "log"]));
        let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(log.as_array().is_some_and(|a| a.len() >= 3), "{log}");

        // A key that is a symlink (to a file anyone can read), or a base others may enter.
        std::fs::rename(base.join("key"), base.join("key.real")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", base.join("key")).unwrap();
        let out = txbox_in(who, &home, &s.ws, &os(&["run", "-C", ws, "--", "true"]));
        assert_eq!(code(&out), Some(125), "{who:?}: {}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("symlink"), "{}", describe(&out));
        std::fs::remove_file(base.join("key")).unwrap();
        std::fs::rename(base.join("key.real"), base.join("key")).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = txbox_in(who, &home, &s.ws, &os(&["run", "-C", ws, "--", "true"]));
        assert_eq!(code(&out), Some(125), "{who:?}: {}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 700"), "{}", describe(&out));
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
        let out = txbox_in(who, &home, &s.ws, &os(&["run", "-C", ws, "--", "true"]));
        assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
    }
}

/// A tmpfs mounted by the test (root only), unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(at: &Path) -> Option<Mount> {
        std::fs::create_dir_all(at).unwrap();
        let st =
            std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "mode=755", "txbox-test"]).arg(at).status();
        st.is_ok_and(|s| s.success()).then(|| Mount(at.to_path_buf()))
    }
}

impl Mount {
    /// `src` bound onto `at` (root only): one filesystem, two mounts.
    fn bind(src: &Path, at: &Path) -> Option<Mount> {
        std::fs::create_dir_all(at).unwrap();
        let st = std::process::Command::new("mount").arg("--bind").arg(src).arg(at).status();
        st.is_ok_and(|s| s.success()).then(|| Mount(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// When the base directory is on another filesystem than the workspace: a per-user directory
/// at that filesystem's root if this user may make one there, else `.txbox` inside the
/// workspace (session layers next to it); ids still resolve from anywhere.
#[test]
fn a_workspace_on_another_filesystem_gets_a_state_directory_there() {
    if !is_root() {
        eprintln!("SKIP other-filesystem fallbacks: mounting a tmpfs needs root");
        return;
    }
    for who in identities() {
        let s = Scratch::new("otherfs");
        let home = s.root.join("home");
        std::fs::create_dir_all(&home).unwrap();
        let Some(mnt) = Mount::tmpfs(&s.root.join("mnt")) else {
            panic!("cannot mount a tmpfs as root");
        };
        // The user's workspace sits in a directory of its own on a root-owned filesystem.
        let dir = mnt.0.join("u");
        let ws = dir.join("proj");
        std::fs::create_dir_all(&ws).unwrap();
        let uid = match who {
            As::Me => rustix::process::geteuid().as_raw(),
            As::User(uid) => {
                // Not the mount's root: that stays root's, as on a shared volume.
                for p in [&home, &dir, &ws] {
                    std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
                }
                uid
            }
        };
        let wss = ws.to_str().unwrap();
        let env = |args: &[&str]| {
            let mut c = txbox_command(who);
            c.env("HOME", &home).env("TXBOX_WARM", "0").env_remove("XDG_STATE_HOME").env_remove("TXBOX_STATE_DIR");
            c.args(args).current_dir(&s.root).output().unwrap()
        };
        let out = env(&["run", "-C", wss, "-c", "echo x > x"]);
        assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
        let at_root = mnt.0.join(format!(".txbox-state-{uid}"));
        let state = if who == As::Me { at_root.clone() } else { ws.join(".txbox") };
        assert!(state.join("txbox-state").is_file(), "{who:?}: no state directory at {}", state.display());
        assert_eq!(who == As::Me, at_root.exists(), "{who:?}: the mount root was used as it should not be");
        let out = env(&["begin", "-C", wss]);
        assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        for args in [vec!["exec", &id, "-c", "echo y > y"], vec!["commit", &id]] {
            let out = env(&args);
            assert_eq!(code(&out), Some(0), "{who:?} {args:?}: {}", describe(&out));
        }
        assert!(ws.join("y").exists() && !dir.join(".proj.txbox-layers").join(&id).exists());
        if who != As::Me {
            // In the workspace: invisible to commands and never committed.
            let out =
                env(&["--json", "run", "-C", wss, "-c", "ls -A .txbox; echo z > .txbox/z 2>/dev/null || echo refused"]);
            let j: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
            assert_eq!(j["stdout"], "refused\n", "{j}");
            assert!(!ws.join(".txbox/z").exists());
        }
        drop(mnt);
    }
}

/// A workspace that is a bind mount of a directory on the same filesystem as the base
/// directory: a rename never crosses a mount, so a state directory in the base directory
/// would take every commit past its commit point and then fail to apply it (`EXDEV`), leaving
/// the workspace to a recovery that cannot finish. The state directory goes inside the
/// workspace's own mount instead; one named on another mount is refused before anything runs.
#[test]
fn a_bind_mounted_workspace_gets_a_state_directory_it_can_commit_into() {
    if !is_root() {
        eprintln!("SKIP bind-mounted workspace: mounting needs root");
        return;
    }
    for who in identities() {
        let s = Scratch::new("bindws");
        let (home, src) = (s.root.join("home"), s.root.join("src"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("f"), "old\n").unwrap();
        if let As::User(uid) = who {
            for p in [&home, &src, &src.join("f")] {
                std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
            }
        }
        let Some(mnt) = Mount::bind(&src, &s.root.join("ws")) else {
            panic!("cannot bind-mount as root");
        };
        let ws = mnt.0.clone();
        let wss = ws.to_str().unwrap();
        let run = |args: &[&str]| txbox_in(who, &home, &s.root, &os(args));
        for text in ["new", "newer"] {
            let out = run(&["run", "-C", wss, "-c", &format!("echo {text} > f")]);
            assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
            assert_eq!(std::fs::read_to_string(src.join("f")).unwrap(), format!("{text}\n"), "{who:?}");
        }
        assert!(ws.join(".txbox/txbox-state").is_file(), "{who:?}: the state directory is not in the mount");
        // A state directory named on another mount of the same filesystem is refused at once.
        let elsewhere = s.root.join("state-elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        if let As::User(uid) = who {
            std::os::unix::fs::chown(&elsewhere, Some(uid), Some(uid)).unwrap();
        }
        let out = run(&["--state-dir", elsewhere.to_str().unwrap(), "run", "-C", wss, "-c", "echo lost > f"]);
        assert_ne!(code(&out), Some(0), "{who:?}: {}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("mount"), "{who:?}: {}", describe(&out));
        assert_eq!(std::fs::read_to_string(src.join("f")).unwrap(), "newer\n", "{who:?}");
        drop(mnt);
    }
}

/// #14.5: eight agents running `txbox run -- true` back to back on one workspace. Before the
/// fix, a spare directory taken by one run could be discarded by another's recovery before
/// it was locked ("owner.lock: No such file or directory"); 1,200 runs showed it.
#[test]
fn parallel_runs_never_fail() {
    const LOOPS: usize = 8;
    const ROUNDS: usize = 150;
    for who in identities() {
        let s = Scratch::new("parallel");
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let ws = s.ws.to_str().unwrap().to_string();
        let script = format!(
            "fail=0; for i in $(seq {ROUNDS}); do \"$0\" --state-dir \"$1\" run -C \"$2\" -- true 2>>\"$3\" || fail=$((fail+1)); done; echo $fail"
        );
        let loops: Vec<_> = (0..LOOPS)
            .map(|n| {
                let errs = s.root.join(format!("errors-{n}"));
                let mut c = match who {
                    As::Me => std::process::Command::new("sh"),
                    As::User(uid) => {
                        let mut c = std::process::Command::new("setpriv");
                        c.arg(format!("--reuid={uid}"))
                            .arg(format!("--regid={uid}"))
                            .arg("--clear-groups")
                            .arg("--")
                            .arg("sh");
                        c
                    }
                };
                if let As::User(_) = who {
                    c.env("HOME", &s.root);
                }
                c.arg("-c").arg(&script).arg(binary()).arg(&s.state).arg(&ws).arg(&errs);
                c.stdout(std::process::Stdio::piped()).spawn().unwrap()
            })
            .collect();
        let mut failed = 0;
        for l in loops {
            let out = l.wait_with_output().unwrap();
            failed += String::from_utf8_lossy(&out.stdout).trim().parse::<usize>().unwrap_or(ROUNDS);
        }
        let errors: String = (0..LOOPS)
            .map(|n| std::fs::read_to_string(s.root.join(format!("errors-{n}"))).unwrap_or_default())
            .flat_map(|e| {
                e.lines().filter(|l| !l.starts_with("txbox: committed")).map(|l| format!("{l}\n")).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(failed, 0, "{who:?}: {failed} of {} runs failed:\n{errors}", LOOPS * ROUNDS);
    }
}

/// #14.6: a session whose fingerprints are damaged (truncated, a flipped byte, deleted) is
/// not committed: an error (exit 125), nothing applied, and the session stays open.
#[test]
fn damaged_session_fingerprints_refuse_the_commit() {
    for who in identities() {
        for damage in ["truncate", "flip", "delete"] {
            let s = Scratch::new("fingerprints");
            if let As::User(uid) = who {
                s.chown(uid);
            }
            let ws = s.ws.to_str().unwrap().to_string();
            let out = txbox(who, &s, &["begin", "-C", &ws]);
            let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let out = txbox(who, &s, &["exec", &id, "-c", "echo x > f"]);
            assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
            let file = s.state.join("tx").join(&id).join("fingerprints");
            let mut bytes = std::fs::read(&file).unwrap();
            match damage {
                "truncate" => bytes.truncate(bytes.len() - 3),
                "flip" => bytes[2] ^= 0x04,
                _ => {}
            }
            if damage == "delete" {
                std::fs::remove_file(&file).unwrap();
            } else {
                std::fs::write(&file, &bytes).unwrap();
            }
            let before = digest(&s.ws, &[]);
            let out = txbox(who, &s, &["--json", "commit", &id]);
            assert_eq!(code(&out), Some(125), "{who:?} {damage}: {}", describe(&out));
            assert!(String::from_utf8_lossy(&out.stderr).contains("fingerprints"), "{}", describe(&out));
            assert!(digest(&s.ws, &[]) == before && !s.ws.join("f").exists(), "{who:?} {damage}: applied");
            let out = txbox(who, &s, &["--json", "list"]);
            assert!(String::from_utf8_lossy(&out.stdout).contains(&id), "{who:?} {damage}: {}", describe(&out));
            let out = txbox(who, &s, &["rollback", &id]);
            assert_eq!(code(&out), Some(0), "{who:?} {damage}: {}", describe(&out));
        }
    }
}

/// #14.7: under sustained load a warm server is never idle; retired directories must not pile
/// up all the same, and none is left in `tx` (where every run's recovery looks).
#[test]
fn retired_directories_stay_bounded_under_sustained_load() {
    const RUNS: usize = 60;
    for who in identities() {
        for warm in ["1", "0"] {
            let s = Scratch::new("retired");
            if let As::User(uid) = who {
                s.chown(uid);
            }
            let ws = s.ws.to_str().unwrap().to_string();
            let mut most = 0;
            for i in 0..RUNS {
                let mut cmd = txbox_command(who);
                if let As::User(_) = who {
                    cmd.env("HOME", &s.root);
                }
                cmd.env("TXBOX_WARM", warm).env("TXBOX_WARM_IDLE", "600");
                let out = cmd
                    .arg("--state-dir")
                    .arg(&s.state)
                    .args(["run", "-C", &ws, "-c", &format!("echo {i} > f; mkdir -p d{i}")])
                    .output()
                    .unwrap();
                assert_eq!(code(&out), Some(0), "{who:?}: {}", describe(&out));
                most = most.max(std::fs::read_dir(s.state.join("gone")).unwrap().count());
            }
            // Wait for the collector at work, if any, by taking its lock.
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(s.state.join("locks/gc.lock"))
                .unwrap();
            rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
            let left = std::fs::read_dir(s.state.join("gone")).unwrap().count();
            let bound = 8 + 1;
            assert!(left <= bound, "{who:?} warm={warm}: {left} retired directories left (most {most})");
            let in_tx: Vec<_> = std::fs::read_dir(s.state.join("tx"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with(".spare-"))
                .collect();
            assert!(in_tx.is_empty(), "{who:?} warm={warm}: left in tx: {in_tx:?}");
        }
    }
}

/// A run that left nothing in its directory hands it to the next run (`.spare-N`), as an
/// ordinary user too. Overlayfs leaves its own `work/work` at mode 0000, which only root can
/// list: until the user's runs gave themselves read access to it, no unprivileged run ever
/// left a spare, and each created its directories and retired them to be deleted (0.5–1 ms per
/// run, docs/BENCHMARKS.md).
#[test]
fn finished_runs_hand_their_directory_to_the_next_as_any_user() {
    for who in identities() {
        let s = Scratch::new("spare");
        std::fs::write(s.ws.join("f"), "a\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let ws = s.ws.to_str().unwrap().to_string();
        let names = |d: &str| -> Vec<String> {
            std::fs::read_dir(s.state.join(d))
                .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default()
        };
        for _ in 0..3 {
            let out = txbox(who, &s, &["run", "-C", &ws, "--", "cat", "f"]);
            assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
            // The warm server lets a run's view go once idle (5 ms); the next run may then take it.
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let tx = names("tx");
        assert!(tx.iter().any(|n| n.starts_with(".spare-")), "{who:?}: no spare left in tx/: {tx:?}");
        assert!(
            names("gone").is_empty(),
            "{who:?}: runs that wrote nothing retired their directories: {:?}",
            names("gone")
        );
        // A run in a directory taken over works as in a new one, and commits.
        let out = txbox(who, &s, &["run", "-C", &ws, "-c", "echo b >> f"]);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", describe(&out));
        assert_eq!(std::fs::read_to_string(s.ws.join("f")).unwrap(), "a\nb\n");
    }
}
