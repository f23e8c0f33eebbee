//! The allowlist: which hosts and ports a command may reach through the proxy. Pure: parsing and
//! matching, unit- and property-tested.
//!
//! One `--allow-host` value is a comma list of items:
//!
//! ```text
//! host              a name: that host only, port 443 through CONNECT (TLS), 80 as plain HTTP
//! host:8443         that port, either way          host:*   any port
//! *.domain          every name below `domain`, at any depth, but not `domain` itself
//! 192.0.2.7         an address (the only way to reach a non-public one: see `addr`)
//! [2001:db8::7]:80  an IPv6 address with a port (bare `2001:db8::7` has none)
//! https://host:8443/path   a URL: its host and port (443 for https, 80 for http); the path is ignored
//! @pypi             a preset, expanded from the package manager's own configuration (`preset`)
//! ```
//!
//! Names compare without regard to ASCII case and one trailing dot. Non-ASCII names are refused:
//! clients send the punycode form (`xn--…`), and that is the form to list. A name whose last
//! label starts with a digit (`2130706433`, `0x7f.1`, `1.2.3`) is refused everywhere: resolvers
//! read such strings as IPv4 addresses in forms no canonical parser accepts, so they could name
//! an address under the guise of a name.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

/// The longest host name DNS allows (RFC 1035), without its trailing dot.
pub const MAX_NAME: usize = 253;
const MAX_LABEL: usize = 63;

/// A host as a request or an allowlist item names it, normalized: names in lowercase without a
/// trailing dot, IPv4-mapped IPv6 addresses as IPv4.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("empty host")]
    Empty,
    #[error("host name longer than {MAX_NAME} bytes")]
    TooLong,
    #[error("a label of the host name is empty or longer than {MAX_LABEL} bytes")]
    BadLabel,
    #[error("character {0:?} is not allowed in a host name")]
    BadChar(char),
    #[error("non-ASCII host name: write its punycode form (xn--…)")]
    NonAscii,
    #[error(
        "a host name ending in a numeric label reads as an IPv4 address: write the address in dotted-decimal form"
    )]
    Numeric,
}

impl Host {
    /// Parse a host: `[v6]`, a bare IPv6 address, dotted-decimal IPv4, or a name.
    pub fn parse(s: &str) -> Result<Host, HostError> {
        if s.is_empty() {
            return Err(HostError::Empty);
        }
        if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            return Ipv6Addr::from_str(inner).map(|a| Host::Ip(IpAddr::V6(a).to_canonical())).map_err(|_| {
                inner
                    .chars()
                    .find(|c| !c.is_ascii_hexdigit() && *c != ':' && *c != '.')
                    .map_or(HostError::BadLabel, HostError::BadChar)
            });
        }
        if let Ok(ip) = IpAddr::from_str(s) {
            return Ok(Host::Ip(ip.to_canonical()));
        }
        parse_name(s).map(Host::Name)
    }

    pub fn is_ip(&self) -> bool {
        matches!(self, Host::Ip(_))
    }
}

/// A host name, validated and normalized (see the module documentation).
fn parse_name(s: &str) -> Result<String, HostError> {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() {
        return Err(HostError::Empty);
    }
    if !s.is_ascii() {
        return Err(HostError::NonAscii);
    }
    if s.len() > MAX_NAME {
        return Err(HostError::TooLong);
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Err(HostError::BadChar(c));
    }
    if s.split('.').any(|l| l.is_empty() || l.len() > MAX_LABEL) {
        return Err(HostError::BadLabel);
    }
    if s.rsplit('.').next().and_then(|l| l.chars().next()).is_some_and(|c| c.is_ascii_digit()) {
        return Err(HostError::Numeric);
    }
    Ok(s.to_ascii_lowercase())
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// How a connection reaches its host through the proxy; it decides the default port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// `CONNECT host:port`: a tunnel, normally for TLS.
    Tunnel,
    /// A plain HTTP request in absolute form (`GET http://host/…`), forwarded.
    Http,
}

impl Via {
    /// The port an item without a port allows: 443 for tunnels, 80 for plain HTTP.
    pub fn default_port(self) -> u16 {
        match self {
            Via::Tunnel => 443,
            Via::Http => 80,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Via::Tunnel => "tunnel",
            Via::Http => "http",
        }
    }
}

/// Which hosts an item allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostPattern {
    /// This host only.
    Exact(Host),
    /// `*.domain`: names strictly below `domain` (`a.domain`, `a.b.domain`), not `domain`.
    Below(String),
}

/// Which ports an item allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ports {
    /// None given: [`Via::default_port`].
    Default,
    One(u16),
    /// `:*`.
    Any,
}

/// One allowlist item (presets expanded).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    pub host: HostPattern,
    pub ports: Ports,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--allow-host `{item}`: {why}")]
pub struct SpecError {
    pub item: String,
    pub why: String,
}

fn spec_error(item: &str, why: impl Into<String>) -> SpecError {
    SpecError { item: item.to_string(), why: why.into() }
}

impl Rule {
    /// One item: `host[:port]`, `*.domain[:port]`, an address, or an `http(s)://` URL.
    pub fn parse(item: &str) -> Result<Rule, SpecError> {
        let s = item.trim();
        let err = |why: String| spec_error(s, why);
        if s.is_empty() {
            return Err(err("empty item".into()));
        }
        if let Some((scheme, rest)) = s.split_once("://") {
            let default = match scheme.to_ascii_lowercase().as_str() {
                "http" => 80,
                "https" => 443,
                other => return Err(err(format!("URL scheme `{other}` (only http and https URLs name hosts here)"))),
            };
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            if authority.contains('@') {
                return Err(err("a URL with credentials: list the host alone".into()));
            }
            let (host, ports) = split_port(authority).map_err(err)?;
            let ports = if ports == Ports::Default { Ports::One(default) } else { ports };
            let host = Host::parse(host).map_err(|e| err(e.to_string()))?;
            return Ok(Rule { host: HostPattern::Exact(host), ports });
        }
        if s == "*" || s.starts_with("*:") {
            return Err(err("`*` would allow every host: give `--network host` for that".into()));
        }
        if let Some(rest) = s.strip_prefix("*.") {
            let (domain, ports) = split_port(rest).map_err(err)?;
            if domain.contains('*') {
                return Err(err("only one leading `*.` is a wildcard".into()));
            }
            let domain = parse_name(domain).map_err(|e| err(e.to_string()))?;
            return Ok(Rule { host: HostPattern::Below(domain), ports });
        }
        let (host, ports) = split_port(s).map_err(err)?;
        if host.contains('*') {
            return Err(err("only a leading `*.` is a wildcard".into()));
        }
        let host = Host::parse(host).map_err(|e| err(e.to_string()))?;
        Ok(Rule { host: HostPattern::Exact(host), ports })
    }

    /// Whether this item lets a connection reach `host:port` the way `via` says.
    pub fn matches(&self, host: &Host, port: u16, via: Via) -> bool {
        let port_ok = match self.ports {
            Ports::Default => port == via.default_port(),
            Ports::One(p) => port == p,
            Ports::Any => true,
        };
        port_ok
            && match (&self.host, host) {
                (HostPattern::Exact(h), _) => h == host,
                (HostPattern::Below(d), Host::Name(n)) => is_below(n, d),
                (HostPattern::Below(_), Host::Ip(_)) => false,
            }
    }

    /// Whether every connection `other` allows, this item allows too (an operator's ceiling
    /// covering a request's item).
    pub fn covers(&self, other: &Rule) -> bool {
        let ports = match (self.ports, other.ports) {
            (Ports::Any, _) => true,
            (a, b) => a == b,
        };
        ports
            && match (&self.host, &other.host) {
                (HostPattern::Exact(a), HostPattern::Exact(b)) => a == b,
                (HostPattern::Below(d), HostPattern::Exact(Host::Name(n))) => is_below(n, d),
                (HostPattern::Below(d), HostPattern::Below(e)) => e == d || is_below(e, d),
                _ => false,
            }
    }
}

/// `name` is strictly below `domain` (`a.b.example` is below `example`; `example` is not).
fn is_below(name: &str, domain: &str) -> bool {
    name.len() > domain.len() + 1
        && name.ends_with(domain)
        && name.as_bytes().get(name.len() - domain.len() - 1) == Some(&b'.')
}

/// Split `host[:port]` (also `[v6]:port` and a bare IPv6 address, which has no port).
fn split_port(s: &str) -> Result<(&str, Ports), String> {
    let (host, port) = if s.starts_with('[') {
        match s.find(']') {
            Some(end) => {
                let rest = &s[end + 1..];
                match rest.strip_prefix(':') {
                    Some(p) => (&s[..=end], Some(p)),
                    None if rest.is_empty() => (s, None),
                    None => return Err(format!("unexpected `{rest}` after the address")),
                }
            }
            None => return Err("`[` without `]`".into()),
        }
    } else if s.matches(':').count() > 1 {
        // A bare IPv6 address: it cannot carry a port.
        (s, None)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let ports = match port {
        None => Ports::Default,
        Some("*") => Ports::Any,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && !p.starts_with('+') => Ports::One(n),
            _ => return Err(format!("`{p}` is not a port (1-65535 or *)")),
        },
    };
    Ok((host, ports))
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(h) => write!(f, "{h}")?,
            HostPattern::Below(d) => write!(f, "*.{d}")?,
        }
        match self.ports {
            Ports::Default => Ok(()),
            Ports::One(p) => write!(f, ":{p}"),
            Ports::Any => f.write_str(":*"),
        }
    }
}

impl FromStr for Rule {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Rule, SpecError> {
        Rule::parse(s)
    }
}

impl serde::Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Rule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Rule, D::Error> {
        let s = String::deserialize(d)?;
        Rule::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The package managers and hosts a preset stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Preset {
    Pypi,
    Npm,
    Crates,
    Go,
    Github,
}

impl Preset {
    pub const ALL: [Preset; 5] = [Preset::Pypi, Preset::Npm, Preset::Crates, Preset::Go, Preset::Github];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Pypi => "pypi",
            Preset::Npm => "npm",
            Preset::Crates => "crates",
            Preset::Go => "go",
            Preset::Github => "github",
        }
    }

    pub fn parse(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name.to_ascii_lowercase())
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "@{}", self.name())
    }
}

/// One item of an `--allow-host` list: a rule, or a preset still to expand.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Spec {
    Rule(Rule),
    Preset(Preset),
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::Rule(r) => write!(f, "{r}"),
            Spec::Preset(p) => write!(f, "{p}"),
        }
    }
}

/// Parse one `--allow-host` value: items separated by commas (spaces around them ignored).
pub fn parse_specs(text: &str) -> Result<Vec<Spec>, SpecError> {
    text.split(',')
        .map(|item| {
            let item = item.trim();
            match item.strip_prefix('@') {
                Some(name) => Preset::parse(name).map(Spec::Preset).ok_or_else(|| {
                    let known: Vec<String> = Preset::ALL.iter().map(|p| p.to_string()).collect();
                    spec_error(item, format!("unknown preset (known: {})", known.join(", ")))
                }),
                None => Rule::parse(item).map(Spec::Rule),
            }
        })
        .collect()
}

/// Parse several `--allow-host` values (each a comma list) into one list, duplicates dropped.
pub fn parse_all<S: AsRef<str>>(values: &[S]) -> Result<Vec<Spec>, SpecError> {
    let mut out: Vec<Spec> = Vec::new();
    for v in values {
        for s in parse_specs(v.as_ref())? {
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    Ok(out)
}

/// The rules a command's connections are checked against. Empty: the network is off.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Allowlist {
    rules: Vec<Rule>,
}

impl Allowlist {
    /// The rules, in order, duplicates dropped.
    pub fn new(rules: impl IntoIterator<Item = Rule>) -> Allowlist {
        let mut out: Vec<Rule> = Vec::new();
        for r in rules {
            if !out.contains(&r) {
                out.push(r);
            }
        }
        Allowlist { rules: out }
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The first rule that lets a connection reach `host:port` via `via`.
    pub fn allowing(&self, host: &Host, port: u16, via: Via) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(host, port, via))
    }

    pub fn allows(&self, host: &Host, port: u16, via: Via) -> bool {
        self.allowing(host, port, via).is_some()
    }

    /// Whether the address itself is listed for this port: what lets a name resolve to a
    /// non-public address (see `addr`).
    pub fn lists_address(&self, ip: IpAddr, port: u16, via: Via) -> bool {
        self.allows(&Host::Ip(ip.to_canonical()), port, via)
    }

    /// Whether `rule` is within this list (some item covers it): how a request's own list is
    /// checked against an operator's ceiling.
    pub fn covers(&self, rule: &Rule) -> bool {
        self.rules.iter().any(|r| r.covers(rule))
    }

    /// The items as `--allow-host` would take them back.
    pub fn to_specs(&self) -> Vec<String> {
        self.rules.iter().map(Rule::to_string).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name(s: &str) -> Host {
        Host::Name(s.to_string())
    }

    fn rule(s: &str) -> Rule {
        Rule::parse(s).unwrap()
    }

    #[test]
    fn items_parse_to_what_they_say() {
        let exact = |h: Host, ports| Rule { host: HostPattern::Exact(h), ports };
        assert_eq!(rule("Example.COM."), exact(name("example.com"), Ports::Default));
        assert_eq!(rule("example.com:8443"), exact(name("example.com"), Ports::One(8443)));
        assert_eq!(rule("example.com:*"), exact(name("example.com"), Ports::Any));
        assert_eq!(
            rule("*.example.com"),
            Rule { host: HostPattern::Below("example.com".into()), ports: Ports::Default }
        );
        assert_eq!(rule("192.0.2.7"), exact(Host::Ip("192.0.2.7".parse().unwrap()), Ports::Default));
        assert_eq!(rule("192.0.2.7:80"), exact(Host::Ip("192.0.2.7".parse().unwrap()), Ports::One(80)));
        assert_eq!(rule("2001:db8::7"), exact(Host::Ip("2001:db8::7".parse().unwrap()), Ports::Default));
        assert_eq!(rule("[2001:db8::7]:80"), exact(Host::Ip("2001:db8::7".parse().unwrap()), Ports::One(80)));
        assert_eq!(rule("[::ffff:192.0.2.7]"), exact(Host::Ip("192.0.2.7".parse().unwrap()), Ports::Default));
        assert_eq!(rule("https://Reg.example/simple/"), exact(name("reg.example"), Ports::One(443)));
        assert_eq!(rule("http://reg.example:8080"), exact(name("reg.example"), Ports::One(8080)));
        assert_eq!(rule(" under_score.example "), exact(name("under_score.example"), Ports::Default));
    }

    #[test]
    fn malformed_items_are_refused_with_a_reason() {
        for (bad, why) in [
            ("", "empty"),
            ("*", "every host"),
            ("*:443", "every host"),
            ("a.*.example", "wildcard"),
            ("*.*.example", "wildcard"),
            ("*.192.0.2.7", "numeric"),
            ("ex ample.com", "not allowed"),
            ("exämple.com", "punycode"),
            ("example.com:0", "not a port"),
            ("example.com:65536", "not a port"),
            ("example.com:+1", "not a port"),
            ("example.com:https", "not a port"),
            ("a..example", "label"),
            (".example", "label"),
            ("2130706433", "numeric"),
            ("0x7f.1", "numeric"),
            ("1.2.3", "numeric"),
            ("127.1", "numeric"),
            ("ftp://example.com", "scheme"),
            ("https://user:pw@example.com/", "credentials"),
            ("[::1", "without"),
            ("[::1]x", "unexpected"),
            ("[nothex]", "not allowed"),
        ] {
            let e = Rule::parse(bad).unwrap_err();
            assert!(e.why.contains(why), "{bad:?}: {e}");
        }
        let long = format!("{}.example", "a".repeat(64));
        assert!(Rule::parse(&long).is_err());
        let too_long = vec!["a".repeat(63); 5].join(".");
        assert_eq!(Rule::parse(&too_long).unwrap_err().why, HostError::TooLong.to_string());
    }

    #[test]
    fn lists_and_presets() {
        let specs = parse_specs("@pypi, example.com,*.example.org:8443,@NPM").unwrap();
        assert_eq!(
            specs,
            vec![
                Spec::Preset(Preset::Pypi),
                Spec::Rule(rule("example.com")),
                Spec::Rule(rule("*.example.org:8443")),
                Spec::Preset(Preset::Npm)
            ]
        );
        assert!(parse_specs("@nope").unwrap_err().why.contains("@pypi, @npm, @crates, @go, @github"));
        assert!(parse_specs("a.example,,b.example").is_err(), "an empty item is a mistake");
        assert_eq!(parse_all(&["a.example,b.example", "b.example", "@go"]).unwrap().len(), 3);
    }

    #[test]
    fn default_ports_depend_on_the_way_in() {
        let r = rule("example.com");
        let h = name("example.com");
        assert!(r.matches(&h, 443, Via::Tunnel));
        assert!(r.matches(&h, 80, Via::Http));
        assert!(!r.matches(&h, 80, Via::Tunnel));
        assert!(!r.matches(&h, 443, Via::Http));
        assert!(!r.matches(&h, 22, Via::Tunnel));
        let any = rule("example.com:*");
        assert!(any.matches(&h, 22, Via::Tunnel) && any.matches(&h, 8080, Via::Http));
    }

    #[test]
    fn wildcards_cover_subdomains_but_not_the_domain_or_lookalikes() {
        let r = rule("*.example.com");
        for yes in ["a.example.com", "a.b.example.com", "x-y.example.com"] {
            assert!(r.matches(&name(yes), 443, Via::Tunnel), "{yes}");
        }
        for no in ["example.com", "badexample.com", "example.com.evil", "a.example.co", "com"] {
            assert!(!r.matches(&name(no), 443, Via::Tunnel), "{no}");
        }
        assert!(!r.matches(&Host::Ip("192.0.2.7".parse().unwrap()), 443, Via::Tunnel));
    }

    #[test]
    fn addresses_match_only_addresses() {
        let list = Allowlist::new([rule("192.0.2.7:8080"), rule("::1")]);
        assert!(list.lists_address("192.0.2.7".parse().unwrap(), 8080, Via::Http));
        assert!(list.lists_address("::ffff:192.0.2.7".parse().unwrap(), 8080, Via::Http));
        assert!(!list.lists_address("192.0.2.7".parse().unwrap(), 80, Via::Http));
        assert!(list.lists_address("::1".parse().unwrap(), 443, Via::Tunnel));
        assert!(!list.allows(&name("localhost"), 443, Via::Tunnel));
    }

    #[test]
    fn ceilings_cover_narrower_items_only() {
        let ceiling = Allowlist::new([rule("*.example.com"), rule("reg.example:*"), rule("192.0.2.7")]);
        for yes in
            ["a.example.com", "*.a.example.com", "*.example.com", "reg.example:8080", "reg.example:*", "192.0.2.7"]
        {
            assert!(ceiling.covers(&rule(yes)), "{yes}");
        }
        for no in ["example.com", "a.example.com:8443", "reg.example.evil", "192.0.2.8", "192.0.2.7:80", "*.example"] {
            assert!(!ceiling.covers(&rule(no)), "{no}");
        }
    }

    #[test]
    fn the_list_serializes_as_its_items() {
        let list =
            Allowlist::new([rule("a.example"), rule("*.b.example:8443"), rule("[2001:db8::1]:*"), rule("a.example")]);
        let json = serde_json::to_string(&list).unwrap();
        assert_eq!(json, r#"["a.example","*.b.example:8443","[2001:db8::1]:*"]"#);
        assert_eq!(serde_json::from_str::<Allowlist>(&json).unwrap(), list);
        assert!(serde_json::from_str::<Allowlist>(r#"["*"]"#).is_err());
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,10}"
    }

    fn domain() -> impl Strategy<Value = String> {
        proptest::collection::vec(label(), 1..4).prop_map(|v| v.join("."))
    }

    fn any_rule() -> impl Strategy<Value = Rule> {
        let host = prop_oneof![
            domain().prop_map(|d| HostPattern::Exact(Host::Name(d))),
            domain().prop_map(HostPattern::Below),
            any::<[u8; 4]>().prop_map(|b| HostPattern::Exact(Host::Ip(IpAddr::from(b)))),
            any::<[u8; 16]>().prop_map(|b| HostPattern::Exact(Host::Ip(IpAddr::from(b).to_canonical()))),
        ];
        let ports = prop_oneof![Just(Ports::Default), Just(Ports::Any), (1u16..).prop_map(Ports::One)];
        (host, ports).prop_map(|(host, ports)| Rule { host, ports })
    }

    fn mixed_case(s: &str, mask: u64) -> String {
        s.chars().enumerate().map(|(i, c)| if mask >> (i % 64) & 1 == 1 { c.to_ascii_uppercase() } else { c }).collect()
    }

    proptest! {
        #[test]
        fn display_parses_back(r in any_rule()) {
            prop_assert_eq!(Rule::parse(&r.to_string()).unwrap(), r);
        }

        #[test]
        fn case_and_one_trailing_dot_do_not_matter(d in domain(), mask in any::<u64>(), port in 1u16..) {
            let list = Allowlist::new([rule(&d)]);
            let written = Host::parse(&format!("{}.", mixed_case(&d, mask))).unwrap();
            prop_assert_eq!(&written, &Host::Name(d.clone()));
            for via in [Via::Tunnel, Via::Http] {
                prop_assert_eq!(list.allows(&written, port, via), list.allows(&Host::Name(d.clone()), port, via));
            }
        }

        #[test]
        fn a_wildcard_matches_exactly_the_names_below_it(d in domain(), sub in label(), other in domain()) {
            let r = rule(&format!("*.{d}"));
            let below = Host::Name(format!("{sub}.{d}"));
            prop_assert!(r.matches(&below, 443, Via::Tunnel));
            prop_assert!(!r.matches(&Host::Name(d.clone()), 443, Via::Tunnel));
            let expected = other.ends_with(&format!(".{d}"));
            prop_assert_eq!(r.matches(&Host::Name(other.clone()), 443, Via::Tunnel), expected);
            // Glued on without a dot it is another name.
            let glued = Host::Name(format!("{sub}{d}"));
            prop_assert!(!r.matches(&glued, 443, Via::Tunnel));
        }

        #[test]
        fn an_exact_rule_matches_one_host(a in domain(), b in domain()) {
            prop_assert_eq!(rule(&a).matches(&Host::Name(b.clone()), 443, Via::Tunnel), a == b);
        }

        #[test]
        fn a_rule_covers_itself_and_coverage_implies_matching(
            a in any_rule(), b in any_rule(), probe in domain(), port in 1u16..,
        ) {
            prop_assert!(a.covers(&a));
            if a.covers(&b) {
                for via in [Via::Tunnel, Via::Http] {
                    let hosts = match &b.host {
                        HostPattern::Exact(h) => vec![h.clone()],
                        HostPattern::Below(d) => vec![Host::Name(format!("{probe}.{d}"))],
                    };
                    for h in hosts {
                        if b.matches(&h, port, via) {
                            prop_assert!(a.matches(&h, port, via), "{} covers {} but not {}:{}", a, b, h, port);
                        }
                    }
                }
            }
        }

        #[test]
        fn host_parsing_never_panics_and_names_stay_valid(s in "\\PC{0,80}") {
            if let Ok(Host::Name(n)) = Host::parse(&s) {
                prop_assert!(n.len() <= MAX_NAME);
                prop_assert!(n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)));
                prop_assert!(!n.ends_with('.') && !n.starts_with('.'));
            }
        }
    }
}
