//! What a client and a warm server say to each other, as bytes. Pure: unit-tested without a
//! socket.
//!
//! ```text
//! client → server   u32 length (LE) + body, with SCM_RIGHTS fds on the first bytes:
//!                   stdin, stdout, stderr, workspace, upper, work, layers… (O_PATH for the dirs)
//!                   body = items, each u32 length (LE) + bytes:
//!                   "txbox-warm/2", the client's binary (`warm::binary_id`), umask (octal),
//!                   rlimits ("RES:CUR:MAX;…", "-" = infinity),
//!                   N, N spec arguments (SandboxSpec::to_args), the environment ("K=V"…),
//!                   "end" (so a cut anywhere is noticed)
//! server → client   "ok\n" or "ok premounted\n" (the command starts, in a view mounted before
//!                   it asked or for it) or "refuse REASON\n" (nothing was done:
//!                   run it elsewhere), then a `Report`, as stage 2 writes it on its report
//!                   pipe: "exit N\n" | "signal N\n" | "error MESSAGE\n", then end of stream
//! client → server   end of stream (shutdown) at any time: kill the command
//! ```
//!
//! Also the server's command line (`ServerArgs`), the names beside its socket
//! (`with_suffix`) and the resource limits a request carries (`RESOURCES`): what client and
//! server both need lives here, so neither depends on the other.
//!
//! May not make a syscall.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::spec::SpecError;
use crate::SandboxSpec;

const VERSION: &[u8] = b"txbox-warm/2";
const END: &[u8] = b"end";

/// The largest request a server reads (a long script and a large environment fit easily).
pub const MAX_REQUEST: usize = 64 << 20;

/// fds beside the body: stdin, stdout, stderr, workspace, upper, work, then one per layer.
pub const FIXED_FDS: usize = 6;

/// Layers a request may carry (SCM_RIGHTS passes at most 253 fds); deeper sessions run cold.
pub const MAX_LAYERS: usize = 200;

/// One command for a warm sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The client's binary: a server of another one does not serve it.
    pub binary: String,
    pub spec: SandboxSpec,
    /// The caller's environment, `KEY=VALUE`, which the command gets instead of the server's.
    pub env: Vec<OsString>,
    pub umask: u32,
    /// The caller's resource limits: (resource number, soft, hard), `None` = unlimited.
    pub rlimits: Vec<(u32, Option<u64>, Option<u64>)>,
}

/// Why a request's body was refused: which item was missing or did not parse, or what was
/// wrong with the spec it carries.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The item named (`umask`, `truncated spec`, `no end marker`…) is missing or malformed.
    #[error("malformed warm-sandbox request: {0}")]
    Malformed(&'static str),
    #[error("malformed warm-sandbox request: {0}")]
    Spec(#[from] SpecError),
}

fn bad(what: &'static str) -> WireError {
    WireError::Malformed(what)
}

impl Request {
    /// The fds that travel with this request.
    pub fn fd_count(&self) -> usize {
        FIXED_FDS + self.spec.layers.len()
    }

    /// The whole frame: length prefix and body.
    pub fn encode(&self) -> Vec<u8> {
        let num = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |n| n.to_string());
        let rlimits: Vec<String> =
            self.rlimits.iter().map(|(r, c, m)| format!("{r}:{}:{}", num(*c), num(*m))).collect();
        let spec = self.spec.to_args();
        let mut items: Vec<Vec<u8>> = vec![
            VERSION.to_vec(),
            self.binary.as_bytes().to_vec(),
            format!("{:o}", self.umask).into_bytes(),
            rlimits.join(";").into_bytes(),
            spec.len().to_string().into_bytes(),
        ];
        items.extend(spec.iter().map(|a| a.as_bytes().to_vec()));
        items.extend(self.env.iter().map(|e| e.as_bytes().to_vec()));
        items.push(END.to_vec());
        let mut body = Vec::new();
        for item in &items {
            body.extend_from_slice(&(item.len() as u32).to_le_bytes());
            body.extend_from_slice(item);
        }
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend(body);
        frame
    }

    /// Parse a body (the frame without its length prefix).
    pub fn decode(body: &[u8]) -> Result<Request, WireError> {
        let mut items = Vec::new();
        let mut rest = body;
        while !rest.is_empty() {
            let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(|| bad("truncated item length"))?;
            let len = u32::from_le_bytes(*len) as usize;
            if tail.len() < len {
                return Err(bad("truncated item"));
            }
            items.push(&tail[..len]);
            rest = &tail[len..];
        }
        if items.last() != Some(&END) {
            return Err(bad("no end marker"));
        }
        items.pop();
        let mut it = items.into_iter();
        if it.next() != Some(VERSION) {
            return Err(bad("not a txbox-warm/2 request"));
        }
        let text = |b: Option<&[u8]>, what: &'static str| -> Result<String, WireError> {
            String::from_utf8(b.ok_or_else(|| bad(what))?.to_vec()).map_err(|_| bad(what))
        };
        let binary = text(it.next(), "binary")?;
        let umask = u32::from_str_radix(&text(it.next(), "umask")?, 8).map_err(|_| bad("umask"))?;
        let mut rlimits = Vec::new();
        for part in text(it.next(), "rlimits")?.split(';').filter(|p| !p.is_empty()) {
            let f: Vec<&str> = part.split(':').collect();
            let opt =
                |s: &str| if s == "-" { Ok(None) } else { s.parse::<u64>().map(Some).map_err(|_| bad("rlimit value")) };
            match f.as_slice() {
                [r, c, m] => rlimits.push((r.parse::<u32>().map_err(|_| bad("rlimit resource"))?, opt(c)?, opt(m)?)),
                _ => return Err(bad("rlimit")),
            }
        }
        let n: usize = text(it.next(), "spec length")?.parse().map_err(|_| bad("spec length"))?;
        let mut spec_args = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            spec_args.push(OsString::from_vec(it.next().ok_or_else(|| bad("truncated spec"))?.to_vec()));
        }
        let spec = SandboxSpec::from_args(&spec_args)?;
        let env = it.map(|e| OsString::from_vec(e.to_vec())).collect();
        Ok(Request { binary, spec, env, umask, rlimits })
    }
}

/// What `txbox __warm` was started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerArgs {
    pub socket: PathBuf,
    /// The state directory, where every transaction's upper and work directories live.
    pub state: PathBuf,
    pub idle: Duration,
    /// The spec of the run that started the server: what its sandbox is built from.
    pub spec: SandboxSpec,
}

impl ServerArgs {
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a = vec![
            OsString::from("--socket"),
            self.socket.clone().into_os_string(),
            OsString::from("--state"),
            self.state.clone().into_os_string(),
            OsString::from("--idle"),
            OsString::from(self.idle.as_secs().to_string()),
        ];
        a.extend(self.spec.to_args());
        a
    }

    pub fn from_args(args: &[OsString]) -> Result<ServerArgs, SpecError> {
        match args {
            [s, socket, t, state, i, idle, rest @ ..] if s == "--socket" && t == "--state" && i == "--idle" => {
                let idle = idle.to_str().and_then(|t| t.parse::<u64>().ok()).ok_or_else(|| SpecError::BadValue {
                    option: "--idle".into(),
                    value: idle.to_string_lossy().into_owned(),
                })?;
                let spec = SandboxSpec::from_args(rest)?;
                Ok(ServerArgs {
                    socket: PathBuf::from(socket),
                    state: PathBuf::from(state),
                    idle: Duration::from_secs(idle),
                    spec,
                })
            }
            _ => Err(SpecError::WarmUsage),
        }
    }
}

/// `SOCKET` + `suffix`: the server's lock (`.lock`), the busy lock a client holds while served
/// (`.busy`), the reason a server could not start (`.failed`).
pub(crate) fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// The resource limits a client passes on, by number.
pub(crate) const RESOURCES: [rustix::process::Resource; 16] = {
    use rustix::process::Resource::*;
    [Cpu, Fsize, Data, Stack, Core, Rss, Nproc, Nofile, Memlock, As, Locks, Sigpending, Msgqueue, Nice, Rtprio, Rttime]
};

pub(crate) fn resource(n: u32) -> Option<rustix::process::Resource> {
    RESOURCES.iter().copied().find(|r| *r as u32 == n)
}

/// How a command ended, as stage 2 reports it on its report pipe and a warm server on its
/// connection: one line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    Exit(i32),
    Signal(i32),
    /// The sandbox could not be built or the command not started (nothing ran).
    Error(String),
}

impl Report {
    /// From a `waitpid` status.
    pub fn of_wait_status(st: i32) -> Report {
        if libc::WIFSIGNALED(st) {
            Report::Signal(libc::WTERMSIG(st))
        } else {
            Report::Exit(libc::WEXITSTATUS(st))
        }
    }

    pub fn line(&self) -> String {
        match self {
            Report::Exit(c) => format!("exit {c}\n"),
            Report::Signal(s) => format!("signal {s}\n"),
            Report::Error(why) => format!("error {}\n", why.replace('\n', " ")),
        }
    }

    pub fn parse(line: &str) -> Option<Report> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let num = |s: &str| s.trim().parse::<i32>().ok();
        if let Some(why) = line.strip_prefix("error ") {
            return Some(Report::Error(why.to_string()));
        }
        if let Some(c) = line.strip_prefix("exit ").and_then(num) {
            return Some(Report::Exit(c));
        }
        line.strip_prefix("signal ").and_then(num).map(Report::Signal)
    }

    /// What a stream of report lines says: the first error, else the last fate.
    pub fn of_stream(text: &str) -> Option<Report> {
        let mut fate = None;
        for r in text.lines().filter_map(Report::parse) {
            match r {
                Report::Error(_) => return Some(r),
                r => fate = Some(r),
            }
        }
        fate
    }
}

/// The server's first answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The command is starting; its fate follows. `premounted`: in the view the server had
    /// mounted before the request came.
    Ok { premounted: bool },
    /// Nothing was done; the caller should build a sandbox of its own.
    Refuse(String),
}

impl Answer {
    pub fn line(&self) -> String {
        match self {
            Answer::Ok { premounted: false } => "ok\n".to_string(),
            Answer::Ok { premounted: true } => "ok premounted\n".to_string(),
            // One line: a reason never carries a newline into the protocol.
            Answer::Refuse(why) => format!("refuse {}\n", why.replace('\n', " ")),
        }
    }

    pub fn parse(line: &str) -> Option<Answer> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        match line {
            "ok" => return Some(Answer::Ok { premounted: false }),
            "ok premounted" => return Some(Answer::Ok { premounted: true }),
            _ => {}
        }
        line.strip_prefix("refuse ").map(|w| Answer::Refuse(w.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn request() -> Request {
        let mut spec = SandboxSpec::new(
            "/w/ws".into(),
            "/s/tx/1/upper".into(),
            "/s/tx/1/work".into(),
            vec![OsString::from("bash"), OsString::from("-c"), OsString::from_vec(b"printf '\xff\n' > f".to_vec())],
        );
        spec.layers = vec![PathBuf::from("/s/tx/1/steps/1/upper")];
        spec.hide = vec!["/s".into()];
        Request {
            binary: "0123456789abcdef".into(),
            spec,
            env: vec![
                OsString::from("PATH=/usr/bin:/bin"),
                OsString::from_vec(b"ODD=\xfe=x".to_vec()),
                OsString::from("EMPTY="),
            ],
            umask: 0o027,
            rlimits: vec![(7, Some(1024), Some(4096)), (3, Some(8 << 20), None)],
        }
    }

    #[test]
    fn requests_round_trip_with_any_bytes() {
        let r = request();
        let frame = r.encode();
        let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        assert_eq!(len, frame.len() - 4);
        assert_eq!(Request::decode(&frame[4..]), Ok(r.clone()));
        assert_eq!(r.fd_count(), 7);
        let mut no_env = r;
        no_env.env.clear();
        no_env.rlimits.clear();
        assert_eq!(Request::decode(&no_env.encode()[4..]), Ok(no_env));
    }

    #[test]
    fn damaged_requests_are_refused_not_guessed() {
        let frame = request().encode();
        let body = &frame[4..];
        for cut in [0, 3, 10, body.len() / 2, body.len() - 1] {
            let r = Request::decode(&body[..cut]);
            assert!(r.is_err(), "a body cut at {cut} of {} was accepted: {r:?}", body.len());
        }
        let mut other = body.to_vec();
        other[4..16].copy_from_slice(b"txbox-warm/1");
        assert_eq!(Request::decode(&other), Err(bad("not a txbox-warm/2 request")));
        assert_eq!(
            Request::decode(&other).map_err(|e| e.to_string()),
            Err("malformed warm-sandbox request: not a txbox-warm/2 request".into())
        );
        // A spec the request carries is judged as stage 2 judges it, and says so.
        let mut r = request();
        r.spec.argv.clear();
        let e = Request::decode(&r.encode()[4..]);
        assert_eq!(e, Err(WireError::Spec(SpecError::NoCommand)));
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("malformed warm-sandbox request: malformed stage-2 arguments: no command".into())
        );
    }

    #[test]
    fn server_arguments_round_trip() {
        let spec = SandboxSpec::new("/w".into(), "/u".into(), "/k".into(), vec![OsString::from("true")]);
        let a =
            ServerArgs { socket: "/s/warm/0123.sock".into(), state: "/s".into(), idle: Duration::from_secs(60), spec };
        assert_eq!(ServerArgs::from_args(&a.to_args()), Ok(a));
        assert!(ServerArgs::from_args(&[OsString::from("--idle")]).is_err());
    }

    #[test]
    fn resources_are_numbered_as_the_kernel_numbers_them() {
        for (i, r) in RESOURCES.iter().enumerate() {
            assert_eq!(*r as u32, i as u32, "{r:?}");
        }
    }
    #[test]
    fn reports_are_single_lines_and_an_error_wins() {
        for r in [Report::Exit(0), Report::Exit(7), Report::Signal(9), Report::Error("at `mount`: EPERM".into())] {
            assert_eq!(Report::parse(&r.line()), Some(r));
        }
        assert_eq!(Report::Error("two\nlines".into()).line(), "error two lines\n");
        assert_eq!(Report::of_stream("exit 1\nexit 3\n"), Some(Report::Exit(3)));
        assert_eq!(Report::of_stream("exit 0\nerror setup\nsignal 9\n"), Some(Report::Error("setup".into())));
        assert_eq!(Report::of_stream("ok\ngarbage\n"), None);
        assert_eq!(Report::of_wait_status(9), Report::Signal(9));
        assert_eq!(Report::of_wait_status(3 << 8), Report::Exit(3));
    }

    #[test]
    fn answers_are_single_lines() {
        for premounted in [false, true] {
            assert_eq!(Answer::parse(&Answer::Ok { premounted }.line()), Some(Answer::Ok { premounted }));
        }
        assert_eq!(Answer::parse("ok premounted later\n"), None);
        let refuse = Answer::Refuse("busy\nnow".into());
        assert_eq!(refuse.line(), "refuse busy now\n");
        assert_eq!(Answer::parse(&refuse.line()), Some(Answer::Refuse("busy now".into())));
        assert_eq!(Answer::parse("exit 0\n"), None);
    }
}
