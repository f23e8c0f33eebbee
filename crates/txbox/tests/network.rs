//! Network by allowlist (issue #15), through the real binary, as root and as an unprivileged
//! user: pip, npm, cargo, git and curl fetch from a stand-in registry (`standin_registry.py`,
//! started here on a loopback address the tests list explicitly: the "unless listed" rule)
//! through the proxy; refusals are clear and recorded; the network off fails at once and says
//! so; a hostile client does not disturb the others. No test uses the internet, except the
//! opt-in one at the end (`TXBOX_TEST_REAL_REGISTRIES=1`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::{describe, identities, txbox_command, As, Scratch};
use serde_json::Value;

/// The stand-in's address: loopback, but not 127.0.0.1 (which `NO_PROXY` keeps for the
/// sandbox's own loopback), so clients inside go through the proxy to reach it.
const REGISTRY_HOST: &str = "127.0.0.2";

/// A running stand-in registry.
struct Registry {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Registry {
    /// Serve `standin_registry.py`'s packages and a git repository (`/git/r.git`) from `dir`.
    fn start(dir: &Path, host: &str) -> Registry {
        std::fs::create_dir_all(dir).unwrap();
        let script = dir.join("standin_registry.py");
        std::fs::write(&script, include_str!("standin_registry.py")).unwrap();
        make_git_repo(&dir.join("git/r.git"));
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(host)
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("the stand-in registry said {line:?}"));
        Registry { child, port, dir: dir.to_path_buf() }
    }

    fn url(&self) -> String {
        format!("http://{REGISTRY_HOST}:{}", self.port)
    }

    fn allow(&self) -> String {
        format!("{REGISTRY_HOST}:{}", self.port)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git").args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", describe(&out));
}

/// A bare repository with one commit, ready for dumb HTTP.
fn make_git_repo(bare: &Path) {
    let src = bare.with_extension("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(bare).unwrap();
    git(bare, &["init", "-q", "--bare"]);
    git(&src, &["init", "-q"]);
    std::fs::write(src.join("hello.txt"), "hello\n").unwrap();
    git(&src, &["add", "hello.txt"]);
    git(&src, &["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one"]);
    git(&src, &["push", "-q", bare.to_str().unwrap(), "HEAD:refs/heads/main"]);
    git(bare, &["symbolic-ref", "HEAD", "refs/heads/main"]);
    git(bare, &["update-server-info"]);
}

/// `txbox ARGS` as `who`, in the scratch workspace, with `env` added.
fn txbox_env(who: As, s: &Scratch, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = txbox_command(who);
    if who != As::Me {
        cmd.env("HOME", &s.root);
    }
    cmd.envs(env.iter().copied()).arg("--state-dir").arg(&s.state).args(args).current_dir(&s.ws);
    cmd.output().unwrap()
}

/// `txbox --json run -C WS ARGS…`, parsed.
fn run_json(who: As, s: &Scratch, args: &[&str], env: &[(&str, &str)]) -> (Output, Value) {
    let ws = s.ws.to_str().unwrap().to_string();
    let mut all = vec!["--json", "run", "-C", &ws];
    all.extend_from_slice(args);
    let out = txbox_env(who, s, &all, env);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", describe(&out)));
    (out, v)
}

fn connections(v: &Value) -> Vec<Value> {
    v["network"]["connections"].as_array().cloned().unwrap_or_default()
}

/// Every connection was made, to the stand-in, and carried bytes back.
fn all_reached_registry(v: &Value, what: &str) {
    let conns = connections(v);
    assert!(!conns.is_empty(), "{what}: no connection recorded: {v}");
    for c in &conns {
        assert_eq!(c["allowed"], true, "{what}: {c}");
        assert_eq!(c["host"], REGISTRY_HOST, "{what}: {c}");
        assert!(c["bytes_down"].as_u64().unwrap_or(0) > 0, "{what}: {c}");
    }
}

fn committed(out: &Output, v: &Value, what: &str) {
    assert_eq!(v["outcome"], "committed", "{what}: {}\n{v}", describe(out));
}

/// A Python with pip that `who` can run.
fn python_with_pip(who: As) -> String {
    let mut candidates = vec!["/usr/bin/python3".to_string(), "/usr/local/bin/python3".to_string()];
    if let Ok(o) = Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output() {
        candidates.push(String::from_utf8_lossy(&o.stdout).trim().to_string());
    }
    for c in candidates {
        let mut cmd = match who {
            As::Me => Command::new(&c),
            As::User(uid) => {
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}")).arg("--clear-groups").arg(&c);
                cmd
            }
        };
        if cmd.args(["-m", "pip", "--version"]).output().is_ok_and(|o| o.status.success()) {
            return c;
        }
    }
    panic!("no python3 with pip for {who:?}: install python3-pip (.ci/run does)");
}

#[test]
fn package_managers_and_git_fetch_through_the_proxy() {
    let reg =
        Registry::start(Path::new(&format!("/var/tmp/txbox-it-registry-{}-a", std::process::id())), REGISTRY_HOST);
    let allow = reg.allow();
    let url = reg.url();
    for who in identities() {
        let s = Scratch::for_who(who, "net-tools");
        let py = python_with_pip(who);
        let pip = format!(
            "PIP_BREAK_SYSTEM_PACKAGES=1 {py} -m pip install -q --no-cache-dir --disable-pip-version-check --target deps \
             --index-url {url}/simple/ txbox-probe && PYTHONPATH=deps {py} -c 'import txbox_probe; print(txbox_probe.VALUE)'"
        );
        let (out, v) = run_json(who, &s, &["--allow-host", &allow, "-c", &pip], &[("PIP_FIND_LINKS", "")]);
        committed(&out, &v, "pip");
        assert_eq!(v["stdout"], "42\n", "pip: {v}");
        all_reached_registry(&v, "pip");

        let npm = format!(
            "npm install --no-audit --no-fund --registry {url}/npm/ txbox-probe && node -e 'console.log(require(\"txbox-probe\"))'"
        );
        let (out, v) =
            run_json(who, &s, &["--allow-host", &allow, "-c", &npm], &[("npm_config_cache", "/tmp/npm-cache")]);
        committed(&out, &v, "npm");
        assert!(v["stdout"].as_str().unwrap_or("").ends_with("42\n"), "npm: {v}");
        all_reached_registry(&v, "npm");

        let clone_url = format!("{url}/git/r.git");
        let (out, v) =
            run_json(who, &s, &["--allow-host", &allow, "--", "git", "clone", "-q", &clone_url, "clone"], &[]);
        committed(&out, &v, "git");
        assert_eq!(std::fs::read_to_string(s.ws.join("clone/hello.txt")).unwrap(), "hello\n");
        all_reached_registry(&v, "git");

        // curl in both ways: plain HTTP forwarded, and a CONNECT tunnel (-p).
        for flags in ["", "-p"] {
            let curl = format!("curl -sSf {flags} -o /dev/null -w '%{{http_code}}' {url}/simple/");
            let (out, v) = run_json(who, &s, &["--allow-host", &allow, "-c", &curl], &[]);
            committed(&out, &v, "curl");
            assert_eq!(v["stdout"], "200", "curl {flags}: {v}");
            all_reached_registry(&v, "curl");
            let via = if flags.is_empty() { "http" } else { "tunnel" };
            assert_eq!(connections(&v)[0]["via"], via, "curl {flags}: {v}");
            // The proxy that parsed these requests says how it was confined (it serves only
            // once confined: a failure to confine is the run's error).
            let confined = v["network"]["proxy"].as_str().unwrap_or("");
            assert!(
                confined.contains("seccomp allow-list") && confined.contains("no capabilities"),
                "curl {flags}: {v}"
            );
        }

        // cargo: root's toolchain (rustup in /root) is not the test user's to run.
        if who == As::Me {
            let proj = s.ws.join("proj");
            std::fs::create_dir_all(proj.join("src")).unwrap();
            std::fs::create_dir_all(proj.join(".cargo")).unwrap();
            std::fs::write(
                proj.join("Cargo.toml"),
                "[package]\nname = \"consumer\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\ntxbox-probe = \"1\"\n",
            )
            .unwrap();
            std::fs::write(proj.join("src/lib.rs"), "pub fn v() -> u32 { txbox_probe::VALUE }\n").unwrap();
            std::fs::write(
                proj.join(".cargo/config.toml"),
                format!(
                    "[source.crates-io]\nreplace-with = \"standin\"\n\n[source.standin]\nregistry = \"sparse+{url}/cargo/\"\n"
                ),
            )
            .unwrap();
            let (out, v) = run_json(
                who,
                &s,
                &["--allow-host", &allow, "-c", "cd proj && cargo build -q"],
                &[("CARGO_HOME", "/tmp/cargo-home"), ("CARGO_TARGET_DIR", "/tmp/target")],
            );
            committed(&out, &v, "cargo");
            all_reached_registry(&v, "cargo");
            assert!(s.ws.join("proj/Cargo.lock").exists(), "cargo resolved the dependency");
        } else {
            eprintln!("cargo runs as root only: the unprivileged user cannot run root's rustup toolchain");
        }
    }
}

/// `sh -c 'curl … http://$(cat target)/'`: a target the policy cannot see in the string, so
/// the proxy is the one to refuse it.
fn hidden_curl(s: &Scratch, target: &str, extra: &str) -> String {
    std::fs::write(s.ws.join("target"), target).unwrap();
    format!("curl -s {extra} -o body -w '%{{http_code}}' http://$(cat target)/; cat body")
}

#[test]
fn refusals_are_clear_and_recorded() {
    let reg =
        Registry::start(Path::new(&format!("/var/tmp/txbox-it-registry-{}-b", std::process::id())), REGISTRY_HOST);
    // A server on 127.0.0.1, which `localhost` resolves to.
    let local =
        Registry::start(Path::new(&format!("/var/tmp/txbox-it-registry-{}-c", std::process::id())), "127.0.0.1");
    for who in identities() {
        let s = Scratch::for_who(who, "net-refusals");
        let allow = format!("{},localhost:{}", reg.allow(), local.port);

        // An address not listed (IP literals are refused unless listed), then the metadata one.
        for target in
            ["127.0.0.3:9".to_string(), "169.254.169.254".to_string(), format!("{REGISTRY_HOST}:{}", reg.port + 1)]
        {
            let cmd = hidden_curl(&s, &target, "");
            let (out, v) = run_json(who, &s, &["--allow-host", &allow, "-c", &cmd], &[]);
            let stdout = v["stdout"].as_str().unwrap_or("");
            assert!(
                stdout.starts_with("403txbox: ") && stdout.contains("--allow-host"),
                "{target}: {}\n{v}",
                describe(&out)
            );
            let c = &connections(&v)[0];
            assert_eq!(
                (c["allowed"].as_bool(), c["code"].as_str()),
                (Some(false), Some("not-allowed")),
                "{target}: {c}"
            );
            assert!(v["network"]["hint"].as_str().unwrap_or("").contains("allow hosts with --allow-host"), "{v}");
        }

        // An allowed name resolving to loopback: refused unless the address is listed too.
        let via_proxy = "--noproxy '' -x \"$HTTP_PROXY\"";
        let cmd = hidden_curl(&s, &format!("localhost:{}", local.port), via_proxy);
        let (out, v) = run_json(who, &s, &["--allow-host", &allow, "-c", &cmd], &[]);
        assert!(v["stdout"].as_str().unwrap_or("").starts_with("403"), "{}\n{v}", describe(&out));
        let c = &connections(&v)[0];
        assert_eq!(c["code"], "non-public", "{c}");
        assert!(c["reason"].as_str().unwrap_or("").contains("127.0.0.1"), "{c}");
        let listed = format!("{allow},127.0.0.1:{}", local.port);
        let (out, v) = run_json(who, &s, &["--allow-host", &listed, "-c", &cmd], &[]);
        assert!(v["stdout"].as_str().unwrap_or("").starts_with("200"), "{}\n{v}", describe(&out));

        // The audit entry has the same connections as the result.
        let ws = s.ws.to_str().unwrap().to_string();
        let log = txbox_env(who, &s, &["--json", "log", "-C", &ws, "-n", "1"], &[]);
        let entries: Value = serde_json::from_slice(&log.stdout).unwrap();
        assert_eq!(entries[0]["tx"], v["tx"], "{entries}");
        assert_eq!(entries[0]["network"]["connections"], v["network"]["connections"], "{entries}\n{v}");

        // Without --json, run says it on stderr after the command.
        let cmd = hidden_curl(&s, "127.0.0.3:9", "");
        let out = txbox_env(who, &s, &["run", "-C", &ws, "--allow-host", &allow, "-c", &cmd], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("txbox: refused 127.0.0.3:9 (not in this command's allowlist); allow hosts with --allow-host 127.0.0.3:9"), "{stderr}");
    }
}

#[test]
fn visible_targets_outside_the_allowlist_are_denied_before_running() {
    for who in identities() {
        let s = Scratch::for_who(who, "net-visible");
        let (out, v) = run_json(who, &s, &["-c", "touch ran; curl -fsS https://pkgs.invalid/x.tgz -o x.tgz"], &[]);
        assert_eq!(out.status.code(), Some(126), "{}", describe(&out));
        assert_eq!(v["decision"]["rule"], "network.allowlist", "{v}");
        assert!(v["decision"]["reason"].as_str().unwrap_or("").ends_with("--allow-host pkgs.invalid"), "{v}");
        assert!(!s.ws.join("ran").exists(), "a denied command ran");
        let (out, v) =
            run_json(who, &s, &["--allow-host", "*.invalid", "-c", "curl -sS https://pkgs.invalid/ || true"], &[]);
        assert_eq!(v["outcome"], "committed", "{}", describe(&out));
        assert_eq!(connections(&v)[0]["code"], "resolve", "an allowed name that does not resolve: {v}");
    }
}

#[test]
fn without_permission_resolution_fails_at_once_and_run_says_so() {
    for who in identities() {
        for warm in ["1", "0"] {
            let s = Scratch::for_who(who, "net-off");
            let env = [("TXBOX_WARM", warm)];
            // Twice: the first run starts a warm server, the second is served by it.
            for _ in 0..2 {
                let (out, v) = run_json(who, &s, &["--", "getent", "hosts", "example.invalid"], &env);
                assert_eq!(v["exit_code"], 2, "{}", describe(&out));
                assert_eq!(v["network"]["mode"], "off", "warm={warm}: {v}");
                assert!(v["network"]["direct_attempts"].as_u64().unwrap_or(0) > 0, "{v}");
            }
            let ws = s.ws.to_str().unwrap().to_string();
            let out = txbox_env(who, &s, &["run", "-C", &ws, "--", "getent", "hosts", "example.invalid"], &env);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("network is off for this command; allow hosts with --allow-host"),
                "warm={warm}: {stderr}"
            );
            // A command that does not touch the network hears nothing about it.
            let (_, v) = run_json(who, &s, &["--", "true"], &env);
            assert!(v.get("network").is_none(), "{v}");
            // sh: stderr stays the command's own; the hint goes to the audit log.
            let out = txbox_env(who, &s, &["sh", "-c", "getent hosts example.invalid; echo done >&2"], &env);
            assert_eq!(String::from_utf8_lossy(&out.stderr), "done\n", "{}", describe(&out));
            let log = txbox_env(who, &s, &["--json", "log", "-C", &ws, "-n", "1"], &[]);
            let entries: Value = serde_json::from_slice(&log.stdout).unwrap();
            let hint = entries[0]["network"]["hint"].as_str().unwrap_or("");
            assert!(hint.contains("network is off"), "{entries}");
        }
    }
}

#[test]
fn a_hostile_client_does_not_disturb_the_others() {
    let reg =
        Registry::start(Path::new(&format!("/var/tmp/txbox-it-registry-{}-d", std::process::id())), REGISTRY_HOST);
    let url = reg.url();
    let script = format!(
        r#"
import os, socket, urllib.request
host, port = "127.0.0.1", int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
def conn(data):
    s = socket.create_connection((host, port)); s.sendall(data); return s
huge = conn(b"GET {url}/ HTTP/1.1\r\n" + b"X: " + b"y" * 100000 + b"\r\n\r\n")
slow = conn(b"GET {url}/sim")
junk = conn(bytes(range(256)) * 4 + b"\r\n\r\n")
for i in range(3):
    print(urllib.request.urlopen("{url}/simple/").status)
print(huge.recv(100).split(b"\r\n")[0].decode())
print(junk.recv(100).split(b"\r\n")[0].decode())
slow.close()
"#
    );
    for who in identities() {
        let s = Scratch::for_who(who, "net-hostile");
        std::fs::write(s.ws.join("hostile.py"), &script).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let (out, v) = run_json(who, &s, &["--allow-host", &reg.allow(), "--", "python3", "hostile.py"], &[]);
        assert_eq!(
            v["stdout"],
            "200\n200\n200\nHTTP/1.1 431 Request Header Fields Too Large\nHTTP/1.1 400 Bad Request\n",
            "{}\n{v}",
            describe(&out)
        );
        let codes: Vec<String> =
            connections(&v).iter().filter_map(|c| c["code"].as_str().map(str::to_string)).collect();
        assert!(codes.contains(&"too-large".to_string()) && codes.contains(&"bad-request".to_string()), "{v}");
    }
}

/// A client that keeps Nagle's algorithm on (urllib3 does behind a proxy: pip, requests) sends
/// a small segment only once the previous one is acknowledged; the proxy acknowledges what it
/// reads at once instead of holding the acknowledgement back for a reply that cannot come
/// before the held segment (40 ms per exchange: #15, docs/BENCHMARKS.md). Counted, not timed:
/// the sandbox's network namespace holds only the command's connections to the proxy, and its
/// `DelayedACKs` counter says how often an acknowledgement waited for the timer (one per
/// exchange without the fix). A proxied run is always cold, so there is no warm variant.
#[test]
fn a_client_with_nagle_on_is_acknowledged_at_once() {
    let reg =
        Registry::start(Path::new(&format!("/var/tmp/txbox-it-registry-{}-f", std::process::id())), REGISTRY_HOST);
    let script = format!(
        r#"
import os, socket
proxy = int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])
def delayed_acks():
    names, values = [l.split() for l in open("/proc/self/net/netstat").read().splitlines()[:2]]
    return int(values[names.index("DelayedACKs")])
before, ok = delayed_acks(), 0
for i in range(8):
    s = socket.create_connection(("127.0.0.1", proxy))
    s.sendall(b"CONNECT {target} HTTP/1.1\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1024)
    # Nagle on (Python's default): the second write waits for the first one's acknowledgement.
    s.sendall(b"GET /simple/ HTTP/1.1\r\n")
    s.sendall(b"Host: x\r\n\r\n")
    got = b""
    while d := s.recv(65536):
        got += d
    ok += got.startswith(b"HTTP/1.0 200")
    s.close()
print(ok, delayed_acks() - before)
"#,
        target = reg.allow()
    );
    for who in identities() {
        let s = Scratch::for_who(who, "net-nagle");
        std::fs::write(s.ws.join("nagle.py"), &script).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let (out, v) = run_json(who, &s, &["--allow-host", &reg.allow(), "--", "python3", "nagle.py"], &[]);
        committed(&out, &v, "nagle.py");
        let said = v["stdout"].as_str().unwrap_or("").to_string();
        let nums: Vec<u64> = said.split_whitespace().filter_map(|n| n.parse().ok()).collect();
        assert_eq!(nums.first(), Some(&8), "every exchange answered: {said:?}\n{v}");
        // One per exchange without the fix; a loaded machine may let the odd timer fire before
        // the proxy reads, never most of them.
        assert!(nums.get(1).is_some_and(|d| *d < 4), "acknowledgements delayed: {said:?} ({who:?})\n{v}");
    }
}

#[test]
fn a_session_keeps_the_hosts_it_began_with() {
    let reg =
        Registry::start(Path::new(&format!("/var/tmp/txbox-it-registry-{}-e", std::process::id())), REGISTRY_HOST);
    for who in identities() {
        // A proxied step builds its own sandbox whether warm servers are on or off.
        for warm in ["1", "0"] {
            let env = [("TXBOX_WARM", warm)];
            let s = Scratch::for_who(who, "net-session");
            let ws = s.ws.to_str().unwrap().to_string();
            let out = txbox_env(who, &s, &["begin", "-C", &ws, "--allow-host", &reg.allow()], &env);
            assert!(out.status.success(), "{}", describe(&out));
            let tx = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let curl = format!("curl -sSf -o page {}/simple/", reg.url());
            let out = txbox_env(who, &s, &["--json", "exec", &tx, "-c", &curl], &env);
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["outcome"], "pending", "warm={warm}: {}", describe(&out));
            all_reached_registry(&v, "exec");
            let out = txbox_env(who, &s, &["--json", "exec", &tx, "-c", "curl -sS https://other.invalid/"], &env);
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["decision"]["rule"], "network.allowlist", "{v}");
            let out = txbox_env(who, &s, &["commit", &tx], &env);
            assert!(out.status.success(), "{}", describe(&out));
            assert!(s.ws.join("page").exists());
        }
    }
}

/// A running stand-in for the caller's own proxy (`standin_upstream.py`), which sends every
/// request to `target` whatever host it names, and logs request lines.
struct Upstream {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Upstream {
    fn start(dir: &Path, target: &str) -> Upstream {
        std::fs::create_dir_all(dir).unwrap();
        let script = dir.join("standin_upstream.py");
        std::fs::write(&script, include_str!("standin_upstream.py")).unwrap();
        let log = dir.join("requests.log");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(&log)
            .arg(target)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("the stand-in upstream said {line:?}"));
        Upstream { child, port, log }
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = self.log.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The caller's own proxy is chained: with `http_proxy`/`https_proxy` set for txbox, allowed
/// connections go through it (plain HTTP forwarded, tunnels by CONNECT), so a name only the
/// upstream can resolve works; refused ones never reach it.
#[test]
fn the_callers_upstream_proxy_is_chained() {
    let pid = std::process::id();
    let reg = Registry::start(Path::new(&format!("/var/tmp/txbox-it-registry-{pid}-f")), REGISTRY_HOST);
    let up = Upstream::start(Path::new(&format!("/var/tmp/txbox-it-upstream-{pid}")), &reg.allow());
    let upstream = format!("http://127.0.0.1:{}", up.port);
    let env = [("http_proxy", upstream.as_str()), ("https_proxy", upstream.as_str()), ("no_proxy", "")];
    // A name that resolves nowhere: only the upstream can take it to the stand-in.
    let name = format!("pkgs.upstream.invalid:{}", reg.port);
    for who in identities() {
        let s = Scratch::for_who(who, "net-upstream");
        for (flags, via, line) in
            [("", "http", format!("GET http://{name}/simple/ ")), ("-p", "tunnel", format!("CONNECT {name} "))]
        {
            let curl = format!("curl -sSf {flags} -o /dev/null -w '%{{http_code}}' http://{name}/simple/");
            let (out, v) = run_json(who, &s, &["--allow-host", &name, "-c", &curl], &env);
            committed(&out, &v, "curl through the upstream");
            assert_eq!(v["stdout"], "200", "curl {flags}: {v}");
            let c = &connections(&v)[0];
            assert_eq!((c["via"].as_str(), c["upstream"].as_bool()), (Some(via), Some(true)), "{c}");
            assert!(up.requests().contains(&line), "{line:?} not in {:?}", up.requests());
        }
        // Refused by txbox: the upstream never hears of it.
        let other = format!("other.upstream.invalid:{}", reg.port);
        let cmd = hidden_curl(&s, &other, "");
        let (out, v) = run_json(who, &s, &["--allow-host", &name, "-c", &cmd], &env);
        assert!(v["stdout"].as_str().unwrap_or("").starts_with("403"), "{}\n{v}", describe(&out));
        assert!(!up.requests().contains("other.upstream.invalid"), "{}", up.requests());
    }
}

/// The processes of `txbox __netproxy` (the broker and the proxy it forked) under `txbox`.
fn proxy_processes(txbox: u32) -> Vec<u32> {
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !cmdline.starts_with(b"txbox-netproxy\0__netproxy") {
            continue;
        }
        let up = parent(pid);
        if up == Some(txbox) || up.and_then(parent) == Some(txbox) {
            out.push(pid);
        }
    }
    out
}

/// Nothing txbox's caller left open reaches the proxy's processes, which parse what the
/// sandbox sends: a descriptor the caller passed to txbox (here fd 7, a host file) is not among
/// theirs.
#[test]
fn the_proxy_inherits_no_descriptor_from_txboxs_caller() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let s = Scratch::new("net-fds");
    let marker = s.root.join("inherited-marker");
    std::fs::write(&marker, "x").unwrap();
    let file = std::fs::File::open(&marker).unwrap();
    let raw = file.as_raw_fd();
    let ws = s.ws.to_str().unwrap().to_string();
    let mut cmd = txbox_command(As::Me);
    cmd.arg("--state-dir").arg(&s.state).args(["run", "-C", &ws, "--allow-host", "192.0.2.1", "--", "sleep", "60"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: dup2 between fork and exec; it clears close-on-exec on fd 7, as a careless caller would.
    unsafe {
        cmd.pre_exec(move || if libc::dup2(raw, 7) < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
    }
    let mut child = cmd.spawn().unwrap();
    let links = |pid: u32| -> Vec<PathBuf> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()).collect())
            .unwrap_or_default()
    };
    // Wait for both processes (no time is asserted: the run sleeps far longer than this loop).
    let mut found = Vec::new();
    for _ in 0..400 {
        found = proxy_processes(child.id());
        if found.len() == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let txbox_has_it = links(child.id()).contains(&marker);
    let leaked: Vec<(u32, Vec<PathBuf>)> = found.iter().map(|p| (*p, links(*p))).collect();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(found.len(), 2, "the broker and the proxy: {found:?}");
    assert!(txbox_has_it, "txbox itself was given the descriptor");
    for (pid, fds) in leaked {
        assert!(!fds.contains(&marker), "{pid} has the caller's descriptor: {fds:?}");
    }
}

/// Opt-in, not in CI: this machine's own registries, through `@pypi`. Names that resolve to
/// non-public addresses here (a mirror on a private network) are listed as the refusal says.
#[test]
fn opt_in_real_pypi_through_the_preset() {
    if std::env::var_os("TXBOX_TEST_REAL_REGISTRIES").is_none() {
        eprintln!("SKIP opt_in_real_pypi_through_the_preset: set TXBOX_TEST_REAL_REGISTRIES=1 to use this machine's registries");
        return;
    }
    let s = Scratch::new("net-real");
    let py = python_with_pip(As::Me);
    let cmd = format!("{py} -m pip download -q --no-deps --no-cache-dir -d dl six");
    let mut allow = "@pypi".to_string();
    for _ in 0..2 {
        let (out, v) = run_json(As::Me, &s, &["--allow-host", &allow, "-c", &cmd], &[]);
        if v["outcome"] == "committed" {
            assert!(connections(&v).iter().all(|c| c["allowed"] == true), "{v}");
            assert!(std::fs::read_dir(s.ws.join("dl")).unwrap().count() == 1);
            return;
        }
        let addresses: Vec<String> = connections(&v)
            .iter()
            .filter(|c| c["code"] == "non-public")
            .filter_map(|c| c["reason"].as_str()?.rsplit("--allow-host ").next()?.strip_suffix(')').map(str::to_string))
            .collect();
        assert!(!addresses.is_empty(), "pip through @pypi failed: {}\n{v}", describe(&out));
        allow = format!("{allow},{}", addresses.join(","));
    }
    panic!("pip through {allow} failed");
}

#[test]
fn a_preset_that_cannot_be_derived_is_reported_not_fatal() {
    let s = Scratch::new("net-preset-missing");
    let env = [("PATH", "/nonexistent")];
    let (out, v) = run_json(As::Me, &s, &["--allow-host", "@npm,192.0.2.1", "--", "/bin/true"], &env);
    assert_eq!(v["outcome"], "committed", "{}", describe(&out));
    assert_eq!(v["network"]["allow"], serde_json::json!(["192.0.2.1"]), "{v}");
    let notes = v["network"]["notes"].to_string();
    assert!(notes.contains("@npm: npm is not on PATH"), "{v}");
    let ws = s.ws.to_str().unwrap().to_string();
    let out = txbox_env(As::Me, &s, &["run", "-C", &ws, "--allow-host", "@npm", "--", "/bin/true"], &env);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("txbox: no hosts from @npm: npm is not on PATH"),
        "{}",
        describe(&out)
    );
}
