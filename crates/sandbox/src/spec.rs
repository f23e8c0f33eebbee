//! What the sandbox must build, as data: the spec handed to the stage-2 helper, and the mount
//! plan derived from it. Pure: unit-tested without privileges.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

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
    /// Paths made invisible and unwritable inside (the state directory, the policy file).
    pub hide: Vec<PathBuf>,
    /// Working directory of the command inside the sandbox.
    pub cwd: PathBuf,
    /// Create a user namespace (needed without root; the invoking ids map to themselves).
    pub userns: bool,
    pub uid: u32,
    pub gid: u32,
    pub argv: Vec<OsString>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed stage-2 arguments: {0}")]
pub struct SpecError(pub String);

impl SandboxSpec {
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
        kv("--cwd", self.cwd.as_os_str());
        kv("--ids", OsStr::new(&format!("{}:{}:{}", u8::from(self.userns), self.uid, self.gid)));
        a.push(OsString::from("--"));
        a.extend(self.argv.iter().cloned());
        a
    }

    pub fn from_args(args: &[OsString]) -> Result<SandboxSpec, SpecError> {
        let mut spec = SandboxSpec {
            workspace: PathBuf::new(),
            upper: PathBuf::new(),
            work: PathBuf::new(),
            layers: Vec::new(),
            hide: Vec::new(),
            cwd: PathBuf::new(),
            userns: false,
            uid: 0,
            gid: 0,
            argv: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(k) = it.next() {
            if k == "--" {
                spec.argv = it.cloned().collect();
                break;
            }
            let v = it.next().ok_or_else(|| SpecError(format!("{} needs a value", k.to_string_lossy())))?;
            match k.as_bytes() {
                b"--workspace" => spec.workspace = PathBuf::from(v),
                b"--upper" => spec.upper = PathBuf::from(v),
                b"--work" => spec.work = PathBuf::from(v),
                b"--hide" => spec.hide.push(PathBuf::from(v)),
                b"--layer" => spec.layers.push(PathBuf::from(v)),
                b"--cwd" => spec.cwd = PathBuf::from(v),
                b"--ids" => {
                    let s = v.to_string_lossy();
                    let parts: Vec<&str> = s.split(':').collect();
                    let num = |x: &str| x.parse::<u32>().map_err(|_| SpecError(format!("bad --ids {s}")));
                    match parts.as_slice() {
                        [u, uid, gid] => {
                            spec.userns = *u == "1";
                            spec.uid = num(uid)?;
                            spec.gid = num(gid)?;
                        }
                        _ => return Err(SpecError(format!("bad --ids {s}"))),
                    }
                }
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
    /// The workspace view: an overlay mounted on the workspace's own path. `lowers` are
    /// topmost first; the last is the workspace itself.
    Overlay { target: PathBuf, lowers: Vec<PathBuf>, upper: PathBuf, work: PathBuf },
    /// An empty read-only tmpfs over a path that must be neither visible nor writable.
    Hide { target: PathBuf },
    /// A procfs of the sandbox's own pid namespace; mounted by its init process.
    Proc { target: PathBuf },
}

/// The mount plan: ops run right after `unshare`, then ops run by the pid namespace's init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub namespace: Vec<MountOp>,
    pub init: Vec<MountOp>,
}

impl MountPlan {
    pub fn for_spec(spec: &SandboxSpec) -> MountPlan {
        let mut namespace = vec![
            MountOp::PrivateRoot,
            MountOp::Overlay {
                target: spec.workspace.clone(),
                lowers: spec.layers.iter().cloned().chain([spec.workspace.clone()]).collect(),
                upper: spec.upper.clone(),
                work: spec.work.clone(),
            },
        ];
        // Hidden paths after the overlay: one inside the workspace must cover the merged view.
        namespace.extend(spec.hide.iter().map(|h| MountOp::Hide { target: h.clone() }));
        MountPlan { namespace, init: vec![MountOp::Proc { target: PathBuf::from("/proc") }] }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            workspace: "/w/ws".into(),
            upper: "/w/ws/.txbox/tx/1/upper".into(),
            work: "/w/ws/.txbox/tx/1/work".into(),
            hide: vec!["/w/ws/.txbox".into()],
            layers: vec!["/w/ws/.txbox/tx/1/steps/1/upper".into()],
            cwd: "/w/ws/src".into(),
            userns: true,
            uid: 1000,
            gid: 100,
            argv: vec![OsString::from("sh"), OsString::from("-c"), OsString::from_vec(b"echo \xff --".to_vec())],
        }
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
        let mut s = spec();
        s.argv.clear();
        assert!(SandboxSpec::from_args(&s.to_args()).is_err());
    }

    #[test]
    fn plan_mounts_overlay_then_hides_then_proc_in_init() {
        let plan = MountPlan::for_spec(&spec());
        assert_eq!(
            plan.namespace,
            vec![
                MountOp::PrivateRoot,
                MountOp::Overlay {
                    target: "/w/ws".into(),
                    lowers: vec!["/w/ws/.txbox/tx/1/steps/1/upper".into(), "/w/ws".into()],
                    upper: "/w/ws/.txbox/tx/1/upper".into(),
                    work: "/w/ws/.txbox/tx/1/work".into()
                },
                MountOp::Hide { target: "/w/ws/.txbox".into() },
            ]
        );
        assert_eq!(plan.init, vec![MountOp::Proc { target: "/proc".into() }]);
    }

    #[test]
    fn overlay_options_escape_separators() {
        let o = overlay_options(&["/l1".into(), "/a,b:c\\d".into()], OsStr::new("/u"), OsStr::new("/w"));
        assert_eq!(o, OsString::from("lowerdir=/l1:/a\\,b\\:c\\\\d,upperdir=/u,workdir=/w,userxattr"));
    }
}
