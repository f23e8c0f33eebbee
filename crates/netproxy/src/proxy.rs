//! The proxy proper: accept the sandbox's connections, read each request head, check it, ask the
//! broker for the connection, and relay bytes both ways, recording what happened.
//!
//! Every client is the sandboxed command, so every byte is hostile. Each connection has its own
//! thread with a small stack and fixed buffers; a head must arrive within [`Limits::head`] and
//! fit [`crate::http::MAX_HEAD`]; a tunnel idle for [`Limits::idle`] is closed; beyond
//! [`Limits::connections`] at once, new ones are answered 503 and closed without being read. A
//! client can waste only its own connections, never another's.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;

use crate::allow::{Allowlist, Host, Via};
use crate::broker::{self, Code};
use crate::fd;
use crate::http::{self, Target};
use crate::report::{Connection, Report};

/// Bounds on what one client may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Connections open at once.
    pub connections: usize,
    /// How long a request head may take to arrive (slow clients).
    #[serde(with = "secs")]
    pub head: Duration,
    /// How long a tunnel may carry nothing either way.
    #[serde(with = "secs")]
    pub idle: Duration,
    /// How long the broker may take to connect.
    #[serde(with = "secs")]
    pub connect: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: 256,
            head: Duration::from_secs(30),
            idle: Duration::from_secs(600),
            connect: Duration::from_secs(90),
        }
    }
}

mod secs {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = <f64 as serde::Deserialize>::deserialize(d)?;
        Duration::try_from_secs_f64(v).map_err(serde::de::Error::custom)
    }
}

/// A connection thread's stack: enough for the relay loop and its two buffers.
const STACK: usize = 256 * 1024;
const BUFFER: usize = 32 * 1024;

/// What every connection thread shares.
pub struct Shared {
    pub allow: Allowlist,
    pub broker: broker::Client,
    pub limits: Limits,
    report: Mutex<Report>,
    active: AtomicUsize,
    /// Connections being relayed, by a number of their own.
    live: Mutex<HashMap<u64, Arc<Live>>>,
    next: AtomicU64,
}

/// A connection being relayed: its record, with the byte counts the relay keeps up to date, so
/// a report taken while it still runs (the server has not closed yet) is right.
struct Live {
    record: Connection,
    started: Instant,
    up: AtomicU64,
    down: AtomicU64,
}

impl Live {
    fn now(&self) -> Connection {
        let mut c = self.record.clone();
        c.bytes_up = self.up.load(Ordering::Relaxed);
        c.bytes_down = self.down.load(Ordering::Relaxed);
        c.duration_ms = self.started.elapsed().as_millis() as u64;
        c
    }
}

impl Shared {
    pub fn new(allow: Allowlist, broker: broker::Client, limits: Limits) -> Arc<Shared> {
        Arc::new(Shared {
            allow,
            broker,
            limits,
            report: Mutex::new(Report::default()),
            active: AtomicUsize::new(0),
            live: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        })
    }

    fn begin(&self, record: Connection, started: Instant) -> (u64, Arc<Live>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let live = Arc::new(Live { record, started, up: AtomicU64::new(0), down: AtomicU64::new(0) });
        if let Ok(mut l) = self.live.lock() {
            l.insert(id, Arc::clone(&live));
        }
        (id, live)
    }

    /// Move a finished connection from the live ones to the report. Both locks are held (live,
    /// then report: the order [`report`](Self::report) takes them in), so a report taken
    /// meanwhile sees the connection exactly once.
    fn end(&self, id: u64) {
        if let Ok(mut l) = self.live.lock() {
            if let Some(live) = l.remove(&id) {
                self.record(live.now());
            }
        }
    }

    fn record(&self, c: Connection) {
        if let Ok(mut r) = self.report.lock() {
            r.add(c);
        }
    }

    /// The report so far (taken when the proxy stops), connections still relayed included.
    pub fn report(&self) -> Report {
        let live = self.live.lock();
        let mut r = self.report.lock().map(|r| r.clone()).unwrap_or_default();
        if let Ok(live) = live {
            let mut open: Vec<(u64, Connection)> = live.iter().map(|(id, l)| (*id, l.now())).collect();
            open.sort_by_key(|(id, _)| *id);
            open.into_iter().for_each(|(_, c)| r.add(c));
        }
        r
    }
}

/// Accept connections on `listener` until `stop` becomes readable (its writer closed it), then
/// wait briefly for connections still finishing and return the report.
pub fn serve(listener: &OwnedFd, stop: BorrowedFd<'_>, shared: &Arc<Shared>) -> Report {
    loop {
        let mut fds = [PollFd::new(listener, PollFlags::IN), PollFd::new(&stop, PollFlags::IN)];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(_) => break,
        }
        if !fds[1].revents().is_empty() {
            break;
        }
        if fds[0].revents().is_empty() {
            continue;
        }
        let Ok(conn) = rustix::net::accept_with(listener, rustix::net::SocketFlags::CLOEXEC) else { continue };
        if shared.active.fetch_add(1, Ordering::SeqCst) >= shared.limits.connections {
            shared.active.fetch_sub(1, Ordering::SeqCst);
            refuse_busy(&conn, shared);
            continue;
        }
        let s = Arc::clone(shared);
        let spawned = std::thread::Builder::new().stack_size(STACK).spawn(move || {
            handle(conn, &s);
            s.active.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            shared.active.fetch_sub(1, Ordering::SeqCst);
        }
    }
    // The sandbox is gone by now, so its ends of every connection are closed. Relays that see
    // it finish at once; one whose server has not closed yet is reported as it stands rather
    // than waited for (the run would wait on a remote server otherwise).
    let deadline = Instant::now() + Duration::from_millis(20);
    while shared.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    shared.report()
}

fn refuse_busy(conn: &OwnedFd, shared: &Shared) {
    let _ = rustix::io::ioctl_fionbio(conn, true);
    let (status, reason) = Code::Busy.status();
    let text = format!("txbox: more than {} connections at once", shared.limits.connections);
    let _ = rustix::io::write(conn, &http::response(status, reason, &text));
    shared.record(refused("", 0, Via::Tunnel, Code::Busy.as_str(), text, Instant::now()));
}

/// Answer a refused client and close the connection gently: shut our side, then read and
/// discard what it still sends (briefly, boundedly), so that closing with unread bytes does not
/// reset the connection and lose the answer before the client reads it.
fn answer_and_close(conn: &OwnedFd, response: &[u8]) {
    let _ = fd::write_all(conn, response);
    let _ = rustix::net::shutdown(conn, rustix::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut sink = [0u8; 4096];
    let mut left = 256 * 1024usize;
    while left > 0 && matches!(fd::wait_readable(conn.as_fd(), Some(deadline)), Ok(true)) {
        match rustix::io::read(conn, &mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

fn refused(host: &str, port: u16, via: Via, code: &str, reason: String, started: Instant) -> Connection {
    Connection {
        host: host.to_string(),
        port,
        via,
        allowed: false,
        code: Some(code.to_string()),
        reason: Some(reason),
        address: None,
        upstream: false,
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: started.elapsed().as_millis() as u64,
    }
}

/// How to allow a host again, as the refusal says it.
fn allow_hint(host: &Host, port: u16, via: Via) -> String {
    if port == via.default_port() {
        host.to_string()
    } else {
        format!("{host}:{port}")
    }
}

/// One client connection, start to end.
fn handle(conn: OwnedFd, shared: &Shared) {
    let started = Instant::now();
    let (head, rest) = match read_head(&conn, started + shared.limits.head) {
        Ok(Some(h)) => h,
        // Gone before saying anything: nothing to record.
        Ok(None) => return,
        Err(why) => {
            let (status, reason, code, text) = match why {
                HeadWait::TooLarge => {
                    (431, "Request Header Fields Too Large", "too-large", http::HeadError::TooLarge.to_string())
                }
                HeadWait::Slow => {
                    (408, "Request Timeout", "slow", "the request head did not arrive in time".to_string())
                }
            };
            shared.record(refused("", 0, Via::Tunnel, code, text.clone(), started));
            answer_and_close(&conn, &http::response(status, reason, &format!("txbox: {text}")));
            return;
        }
    };
    let req = match http::parse(&head) {
        Ok(r) => r,
        Err(e) => {
            let (status, reason) = e.status();
            let code = if e == http::HeadError::TooLarge { "too-large" } else { Code::Bad.as_str() };
            shared.record(refused("", 0, Via::Tunnel, code, e.to_string(), started));
            answer_and_close(&conn, &http::response(status, reason, &format!("txbox: {e}")));
            return;
        }
    };
    let (host, port, via) = (req.host().clone(), req.port(), req.via());
    let host_text = host.to_string();
    if !shared.allow.allows(&host, port, via) {
        let text = format!(
            "{host_text}:{port} is not in this command's allowlist; allow it with --allow-host {}",
            allow_hint(&host, port, via)
        );
        shared.record(refused(&host_text, port, via, Code::NotAllowed.as_str(), text.clone(), started));
        answer_and_close(&conn, &http::response(403, "Forbidden", &format!("txbox: {text}")));
        return;
    }
    let server = match shared.broker.connect(&host, port, via, shared.limits.connect) {
        Ok(s) => s,
        Err(r) => {
            let (status, reason) = r.code.status();
            let response = http::response(status, reason, &format!("txbox: {}", r.text));
            shared.record(refused(&host_text, port, via, r.code.as_str(), r.text, started));
            answer_and_close(&conn, &response);
            return;
        }
    };
    let opening = match &req.target {
        Target::Connect { .. } => {
            if fd::write_all(&conn, http::ESTABLISHED).is_err() {
                return;
            }
            rest
        }
        Target::Absolute { .. } => {
            let mut first = req.forwarded_head(server.upstream, server.auth.as_deref());
            first.extend_from_slice(&rest);
            first
        }
    };
    let record = Connection {
        host: host_text,
        port,
        via,
        allowed: true,
        code: None,
        reason: None,
        address: Some(server.address.clone()),
        upstream: server.upstream,
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
    };
    let (id, live) = shared.begin(record, started);
    relay(&conn, &server.stream, &opening, shared.limits.idle, &live);
    shared.end(id);
}

enum HeadWait {
    TooLarge,
    Slow,
}

/// A request head and the bytes that came after it.
type Head = (Vec<u8>, Vec<u8>);

/// Read until the end of the request head. None: closed first.
fn read_head(conn: &OwnedFd, deadline: Instant) -> Result<Option<Head>, HeadWait> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        match fd::wait_readable(conn.as_fd(), Some(deadline)) {
            Ok(true) => {}
            Ok(false) => return Err(HeadWait::Slow),
            Err(_) => return Ok(None),
        }
        let n = match rustix::io::read(conn, &mut chunk) {
            Ok(0) => return Ok(None),
            Ok(n) => {
                ack_now(conn.as_fd());
                n
            }
            Err(Errno::INTR | Errno::AGAIN) => continue,
            Err(_) => return Ok(None),
        };
        // Only the new bytes (and the three before them) can complete the blank line.
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = http::head_end(&buf[from..]).map(|e| e + from) {
            let rest = buf.split_off(end);
            return Ok(Some((buf, rest)));
        }
        if buf.len() > http::MAX_HEAD {
            return Err(HeadWait::TooLarge);
        }
    }
}

/// Acknowledge at once what was just read from the client (`TCP_QUICKACK`; the kernel clears
/// it again by itself, so it is set after every read).
///
/// The proxy is a TCP hop the command would not have without it, and its end must not hold
/// back the command's bytes. A client that leaves Nagle's algorithm on (urllib3, and so pip and
/// requests, turns `TCP_NODELAY` off precisely when it goes through a proxy) sends a small
/// segment only once the previous one is acknowledged; the proxy's socket, which has just
/// sent something the other way (the `200` of a CONNECT, the server's handshake), counts the
/// connection as interactive and delays its acknowledgement for the reply it expects to carry
/// it, up to 40 ms; but the reply can only come once the held segment has reached the server.
/// pip's TLS `Finished` and its first request on each connection met exactly that: 40 ms per
/// connection (docs/BENCHMARKS.md, #15). Failing to set it costs only that delay.
fn ack_now(fd: BorrowedFd<'_>) {
    let _ = rustix::net::sockopt::set_tcp_quickack(fd, true);
}

/// One direction of a relay: bytes read but not yet written.
struct Pipe {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The source reached its end (or failed); once drained, the sink's write side is shut.
    eof: bool,
    shut: bool,
    moved: u64,
    /// The source is the client: acknowledge each read at once ([`ack_now`]).
    ack: bool,
}

impl Pipe {
    fn new(opening: &[u8], ack: bool) -> Pipe {
        let mut buf = vec![0u8; BUFFER.max(opening.len())].into_boxed_slice();
        buf[..opening.len()].copy_from_slice(opening);
        Pipe { buf, start: 0, end: opening.len(), eof: false, shut: false, moved: 0, ack }
    }

    fn pending(&self) -> bool {
        self.start < self.end
    }

    fn done(&self) -> bool {
        self.shut
    }

    /// Move what can be moved without blocking; false if the relay should stop (an error).
    fn pump(&mut self, from: BorrowedFd<'_>, to: BorrowedFd<'_>, readable: bool) -> bool {
        // Write, read, write again: what was just read leaves at once, without waiting for
        // another round of poll (the sockets are non-blocking; a full one says EAGAIN).
        if !self.flush(to) {
            return false;
        }
        if readable && !self.eof && self.end < self.buf.len() {
            match rustix::io::read(from, &mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.end += n;
                    if self.ack {
                        ack_now(from);
                    }
                }
                Err(Errno::AGAIN | Errno::INTR) => {}
                Err(_) => self.eof = true,
            }
        }
        if !self.flush(to) {
            return false;
        }
        if self.eof && !self.pending() && !self.shut {
            let _ = rustix::net::shutdown(to, rustix::net::Shutdown::Write);
            self.shut = true;
        }
        true
    }

    /// Write what is pending, as far as the sink takes it; false on an error.
    fn flush(&mut self, to: BorrowedFd<'_>) -> bool {
        while self.pending() {
            match rustix::io::write(to, &self.buf[self.start..self.end]) {
                Ok(n) => {
                    self.start += n;
                    self.moved += n as u64;
                }
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => {}
                Err(_) => return false,
            }
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        true
    }
}

/// Carry bytes both ways until both directions end, one fails, or nothing moves for `idle`.
/// `opening` goes to the server first (the forwarded head, or what a tunnel's client sent
/// right after its CONNECT). Keeps `live`'s counts of the bytes carried up (to the server) and
/// down.
fn relay(client: &OwnedFd, server: &OwnedFd, opening: &[u8], idle: Duration, live: &Live) {
    // No Nagle here: the proxy passes on each segment as its sender cut it; delaying a small
    // one until the previous is acknowledged (and the peer delays its ACK) costs tens of
    // milliseconds per exchange. The same for a client that keeps Nagle on: what it sends is
    // acknowledged at once (`up` acks each read, see `ack_now`).
    for fd in [client, server] {
        let _ = rustix::io::ioctl_fionbio(fd, true);
        let _ = rustix::net::sockopt::set_tcp_nodelay(fd, true);
    }
    let mut up = Pipe::new(opening, true);
    let mut down = Pipe::new(&[], false);
    let mut last = Instant::now();
    while !(up.done() && down.done()) {
        let want = |p: &Pipe| if !p.eof && p.end < p.buf.len() { PollFlags::IN } else { PollFlags::empty() };
        let out = |p: &Pipe| if p.pending() { PollFlags::OUT } else { PollFlags::empty() };
        let mut fds = [PollFd::new(client, want(&up) | out(&down)), PollFd::new(server, want(&down) | out(&up))];
        let left = idle.saturating_sub(last.elapsed());
        if left.is_zero() {
            break;
        }
        match rustix::event::poll(&mut fds, Some(&fd::timespec(left))) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(_) => break,
        }
        let (c, s) = (fds[0].revents(), fds[1].revents());
        let hup = PollFlags::HUP | PollFlags::ERR;
        let before = (up.moved, down.moved, up.end, down.end);
        let ok = up.pump(client.as_fd(), server.as_fd(), c.intersects(PollFlags::IN | hup))
            && down.pump(server.as_fd(), client.as_fd(), s.intersects(PollFlags::IN | hup));
        if !ok {
            break;
        }
        // A peer that hung up entirely can take no more bytes either.
        if c.contains(PollFlags::ERR) || s.contains(PollFlags::ERR) {
            break;
        }
        if before != (up.moved, down.moved, up.end, down.end) {
            last = Instant::now();
            live.up.store(up.moved, Ordering::Relaxed);
            live.down.store(down.moved, Ordering::Relaxed);
        }
    }
    live.up.store(up.moved, Ordering::Relaxed);
    live.down.store(down.moved, Ordering::Relaxed);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::allow::Rule;
    use crate::broker::Rules;
    use crate::upstream::Upstream;
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// A proxy on loopback in this process (unconfined), its broker on a thread, and a stop pipe.
    struct Harness {
        port: u16,
        stop: Option<OwnedFd>,
        thread: Option<std::thread::JoinHandle<Report>>,
    }

    impl Harness {
        fn new(items: &[String], limits: Limits) -> Harness {
            let allow = Allowlist::new(items.iter().map(|s| Rule::parse(s).unwrap()));
            let (ours, theirs) =
                rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                    .unwrap();
            let rules = Rules { allow: allow.clone(), upstream: Upstream::default() };
            std::thread::spawn(move || broker::serve(theirs, rules));
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let listener = OwnedFd::from(listener);
            let (stop_r, stop_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
            let shared = Shared::new(allow, broker::Client::new(ours), limits);
            let thread = std::thread::spawn(move || serve(&listener, stop_r.as_fd(), &shared));
            Harness { port, stop: Some(stop_w), thread: Some(thread) }
        }

        fn client(&self) -> TcpStream {
            let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s
        }

        fn finish(mut self) -> Report {
            drop(self.stop.take());
            self.thread.take().unwrap().join().unwrap()
        }
    }

    /// An origin server on loopback answering every request with `body` and closing.
    fn origin(body: &'static str) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let mut got = Vec::new();
                    while http::head_end(&got).is_none() {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&got).into_owned();
                    let text = format!("{body} {}", head.lines().next().unwrap_or(""));
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                        text.len()
                    );
                });
            }
        });
        port
    }

    fn exchange(s: &mut TcpStream, request: &str) -> String {
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn plain_http_and_tunnels_reach_listed_hosts_and_are_recorded() {
        let port = origin("hello");
        let h = Harness::new(&[format!("127.0.0.1:{port}")], Limits::default());
        let got = exchange(
            &mut h.client(),
            &format!("GET http://127.0.0.1:{port}/x?y HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        );
        assert!(got.ends_with("hello GET /x?y HTTP/1.1"), "{got}");
        let mut t = h.client();
        let got =
            exchange(&mut t, &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET /t HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(got.starts_with("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK"), "{got}");
        assert!(got.ends_with("hello GET /t HTTP/1.1"), "{got}");
        drop(t);
        let r = h.finish();
        assert_eq!(r.connections.len(), 2, "{r:?}");
        assert!(r.connections.iter().all(|c| c.allowed && c.bytes_up > 0 && c.bytes_down > 0), "{r:?}");
        assert!(r.connections.iter().any(|c| c.via == Via::Tunnel));
    }

    #[test]
    fn refusals_say_why_and_are_recorded() {
        let (port, other) = (origin("hello"), origin("other"));
        let h = Harness::new(&[format!("127.0.0.1:{port}"), format!("localhost:{other}")], Limits::default());
        let cases = [
            ("CONNECT evil.example:443 HTTP/1.1\r\n\r\n".to_string(), "403", "--allow-host evil.example"),
            (format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", port + 1), "403", "not in this command's allowlist"),
            ("GET http://169.254.169.254/ HTTP/1.1\r\n\r\n".to_string(), "403", "--allow-host 169.254.169.254"),
            (format!("GET http://localhost:{other}/ HTTP/1.1\r\n\r\n"), "403", "not a public address"),
            ("GET /x HTTP/1.1\r\nHost: a\r\n\r\n".to_string(), "400", "absolute"),
            ("\u{16}\u{3}\u{1}garbage\r\n\r\n".to_string(), "400", "malformed"),
        ];
        for (request, status, says) in &cases {
            let got = exchange(&mut h.client(), request);
            assert!(got.starts_with(&format!("HTTP/1.1 {status} ")), "{request:?} → {got}");
            assert!(got.contains(says), "{request:?} → {got}");
        }
        let r = h.finish();
        assert_eq!(r.connections.len(), cases.len());
        assert!(r.connections.iter().all(|c| !c.allowed && c.reason.is_some()));
        assert!(r.hosts_with(&["not-allowed"]).contains(&"evil.example:443".to_string()), "{r:?}");
        assert!(r.hosts_with(&["non-public"]).contains(&format!("localhost:{other}")), "{r:?}");
    }

    #[test]
    fn hostile_clients_do_not_hold_up_others() {
        let port = origin("fine");
        let limits = Limits { connections: 8, ..Limits::default() };
        let h = Harness::new(&[format!("127.0.0.1:{port}")], limits);
        // A head that never ends, one that is too large, and a slow one that stays open.
        let mut huge = h.client();
        let _ = huge.write_all(format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n").as_bytes());
        let big = format!("X: {}\r\n", "y".repeat(1000)).repeat(40);
        let _ = huge.write_all(big.as_bytes());
        let mut answer = String::new();
        let _ = huge.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        let mut slow = h.client();
        slow.write_all(b"GET http://127.0.0.1").unwrap();
        let mut garbage = h.client();
        garbage.write_all(&[0u8; 100]).unwrap();
        // Others are served meanwhile.
        for _ in 0..3 {
            let got = exchange(&mut h.client(), &format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"));
            assert!(got.contains("fine GET / HTTP/1.1"), "{got}");
        }
        // Past the limit of open connections, new ones are told so at once.
        let hold: Vec<TcpStream> = (0..8).map(|_| h.client()).collect();
        let mut late = h.client();
        let mut answer = String::new();
        let _ = late.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        drop(hold);
        drop((slow, garbage));
        let r = h.finish();
        assert!(r.connections.iter().filter(|c| c.allowed).count() >= 3, "{r:?}");
    }

    #[test]
    fn a_connection_whose_server_stays_open_is_reported_as_it_stands() {
        // A server that answers and then keeps the connection open.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel::<TcpStream>();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
                let _ = tx.send(s);
            }
        });
        let h = Harness::new(&[format!("127.0.0.1:{port}")], Limits::default());
        let mut c = h.client();
        c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n").as_bytes()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while !got.ends_with(b"hello") {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "{}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        drop(c);
        let r = h.finish();
        let held = rx.recv().unwrap();
        assert_eq!(r.connections.len(), 1, "{r:?}");
        assert!(r.connections[0].allowed && r.connections[0].bytes_down >= 40, "{r:?}");
        drop(held);
    }

    #[test]
    fn slow_heads_time_out() {
        let h =
            Harness::new(&["a.example".to_string()], Limits { head: Duration::from_millis(200), ..Limits::default() });
        let mut s = h.client();
        s.write_all(b"CONNECT a.exa").unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
        h.finish();
    }
}
