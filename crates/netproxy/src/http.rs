//! The one piece of HTTP the proxy reads: a client's request head. Pure, strict and bounded,
//! since every byte comes from the sandboxed command.
//!
//! Accepted: `CONNECT host:port HTTP/1.x` (a tunnel), and any other method with an absolute-form
//! `http://` URL (plain HTTP, forwarded). Refused: origin-form targets (a client that took the
//! proxy for a server), `https://` URLs (clients tunnel those), credentials in URLs, a `Host`
//! header naming another host than the URL (a server behind a shared address would route by
//! it: domain fronting), folded or bare-LF lines, NULs, more than [`MAX_HEADERS`] headers or
//! [`MAX_HEAD`] bytes.

use std::fmt::Write as _;

use crate::allow::{Host, Via};

/// The largest request head read (request line and headers).
pub const MAX_HEAD: usize = 32 * 1024;
/// The most header fields in a head.
pub const MAX_HEADERS: usize = 100;
const MAX_METHOD: usize = 32;
const MAX_NAME: usize = 256;

/// A request head the proxy accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub target: Target,
    /// The header fields in order, names as sent.
    pub headers: Vec<(String, Vec<u8>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`.
    Connect { host: Host, port: u16 },
    /// `METHOD http://authority/path`: `authority` as written (for a missing `Host` header),
    /// `path` with its query, at least `/`.
    Absolute { host: Host, port: u16, authority: String, path: String },
}

/// Why a head was refused; each maps to the status the client gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the request head is larger than {MAX_HEAD} bytes or has more than {MAX_HEADERS} fields")]
    TooLarge,
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("the request names a path, not a URL: the proxy forwards absolute http:// URLs and CONNECT tunnels only")]
    OriginForm,
    #[error("`{0}` URLs are not forwarded (https goes through CONNECT)")]
    Scheme(String),
    #[error("host `{0}`: {1}")]
    Host(String, String),
    #[error("the Host header names another host than the URL")]
    HostMismatch,
}

impl HeadError {
    /// The HTTP status and reason phrase to answer with.
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            HeadError::TooLarge => (431, "Request Header Fields Too Large"),
            _ => (400, "Bad Request"),
        }
    }
}

/// Where the head ends: the index just past its blank line, if it is all there.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// `tchar` of RFC 9110.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parse a complete head (up to and including its blank line, as [`head_end`] found it).
pub fn parse(head: &[u8]) -> Result<Request, HeadError> {
    if head.len() > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    let body = head.strip_suffix(b"\r\n\r\n").ok_or(HeadError::Malformed("the head does not end in a blank line"))?;
    if crlf_lines(body).any(|l| l.contains(&b'\n') || l.contains(&b'\r')) {
        return Err(HeadError::Malformed("bare LF or CR"));
    }
    let mut lines = crlf_lines(body).map(Ok::<&[u8], HeadError>);
    let first = lines.next().ok_or(HeadError::Malformed("empty"))??;
    let (method, target) = request_line(first)?;
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    for line in lines {
        let line = line?;
        if headers.len() >= MAX_HEADERS {
            return Err(HeadError::TooLarge);
        }
        headers.push(header(line)?);
    }
    let target = if method == "CONNECT" { connect_target(target)? } else { absolute_target(target)? };
    if let Target::Absolute { host, port, .. } = &target {
        check_host_header(&headers, host, *port)?;
    }
    Ok(Request { method, target, headers })
}

/// The lines of `body`, split at CRLF.
fn crlf_lines(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(body);
    std::iter::from_fn(move || {
        let r = rest?;
        match r.windows(2).position(|w| w == b"\r\n") {
            Some(i) => {
                rest = Some(&r[i + 2..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

fn request_line(line: &[u8]) -> Result<(String, &[u8]), HeadError> {
    let mut parts = line.split(|b| *b == b' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::Malformed("the request line is not METHOD TARGET VERSION"));
    };
    if method.is_empty() || method.len() > MAX_METHOD || !method.iter().copied().all(is_tchar) {
        return Err(HeadError::Malformed("bad method"));
    }
    if version != b"HTTP/1.1" && version != b"HTTP/1.0" {
        return Err(HeadError::Malformed("not HTTP/1.0 or HTTP/1.1"));
    }
    if target.is_empty() || !target.iter().all(|b| (0x21..0x7f).contains(b)) {
        return Err(HeadError::Malformed("bad request target"));
    }
    Ok((String::from_utf8_lossy(method).into_owned(), target))
}

fn header(line: &[u8]) -> Result<(String, Vec<u8>), HeadError> {
    if line.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
        return Err(HeadError::Malformed("folded header line"));
    }
    let colon = line.iter().position(|b| *b == b':').ok_or(HeadError::Malformed("header without a colon"))?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    if name.is_empty() || name.len() > MAX_NAME || !name.iter().copied().all(is_tchar) {
        return Err(HeadError::Malformed("bad header name"));
    }
    if value.iter().any(|b| *b == 0 || *b == b'\r') {
        return Err(HeadError::Malformed("control character in a header value"));
    }
    let value = value.trim_ascii();
    Ok((String::from_utf8_lossy(name).into_owned(), value.to_vec()))
}

/// `host:port` (or `[v6]:port`); the port defaults to 443.
fn authority(text: &str, default_port: u16) -> Result<(Host, u16), HeadError> {
    let bad = |why: &str| HeadError::Host(text.to_string(), why.to_string());
    if text.contains('@') {
        return Err(bad("credentials in the authority"));
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let end = rest.find(']').ok_or_else(|| bad("`[` without `]`"))?;
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(bad("junk after the address")),
        };
        (&text[..end + 2], port)
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    let port = match port {
        None => default_port,
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            p.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(|| bad("bad port"))?
        }
        Some(_) => return Err(bad("bad port")),
    };
    let host = Host::parse(host).map_err(|e| bad(&e.to_string()))?;
    Ok((host, port))
}

fn connect_target(target: &[u8]) -> Result<Target, HeadError> {
    let text = std::str::from_utf8(target).map_err(|_| HeadError::Malformed("bad request target"))?;
    let (host, port) = authority(text, 443)?;
    Ok(Target::Connect { host, port })
}

fn absolute_target(target: &[u8]) -> Result<Target, HeadError> {
    let text = std::str::from_utf8(target).map_err(|_| HeadError::Malformed("bad request target"))?;
    if text.starts_with('/') || text == "*" {
        return Err(HeadError::OriginForm);
    }
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(HeadError::Malformed("the request target is not a URL"));
    };
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(HeadError::Scheme(scheme.to_string()));
    }
    let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(split);
    if auth.is_empty() {
        return Err(HeadError::Malformed("a URL without a host"));
    }
    let (host, port) = authority(auth, 80)?;
    let path = match path.chars().next() {
        None => "/".to_string(),
        Some('/') => path.to_string(),
        Some(_) => format!("/{path}"),
    };
    Ok(Target::Absolute { host, port, authority: auth.to_string(), path })
}

/// At most one `Host` field, and it names the URL's host and port.
fn check_host_header(headers: &[(String, Vec<u8>)], host: &Host, port: u16) -> Result<(), HeadError> {
    let mut values = headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("host")).map(|(_, v)| v);
    let Some(value) = values.next() else { return Ok(()) };
    if values.next().is_some() {
        return Err(HeadError::Malformed("more than one Host header"));
    }
    let text = std::str::from_utf8(value).map_err(|_| HeadError::HostMismatch)?;
    match authority(text, 80) {
        Ok((h, p)) if h == *host && p == port => Ok(()),
        _ => Err(HeadError::HostMismatch),
    }
}

/// Headers that concern one hop only, and never travel on: the client's connection to us is not
/// the server's (RFC 9110 §7.6.1), and credentials meant for a proxy stay with it.
fn hop_by_hop(name: &str, listed: &[String]) -> bool {
    const FIXED: [&str; 8] = [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    ];
    let lower = name.to_ascii_lowercase();
    FIXED.contains(&lower.as_str()) || listed.contains(&lower)
}

impl Request {
    pub fn via(&self) -> Via {
        match self.target {
            Target::Connect { .. } => Via::Tunnel,
            Target::Absolute { .. } => Via::Http,
        }
    }

    pub fn host(&self) -> &Host {
        match &self.target {
            Target::Connect { host, .. } | Target::Absolute { host, .. } => host,
        }
    }

    pub fn port(&self) -> u16 {
        match self.target {
            Target::Connect { port, .. } | Target::Absolute { port, .. } => port,
        }
    }

    /// The head forwarded for a plain HTTP request: to the server itself in origin form
    /// (`upstream_auth: None` and `absolute: false`), or to an upstream proxy in absolute form
    /// with its credentials. Hop-by-hop fields are dropped, and the connection closes after one
    /// response (`Connection: close`), so every request on it is one the proxy checked.
    pub fn forwarded_head(&self, absolute: bool, upstream_auth: Option<&str>) -> Vec<u8> {
        let Target::Absolute { authority, path, .. } = &self.target else { return Vec::new() };
        let listed: Vec<String> = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
            .flat_map(|(_, v)| {
                String::from_utf8_lossy(v).split(',').map(|t| t.trim().to_ascii_lowercase()).collect::<Vec<_>>()
            })
            .collect();
        let mut out = Vec::with_capacity(512);
        let target = if absolute { format!("http://{authority}{path}") } else { path.clone() };
        out.extend_from_slice(format!("{} {target} HTTP/1.1\r\n", self.method).as_bytes());
        let mut has_host = false;
        for (name, value) in &self.headers {
            if hop_by_hop(name, &listed) {
                continue;
            }
            has_host |= name.eq_ignore_ascii_case("host");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        if !has_host {
            out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
        }
        if let Some(auth) = upstream_auth {
            out.extend_from_slice(format!("Proxy-Authorization: {auth}\r\n").as_bytes());
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out
    }
}

/// A complete response from the proxy itself (a refusal or an error): one line of text saying
/// what happened and what to do, and `X-Txbox-Proxy` so a person reading headers knows who spoke.
pub fn response(status: u16, reason: &str, text: &str) -> Vec<u8> {
    let body = format!("{text}\n");
    let mut out = String::with_capacity(160 + body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\nX-Txbox-Proxy: refused\r\n\r\n{body}",
        body.len()
    );
    out.into_bytes()
}

/// What a tunnel's client gets once its server is connected.
pub const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// The status code of a response head (`HTTP/1.x NNN …`): how an upstream proxy answered our
/// CONNECT.
pub fn status_of(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let mut parts = line.split(|b| *b == b' ');
    let version = parts.next()?;
    if !version.starts_with(b"HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(text: &str) -> Result<Request, HeadError> {
        parse(text.as_bytes())
    }

    fn name(s: &str) -> Host {
        Host::Name(s.into())
    }

    #[test]
    fn connect_and_absolute_form_parse() {
        let r = req("CONNECT Reg.Example:443 HTTP/1.1\r\nHost: whatever\r\n\r\n").unwrap();
        assert_eq!(r.target, Target::Connect { host: name("reg.example"), port: 443 });
        assert_eq!(r.via(), Via::Tunnel);
        let r = req("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(r.target, Target::Connect { host: Host::Ip("2001:db8::1".parse().unwrap()), port: 8443 });
        let r = req("GET http://reg.example:8080/simple/x/?a=1 HTTP/1.1\r\nHost: reg.example:8080\r\n\r\n").unwrap();
        assert_eq!(
            r.target,
            Target::Absolute {
                host: name("reg.example"),
                port: 8080,
                authority: "reg.example:8080".into(),
                path: "/simple/x/?a=1".into()
            }
        );
        let r = req("HEAD http://reg.example HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(r.port(), 80);
        assert!(matches!(&r.target, Target::Absolute { path, .. } if path == "/"));
        let r = req("GET http://reg.example?q HTTP/1.1\r\nHost: REG.example:80\r\n\r\n").unwrap();
        assert!(matches!(&r.target, Target::Absolute { path, .. } if path == "/?q"));
    }

    #[test]
    fn hostile_heads_are_refused_with_a_status() {
        let cases: &[(&str, u16)] = &[
            ("GET /path HTTP/1.1\r\nHost: reg.example\r\n\r\n", 400),
            ("OPTIONS * HTTP/1.1\r\n\r\n", 400),
            ("GET https://reg.example/ HTTP/1.1\r\n\r\n", 400),
            ("GET ftp://reg.example/ HTTP/1.1\r\n\r\n", 400),
            ("GET http://user:pw@reg.example/ HTTP/1.1\r\n\r\n", 400),
            ("GET http:///x HTTP/1.1\r\n\r\n", 400),
            ("GET http://reg.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", 400),
            ("GET http://reg.example/ HTTP/1.1\r\nHost: reg.example:81\r\n\r\n", 400),
            ("GET http://reg.example/ HTTP/1.1\r\nHost: reg.example\r\nHost: reg.example\r\n\r\n", 400),
            ("GET http://reg.example/ HTTP/2.0\r\n\r\n", 400),
            ("GET  http://reg.example/ HTTP/1.1\r\n\r\n", 400),
            ("GET http://reg.example/ HTTP/1.1\n\r\n", 400),
            ("GET http://reg.example/ HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400),
            ("GET http://reg.example/ HTTP/1.1\r\nX: a\0b\r\n\r\n", 400),
            ("GET http://reg.example/ HTTP/1.1\r\nBad Name: a\r\n\r\n", 400),
            ("GET http://reg.example/ HTTP/1.1\r\nNoColon\r\n\r\n", 400),
            ("G\u{e9}T http://reg.example/ HTTP/1.1\r\n\r\n", 400),
            ("CONNECT reg.example:0 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT reg.example:65536 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT reg.example:-1 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT 2130706433:443 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT [::1:443 HTTP/1.1\r\n\r\n", 400),
            ("CONNECT reg.example:443 HTTP/1.1\r\n", 400),
        ];
        for (text, status) in cases {
            let e = req(text).unwrap_err();
            assert_eq!(e.status().0, *status, "{text:?}: {e}");
        }
        let many = format!("GET http://reg.example/ HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(MAX_HEADERS + 1));
        assert_eq!(req(&many).unwrap_err(), HeadError::TooLarge);
        let huge = format!("GET http://reg.example/ HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(MAX_HEAD));
        assert_eq!(req(&huge).unwrap_err(), HeadError::TooLarge);
    }

    #[test]
    fn forwarded_heads_drop_hop_by_hop_fields_and_close() {
        let r = req("POST http://reg.example:8080/up HTTP/1.1\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\n\
             Proxy-Authorization: Basic abc\r\nContent-Length: 2\r\nProxy-Connection: keep-alive\r\n\r\n")
        .unwrap();
        let origin = String::from_utf8(r.forwarded_head(false, None)).unwrap();
        assert_eq!(
            origin,
            "POST /up HTTP/1.1\r\nContent-Length: 2\r\nHost: reg.example:8080\r\nConnection: close\r\n\r\n"
        );
        let upstream = String::from_utf8(r.forwarded_head(true, Some("Basic dXA="))).unwrap();
        assert_eq!(
            upstream,
            "POST http://reg.example:8080/up HTTP/1.1\r\nContent-Length: 2\r\nHost: reg.example:8080\r\n\
             Proxy-Authorization: Basic dXA=\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn responses_and_status_lines() {
        let r = response(403, "Forbidden", "txbox: no");
        let text = String::from_utf8(r.clone()).unwrap();
        assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n") && text.ends_with("\r\n\r\ntxbox: no\n"), "{text}");
        assert_eq!(status_of(&r), Some(403));
        assert_eq!(status_of(ESTABLISHED), Some(200));
        assert_eq!(status_of(b"HTTP/1.0 407 Proxy Authentication Required\r\n"), Some(407));
        assert_eq!(status_of(b"SSH-2.0-x\r\n"), None);
        assert_eq!(head_end(b"GET http://a.example/ HTTP/1.1\r\n\r\nbody"), Some(34));
        assert_eq!(head_end(b"GET http://a.example/ HTTP/1.1\r\n"), None);
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse(&bytes);
            let _ = status_of(&bytes);
            let _ = head_end(&bytes);
        }

        #[test]
        fn mutated_valid_heads_never_panic(pos in 0usize..60, b in any::<u8>()) {
            let mut head = b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n".to_vec();
            let i = pos % head.len();
            head[i] = b;
            if let Ok(r) = parse(&head) {
                prop_assert!(r.port() > 0);
            }
        }
    }
}
