//! What every sandbox hides, by rule rather than by a short list: other people's homes, the
//! host's private keys, credentials of clouds and tools, other workspaces' state, and the
//! places host daemons keep their sockets. Data and a pure function ([`hidden`]); the facts
//! about the host it needs are gathered in one place ([`Host::gather`]).
//!
//! Hiding is a mount over the path (an empty, read-only directory or file), so the command
//! finds nothing there, and its writes fail. Every named path is in the list whether it exists
//! or not: the mount skips a missing path, and a warm server watches where each would appear
//! (`warm::server`), and retires when one does. What does exist is also hidden where it really
//! is, past symlinks (one `lstat` per named path, a few more for those that exist).
//!
//! Owns what is hidden, as data; may not mount (the mount plan does), nor look at the host beyond
//! what [`Host::gather`] collects.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub mod watched;

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
///
/// Each path is hidden where it was named and where it really is: a secret named through a
/// symlink (a dotfile manager's `~/.ssh -> /data/dotfiles/ssh`, `/var/run -> /run`), and the
/// symlinks directly inside the caller's hidden directories (`~/.aws/credentials -> ...`), are
/// followed (`look`) and their real paths hidden too. A link that lies in the workspace or a
/// writable path is the command's to make, and following it out could hide anything (`/usr`):
/// it is followed only into the workspace. A real path that must stay visible stays (the same
/// rule as a named one). The
/// mount itself never follows a symlink (`MountOp::Hide`), so a named path whose real place is
/// refused here hides nothing, rather than whatever its link points to when the sandbox is built.
pub fn hidden(host: &Host, workspace: &Path, writable: &[PathBuf], look: &dyn Look) -> Vec<PathBuf> {
    // The named paths share their parents (`/etc`, `/run`, the home), which resolving each
    // would look at again.
    let look = &Memo::new(look);
    let mut v: Vec<PathBuf> = SYSTEM.iter().chain(SOCKET_PLACES).map(PathBuf::from).collect();
    // The caller's own: their links (dotfile managers) are looked into, one level.
    let mut own: Vec<PathBuf> = Vec::new();
    if let Some(h) = &host.home {
        own.extend(IN_HOME.iter().map(|rel| h.join(rel)));
    }
    own.extend(host.runtime_dir.iter().cloned());
    // Other people's homes.
    v.extend(host.homes.iter().filter(|h| host.home.as_ref() != Some(*h)).cloned());
    if !host.root {
        v.push(PathBuf::from("/root"));
    }
    let keep = |p: &Path| {
        beneath(workspace, p)
            || writable.iter().any(|w| beneath(w, p))
            || host.home.as_ref().is_some_and(|h| beneath(h, p))
    };
    // A link the command could have made is followed only into the workspace (whose view the
    // command owns anyway).
    let hostile = |link: &Path| beneath(link, workspace) || writable.iter().any(|w| beneath(link, w));
    let trusted = |r: &Real| beneath(&r.path, workspace) || !r.via.iter().any(|l| hostile(l));
    let mut real: Vec<PathBuf> = Vec::new();
    let named = v.iter().map(|p| (p, false)).chain(own.iter().map(|p| (p, true)));
    for (p, mine) in named.filter(|(p, _)| p.is_absolute()) {
        // Most named paths do not exist: one `lstat` each, and nothing more.
        if look.kind(p).is_none() {
            continue;
        }
        let Some(r) = resolve(look, p) else { continue };
        // (Compared as bytes: `Path`'s equality does not see `/srv/rt/` as another name.)
        let same = r.path.as_os_str() == p.as_os_str();
        let hides = (same || trusted(&r)) && !keep(&r.path);
        // Into a directory only if it is hidden itself (not `/`, where a link leads to `/usr`).
        if mine && hides && r.kind == Kind::Dir {
            for link in look.links_in(&r.path) {
                real.extend(resolve(look, &link).filter(|l| trusted(l)).map(|l| l.path));
            }
        }
        if hides && !same {
            real.push(r.path);
        }
    }
    v.extend(own);
    v.extend(real);
    // Other state directories are named as found (real directories only: `Host::gather`).
    v.extend(host.states.iter().cloned());
    // A name with `.`, `..` or a doubled or trailing `/` (a runtime directory as the caller
    // wrote it) is hidden by its real path only: `..` would defeat the byte comparisons of
    // `keep` (`/w/ws/..` is above the workspace), and the mount would follow it.
    v.retain(|p| plain(p) && !keep(p));
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

/// Whether `p` is absolute and spelled as its components join: no `.`, `..`, `//`, trailing `/`.
fn plain(p: &Path) -> bool {
    let b = p.as_os_str().as_bytes();
    p.is_absolute()
        && (b == b"/" || !b.ends_with(b"/"))
        && !b.windows(2).any(|w| w == b"//")
        && p.components().all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)))
}

/// Whether `p` is `dir` or lies beneath it, by bytes (the paths here are absolute and plain:
/// comparing components one by one costs most of the rule's time).
fn beneath(p: &Path, dir: &Path) -> bool {
    let (p, d) = (p.as_os_str().as_bytes(), dir.as_os_str().as_bytes());
    p.starts_with(d) && (p.len() == d.len() || p[d.len()] == b'/' || d.ends_with(b"/"))
}

/// What a path is, without following it when it is a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    Link,
    Other,
}

/// How [`hidden`] looks at the host's filesystem (a seam: [`HostFs`] is the real one).
pub trait Look {
    /// What is at `p` (`lstat`: a final symlink is not followed, those on the way are), or
    /// nothing.
    fn kind(&self, p: &Path) -> Option<Kind>;
    /// Where the symlink `p` points.
    fn link(&self, p: &Path) -> Option<PathBuf>;
    /// The symlinks directly in the directory `dir`, by their paths.
    fn links_in(&self, dir: &Path) -> Vec<PathBuf>;
}

/// A [`Look`] that keeps what it found: each path that exists is looked at once. (What does
/// not exist is not kept: [`hidden`] asks for such a path once and goes on.)
struct Memo<'a> {
    look: &'a dyn Look,
    found: std::cell::RefCell<std::collections::HashMap<PathBuf, Kind>>,
}

impl<'a> Memo<'a> {
    fn new(look: &'a dyn Look) -> Self {
        Memo { look, found: std::cell::RefCell::new(std::collections::HashMap::new()) }
    }
}

impl Look for Memo<'_> {
    fn kind(&self, p: &Path) -> Option<Kind> {
        if let Some(k) = self.found.borrow().get(p) {
            return Some(*k);
        }
        let k = self.look.kind(p)?;
        self.found.borrow_mut().insert(p.to_path_buf(), k);
        Some(k)
    }

    fn link(&self, p: &Path) -> Option<PathBuf> {
        self.look.link(p)
    }

    fn links_in(&self, dir: &Path) -> Vec<PathBuf> {
        self.look.links_in(dir)
    }
}

/// The host's filesystem, as this process sees it.
pub struct HostFs;

impl Look for HostFs {
    fn kind(&self, p: &Path) -> Option<Kind> {
        let st = rustix::fs::lstat(p).ok()?;
        Some(match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::Directory => Kind::Dir,
            rustix::fs::FileType::Symlink => Kind::Link,
            _ => Kind::Other,
        })
    }

    fn link(&self, p: &Path) -> Option<PathBuf> {
        std::fs::read_link(p).ok()
    }

    fn links_in(&self, dir: &Path) -> Vec<PathBuf> {
        let Ok(d) = std::fs::read_dir(dir) else { return Vec::new() };
        // The kind comes with the entry (d_type): no `lstat` per entry.
        d.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_symlink())).map(|e| e.path()).collect()
    }
}

/// Where a path really is, and the symlinks followed on the way there (by their real paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Real {
    pub path: PathBuf,
    /// What is there.
    pub kind: Kind,
    pub via: Vec<PathBuf>,
}

/// Links followed before giving up (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// `p` resolved component by component as the kernel would (`..` after the link it follows),
/// noting every symlink on the way; nothing when a component is missing or links loop.
pub fn resolve(look: &dyn Look, p: &Path) -> Option<Real> {
    use std::path::Component;
    let mut rest: std::collections::VecDeque<std::ffi::OsString> = std::collections::VecDeque::new();
    let push_front = |rest: &mut std::collections::VecDeque<std::ffi::OsString>, p: &Path| {
        for c in p.components().rev() {
            match c {
                Component::Normal(n) => rest.push_front(n.to_os_string()),
                Component::ParentDir => rest.push_front("..".into()),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
    };
    if !p.is_absolute() {
        return None;
    }
    push_front(&mut rest, p);
    let mut done = PathBuf::from("/");
    let mut kind = Kind::Dir;
    let mut via = Vec::new();
    while let Some(c) = rest.pop_front() {
        if c == ".." {
            done.pop();
            kind = Kind::Dir;
            continue;
        }
        let next = done.join(&c);
        kind = look.kind(&next)?;
        match kind {
            Kind::Link => {
                if via.len() >= MAX_LINKS {
                    return None;
                }
                let to = look.link(&next)?;
                if to.is_absolute() {
                    done = PathBuf::from("/");
                }
                push_front(&mut rest, &to);
                via.push(next);
                // Where it leads is a directory unless a later component says otherwise.
                kind = Kind::Dir;
            }
            Kind::Dir | Kind::Other => done = next,
        }
    }
    Some(Real { path: done, kind, via })
}

impl Host {
    /// The facts about this host and caller. `states`: other state directories the caller
    /// knows of (real directories: a symlink there could be anyone's, and is not followed).
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
            // As named: `hidden` hides it where it really is as well.
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
        v.iter().any(|x| x.as_os_str() == p)
    }

    #[test]
    fn other_homes_keys_credentials_and_sockets_are_hidden() {
        let v = hidden(&host(), Path::new("/home/ann/work"), &[], &Fake::default());
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
        let mut again = hidden(&host(), Path::new("/home/ann/work"), &[], &Fake::default());
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
        let v = hidden(&h, Path::new("/home/bob/project"), &["/home/cy/cache".into()], &Fake::default());
        assert!(!has(&v, "/home/bob") && !has(&v, "/home/cy") && !has(&v, "/root"), "{v:#?}");
        assert!(has(&v, "/home/ann") && has(&v, "/root/.ssh"), "{v:#?}");
        // A workspace inside a secret directory keeps that directory visible.
        let v = hidden(&host(), Path::new("/home/ann/.aws/tooling"), &[], &Fake::default());
        assert!(!has(&v, "/home/ann/.aws"), "{v:#?}");
    }

    /// A filesystem of real paths: directories (`None`), files and symlinks.
    #[derive(Default)]
    struct Fake(std::collections::BTreeMap<PathBuf, Option<Kind>>, std::collections::BTreeMap<PathBuf, PathBuf>);

    impl Fake {
        fn new(dirs: &[&str], files: &[&str], links: &[(&str, &str)]) -> Fake {
            let mut f = Fake::default();
            let all = dirs.iter().map(|d| (d, Kind::Dir)).chain(files.iter().map(|f| (f, Kind::Other)));
            for (p, kind) in all.chain(links.iter().map(|(l, _)| (l, Kind::Link))) {
                for a in Path::new(p).ancestors().skip(1) {
                    f.0.insert(a.to_path_buf(), Some(Kind::Dir));
                }
                f.0.insert(p.into(), Some(kind));
            }
            f.1 = links.iter().map(|(l, to)| (PathBuf::from(l), PathBuf::from(to))).collect();
            f
        }

        /// `p` with the directories on the way resolved.
        fn at(&self, p: &Path) -> Option<PathBuf> {
            Some(resolve(self, p.parent()?)?.path.join(p.file_name()?))
        }
    }

    impl Look for Fake {
        fn kind(&self, p: &Path) -> Option<Kind> {
            match self.at(p) {
                Some(at) => self.0.get(&at).copied().flatten(),
                None => (p == Path::new("/")).then_some(Kind::Dir),
            }
        }
        fn link(&self, p: &Path) -> Option<PathBuf> {
            self.1.get(&self.at(p)?).cloned()
        }
        fn links_in(&self, dir: &Path) -> Vec<PathBuf> {
            self.1.keys().filter(|p| p.parent() == Some(dir)).cloned().collect()
        }
    }

    #[test]
    fn secrets_named_through_symlinks_are_hidden_where_they_really_are() {
        let fs = Fake::new(
            &["/home/ann/.aws", "/data/dotfiles/ssh", "/srv/rt", "/run/dbus", "/data/gh"],
            &["/data/aws/credentials", "/data/keys/id"],
            &[
                // A dotfile manager's links: a directory, a file inside a hidden directory, a
                // relative one, and one through a linked parent.
                ("/home/ann/.ssh", "/data/dotfiles/ssh"),
                ("/home/ann/.aws/credentials", "../../../data/aws/credentials"),
                ("/home/ann/.config", "/data/config"),
                ("/data/config/gh", "/data/gh"),
                ("/data/dotfiles/ssh/id", "/data/keys/id"),
                // The runtime directory behind a link, and /var/run -> /run.
                ("/tmp/xdg", "/srv/rt"),
                ("/var/run", "/run"),
            ],
        );
        let mut h = host();
        h.runtime_dir = Some("/tmp/xdg".into());
        let v = hidden(&h, Path::new("/home/ann/work"), &[], &fs);
        for p in [
            "/home/ann/.ssh",
            "/data/dotfiles/ssh",
            "/home/ann/.aws",
            "/data/aws/credentials",
            "/home/ann/.config/gh",
            "/data/gh",
            "/tmp/xdg",
            "/srv/rt",
            "/var/run/dbus",
            "/run/dbus",
        ] {
            assert!(has(&v, p), "{p} not hidden: {v:#?}");
        }
        // One level into the caller's hidden directories: the key the linked ~/.ssh holds is
        // hidden with it (beneath /data/dotfiles/ssh), and a link inside is followed too.
        assert!(has(&v, "/data/keys/id"), "{v:#?}");
    }

    #[test]
    fn a_real_path_that_must_stay_visible_is_not_hidden() {
        // The workspace, an ancestor of it, the root, a writable path: named through a secret's
        // link, each stays; the link's own name is still listed (the mount never follows it).
        for to in ["/", "/w", "/w/ws", "/cache", "/home/ann", "/home"] {
            // Links in each of them, which a hidden directory's would be followed.
            let links = [("/home/ann/.aws", to), ("/bin", "usr/bin"), ("/w/l", "/usr/bin"), ("/cache/l", "/usr/bin")];
            let fs = Fake::new(&["/w/ws", "/cache", "/usr/bin"], &[], &links);
            let v = hidden(&host(), Path::new("/w/ws"), &["/cache".into()], &fs);
            assert!(has(&v, "/home/ann/.aws") && !has(&v, "/usr/bin"), "{to}: {v:#?}");
            assert!(!v.iter().any(|p| p == Path::new(to)), "{to} hidden: {v:#?}");
            assert!(!v.iter().any(|p| beneath(Path::new("/w/ws"), p) || beneath(Path::new("/cache"), p)), "{v:#?}");
        }
    }

    #[test]
    fn links_the_command_could_make_are_followed_only_into_the_workspace() {
        // The caller works in their home: a link there is the command's to make.
        let mut h = host();
        h.home = Some("/home/ann".into());
        let fs = Fake::new(
            &["/usr/lib", "/home/ann/keys", "/home/ann/.config"],
            &[],
            &[
                ("/home/ann/.ssh", "/usr/lib"),
                ("/home/ann/.aws", "/home/ann/keys"),
                ("/home/ann/.gnupg", "/home/ann/.config"),
                ("/home/ann/.config/gh", "/usr"),
            ],
        );
        let v = hidden(&h, Path::new("/home/ann"), &[], &fs);
        assert!(!has(&v, "/usr/lib") && !has(&v, "/usr"), "{v:#?}");
        assert!(has(&v, "/home/ann/keys") && has(&v, "/home/ann/.config"), "inside the workspace: {v:#?}");
        // A link in a writable path: the same.
        let v = hidden(&host(), Path::new("/w"), &["/home/ann/.config".into()], &fs);
        assert!(!has(&v, "/usr"), "{v:#?}");
        // Into the workspace from the caller's home (the workspace is a dotfiles repository).
        let fs = Fake::new(&["/home/ann/dotfiles/ssh"], &[], &[("/home/ann/.ssh", "/home/ann/dotfiles/ssh")]);
        let v = hidden(&host(), Path::new("/home/ann/dotfiles"), &[], &fs);
        assert!(has(&v, "/home/ann/dotfiles/ssh"), "{v:#?}");
    }

    #[test]
    fn a_name_that_is_not_plain_is_hidden_by_its_real_path_only() {
        let fs = Fake::new(&["/w/ws", "/srv/rt", "/run/user/1000"], &[], &[]);
        for (named, real) in [("/w/ws/..", None), ("/srv/rt/", Some("/srv/rt")), ("/srv//rt/.", Some("/srv/rt"))] {
            let mut h = host();
            h.runtime_dir = Some(named.into());
            let v = hidden(&h, Path::new("/w/ws"), &[], &fs);
            assert!(!has(&v, named) && !has(&v, "/w") && !has(&v, "/w/ws"), "{named}: {v:#?}");
            assert!(real.is_none_or(|r| has(&v, r)), "{named}: {v:#?}");
        }
        assert!(plain(Path::new("/")) && plain(Path::new("/a/b")) && !plain(Path::new("a")));
    }

    /// Resolving each named path would look at its parents again (`/etc` once per secret in
    /// it): every path that exists is looked at once, whatever the number of names under it.
    #[test]
    fn each_path_that_exists_is_looked_at_once() {
        struct Counting<'a>(&'a Fake, std::cell::RefCell<std::collections::BTreeMap<PathBuf, usize>>);
        impl Look for Counting<'_> {
            fn kind(&self, p: &Path) -> Option<Kind> {
                *self.1.borrow_mut().entry(p.to_path_buf()).or_default() += 1;
                self.0.kind(p)
            }
            fn link(&self, p: &Path) -> Option<PathBuf> {
                self.0.link(p)
            }
            fn links_in(&self, dir: &Path) -> Vec<PathBuf> {
                self.0.links_in(dir)
            }
        }
        let fs = Fake::new(
            &["/etc", "/etc/ssh", "/etc/ssl", "/etc/ssl/private", "/home", "/home/ann", "/home/ann/.ssh", "/run"],
            &["/etc/shadow", "/etc/gshadow", "/home/ann/.netrc"],
            &[("/var", "/srv/var")],
        );
        let c = Counting(&fs, Default::default());
        let v = hidden(&host(), Path::new("/home/ann/work"), &[], &c);
        assert!(has(&v, "/etc/ssh") && has(&v, "/etc/shadow") && has(&v, "/home/ann/.netrc"), "{v:#?}");
        for (p, n) in c.1.borrow().iter() {
            if fs.kind(p).is_some() {
                assert_eq!(*n, 1, "{} looked at {n} times", p.display());
            }
        }
    }

    #[test]
    fn resolving_follows_the_kernels_rules() {
        let fs = Fake::new(
            &["/a/b", "/c"],
            &["/c/f"],
            &[("/a/up", ".."), ("/a/rel", "b/../../c"), ("/l1", "/l2"), ("/l2", "/l1"), ("/dangling", "/nowhere")],
        );
        let r = |p: &str| resolve(&fs, Path::new(p)).map(|r| (r.path, r.kind, r.via.len()));
        assert_eq!(r("/a/up/c/f"), Some(("/c/f".into(), Kind::Other, 1)));
        assert_eq!(r("/a/rel"), Some(("/c".into(), Kind::Dir, 1)));
        assert_eq!(r("/a/b/../../c"), Some(("/c".into(), Kind::Dir, 0)));
        assert_eq!(r("/l1"), None, "a loop");
        assert_eq!(r("/dangling"), None);
        assert_eq!(r("relative"), None);
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
        let v = hidden(&h, Path::new("/w"), &[], &Fake::default());
        assert!(has(&v, "/home/x") && has(&v, "/root") && has(&v, "/etc/ssh"));
        assert!(!v.iter().any(|p| p.ends_with(".ssh")), "{v:#?}");
    }
}
