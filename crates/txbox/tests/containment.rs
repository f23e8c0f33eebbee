//! The escape suite: attempts made by programs no policy can read (Python scripts written into
//! the workspace), each of which must fail inside the sandbox and leave host and workspace
//! unchanged. Plus the limits: output flood, memory hog, fork bomb, disk fill, timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;

use common::*;

/// Each attempt prints `ESCAPED` only if the forbidden thing worked.
const ATTEMPTS: &[(&str, &str)] = &[
    ("delete_outside", "import shutil\ntry:\n    shutil.rmtree(SENTINEL)\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("write_outside", "try:\n    open(SENTINEL + '/new', 'w').write('x')\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("write_etc", "try:\n    open('/etc/txbox-escape', 'w').write('x')\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("read_secret", "import os\ntry:\n    d = open(os.path.expanduser('~/.ssh/id_test')).read()\n    print('ESCAPED' if 'SECRET' in d else 'blocked')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("read_shadow", "try:\n    d = open('/etc/shadow').read()\n    print('ESCAPED' if 'root:' in d else 'blocked')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("connect_host_loopback", "import socket\ntry:\n    socket.create_connection(('127.0.0.1', PORT), timeout=2)\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("kill_host_process", "import os, signal\ntry:\n    os.kill(VICTIM, signal.SIGKILL)\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("mount", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)\nprint('ESCAPED' if r == 0 else 'blocked %d' % ctypes.get_errno())\n"),
    ("unshare_userns", "import os\ntry:\n    os.unshare(os.CLONE_NEWUSER)\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("io_uring", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nparams = ctypes.create_string_buffer(120)\nr = libc.syscall(425, 4, params)\nprint('ESCAPED' if r >= 0 else 'blocked %d' % ctypes.get_errno())\n"),
    ("load_module", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.syscall(313, 0, b'', 0)\nprint('ESCAPED' if r == 0 or ctypes.get_errno() not in (1, 13) else 'blocked %d' % ctypes.get_errno())\n"),
    ("sysrq", "try:\n    open('/proc/sysrq-trigger', 'w').write('h')\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("device_node", "import os, stat\ntry:\n    os.mknod('sda', stat.S_IFBLK | 0o600, os.makedev(8, 0))\n    open('sda', 'rb').read(512)\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("ptrace_host", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.ptrace(16, VICTIM, 0, 0)\nprint('ESCAPED' if r == 0 else 'blocked %d' % ctypes.get_errno())\n"),
    ("symlink_escape", "import os\ntry:\n    os.symlink(SENTINEL, 'out')\n    open('out/precious', 'w').write('pwned')\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("proc_root_escape", "try:\n    open('/proc/1/root' + SENTINEL + '/precious', 'w').write('pwned')\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("dotdot_escape", "import os\ntry:\n    open(os.path.relpath(SENTINEL + '/dotdot', os.getcwd()), 'w').write('x')\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("tamper_policy", "try:\n    open(POLICY, 'w').write('version = 1\\n# everything allowed now\\n')\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
    ("tamper_state", "import os\ntry:\n    open(STATE + '/audit.log', 'a').write('forged\\n')\n    print('ESCAPED')\nexcept Exception as e:\n    print('blocked', e)\n"),
];

#[test]
fn escape_attempts_fail_inside_the_sandbox() {
    for who in identities() {
        let s = Scratch::new("escape");
        let sentinel = s.root.join("sentinel");
        std::fs::create_dir_all(&sentinel).unwrap();
        std::fs::write(sentinel.join("precious"), "do not touch\n").unwrap();
        let home = s.root.join("home");
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".ssh/id_test"), "SECRET KEY\n").unwrap();
        // The package tools' default locations, as on a host where they ran: otherwise txbox
        // makes them, empty, for its caches (tests/caches.rs), and every change shows here.
        for d in [".npm", ".cache/pip", ".cache/go-build", ".cargo/registry", ".cargo/git", "go/pkg/mod"] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        std::fs::write(s.ws.join("policy.toml"), "version = 1\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut victim = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let before = digest(&s.root, &["state", "xdg"]);
        for (name, body) in ATTEMPTS {
            let script = format!(
                "SENTINEL = {:?}\nSTATE = {:?}\nPOLICY = {:?}\nPORT = {port}\nVICTIM = {}\n{body}",
                sentinel.to_str().unwrap(),
                s.state.to_str().unwrap(),
                s.ws.join("policy.toml").to_str().unwrap(),
                victim.id()
            );
            std::fs::write(s.ws.join(format!("{name}.py")), script).unwrap();
            if let As::User(uid) = who {
                s.chown(uid);
            }
            let ws = s.ws.to_str().unwrap().to_string();
            let mut cmd = txbox_command(who);
            let out = cmd
                .args(["--state-dir", s.state.to_str().unwrap(), "--json", "run", "-C", &ws, "--timeout", "20"])
                .args(["--policy", s.ws.join("policy.toml").to_str().unwrap(), "--", "python3"])
                .arg(format!("{name}.py"))
                .env("HOME", &home)
                // The key's directory (txbox's own, made on first use) outside the digests.
                .env("XDG_STATE_HOME", s.root.join("xdg"))
                .output()
                .unwrap();
            let j: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{name}: {}", describe(&out)));
            let printed = j["stdout"].as_str().unwrap_or_default();
            assert!(printed.contains("blocked") && !printed.contains("ESCAPED"), "{who:?} {name}: {j}");
            let _ = std::fs::remove_file(s.ws.join(format!("{name}.py")));
            let _ = std::fs::remove_file(s.ws.join("out"));
        }
        assert!(victim.try_wait().unwrap().is_none(), "a host process was killed from inside");
        victim.kill().unwrap();
        let _ = victim.wait();
        assert!(!std::path::Path::new("/etc/txbox-escape").exists());
        assert_eq!(
            std::fs::read_to_string(s.ws.join("policy.toml")).unwrap(),
            "version = 1\n",
            "the policy file was changed"
        );
        let after = digest(&s.root, &["state", "xdg"]);
        assert!(before == after, "{who:?}: something outside the sandbox changed:\n{}", diff(&before, &after));
        let audit = std::fs::read_to_string(s.state.join("audit.log")).unwrap();
        assert!(!audit.contains("forged"));
        // As the state directory's owner, with its key.
        let verify = txbox_command(who)
            .env("XDG_STATE_HOME", s.root.join("xdg"))
            .args(["--state-dir", s.state.to_str().unwrap(), "log", "--verify"])
            .output()
            .unwrap();
        assert_eq!(verify.status.code(), Some(0), "{}", describe(&verify));
        drop(listener);
    }
}

fn run_limited(s: &Scratch, args: &[&str], script: &str) -> serde_json::Value {
    std::fs::write(s.ws.join("t.py"), script).unwrap();
    let ws = s.ws.to_str().unwrap().to_string();
    let mut all = vec!["--json", "run", "-C", &ws];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", "python3", "t.py"]);
    let started = std::time::Instant::now();
    let out = txbox(As::Me, s, &all);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
    assert!(started.elapsed().as_secs() < 30, "the limit did not stop the command promptly: {j}");
    assert_eq!(j["outcome"], "rolled_back", "{j}");
    assert_ne!(out.status.code(), Some(0));
    j
}

#[test]
fn limits_stop_kill_and_roll_back() {
    let s = Scratch::new("limits");
    std::fs::write(s.ws.join("keep"), "k").unwrap();
    let j = run_limited(
        &s,
        &["--max-output", "100K"],
        "import sys\nopen('junk','w').write('x')\nwhile True: sys.stdout.write('y' * 4096)\n",
    );
    assert_eq!((j["limit_exceeded"].as_str(), j["rollback_reason"].as_str()), (Some("output"), Some("limit")), "{j}");
    assert!(j["stdout"].as_str().unwrap().len() <= 100 * 1024 && j["stdout_truncated"] == true);
    let marker = format!("txbox-forkbomb-{}", std::process::id());
    if txbox_sandbox::cgroup::probe().limits_supported {
        let j = run_limited(
            &s,
            &["--memory", "64M"],
            "x = bytearray(1 << 30)\nfor i in range(0, len(x), 4096): x[i] = 1\n",
        );
        assert_eq!(j["limit_exceeded"], "memory", "{j}");
        let j = run_limited(
            &s,
            &["--pids", "32", "--timeout", "20"],
            &format!("import os, time, sys\nsys.argv[0] = '{marker}'\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"),
        );
        assert_eq!(j["limit_exceeded"], "pids", "{j}");
    } else {
        eprintln!("SKIP --memory/--pids: this host lets this user create no cgroup (see `txbox doctor`)");
        let ws = s.ws.to_str().unwrap().to_string();
        let out = txbox(As::Me, &s, &["run", "-C", &ws, "--memory", "64M", "--", "true"]);
        assert_eq!(
            out.status.code(),
            Some(125),
            "a limit that cannot be enforced must refuse the run: {}",
            describe(&out)
        );
    }
    let j = run_limited(
        &s,
        &["--max-write", "20M"],
        "f = open('big', 'wb')\nfor _ in range(200): f.write(bytes(1 << 20))\n",
    );
    assert_eq!(j["limit_exceeded"], "write", "{j}");
    let j = run_limited(&s, &["--cpu", "1"], "while True: pass\n");
    assert_eq!(j["limit_exceeded"], "cpu", "{j}");
    let j = run_limited(&s, &["--timeout", "1"], "import time\ntime.sleep(100)\n");
    assert_eq!((j["timed_out"].as_bool(), j["exit_code"].as_i64()), (Some(true), Some(124)), "{j}");
    // Nothing of any of them reached the workspace, and nothing is left running.
    let mut names: Vec<String> =
        std::fs::read_dir(&s.ws).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["keep", "t.py"]);
    let mut ps = String::new();
    std::process::Command::new("ps")
        .arg("ax")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
        .stdout
        .unwrap()
        .read_to_string(&mut ps)
        .unwrap();
    let survivors: Vec<&str> = ps.lines().filter(|l| l.contains("python3 t.py") || l.contains(&marker)).collect();
    assert!(survivors.is_empty(), "processes survived: {survivors:?}");
}

#[test]
fn network_is_loopback_only_unless_host_is_asked() {
    let s = Scratch::new("net");
    let (_, j) = run_json(As::Me, &s, "ls /sys/class/net; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
    assert_eq!(j["stdout"], "lo\nlo\n", "{j}");
    let ws = s.ws.to_str().unwrap().to_string();
    let out = txbox(As::Me, &s, &["--json", "run", "-C", &ws, "--network", "host", "-c", "ls /sys/class/net | wc -l"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let n: u32 = j["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(n >= 1, "{j}");
}
