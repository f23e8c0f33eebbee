//! Package caches (#15): txbox's own persistent caches at the tools' default locations, writable
//! inside the sandbox, outside transactions, per workspace, never the host's; `txbox gc` bounds
//! them. Tools are found on `PATH` (stand-ins here) and locations from their variables and
//! `HOME`; as root and unprivileged, warm and cold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

/// A scratch area with a home and stand-ins for pip, npm, cargo and go on `PATH`.
fn setup(who: As, name: &str) -> Scratch {
    let s = Scratch::new(name);
    let bin = s.root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["pip", "npm", "cargo", "go"] {
        std::fs::write(bin.join(tool), "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(bin.join(tool), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // The tools' locations exist on the host (a tool's first run makes them; txbox does not).
    for d in [".npm", ".cargo/registry", ".cache/pip", "go/pkg/mod", ".cache/go-build"] {
        std::fs::create_dir_all(s.root.join("home").join(d)).unwrap();
    }
    std::fs::create_dir_all(s.root.join("ws2")).unwrap();
    if let As::User(uid) = who {
        s.chown(uid);
    }
    s
}

fn run_in(
    who: As,
    s: &Scratch,
    ws: &Path,
    env: &[(&str, PathBuf)],
    extra: &[&str],
    script: &str,
    cold: bool,
) -> Output {
    let mut cmd = txbox_command(who);
    cmd.env("HOME", s.root.join("home"))
        .env("PATH", format!("{}:/usr/bin:/bin", s.root.join("bin").display()))
        .env_remove("XDG_CACHE_HOME")
        .env_remove("CARGO_HOME")
        .env_remove("GOPATH")
        .env_remove("GOMODCACHE")
        .env_remove("GOCACHE")
        .env_remove("PIP_CACHE_DIR")
        .env_remove("npm_config_cache")
        .env("XDG_STATE_HOME", s.root.join("xdg-state"))
        .env("TXBOX_CONFIG", s.root.join("none.toml"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    if cold {
        cmd.env("TXBOX_WARM", "0");
    }
    cmd.arg("--state-dir").arg(&s.state).args(["run", "-C"]).arg(ws).args(extra).args(["--", "bash", "-c", script]);
    cmd.current_dir(ws).output().unwrap()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn caches_persist_outside_transactions_per_workspace_never_the_hosts() {
    for who in identities() {
        for cold in [false, true] {
            let s = setup(who, "caches");
            let home = s.root.join("home");
            let at = format!("{who:?} cold={cold}");
            // Written by a command that fails: the transaction rolls back, the cache stays.
            let o = run_in(who, &s, &s.ws, &[], &[], "echo one > ~/.npm/x && echo reg > ~/.cargo/registry/r && echo p > ~/.cache/pip/p && echo g > ~/go/pkg/mod/m && echo b > ~/.cache/go-build/b && exit 1", cold);
            assert_eq!(o.status.code(), Some(1), "{at}: {}", describe(&o));
            let o = run_in(
                who,
                &s,
                &s.ws,
                &[],
                &[],
                "cat ~/.npm/x ~/.cargo/registry/r ~/.cache/pip/p ~/go/pkg/mod/m ~/.cache/go-build/b",
                cold,
            );
            assert_eq!(out(&o), "one\nreg\np\ng\nb\n", "{at}: {}", describe(&o));
            // The host's locations are only the (empty) mount points.
            for d in [".npm", ".cargo/registry", ".cache/pip", "go/pkg/mod", ".cache/go-build"] {
                let n = std::fs::read_dir(home.join(d)).unwrap_or_else(|e| panic!("{d}: {e}")).count();
                assert_eq!(n, 0, "{at}: the host's {d} was written");
            }
            // The workspace is untouched by cache writes.
            assert_eq!(std::fs::read_dir(&s.ws).unwrap().count(), 0, "{at}");
            // Another workspace has caches of its own.
            let ws2 = s.root.join("ws2");
            let o = run_in(who, &s, &ws2, &[], &[], "cat ~/.npm/x 2>/dev/null || echo absent", cold);
            assert_eq!(out(&o), "absent\n", "{at}: {}", describe(&o));
            // Without caches, the tools' locations are the host's, read-only.
            let o = run_in(who, &s, &s.ws, &[], &["--no-caches"], "echo two > ~/.npm/y", cold);
            assert_ne!(o.status.code(), Some(0), "{at}: {}", describe(&o));
            assert!(!home.join(".npm/y").exists());
            // `txbox gc` within a budget: everything goes at 1 byte.
            let mut gc = txbox_command(who);
            let g = gc
                .env("HOME", &home)
                .env("XDG_STATE_HOME", s.root.join("xdg-state"))
                .arg("--state-dir")
                .arg(&s.state)
                .args(["--json", "gc", "-C"])
                .arg(&s.ws)
                .args(["--max-cache-size", "1"])
                .output()
                .unwrap();
            assert!(g.status.success(), "{at}: {}", describe(&g));
            let r: serde_json::Value = serde_json::from_slice(&g.stdout).unwrap();
            assert!(r["caches"]["removed"].as_array().unwrap().len() >= 5 && r["caches"]["after"] == 0, "{at}: {r}");
            let o = run_in(who, &s, &s.ws, &[], &[], "cat ~/.npm/x 2>/dev/null || echo absent", cold);
            assert_eq!(out(&o), "absent\n", "{at}: {}", describe(&o));
        }
    }
}

#[test]
fn locations_follow_the_tools_variables_and_refuse_symlinks() {
    for who in identities() {
        let s = setup(who, "caches-vars");
        let ch = s.root.join("cargo-home");
        let outside = s.root.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(ch.join("registry")).unwrap();
        std::fs::remove_dir(s.root.join("home/.npm")).unwrap();
        std::os::unix::fs::symlink(&outside, s.root.join("home/.npm")).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let o = run_in(
            who,
            &s,
            &s.ws,
            &[("CARGO_HOME", ch.clone())],
            &[],
            "echo c > $CARGO_HOME/registry/c && cat $CARGO_HOME/registry/c; echo n > ~/.npm/n 2>/dev/null || echo refused",
            true,
        );
        assert_eq!(out(&o), "c\nrefused\n", "{who:?}: {}", describe(&o));
        assert!(!ch.join("registry/c").exists(), "{who:?}: written to the host's CARGO_HOME");
        assert!(!outside.join("n").exists(), "{who:?}: a cache mounted through a symlink");
        // A location that does not exist gets no cache, and nothing is made in the home.
        std::fs::remove_dir_all(s.root.join("home/.cache")).unwrap();
        let o =
            run_in(who, &s, &s.ws, &[], &[], "mkdir -p ~/.cache/pip 2>/dev/null && echo made || echo refused", true);
        assert_eq!(out(&o), "refused\n", "{who:?}: {}", describe(&o));
        assert!(!s.root.join("home/.cache").exists(), "{who:?}: txbox made a directory in the home");
    }
}
