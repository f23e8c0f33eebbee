//! Warm sandboxes (`txbox_sandbox::warm`) through the real binary: a run after the first is
//! served by the server the first one started, and behaves exactly like a cold run — same
//! results, the caller's environment, nothing carried from one transaction to the next, no
//! process left behind, secrets that appear later still hidden — as root and unprivileged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `txbox run -c SCRIPT` with phase timings on, stdin from /dev/null (as an agent runs it).
fn timed_command(who: As, s: &Scratch, script: &str, extra_env: &[(&str, &str)]) -> Command {
    let mut cmd = txbox_command(who);
    if who != As::Me {
        cmd.env("HOME", &s.root);
    }
    cmd.env_remove("TXBOX_WARM");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.env("TXBOX_TIMING", "1").arg("--state-dir").arg(&s.state).args(["run", "-c", script]);
    cmd.current_dir(&s.ws).stdin(Stdio::null());
    cmd
}

/// [`timed_command`], waited for.
fn run_timed(who: As, s: &Scratch, script: &str, extra_env: &[(&str, &str)]) -> Output {
    timed_command(who, s, script, extra_env).output().unwrap()
}

/// [`timed_command`] in the background, its output captured.
fn spawn_timed(who: As, s: &Scratch, script: &str, extra_env: &[(&str, &str)]) -> std::process::Child {
    timed_command(who, s, script, extra_env).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

fn served_warm(o: &Output) -> bool {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("txbox timing"), "no timing line: {}", describe(o));
    err.contains("txbox sandbox: warm")
}

/// Run until a run is served warm (the first one starts the server; it may take a moment).
fn warm_up(who: As, s: &Scratch) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = run_timed(who, s, "true", &[]);
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        if served_warm(&o) {
            return;
        }
        assert!(Instant::now() < deadline, "never served warm: {}", describe(&o));
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn servers_of(s: &Scratch) -> Vec<u32> {
    let out = Command::new("pgrep").arg("-f").arg(format!("__warm --socket {}", s.state.display())).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

#[test]
fn a_warm_run_commits_and_rolls_back_like_a_cold_one() {
    for who in identities() {
        let s = Scratch::new("warm-commit");
        std::fs::write(s.ws.join("keep.txt"), "old\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        warm_up(who, &s);
        let o =
            run_timed(who, &s, "echo new > keep.txt && mkdir -p d && echo x > d/f && echo out && echo err >&2", &[]);
        assert!(served_warm(&o), "{}", describe(&o));
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "out\n");
        assert!(String::from_utf8_lossy(&o.stderr).starts_with("err\n"), "{}", describe(&o));
        assert_eq!(std::fs::read_to_string(s.ws.join("keep.txt")).unwrap(), "new\n");
        assert_eq!(std::fs::read_to_string(s.ws.join("d/f")).unwrap(), "x\n");
        let o = run_timed(who, &s, "echo lost > keep.txt; rm -r d; exit 7", &[]);
        assert!(served_warm(&o), "{}", describe(&o));
        assert_eq!(o.status.code(), Some(7), "{}", describe(&o));
        assert_eq!(std::fs::read_to_string(s.ws.join("keep.txt")).unwrap(), "new\n", "{who:?}");
        assert!(s.ws.join("d/f").exists(), "{who:?}");
    }
}

/// Write `rel` in the workspace, as `who`'s file.
fn put(who: As, s: &Scratch, rel: &str, text: &str) {
    let p = s.ws.join(rel);
    std::fs::write(&p, text).unwrap();
    if let As::User(uid) = who {
        std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
    }
}

fn premounted(o: &Output) -> bool {
    String::from_utf8_lossy(&o.stderr).contains("txbox sandbox: warm, premounted")
}

/// The view a server mounts ahead for the next run (`warm::premount`) is mounted while the run
/// before commits: each run must still see everything that run committed (a file rewritten, a
/// directory made, one removed) and nothing of one rolled back, as a view mounted for it would.
#[test]
fn a_premounted_view_shows_what_the_run_before_committed() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-premount");
        warm_up(who, &s);
        // A premounted run sees exactly what run `i` committed.
        let sees_commit = |i: u32| {
            let o = run_timed(who, &s, &format!("cat f; ls -d d*; cat d{i}/g"), &[]);
            assert!(premounted(&o), "{who:?} {i}: {}", describe(&o));
            assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{i}\nd{i}\n{i}\n"), "{who:?}: {}", describe(&o));
        };
        for i in 1..=6 {
            let write = format!("echo {i} > f && mkdir d{i} && echo {i} > d{i}/g && rm -rf d{}", i - 1);
            let o = run_timed(who, &s, &write, &[]);
            assert_eq!(o.status.code(), Some(0), "{who:?}: {}", describe(&o));
            assert!(premounted(&o), "{who:?} {i}: {}", describe(&o));
            sees_commit(i);
            let o = run_timed(who, &s, &format!("echo lost > f; rm -r d{i}; mkdir lost; exit 3"), &[]);
            assert_eq!(o.status.code(), Some(3), "{who:?}: {}", describe(&o));
            sees_commit(i);
        }
    }
}

/// Overlayfs takes the view's root mode and owner from the upper root when it mounts: a view
/// premounted before the workspace root's mode changed (by a run, or on the host) is not the
/// next run's, which sees the root as it is.
#[test]
fn a_premounted_view_follows_a_changed_workspace_root() {
    use std::os::unix::fs::PermissionsExt;
    for who in identities() {
        let s = Scratch::for_who(who, "warm-premount-root");
        warm_up(who, &s);
        for mode in ["700", "751"] {
            let o = run_timed(who, &s, &format!("chmod {mode} ."), &[]);
            assert_eq!(o.status.code(), Some(0), "{who:?}: {}", describe(&o));
            let o = run_timed(who, &s, "stat -c %a .", &[]);
            assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{mode}\n"), "{who:?}: {}", describe(&o));
        }
        for mode in [0o705, 0o755] {
            std::fs::set_permissions(&s.ws, std::fs::Permissions::from_mode(mode)).unwrap();
            let o = run_timed(who, &s, "stat -c %a .", &[]);
            assert!(served_warm(&o), "{who:?}: {}", describe(&o));
            assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{mode:o}\n"), "{who:?}: {}", describe(&o));
            // The next premount has the new mode.
            let o = run_timed(who, &s, "stat -c %a .", &[]);
            assert!(premounted(&o), "{who:?}: {}", describe(&o));
            assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{mode:o}\n"), "{who:?}: {}", describe(&o));
        }
    }
}

/// A warm command runs in a process group of its own, in a session without a terminal: what it
/// signals as its group (`kill 0`, as a shell's job control or a build tool's cleanup does)
/// reaches its own processes and never the server outside the sandbox; it has no terminal to
/// open. The server goes on serving, premounted.
#[test]
fn a_command_signalling_its_process_group_reaches_nothing_outside() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-pgrp");
        warm_up(who, &s);
        let servers = servers_of(&s);
        assert!(!servers.is_empty());
        let probe = "import os, signal
print('pgrp', os.getpgrp())
try:
    os.open('/dev/tty', os.O_RDWR)
    print('TTY-OPENED')
except OSError as e:
    print('no-tty', e.errno)
os.killpg(0, signal.SIGTERM)";
        let o = run_timed(who, &s, &format!("python3 -c \"{probe}\"; echo NOT-REACHED"), &[]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(premounted(&o), "{who:?}: {}", describe(&o));
        assert!(!out.contains("TTY-OPENED") && out.contains("no-tty"), "{who:?}: {}", describe(&o));
        // Its group is the shell's, a process of the sandbox; init's (the server's, outside)
        // would show as 0, a process this pid namespace cannot name.
        let pgrp = out.lines().find_map(|l| l.strip_prefix("pgrp ")).and_then(|p| p.parse::<u32>().ok());
        assert!(pgrp.is_some_and(|p| p > 1), "{who:?}: {}", describe(&o));
        // The shell and python are of the group the signal went to; it ended them.
        assert!(!out.contains("NOT-REACHED"), "{who:?}: {}", describe(&o));
        assert_eq!(servers_of(&s), servers, "{who:?}: a server was signalled");
        let o = run_timed(who, &s, "echo after > f", &[]);
        assert_eq!(o.status.code(), Some(0), "{who:?}: {}", describe(&o));
        assert!(premounted(&o), "{who:?}: {}", describe(&o));
    }
}

/// A warm server killed at any moment of a run (premounting, exchanging directories, while the
/// command runs, reporting) loses nothing: the run's outcome is true of the workspace (status
/// 0 and the new content, or a failure and the old), and the next runs are served premounted.
#[test]
fn a_warm_server_killed_at_any_moment_of_a_run_loses_nothing() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-kill");
        put(who, &s, "f", "old\n");
        for i in 0..10u64 {
            warm_up(who, &s);
            let before = std::fs::read_to_string(s.ws.join("f")).unwrap();
            let child = spawn_timed(who, &s, &format!("echo {i} > f"), &[]);
            std::thread::sleep(Duration::from_micros(400 * i));
            for pid in servers_of(&s) {
                // SAFETY: a plain kill(2) of a process this test's runs started.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            let o = child.wait_with_output().unwrap();
            let now = std::fs::read_to_string(s.ws.join("f")).unwrap();
            match o.status.code() {
                Some(0) => assert_eq!(now, format!("{i}\n"), "{who:?} {i}: {}", describe(&o)),
                _ => assert_eq!(now, before, "{who:?} {i}: a failed run changed the workspace: {}", describe(&o)),
            }
        }
        warm_up(who, &s);
        let o = run_timed(who, &s, "echo again > f", &[]);
        assert!(premounted(&o), "{who:?}: {}", describe(&o));
        let o = run_timed(who, &s, "cat f", &[]);
        assert!(premounted(&o), "{who:?}: {}", describe(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "again\n", "{who:?}: {}", describe(&o));
    }
}

/// Whether a shell (the command of a sandbox, not the txbox or setpriv that asked for it) has
/// `marker` in its command line.
fn command_running(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else { return false };
        let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        args[0].ends_with("sh") && args.iter().any(|a| a.contains(marker))
    })
}

/// A client whose server does not answer in time (stopped, stalled) builds a sandbox of its
/// own on the run's directories. The server must not act on that request any more: exchanging
/// the directories for its premount, or mounting its own view on them, took the command's
/// writes from the run (the commit saw an empty upper, or a write failed with EPERM when the
/// next premount cleaned the work directory under the run's overlay). So the client stops the
/// server and waits until no view holds the run's work directory before it builds its own
/// (`warm::client::abandon`); a server that goes on all the same refuses a request whose client
/// has hung up (`server::hung_up`).
#[test]
fn a_server_that_answers_too_late_leaves_the_runs_directories_alone() {
    for who in identities() {
        let s = Scratch::new("warm-late");
        std::fs::write(s.ws.join("f"), "old\n").unwrap();
        std::fs::write(s.ws.join("flag"), "wait\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        warm_up(who, &s);
        let servers = servers_of(&s);
        let signal = |sig| {
            for &pid in &servers {
                // SAFETY: a plain kill(2) of a server this test's runs started.
                unsafe { libc::kill(pid as i32, sig) };
            }
        };
        signal(libc::SIGSTOP);
        let marker = format!("late-{}", std::process::id());
        let script = format!("until grep -q go flag; do sleep 0.05; done; echo new > f; : {marker}");
        let child = spawn_timed(who, &s, &script, &[]);
        // The client gives up on the stopped server and runs the command in its own sandbox.
        let deadline = Instant::now() + Duration::from_secs(120);
        while !command_running(&marker) {
            assert!(Instant::now() < deadline, "{who:?}: the command never ran");
            std::thread::sleep(Duration::from_millis(100));
        }
        // The client stopped the server that gave no answer (a zombie is gone but for its entry).
        let alive = |pid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|st| st.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while servers.iter().any(alive) {
            assert!(Instant::now() < deadline, "{who:?}: the stalled server {servers:?} lives on");
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(libc::SIGCONT);
        std::fs::write(s.ws.join("flag"), "go\n").unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(!served_warm(&o), "{who:?}: {}", describe(&o));
        assert_eq!(o.status.code(), Some(0), "{who:?}: {}", describe(&o));
        assert_eq!(std::fs::read_to_string(s.ws.join("f")).unwrap(), "new\n", "{who:?}: {}", describe(&o));
        // A new server serves the next runs.
        warm_up(who, &s);
    }
}

/// A client killed at any moment of its run (connecting, sending its request, while the
/// command runs) leaves the server fit: the request it never finished is refused before the
/// premounted view is touched (`reset_scratch` keeps it), and the next runs are served
/// premounted and see the workspace as it is. A killed run changes nothing.
#[test]
fn a_client_killed_at_any_moment_leaves_the_server_and_its_premount_fit() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-client-kill");
        put(who, &s, "f", "old\n");
        warm_up(who, &s);
        for i in 0..10u64 {
            let mut child = spawn_timed(who, &s, &format!("echo {i} > f; sleep 0.05; echo {i} > g"), &[]);
            std::thread::sleep(Duration::from_micros(500 * i));
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            // Killed before its commit point: nothing of it lands; after it: all of it.
            let (f, g) = (std::fs::read_to_string(s.ws.join("f")).unwrap(), std::fs::read_to_string(s.ws.join("g")));
            match g {
                Ok(g) => assert_eq!((f.as_str(), g.as_str()), (format!("{i}\n").as_str(), format!("{i}\n").as_str())),
                Err(_) => assert_eq!(f, "old\n", "{who:?} {i}: {}", describe(&o)),
            }
            let _ = std::fs::remove_file(s.ws.join("g"));
            put(who, &s, "f", "old\n");
            // Read and write: a view that is not the run's (none, or a stale one) fails either.
            let o = run_timed(who, &s, "cat f; ls; echo new > h", &[]);
            assert_eq!(o.status.code(), Some(0), "{who:?} {i}: {}", describe(&o));
            assert!(premounted(&o), "{who:?} {i}: {}", describe(&o));
            assert_eq!(String::from_utf8_lossy(&o.stdout), "old\nf\n", "{who:?} {i}: {}", describe(&o));
            std::fs::remove_file(s.ws.join("h")).unwrap();
        }
    }
}

/// Requests the server refuses before it gets to a view (a client that connects and leaves, a
/// malformed request, one of another binary's size) leave the premounted view in place: the
/// next run is served in it, and it is a writable view of the workspace as it is (were it
/// detached with the refused request's, the run would find the bare read-only workspace).
#[test]
fn a_request_refused_before_its_view_leaves_the_premount_in_place() {
    use std::io::Write;
    let s = Scratch::new("warm-early-refusal");
    std::fs::write(s.ws.join("f"), "old\n").unwrap();
    warm_up(As::Me, &s);
    let socket = only_socket(&s);
    let requests: [&[u8]; 3] = [b"", b"\x05\x00\x00\x00junk!", b"\xff\xff\xff\x7f"];
    for (i, bytes) in requests.iter().enumerate() {
        let mut c = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        c.write_all(bytes).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut c, &mut answer).unwrap();
        assert!(answer.is_empty() || answer.starts_with("refuse "), "{i}: {answer:?}");
        // The refusal gave the sandbox a new /tmp: the ruleset made ahead for the premounted
        // view is made anew with it, or the command could not write there.
        let o = run_timed(As::Me, &s, &format!("cat f; echo {i} > f && echo t > /tmp/t && cat /tmp/t"), &[]);
        assert_eq!(o.status.code(), Some(0), "{i}: {}", describe(&o));
        assert!(premounted(&o), "{i}: {}", describe(&o));
        assert_eq!(std::fs::read_to_string(s.ws.join("f")).unwrap(), format!("{i}\n"), "{}", describe(&o));
    }
}

/// A command handed the premounted view runs under the Landlock ruleset its server made while
/// it waited (`warm::server::ruleset_for`): it writes its workspace, `/tmp` and `/dev/shm`, run
/// after run, and not what only Landlock keeps it from, such as its own `/proc` files (the
/// mounts and permissions allow that write).
#[test]
fn a_premounted_command_is_confined_by_the_ruleset_made_ahead() {
    // The policy refuses a write to /proc it can see; this one it cannot, so the sandbox must.
    let script = "echo w > f && echo t > /tmp/t && echo s > /dev/shm/s && cat /tmp/t /dev/shm/s && python3 -c '
try:
    open(\"/proc/self/comm\", \"w\").write(\"x\")
    print(\"COMM-WRITTEN\")
except OSError as e:
    print(\"COMM-REFUSED\" if e.errno == 13 else e)'";
    for who in identities() {
        let s = Scratch::for_who(who, "warm-landlock");
        warm_up(who, &s);
        for i in 0..3 {
            let o = run_timed(who, &s, script, &[]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(o.status.code(), Some(0), "{who:?} {i}: {}", describe(&o));
            assert!(premounted(&o), "{who:?} {i}: {}", describe(&o));
            assert_eq!(out, "t\ns\nCOMM-REFUSED\n", "{who:?} {i}: {}", describe(&o));
        }
        // The same command in a sandbox of its own is confined the same way.
        let o = run_timed(who, &s, script, &[("TXBOX_WARM", "0")]);
        assert_eq!(String::from_utf8_lossy(&o.stdout), "t\ns\nCOMM-REFUSED\n", "{who:?}: {}", describe(&o));
    }
}

/// `txbox gc` removes what warm servers that are gone left beside their sockets (a killed
/// server's socket, lock, busy file and premount directories; every build names its servers
/// anew), and leaves a running server's, however old its files.
#[test]
fn gc_removes_what_gone_warm_servers_left_and_nothing_of_a_live_one() {
    let s = Scratch::new("warm-stale");
    warm_up(As::Me, &s);
    let warm = s.state.join("warm");
    std::fs::create_dir_all(warm.join("0123456789abcdef.sock.next/work/work")).unwrap();
    std::fs::create_dir_all(warm.join("0123456789abcdef.sock.next/upper")).unwrap();
    for f in ["0123456789abcdef.sock", "0123456789abcdef.sock.lock", "0123456789abcdef-2.sock.busy"] {
        std::fs::write(warm.join(f), "").unwrap();
    }
    // An hour old, all of them (a socket cannot be opened to set its times: by path).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let old = rustix::fs::Timespec { tv_sec: now - 3600, tv_nsec: 0 };
    let times = rustix::fs::Timestamps { last_access: old, last_modification: old };
    for e in std::fs::read_dir(&warm).unwrap() {
        let p = e.unwrap().path();
        rustix::fs::utimensat(rustix::fs::CWD, &p, &times, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).unwrap();
    }
    let before: Vec<_> = std::fs::read_dir(&warm).unwrap().map(|e| e.unwrap().file_name()).collect();
    let o = Command::new(binary())
        .args(["--json", "--state-dir"])
        .arg(&s.state)
        .arg("gc")
        .current_dir(&s.ws)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["warm_servers_removed"], 2, "{}", describe(&o));
    let after: Vec<_> = std::fs::read_dir(&warm).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(after.iter().all(|n| !n.to_string_lossy().starts_with("0123456789abcdef")), "{after:?}");
    assert_eq!(after.len(), before.len() - 4, "the live server's files stay: {before:?} -> {after:?}");
    let o = run_timed(As::Me, &s, "true", &[]);
    assert!(premounted(&o), "{}", describe(&o));
}

/// A server that leaves when idle takes its premounted view and the directories under it with
/// it: nothing of it is left in `STATE/warm` but its socket's lock and busy files.
#[test]
fn an_idle_server_leaves_no_premount_behind() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-premount-gone");
        let idle = [("TXBOX_WARM_IDLE", "1")];
        let deadline = Instant::now() + Duration::from_secs(10);
        while !premounted(&run_timed(who, &s, "true", &idle)) {
            assert!(Instant::now() < deadline, "{who:?}: never served premounted");
            std::thread::sleep(Duration::from_millis(50));
        }
        let next = |s: &Scratch| -> Vec<String> {
            std::fs::read_dir(s.state.join("warm"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".next"))
                .collect()
        };
        assert_eq!(next(&s).len(), 1, "{who:?}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !servers_of(&s).is_empty() {
            assert!(Instant::now() < deadline, "{who:?}: the server never left");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(next(&s), Vec::<String>::new(), "{who:?}");
    }
}

#[test]
fn a_warm_run_gets_the_callers_environment_directory_umask_and_limits() {
    for who in identities() {
        let s = Scratch::new("warm-env");
        std::fs::create_dir(s.ws.join("sub")).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        warm_up(who, &s);
        let script = "echo \"$TXBOX_TEST_VAR|$(pwd)|$(umask)|$(ulimit -n)|$(ulimit -s)\"";
        // The caller sets its umask and limits with shell builtins, then becomes txbox.
        let line = format!(
            "umask 027; ulimit -n 200; ulimit -s 4096; exec {} --state-dir {} run -C {} -c '{}'",
            binary().display(),
            s.state.display(),
            s.ws.display(),
            script.replace('\'', "'\\''")
        );
        let mut cmd = match who {
            As::Me => Command::new("bash"),
            As::User(uid) => {
                let mut c = Command::new("setpriv");
                c.args([
                    format!("--reuid={uid}"),
                    format!("--regid={uid}"),
                    "--clear-groups".into(),
                    "--".into(),
                    "bash".into(),
                ]);
                c.env("HOME", &s.root);
                c
            }
        };
        let o = cmd
            .arg("-c")
            .arg(&line)
            .env("TXBOX_TIMING", "1")
            .env("TXBOX_TEST_VAR", "a b ☃")
            .current_dir(s.ws.join("sub"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(served_warm(&o), "{}", describe(&o));
        let want = format!("a b ☃|{}|0027|200|4096\n", s.ws.join("sub").display());
        assert_eq!(String::from_utf8_lossy(&o.stdout), want, "{who:?}: {}", describe(&o));
        // stdin is the caller's.
        let mut cmd = txbox_command(who);
        if who != As::Me {
            cmd.env("HOME", &s.root);
        }
        let o = cmd
            .args(["--state-dir", s.state.to_str().unwrap(), "run", "--", "cat"])
            .env_remove("TXBOX_WARM")
            .env("TXBOX_TIMING", "1")
            .current_dir(&s.ws)
            .stdin(std::fs::File::open("/etc/hostname").unwrap())
            .output()
            .unwrap();
        assert!(served_warm(&o), "{who:?}: {}", describe(&o));
        assert_eq!(o.stdout, std::fs::read("/etc/hostname").unwrap(), "{who:?}: {}", describe(&o));
    }
}

#[test]
fn nothing_of_one_warm_transaction_reaches_the_next() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-clean");
        warm_up(who, &s);
        let marker = format!("txbox-warm-leftover-{}-{}", std::process::id(), s.root.display().to_string().len());
        // Scratch files, shared memory, SysV shared memory, and a background process in a
        // session of its own (so it is not the command's child).
        let dirty = format!(
            "echo t > /tmp/left; echo s > /dev/shm/left; ipcmk -M 4096 >/dev/null; \
             setsid sh -c 'sleep 300; :' {marker} >/dev/null 2>&1 < /dev/null & true"
        );
        let o = run_timed(who, &s, &dirty, &[]);
        assert!(served_warm(&o), "{}", describe(&o));
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        // The background process died with the transaction.
        let left = Command::new("pgrep").arg("-f").arg(&marker).output().unwrap();
        assert!(left.stdout.is_empty(), "{who:?}: process left behind: {}", String::from_utf8_lossy(&left.stdout));
        let next = "hostname; ls -A /tmp /dev/shm; ipcs -m | grep -c '^0x'; ps -e -o pid=,comm= | wc -l";
        let o = run_timed(who, &s, next, &[]);
        assert!(served_warm(&o), "{}", describe(&o));
        // The hostname every sandbox has (its UTS namespace is a copy of the server's first).
        assert_eq!(String::from_utf8_lossy(&o.stdout).lines().next(), Some("txbox"), "{}", describe(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(!out.contains("left"), "{who:?}: scratch files carried over: {out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines.get(lines.len().wrapping_sub(2)).map(|l| l.trim()),
            Some("0"),
            "{who:?}: SysV memory carried over: {out}"
        );
        // Only the shell pipeline itself (ps, wc, bash) and init remain.
        let procs: usize = out.lines().last().and_then(|l| l.trim().parse().ok()).unwrap_or(99);
        assert!(procs <= 5, "{who:?}: processes visible in the next transaction: {out}");
        // Nothing was committed by either.
        assert!(std::fs::read_dir(&s.ws).unwrap().next().is_none(), "{who:?}");
    }
}

#[test]
fn a_timeout_in_a_warm_sandbox_kills_every_process_and_rolls_back() {
    let s = Scratch::new("warm-timeout");
    warm_up(As::Me, &s);
    let marker = format!("txbox-warm-timeout-{}", std::process::id());
    let t0 = Instant::now();
    let o = Command::new(binary())
        .args(["--state-dir", s.state.to_str().unwrap(), "run", "--timeout", "0.5", "-c"])
        .arg(format!("echo partial > f; sh -c 'sleep 300; :' {marker} & sh -c 'sleep 300; :' {marker}"))
        .env("TXBOX_TIMING", "1")
        .current_dir(&s.ws)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(served_warm(&o), "{}", describe(&o));
    assert_eq!(o.status.code(), Some(124), "{}", describe(&o));
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    assert!(!s.ws.join("f").exists());
    let left = Command::new("pgrep").arg("-f").arg(&marker).output().unwrap();
    assert!(left.stdout.is_empty(), "process left behind: {}", String::from_utf8_lossy(&left.stdout));
    // The server is still fit for the next one.
    let o = run_timed(As::Me, &s, "echo ok > g", &[]);
    assert!(served_warm(&o), "{}", describe(&o));
    assert_eq!(std::fs::read_to_string(s.ws.join("g")).unwrap(), "ok\n");
}

/// The run's own transaction directory (not a spare, not a retired one) while it runs.
fn running_tx_work(s: &Scratch) -> Option<std::path::PathBuf> {
    std::fs::read_dir(s.state.join("tx"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| !n.to_string_lossy().starts_with('.')) && p.join("work").is_dir())
        .map(|p| p.join("work"))
}

/// Whether someone holds a `flock` on `path` now, as `/proc/locks` lists it. It does not take
/// the lock: a probe that held a server's `.busy` for a moment would make a client that looks
/// then find the server busy, and one that held its `.lock` would make a server starting then
/// leave.
fn held(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::metadata(path) else { return false };
    let id = format!("{:02x}:{:02x}:{}", rustix::fs::major(md.dev()), rustix::fs::minor(md.dev()), md.ino());
    let locks = std::fs::read_to_string("/proc/locks").unwrap();
    locks.lines().any(|l| !l.contains("->") && l.contains(" FLOCK ") && l.split_whitespace().any(|f| f == id))
}

#[test]
fn a_warm_server_holds_the_work_directory_until_its_overlay_is_gone() {
    // A later transaction may take this directory over (a spare) only once this lock is let
    // go, so that no two overlays ever share upper and work.
    let s = Scratch::new("warm-in-use");
    warm_up(As::Me, &s);
    let mut child = spawn_timed(As::Me, &s, "sleep 2", &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut locked = false;
    while !locked && Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        locked = running_tx_work(&s).is_some_and(|w| held(&w));
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    assert!(served_warm(&o), "{}", describe(&o));
    assert!(locked, "the work directory was never locked while the command ran");
    // Released once the server has let the view go (when idle): the directory is a spare now.
    let spare = s.state.join("tx/.spare-0/work");
    let deadline = Instant::now() + Duration::from_secs(10);
    while held(&spare) {
        assert!(Instant::now() < deadline, "the spare's work directory stayed locked");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The busy locks of the state directory's warm servers that a client holds now.
fn busy_slots(s: &Scratch) -> usize {
    let Ok(dir) = std::fs::read_dir(s.state.join("warm")) else { return 0 };
    dir.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".busy")).filter(|e| held(&e.path())).count()
}

/// An agent running commands side by side on one workspace: while one run holds the first
/// server, the next is built cold and starts a second server, which serves the runs that
/// overlap from then on; both commit. Before slots, every overlapping run was cold.
#[test]
fn overlapping_runs_on_one_workspace_are_each_served_warm() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-slots");
        warm_up(who, &s);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut second_warm = false;
        let mut round = 0;
        while !second_warm {
            assert!(Instant::now() < deadline, "{who:?}: an overlapping run was never served warm");
            round += 1;
            let long = spawn_timed(who, &s, &format!("sleep 1; echo long > long-{round}"), &[]);
            // Only once the first server is taken does the next run overlap it.
            while busy_slots(&s) == 0 {
                assert!(Instant::now() < deadline, "{who:?}: the long run never took a server");
                std::thread::sleep(Duration::from_millis(10));
            }
            let o = run_timed(who, &s, &format!("echo short > short-{round}"), &[]);
            assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
            second_warm = served_warm(&o);
            let l = long.wait_with_output().unwrap();
            assert!(served_warm(&l), "{}", describe(&l));
            assert_eq!(l.status.code(), Some(0), "{}", describe(&l));
            assert_eq!(std::fs::read_to_string(s.ws.join(format!("long-{round}"))).unwrap(), "long\n");
            assert_eq!(std::fs::read_to_string(s.ws.join(format!("short-{round}"))).unwrap(), "short\n");
            if !second_warm {
                // No second server yet, or one that retired for a reason outside this test (a
                // hidden path of the host came or went: other tests' state directories at the
                // mount root are hidden) and said so: the next round tries again.
                let err = String::from_utf8_lossy(&o.stderr);
                let retired = err.contains("the warm server is leaving") || err.contains("after this server started");
                assert!(
                    err.contains("cold (Absent)") || retired,
                    "{who:?}: the second slot was not started: {}",
                    describe(&o)
                );
            }
        }
        let second = s.state.join("warm").read_dir().unwrap().flatten().find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix("-1.sock").map(str::to_string)
        });
        let key = second.expect("no server in the second slot");
        // The first slot's server gone (idled out, retired), the second still serves: a run
        // goes on to it rather than building its own.
        let first = format!("__warm --socket {}/warm/{key}.sock ", s.state.display());
        assert!(Command::new("pkill").arg("-f").arg(&first).status().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Command::new("pgrep").arg("-f").arg(&first).status().unwrap().success() {
            assert!(Instant::now() < deadline, "the first slot's server did not go");
            std::thread::sleep(Duration::from_millis(20));
        }
        let o = run_timed(who, &s, "echo after > after", &[]);
        assert!(served_warm(&o), "{who:?}: the second slot's server was passed over: {}", describe(&o));
        assert_eq!(std::fs::read_to_string(s.ws.join("after")).unwrap(), "after\n");
    }
}

/// At the retention budget every commit evicts the oldest retained transaction into `gone/`.
/// After a warm run that is left to the server, which deletes it when idle (no collector per
/// commit): nothing piles up, and what is retained stays within the budget.
#[test]
fn evicted_data_is_deleted_by_the_warm_server_when_idle() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-evicted");
        warm_up(who, &s);
        let budget = [("TXBOX_RETAIN_COUNT", "2")];
        for i in 0..12 {
            let o = run_timed(who, &s, &format!("echo {i} > f{i}"), &budget);
            assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
            assert!(served_warm(&o), "{}", describe(&o));
            let waiting = std::fs::read_dir(s.state.join("gone")).unwrap().count();
            let bound = txbox_txn::state::RETIRED_BOUND as usize + 2;
            assert!(waiting <= bound, "{who:?}: {waiting} directories wait in gone/");
        }
        let retained = |s: &Scratch| {
            let kept = std::fs::read_dir(s.state.join("kept")).unwrap().flatten();
            kept.filter(|e| e.file_name().len() == 16 && e.path().is_dir()).count()
        };
        assert_eq!(retained(&s), 2, "{who:?}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::read_dir(s.state.join("gone")).unwrap().count() > 0 {
            assert!(Instant::now() < deadline, "{who:?}: gone/ was never emptied");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(std::fs::read_to_string(s.ws.join("f11")).unwrap(), "11\n");

        // Evicted data that waits for the server can hold a secret an overwrite displaced:
        // `txbox gc --purge-all` deletes it at once, as it deletes what is retained.
        let holding = |s: &Scratch| {
            let out = Command::new("grep").args(["-r", "-l", "SECRET-TOKEN"]).arg(&s.state).output().unwrap();
            String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect::<Vec<_>>()
        };
        // The secret is never on a command line (the audit log keeps those).
        for script in ["printf 'SECRET-%s\\n' TOKEN > s", "echo clean > s", "echo x > g1", "echo x > g2"] {
            let o = run_timed(who, &s, script, &budget);
            assert!(served_warm(&o), "{}", describe(&o));
        }
        // The server deletes `gone/` only after a second without work: it still waits now.
        let waiting = holding(&s);
        assert!(waiting.iter().any(|p| p.contains("/gone/")), "{who:?}: the secret was not evicted: {waiting:?}");
        let o = txbox(who, &s, &["gc", "--purge-all"]);
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        assert_eq!(holding(&s), Vec::<String>::new(), "{who:?}: purged data left behind");
    }
}

#[test]
fn a_secret_that_appears_after_the_server_started_is_still_hidden() {
    let s = Scratch::new("warm-secret");
    let home = s.root.join("home");
    std::fs::create_dir(&home).unwrap();
    let h = home.to_str().unwrap();
    let o = run_timed(As::Me, &s, "true", &[("HOME", h)]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !served_warm(&run_timed(As::Me, &s, "true", &[("HOME", h)])) {
        assert!(Instant::now() < deadline, "never served warm");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::create_dir(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY").unwrap();
    let o = run_timed(As::Me, &s, "cat ~/.ssh/id_ed25519", &[("HOME", h)]);
    assert_ne!(o.status.code(), Some(0), "{}", describe(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("PRIVATE"), "{}", describe(&o));
}

/// A secret hidden when the server started, then replaced on the host the way credential
/// helpers do it (a file renamed over it; a directory deleted and made again): the kernel
/// drops the mounts that covered the old ones, and the next run must not see the new ones.
#[test]
fn a_secret_replaced_after_the_server_started_is_still_hidden() {
    let s = Scratch::new("warm-replaced");
    let home = s.root.join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "OLD KEY").unwrap();
    std::fs::write(home.join(".git-credentials"), "https://old:OLDTOKEN@example.com\n").unwrap();
    let h = home.to_str().unwrap();
    warm_up_with_home(&s, h);
    let o = run_timed(As::Me, &s, "cat ~/.git-credentials ~/.ssh/id_ed25519", &[("HOME", h)]);
    assert!(served_warm(&o), "{}", describe(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("OLD"), "{}", describe(&o));

    std::fs::write(home.join(".git-credentials.lock"), "https://new:NEWTOKEN@example.com\n").unwrap();
    std::fs::rename(home.join(".git-credentials.lock"), home.join(".git-credentials")).unwrap();
    let o = run_timed(As::Me, &s, "cat ~/.git-credentials", &[("HOME", h)]);
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("NEWTOKEN"),
        "a file renamed over a secret showed: {}",
        describe(&o)
    );

    warm_up_with_home(&s, h);
    std::fs::remove_dir_all(home.join(".ssh")).unwrap();
    std::fs::create_dir(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "NEW KEY").unwrap();
    let o = run_timed(As::Me, &s, "cat ~/.ssh/id_ed25519", &[("HOME", h)]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("NEW KEY"), "a directory made again showed: {}", describe(&o));
}

/// Run with HOME until a run is served warm again (a server that stopped is replaced).
fn warm_up_with_home(s: &Scratch, home: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !served_warm(&run_timed(As::Me, s, "true", &[("HOME", home)])) {
        assert!(Instant::now() < deadline, "never served warm again");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn concurrent_runs_share_one_server_or_build_their_own() {
    let s = Scratch::new("warm-busy");
    warm_up(As::Me, &s);
    let runs: Vec<_> = (0..4)
        .map(|i| {
            let st = s.state.clone();
            let ws = s.ws.clone();
            std::thread::spawn(move || {
                Command::new(binary())
                    .args(["--state-dir", st.to_str().unwrap(), "run", "-c"])
                    .arg(format!("sleep 0.3; echo {i} > f{i}"))
                    .current_dir(&ws)
                    .stdin(Stdio::null())
                    .output()
                    .unwrap()
            })
        })
        .collect();
    for (i, r) in runs.into_iter().enumerate() {
        let o = r.join().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        assert_eq!(std::fs::read_to_string(s.ws.join(format!("f{i}"))).unwrap(), format!("{i}\n"));
    }
}

#[test]
fn a_server_goes_when_its_state_directory_goes() {
    let s = Scratch::new("warm-gone");
    warm_up(As::Me, &s);
    assert!(!servers_of(&s).is_empty(), "no server runs for {}", s.state.display());
    // The server may still be making the next run's view in it (`STATE/warm/*.next`), as
    // `rm -rf` racing it would find: remove until nothing is left.
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = std::fs::remove_dir_all(&s.state) {
        assert!(Instant::now() < deadline, "the state directory stays: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
    while !servers_of(&s).is_empty() {
        assert!(Instant::now() < deadline, "the server outlived its state directory: {:?}", servers_of(&s));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn warm_servers_can_be_turned_off() {
    let s = Scratch::new("warm-off");
    for _ in 0..3 {
        let o = run_timed(As::Me, &s, "true", &[("TXBOX_WARM", "0")]);
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        assert!(!served_warm(&o), "{}", describe(&o));
    }
    assert!(servers_of(&s).is_empty());
}

/// The socket of the one warm server of `s`.
fn only_socket(s: &Scratch) -> std::path::PathBuf {
    let socks: Vec<_> = std::fs::read_dir(s.state.join("warm"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    assert_eq!(socks.len(), 1, "{socks:?}");
    socks[0].clone()
}

/// A client that is not the binary that started the server (here: this test program) is not
/// served, and the server retires; another copy of txbox names a socket of its own.
#[test]
fn a_server_of_another_binary_does_not_serve_and_retires() {
    use std::os::fd::AsFd;
    let s = Scratch::new("warm-binary");
    warm_up(As::Me, &s);
    let socket = only_socket(&s);
    let spec = txbox_sandbox::SandboxSpec::new(
        s.ws.clone(),
        s.ws.clone(),
        s.ws.clone(),
        vec![std::ffi::OsString::from("true")],
    );
    let null = std::fs::File::open("/dev/null").unwrap();
    let r = txbox_sandbox::warm::claim(&socket, &spec, [null.as_fd(), null.as_fd(), null.as_fd()], None);
    match r {
        Err(txbox_sandbox::warm::NotWarm::Refused(why)) => assert!(why.contains("another txbox binary"), "{why}"),
        Err(other) => panic!("not refused for its binary: {other:?}"),
        Ok(_) => panic!("a server served a client of another binary"),
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !servers_of(&s).is_empty() {
        assert!(Instant::now() < deadline, "the server did not retire");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Another copy of the binary: its own socket, never the first one's.
    let copy = s.root.join("txbox-copy");
    std::fs::copy(binary(), &copy).unwrap();
    let o = Command::new(&copy)
        .env("TXBOX_TIMING", "1")
        .env_remove("TXBOX_WARM")
        .args(["--state-dir", s.state.to_str().unwrap(), "run", "-c", "true"])
        .current_dir(&s.ws)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("cold (Absent)"), "{}", describe(&o));
}

/// A client in a pid namespace below the host's (as every command of every sandbox is) is not
/// a txbox launcher: the server refuses it, whoever's user it runs as.
#[test]
fn a_client_inside_another_pid_namespace_is_refused() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-pidns");
        warm_up(who, &s);
        let mut cmd = match who {
            As::Me => {
                let mut c = Command::new("unshare");
                c.args(["--pid", "--fork", "--"]);
                c
            }
            As::User(uid) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}")).arg("--clear-groups");
                c.args(["--", "unshare", "--user", "--map-current-user", "--pid", "--fork", "--"]);
                c.env("HOME", &s.root);
                c
            }
        };
        let o = cmd
            .arg(binary())
            .args(["--state-dir", s.state.to_str().unwrap(), "run", "-c", "echo ran"])
            .env("TXBOX_TIMING", "1")
            .env_remove("TXBOX_WARM")
            .current_dir(&s.ws)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{who:?}: {}", describe(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("cold (Refused(") && err.contains("inside a sandbox"), "{who:?}: {}", describe(&o));
        // The launcher outside is still served.
        let o = run_timed(who, &s, "true", &[]);
        assert!(served_warm(&o), "{who:?}: {}", describe(&o));
    }
}

/// A secret whose directory did not exist either when the server started: the directory
/// appears first (nothing secret yet: served warm), then the secret in it.
#[test]
fn a_secret_in_a_directory_made_after_the_server_started_is_still_hidden() {
    let s = Scratch::new("warm-nested-secret");
    let home = s.root.join("home");
    std::fs::create_dir(&home).unwrap();
    let h = home.to_str().unwrap();
    warm_up_with_home(&s, h);
    std::fs::create_dir(home.join(".config")).unwrap();
    std::fs::write(home.join(".config/ordinary.toml"), "x = 1\n").unwrap();
    let o = run_timed(As::Me, &s, "cat ~/.config/ordinary.toml", &[("HOME", h)]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "x = 1\n", "{}", describe(&o));
    warm_up_with_home(&s, h);
    std::fs::create_dir(home.join(".config/gh")).unwrap();
    std::fs::write(home.join(".config/gh/hosts.yml"), "oauth_token: GHTOKEN\n").unwrap();
    let o = run_timed(As::Me, &s, "cat ~/.config/gh/hosts.yml", &[("HOME", h)]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("GHTOKEN"), "{}", describe(&o));
}

/// A scratch area below `/tmp` (a workspace, a state directory and a home beside it), for
/// what a warm sandbox shows of `/tmp`: the host's `/tmp` never, the workspace's view only.
struct UnderTmp {
    root: std::path::PathBuf,
    ws: std::path::PathBuf,
    state: std::path::PathBuf,
    home: std::path::PathBuf,
}

impl UnderTmp {
    fn new(name: &str, who: As) -> UnderTmp {
        use std::os::unix::fs::PermissionsExt;
        let root = std::path::PathBuf::from(format!("/tmp/txbox-it-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let t = UnderTmp { ws: root.join("ws"), state: root.join("state"), home: root.join("home"), root };
        for d in [&t.ws, &t.state, &t.home] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::set_permissions(&t.root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(t.home.join(".ssh")).unwrap();
        std::fs::write(t.home.join(".ssh/id_ed25519"), "OLDKEY").unwrap();
        std::fs::write(t.root.join("plain.txt"), "HOSTFILE").unwrap();
        std::fs::write(t.ws.join("seen.txt"), "WORKSPACE").unwrap();
        // A hidden path inside the workspace: the policy file (covered per run).
        std::fs::write(t.ws.join("policy.toml"), "version = 1 # POLICYTEXT\n").unwrap();
        if let As::User(uid) = who {
            assert!(Command::new("chown")
                .arg("-R")
                .arg(format!("{uid}:{uid}"))
                .arg(&t.root)
                .status()
                .unwrap()
                .success());
        }
        t
    }

    fn run(&self, who: As, script: &str) -> Output {
        let mut cmd = txbox_command(who);
        cmd.env_remove("TXBOX_WARM").env("TXBOX_TIMING", "1").env("HOME", &self.home);
        cmd.env("TXBOX_POLICY", self.ws.join("policy.toml"));
        cmd.arg("--state-dir").arg(&self.state).args(["run", "-c", script]);
        cmd.current_dir(&self.ws).stdin(Stdio::null()).output().unwrap()
    }
}

impl Drop for UnderTmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Warm servers do not watch hidden paths below `/tmp` and `/dev/shm` (3229b6e): that holds only
/// while nothing of the host shows there, before the first reset and after every one, with the
/// workspace itself below `/tmp` (its own hidden paths covered per run). A state directory, a
/// home and its secrets below `/tmp`, outside the workspace: none shows, not even a secret that
/// appears or is replaced after the server started; the same server goes on serving (the
/// watches are not lost on every reset); what a run leaves in `/tmp` is gone for the next.
#[test]
fn nothing_of_the_hosts_tmp_shows_in_a_warm_sandbox() {
    for who in identities() {
        let t = UnderTmp::new(&format!("tmp-secrets-{}", matches!(who, As::Me)), who);
        let r = t.root.display().to_string();
        let look = format!(
            "cat seen.txt; echo; cat policy.toml; cat $HOME/.ssh/id_ed25519 $HOME/.aws/credentials {r}/plain.txt \
             {r}/late.txt; ls -A /tmp {r} {r}/state $HOME /dev/shm; true"
        );
        let bad =
            ["OLDKEY", "NEWKEY", "POLICYTEXT", "HOSTFILE", "LATE", "AWSSECRET", "id_ed25519", "plain.txt", "left"];
        let check = |o: &Output, when: &str| {
            assert_eq!(o.status.code(), Some(0), "{who:?} {when}: {}", describe(o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.starts_with("WORKSPACE\n"), "{who:?} {when}: the workspace below /tmp: {}", describe(o));
            for b in bad {
                assert!(!out.contains(b), "{who:?} {when}: {b} showed: {}", describe(o));
            }
        };
        // The first run is cold and starts the server; the next is its first transaction, on
        // the sandbox as built (before any reset).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let o = t.run(who, &look);
            check(&o, "before the server");
            if served_warm(&o) {
                break;
            }
            assert!(Instant::now() < deadline, "{who:?}: never served warm: {}", describe(&o));
            std::thread::sleep(Duration::from_millis(50));
        }
        // A run writes where the host's secrets would be, in its own /tmp.
        let o = t
            .run(who, &format!("mkdir -p {r}/home/.ssh && echo left > {r}/home/.ssh/id_ed25519 && echo left > /tmp/x"));
        assert!(served_warm(&o), "{who:?}: {}", describe(&o));
        // The host changes below /tmp: a secret appears, one is replaced, a file appears.
        std::fs::create_dir(t.home.join(".aws")).unwrap();
        std::fs::write(t.home.join(".aws/credentials"), "AWSSECRET").unwrap();
        std::fs::write(t.home.join(".ssh/new"), "NEWKEY").unwrap();
        std::fs::rename(t.home.join(".ssh/new"), t.home.join(".ssh/id_ed25519")).unwrap();
        std::fs::write(t.root.join("late.txt"), "LATE").unwrap();
        for i in 0..3 {
            let o = t.run(who, &look);
            check(&o, &format!("after the host changed, run {i}"));
            assert!(served_warm(&o), "{who:?}: the server stopped serving: {}", describe(&o));
        }
    }
}

/// The warm servers of the state directory alive now (their `.lock` held), by socket name.
fn live_slots(state: &std::path::Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(state.join("warm")) else { return Vec::new() };
    let mut v: Vec<String> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".lock")).map(str::to_string))
        .filter(|n| held(&state.join("warm").join(format!("{n}.lock"))))
        .collect();
    v.sort();
    v
}

/// Every `.busy` file of the state directory's warm servers has a server's `.lock` beside it:
/// a run that looks at every slot leaves nothing behind for a slot that never had a server.
fn busy_files_without_a_server(state: &std::path::Path) -> Vec<String> {
    let warm = state.join("warm");
    let Ok(dir) = std::fs::read_dir(&warm) else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".busy")).map(str::to_string))
        .filter(|sock| !warm.join(format!("{sock}.lock")).exists())
        .collect()
}

/// Many runs at once on one workspace, again and again: never more servers than slots, and
/// every run commits. A second slot's server, once the runs stop overlapping, leaves after
/// its idle time while the first one, serving one client at a time, stays. The first run,
/// finding no server in any slot, leaves no file behind for the slots it looked at.
#[test]
fn overlapping_runs_start_at_most_the_slots_and_idle_extra_servers_leave() {
    for who in identities() {
        let s = Scratch::for_who(who, "warm-bounded");
        // A first server that leaves at once; then a run finds no server in any slot.
        let o = run_timed(who, &s, "true", &[("TXBOX_WARM_IDLE", "0")]);
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_dir(s.state.join("warm")).is_ok_and(|d| d.count() > 0) || !live_slots(&s.state).is_empty()
        {
            assert!(Instant::now() < deadline, "{who:?}: the first server never left");
            std::thread::sleep(Duration::from_millis(50));
        }
        let idle = [("TXBOX_WARM_IDLE", "4")];
        let o = run_timed(who, &s, "true", &idle);
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("cold (Absent)"), "{who:?}: {}", describe(&o));
        assert_eq!(busy_files_without_a_server(&s.state), Vec::<String>::new(), "{who:?}");
        let mut most = 0;
        for round in 0..3 {
            let runs: Vec<_> =
                (0..8).map(|i| spawn_timed(who, &s, &format!("sleep 0.5; echo {i} > f{round}-{i}"), &idle)).collect();
            for (i, r) in runs.into_iter().enumerate() {
                let o = r.wait_with_output().unwrap();
                assert_eq!(o.status.code(), Some(0), "{who:?}: {}", describe(&o));
                assert_eq!(std::fs::read_to_string(s.ws.join(format!("f{round}-{i}"))).unwrap(), format!("{i}\n"));
                most = most.max(live_slots(&s.state).len());
            }
            // Servers started by the last runs of the round are on their way.
            std::thread::sleep(Duration::from_millis(300));
            most = most.max(live_slots(&s.state).len());
        }
        assert!(most >= 2, "{who:?}: overlapping runs never got a second server");
        assert!(most <= txbox_sandbox::warm::SLOTS, "{who:?}: {most} servers for one sandbox");
        // One client at a time, for longer than the idle time: the first free slot serves it.
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(8) {
            let o = run_timed(who, &s, "true", &idle);
            assert!(served_warm(&o), "{who:?}: {}", describe(&o));
            std::thread::sleep(Duration::from_millis(200));
        }
        let live = live_slots(&s.state);
        assert_eq!(live.len(), 1, "{who:?}: idle extra servers stayed: {live:?}");
    }
}
