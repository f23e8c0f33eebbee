//! `txbox doctor`: what this host supports, and for anything missing, the exact fix.
//! Ends with a live probe: a real transaction in a scratch workspace.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;
use txbox::engine;
use txbox::request::{self, Command, RunRequest};
use txbox::request::{Io, Limits};
use txbox::result::Outcome;
use txbox_policy::Policy;

#[derive(Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    /// Essential checks make txbox unusable when they fail; others weaken a guarantee.
    essential: bool,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

fn read(p: &str) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn kernel_version() -> (u32, u32, String) {
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = release.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u32>().ok());
    (it.next().unwrap_or(0), it.next().unwrap_or(0), release)
}

fn checks(dir: &Path) -> Vec<Check> {
    let mut v = Vec::new();
    let root = rustix::process::geteuid().is_root();
    let (major, minor, release) = kernel_version();
    let recent = (major, minor) >= (5, 12);
    v.push(Check {
        name: "kernel",
        ok: recent,
        essential: true,
        detail: format!("Linux {release}"),
        fix: (!recent).then(|| "txbox needs Linux ≥ 5.12 (overlayfs in user namespaces, mount_setattr)".into()),
    });
    let max_userns = read("/proc/sys/user/max_user_namespaces").and_then(|s| s.parse::<u64>().ok()).unwrap_or(1);
    let clone_ok = read("/proc/sys/kernel/unprivileged_userns_clone").is_none_or(|s| s == "1");
    let apparmor = read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").is_some_and(|s| s == "1");
    let userns_ok = max_userns > 0 && clone_ok && !apparmor;
    v.push(Check {
        name: "user namespaces",
        ok: userns_ok || root,
        essential: !root,
        detail: format!(
            "max_user_namespaces={max_userns}, unprivileged_userns_clone={}, apparmor restriction={}",
            if clone_ok { "on" } else { "off" },
            if apparmor { "on" } else { "off" }
        ),
        fix: (!userns_ok).then(|| {
            let mut f = Vec::new();
            if max_userns == 0 {
                f.push("sysctl -w user.max_user_namespaces=15000");
            }
            if !clone_ok {
                f.push("sysctl -w kernel.unprivileged_userns_clone=1");
            }
            if apparmor {
                f.push("sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile for txbox with `userns,`)");
            }
            format!("{} — needed for users other than root", f.join("; "))
        }),
    });
    let overlay = read("/proc/filesystems").is_some_and(|s| s.lines().any(|l| l.ends_with("overlay")));
    v.push(Check {
        name: "overlayfs",
        ok: overlay,
        essential: true,
        detail: if overlay { "available".into() } else { "not in /proc/filesystems".into() },
        fix: (!overlay).then(|| "modprobe overlay".into()),
    });
    let abi = txbox_sandbox::landlock::kernel_abi();
    v.push(Check {
        name: "landlock",
        ok: abi > 0,
        essential: false,
        detail: if abi > 0 { format!("ABI {abi}") } else { "not available".into() },
        fix: (abi == 0).then(|| {
            "boot with `lsm=landlock,...` (CONFIG_SECURITY_LANDLOCK=y); the read-only mounts still confine writes"
                .into()
        }),
    });
    let seccomp = std::path::Path::new("/proc/sys/kernel/seccomp/actions_avail").exists();
    v.push(Check {
        name: "seccomp",
        ok: seccomp,
        essential: true,
        detail: read("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_else(|| "not available".into()),
        fix: (!seccomp).then(|| "a kernel with CONFIG_SECCOMP_FILTER=y".into()),
    });
    v.extend(edge_checks());
    let cg = txbox_sandbox::cgroup::probe();
    v.push(Check {
        name: "cgroups",
        ok: cg.limits_supported,
        essential: false,
        detail: cg.to_string(),
        fix: cg.hint.clone().map(|h| format!("{h} — without it --memory and --pids are refused")),
    });
    v.push(default_limits(root, dir));
    v
}

/// The default limits of a run without options (`txbox::limits`), and the one this host cannot
/// enforce: the kernel does not apply RLIMIT_NPROC to root.
fn default_limits(root: bool, dir: &Path) -> Check {
    let limits = Limits::default();
    let d = txbox::limits::with_defaults(&limits, dir);
    let write = d.max_write.map_or("none (the filesystem does not say)".into(), |w| format!("{} MiB here", w >> 20));
    let procs = txbox::limits::default_procs(&limits).unwrap_or(0);
    Check {
        name: "default limits",
        ok: !root,
        essential: false,
        detail: format!(
            "timeout {} s, write {write}, {procs} processes (RLIMIT_NPROC), memory: first OOM victim",
            txbox::limits::DEFAULT_TIMEOUT.as_secs()
        ),
        fix: root.then(|| {
            "runs as root get no default process limit (the kernel does not apply RLIMIT_NPROC to root); the pid \
             namespace still ends every process with the command; give --pids (cgroup) to cap it"
                .into()
        }),
    }
}

/// The sandbox's edge (docs/SECURITY.md): which mechanism keeps host unix sockets out of
/// reach, and what stands in where this kernel lacks one.
fn edge_checks() -> Vec<Check> {
    use txbox_sandbox::supervisor::{Guard, Support, LANDLOCK_UNIX_ABI};
    let s = Support::probe();
    let mut v = Vec::new();
    let (ok, essential, detail, fix) = match (s.guard, s.user_notif) {
        (Guard::Landlock, _) => {
            (true, false, format!("Landlock ABI {} scopes them to the command", s.landlock_abi), None)
        }
        (Guard::Supervisor, true) => (
            false,
            false,
            format!(
                "Landlock ABI {} cannot scope pathname sockets (needs {LANDLOCK_UNIX_ABI}); the seccomp supervisor \
                 stands in: connect and sends by address are checked and performed for the command",
                s.landlock_abi
            ),
            Some(format!("a kernel with Landlock ABI {LANDLOCK_UNIX_ABI} makes the supervisor unnecessary")),
        ),
        (Guard::Supervisor, false) => (
            false,
            true,
            "neither Landlock ABI 9 nor seccomp user notification: host sockets cannot be kept out".into(),
            Some("a kernel with seccomp user notification (Linux ≥ 5.9)".into()),
        ),
    };
    v.push(Check { name: "unix sockets", ok, essential, detail, fix });
    v.push(Check {
        name: "warm clients",
        ok: s.peer_pidfd,
        essential: false,
        detail: if s.peer_pidfd {
            "only launchers outside every sandbox are served (SO_PEERPIDFD)".into()
        } else {
            "SO_PEERPIDFD missing: warm servers check the client's uid only (no sandbox reaches their socket)".into()
        },
        fix: (!s.peer_pidfd).then(|| "Linux ≥ 6.5".into()),
    });
    let scopes = s.landlock_abi >= 6;
    v.push(Check {
        name: "landlock scopes",
        ok: scopes,
        essential: false,
        detail: if scopes {
            "abstract sockets and signals scoped to the command".into()
        } else {
            "no abstract-socket or signal scoping; the network and pid namespaces and the supervisor stand in".into()
        },
        fix: (!scopes).then(|| "Linux ≥ 6.12 (Landlock ABI 6)".into()),
    });
    if let Some(on) = s.legacy_tiocsti {
        v.push(Check {
            name: "terminal",
            ok: !on,
            essential: false,
            detail: if on {
                "TIOCSTI works on this kernel (legacy_tiocsti=1); the seccomp filter refuses it and the command has a \
                 session and terminal of its own"
                    .into()
            } else {
                "TIOCSTI off for everyone (legacy_tiocsti=0)".into()
            },
            fix: on.then(|| "sysctl -w dev.tty.legacy_tiocsti=0".into()),
        });
    }
    v
}

fn live_probe() -> Check {
    let dir = PathBuf::from(format!("/var/tmp/txbox-doctor-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let req = RunRequest {
        workspace: dir.clone(),
        state_dir: None,
        cwd: dir.clone(),
        command: Command::Shell("echo probe > probe.txt".into()),
        policy: Policy::builtin(),
        policy_file: None,
        io: Io::Api,
        limits: Limits::default(),
        validate: None,
        no_commit: false,
        keep_on_failure: false,
        isolation: Default::default(),
        pass_env: Vec::new(),
        keep: Default::default(),
    };
    let r = engine::run(&req);
    let ok = matches!(&r, Ok(r) if r.outcome == Outcome::Committed) && dir.join("probe.txt").exists();
    let detail = match &r {
        Ok(r) if ok => format!("committed a transaction in {}", txbox::render::ms(r.duration_ms)),
        Ok(r) => r.error.clone().unwrap_or_else(|| format!("outcome {}", r.outcome.as_str())),
        Err(e) => e.to_string(),
    };
    let _ = txbox_txn::state::remove_tree(&dir);
    Check { name: "live transaction", ok, essential: true, detail, fix: (!ok).then(|| "see the checks above".into()) }
}

/// `doctor -C DIR`: whether DIR can be a workspace, and where its state directory is (or will
/// be). Reads only: nothing is made for it.
fn workspace_check(state_dir: Option<&Path>, ws: &Path) -> Check {
    let failed = |detail: String, fix: &str| Check {
        name: "workspace",
        ok: false,
        essential: true,
        detail,
        fix: Some(fix.into()),
    };
    let real = match request::resolve_workspace(ws) {
        Ok(real) => real,
        Err(e) => return failed(e.to_string(), "name a project directory with -C"),
    };
    match txbox_txn::StateDir::existing_for_workspace(state_dir, &real) {
        Ok(Some(state)) => Check {
            name: "workspace",
            ok: true,
            essential: true,
            detail: format!("{}: state directory {}", real.display(), state.root.display()),
            fix: None,
        },
        Ok(None) => Check {
            name: "workspace",
            ok: true,
            essential: true,
            detail: format!("{}: no state directory yet; the first transaction makes one", real.display()),
            fix: None,
        },
        Err(e) => {
            failed(format!("{}: {e}", real.display()), "see the message: txbox uses only state directories it made")
        }
    }
}

/// Objects of a workspace an unprivileged sandbox cannot change: its user namespace maps only
/// the caller's uid and gid, and overlayfs gives a copy its owner and group, so writing one
/// whose owner or group is another fails inside with EOVERFLOW (docs/DEVIATIONS.md).
#[derive(Debug, Default, PartialEq, Eq)]
struct Foreign {
    looked: usize,
    /// Owned by another user.
    owner: usize,
    /// Ours, in another group.
    group: usize,
    /// The first few of either, for the message.
    first: Vec<PathBuf>,
}

impl Foreign {
    /// Pure: tally `(path, uid, gid)` for a caller `euid`/`egid`.
    fn tally(entries: impl Iterator<Item = (PathBuf, u32, u32)>, euid: u32, egid: u32) -> Foreign {
        let mut f = Foreign::default();
        for (p, uid, gid) in entries {
            f.looked += 1;
            if uid != euid {
                f.owner += 1;
            } else if gid != egid {
                f.group += 1;
            } else {
                continue;
            }
            if f.first.len() < 3 {
                f.first.push(p);
            }
        }
        f
    }
}

/// At most this many entries of a workspace are looked at by `doctor -C`.
const OWNERSHIP_BOUND: usize = 200_000;

/// The workspace's entries (not following symlinks, not crossing into another filesystem), up
/// to [`OWNERSHIP_BOUND`], relative to it; and whether the bound cut the walk short.
fn entries(ws: &Path) -> (Vec<(PathBuf, u32, u32)>, bool) {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::symlink_metadata(ws).map(|m| m.dev()).ok();
    let mut todo = vec![ws.to_path_buf()];
    let mut out = Vec::new();
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            let p = e.path();
            // A mount inside (a network or FUSE filesystem, a large bind mount) is not walked.
            if md.is_dir() && Some(md.dev()) == dev {
                todo.push(p.clone());
            }
            out.push((p.strip_prefix(ws).map(Path::to_path_buf).unwrap_or(p), md.uid(), md.gid()));
            if out.len() >= OWNERSHIP_BOUND {
                return (out, true);
            }
        }
    }
    (out, false)
}

/// `doctor -C DIR` as an unprivileged caller: whether the workspace holds objects its sandbox
/// cannot change. None for root, whose sandbox maps every owner.
fn ownership_check(ws: &Path) -> Option<Check> {
    use std::os::unix::fs::MetadataExt;
    let (euid, egid) = (rustix::process::geteuid(), rustix::process::getegid());
    if euid.is_root() {
        return None;
    }
    let (all, cut) = entries(ws);
    let f = Foreign::tally(all.into_iter(), euid.as_raw(), egid.as_raw());
    let ok = f.owner == 0 && f.group == 0;
    let looked = if cut {
        format!("the first {} entries (the walk stops there)", f.looked)
    } else {
        format!("{} entries", f.looked)
    };
    let detail = if ok {
        format!("{looked}, all yours in your group")
    } else {
        let first: Vec<String> =
            f.first.iter().map(|p| txbox::render::printable(&p.to_string_lossy()).into_owned()).collect();
        format!(
            "of {looked}, {} belong to another user and {} to another group (e.g. {}): a command cannot \
             change them in an unprivileged sandbox (EOVERFLOW, \"Value too large for defined data type\")",
            f.owner,
            f.group,
            first.join(", ")
        )
    };
    let fix = (!ok).then(|| {
        let quoted = crate::hook::quote(&txbox::render::printable(&ws.to_string_lossy()));
        // A shared project directory (setgid, in a group of the caller's): its files are meant
        // to be in that group, and taking them out of it would lock the team out.
        let root_gid = std::fs::metadata(ws).map(|m| m.gid()).ok();
        let shared = std::fs::metadata(ws).is_ok_and(|m| m.mode() & 0o2000 != 0)
            && root_gid.is_some_and(|g| g != egid.as_raw() && txbox_txn::check::member_groups().contains(&g));
        let mut fix = match root_gid.filter(|_| shared) {
            Some(g) => {
                format!("run txbox with the project's group as your own (`sg {g} -c 'txbox …'` or `newgrp {g}`)")
            }
            None => format!("chgrp -R -- {} {quoted}", egid.as_raw()),
        };
        if f.owner > 0 {
            fix.push_str("; objects of other users need their owner changed (chown, as root) or txbox run as root");
        }
        fix
    });
    Some(Check { name: "ownership", ok, essential: false, detail, fix })
}

/// `dir`: the workspace `-C` named (its filesystem's default write limit, its state
/// directory), else the current directory.
pub fn run(json: bool, state_dir: Option<&Path>, workspace: Option<&Path>) -> Result<i32> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let mut all = checks(workspace.unwrap_or(&cwd));
    if let Some(ws) = workspace {
        all.push(workspace_check(state_dir, ws));
        all.extend(ownership_check(ws));
    }
    all.push(live_probe());
    let healthy = all.iter().all(|c| c.ok || !c.essential);
    if json {
        println!("{}", serde_json::json!({ "ok": healthy, "checks": all }));
    } else {
        for c in &all {
            let mark = if c.ok {
                "ok  "
            } else if c.essential {
                "FAIL"
            } else {
                "warn"
            };
            println!("{mark} {:<17} {}", c.name, c.detail);
            if let Some(f) = &c.fix {
                println!("     {:<17} fix: {f}", "");
            }
        }
        println!(
            "{}",
            if healthy { "txbox can run here." } else { "txbox cannot run here until the FAIL lines are fixed." }
        );
    }
    Ok(if healthy { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_owners_and_groups_are_counted_apart() {
        let e = |p: &str, u, g| (PathBuf::from(p), u, g);
        let f = Foreign::tally(
            [e("a", 1000, 1000), e("b", 1000, 0), e("c", 0, 1000), e("d", 0, 0)].into_iter(),
            1000,
            1000,
        );
        assert_eq!((f.looked, f.owner, f.group), (4, 2, 1));
        assert_eq!(f.first, [PathBuf::from("b"), PathBuf::from("c"), PathBuf::from("d")]);
        let f = Foreign::tally([e("a", 1000, 1000)].into_iter(), 1000, 1000);
        assert_eq!((f.owner, f.group, f.first.len()), (0, 0, 0));
    }
}
