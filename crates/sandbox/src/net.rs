//! The sandbox's side of network by allowlist (issue #15): everything here runs in stage 2 or
//! a warm server, inside the sandbox's own network namespace, which has loopback only.
//!
//! - [`hand_over_listener`]: with `spec.proxy_port`, stage 2 listens on `127.0.0.1:PORT` in the
//!   new namespace and sends the listening socket on [`NET_FD`] to the proxy outside. A socket
//!   keeps the namespace it was made in, so the proxy accepts the command's connections
//!   directly; the namespace gets no route out.
//! - [`Attempts`]: how often the command tried to reach the network anyway: packets the
//!   namespace had no route for (`OutNoRoutes`, IPv4 and IPv6: name servers and hosts
//!   outside) and UDP datagrams to closed loopback ports (`NoPorts`: a name server configured
//!   on loopback, such as `127.0.0.53`, which does not exist here). Name resolution itself
//!   fails at once either way (no route, or a port unreachable), never by timeout. Reported as
//!   `net N` on the report channel, after the command's fate.
//!
//! Owns the listener handed to the proxy and the namespace's counters; may not connect anywhere
//! (the proxy, outside the sandbox, does) nor decide when it runs (stage 2's order, through
//! `kernel::Kernel`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::stage2::{at, StepError};
use crate::SandboxSpec;

/// The fd on which stage 2 sends the proxy listener (installed by the launcher).
pub const NET_FD: i32 = 9;

/// Listen on `127.0.0.1:spec.proxy_port` and send the socket on [`NET_FD`]; then close it. A
/// no-op without a proxy port.
pub(crate) fn hand_over_listener(spec: &SandboxSpec) -> Result<(), StepError> {
    let Some(port) = spec.proxy_port else { return Ok(()) };
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    // SAFETY: NET_FD was installed by the launcher for this process; owned from here on.
    let handoff = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(NET_FD) };
    let listener = rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(at("proxy listener"))?;
    let addr = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    rustix::net::bind(&listener, &addr).map_err(|e| StepError::new(format!("bind the proxy listener to {addr}"), e))?;
    rustix::net::listen(&listener, 128).map_err(at("listen for the proxy"))?;
    send_fd(handoff.as_fd(), listener.as_fd()).map_err(at("hand the proxy listener over"))?;
    Ok(())
}

fn send_fd(sock: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> rustix::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(rustix::io::Errno::NOBUFS);
    }
    rustix::net::sendmsg(sock, &[std::io::IoSlice::new(b"listener")], &mut control, SendFlags::NOSIGNAL).map(drop)
}

/// Set `spec.env` in this (single-threaded) process, for the command it will exec.
pub(crate) fn apply_env(spec: &SandboxSpec) {
    use std::os::unix::ffi::OsStrExt;
    for e in &spec.env {
        let b = e.as_bytes();
        if let Some(i) = b.iter().position(|c| *c == b'=') {
            let (k, v) = (std::ffi::OsStr::from_bytes(&b[..i]), std::ffi::OsStr::from_bytes(&b[i + 1..]));
            if !k.is_empty() {
                std::env::set_var(k, v);
            }
        }
    }
}

/// The counters of one network namespace, opened while in it (a `/proc/self/net` file shows
/// the namespace of whoever opened it, wherever it is read later).
pub(crate) struct Attempts {
    snmp: Option<OwnedFd>,
    snmp6: Option<OwnedFd>,
    /// The total at the last [`since_last`](Self::since_last) (a warm namespace serves many runs).
    last: u64,
}

impl Attempts {
    /// Open the counters of the current network namespace, just made (None for the host's
    /// network). Reading both files costs ~0.02 ms, once per run.
    pub(crate) fn open(spec: &SandboxSpec) -> Option<Attempts> {
        if spec.host_network {
            return None;
        }
        let open = |p: &str| {
            rustix::fs::open(p, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
                .ok()
        };
        // Opened right after the namespace was made: its counters start at zero.
        Some(Attempts { snmp: open("/proc/self/net/snmp"), snmp6: open("/proc/self/net/snmp6"), last: 0 })
    }

    fn total(&self) -> u64 {
        let read = |fd: &Option<OwnedFd>| -> String {
            let Some(fd) = fd else { return String::new() };
            let mut buf = vec![0u8; 16 * 1024];
            let mut len = 0;
            while len < buf.len() {
                match rustix::io::pread(fd, &mut buf[len..], len as u64) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => len += n,
                }
            }
            String::from_utf8_lossy(&buf[..len]).into_owned()
        };
        attempts_v4(&read(&self.snmp)) + attempts_v6(&read(&self.snmp6))
    }

    /// Attempts since the namespace was made or since the last call: the report line.
    pub(crate) fn since_last(&mut self) -> String {
        let now = self.total();
        let n = now.saturating_sub(self.last);
        self.last = now;
        format!("net {n}\n")
    }
}

/// A warm server's counters, opened once in its namespace (its pid 1 is forked after, and
/// serves one run at a time).
static WARM: std::sync::Mutex<Option<Attempts>> = std::sync::Mutex::new(None);

/// In a warm server, right after it entered its namespaces: keep the counters it opened there
/// (`kernel::Kernel::net_attempts`).
pub(crate) fn warm_keep(attempts: Option<Attempts>) {
    if let Ok(mut w) = WARM.lock() {
        *w = attempts;
    }
}

/// In a warm server, after a run: the attempts since the previous one, as a report line.
pub(crate) fn warm_since_last() -> Option<String> {
    WARM.lock().ok()?.as_mut().map(Attempts::since_last)
}

/// `OutNoRoutes` of `Ip:` plus `NoPorts` of `Udp:` in `/proc/net/snmp` (a header line of
/// names, then a line of values, per protocol).
pub fn attempts_v4(text: &str) -> u64 {
    let mut lines = text.lines();
    let mut total = 0;
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (Some((proto, names)), Some((_, values))) = (names.split_once(':'), values.split_once(':')) else {
            continue;
        };
        let want = match proto {
            "Ip" => "OutNoRoutes",
            "Udp" => "NoPorts",
            _ => continue,
        };
        if let Some(v) = names.split_whitespace().zip(values.split_whitespace()).find(|(n, _)| *n == want) {
            total += v.1.parse::<u64>().unwrap_or(0);
        }
    }
    total
}

/// `Ip6OutNoRoutes` plus `Udp6NoPorts` in `/proc/net/snmp6` (one `name value` per line).
pub fn attempts_v6(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .filter(|(n, _)| matches!(*n, "Ip6OutNoRoutes" | "Udp6NoPorts"))
        .map(|(_, v)| v.trim().parse::<u64>().unwrap_or(0))
        .sum()
}

/// The attempts a report carries (`net N` lines), if any.
pub fn parse_report_line(line: &str) -> Option<u64> {
    line.strip_prefix("net ").and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_both_files() {
        let snmp = "Ip: Forwarding DefaultTTL OutRequests OutNoRoutes ReasmTimeout\nIp: 2 64 0 5 0\n\
                    Icmp: InMsgs InErrors\nIcmp: 1 2\n\
                    Udp: InDatagrams NoPorts InErrors\nUdp: 0 3 0\n";
        assert_eq!(attempts_v4(snmp), 8);
        let snmp6 = "Ip6InReceives                   \t0\nIp6OutNoRoutes                  \t2\nUdp6NoPorts \t1\n";
        assert_eq!(attempts_v6(snmp6), 3);
        assert_eq!(attempts_v4(""), 0);
        assert_eq!(attempts_v4("Ip: OutNoRoutes\n"), 0);
        assert_eq!(parse_report_line("net 7\n"), Some(7));
        assert_eq!(parse_report_line("exit 7\n"), None);
    }
}
