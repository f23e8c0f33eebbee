//! What the sandbox must build, as data: the spec handed to the stage-2 helper, and the mount
//! plan derived from it. Pure: unit-tested without privileges.

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
    /// Wait for one byte on fd 4 before starting the command (the launcher first puts stage 2
    /// into its cgroups, so no child escapes the limits).
    pub sync: bool,
    pub argv: Vec<OsString>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed stage-2 arguments: {0}")]
pub struct SpecError(pub String);

impl SandboxSpec {
    /// A spec with the defaults of DESIGN §5 for running `argv` in `workspace`.
    pub fn new(workspace: PathBuf, upper: PathBuf, work: PathBuf, argv: Vec<OsString>) -> SandboxSpec {
        SandboxSpec {
            cwd: workspace.clone(),
            workspace,
            upper,
            work,
            layers: Vec::new(),
            hide: Vec::new(),
            writable: Vec::new(),
            userns: false,
            uid: 0,
            gid: 0,
            host_network: false,
            cpu_seconds: None,
            max_file_size: None,
            sync: false,
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
        kv("--cwd", self.cwd.as_os_str());
        kv("--ids", OsStr::new(&format!("{}:{}:{}", u8::from(self.userns), self.uid, self.gid)));
        let opt = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
        kv(
            "--limits",
            OsStr::new(&format!(
                "{}:{}:{}:{}",
                u8::from(self.host_network),
                opt(self.cpu_seconds),
                opt(self.max_file_size),
                u8::from(self.sync)
            )),
        );
        a.push(OsString::from("--"));
        a.extend(self.argv.iter().cloned());
        a
    }

    pub fn from_args(args: &[OsString]) -> Result<SandboxSpec, SpecError> {
        let mut spec = SandboxSpec::new(PathBuf::new(), PathBuf::new(), PathBuf::new(), Vec::new());
        let mut it = args.iter();
        while let Some(k) = it.next() {
            if k == "--" {
                spec.argv = it.cloned().collect();
                break;
            }
            let v = it.next().ok_or_else(|| SpecError(format!("{} needs a value", k.to_string_lossy())))?;
            let s = v.to_string_lossy();
            let parts: Vec<&str> = s.split(':').collect();
            let bad = || SpecError(format!("bad {}: {s}", k.to_string_lossy()));
            let num = |x: &str| x.parse::<u32>().map_err(|_| bad());
            let opt = |x: &str| if x == "-" { Ok(None) } else { x.parse::<u64>().map(Some).map_err(|_| bad()) };
            match k.as_bytes() {
                b"--workspace" => spec.workspace = PathBuf::from(v),
                b"--upper" => spec.upper = PathBuf::from(v),
                b"--work" => spec.work = PathBuf::from(v),
                b"--hide" => spec.hide.push(PathBuf::from(v)),
                b"--writable" => spec.writable.push(PathBuf::from(v)),
                b"--layer" => spec.layers.push(PathBuf::from(v)),
                b"--cwd" => spec.cwd = PathBuf::from(v),
                b"--ids" => match parts.as_slice() {
                    [u, uid, gid] => {
                        spec.userns = *u == "1";
                        spec.uid = num(uid)?;
                        spec.gid = num(gid)?;
                    }
                    _ => return Err(bad()),
                },
                b"--limits" => match parts.as_slice() {
                    [net, cpu, fsize, sync] => {
                        spec.host_network = *net == "1";
                        spec.cpu_seconds = opt(cpu)?;
                        spec.max_file_size = opt(fsize)?;
                        spec.sync = *sync == "1";
                    }
                    _ => return Err(bad()),
                },
                other => return Err(SpecError(format!("unknown option {}", String::from_utf8_lossy(other)))),
            }
        }
        if spec.argv.is_empty() {
            return Err(SpecError("no command".into()));
        }
        if !spec.workspace.is_absolute() || !spec.upper.is_absolute() || !spec.work.is_absolute() {
            return Err(SpecError("workspace, upper and work must be absolute paths".into()));
        }
        Ok(spec)
    }
}

/// One mount operation of the sandbox, in the order it must happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOp {
    /// Make every mount private, so nothing done inside propagates to the host.
    PrivateRoot,
    /// A fresh tmpfs (`/tmp`, `/dev`, `/dev/shm`).
    Tmpfs { target: PathBuf, mode: u32 },
    /// The workspace view: an overlay mounted on the workspace's own path. `lowers` are
    /// topmost first; the last is the workspace itself. Every layer is opened before the first
    /// mount, so a workspace below `/tmp` is still reachable after `/tmp` is replaced.
    Overlay { target: PathBuf, lowers: Vec<PathBuf>, upper: PathBuf, work: PathBuf },
    /// Every mount read-only, recursively (`mount_setattr`).
    ReadOnlyRoot,
    /// Undo `ReadOnlyRoot` for one mount of our own (the workspace view, `/tmp`, extras).
    Writable { target: PathBuf },
    /// Make one mount read-only (`/dev` once it is populated).
    ReadOnly { target: PathBuf },
    /// Bind a host object (opened before `/dev` was replaced) onto a path.
    Bind { source: PathBuf, target: PathBuf },
    /// A private devpts instance.
    Devpts { target: PathBuf },
    Symlink { target: PathBuf, points_to: PathBuf },
    /// Make a path invisible: an empty read-only tmpfs over a directory, an empty read-only
    /// file over a file.
    Hide { target: PathBuf },
    /// A procfs of the sandbox's own pid namespace; mounted by its init process.
    Proc { target: PathBuf },
    /// Bind a path onto itself read-only (kernel knobs under /proc that root could turn).
    ReadOnlyBind { target: PathBuf },
    /// A read-only sysfs of the sandbox's own network namespace (so /sys/class/net shows
    /// only its loopback).
    Sysfs { target: PathBuf },
}

/// The mount plan: ops run right after `unshare`, then ops run by the pid namespace's init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub namespace: Vec<MountOp>,
    pub init: Vec<MountOp>,
}

/// The device nodes the sandbox's `/dev` holds (DESIGN §5), bound from the host.
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
            MountOp::ReadOnlyRoot,
            MountOp::Writable { target: spec.workspace.clone() },
            MountOp::Writable { target: p("/tmp") },
        ];
        ops.extend(spec.writable.iter().map(|w| MountOp::Writable { target: w.clone() }));
        if !spec.host_network {
            ops.push(MountOp::Sysfs { target: p("/sys") });
        }
        ops.push(MountOp::Tmpfs { target: p("/dev"), mode: 0o755 });
        for d in DEVICES {
            ops.push(MountOp::Bind { source: Path::new("/dev").join(d), target: Path::new("/dev").join(d) });
        }
        ops.push(MountOp::Devpts { target: p("/dev/pts") });
        ops.push(MountOp::Symlink { target: p("/dev/ptmx"), points_to: p("pts/ptmx") });
        ops.push(MountOp::Tmpfs { target: p("/dev/shm"), mode: 0o1777 });
        for (name, to) in [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")] {
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
        let mut out = Vec::new();
        for op in &self.namespace {
            match op {
                MountOp::Overlay { lowers, upper, work, .. } => {
                    out.extend(lowers.iter().cloned());
                    out.push(upper.clone());
                    out.push(work.clone());
                }
                MountOp::Bind { source, .. } => out.push(source.clone()),
                _ => {}
            }
        }
        out
    }
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

/// The default list of secrets hidden from every sandbox (DESIGN §5), for a user whose home
/// directory is `home`.
pub fn default_secrets(home: Option<&Path>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = ["/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d", "/etc/ssh"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(h) = home {
        for rel in [
            ".ssh",
            ".aws",
            ".gnupg",
            ".config/gh",
            ".netrc",
            ".docker/config.json",
            ".kube",
            ".git-credentials",
            ".config/gcloud",
            ".azure",
            ".pypirc",
            ".npmrc",
            ".cargo/credentials.toml",
            ".cargo/credentials",
            ".password-store",
            ".local/share/keyrings",
        ] {
            v.push(h.join(rel));
        }
    }
    v
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
        s.sync = true;
        s
    }

    #[test]
    fn spec_round_trips_through_arguments() {
        let s = spec();
        assert_eq!(SandboxSpec::from_args(&s.to_args()), Ok(s));
    }

    #[test]
    fn malformed_arguments_are_refused() {
        assert!(SandboxSpec::from_args(&[OsString::from("--workspace")]).is_err());
        assert!(SandboxSpec::from_args(&[OsString::from("--bogus"), OsString::from("x")]).is_err());
        assert!(SandboxSpec::from_args(&[OsString::from("--limits"), OsString::from("1:x:-:0")]).is_err());
        let mut s = spec();
        s.argv.clear();
        assert!(SandboxSpec::from_args(&s.to_args()).is_err());
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
        assert!(tmp < overlay && overlay < ro && ro < ws_rw && ws_rw < dev && dev < null && null < hide_state, "{ops:#?}");
        assert_eq!(ops[ops.len() - 2], MountOp::Hide { target: "/home/u/.ssh".into() });
        assert_eq!(ops.last(), Some(&MountOp::ReadOnly { target: "/dev".into() }));
        assert_eq!(plan.init[0], MountOp::Proc { target: "/proc".into() });
        assert!(plan.init.contains(&MountOp::ReadOnlyBind { target: "/proc/sysrq-trigger".into() }));
        // Everything a later mount may cover is opened first.
        let sources = plan.sources();
        assert!(sources.contains(&"/w/ws".into()) && sources.contains(&"/dev/null".into()));
    }

    #[test]
    fn overlay_options_escape_separators() {
        let o = overlay_options(&["/l1".into(), "/a,b:c\\d".into()], OsStr::new("/u"), OsStr::new("/w"));
        assert_eq!(o, OsString::from("lowerdir=/l1:/a\\,b\\:c\\\\d,upperdir=/u,workdir=/w,userxattr"));
    }

    #[test]
    fn secrets_cover_the_usual_credentials() {
        let s = default_secrets(Some(Path::new("/home/dev")));
        for want in ["/home/dev/.ssh", "/home/dev/.aws", "/etc/shadow", "/home/dev/.docker/config.json", "/home/dev/.kube"] {
            assert!(s.contains(&PathBuf::from(want)), "{want} missing");
        }
    }
}
