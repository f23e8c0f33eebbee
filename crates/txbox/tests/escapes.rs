//! The escape suite, part two (issue #13): the sandbox's edge. Host unix sockets (every way to
//! name one, every call that reaches one, races included), the caller's terminal, descriptors
//! the caller left open, and secrets outside the caller's short list. Each class as root and
//! unprivileged, cold and warm (which one ran is asserted from `TXBOX_TIMING`), and each
//! attempt also made natively first where that shows the attempt itself works.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use std::os::linux::net::SocketAddrExt;

/// Cold (`TXBOX_WARM=0`) or warm (a server already up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Cold,
    Warm,
}

const MODES: [Mode; 2] = [Mode::Cold, Mode::Warm];

/// `txbox run ARGS` as `who` in `s`, with timing on, stdin from /dev/null.
fn run(who: As, s: &Scratch, mode: Mode, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = txbox_command(who);
    cmd.env("HOME", s.root.join("home")).env("XDG_STATE_HOME", s.root.join("xdg")).env("TXBOX_TIMING", "1");
    match mode {
        Mode::Cold => cmd.env("TXBOX_WARM", "0"),
        Mode::Warm => cmd.env_remove("TXBOX_WARM"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.arg("--state-dir").arg(&s.state).arg("run").args(args);
    cmd.current_dir(&s.ws).stdin(Stdio::null()).output().unwrap()
}

/// Which sandbox ran, from the timing line.
fn ran(o: &Output) -> Mode {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("txbox sandbox: "), "no timing line: {}", describe(o));
    if err.contains("txbox sandbox: warm") {
        Mode::Warm
    } else {
        Mode::Cold
    }
}

/// Make `s` a scratch area `who` may use, with a home.
fn scratch(who: As, name: &str) -> Scratch {
    let s = Scratch::new(name);
    std::fs::create_dir_all(s.root.join("home")).unwrap();
    if let As::User(uid) = who {
        s.chown(uid);
    }
    s
}

/// Until a run is served warm (the first starts the server).
fn warm_up(who: As, s: &Scratch) {
    warm_up_with(who, s, &[], &[]);
}

/// Until a run with these flags and this environment (which choose the sandbox) is served warm.
fn warm_up_with(who: As, s: &Scratch, flags: &[&str], env: &[(&str, &str)]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let args: Vec<&str> = flags.iter().copied().chain(["--", "true"]).collect();
    loop {
        let o = run(who, s, Mode::Warm, env, &args);
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        if ran(&o) == Mode::Warm {
            return;
        }
        assert!(Instant::now() < deadline, "never served warm: {}", describe(&o));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run `args` in `mode`, warming up first for a warm run, and check that mode ran.
fn run_in(who: As, s: &Scratch, mode: Mode, env: &[(&str, &str)], args: &[&str]) -> Output {
    if mode == Mode::Warm {
        let flags = args.iter().position(|a| *a == "--").map_or(&[][..], |i| &args[..i]);
        warm_up_with(who, s, flags, env);
    }
    let o = run(who, s, mode, env, args);
    assert_eq!(ran(&o), mode, "{who:?}: {}", describe(&o));
    o
}

// ---------------------------------------------------------------------------------------------
// Host unix sockets (#13.2)
// ---------------------------------------------------------------------------------------------

/// Host servers: a stream, a seqpacket and a datagram socket in each place, world-connectable,
/// answering "HOST"; every datagram received is logged.
const HOST_SERVERS: &str = r#"
import os, select, socket, sys
log = open(sys.argv[1], "a")
socks = []
for spec in sys.argv[2:]:
    kind, path = spec.split("=", 1)
    t = {"stream": socket.SOCK_STREAM, "seqpacket": socket.SOCK_SEQPACKET, "dgram": socket.SOCK_DGRAM}[kind]
    s = socket.socket(socket.AF_UNIX, t)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    s.bind(path)
    os.chmod(path, 0o777)
    if t != socket.SOCK_DGRAM:
        s.listen(128)
    socks.append((s, t))
print("ready", flush=True)
while True:
    r, _, _ = select.select([s for s, _ in socks], [], [])
    for s in r:
        t = dict((id(a), b) for a, b in socks)[id(s)]
        if t == socket.SOCK_DGRAM:
            log.write(repr(s.recv(256)) + "\n")
            log.flush()
        else:
            c, _ = s.accept()
            try:
                c.send(b"HOST")
            except OSError:
                pass
            c.close()
"#;

struct HostServers {
    child: Child,
    log: PathBuf,
}

impl HostServers {
    fn start(dir: &Path, sockets: &[(&str, PathBuf)]) -> HostServers {
        let log = dir.join("host-datagrams.log");
        std::fs::write(&log, "").unwrap();
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(HOST_SERVERS).arg(&log);
        for (kind, p) in sockets {
            cmd.arg(format!("{kind}={}", p.display()));
        }
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "host servers did not start");
        HostServers { child, log }
    }

    fn datagrams(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for HostServers {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run the socket client (tests/escape_sockets.py) with `cfg` as `who`: inside txbox, or
/// natively (`mode` None) in the workspace.
fn sockets_client(who: As, s: &Scratch, mode: Option<Mode>, cfg: &serde_json::Value) -> BTreeMap<String, String> {
    let script = s.root.join("escape_sockets.py");
    let cfg = cfg.to_string();
    let o = match mode {
        Some(m) => {
            let o = run_in(who, s, m, &[], &["--", "python3", script.to_str().unwrap(), &cfg]);
            // The client exits 3 so that nothing it made (links, sockets) is committed.
            assert_eq!(o.status.code(), Some(3), "{who:?} {m:?}: {}", describe(&o));
            o
        }
        None => {
            let dir = s.root.join("native");
            std::fs::create_dir_all(&dir).unwrap();
            if let As::User(uid) = who {
                std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).unwrap();
            }
            let mut cmd = match who {
                As::Me => Command::new("python3"),
                As::User(uid) => {
                    let mut c = Command::new("setpriv");
                    c.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}")).arg("--clear-groups");
                    // Not through $PATH: root's may name an interpreter in root's home.
                    c.arg("--").arg(if Path::new("/usr/bin/python3").exists() {
                        "/usr/bin/python3"
                    } else {
                        "python3"
                    });
                    c
                }
            };
            cmd.arg(&script).arg(&cfg).current_dir(&dir).output().unwrap()
        }
    };
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{who:?} {mode:?}: no results ({e}): {}", describe(&o)))
}

#[test]
fn no_host_unix_socket_is_reachable_and_the_commands_own_are() {
    for who in identities() {
        let s = scratch(who, "sockets");
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/escape_sockets.py"),
            s.root.join("escape_sockets.py"),
        )
        .unwrap();
        // Another workspace's warm server: its socket lies in that workspace's state directory.
        let other = scratch(who, "sockets-other");
        warm_up(who, &other);
        let others: Vec<String> = std::fs::read_dir(other.state.join("warm"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "sock"))
            .map(|p| p.display().to_string())
            .collect();
        assert!(!others.is_empty());
        // Host sockets where they usually are: a shared directory, the workspace itself (a
        // socket bound on the host in the lower layer), the caller's home.
        let places = [("vartmp", s.root.clone()), ("lower", s.ws.clone()), ("home", s.root.join("home"))];
        let mut sockets = Vec::new();
        let mut hosts = serde_json::Map::new();
        let mut dgrams = serde_json::Map::new();
        for (place, dir) in &places {
            for kind in ["stream", "seqpacket", "dgram"] {
                let p = dir.join(format!("host-{kind}.sock"));
                hosts.insert(format!("{place}-{kind}"), p.display().to_string().into());
                if kind == "dgram" {
                    dgrams.insert(format!("{place}-{kind}"), p.display().to_string().into());
                }
                sockets.push((kind, p));
            }
        }
        let servers = HostServers::start(&s.root, &sockets);
        let race = s.root.join("host-stream.sock").display().to_string();
        let race_dgram = s.root.join("host-dgram.sock").display().to_string();
        let cfg = serde_json::json!({
            "hosts": hosts, "dgrams": dgrams, "other": others, "race": race, "race_dgram": race_dgram,
        });

        // Natively, each of these reaches the host: what the sandbox refuses is real.
        let native = sockets_client(who, &s, None, &serde_json::json!({"hosts": hosts, "dgrams": {}, "other": others}));
        for name in ["vartmp-stream:absolute", "vartmp-seqpacket:proc-self-root", "home-stream:symlink-in-workspace"] {
            assert_eq!(native[name], "OK HOST", "{who:?}: the native control failed: {native:?}");
        }
        assert!(native["other-warm-server-0"].starts_with("OK"), "{who:?}: {native:?}");
        std::fs::write(&servers.log, "").unwrap();

        for mode in MODES {
            let got = sockets_client(who, &s, Some(mode), &cfg);
            let mut failures = Vec::new();
            for (name, result) in &got {
                let ok = if name.starts_with("own:") {
                    result.starts_with("OK") && !result.contains("HOST")
                } else if name.starts_with("race:address") {
                    result.starts_with("HOST 0 ") && !result.contains("own 0 ")
                } else if name.starts_with("race:") {
                    true
                } else {
                    // Refused: EACCES by the guard, or ECONNREFUSED where the kernel itself
                    // finds nothing (a host socket in the workspace's lower layer is not
                    // reachable through the overlay), ELOOP for another process's magic link.
                    result == "REFUSED 13" || result == "REFUSED 111" || result == "REFUSED 40"
                };
                if !ok {
                    failures.push(format!("{name}: {result}"));
                }
            }
            assert!(failures.is_empty(), "{who:?} {mode:?}:\n{}\nall: {got:#?}", failures.join("\n"));
            // Every way to a host socket was tried, and its own servers answered.
            assert!(got.len() > 70, "{who:?} {mode:?}: only {} attempts: {got:#?}", got.len());
            assert_eq!(got["own:workspace-stream"], "OK OWN");
            assert_eq!(got["own:dgram-sendto-sendmsg"], "OK own-datagram+own-msg");
            assert_eq!(got["own:scm-rights"], "OK passed");
            assert_eq!(got["own:tcp-loopback"], "OK TCP");
            assert_eq!(got["vartmp-stream:absolute"], "REFUSED 13", "the guard's own answer");
            assert_eq!(servers.datagrams(), "", "{who:?} {mode:?}: a datagram reached the host");
        }
    }
}

/// With the host's network shared, TCP reaches the host (as asked), abstract unix sockets do
/// not (the host's D-Bus and X11 listen there).
#[test]
fn host_network_reaches_tcp_but_not_abstract_sockets() {
    let s = scratch(As::Me, "sockets-hostnet");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let name = format!("txbox-test-abstract-{}", std::process::id());
    let abs = std::os::unix::net::UnixListener::bind_addr(
        &std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap(),
    )
    .unwrap();
    std::thread::spawn(move || while tcp.accept().is_ok() {});
    let script = format!(
        "import socket\n\
         socket.create_connection(('127.0.0.1', {port}), timeout=5)\n\
         c = socket.socket(socket.AF_UNIX)\n\
         try:\n    c.connect('\\0{name}')\n    print('ABSTRACT REACHED')\n\
         except OSError as e:\n    print('abstract refused', e.errno)\n"
    );
    for mode in MODES {
        let o = run_in(As::Me, &s, mode, &[], &["--network", "host", "--", "python3", "-c", &script]);
        assert_eq!(o.status.code(), Some(0), "{mode:?}: {}", describe(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "abstract refused 13\n", "{mode:?}: {}", describe(&o));
    }
    drop(abs);
}

// ---------------------------------------------------------------------------------------------
// Descriptors the caller left open (#13.5)
// ---------------------------------------------------------------------------------------------

#[test]
fn descriptors_the_caller_left_open_do_not_reach_the_command() {
    for who in identities() {
        let s = scratch(who, "fds");
        let secret_dir = s.root.join("hidden-dir");
        std::fs::create_dir_all(&secret_dir).unwrap();
        std::fs::write(secret_dir.join("inside"), "SECRET").unwrap();
        let host_file = s.root.join("host-file");
        std::fs::write(&host_file, "untouched\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let probe = "import os\n\
             for n in (5, 200, 1500):\n\
             \x20   for how, f in (('fstat', lambda: os.fstat(n)), ('list', lambda: os.listdir('/proc/self/fd/%d' % n)),\n\
             \x20                  ('write', lambda: os.write(os.open('/proc/self/fd/%d' % n, os.O_WRONLY | os.O_APPEND), b'x'))):\n\
             \x20       try:\n\
             \x20           f()\n\
             \x20           print('ESCAPED', how, n)\n\
             \x20       except OSError as e:\n\
             \x20           print('closed', how, n, e.errno)\n\
             print('fds', sorted(int(x) for x in os.listdir('/proc/self/fd')))\n";
        for mode in MODES {
            if mode == Mode::Warm {
                warm_up(who, &s);
            }
            // The caller opens them, then becomes txbox.
            let line = format!(
                "exec 5<{dir} 200>>{file} 1500<{dir}; exec {bin} --state-dir {state} run -- python3 -c \"$PROBE\"",
                dir = secret_dir.display(),
                file = host_file.display(),
                bin = binary().display(),
                state = s.state.display()
            );
            let mut cmd = match who {
                As::Me => Command::new("bash"),
                As::User(uid) => {
                    let mut c = Command::new("setpriv");
                    c.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}")).arg("--clear-groups");
                    c.arg("--").arg("bash");
                    c
                }
            };
            cmd.arg("-c").arg(&line).env("PROBE", probe).env("HOME", s.root.join("home"));
            cmd.env("TXBOX_TIMING", "1").env("XDG_STATE_HOME", s.root.join("xdg"));
            match mode {
                Mode::Cold => cmd.env("TXBOX_WARM", "0"),
                Mode::Warm => cmd.env_remove("TXBOX_WARM"),
            };
            let o = cmd.current_dir(&s.ws).stdin(Stdio::null()).output().unwrap();
            assert_eq!(ran(&o), mode, "{}", describe(&o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(!out.contains("ESCAPED"), "{who:?} {mode:?}: {}", describe(&o));
            assert_eq!(out.matches("closed").count(), 9, "{who:?} {mode:?}: {}", describe(&o));
            // 0-2, and the directory listdir itself opened.
            assert!(out.contains("fds [0, 1, 2, 3]"), "{who:?} {mode:?}: {}", describe(&o));
            assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "untouched\n");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The caller's terminal (#13.4)
// ---------------------------------------------------------------------------------------------

/// Run `line` (a shell command line) in a real terminal made by `script`, as `who`, with
/// `input` typed into it. Returns what the terminal showed.
fn in_terminal(who: As, s: &Scratch, line: &str, input: &str) -> String {
    let mut cmd = match who {
        As::Me => Command::new("script"),
        As::User(uid) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}")).arg("--clear-groups");
            c.arg("--").arg("script");
            c
        }
    };
    cmd.args(["-qefc", line, "/dev/null"]).env("HOME", s.root.join("home"));
    cmd.env("XDG_STATE_HOME", s.root.join("xdg")).env("TXBOX_TIMING", "1").env_remove("TXBOX_WARM");
    let mut child = cmd.current_dir(&s.ws).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Typed after the command started: a shell in a terminal reads line by line.
    std::thread::sleep(Duration::from_millis(500));
    stdin.write_all(input.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    drop(stdin);
    String::from_utf8_lossy(&o.stdout).replace('\r', "")
}

#[test]
fn the_command_has_a_terminal_of_its_own_and_cannot_push_input_into_any() {
    for who in identities() {
        let s = scratch(who, "tty");
        let bin = binary().display().to_string();
        let state = s.state.display().to_string();
        // TIOCSTI into every terminal descriptor it can find, including with junk in the high
        // half of the request; its session and terminal; output arrives.
        let probe = r#"import ctypes, fcntl, os, termios
libc = ctypes.CDLL(None, use_errno=True)
fds = {"stdin": 0, "stdout": 1, "dev-tty": os.open("/dev/tty", os.O_RDWR), "proc-fd0": os.open("/proc/self/fd/0", os.O_RDWR)}
for name, fd in fds.items():
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"x")
        print("INJECTED", name)
    except OSError as e:
        print("refused", name, e.errno)
c = ctypes.c_char(b"y")
r = libc.ioctl(0, ctypes.c_ulong(termios.TIOCSTI | (1 << 32)), ctypes.byref(c))
print("high-bits", "INJECTED" if r == 0 else "refused %d" % ctypes.get_errno())
print("session-leader", os.getsid(0) == os.getpid(), "foreground", os.tcgetpgrp(0) == os.getpgrp())
print("tty", os.ttyname(0))
"#;
        std::fs::write(s.root.join("tty_probe.py"), probe).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let line = format!(
            "stty -g > {root}/before; echo caller-sid $(ps -o sid= -p $$); \
             {bin} --state-dir {state} run -- python3 {root}/tty_probe.py; \
             stty -g > {root}/after; echo done",
            root = s.root.display()
        );
        let shown = in_terminal(who, &s, &line, "");
        assert!(!shown.contains("INJECTED"), "{who:?}: {shown}");
        assert_eq!(shown.matches("refused").count(), 5, "{who:?}: {shown}");
        assert!(shown.contains("refused stdin 1"), "{who:?}: EPERM from the filter: {shown}");
        assert!(shown.contains("session-leader True foreground True"), "{who:?}: {shown}");
        assert!(shown.contains("tty /dev/pts/0"), "{who:?}: the sandbox's own terminal: {shown}");
        assert!(shown.contains("txbox sandbox: cold (Unsuitable)"), "{who:?}: {shown}");
        assert!(shown.contains("done"), "{who:?}: {shown}");
        assert_eq!(
            std::fs::read_to_string(s.root.join("before")).unwrap(),
            std::fs::read_to_string(s.root.join("after")).unwrap(),
            "{who:?}: the caller's terminal mode was not restored"
        );

        // Keys typed reach the command; an interactive shell inside has job control.
        let line = format!(
            "{bin} --state-dir {state} run -- bash -c 'read -r line; echo \"got:$line\"; \
             bash -ic \"echo flags:\\$-\" 2>&1'; echo exit:$?"
        );
        let shown = in_terminal(who, &s, &line, "typed-here\n");
        assert!(shown.contains("got:typed-here"), "{who:?}: {shown}");
        let flags = shown.lines().find_map(|l| l.strip_prefix("flags:")).unwrap_or_default();
        assert!(flags.contains('m'), "{who:?}: no job control inside: {shown}");
        assert!(shown.contains("exit:0"), "{who:?}: {shown}");
    }
}

// ---------------------------------------------------------------------------------------------
// Secrets by deny-by-default (#13.8)
// ---------------------------------------------------------------------------------------------

#[test]
fn secrets_outside_the_short_list_are_hidden() {
    // Another user's home, with something in it (and the machine's own, where there is one).
    let other_home = PathBuf::from(format!("/home/txbox-it-other-{}", std::process::id()));
    std::fs::create_dir_all(other_home.join(".ssh")).unwrap();
    std::fs::write(other_home.join("notes.txt"), "OTHER USER DATA\n").unwrap();
    std::fs::write(other_home.join(".ssh/id_ed25519"), "OTHER USER KEY\n").unwrap();
    let _cleanup = Cleanup(other_home.clone());
    // A host private key.
    let key = PathBuf::from(format!("/etc/ssl/private/txbox-it-{}.key", std::process::id()));
    std::fs::write(&key, "HOST PRIVATE KEY\n").unwrap();
    let _cleanup_key = Cleanup(key.clone());
    for who in identities() {
        let s = scratch(who, "secrets");
        let home = s.root.join("home");
        let creds = [
            ".aws/credentials",
            ".config/gcloud/credentials.db",
            ".azure/accessTokens.json",
            ".kube/config",
            ".docker/config.json",
            ".netrc",
            ".claude/.credentials.json",
            ".codex/auth.json",
            ".config/gh/hosts.yml",
            ".git-credentials",
            ".pgpass",
            ".vault-token",
        ];
        for c in creds {
            let p = home.join(c);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "CLOUD TOKEN\n").unwrap();
        }
        // The state base directory (the key's): other workspaces' state may be there.
        std::fs::create_dir_all(s.root.join("xdg/txbox")).unwrap();
        std::fs::set_permissions(s.root.join("xdg/txbox"), std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        std::fs::write(s.root.join("xdg/txbox/other-state-file"), "OTHER STATE\n").unwrap();
        std::fs::write(home.join("plain.txt"), "ordinary\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
            std::os::unix::fs::chown(&other_home, Some(0), Some(0)).unwrap();
        }
        let mut targets: Vec<String> = vec![
            other_home.join("notes.txt").display().to_string(),
            other_home.join(".ssh/id_ed25519").display().to_string(),
            key.display().to_string(),
            s.root.join("xdg/txbox/other-state-file").display().to_string(),
        ];
        targets.extend(creds.iter().map(|c| home.join(c).display().to_string()));
        if Path::new("/home/cloudsdk/.bashrc").exists() {
            targets.push("/home/cloudsdk/.bashrc".into());
        }
        let script = format!(
            "import sys\nfor p in {targets:?}:\n    try:\n        d = open(p).read()\n        print('READ' if d else 'empty', p)\n    except OSError as e:\n        print('hidden', p, e.errno)\nprint(open({plain:?}).read().strip())\n",
            plain = home.join("plain.txt").display().to_string()
        );
        for mode in MODES {
            let o = run_in(who, &s, mode, &[], &["--", "python3", "-c", &script]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(!out.contains("READ"), "{who:?} {mode:?}: {}", describe(&o));
            assert!(out.contains("ordinary"), "{who:?} {mode:?}: the caller's own home is visible: {}", describe(&o));
            assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        }
    }
}

/// A secret named through a symlink is hidden where it really is, not only where it was named
/// (dotfile managers link `~/.ssh` and single credential files elsewhere; a runtime directory
/// may be a link, one in `/tmp` is gone from the sandbox's own `/tmp`); a link that leads to `/`
/// or above the workspace hides nothing and breaks nothing; a link re-pointed after a warm
/// server started is hidden where it points now.
#[test]
fn secrets_behind_symlinks_are_hidden_where_they_really_are() {
    for who in identities() {
        let s = scratch(who, "linked-secrets");
        let (home, dot) = (s.root.join("home"), s.root.join("dot"));
        for d in ["ssh", "ssh2", "config/gh", "rt"] {
            std::fs::create_dir_all(dot.join(d)).unwrap();
        }
        std::fs::write(dot.join("ssh/id_ed25519"), "LINKED KEY\n").unwrap();
        std::fs::write(dot.join("ssh2/id_ed25519"), "LINKED KEY TWO\n").unwrap();
        std::fs::write(dot.join("aws-credentials"), "LINKED TOKEN\n").unwrap();
        std::fs::write(dot.join("config/gh/hosts.yml"), "LINKED TOKEN\n").unwrap();
        std::fs::write(dot.join("rt/notes"), "LINKED RUNTIME\n").unwrap();
        std::fs::create_dir_all(home.join(".aws")).unwrap();
        let link = |to: &Path, at: &Path| std::os::unix::fs::symlink(to, at).unwrap();
        link(&dot.join("ssh"), &home.join(".ssh"));
        link(&dot.join("aws-credentials"), &home.join(".aws/credentials"));
        link(&dot.join("config"), &home.join(".config"));
        // The runtime directory behind a link in /tmp, with an agent listening in it.
        let xdg = PathBuf::from(format!("/tmp/txbox-it-xdg-{}-{who:?}", std::process::id()));
        let _ = std::fs::remove_file(&xdg);
        link(&dot.join("rt"), &xdg);
        let _cleanup = Cleanup(xdg.clone());
        let agent = std::os::unix::net::UnixListener::bind(dot.join("rt/agent.sock")).unwrap();
        std::fs::write(s.ws.join("plain.txt"), "ordinary\n").unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
            std::os::unix::fs::lchown(&xdg, Some(uid), Some(uid)).unwrap();
        }
        let paths = |ssh: &str| {
            [
                home.join(".ssh/id_ed25519"),
                dot.join(ssh).join("id_ed25519"),
                home.join(".aws/credentials"),
                dot.join("aws-credentials"),
                home.join(".config/gh/hosts.yml"),
                dot.join("config/gh/hosts.yml"),
                xdg.join("notes"),
                dot.join("rt/notes"),
            ]
            .map(|p| p.display().to_string())
        };
        let sockets = [xdg.join("agent.sock"), dot.join("rt/agent.sock")].map(|p| p.display().to_string());
        let probe = |ssh: &str| {
            format!(
                "import socket\nfor p in {files:?}:\n    try:\n        print('READ' if 'LINKED' in open(p).read() else 'empty', p)\n    \
                 except OSError as e:\n        print('hidden', p, e.errno)\nfor p in {sockets:?}:\n    \
                 c = socket.socket(socket.AF_UNIX)\n    try:\n        c.connect(p)\n        print('CONNECTED', p)\n    \
                 except OSError as e:\n        print('refused', p, e.errno)\nprint(open('plain.txt').read().strip())\n",
                files = paths(ssh)
            )
        };
        let xdg_env = xdg.display().to_string();
        let env = [("XDG_RUNTIME_DIR", xdg_env.as_str())];
        // Natively, every one of them is there (the system's python: a user's shim may be
        // out of the test user's reach).
        let mut native = match who {
            As::Me => Command::new("/usr/bin/python3"),
            As::User(uid) => {
                let mut c = Command::new("setpriv");
                c.args([format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".into(), "--".into()]);
                c.arg("/usr/bin/python3");
                c
            }
        };
        let o = native.arg("-c").arg(probe("ssh")).current_dir(&s.ws).env("HOME", &home).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out.matches("READ").count(), 8, "{who:?} natively: {}", describe(&o));
        assert_eq!(out.matches("CONNECTED").count(), 2, "{who:?} natively: {}", describe(&o));
        for mode in MODES {
            let o = run_in(who, &s, mode, &env, &["--", "python3", "-c", &probe("ssh")]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(!out.contains("READ") && !out.contains("CONNECTED"), "{who:?} {mode:?}: {}", describe(&o));
            assert!(out.contains("ordinary"), "{who:?} {mode:?}: the workspace is visible: {}", describe(&o));
            assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        }
        // Re-pointed while a warm server serves the old sandbox: where it points now is hidden.
        std::fs::remove_file(home.join(".ssh")).unwrap();
        link(&dot.join("ssh2"), &home.join(".ssh"));
        if let As::User(uid) = who {
            std::os::unix::fs::lchown(home.join(".ssh"), Some(uid), Some(uid)).unwrap();
        }
        for mode in [Mode::Warm, Mode::Cold] {
            let o = run(who, &s, mode, &env, &["--", "python3", "-c", &probe("ssh2")]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(!out.contains("READ") && !out.contains("CONNECTED"), "{who:?} {mode:?}: {}", describe(&o));
            assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        }
        // Links to what must stay visible, the root and a directory above the workspace: they
        // hide nothing there, and the rest stays hidden.
        link(Path::new("/"), &home.join(".gnupg"));
        link(&s.root, &home.join(".kube"));
        for mode in MODES {
            let o = run_in(who, &s, mode, &env, &["--", "python3", "-c", &probe("ssh2")]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(!out.contains("READ") && !out.contains("CONNECTED"), "{who:?} {mode:?}: {}", describe(&o));
            assert!(out.contains("ordinary"), "{who:?} {mode:?}: the workspace is visible: {}", describe(&o));
            assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        }
        // A runtime directory named with `..`, above the workspace: the same.
        let above = format!("{}/..", s.ws.display());
        for mode in MODES {
            let o = run_in(who, &s, mode, &[("XDG_RUNTIME_DIR", &above)], &["--", "cat", "plain.txt"]);
            assert_eq!(String::from_utf8_lossy(&o.stdout), "ordinary\n", "{who:?} {mode:?}: {}", describe(&o));
        }
        drop(agent);
    }
}

/// Removes a path when the test ends, passed or not.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// What `txbox doctor` says about the edge
// ---------------------------------------------------------------------------------------------

#[test]
fn doctor_says_what_keeps_host_sockets_out_and_what_stands_in() {
    let o = Command::new(binary()).args(["--json", "doctor"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&o)));
    let checks = v["checks"].as_array().unwrap();
    let check = |name: &str| checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name}: {v}"));
    let sockets = check("unix sockets");
    let detail = sockets["detail"].as_str().unwrap();
    if txbox_sandbox::landlock::kernel_abi() >= txbox_sandbox::supervisor::LANDLOCK_UNIX_ABI {
        assert!(detail.contains("Landlock") && sockets["ok"] == true, "{sockets}");
    } else {
        // Missing here, and what stands in.
        assert!(sockets["ok"] == false && sockets["essential"] == false, "{sockets}");
        assert!(detail.contains("seccomp supervisor stands in"), "{sockets}");
    }
    for name in ["warm clients", "landlock scopes"] {
        check(name);
    }
}

// ---------------------------------------------------------------------------------------------
// The sandbox's init and the socket supervisor are out of the command's reach
// ---------------------------------------------------------------------------------------------

#[test]
fn init_and_the_supervisor_are_out_of_reach() {
    let probe = r#"import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, f):
    try:
        f()
        print("REACHED", name)
    except OSError as e:
        print("refused", name, e.errno)
def init_fds():
    # The numbers may be listed (root owns the directory); what they are must stay closed.
    try:
        fds = os.listdir("/proc/1/fd")
    except OSError:
        fds = ["0", "3"]
    for fd in fds:
        for use in (lambda: os.readlink("/proc/1/fd/" + fd), lambda: os.open("/proc/1/fd/" + fd, os.O_RDONLY)):
            try:
                use()
                return
            except OSError as e:
                err = e
    raise err
attempt("init-fds", init_fds)
attempt("init-mem", lambda: open("/proc/1/mem", "rb").read(1))
attempt("init-environ", lambda: open("/proc/1/environ", "rb").read(1))
r = libc.ptrace(16, 1, 0, 0)
print("REACHED ptrace-init" if r == 0 else "refused ptrace-init %d" % ctypes.get_errno())
# Landlock's signal scope refuses these (EPERM); without it the kernel drops them (pid 1 of
# a namespace gets no signal from inside it has no handler for): init lives on either way.
for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
    try:
        os.kill(1, sig)
        print("signal sent", sig)
    except OSError as e:
        print("signal blocked", sig, e.errno)
names = sorted(open("/proc/%s/comm" % p).read().strip() for p in os.listdir("/proc") if p.isdigit())
print("processes", " ".join(names))
"#;
    for who in identities() {
        let s = scratch(who, "init");
        for mode in MODES {
            let o = run_in(who, &s, mode, &[], &["--", "python3", "-c", probe]);
            let out = String::from_utf8_lossy(&o.stdout);
            // init survived its signals: the run completed and reported.
            assert_eq!(o.status.code(), Some(0), "{who:?} {mode:?}: {}", describe(&o));
            assert!(!out.contains("REACHED"), "{who:?} {mode:?}: {out}");
            assert_eq!(out.matches("refused").count(), 4, "{who:?} {mode:?}: {out}");
            // Only the sandbox's own processes: no supervisor among them.
            let procs = out.lines().find_map(|l| l.strip_prefix("processes ")).unwrap_or_default();
            assert!(!procs.contains("txbox-sockets"), "{who:?} {mode:?}: {procs}");
            assert!(procs.split(' ').count() <= 3, "{who:?} {mode:?}: {procs}");
        }
    }
}

/// Root without a user namespace keeps only the everyday capabilities, warm or cold: its
/// bounding set (what it gets back at exec) and so its effective set lack every capability
/// that reaches the kernel, devices, time, modules or other processes. A warm server's init
/// drops them once for every command it starts; a cold sandbox's command drops them itself.
/// An unprivileged caller's command has none at all.
#[test]
fn commands_keep_only_the_everyday_capabilities() {
    // Everything up to CAP_CHECKPOINT_RESTORE (40) but these (stage2::DROPPED_CAPS).
    let dropped =
        [9u32, 12, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 30, 32, 33, 34, 35, 36, 37, 38, 39, 40];
    let everyday = (0..=40u32).filter(|c| !dropped.contains(c)).fold(0u64, |m, c| m | 1 << c);
    for who in identities() {
        let root = who == As::Me && rustix::process::geteuid().is_root();
        let s = scratch(who, "caps");
        for mode in MODES {
            let o = run_in(who, &s, mode, &[], &["--", "sh", "-c", "grep -E '^Cap(Bnd|Eff):' /proc/self/status"]);
            assert_eq!(o.status.code(), Some(0), "{who:?} {mode:?}: {}", describe(&o));
            let out = String::from_utf8_lossy(&o.stdout);
            let field = |name: &str| {
                let hex = out.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).map(str::trim);
                hex.and_then(|h| u64::from_str_radix(h, 16).ok())
            };
            if root {
                assert_eq!((field("CapBnd"), field("CapEff")), (Some(everyday), Some(everyday)), "{mode:?}: {out}");
            } else {
                assert_eq!(field("CapEff"), Some(0), "{who:?} {mode:?}: {out}");
            }
        }
    }
}
