//! What the sandbox must build, as data: the spec handed to the stage-2 helper, and the mount
//! plan derived from it. Pure: unit-tested without privileges.
//!
//! Owns the spec, its argument encoding and the mount plan; may not make a syscall.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Everything the stage-2 helper needs, passed on its command line (lossless for any bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The real workspace; the overlay is mounted on this very path.
    pub workspace: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Earlier steps of a session: read-only layers between the upper and the workspace,
    /// topmost first.
    pub layers: Vec<PathBuf>,
    /// Paths made invisible and unwritable inside: the state directory, the policy file,
    /// secrets (`~/.ssh`, `/etc/shadow`, ...). Missing ones are skipped.
    pub hide: Vec<PathBuf>,
    /// Extra paths that stay writable (off by default; e.g. a build cache).
    pub writable: Vec<PathBuf>,
    /// Package caches: a host directory (txbox's) bound writable over a path (the tool's
    /// default location), `(source, target)`. Not part of the transaction.
    pub caches: Vec<(PathBuf, PathBuf)>,
    /// Working directory of the command inside the sandbox.
    pub cwd: PathBuf,
    /// Create a user namespace (needed without root; the invoking ids map to themselves).
    pub userns: bool,
    pub uid: u32,
    pub gid: u32,
    /// Share the host's network instead of a namespace with loopback only.
    pub host_network: bool,
    /// RLIMIT_CPU in seconds.
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_FSIZE in bytes: no single file may grow past the write limit.
    pub max_file_size: Option<u64>,
    /// RLIMIT_NPROC: the most processes (threads included) of the command's user. In the user
    /// namespace of an unprivileged run it counts the sandbox's own processes only; the kernel
    /// does not apply it to root.
    pub max_procs: Option<u64>,
    /// Wait for one byte on fd 4 before starting the command (the launcher first puts stage 2
    /// into its cgroups, so no child escapes the limits).
    pub sync: bool,
    /// Network by allowlist (`crate::net`): stage 2 listens on `127.0.0.1:PORT` in the
    /// sandbox's network namespace and hands the listener to the proxy outside.
    pub proxy_port: Option<u16>,
    /// `KEY=VALUE` entries set in the command's environment (the proxy variables).
    pub env: Vec<OsString>,
    /// Give the command a terminal of its own and send its master to the launcher on fd 5
    /// (the caller has a terminal: `crate::terminal`).
    pub terminal: bool,
    pub argv: Vec<OsString>,
}

/// Why the arguments of a sandbox spec (stage 2's, a warm server's or a request's) were refused.
/// Each says which option and what it was given, so a broken caller is found from the message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("malformed stage-2 arguments: {0} needs a value")]
    MissingValue(String),
    /// A value that does not parse as the option's kind (a number, `U:UID:GID`, a port).
    #[error("malformed stage-2 arguments: bad {option}: {value}")]
    BadValue { option: String, value: String },
    #[error("malformed stage-2 arguments: unknown option {0}")]
    UnknownOption(String),
    #[error("malformed stage-2 arguments: --cache-at without --cache")]
    CacheAtWithoutCache,
    #[error("malformed stage-2 arguments: each --cache needs an absolute --cache-at, and both absolute")]
    CacheNotAbsolute,
    #[error("malformed stage-2 arguments: workspace, upper and work must be absolute paths")]
    NotAbsolute,
    #[error("malformed stage-2 arguments: no command")]
    NoCommand,
    /// A warm server's command line is not `--socket PATH --state DIR --idle SECS SPEC…`.
    #[error("malformed stage-2 arguments: usage: __warm --socket PATH --state DIR --idle SECS SPEC…")]
    WarmUsage,
}

impl SandboxSpec {
    /// A spec with the defaults of docs/DESIGN.md §6 for running `argv` in `workspace`.
    pub fn new(workspace: PathBuf, upper: PathBuf, work: PathBuf, argv: Vec<OsString>) -> SandboxSpec {
        SandboxSpec {
            cwd: workspace.clone(),
            workspace,
            upper,
            work,
            layers: Vec::new(),
            hide: Vec::new(),
            writable: Vec::new(),
            caches: Vec::new(),
            userns: false,
            uid: 0,
            gid: 0,
            host_network: false,
            cpu_seconds: None,
            max_file_size: None,
            max_procs: None,
            sync: false,
            proxy_port: None,
            env: Vec::new(),
            terminal: false,
            argv,
        }
    }

    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut kv = |k: &str, v: &OsStr| {
            a.push(OsString::from(k));
            a.push(v.to_os_string());
        };
        kv("--workspace", self.workspace.as_os_str());
        kv("--upper", self.upper.as_os_str());
        kv("--work", self.work.as_os_str());
        for l in &self.layers {
            kv("--layer", l.as_os_str());
        }
        for h in &self.hide {
            kv("--hide", h.as_os_str());
        }
        for w in &self.writable {
            kv("--writable", w.as_os_str());
        }
        for (from, to) in &self.caches {
            kv("--cache", from.as_os_str());
            kv("--cache-at", to.as_os_str());
        }
        kv("--cwd", self.cwd.as_os_str());
        kv("--ids", OsStr::new(&format!("{}:{}:{}", u8::from(self.userns), self.uid, self.gid)));
        let opt = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
        kv(
            "--limits",
            OsStr::new(&format!(
                "{}:{}:{}:{}:{}:{}",
                u8::from(self.host_network),
                opt(self.cpu_seconds),
                opt(self.max_file_size),
                u8::from(self.sync),
                opt(self.max_procs),
                u8::from(self.terminal)
            )),
        );
        if let Some(port) = self.proxy_port {
            kv("--proxy", OsStr::new(&port.to_string()));
        }
        for e in &self.env {
            kv("--setenv", e.as_os_str());
        }
        a.push(OsString::from("--"));
        a.extend(self.argv.iter().cloned());
        a
    }

    pub fn from_args(args: &[OsString]) -> Result<SandboxSpec, SpecError> {
        let mut spec = SandboxSpec::new(PathBuf::new(), PathBuf::new(), PathBuf::new(), Vec::new());
        let mut cache_from: Option<PathBuf> = None;
        let mut it = args.iter();
        while let Some(k) = it.next() {
            if k == "--" {
                spec.argv = it.cloned().collect();
                break;
            }
            let v = it.next().ok_or_else(|| SpecError::MissingValue(k.to_string_lossy().into_owned()))?;
            let s = v.to_string_lossy();
            let parts: Vec<&str> = s.split(':').collect();
            let bad = || SpecError::BadValue { option: k.to_string_lossy().into_owned(), value: s.to_string() };
            let num = |x: &str| x.parse::<u32>().map_err(|_| bad());
            let opt = |x: &str| if x == "-" { Ok(None) } else { x.parse::<u64>().map(Some).map_err(|_| bad()) };
            match k.as_bytes() {
                b"--workspace" => spec.workspace = PathBuf::from(v),
                b"--upper" => spec.upper = PathBuf::from(v),
                b"--work" => spec.work = PathBuf::from(v),
                b"--hide" => spec.hide.push(PathBuf::from(v)),
                b"--writable" => spec.writable.push(PathBuf::from(v)),
                b"--cache" => cache_from = Some(PathBuf::from(v)),
                b"--cache-at" => {
                    let from = cache_from.take().ok_or(SpecError::CacheAtWithoutCache)?;
                    spec.caches.push((from, PathBuf::from(v)));
                }
                b"--layer" => spec.layers.push(PathBuf::from(v)),
                b"--cwd" => spec.cwd = PathBuf::from(v),
                b"--proxy" => spec.proxy_port = Some(s.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?),
                b"--setenv" if v.as_bytes().contains(&b'=') => spec.env.push(v.clone()),
                b"--ids" => match parts.as_slice() {
                    [u, uid, gid] => {
                        spec.userns = *u == "1";
                        spec.uid = num(uid)?;
                        spec.gid = num(gid)?;
                    }
                    _ => return Err(bad()),
                },
                b"--limits" => match parts.as_slice() {
                    [net, cpu, fsize, sync, procs, terminal] => {
                        spec.host_network = *net == "1";
                        spec.cpu_seconds = opt(cpu)?;
                        spec.max_file_size = opt(fsize)?;
                        spec.sync = *sync == "1";
                        spec.max_procs = opt(procs)?;
                        spec.terminal = *terminal == "1";
                    }
                    _ => return Err(bad()),
                },
                other => return Err(SpecError::UnknownOption(String::from_utf8_lossy(other).into_owned())),
            }
        }
        if spec.argv.is_empty() {
            return Err(SpecError::NoCommand);
        }
        if cache_from.is_some() || spec.caches.iter().any(|(a, b)| !a.is_absolute() || !b.is_absolute()) {
            return Err(SpecError::CacheNotAbsolute);
        }
        if !spec.workspace.is_absolute() || !spec.upper.is_absolute() || !spec.work.is_absolute() {
            return Err(SpecError::NotAbsolute);
        }
        Ok(spec)
    }
}

impl SandboxSpec {
    /// The same sandbox without anything of one run (its layers, directory, limits, command):
    /// what a warm server is started with, and shows in its command line.
    pub fn sandbox_only(&self) -> SandboxSpec {
        let ws = self.workspace.clone();
        let mut s = SandboxSpec::new(ws.clone(), ws.clone(), ws, vec![OsString::from("-")]);
        s.hide = self.hide.clone();
        s.writable = self.writable.clone();
        s.caches = self.caches.clone();
        s.userns = self.userns;
        s.uid = self.uid;
        s.gid = self.gid;
        s.host_network = self.host_network;
        // A sandbox with a proxy listener is never a warm server's (see `crate::net`).
        s.proxy_port = self.proxy_port;
        s
    }

    /// Whether a warm sandbox built for `self` may run `other`'s command: same workspace,
    /// hidden and writable paths, identities and network.
    pub fn same_sandbox(&self, other: &SandboxSpec) -> bool {
        self.sandbox_only() == other.sandbox_only()
    }

    /// A short name for what [`same_sandbox`](Self::same_sandbox) compares (16 hex digits,
    /// FNV-1a): names the warm server's socket. Not a security boundary: the server compares
    /// the full fields of every request.
    pub fn sandbox_key(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        // Each argument with its length first, so that no two lists of arguments hash alike
        // by their concatenation alone.
        for arg in self.sandbox_only().to_args() {
            let bytes = arg.as_bytes();
            for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        format!("{h:016x}")
    }
}

/// One mount operation of the sandbox, in the order it must happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOp {
    /// Make every mount private, so nothing done inside propagates to the host.
    PrivateRoot,
    /// A fresh tmpfs (`/tmp`, `/dev`, `/dev/shm`).
    Tmpfs {
        target: PathBuf,
        mode: u32,
    },
    /// The workspace view: an overlay mounted on the workspace's own path. `lowers` are
    /// topmost first; the last is the workspace itself. Every layer is opened before the first
    /// mount, so a workspace below `/tmp` is still reachable after `/tmp` is replaced.
    Overlay {
        target: PathBuf,
        lowers: Vec<PathBuf>,
        upper: PathBuf,
        work: PathBuf,
    },
    /// Every mount read-only, recursively (`mount_setattr`).
    ReadOnlyRoot,
    /// Undo `ReadOnlyRoot` for one mount of our own (the workspace view, `/tmp`, extras).
    Writable {
        target: PathBuf,
    },
    /// Make one mount read-only (`/dev` once it is populated).
    ReadOnly {
        target: PathBuf,
    },
    /// Bind a host object (opened before `/dev` was replaced) onto a path.
    Bind {
        source: PathBuf,
        target: PathBuf,
    },
    /// Bind a host directory (opened before the first mount) over a directory, without
    /// setuid or device files (a package cache over the tool's default location).
    BindDir {
        source: PathBuf,
        target: PathBuf,
    },
    /// A private devpts instance.
    Devpts {
        target: PathBuf,
    },
    Symlink {
        target: PathBuf,
        points_to: PathBuf,
    },
    /// Make a path invisible: an empty read-only tmpfs over a directory, an empty read-only
    /// file over a file. Exactly the path named: nothing when a symlink is on the way
    /// (`crate::secrets` names each secret's real path too).
    Hide {
        target: PathBuf,
    },
    /// A procfs of the sandbox's own pid namespace; mounted by its init process.
    Proc {
        target: PathBuf,
    },
    /// Bind a path onto itself read-only (kernel knobs under /proc that root could turn).
    ReadOnlyBind {
        target: PathBuf,
    },
    /// A read-only sysfs of the sandbox's own network namespace (so /sys/class/net shows
    /// only its loopback).
    Sysfs {
        target: PathBuf,
    },
    /// Detach a mount and everything below it (a warm sandbox between two transactions).
    Detach {
        target: PathBuf,
    },
    /// The empty file that `Hide` binds over files ([`EMPTY_FILE`], in the sandbox's `/dev`), a
    /// read-only mount of its own so that every bind of it is read-only.
    EmptyFile {
        target: PathBuf,
    },
}

/// The empty file bound over hidden files; lives in the sandbox's own /dev, a read-only mount.
pub const EMPTY_FILE: &str = "/dev/.txbox-empty";

/// The mount plan: ops run right after `unshare`, then ops run by the pid namespace's init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub namespace: Vec<MountOp>,
    pub init: Vec<MountOp>,
}

/// The device nodes the sandbox's `/dev` holds (docs/DESIGN.md §6), bound from the host.
pub const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

impl MountPlan {
    pub fn for_spec(spec: &SandboxSpec) -> MountPlan {
        let p = |s: &str| PathBuf::from(s);
        let mut ops = vec![
            MountOp::PrivateRoot,
            // /tmp before the overlay: a workspace below /tmp is mounted inside the new tmpfs.
            MountOp::Tmpfs { target: p("/tmp"), mode: 0o1777 },
            MountOp::Overlay {
                target: spec.workspace.clone(),
                lowers: spec.layers.iter().cloned().chain([spec.workspace.clone()]).collect(),
                upper: spec.upper.clone(),
                work: spec.work.clone(),
            },
        ];
        // Package caches before everything is made read-only, writable again after.
        ops.extend(spec.caches.iter().map(|(s, t)| MountOp::BindDir { source: s.clone(), target: t.clone() }));
        ops.extend([
            MountOp::ReadOnlyRoot,
            MountOp::Writable { target: spec.workspace.clone() },
            MountOp::Writable { target: p("/tmp") },
        ]);
        ops.extend(spec.writable.iter().map(|w| MountOp::Writable { target: w.clone() }));
        ops.extend(spec.caches.iter().map(|(_, t)| MountOp::Writable { target: t.clone() }));
        if !spec.host_network {
            ops.push(MountOp::Sysfs { target: p("/sys") });
        }
        ops.push(MountOp::Tmpfs { target: p("/dev"), mode: 0o755 });
        ops.push(MountOp::EmptyFile { target: p(EMPTY_FILE) });
        for d in DEVICES {
            ops.push(MountOp::Bind { source: Path::new("/dev").join(d), target: Path::new("/dev").join(d) });
        }
        ops.push(MountOp::Devpts { target: p("/dev/pts") });
        ops.push(MountOp::Symlink { target: p("/dev/ptmx"), points_to: p("pts/ptmx") });
        ops.push(MountOp::Tmpfs { target: p("/dev/shm"), mode: 0o1777 });
        for (name, to) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            ops.push(MountOp::Symlink { target: Path::new("/dev").join(name), points_to: p(to) });
        }
        // Hidden paths last: one inside the workspace must cover the merged view.
        ops.extend(spec.hide.iter().map(|h| MountOp::Hide { target: h.clone() }));
        // /dev is complete: nothing may be added to it (device nodes stay usable).
        ops.push(MountOp::ReadOnly { target: p("/dev") });
        let mut init = vec![MountOp::Proc { target: p("/proc") }];
        // Writable kernel knobs in a fresh procfs (what Docker masks too).
        for knob in ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"] {
            init.push(MountOp::ReadOnlyBind { target: p(knob) });
        }
        MountPlan { namespace: ops, init }
    }

    /// Host paths the executor must open before its first mount (they may be covered later).
    pub fn sources(&self) -> Vec<PathBuf> {
        sources(&self.namespace)
    }

    /// The same sandbox split for a warm server (`crate::warm`): what can be built before the
    /// transaction is known, what each transaction mounts, and what undoes it afterwards.
    pub fn for_warm(spec: &SandboxSpec) -> WarmPlan {
        let cold = MountPlan::for_spec(spec);
        let ws = &spec.workspace;
        // Per transaction: its overlay, and hidden paths inside the workspace, which must cover
        // the overlay. The overlay is a new mount, so it is writable without `Writable`.
        let per_run: Vec<MountOp> = cold
            .namespace
            .iter()
            .filter(|op| match op {
                MountOp::Overlay { .. } => true,
                MountOp::Hide { target } => target.starts_with(ws),
                _ => false,
            })
            .cloned()
            .collect();
        let base: Vec<MountOp> = cold
            .namespace
            .into_iter()
            .filter(|op| !per_run.contains(op) && *op != MountOp::Writable { target: ws.clone() })
            .collect();
        // Afterwards, when no process of the transaction is left: the workspace view goes (with
        // whatever covers it), then the scratch filesystems are replaced by empty ones, so
        // nothing one transaction leaves in /tmp or /dev/shm is seen by the next.
        let p = |s: &str| PathBuf::from(s);
        let release = vec![MountOp::Detach { target: ws.clone() }];
        let reset = vec![
            MountOp::Detach { target: p("/tmp") },
            MountOp::Tmpfs { target: p("/tmp"), mode: 0o1777 },
            MountOp::Detach { target: p("/dev/shm") },
            MountOp::Tmpfs { target: p("/dev/shm"), mode: 0o1777 },
        ];
        WarmPlan { base: MountPlan { namespace: base, init: cold.init }, per_run, release, reset }
    }
}

/// A [`MountPlan`] for a sandbox built ahead of its transactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPlan {
    /// Built once, when the warm server starts.
    pub base: MountPlan,
    /// Mounted by the server's init for each transaction, before the command starts.
    pub per_run: Vec<MountOp>,
    /// Run by the server's init after each transaction, when no process of it is left: what
    /// undoes `per_run`.
    pub release: Vec<MountOp>,
    /// Run after `release`, to make the sandbox as new for the next transaction.
    pub reset: Vec<MountOp>,
}

impl WarmPlan {
    /// The scratch filesystems: replaced by empty ones after every transaction (`reset`), so
    /// nothing of the host below them is ever seen from inside.
    pub fn scratch(&self) -> Vec<PathBuf> {
        let tmpfs = |op: &MountOp| match op {
            MountOp::Tmpfs { target, .. } => Some(target.clone()),
            _ => None,
        };
        self.reset.iter().filter_map(tmpfs).collect()
    }
}

/// Host paths `ops` mount from, which must be opened before the first mount covers them.
pub fn sources(ops: &[MountOp]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            MountOp::Overlay { lowers, upper, work, .. } => {
                out.extend(lowers.iter().cloned());
                out.push(upper.clone());
                out.push(work.clone());
            }
            MountOp::Bind { source, .. } | MountOp::BindDir { source, .. } => out.push(source.clone()),
            _ => {}
        }
    }
    out
}

/// Escape a path for overlayfs's option string (`\`, `,` and `:` are separators there).
pub fn overlay_escape(p: &OsStr) -> Vec<u8> {
    let mut out = Vec::with_capacity(p.len());
    for &b in p.as_bytes() {
        if matches!(b, b'\\' | b',' | b':') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

/// The overlay mount options for a workspace view (`lowers` topmost first).
pub fn overlay_options(lowers: &[PathBuf], upper: &OsStr, work: &OsStr) -> OsString {
    let mut o = b"lowerdir=".to_vec();
    for (i, l) in lowers.iter().enumerate() {
        if i > 0 {
            o.push(b':');
        }
        o.extend(overlay_escape(l.as_os_str()));
    }
    o.extend_from_slice(b",upperdir=");
    o.extend(overlay_escape(upper));
    o.extend_from_slice(b",workdir=");
    o.extend(overlay_escape(work));
    // userxattr: overlay metadata in user.overlay.*, the only kind allowed in a user namespace;
    // used as root too, so the upper layer has one format (no redirect_dir, no metacopy).
    o.extend_from_slice(b",userxattr");
    OsString::from_vec(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        let mut s = SandboxSpec::new(
            "/w/ws".into(),
            "/w/ws/.txbox/tx/1/upper".into(),
            "/w/ws/.txbox/tx/1/work".into(),
            vec![OsString::from("sh"), OsString::from("-c"), OsString::from_vec(b"echo \xff --".to_vec())],
        );
        s.layers = vec!["/w/ws/.txbox/tx/1/steps/1/upper".into()];
        s.hide = vec!["/w/ws/.txbox".into(), "/home/u/.ssh".into()];
        s.cwd = "/w/ws/src".into();
        s.userns = true;
        s.uid = 1000;
        s.gid = 100;
        s.cpu_seconds = Some(5);
        s.max_procs = Some(4096);
        s.sync = true;
        s.env = vec![OsString::from("HTTPS_PROXY=http://127.0.0.1:3128"), OsString::from_vec(b"ODD=\xff=".to_vec())];
        s.terminal = true;
        s.caches = vec![("/state/caches/ab/pip".into(), "/home/u/.cache/pip".into())];
        s
    }

    #[test]
    fn spec_round_trips_through_arguments() {
        let mut s = spec();
        assert_eq!(SandboxSpec::from_args(&s.to_args()), Ok(s.clone()));
        s.proxy_port = Some(3128);
        assert_eq!(SandboxSpec::from_args(&s.to_args()), Ok(s));
        let bad = |k: &str, v: &str| {
            SandboxSpec::from_args(&[k, v, "--", "true"].map(OsString::from))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(bad("--proxy", "0").contains("--proxy"));
        assert!(bad("--setenv", "NOEQUALS").contains("unknown option --setenv"));
        // A cache without its place, or a relative one, is refused.
        let mut a = spec().to_args();
        let Some(at) = a.iter().position(|x| x == "--cache-at") else { panic!("no --cache-at in {a:?}") };
        a.drain(at..at + 2);
        assert!(SandboxSpec::from_args(&a).is_err());
        let mut a = spec().to_args();
        a[at + 1] = OsString::from("rel");
        assert!(SandboxSpec::from_args(&a).is_err());
    }

    #[test]
    fn caches_are_bound_before_everything_turns_read_only_and_writable_after() {
        let s = spec();
        let plan = MountPlan::for_spec(&s);
        let pos = |op: &MountOp| plan.namespace.iter().position(|o| o == op).unwrap_or(usize::MAX);
        let (src, dst) = s.caches[0].clone();
        let bind = pos(&MountOp::BindDir { source: src.clone(), target: dst.clone() });
        let read_only = pos(&MountOp::ReadOnlyRoot);
        let writable = pos(&MountOp::Writable { target: dst.clone() });
        assert!(bind < read_only && read_only < writable && writable != usize::MAX, "{plan:?}");
        assert!(plan.sources().contains(&src), "the source is opened before any mount");
        // Warm: built once with the sandbox, not per transaction.
        let warm = MountPlan::for_warm(&s);
        assert!(warm.base.namespace.contains(&MountOp::BindDir { source: src, target: dst.clone() }));
        assert!(warm.base.namespace.contains(&MountOp::Writable { target: dst }));
        assert!(!warm.per_run.iter().any(|o| matches!(o, MountOp::BindDir { .. })));
    }

    #[test]
    fn sandbox_key_follows_what_the_sandbox_is_built_from() {
        let a = spec();
        let mut per_run = a.clone();
        per_run.upper = "/elsewhere/upper".into();
        per_run.argv = vec![OsString::from("true")];
        per_run.cwd = "/w/ws".into();
        per_run.cpu_seconds = None;
        per_run.layers.clear();
        assert!(a.same_sandbox(&per_run));
        assert_eq!(a.sandbox_key(), per_run.sandbox_key());
        // What a server is started with keeps the sandbox and drops the run.
        let only = a.sandbox_only();
        assert!(a.same_sandbox(&only));
        assert!(
            only.layers.is_empty()
                && only.argv == [OsString::from("-")]
                && only.cpu_seconds.is_none()
                && !only.sync
                && !only.terminal
        );
        assert!(!only.to_args().iter().any(|x| x.as_bytes().windows(4).any(|w| w == b"echo")));
        let changes: [fn(&mut SandboxSpec); 8] = [
            |s| s.caches.push(("/state/caches/ab/npm".into(), "/home/u/.npm".into())),
            |s| s.proxy_port = Some(3128),
            |s| s.workspace = "/w/other".into(),
            |s| s.hide.push("/home/u/.aws".into()),
            |s| s.writable.push("/cache".into()),
            |s| s.host_network = true,
            |s| s.uid = 1001,
            |s| s.userns = false,
        ];
        for change in changes {
            let mut b = a.clone();
            change(&mut b);
            assert!(!a.same_sandbox(&b), "{b:?}");
            assert_ne!(a.sandbox_key(), b.sandbox_key());
        }
        // Moving a path from one list to the other is a different sandbox too.
        let mut c = a.clone();
        let h = c.hide.pop().unwrap_or_default();
        c.writable.push(h);
        assert!(!a.same_sandbox(&c));
    }

    #[test]
    fn malformed_arguments_are_refused() {
        assert!(SandboxSpec::from_args(&[OsString::from("--workspace")]).is_err());
        assert!(SandboxSpec::from_args(&[OsString::from("--bogus"), OsString::from("x")]).is_err());
        assert!(SandboxSpec::from_args(&[OsString::from("--limits"), OsString::from("1:x:-:0:0")]).is_err());
        let mut s = spec();
        s.argv.clear();
        assert!(SandboxSpec::from_args(&s.to_args()).is_err());
    }

    #[test]
    fn each_refusal_names_its_option_and_value() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let err = |a: &[&str]| SandboxSpec::from_args(&args(a)).err();
        let abs = ["--workspace", "/w", "--upper", "/u", "--work", "/k"];
        let with = |more: &[&'static str]| [&abs[..], more, &["--", "true"][..]].concat();
        let cases: Vec<(Option<SpecError>, &str)> = vec![
            (err(&["--workspace"]), "--workspace needs a value"),
            (err(&with(&["--ids", "1:x:0"])), "bad --ids: 1:x:0"),
            (err(&with(&["--limits", "1:x:-:0:0"])), "bad --limits: 1:x:-:0:0"),
            (err(&with(&["--proxy", "0"])), "bad --proxy: 0"),
            (err(&with(&["--bogus", "x"])), "unknown option --bogus"),
            (err(&with(&["--cache-at", "/t"])), "--cache-at without --cache"),
            (err(&with(&["--cache", "/s"])), "each --cache needs an absolute --cache-at, and both absolute"),
            (
                err(&with(&["--cache", "/s", "--cache-at", "t"])),
                "each --cache needs an absolute --cache-at, and both absolute",
            ),
            (err(&["--workspace", "w", "--", "true"]), "workspace, upper and work must be absolute paths"),
            (err(&abs), "no command"),
        ];
        for (e, text) in cases {
            let e = e.unwrap_or_else(|| panic!("accepted: {text}"));
            assert_eq!(e.to_string(), format!("malformed stage-2 arguments: {text}"));
        }
        assert_eq!(
            err(&with(&["--ids", "1:x:0"])),
            Some(SpecError::BadValue { option: "--ids".into(), value: "1:x:0".into() })
        );
        assert_eq!(err(&["--workspace"]), Some(SpecError::MissingValue("--workspace".into())));
    }

    #[test]
    fn plan_orders_tmp_overlay_readonly_dev_then_hidden_paths() {
        let plan = MountPlan::for_spec(&spec());
        let ops = &plan.namespace;
        let pos = |want: &MountOp| ops.iter().position(|o| o == want).unwrap_or(usize::MAX);
        let tmp = pos(&MountOp::Tmpfs { target: "/tmp".into(), mode: 0o1777 });
        let overlay = pos(&MountOp::Overlay {
            target: "/w/ws".into(),
            lowers: vec!["/w/ws/.txbox/tx/1/steps/1/upper".into(), "/w/ws".into()],
            upper: "/w/ws/.txbox/tx/1/upper".into(),
            work: "/w/ws/.txbox/tx/1/work".into(),
        });
        let ro = pos(&MountOp::ReadOnlyRoot);
        let ws_rw = pos(&MountOp::Writable { target: "/w/ws".into() });
        let dev = pos(&MountOp::Tmpfs { target: "/dev".into(), mode: 0o755 });
        let null = pos(&MountOp::Bind { source: "/dev/null".into(), target: "/dev/null".into() });
        let hide_state = pos(&MountOp::Hide { target: "/w/ws/.txbox".into() });
        assert_eq!(ops[0], MountOp::PrivateRoot);
        assert!(
            tmp < overlay && overlay < ro && ro < ws_rw && ws_rw < dev && dev < null && null < hide_state,
            "{ops:#?}"
        );
        assert_eq!(ops[ops.len() - 2], MountOp::Hide { target: "/home/u/.ssh".into() });
        assert_eq!(ops.last(), Some(&MountOp::ReadOnly { target: "/dev".into() }));
        assert_eq!(plan.init[0], MountOp::Proc { target: "/proc".into() });
        assert!(plan.init.contains(&MountOp::ReadOnlyBind { target: "/proc/sysrq-trigger".into() }));
        // Everything a later mount may cover is opened first.
        let sources = plan.sources();
        assert!(sources.contains(&"/w/ws".into()) && sources.contains(&"/dev/null".into()));
    }

    #[test]
    fn warm_plan_is_the_cold_plan_split_in_time() {
        let s = spec();
        let cold = MountPlan::for_spec(&s);
        let warm = MountPlan::for_warm(&s);
        // Each transaction: its overlay first, then the state directory hidden inside it.
        assert!(matches!(warm.per_run[0], MountOp::Overlay { .. }), "{:#?}", warm.per_run);
        assert_eq!(warm.per_run[1..], [MountOp::Hide { target: "/w/ws/.txbox".into() }]);
        // The base holds everything else of the cold plan, in the cold order, except making
        // the (not yet mounted) workspace writable; the secret outside the workspace is in it.
        let expected: Vec<MountOp> = cold
            .namespace
            .iter()
            .filter(|op| !warm.per_run.contains(op) && **op != MountOp::Writable { target: "/w/ws".into() })
            .cloned()
            .collect();
        assert_eq!(warm.base.namespace, expected);
        assert!(warm.base.namespace.contains(&MountOp::Hide { target: "/home/u/.ssh".into() }));
        assert_eq!(warm.base.init, cold.init);
        // Nothing of the overlay's layers is opened when the base is built: they come with
        // each transaction.
        assert!(!warm.base.sources().iter().any(|p| p.starts_with("/w/ws")), "{:?}", warm.base.sources());
        // Afterwards the view is detached, then the scratch filesystems are replaced.
        assert_eq!(warm.release, [MountOp::Detach { target: "/w/ws".into() }]);
        let tmp_gone = warm.reset.iter().position(|o| *o == MountOp::Detach { target: "/tmp".into() });
        let tmp_new = warm.reset.iter().position(|o| *o == MountOp::Tmpfs { target: "/tmp".into(), mode: 0o1777 });
        assert!(tmp_gone < tmp_new && tmp_new.is_some());
        assert!(warm.reset.contains(&MountOp::Tmpfs { target: "/dev/shm".into(), mode: 0o1777 }));
    }

    #[test]
    fn overlay_options_escape_separators() {
        let o = overlay_options(&["/l1".into(), "/a,b:c\\d".into()], OsStr::new("/u"), OsStr::new("/w"));
        assert_eq!(o, OsString::from("lowerdir=/l1:/a\\,b\\:c\\\\d,upperdir=/u,workdir=/w,userxattr"));
    }
}
