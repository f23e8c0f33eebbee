//! Path classes: where an argument would point, decided lexically against the [`Context`]
//! (no filesystem access, so symlinks are not followed; the sandbox contains what this misses).

use std::borrow::Cow;
use std::path::{Component, Path, PathBuf};

use crate::Context;

/// One class a path can belong to. A path usually has several (e.g. `/usr` is `system`,
/// `system-dir` and `outside`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathClass {
    /// Strictly inside the workspace.
    Workspace,
    /// The workspace directory itself.
    WorkspaceRoot,
    /// A strict ancestor of the workspace (deleting it deletes the workspace and more).
    WorkspaceAncestor,
    /// Not inside the workspace and not scratch space.
    Outside,
    /// `/` itself.
    Root,
    /// At or below a system directory (`/usr`, `/etc`, `/var`, ...).
    System,
    /// Exactly a top-level system directory or a standard subtree (`/usr/lib`, `/var/log`).
    SystemDir,
    /// At or below a home directory (`~`, `/home/*`, `/root`, `/Users/*`).
    Home,
    /// Exactly a home directory, or `/home`, `/Users`.
    HomeDir,
    /// Credentials: `~/.ssh`, `~/.aws`, `/etc/shadow`, private keys, ...
    Secret,
    /// Accounts, sudoers and boot files whose loss breaks the machine.
    Critical,
    /// A device node other than the harmless ones (`/dev/null`, `/dev/tty`, ...).
    Device,
    /// Kernel tunables: `/proc/sys`, `/proc/sysrq-trigger`, `/sys`.
    Kernel,
    /// Bash's network pseudo-files `/dev/tcp/*`, `/dev/udp/*`.
    Network,
    /// Private scratch space: `/tmp`, `/var/tmp`, `/dev/shm`.
    Scratch,
    /// Not resolvable statically (a variable, a command substitution, an unknown cwd).
    Dynamic,
    /// A file of the host a write would change: outside the workspace and scratch space, and
    /// not a stream (`/dev/null`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`, a terminal).
    Host,
    /// A file the host runs by itself later: shell startup files, `authorized_keys`, cron,
    /// at and systemd directories, init scripts, `ld.so.preload`, autostart entries.
    Persistence,
}

pub const ALL_CLASSES: &[PathClass] = &[
    PathClass::Workspace,
    PathClass::WorkspaceRoot,
    PathClass::WorkspaceAncestor,
    PathClass::Outside,
    PathClass::Root,
    PathClass::System,
    PathClass::SystemDir,
    PathClass::Home,
    PathClass::HomeDir,
    PathClass::Secret,
    PathClass::Critical,
    PathClass::Device,
    PathClass::Kernel,
    PathClass::Network,
    PathClass::Scratch,
    PathClass::Dynamic,
    PathClass::Host,
    PathClass::Persistence,
];

impl PathClass {
    pub fn as_str(self) -> &'static str {
        match self {
            PathClass::Workspace => "workspace",
            PathClass::WorkspaceRoot => "workspace-root",
            PathClass::WorkspaceAncestor => "workspace-ancestor",
            PathClass::Outside => "outside",
            PathClass::Root => "root",
            PathClass::System => "system",
            PathClass::SystemDir => "system-dir",
            PathClass::Home => "home",
            PathClass::HomeDir => "home-dir",
            PathClass::Secret => "secret",
            PathClass::Critical => "critical",
            PathClass::Device => "device",
            PathClass::Kernel => "kernel",
            PathClass::Network => "network",
            PathClass::Scratch => "scratch",
            PathClass::Dynamic => "dynamic",
            PathClass::Host => "host",
            PathClass::Persistence => "persistence",
        }
    }

    pub fn parse(s: &str) -> Option<PathClass> {
        ALL_CLASSES.iter().copied().find(|c| c.as_str() == s)
    }

    const fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A small set of [`PathClass`]es.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct ClassSet(u32);

impl ClassSet {
    pub fn of(classes: &[PathClass]) -> Self {
        ClassSet(classes.iter().fold(0, |acc, c| acc | c.bit()))
    }
    pub fn insert(&mut self, c: PathClass) {
        self.0 |= c.bit();
    }
    pub fn remove(&mut self, c: PathClass) {
        self.0 &= !c.bit();
    }
    pub fn contains(self, c: PathClass) -> bool {
        self.0 & c.bit() != 0
    }
    /// A stream (`/dev/null`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`, a terminal, bash's
    /// `/dev/tcp/*`): outside the workspace and scratch space, yet no file of the host
    /// ([`classify_abs`] gives every other such path but `/` [`PathClass::Host`]). Writing one
    /// changes no file.
    pub fn is_stream(self) -> bool {
        self.contains(PathClass::Outside)
            && !self.contains(PathClass::Host)
            && !self.contains(PathClass::Scratch)
            && !self.contains(PathClass::Root)
    }

    pub fn intersects(self, other: ClassSet) -> bool {
        self.0 & other.0 != 0
    }
    pub fn is_subset(self, other: ClassSet) -> bool {
        self.0 & !other.0 == 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn union(self, other: ClassSet) -> ClassSet {
        ClassSet(self.0 | other.0)
    }
    pub fn names(self) -> Vec<&'static str> {
        ALL_CLASSES.iter().filter(|c| self.contains(**c)).map(|c| c.as_str()).collect()
    }
}

/// How much of a path an operation reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The path itself (or every child of it, for a glob).
    Full,
    /// Descendants picked by generic tests (`find DIR -mtime +3 -delete`): `DIR/{}`.
    Bulk,
    /// Descendants picked by a specific name (`find DIR -name core -delete`): `DIR/**/core`.
    Selective,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Full => "full",
            Scope::Bulk => "bulk",
            Scope::Selective => "selective",
        }
    }
    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "full" => Some(Scope::Full),
            "bulk" => Some(Scope::Bulk),
            "selective" => Some(Scope::Selective),
            _ => None,
        }
    }
}

/// A classified path operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// What to show in a reason: the resolved path, or the text as written when dynamic.
    pub display: String,
    pub classes: ClassSet,
    pub scope: Scope,
}

const SYSTEM_TOP: &[&str] = &[
    "bin",
    "boot",
    "dev",
    "etc",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "opt",
    "proc",
    "sbin",
    "srv",
    "sys",
    "usr",
    "var",
    "snap",
    "run",
    "mnt",
    "media",
    "lost+found",
    "nix",
    "efi",
];

const SYSTEM_DIRS: &[&str] = &[
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libexec",
    "/usr/local",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/usr/local/lib",
    "/usr/local/share",
    "/usr/share",
    "/usr/include",
    "/usr/src",
    "/var/lib",
    "/var/log",
    "/var/cache",
    "/var/spool",
    "/var/mail",
    "/var/backups",
    "/var/opt",
    "/etc/ssh",
    "/etc/systemd",
    "/etc/default",
    "/etc/init.d",
    "/etc/cron.d",
    "/etc/apt",
    "/etc/ssl",
    "/etc/pam.d",
    "/etc/security",
    "/etc/sudoers.d",
    "/boot/efi",
    "/boot/grub",
    "/var/lib/dpkg",
    "/var/lib/apt",
    "/var/lib/docker",
    "/usr/lib/systemd",
];

/// Relative to a home directory.
const SECRET_IN_HOME: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".config/gh",
    ".netrc",
    ".docker/config.json",
    ".kube",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".config/gcloud",
    ".azure",
    ".password-store",
    ".vault-token",
    ".config/hub",
    ".gem/credentials",
    ".pgpass",
    ".my.cnf",
    ".terraform.d/credentials.tfrc.json",
    ".config/op",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".local/share/keyrings",
    ".bash_history",
    ".zsh_history",
    ".config/rclone",
    ".s3cfg",
    ".boto",
    ".env",
];

const SECRET_ABS: &[&str] = &[
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
    "/etc/sudoers",
    "/etc/security/opasswd",
    "/etc/ssl/private",
    "/var/lib/sss",
];

const SECRET_BASENAMES: &[&str] =
    &["id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk", "authorized_keys"];

const CRITICAL: &[&str] = &[
    "/etc/passwd",
    "/etc/shadow",
    "/etc/group",
    "/etc/gshadow",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/boot",
    "/etc/fstab",
    "/etc/ld.so.preload",
    "/etc/pam.d",
    "/etc/crypttab",
    "/etc/inittab",
    "/etc/security",
    "/etc/ssh/sshd_config",
    "/etc/shells",
    "/etc/login.defs",
];

/// Startup files relative to a home directory: a write there runs at the next login or shell.
const PERSIST_IN_HOME: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".shrc",
    ".kshrc",
    ".mkshrc",
    ".cshrc",
    ".tcshrc",
    ".login",
    ".logout",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".config/fish",
    ".xinitrc",
    ".xprofile",
    ".xsession",
    ".xsessionrc",
    ".config/autostart",
    ".config/systemd",
    ".local/share/systemd",
    ".ssh/authorized_keys",
    ".ssh/authorized_keys2",
    ".ssh/rc",
    ".ssh/config",
    ".gitconfig",
    ".config/git",
    ".vimrc",
    ".pam_environment",
];

/// Places the host runs from by itself (schedulers, service managers, loaders, login).
const PERSIST_ABS: &[&str] = &[
    "/etc/profile",
    "/etc/profile.d",
    "/etc/bash.bashrc",
    "/etc/bashrc",
    "/etc/zsh",
    "/etc/environment",
    "/etc/rc.local",
    "/etc/rc.common",
    "/etc/init.d",
    "/etc/rc0.d",
    "/etc/rc1.d",
    "/etc/rc2.d",
    "/etc/rc3.d",
    "/etc/rc4.d",
    "/etc/rc5.d",
    "/etc/rc6.d",
    "/etc/rcS.d",
    "/etc/crontab",
    "/etc/cron.d",
    "/etc/cron.hourly",
    "/etc/cron.daily",
    "/etc/cron.weekly",
    "/etc/cron.monthly",
    "/etc/anacrontab",
    "/var/spool/cron",
    "/var/spool/at",
    "/etc/systemd",
    "/lib/systemd",
    "/usr/lib/systemd",
    "/etc/xdg/autostart",
    "/etc/ld.so.preload",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/udev/rules.d",
    "/etc/update-motd.d",
    "/etc/modules-load.d",
    "/etc/modprobe.d",
    "/etc/ssh/sshd_config",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/pam.d",
];

const BENIGN_DEV: &[&str] = &[
    "null", "zero", "full", "random", "urandom", "tty", "stdin", "stdout", "stderr", "ptmx", "fd", "pts", "shm",
    "console",
];

/// `p` (normalised, absolute) is `prefix` or below it: a string comparison, equivalent to
/// `Path::starts_with` on such paths and much cheaper.
fn under(p: &str, prefix: &str) -> bool {
    p.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// [`normalize`], borrowing `p` when it is normal already (absolute, no `.` or `..`, no empty
/// or trailing component): the workspace and home of a context usually are, and every
/// classified path needs them.
fn normalized(p: &Path) -> Cow<'_, Path> {
    let normal = p.to_str().is_some_and(|s| {
        s == "/"
            || (s.starts_with('/')
                && !s.ends_with('/')
                && s[1..].split('/').all(|c| !c.is_empty() && c != "." && c != ".."))
    });
    if normal {
        Cow::Borrowed(p)
    } else {
        Cow::Owned(normalize(p))
    }
}

/// Lexically normalise an absolute path: drop `.`, apply `..` (never above `/`).
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for comp in p.components() {
        match comp {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

fn is_glob_component(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Classify `text` (a word after expansion). `dyn_at` is the byte offset of the first part the
/// engine could not resolve, if any. `cwd` is `None` when a `cd` made it unknown.
pub fn classify(text: &str, dyn_at: Option<usize>, cwd: Option<&Path>, ctx: &Context) -> PathInfo {
    let dynamic =
        || PathInfo { display: text.to_string(), classes: ClassSet::of(&[PathClass::Dynamic]), scope: Scope::Full };
    // A dynamic tail is as wide as "anything below the static directory before it".
    let (stat, dyn_tail) = match dyn_at {
        Some(0) => return dynamic(),
        Some(i) => match text.get(..i).and_then(|s| s.rfind('/').map(|j| &s[..=j])) {
            Some(prefix) => (prefix, true),
            None => return dynamic(),
        },
        None => (text, false),
    };
    if stat.is_empty() {
        return dynamic();
    }
    let home = ctx.home.as_deref().unwrap_or(Path::new("/root"));
    let joined: Cow<'_, Path> = if stat == "~" {
        Cow::Borrowed(home)
    } else if let Some(rest) = stat.strip_prefix("~/") {
        Cow::Owned(home.join(rest))
    } else if stat.starts_with('/') {
        Cow::Borrowed(Path::new(stat))
    } else {
        match cwd {
            Some(c) => Cow::Owned(c.join(stat)),
            None => return dynamic(),
        }
    };
    // Walk components ourselves so globs and find markers are seen before `..` is applied.
    let mut base = PathBuf::from("/");
    let mut children = dyn_tail;
    let mut scope = Scope::Full;
    let mut comps = joined.components().peekable();
    while let Some(comp) = comps.next() {
        match comp {
            Component::ParentDir => {
                base.pop();
            }
            Component::Normal(n) => {
                let s = n.to_string_lossy();
                if s == "**" {
                    scope = Scope::Selective;
                    children = true;
                    break;
                }
                if s == "{}" && comps.peek().is_none() {
                    scope = Scope::Bulk;
                    children = true;
                    break;
                }
                if is_glob_component(&s) {
                    children = true;
                    break;
                }
                base.push(n);
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mut display = base.to_string_lossy().into_owned();
    if children {
        let shown = match scope {
            Scope::Full => "*",
            Scope::Bulk => "{}",
            Scope::Selective => "**",
        };
        if !display.ends_with('/') {
            display.push('/');
        }
        display.push_str(shown);
    }
    let mut classes = classify_abs(&base, children, ctx);
    if dyn_tail {
        classes.insert(PathClass::Dynamic);
    }
    // Secrets are also recognised by file name wherever they are (`./id_rsa`, `/tmp/x/id_ed25519`);
    // public keys and known hosts are no secrets, wherever they are.
    if let Some(name) = Path::new(text).file_name().and_then(|n| n.to_str()) {
        if SECRET_BASENAMES.contains(&name) {
            classes.insert(PathClass::Secret);
        }
        if name.ends_with(".pub") || name == "known_hosts" {
            classes.remove(PathClass::Secret);
        }
    }
    PathInfo { display, classes, scope }
}

fn home_dirs(ctx: &Context) -> [Option<Cow<'_, Path>>; 2] {
    [Some(Cow::Borrowed(Path::new("/root"))), ctx.home.as_deref().map(normalized)]
}

/// Classes of an absolute, normalised path; `children` means "every entry below it".
pub fn classify_abs(p: &Path, children: bool, ctx: &Context) -> ClassSet {
    let ws = normalized(&ctx.workspace);
    let mut set = ClassSet::default();
    if p == ws {
        set.insert(if children { PathClass::Workspace } else { PathClass::WorkspaceRoot });
        return set;
    }
    if p.starts_with(&*ws) {
        set.insert(PathClass::Workspace);
        return set;
    }
    let comps: Vec<Cow<'_, str>> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy()),
            _ => None,
        })
        .collect();
    let comp = |k: usize| comps.get(k).map(|c| c.as_ref());
    let first = comp(0);
    let scratch = matches!(first, Some("tmp"))
        || (first == Some("var") && comp(1) == Some("tmp"))
        || (first == Some("dev") && comp(1) == Some("shm"))
        || ctx.writable.iter().any(|w| p.starts_with(normalized(w)));
    // An ancestor of the workspace is one whatever else it is: deleting /var/tmp/proj while
    // working in /var/tmp/proj/ws destroys the workspace itself.
    if ws.starts_with(p) {
        set.insert(PathClass::Outside);
        set.insert(PathClass::WorkspaceAncestor);
    }
    if scratch {
        set.insert(PathClass::Scratch);
        return set;
    }
    set.insert(PathClass::Outside);
    if comps.is_empty() {
        set.insert(PathClass::Root);
        set.insert(PathClass::System);
        set.insert(PathClass::SystemDir);
        set.insert(PathClass::HomeDir);
        set.insert(PathClass::Home);
        return set;
    }
    let pstr = p.to_string_lossy();
    if let Some(f) = first {
        if SYSTEM_TOP.contains(&f) {
            set.insert(PathClass::System);
            if comps.len() == 1 || SYSTEM_DIRS.contains(&pstr.as_ref()) {
                set.insert(PathClass::SystemDir);
            }
        }
    }
    // Home directories: the user's, /root, /home/<u>, /Users/<u>.
    let homes = home_dirs(ctx);
    let homes = homes.iter().flatten();
    let in_home: Option<Cow<'_, Path>> =
        homes.clone().find(|h| p.starts_with(h)).map(|h| Cow::Borrowed(h.as_ref())).or_else(|| {
            if matches!(first, Some("home") | Some("Users")) && comps.len() >= 2 {
                Some(Cow::Owned(PathBuf::from(format!("/{}/{}", comps[0], comps[1]))))
            } else {
                None
            }
        });
    if matches!(first, Some("home") | Some("Users")) && comps.len() == 1 {
        set.insert(PathClass::Home);
        set.insert(PathClass::HomeDir);
    }
    if let Some(h) = &in_home {
        set.insert(PathClass::Home);
        if p == h.as_ref() {
            set.insert(PathClass::HomeDir);
        }
        if let Ok(rel) = p.strip_prefix(h) {
            let rel_s = rel.to_string_lossy();
            if SECRET_IN_HOME.iter().any(|s| under(&rel_s, s)) {
                set.insert(PathClass::Secret);
            }
            // Every secret lives below the home dir: "home/*" covers them too.
            if children && rel.as_os_str().is_empty() {
                set.insert(PathClass::Secret);
            }
        }
        // /root is both a system dir and a home; treat it as home only.
        set.remove(PathClass::System);
        set.remove(PathClass::SystemDir);
    }
    // A process's environment holds its credentials.
    if first == Some("proc") && comps.len() == 3 && comp(2) == Some("environ") {
        set.insert(PathClass::Secret);
    }
    // A secret, or a directory that holds one (`tar c /etc/ssh`, `tar c ~`).
    if SECRET_ABS.iter().any(|s| under(&pstr, s) || under(s, &pstr))
        || homes.clone().any(|h| under(&h.to_string_lossy(), &pstr))
    {
        set.insert(PathClass::Secret);
    }
    if CRITICAL.iter().any(|s| under(&pstr, s)) || (children && (pstr == "/etc")) {
        set.insert(PathClass::Critical);
    }
    if first == Some("dev") {
        match comp(1) {
            Some("tcp") | Some("udp") => set.insert(PathClass::Network),
            Some(d)
                if BENIGN_DEV.contains(&d)
                    || d.starts_with("tty")
                    || d.starts_with("pty")
                    || d.starts_with("nul")
                    || d == "kmsg"
                    || d == "log" => {}
            Some(_) => set.insert(PathClass::Device),
            None => {
                if children {
                    set.insert(PathClass::Device);
                }
            }
        }
    }
    if (first == Some("proc") && matches!(comp(1), Some("sys") | Some("sysrq-trigger"))) || first == Some("sys") {
        set.insert(PathClass::Kernel);
    }
    if in_home
        .as_ref()
        .and_then(|h| p.strip_prefix(h).ok())
        .is_some_and(|rel| PERSIST_IN_HOME.iter().any(|s| under(&rel.to_string_lossy(), s)))
        || PERSIST_ABS.iter().any(|s| under(&pstr, s))
    {
        set.insert(PathClass::Persistence);
    }
    // Streams are no files of the host: writing them changes nothing there.
    let stream = set.contains(PathClass::Network)
        || (first == Some("dev") && comps.len() >= 2 && !set.contains(PathClass::Device))
        || (first == Some("proc")
            && comp(2) == Some("fd")
            && comp(1).is_some_and(|d| d == "self" || d.chars().all(|c| c.is_ascii_digit())));
    if !stream {
        set.insert(PathClass::Host);
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_outside_yet_no_file_of_the_host() {
        let c = ctx();
        let class = |p: &str| classify_abs(Path::new(p), false, &c);
        for p in
            ["/dev/null", "/dev/stderr", "/dev/stdout", "/dev/tty", "/dev/fd/2", "/proc/self/fd/1", "/dev/tcp/h/80"]
        {
            assert!(class(p).is_stream(), "{p}");
        }
        for p in ["/dev/sda", "/etc/motd", "/tmp/x", "/dev/shm/x", "/proc/sys/kernel/x", "/", "/dev"] {
            assert!(!class(p).is_stream(), "{p}");
        }
        assert!(!class(&format!("{}/a", c.workspace.display())).is_stream());
    }

    #[test]
    fn a_package_cache_is_scratch_not_the_host() {
        let c = ctx();
        let class = |p: &str| classify_abs(Path::new(p), false, &c);
        assert!(class("/home/dev/.npm/_cacache/x").contains(PathClass::Scratch));
        assert!(!class("/home/dev/.npm/_cacache/x").contains(PathClass::Outside));
        assert!(class("/home/dev/.npmrc").contains(PathClass::Outside));
        assert!(class("/home/dev/.npm2/x").contains(PathClass::Outside));
    }

    fn ctx() -> Context {
        crate::example_context()
    }

    fn names(s: &str) -> Vec<&'static str> {
        let c = ctx();
        classify(s, None, Some(&c.cwd), &c).classes.names()
    }

    #[test]
    fn classes() {
        assert_eq!(names("src"), ["workspace"]);
        assert_eq!(names("."), ["workspace-root"]);
        assert_eq!(names("./*"), ["workspace"]);
        assert!(names("..").contains(&"workspace-ancestor"));
        assert!(names("..").contains(&"home-dir"));
        assert!(names("/").contains(&"root"));
        assert!(names("/*").contains(&"root"));
        assert_eq!(names("/tmp/x"), ["scratch"]);
        assert!(names("/usr").contains(&"system-dir"));
        assert!(!names("/usr/share/foo").contains(&"system-dir"));
        assert!(names("~/.ssh/id_rsa").contains(&"secret"));
        assert!(names("/dev/sda").contains(&"device"));
        assert!(!names("/dev/null").contains(&"device"));
        assert!(names("/dev/tcp/1.2.3.4/80").contains(&"network"));
        assert!(names("/etc/passwd").contains(&"critical"));
        assert!(names("/proc/sys/kernel/x").contains(&"kernel"));
        assert!(names("/etc/resolv.conf").contains(&"host"), "{:?}", names("/etc/resolv.conf"));
        assert!(!names("/dev/null").contains(&"host"));
        assert!(!names("/tmp/x").contains(&"host"));
        assert!(names("~/.bashrc").contains(&"persistence"));
    }

    #[test]
    fn dynamic_tails() {
        let c = ctx();
        let p = classify("/$X", Some(1), Some(&c.cwd), &c);
        assert!(p.classes.contains(PathClass::Root));
        let p = classify("$X/a", Some(0), Some(&c.cwd), &c);
        assert_eq!(p.classes.names(), ["dynamic"]);
        let p = classify("a", None, None, &c);
        assert_eq!(p.classes.names(), ["dynamic"]);
    }

    #[test]
    fn find_markers() {
        let c = ctx();
        let p = classify("/var/log/{}", None, Some(&c.cwd), &c);
        assert_eq!(p.scope, Scope::Bulk);
        assert!(p.classes.contains(PathClass::SystemDir));
        let p = classify("/home/**/core", None, Some(&c.cwd), &c);
        assert_eq!(p.scope, Scope::Selective);
    }
}
