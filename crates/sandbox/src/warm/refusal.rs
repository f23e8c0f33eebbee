//! Why a warm server does not take a request, as data: who is asking, what the request names,
//! what changed since the server started, a step of the run's own setup that failed. The
//! client gets the text (`refuse REASON`, `crate::warm::wire::Answer`) and builds a sandbox of
//! its own.
//!
//! Owns the wording of each reason and which of them retire the server; may not make a
//! syscall nor decide when a request is refused (the server's).

use std::path::PathBuf;

use rustix::io::Errno;

use super::wire::WireError;
use crate::step::StepError;

/// A request the server did not serve (nothing of it ran).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    // Who is asking (`server::trusted`).
    #[error("uid {uid} may not use the warm server of uid {server}")]
    OtherUser { uid: u32, server: u32 },
    #[error("who is asking: {0}")]
    WhoIsAsking(Errno),
    /// The peer is a command of some sandbox, not a launcher on the host.
    #[error("the client runs inside a sandbox ({depth} pid namespaces deep)")]
    InsideSandbox { depth: usize },
    #[error("the client is gone")]
    ClientGone,

    // Reading the request (`server::receive`).
    #[error("reading the request: {0}")]
    Read(Errno),
    #[error("the client left before sending its whole request")]
    Incomplete,
    #[error("request of {len} bytes is too large")]
    TooLarge { len: usize },
    #[error(transparent)]
    Malformed(#[from] WireError),
    #[error("{got} fds came with a request that needs {want}")]
    FdCount { got: usize, want: usize },

    // What the request asks for.
    #[error("this server was started by another txbox binary")]
    OtherBinary,
    #[error("this server was built for another sandbox")]
    OtherSandbox,
    #[error("{} is not a transaction's layer", .0.display())]
    NotALayer(PathBuf),
    #[error("upper and work are not one transaction's")]
    NotOneTransaction,
    #[error("{} is not an earlier step of the same session", .0.display())]
    NotAnEarlierStep(PathBuf),
    /// The command cannot be handed to exec (a NUL byte in an argument, the environment, the
    /// working directory): the step says which.
    #[error("{}", .0.step)]
    Command(StepError),

    // What changed since the server started.
    #[error("{} appeared or was replaced after this server started", .0.display())]
    SecretMoved(PathBuf),
    #[error("the workspace was replaced since this server started")]
    WorkspaceReplaced,

    // The request's layers, found beneath the server's own clone of the state directory.
    #[error("{} is not in the state directory", .0.display())]
    NotInState(PathBuf),
    #[error("open {}: {errno}", .path.display())]
    Open { path: PathBuf, errno: Errno },
    #[error("{} changed under the request", .0.display())]
    Changed(PathBuf),
    #[error("locking {}: {errno}", .path.display())]
    Lock { path: PathBuf, errno: Errno },

    /// A mount of the run's own failed (worded as a cold sandbox's failed step).
    #[error(transparent)]
    Setup(StepError),
}

impl Refusal {
    /// Whether the server stops serving after this refusal: it cannot serve anyone any more
    /// (another binary took over, a secret shows, the workspace it shows is not the real one).
    pub fn retires(&self) -> bool {
        matches!(self, Refusal::OtherBinary | Refusal::SecretMoved(_) | Refusal::WorkspaceReplaced)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn reasons_read_as_before_and_only_a_server_that_cannot_serve_retires() {
        let p = || PathBuf::from("/s/tx/a/upper");
        let cases: Vec<(Refusal, &str, bool)> = vec![
            (Refusal::OtherUser { uid: 7, server: 0 }, "uid 7 may not use the warm server of uid 0", false),
            (Refusal::WhoIsAsking(Errno::NOTCONN), "who is asking: ", false),
            (Refusal::InsideSandbox { depth: 2 }, "the client runs inside a sandbox (2 pid namespaces deep)", false),
            (Refusal::ClientGone, "the client is gone", false),
            (Refusal::Read(Errno::AGAIN), "reading the request: ", false),
            (Refusal::Incomplete, "the client left before sending its whole request", false),
            (Refusal::TooLarge { len: 9 }, "request of 9 bytes is too large", false),
            (WireError::Malformed("umask").into(), "malformed warm-sandbox request: umask", false),
            (Refusal::FdCount { got: 3, want: 7 }, "3 fds came with a request that needs 7", false),
            (Refusal::OtherBinary, "this server was started by another txbox binary", true),
            (Refusal::OtherSandbox, "this server was built for another sandbox", false),
            (Refusal::NotALayer(p()), "/s/tx/a/upper is not a transaction's layer", false),
            (Refusal::NotOneTransaction, "upper and work are not one transaction's", false),
            (Refusal::NotAnEarlierStep(p()), "/s/tx/a/upper is not an earlier step of the same session", false),
            (
                Refusal::Command(StepError::new("argument with a NUL byte", Errno::INVAL)),
                "argument with a NUL byte",
                false,
            ),
            (Refusal::SecretMoved(p()), "/s/tx/a/upper appeared or was replaced after this server started", true),
            (Refusal::WorkspaceReplaced, "the workspace was replaced since this server started", true),
            (Refusal::NotInState(p()), "/s/tx/a/upper is not in the state directory", false),
            (Refusal::Open { path: p(), errno: Errno::LOOP }, "open /s/tx/a/upper: ", false),
            (Refusal::Changed(p()), "/s/tx/a/upper changed under the request", false),
            (
                Refusal::Setup(StepError::at_path("mount overlay on", Path::new("/w"), Errno::INVAL)),
                "sandbox setup failed at `mount overlay on /w`: ",
                false,
            ),
        ];
        for (r, text, retires) in cases {
            assert!(r.to_string().starts_with(text), "{r:?}: {r}");
            assert_eq!(r.retires(), retires, "{r:?}");
        }
        // The errno is worded as before (rustix's Display).
        let e = Errno::LOOP;
        assert_eq!(Refusal::Lock { path: p(), errno: e }.to_string(), format!("locking /s/tx/a/upper: {e}"));
    }
}
