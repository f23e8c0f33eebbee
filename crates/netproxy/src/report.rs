//! What the proxy saw: every connection a command made through it, allowed or refused and why,
//! with the bytes each carried. It becomes part of the transaction's JSON result and audit
//! entry. Pure data.

use crate::allow::Via;

/// The most connections listed one by one; beyond them only counted (a command looping over
/// connections must not grow the audit log without bound).
pub const MAX_LISTED: usize = 1000;

/// One connection from the sandbox.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Connection {
    /// The host the client asked for (empty if its request did not parse).
    pub host: String,
    pub port: u16,
    pub via: Via,
    /// The connection was made (the allowlist allowed it and the host answered).
    pub allowed: bool,
    /// Why not, for programs: `not-allowed` (not in the allowlist), `non-public` (an allowed
    /// name resolving to an unlisted non-public address), `resolve`, `connect`, `timeout`,
    /// `upstream` (the caller's proxy), `busy`, `bad-request`, `too-large`, `slow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Why not, for people and agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The address connected to (the caller's proxy's, when chained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Chained through the caller's own proxy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upstream: bool,
    /// Bytes from the command to the host, and back (after the request head).
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
}

/// Everything the proxy reports when it stops.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub connections: Vec<Connection>,
    /// Connections beyond [`MAX_LISTED`]: (allowed, refused).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unlisted_allowed: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unlisted_refused: u64,
    /// How the proxy was confined (`landlock: …, seccomp`), or why it could not be.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub confinement: String,
    /// The proxy itself failed (the command then had no network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Report {
    /// Add a connection's record (listed while there is room, counted after).
    pub fn add(&mut self, c: Connection) {
        if self.connections.len() < MAX_LISTED {
            self.connections.push(c);
        } else if c.allowed {
            self.unlisted_allowed += 1;
        } else {
            self.unlisted_refused += 1;
        }
    }

    /// Connections refused or failed with one of `codes`, as `host:port`, each once.
    pub fn hosts_with(&self, codes: &[&str]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let wanted = |c: &Connection| c.code.as_deref().is_some_and(|k| codes.contains(&k));
        for c in self.connections.iter().filter(|c| !c.allowed && !c.host.is_empty() && wanted(c)) {
            let hp = format!("{}:{}", c.host, c.port);
            if !out.contains(&hp) {
                out.push(hp);
            }
        }
        out
    }

    pub fn refused(&self) -> u64 {
        self.connections.iter().filter(|c| !c.allowed).count() as u64 + self.unlisted_refused
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn conn(host: &str, allowed: bool) -> Connection {
        Connection {
            host: host.into(),
            port: 443,
            via: Via::Tunnel,
            allowed,
            code: (!allowed).then(|| "not-allowed".to_string()),
            reason: None,
            address: None,
            upstream: false,
            bytes_up: 1,
            bytes_down: 2,
            duration_ms: 3,
        }
    }

    #[test]
    fn records_are_bounded_and_counted() {
        let mut r = Report::default();
        for i in 0..MAX_LISTED + 5 {
            r.add(conn("a.example", i % 2 == 0));
        }
        assert_eq!(r.connections.len(), MAX_LISTED);
        assert_eq!(r.unlisted_allowed + r.unlisted_refused, 5);
        assert_eq!(r.hosts_with(&["not-allowed"]), vec!["a.example:443".to_string()]);
        assert!(r.hosts_with(&["resolve"]).is_empty());
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&json).unwrap(), r);
    }
}
