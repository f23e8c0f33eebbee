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
    // The tools' locations exist on the host (a tool's first run has made them).
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

/// Stand-ins that use their tool's default cache locations as the tool does: each location is
/// made if missing (`mkdir -p`, failing when it cannot be) and marked; a later run finds the
/// mark and says `warm`.
fn stand_ins(s: &Scratch) {
    let bin = s.root.join("bin");
    let tools: [(&str, &[&str]); 4] = [
        ("pip", &["${XDG_CACHE_HOME:-$HOME/.cache}/pip"]),
        ("npm", &["$HOME/.npm"]),
        ("cargo", &["${CARGO_HOME:-$HOME/.cargo}/registry", "${CARGO_HOME:-$HOME/.cargo}/git"]),
        ("go", &["$HOME/go/pkg/mod", "${XDG_CACHE_HOME:-$HOME/.cache}/go-build"]),
    ];
    for (tool, dirs) in tools {
        let mut sh = String::from("#!/bin/sh\nset -e\n");
        for d in dirs {
            sh += &format!(
                "if [ -f \"{d}/seen\" ]; then echo {tool} warm; else mkdir -p \"{d}/x\"; echo 1 > \"{d}/seen\"; echo {tool} cold; fi\n"
            );
        }
        std::fs::write(bin.join(tool), sh).unwrap();
        std::fs::set_permissions(bin.join(tool), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// The tools' default locations under the scratch home, as a stand-in uses them.
const LOCATIONS: [&str; 6] = [".npm", ".cache/pip", ".cargo/registry", ".cargo/git", "go/pkg/mod", ".cache/go-build"];

const ALL_TOOLS: &str = "pip install x && npm install && cargo build && go build";

/// A user with no history: none of the tools' directories exists on the host (nor `.cache`,
/// `.cargo` or `go`). txbox makes each, empty, 0700, the caller's, and mounts its cache there:
/// every tool works on the first run, finds its cache on the second, and the host's
/// directories stay empty.
#[test]
fn a_user_with_no_history_gets_caches_at_the_tools_default_locations() {
    use std::os::unix::fs::MetadataExt;
    for who in identities() {
        for cold in [false, true] {
            let s = setup(who, "caches-new");
            let home = s.root.join("home");
            std::fs::remove_dir_all(&home).unwrap();
            std::fs::create_dir(&home).unwrap();
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
            stand_ins(&s);
            let uid = match who {
                As::User(uid) => {
                    s.chown(uid);
                    uid
                }
                As::Me => rustix::process::geteuid().as_raw(),
            };
            let at = format!("{who:?} cold={cold}");
            let o = run_in(who, &s, &s.ws, &[], &[], ALL_TOOLS, cold);
            assert_eq!(o.status.code(), Some(0), "{at}: {}", describe(&o));
            assert_eq!(out(&o), "pip cold\nnpm cold\ncargo cold\ncargo cold\ngo cold\ngo cold\n", "{at}");
            let o = run_in(who, &s, &s.ws, &[], &[], ALL_TOOLS, cold);
            assert_eq!(
                out(&o),
                "pip warm\nnpm warm\ncargo warm\ncargo warm\ngo warm\ngo warm\n",
                "{at}: {}",
                describe(&o)
            );
            for d in LOCATIONS {
                let md = std::fs::symlink_metadata(home.join(d)).unwrap_or_else(|e| panic!("{at}: {d}: {e}"));
                assert!(md.is_dir() && md.mode() & 0o7777 == 0o700 && md.uid() == uid, "{at}: {d}: {md:?}");
                let n = std::fs::read_dir(home.join(d)).unwrap().count();
                assert_eq!(n, 0, "{at}: the host's {d} was written");
            }
            // Nothing else was made in the home, nothing in the workspace.
            let mut names: Vec<String> = std::fs::read_dir(&home)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            assert_eq!(names, [".cache", ".cargo", ".npm", "go"], "{at}");
            assert_eq!(std::fs::read_dir(&s.ws).unwrap().count(), 0, "{at}");
            // `~/.cargo` exists, `~/.cargo/registry` not (a fresh rustup): made, the cache is
            // there (this workspace's, so warm).
            std::fs::remove_dir(home.join(".cargo/registry")).unwrap();
            let o = run_in(who, &s, &s.ws, &[], &[], "cargo build", cold);
            assert_eq!(out(&o), "cargo warm\ncargo warm\n", "{at}: {}", describe(&o));
            assert!(home.join(".cargo/registry").is_dir(), "{at}");
        }
    }
}

#[test]
fn locations_follow_the_tools_variables_and_symlinks_to_their_real_paths() {
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
        let script = "echo c > $CARGO_HOME/registry/c && cat $CARGO_HOME/registry/c; echo n > ~/.npm/n && cat ~/.npm/n";
        let o = run_in(who, &s, &s.ws, &[("CARGO_HOME", ch.clone())], &[], script, true);
        assert_eq!(out(&o), "c\nn\n", "{who:?}: {}", describe(&o));
        assert!(!ch.join("registry/c").exists(), "{who:?}: written to the host's CARGO_HOME");
        // Through the link: the cache is mounted at the real path, the host's stays empty.
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "{who:?}: written through a symlink");
        let o = run_in(who, &s, &s.ws, &[], &[], "cat ~/.npm/n", false);
        assert_eq!(out(&o), "n\n", "{who:?}: {}", describe(&o));
        // A missing location beneath a link is made at the real path, empty.
        let real_cache = s.root.join("real-cache");
        std::fs::remove_dir_all(s.root.join("home/.cache")).unwrap();
        std::fs::create_dir(&real_cache).unwrap();
        std::os::unix::fs::symlink(&real_cache, s.root.join("home/.cache")).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let o = run_in(who, &s, &s.ws, &[], &[], "echo p > ~/.cache/pip/p && cat ~/.cache/pip/p", true);
        assert_eq!(out(&o), "p\n", "{who:?}: {}", describe(&o));
        assert!(real_cache.join("pip").is_dir() && !real_cache.join("pip/p").exists(), "{who:?}");
    }
}

/// Where txbox makes nothing and mounts nothing, and the run goes on: a link into the
/// workspace, into a hidden place (the cache would make it visible again), a home the caller
/// does not own, a home others may write.
#[test]
fn no_cache_where_the_real_path_clashes_or_the_caller_is_not_alone() {
    for who in identities() {
        let s = setup(who, "caches-refused");
        stand_ins(&s);
        let home = s.root.join("home");
        let uid = match who {
            As::User(uid) => uid,
            As::Me => rustix::process::geteuid().as_raw(),
        };
        // `~/.cache` → the workspace: no cache for pip or go's build cache, nothing made.
        std::fs::remove_dir_all(home.join(".cache")).unwrap();
        std::os::unix::fs::symlink(&s.ws, home.join(".cache")).unwrap();
        // `~/.npm` → a hidden place (`~/.aws`), which stays hidden.
        std::fs::create_dir_all(home.join(".aws/npm")).unwrap();
        std::fs::write(home.join(".aws/credentials"), "secret").unwrap();
        std::fs::remove_dir(home.join(".npm")).unwrap();
        std::os::unix::fs::symlink(home.join(".aws/npm"), home.join(".npm")).unwrap();
        // `PIP_CACHE_DIR` in a hidden place, written as it is: the same.
        let pip = home.join(".ssh/pip");
        std::fs::create_dir_all(&pip).unwrap();
        if let As::User(uid) = who {
            s.chown(uid);
        }
        let script = "echo > ~/.cache/pip/t 2>/dev/null && echo pip; echo > ~/.npm/t 2>/dev/null && echo npm; \
                      echo > ~/.ssh/pip/t 2>/dev/null && echo ssh; \
                      cat ~/.aws/credentials 2>/dev/null; ls -A ~/.ssh 2>/dev/null; echo done";
        for cold in [false, true] {
            let o = run_in(who, &s, &s.ws, &[("PIP_CACHE_DIR", pip.clone())], &[], script, cold);
            assert_eq!(out(&o), "done\n", "{who:?} cold={cold}: {}", describe(&o));
            assert_eq!(o.status.code(), Some(0), "{who:?}: {}", describe(&o));
        }
        assert_eq!(std::fs::read_dir(&s.ws).unwrap().count(), 0, "{who:?}: made in the workspace");
        // A home the caller does not own, then one others may write: nothing made in it.
        std::fs::remove_file(home.join(".cache")).unwrap();
        std::fs::remove_file(home.join(".npm")).unwrap();
        let chown = |owner: u32| {
            let st = std::process::Command::new("chown").arg(owner.to_string()).arg(&home).status().unwrap();
            assert!(st.success());
        };
        let other = if uid == 0 { 65534 } else { 0 };
        for (owner, mode) in [(other, 0o755), (uid, 0o775), (uid, 0o757)] {
            if is_root() {
                chown(owner);
            } else if owner != uid {
                continue;
            }
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(mode)).unwrap();
            let o = run_in(who, &s, &s.ws, &[], &[], "npm install; echo $?", true);
            assert_eq!(out(&o), "1\n", "{who:?} {owner} {mode:o}: {}", describe(&o));
            assert!(!home.join(".npm").exists() && !home.join(".cache").exists(), "{who:?} {owner} {mode:o}");
        }
    }
}
