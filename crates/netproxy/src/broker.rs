//! The broker: the only part of the proxy that resolves names and opens connections. It runs
//! unconfined (name resolution reads `/etc/resolv.conf`, `/etc/hosts`, `/etc/nsswitch.conf`),
//! parses nothing the sandbox wrote beyond one short line, and checks every request against the
//! allowlist itself: a proxy taken over by a hostile client can ask it for nothing the command
//! was not allowed anyway.
//!
//! ```text
//! proxy → broker   one SOCK_SEQPACKET message per connection: "connect VIA PORT HOST", with a
//!                  fresh SOCK_SEQPACKET socket attached on which the answer comes back
//! broker → proxy   on that socket: "ok direct|upstream ADDRESS [AUTH]" with the connected socket
//!                  attached, or "refused CODE TEXT"
//! ```
//!
//! With an upstream proxy, a tunnel's `CONNECT` to it is made here and the socket handed over
//! ready to carry the client's bytes; a plain HTTP request is sent by the proxy, in absolute form
//! with `AUTH` as its `Proxy-Authorization`.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketFlags, SocketType};

use crate::addr::is_public;
use crate::allow::{Allowlist, Host, Via};
use crate::fd;
use crate::http;
use crate::upstream::{ProxyUrl, Upstream};

/// The longest message either side sends.
const MAX_MESSAGE: usize = 1024;
/// Requests served at once; more are refused (`busy`). The proxy admits no more connections.
const MAX_PENDING: usize = 256;
/// How long one address may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the caller's proxy may take to answer a CONNECT.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a connection was not made: a code for programs, a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Not in the allowlist.
    NotAllowed,
    /// An allowed name resolving only to addresses that are not public and not listed.
    NonPublic,
    Resolve,
    Connect,
    Timeout,
    /// The caller's proxy refused, failed, or speaks a scheme this proxy cannot chain.
    Upstream,
    Busy,
    Bad,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::NotAllowed => "not-allowed",
            Code::NonPublic => "non-public",
            Code::Resolve => "resolve",
            Code::Connect => "connect",
            Code::Timeout => "timeout",
            Code::Upstream => "upstream",
            Code::Busy => "busy",
            Code::Bad => "bad-request",
        }
    }

    fn parse(s: &str) -> Code {
        [Code::NotAllowed, Code::NonPublic, Code::Resolve, Code::Connect, Code::Timeout, Code::Upstream, Code::Busy]
            .into_iter()
            .find(|c| c.as_str() == s)
            .unwrap_or(Code::Bad)
    }

    /// The status a client of the proxy gets for it.
    pub fn status(self) -> (u16, &'static str) {
        match self {
            Code::NotAllowed | Code::NonPublic => (403, "Forbidden"),
            Code::Resolve | Code::Connect | Code::Upstream => (502, "Bad Gateway"),
            Code::Timeout => (504, "Gateway Timeout"),
            Code::Busy => (503, "Service Unavailable"),
            Code::Bad => (400, "Bad Request"),
        }
    }
}

fn refusal(code: Code, text: impl Into<String>) -> Refusal {
    Refusal { code, text: text.into() }
}

/// What the broker enforces.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub allow: Allowlist,
    pub upstream: Upstream,
}

/// How to reach a host that passed the allowlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    Direct,
    Upstream(&'a ProxyUrl),
}

/// The allowlist, then the route: pure.
pub fn route<'a>(rules: &'a Rules, host: &Host, port: u16, via: Via) -> Result<Route<'a>, Refusal> {
    if !rules.allow.allows(host, port, via) {
        return Err(refusal(Code::NotAllowed, format!("{}:{port} is not in this command's allowlist", show(host))));
    }
    match rules.upstream.route(host, via) {
        Some(p) => match &p.unsupported {
            Some(why) => Err(refusal(Code::Upstream, format!("{why} cannot carry this connection"))),
            None => Ok(Route::Upstream(p)),
        },
        None => Ok(Route::Direct),
    }
}

fn show(host: &Host) -> String {
    host.to_string()
}

/// The addresses a direct connection may use: public ones, and the others only if the
/// address itself is listed (an address named literally passed the allowlist as such). Pure.
pub fn usable(
    allow: &Allowlist,
    host: &Host,
    port: u16,
    via: Via,
    resolved: &[IpAddr],
) -> Result<Vec<IpAddr>, Refusal> {
    if let Host::Ip(ip) = host {
        return Ok(vec![*ip]);
    }
    let keep: Vec<IpAddr> =
        resolved.iter().copied().filter(|ip| is_public(*ip) || allow.lists_address(*ip, port, via)).collect();
    if keep.is_empty() {
        let shown: Vec<String> = resolved.iter().take(4).map(|ip| ip.to_canonical().to_string()).collect();
        let first = resolved.first().map(|ip| Host::Ip(ip.to_canonical()).to_string()).unwrap_or_default();
        return Err(refusal(
            Code::NonPublic,
            format!(
                "{} resolves to {} (not a public address); list the address itself to allow it (--allow-host {first}:{port})",
                show(host),
                shown.join(", ")
            ),
        ));
    }
    Ok(keep)
}

/// A request line as the proxy sends it.
pub fn request_line(host: &Host, port: u16, via: Via) -> String {
    format!("connect {} {port} {host}", via.as_str())
}

/// Parse a request line; the host is parsed (and so validated) again here.
pub fn parse_request(line: &str) -> Result<(Host, u16, Via), Refusal> {
    let bad = || refusal(Code::Bad, "malformed broker request");
    let mut parts = line.split(' ');
    let (Some("connect"), Some(via), Some(port), Some(host), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let via = match via {
        "tunnel" => Via::Tunnel,
        "http" => Via::Http,
        _ => return Err(bad()),
    };
    let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?;
    let host = Host::parse(host).map_err(|_| bad())?;
    Ok((host, port, via))
}

/// A connection made for the proxy.
#[derive(Debug)]
pub struct Connected {
    pub stream: OwnedFd,
    pub address: String,
    /// Through the caller's proxy.
    pub upstream: bool,
    /// For a plain HTTP request through the caller's proxy: its `Proxy-Authorization`.
    pub auth: Option<String>,
}

/// Resolve and connect, or say why not.
fn make(rules: &Rules, host: &Host, port: u16, via: Via) -> Result<Connected, Refusal> {
    match route(rules, host, port, via)? {
        Route::Upstream(p) => {
            let (stream, address) = dial(&p.host, p.port, |all| Ok(all.to_vec())).map_err(|r| {
                refusal(Code::Upstream, format!("the caller's proxy {}:{}: {}", p.host, p.port, r.text))
            })?;
            match via {
                Via::Tunnel => {
                    upstream_connect(&stream, host, port, p.auth.as_deref())?;
                    Ok(Connected { stream: stream.into(), address, upstream: true, auth: None })
                }
                Via::Http => Ok(Connected { stream: stream.into(), address, upstream: true, auth: p.auth.clone() }),
            }
        }
        Route::Direct => {
            let name = match host {
                Host::Name(n) => n.clone(),
                Host::Ip(ip) => ip.to_string(),
            };
            let (stream, address) = dial(&name, port, |resolved| usable(&rules.allow, host, port, via, resolved))?;
            Ok(Connected { stream: stream.into(), address, upstream: false, auth: None })
        }
    }
}

/// Resolve `name`, keep what `filter` allows, and connect to the first address that answers.
fn dial(
    name: &str,
    port: u16,
    filter: impl FnOnce(&[IpAddr]) -> Result<Vec<IpAddr>, Refusal>,
) -> Result<(TcpStream, String), Refusal> {
    let resolved: Vec<IpAddr> = match name.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => (name, port)
            .to_socket_addrs()
            .map_err(|e| refusal(Code::Resolve, format!("could not resolve {name}: {e}")))?
            .map(|a| a.ip())
            .collect(),
    };
    let mut unique: Vec<IpAddr> = Vec::new();
    for ip in resolved {
        if !unique.contains(&ip) {
            unique.push(ip);
        }
    }
    let addrs = filter(&unique)?;
    let mut last = refusal(Code::Resolve, format!("{name} has no address"));
    for ip in addrs {
        let sa = SocketAddr::new(ip, port);
        match TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT) {
            Ok(s) => return Ok((s, sa.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                last = refusal(Code::Timeout, format!("{sa} did not answer within {}s", CONNECT_TIMEOUT.as_secs()))
            }
            Err(e) => last = refusal(Code::Connect, format!("connecting to {sa}: {e}")),
        }
    }
    Err(last)
}

/// `CONNECT host:port` to the caller's proxy; Ok when it answers 2xx. Reads exactly the
/// response head, so nothing of the tunnel's first bytes is lost.
fn upstream_connect(stream: &TcpStream, host: &Host, port: u16, auth: Option<&str>) -> Result<(), Refusal> {
    let fail = |why: String| refusal(Code::Upstream, format!("the caller's proxy: {why}"));
    let mut head = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n");
    if let Some(a) = auth {
        head.push_str(&format!("Proxy-Authorization: {a}\r\n"));
    }
    head.push_str("\r\n");
    let mut s = stream;
    s.write_all(head.as_bytes()).map_err(|e| fail(e.to_string()))?;
    let _ = stream.set_read_timeout(Some(UPSTREAM_TIMEOUT));
    let mut buf = vec![0u8; 16 * 1024];
    let deadline = Instant::now() + UPSTREAM_TIMEOUT;
    let end = loop {
        let n = stream.peek(&mut buf).map_err(|e| fail(e.to_string()))?;
        if n == 0 {
            return Err(fail("closed the connection".into()));
        }
        if let Some(end) = http::head_end(&buf[..n]) {
            break end;
        }
        if n == buf.len() || Instant::now() >= deadline {
            return Err(fail("no complete answer".into()));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut head = vec![0u8; end];
    s.read_exact(&mut head).map_err(|e| fail(e.to_string()))?;
    let _ = stream.set_read_timeout(None);
    match http::status_of(&head) {
        Some(code) if (200..300).contains(&code) => Ok(()),
        Some(code) => Err(fail(format!("answered {code} to CONNECT {host}:{port}"))),
        None => Err(fail("answered something that is not HTTP".into())),
    }
}

/// Serve the proxy's requests on `channel` until it closes (the proxy exited).
pub fn serve(channel: OwnedFd, rules: Rules) {
    let rules = Arc::new(rules);
    let pending = Arc::new(AtomicUsize::new(0));
    let mut buf = [0u8; MAX_MESSAGE];
    loop {
        let (n, reply) = match fd::recv(channel.as_fd(), &mut buf) {
            Ok((0, _)) | Err(_) => return,
            Ok(r) => r,
        };
        let Some(reply) = reply else { continue };
        let line = String::from_utf8_lossy(&buf[..n]).into_owned();
        if pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING {
            pending.fetch_sub(1, Ordering::SeqCst);
            answer(reply.as_fd(), Err(refusal(Code::Busy, "too many connections at once")));
            continue;
        }
        let (rules, done) = (Arc::clone(&rules), Arc::clone(&pending));
        let spawned = std::thread::Builder::new().stack_size(256 * 1024).spawn(move || {
            let made = parse_request(&line).and_then(|(host, port, via)| make(&rules, &host, port, via));
            answer(reply.as_fd(), made);
            done.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn answer(reply: BorrowedFd<'_>, made: Result<Connected, Refusal>) {
    let _ = match made {
        Ok(c) => {
            let mode = if c.upstream { "upstream" } else { "direct" };
            let mut line = format!("ok {mode} {}", c.address);
            if let Some(a) = &c.auth {
                line.push(' ');
                line.push_str(a);
            }
            fd::send(reply, line.as_bytes(), Some(c.stream.as_fd()))
        }
        Err(r) => fd::send(reply, format!("refused {} {}", r.code.as_str(), r.text).as_bytes(), None),
    };
}

/// The proxy's side of the broker.
pub struct Client {
    channel: OwnedFd,
}

impl Client {
    pub fn new(channel: OwnedFd) -> Client {
        Client { channel }
    }

    /// Ask for a connection to `host:port`; wait at most `timeout` for the answer.
    pub fn connect(&self, host: &Host, port: u16, via: Via, timeout: Duration) -> Result<Connected, Refusal> {
        let broken = |e: rustix::io::Errno| refusal(Code::Connect, format!("the proxy's broker: {e}"));
        let (ours, theirs) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                .map_err(broken)?;
        fd::send(self.channel.as_fd(), request_line(host, port, via).as_bytes(), Some(theirs.as_fd()))
            .map_err(broken)?;
        drop(theirs);
        if !fd::wait_readable(ours.as_fd(), Some(Instant::now() + timeout)).map_err(broken)? {
            return Err(refusal(
                Code::Timeout,
                format!("no connection to {host}:{port} within {}s", timeout.as_secs()),
            ));
        }
        let mut buf = [0u8; MAX_MESSAGE];
        let (n, stream) = fd::recv(ours.as_fd(), &mut buf).map_err(broken)?;
        parse_answer(&String::from_utf8_lossy(&buf[..n]), stream)
    }
}

/// Parse the broker's answer (with the socket that came with it).
pub fn parse_answer(line: &str, stream: Option<OwnedFd>) -> Result<Connected, Refusal> {
    if let Some(rest) = line.strip_prefix("ok ") {
        let mut parts = rest.splitn(3, ' ');
        let (Some(mode), Some(address)) = (parts.next(), parts.next()) else {
            return Err(refusal(Code::Connect, "the broker's answer is malformed"));
        };
        let stream = stream.ok_or_else(|| refusal(Code::Connect, "the broker answered without a connection"))?;
        return Ok(Connected {
            stream,
            address: address.to_string(),
            upstream: mode == "upstream",
            auth: parts.next().map(str::to_string),
        });
    }
    if let Some(rest) = line.strip_prefix("refused ") {
        let (code, text) = rest.split_once(' ').unwrap_or((rest, ""));
        return Err(refusal(Code::parse(code), text));
    }
    Err(refusal(Code::Connect, "the broker closed without answering"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::allow::Rule;

    fn rules(items: &[&str]) -> Rules {
        Rules { allow: Allowlist::new(items.iter().map(|s| Rule::parse(s).unwrap())), upstream: Upstream::default() }
    }

    fn name(s: &str) -> Host {
        Host::Name(s.into())
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn the_broker_checks_the_allowlist_itself() {
        let r = rules(&["reg.example", "*.cdn.example:8443"]);
        assert_eq!(route(&r, &name("reg.example"), 443, Via::Tunnel), Ok(Route::Direct));
        assert_eq!(route(&r, &name("a.cdn.example"), 8443, Via::Http), Ok(Route::Direct));
        for (h, p) in [("reg.example", 22), ("evil.example", 443), ("cdn.example", 8443)] {
            assert_eq!(route(&r, &name(h), p, Via::Tunnel).unwrap_err().code, Code::NotAllowed, "{h}:{p}");
        }
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(route(&r, &Host::Ip(ip), 443, Via::Tunnel).unwrap_err().code, Code::NotAllowed);
    }

    #[test]
    fn names_resolving_to_non_public_addresses_need_the_address_listed() {
        let r = rules(&["reg.example", "metadata.example", "127.0.0.1:443"]);
        let allow = &r.allow;
        // A public answer is used; non-public ones next to it are dropped.
        assert_eq!(
            usable(allow, &name("reg.example"), 443, Via::Tunnel, &ips(&["10.0.0.1", "8.8.8.8"])).unwrap(),
            ips(&["8.8.8.8"])
        );
        let e = usable(allow, &name("metadata.example"), 443, Via::Tunnel, &ips(&["169.254.169.254"])).unwrap_err();
        assert_eq!(e.code, Code::NonPublic);
        assert!(
            e.text.contains("169.254.169.254") && e.text.contains("--allow-host 169.254.169.254:443"),
            "{}",
            e.text
        );
        // The listed address is allowed for the port it is listed for, not for others.
        assert_eq!(
            usable(allow, &name("reg.example"), 443, Via::Tunnel, &ips(&["127.0.0.1"])).unwrap(),
            ips(&["127.0.0.1"])
        );
        assert!(usable(allow, &name("reg.example"), 80, Via::Http, &ips(&["127.0.0.1"])).is_err());
        assert!(usable(allow, &name("reg.example"), 443, Via::Tunnel, &ips(&["::ffff:127.0.0.1"])).is_ok());
        assert!(usable(allow, &name("reg.example"), 443, Via::Tunnel, &ips(&["::1"])).is_err());
        assert!(usable(allow, &name("reg.example"), 443, Via::Tunnel, &[]).is_err());
    }

    #[test]
    fn an_unsupported_upstream_is_refused_not_bypassed() {
        let mut r = rules(&["reg.example"]);
        r.upstream.tunnel = ProxyUrl::parse("socks5://proxy.example:1080");
        let e = route(&r, &name("reg.example"), 443, Via::Tunnel).unwrap_err();
        assert_eq!(e.code, Code::Upstream);
        r.upstream.no_proxy = vec!["reg.example".into()];
        assert_eq!(route(&r, &name("reg.example"), 443, Via::Tunnel), Ok(Route::Direct));
    }

    #[test]
    fn request_and_answer_lines_round_trip() {
        let line = request_line(&name("reg.example"), 8443, Via::Http);
        assert_eq!(parse_request(&line).unwrap(), (name("reg.example"), 8443, Via::Http));
        let v6 = Host::Ip("2001:db8::1".parse().unwrap());
        assert_eq!(parse_request(&request_line(&v6, 443, Via::Tunnel)).unwrap().0, v6);
        for bad in
            ["", "connect", "connect tunnel 0 a.example", "connect udp 53 a.example", "connect tunnel 443 a b", "x"]
        {
            assert_eq!(parse_request(bad).unwrap_err().code, Code::Bad, "{bad:?}");
        }
        let e = parse_answer("refused non-public a.example resolves to 127.0.0.1", None).unwrap_err();
        assert_eq!((e.code, e.text.as_str()), (Code::NonPublic, "a.example resolves to 127.0.0.1"));
        assert!(parse_answer("ok direct 1.2.3.4:443", None).is_err(), "an answer without its socket");
        assert!(parse_answer("", None).is_err());
    }

    #[test]
    fn the_broker_answers_over_the_channel() {
        // A listener on loopback stands for an allowed host; the broker connects to it.
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = server.local_addr().unwrap().port();
        let r = rules(&[&format!("127.0.0.1:{port}")]);
        let (ours, theirs) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        let broker = std::thread::spawn(move || serve(theirs, r));
        let client = Client::new(ours);
        let ip = Host::Ip("127.0.0.1".parse().unwrap());
        let c = client.connect(&ip, port, Via::Http, Duration::from_secs(10)).unwrap();
        assert_eq!(c.address, format!("127.0.0.1:{port}"));
        assert!(!c.upstream);
        let e = client.connect(&ip, port + 1, Via::Http, Duration::from_secs(10)).unwrap_err();
        assert_eq!(e.code, Code::NotAllowed);
        let e = client.connect(&name("localhost"), port, Via::Http, Duration::from_secs(10)).unwrap_err();
        assert_eq!(e.code, Code::NotAllowed);
        drop(client);
        broker.join().unwrap();
    }
}
