//! What every sandbox hides, by rule rather than by a short list: other people's homes, the
//! host's private keys, credentials of clouds and tools, other workspaces' state, and the
//! places host daemons keep their sockets. Data and a pure function ([`hidden`]); the facts
//! about the host it needs are gathered in one place ([`Host::gather`]).
//!
//! Hiding is a mount over the path (an empty, read-only directory or file), so the command
//! finds nothing there, and its writes fail. The list does not depend on what exists (looking
//! costs a `stat` each, on every run): the mount skips a missing path, and a warm server
//! watches where each would appear (`warm::server`), and retires when one does.
//!
//! Owns what is hidden, as data; may not mount (the mount plan does), nor look at the host beyond
//! what [`Host::gather`] collects.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The host's own secrets: account databases, private keys, credentials of services. Whole
/// directories where the directory holds nothing an ordinary command needs.
pub const SYSTEM: &[&str] = &[
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/security/opasswd",
    // Host keys (ssh_host_*_key) and the rest of the server's configuration.
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/pki/tls/private",
    "/etc/pki/CA/private",
    "/etc/letsencrypt",
    "/etc/ipsec.secrets",
    "/etc/ipsec.d/private",
    "/etc/wireguard",
    "/etc/openvpn",
    "/etc/NetworkManager/system-connections",
    "/etc/krb5.keytab",
    "/etc/sssd",
    "/var/lib/sss/db",
    "/var/lib/samba/private",
    // Clusters and clouds.
    "/etc/kubernetes",
    "/var/lib/kubelet/pki",
    "/etc/rancher",
    "/etc/boto.cfg",
    "/var/lib/cloud",
    "/var/lib/waagent",
    // systemd's credentials.
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/run/credentials",
    "/var/lib/systemd/credential.secret",
];

/// Where host daemons keep their control sockets, hidden as a second wall behind
/// `crate::supervisor` (which refuses every host socket wherever it is). Only places that
/// hold sockets and nothing an ordinary command needs: `/run` itself stays (DNS's
/// `resolv.conf` often lives there), and so do `/run/lock` and `/run/systemd/resolve`.
pub const SOCKET_PLACES: &[&str] = &[
    "/run/user",
    "/run/dbus",
    "/run/docker.sock",
    "/run/docker",
    "/run/containerd",
    "/run/podman",
    "/run/crio",
    "/run/libvirt",
    "/run/snapd.socket",
    "/run/snapd-snap.socket",
    "/run/systemd/private",
    "/run/systemd/journal",
    "/run/systemd/notify",
    "/run/systemd/userdb",
    "/var/run/docker.sock",
    "/var/run/dbus",
];

/// Credentials in the caller's home (relative to it): keys, tokens of clouds, registries and
/// tools (agents' own included), browser profiles, and shell histories (tokens typed on
/// command lines end up there).
pub const IN_HOME: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".password-store",
    ".local/share/keyrings",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".oci",
    ".config/doctl",
    ".config/hcloud",
    ".boto",
    ".s3cfg",
    ".config/rclone",
    ".terraform.d/credentials.tfrc.json",
    ".terraformrc",
    ".vault-token",
    ".docker/config.json",
    ".config/containers/auth.json",
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".config/glab-cli",
    ".config/op",
    ".pypirc",
    ".npmrc",
    ".gem/credentials",
    ".cargo/credentials.toml",
    ".cargo/credentials",
    ".m2/settings-security.xml",
    ".pgpass",
    ".my.cnf",
    ".claude/.credentials.json",
    ".codex/auth.json",
    ".config/github-copilot",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".thunderbird",
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
    ".node_repl_history",
];

/// What [`hidden`] needs to know about the host and the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// The caller's home (`$HOME`), real path.
    pub home: Option<PathBuf>,
    /// The caller is root (then `/root` is its own home, not someone else's).
    pub root: bool,
    /// Every entry of `/home`, real paths.
    pub homes: Vec<PathBuf>,
    /// The caller's `$XDG_RUNTIME_DIR`, where its agents' sockets are.
    pub runtime_dir: Option<PathBuf>,
    /// Other state directories of txbox the caller might reach (other users', other
    /// filesystems').
    pub states: Vec<PathBuf>,
}

/// Every path to hide, sorted, none beneath another, none that must stay visible: the
/// workspace and the writable paths, and every directory above them (hiding one would hide
/// them).
pub fn hidden(host: &Host, workspace: &Path, writable: &[PathBuf]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = SYSTEM.iter().chain(SOCKET_PLACES).map(PathBuf::from).collect();
    if let Some(h) = &host.home {
        v.extend(IN_HOME.iter().map(|rel| h.join(rel)));
    }
    // Other people's homes.
    v.extend(host.homes.iter().filter(|h| host.home.as_ref() != Some(*h)).cloned());
    if !host.root {
        v.push(PathBuf::from("/root"));
    }
    v.extend(host.runtime_dir.iter().cloned());
    v.extend(host.states.iter().cloned());
    let keep = |p: &Path| {
        beneath(workspace, p)
            || writable.iter().any(|w| beneath(w, p))
            || host.home.as_ref().is_some_and(|h| beneath(h, p))
    };
    v.retain(|p| p.is_absolute() && !keep(p));
    // Sorted as a tree is walked ('/' before any other byte), so that whatever lies beneath a
    // path comes right after it (and runs pay n log n byte comparisons, not component parsing).
    let tree = |b: &u8| if *b == b'/' { 0 } else { *b };
    v.sort_unstable_by(|a, b| a.as_os_str().as_bytes().iter().map(tree).cmp(b.as_os_str().as_bytes().iter().map(tree)));
    // A path beneath another hidden one is hidden with it.
    let mut out: Vec<PathBuf> = Vec::with_capacity(v.len());
    for p in v {
        if out.last().is_none_or(|last| !beneath(&p, last)) {
            out.push(p);
        }
    }
    out
}

/// Whether `p` is `dir` or lies beneath it, by bytes (the paths here are absolute and plain:
/// comparing components one by one costs most of the rule's time).
fn beneath(p: &Path, dir: &Path) -> bool {
    let (p, d) = (p.as_os_str().as_bytes(), dir.as_os_str().as_bytes());
    p.starts_with(d) && (p.len() == d.len() || p[d.len()] == b'/' || d.ends_with(b"/"))
}

impl Host {
    /// The facts about this host and caller. `states`: other state directories the caller
    /// knows of.
    pub fn gather(states: Vec<PathBuf>) -> Host {
        let real = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p);
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let mut homes: Vec<PathBuf> =
            std::fs::read_dir("/home").map(|d| d.flatten().map(|e| real(e.path())).collect()).unwrap_or_default();
        homes.sort();
        Host {
            home: var("HOME").filter(|h| h.is_absolute()).map(real),
            root: rustix::process::geteuid().is_root(),
            homes,
            runtime_dir: var("XDG_RUNTIME_DIR").filter(|p| p.is_absolute()),
            states,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Host {
        Host {
            home: Some("/home/ann".into()),
            root: false,
            homes: vec!["/home/ann".into(), "/home/bob".into(), "/home/cy".into()],
            runtime_dir: Some("/run/user/1000".into()),
            states: vec!["/srv/.txbox-state-1001".into()],
        }
    }

    fn has(v: &[PathBuf], p: &str) -> bool {
        v.iter().any(|x| x == Path::new(p))
    }

    #[test]
    fn other_homes_keys_credentials_and_sockets_are_hidden() {
        let v = hidden(&host(), Path::new("/home/ann/work"), &[]);
        for p in [
            "/home/bob",
            "/home/cy",
            "/root",
            "/etc/ssh",
            "/etc/ssl/private",
            "/etc/shadow",
            "/home/ann/.ssh",
            "/home/ann/.aws",
            "/home/ann/.claude/.credentials.json",
            "/home/ann/.bash_history",
            "/run/user",
            "/run/docker.sock",
            "/srv/.txbox-state-1001",
        ] {
            assert!(has(&v, p), "{p} not hidden: {v:#?}");
        }
        // The caller's own home and the workspace stay; /run/user/1000 goes with /run/user.
        assert!(!has(&v, "/home/ann") && !has(&v, "/home/ann/work"));
        assert!(!has(&v, "/run/user/1000"), "nested under /run/user: {v:#?}");
        let mut again = hidden(&host(), Path::new("/home/ann/work"), &[]);
        again.dedup();
        assert_eq!(v, again, "the same for the same host, each once");
    }

    #[test]
    fn nothing_above_the_workspace_or_a_writable_path_is_hidden() {
        // Root working in someone else's home: that home stays (it holds the workspace), the
        // others go, /root is root's own.
        let mut h = host();
        h.root = true;
        h.home = Some("/root".into());
        let v = hidden(&h, Path::new("/home/bob/project"), &["/home/cy/cache".into()]);
        assert!(!has(&v, "/home/bob") && !has(&v, "/home/cy") && !has(&v, "/root"), "{v:#?}");
        assert!(has(&v, "/home/ann") && has(&v, "/root/.ssh"), "{v:#?}");
        // A workspace inside a secret directory keeps that directory visible.
        let v = hidden(&host(), Path::new("/home/ann/.aws/tooling"), &[]);
        assert!(!has(&v, "/home/ann/.aws"), "{v:#?}");
    }

    #[test]
    fn beneath_compares_whole_components() {
        assert!(beneath(Path::new("/a/b"), Path::new("/a")) && beneath(Path::new("/a"), Path::new("/a")));
        assert!(beneath(Path::new("/a/b"), Path::new("/")));
        assert!(!beneath(Path::new("/ab"), Path::new("/a")) && !beneath(Path::new("/a"), Path::new("/a/b")));
    }

    #[test]
    fn without_a_home_only_the_host_rules_apply() {
        let h = Host { homes: vec!["/home/x".into()], ..Host::default() };
        let v = hidden(&h, Path::new("/w"), &[]);
        assert!(has(&v, "/home/x") && has(&v, "/root") && has(&v, "/etc/ssh"));
        assert!(!v.iter().any(|p| p.ends_with(".ssh")), "{v:#?}");
    }
}
