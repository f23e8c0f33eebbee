//! The caller's own proxy, if it has one: corporate networks often reach the internet only
//! through one, and a command allowed to reach a host must get there the same way. Read from
//! the caller's environment (`https_proxy`/`HTTPS_PROXY` for tunnels, `http_proxy`/`HTTP_PROXY`
//! for plain HTTP, `all_proxy`/`ALL_PROXY` for both, `no_proxy`/`NO_PROXY` for exceptions), the
//! lowercase spelling first as curl reads them. Pure.

use std::net::IpAddr;

use crate::allow::{Host, Via};

/// An upstream proxy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProxyUrl {
    /// As the URL names it: a name (resolved by the broker, no public-address check: it is the
    /// caller's own proxy) or an address.
    pub host: String,
    pub port: u16,
    /// `Basic …` for `user:password@` in the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
    /// Set for schemes the proxy cannot speak (`https://` to the proxy, `socks5://`): every
    /// connection that would go through it is refused, saying why, rather than sent around it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
}

/// Where a connection goes: straight to its host, or through the caller's proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Upstream {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<ProxyUrl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<ProxyUrl>,
    /// `no_proxy` entries, lowercase, without leading dots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_proxy: Vec<String>,
}

impl Upstream {
    /// From an environment (`get` looks a variable up).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Upstream {
        let first = |names: &[&str]| names.iter().find_map(|n| get(n).filter(|v| !v.trim().is_empty()));
        let all = first(&["all_proxy", "ALL_PROXY"]);
        let http = first(&["http_proxy", "HTTP_PROXY"]).or_else(|| all.clone());
        let tunnel = first(&["https_proxy", "HTTPS_PROXY"]).or(all);
        let no_proxy = first(&["no_proxy", "NO_PROXY"])
            .map(|v| {
                v.split(',')
                    .map(|e| e.trim().trim_start_matches('.').to_ascii_lowercase())
                    .filter(|e| !e.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        Upstream {
            http: http.as_deref().and_then(ProxyUrl::parse),
            tunnel: tunnel.as_deref().and_then(ProxyUrl::parse),
            no_proxy,
        }
    }

    /// The upstream proxy for a connection to `host` via `via`; None: connect directly.
    pub fn route(&self, host: &Host, via: Via) -> Option<&ProxyUrl> {
        let proxy = match via {
            Via::Tunnel => self.tunnel.as_ref(),
            Via::Http => self.http.as_ref(),
        }?;
        (!self.bypassed(host)).then_some(proxy)
    }

    /// Whether `no_proxy` sends `host` around the proxy: `*`, the name itself or a name below
    /// an entry, an address, or an address in a CIDR entry.
    fn bypassed(&self, host: &Host) -> bool {
        self.no_proxy.iter().any(|entry| {
            let entry = entry
                .rsplit_once(':')
                .filter(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok())
                .map_or(entry.as_str(), |(h, _)| h);
            if entry == "*" {
                return true;
            }
            match host {
                Host::Name(n) => {
                    n == entry
                        || (n.len() > entry.len()
                            && n.ends_with(entry)
                            && n.as_bytes()[n.len() - entry.len() - 1] == b'.')
                }
                Host::Ip(ip) => in_cidr(*ip, entry),
            }
        })
    }
}

/// `ip` equals `entry`, or lies in it when it is `addr/len`.
fn in_cidr(ip: IpAddr, entry: &str) -> bool {
    let entry = entry.trim_start_matches('[').trim_end_matches(']');
    let (net, len) = match entry.split_once('/') {
        Some((n, l)) => match l.parse::<u32>() {
            Ok(l) => (n, Some(l)),
            Err(_) => return false,
        },
        None => (entry, None),
    };
    let Ok(net) = net.parse::<IpAddr>() else { return false };
    match (ip.to_canonical(), net.to_canonical()) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let l = len.unwrap_or(32).min(32);
            let mask = if l == 0 { 0 } else { u32::MAX << (32 - l) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let l = len.unwrap_or(128).min(128);
            let mask = if l == 0 { 0 } else { u128::MAX << (128 - l) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

impl ProxyUrl {
    /// `[scheme://][user[:password]@]host[:port][/]`; None when there is no host.
    pub fn parse(text: &str) -> Option<ProxyUrl> {
        let text = text.trim();
        let (scheme, rest) = match text.split_once("://") {
            Some((s, r)) => (s.to_ascii_lowercase(), r),
            None => ("http".to_string(), text),
        };
        let authority = rest.split('/').next().unwrap_or("");
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = match hostport.strip_prefix('[') {
            Some(r) => {
                let end = r.find(']')?;
                (&r[..end], r[end + 1..].strip_prefix(':'))
            }
            None => match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            },
        };
        if host.is_empty() {
            return None;
        }
        let default_port = if scheme.starts_with("socks") {
            1080
        } else if scheme == "https" {
            443
        } else {
            80
        };
        let port = match port {
            Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0)?,
            None => default_port,
        };
        let auth = userinfo.map(|u| format!("Basic {}", base64(percent_decode(u).as_slice())));
        let unsupported = (scheme != "http")
            .then(|| format!("the caller's proxy {scheme}://{host}:{port} (only http:// proxies can be chained)"));
        Some(ProxyUrl { host: host.to_string(), port, auth, unsupported })
    }
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Standard base64 with padding (RFC 4648), for `Basic` credentials.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Upstream {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Upstream::from_env(|k| m.get(k).cloned())
    }

    fn name(s: &str) -> Host {
        Host::Name(s.into())
    }

    #[test]
    fn no_variables_means_direct() {
        let u = env(&[]);
        assert_eq!(u, Upstream::default());
        assert!(u.route(&name("a.example"), Via::Tunnel).is_none());
    }

    #[test]
    fn lowercase_first_and_all_proxy_as_fallback() {
        let u = env(&[
            ("https_proxy", "http://lower.example:3128"),
            ("HTTPS_PROXY", "http://upper.example:3128"),
            ("ALL_PROXY", "http://all.example:8080"),
        ]);
        assert_eq!(u.route(&name("a.example"), Via::Tunnel).unwrap().host, "lower.example");
        assert_eq!(u.route(&name("a.example"), Via::Http).unwrap().host, "all.example");
    }

    #[test]
    fn credentials_schemes_and_ports() {
        let p = ProxyUrl::parse("http://us%40er:p%3Ass@proxy.example:8080/").unwrap();
        assert_eq!((p.host.as_str(), p.port), ("proxy.example", 8080));
        assert_eq!(p.auth.as_deref(), Some(format!("Basic {}", base64(b"us@er:p:ss")).as_str()));
        assert!(p.unsupported.is_none());
        assert_eq!(ProxyUrl::parse("proxy.example").unwrap().port, 80);
        assert_eq!(ProxyUrl::parse("[2001:db8::1]:3128").unwrap().host, "2001:db8::1");
        assert!(ProxyUrl::parse("socks5h://proxy.example").unwrap().unsupported.unwrap().contains("socks5h://"));
        assert!(ProxyUrl::parse("http://:80").is_none());
        assert!(ProxyUrl::parse("http://proxy.example:x").is_none());
    }

    #[test]
    fn no_proxy_entries() {
        let u = env(&[
            ("HTTPS_PROXY", "http://proxy.example:3128"),
            ("NO_PROXY", ".internal.example, other.example:443, 10.0.0.0/8, 2001:db8::/32, [::1]"),
        ]);
        let direct = |h: Host| u.route(&h, Via::Tunnel).is_none();
        assert!(direct(name("internal.example")));
        assert!(direct(name("a.internal.example")));
        assert!(!direct(name("xinternal.example")));
        assert!(direct(name("other.example")));
        assert!(direct(Host::Ip("10.2.3.4".parse().unwrap())));
        assert!(!direct(Host::Ip("11.2.3.4".parse().unwrap())));
        assert!(direct(Host::Ip("2001:db8::5".parse().unwrap())));
        assert!(direct(Host::Ip("::1".parse().unwrap())));
        assert!(!direct(name("public.example")));
        assert!(env(&[("https_proxy", "p.example"), ("no_proxy", "*")])
            .route(&name("x.example"), Via::Tunnel)
            .is_none());
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }
}
