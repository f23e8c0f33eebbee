//! Network by allowlist for one command (issue #15): the `--allow-host` items expanded (presets
//! from the caller's package managers), the proxy started for the command and given to its
//! sandbox, and what the result and the audit entry say afterwards.
//!
//! Three modes: `host` (the host's network, nothing watched), `allowlist` (a network namespace
//! with loopback only, and a confined proxy outside it reached through a listener on
//! `127.0.0.1:3128` inside: [`txbox_netproxy`]), `off` (loopback only; attempts to reach the
//! network are counted, and the result says how to allow hosts).

use std::os::fd::AsRawFd;
use std::path::Path;

use serde::Serialize;
use txbox_netproxy::{Allowlist, Connection, Report, Spec};
use txbox_sandbox::SandboxSpec;

/// The port of the proxy inside the sandbox's network namespace.
pub const PROXY_PORT: u16 = 3128;

/// What a command may reach, resolved before it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Host,
    Off,
    Allow(Allowlist),
}

/// Expand `specs` (presets from the caller's configuration, see `txbox_netproxy::preset`,
/// cached in the state base directory `base`). Returns the plan and notes about presets.
pub fn plan(host_network: bool, specs: &[Spec], base: Option<&Path>) -> Result<(Plan, Vec<String>), String> {
    if host_network {
        return Ok((Plan::Host, Vec::new()));
    }
    if specs.is_empty() {
        return Ok((Plan::Off, Vec::new()));
    }
    let (allow, notes) = txbox_netproxy::preset::expand(specs, base).map_err(|e| e.to_string())?;
    Ok((if allow.is_empty() { Plan::Off } else { Plan::Allow(allow) }, notes))
}

/// The proxy variables a command gets: every spelling the usual tools read.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let local = "localhost,127.0.0.1,::1".to_string();
    let mut v: Vec<(String, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "npm_config_proxy",
        "npm_config_https_proxy",
        "CARGO_HTTP_PROXY",
    ]
    .iter()
    .map(|k| (k.to_string(), url.clone()))
    .collect();
    v.push(("NO_PROXY".into(), local.clone()));
    v.push(("no_proxy".into(), local.clone()));
    v.push(("npm_config_noproxy".into(), local));
    v
}

/// The proxy of one command, while it runs.
pub struct Session {
    running: Option<txbox_netproxy::Running>,
    plan: Plan,
}

impl Session {
    /// Start what `plan` needs and fill in the sandbox's side of it.
    pub fn start(plan: Plan, exe: &Path, spec: &mut SandboxSpec) -> Result<Session, String> {
        let running = match &plan {
            Plan::Allow(allow) => {
                let config = txbox_netproxy::Config {
                    allow: allow.clone(),
                    upstream: txbox_netproxy::upstream::Upstream::from_env(|k| std::env::var(k).ok()),
                    limits: Default::default(),
                };
                let running =
                    txbox_netproxy::start(exe, &config).map_err(|e| format!("starting the network proxy: {e}"))?;
                spec.proxy_port = Some(PROXY_PORT);
                spec.env.extend(proxy_env(PROXY_PORT).into_iter().map(|(k, v)| format!("{k}={v}").into()));
                Some(running)
            }
            Plan::Off | Plan::Host => None,
        };
        Ok(Session { running, plan })
    }

    /// The hand-off socket for stage 2 (`LaunchOptions::net_handoff`).
    pub fn handoff(&self) -> Option<std::os::fd::RawFd> {
        self.running.as_ref().and_then(|r| r.sandbox_end()).map(|fd| fd.as_raw_fd())
    }

    /// The command is over: stop the proxy and say what happened.
    pub fn finish(self, attempts: u64) -> Option<Summary> {
        let report = self.running.map(txbox_netproxy::Running::finish);
        summarize(&self.plan, report, attempts)
    }
}

/// The `network` object of a result and an audit entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// `off` or `allowlist`.
    pub mode: &'static str,
    /// The allowlist, presets expanded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Every connection through the proxy, allowed or refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<Connection>,
    /// Connections beyond the listed ones (`txbox_netproxy::report::MAX_LISTED`).
    #[serde(skip_serializing_if = "is_zero")]
    pub unlisted: u64,
    /// Attempts to reach the network around the proxy (names resolved, addresses dialled):
    /// they fail, there being no route.
    #[serde(skip_serializing_if = "is_zero")]
    pub direct_attempts: u64,
    /// What to do about refusals, for people and agents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// How the proxy was confined.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub proxy: String,
    /// What to know about the presets used (e.g. hosts they cannot cover).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The proxy failed (the command then had no network).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

const PRESETS: &str = "@pypi, @npm, @crates, @go, @github";

/// The summary of a run, None when there is nothing to say (the network was off and the command
/// did not try it, or it had the host's).
pub fn summarize(plan: &Plan, report: Option<Report>, attempts: u64) -> Option<Summary> {
    match plan {
        Plan::Host => None,
        Plan::Off if attempts == 0 => None,
        Plan::Off => Some(Summary {
            mode: "off",
            allow: Vec::new(),
            connections: Vec::new(),
            unlisted: 0,
            direct_attempts: attempts,
            hint: Some(format!(
                "txbox: the command tried to reach the network, but network is off for this command; \
                 allow hosts with --allow-host HOST (or a preset: {PRESETS})"
            )),
            proxy: String::new(),
            notes: Vec::new(),
            error: None,
        }),
        Plan::Allow(allow) => {
            let report = report.unwrap_or_default();
            let hint = allowlist_hint(&report, attempts);
            Some(Summary {
                mode: "allowlist",
                allow: allow.to_specs(),
                unlisted: report.unlisted_allowed + report.unlisted_refused,
                connections: report.connections,
                direct_attempts: attempts,
                hint,
                proxy: report.confinement,
                notes: Vec::new(),
                error: report.error,
            })
        }
    }
}

/// What to say after a run with an allowlist: which hosts were refused and how to allow them,
/// which could not be reached, and attempts around the proxy.
fn allowlist_hint(report: &Report, attempts: u64) -> Option<String> {
    let mut parts = Vec::new();
    let refused = report.hosts_with(&["not-allowed"]);
    if !refused.is_empty() {
        let items: Vec<String> = refused
            .iter()
            .map(|hp| hp.strip_suffix(":443").or_else(|| hp.strip_suffix(":80")).unwrap_or(hp).to_string())
            .collect();
        parts.push(format!(
            "refused {} (not in this command's allowlist); allow hosts with --allow-host {}",
            refused.join(", "),
            items.join(",")
        ));
    }
    let private = report.hosts_with(&["non-public"]);
    if !private.is_empty() {
        parts.push(format!(
            "refused {} (the name resolves to a non-public address; list that address to allow it: see `network.connections`)",
            private.join(", ")
        ));
    }
    let failed = report.hosts_with(&["resolve", "connect", "timeout", "upstream"]);
    if !failed.is_empty() {
        parts.push(format!("could not reach {} (see `network.connections`)", failed.join(", ")));
    }
    if attempts > 0 {
        parts.push(format!(
            "the command tried {attempts} time(s) to reach the network around the proxy, which fails: this command \
             reaches its allowlist through HTTPS_PROXY/HTTP_PROXY only"
        ));
    }
    if report.error.is_some() {
        parts.push("the proxy failed (see `network.error`): the command had no network".to_string());
    }
    (!parts.is_empty()).then(|| format!("txbox: {}", parts.join("; ")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use txbox_netproxy::{Rule, Via};

    #[test]
    fn nothing_to_say_without_network_use() {
        assert_eq!(summarize(&Plan::Off, None, 0), None);
        assert_eq!(summarize(&Plan::Host, None, 5), None);
        let s = summarize(&Plan::Off, None, 2).unwrap();
        assert!(s.hint.unwrap().contains("network is off for this command; allow hosts with --allow-host"));
    }

    #[test]
    fn refusals_become_a_hint_naming_the_hosts() {
        let allow = Allowlist::new([Rule::parse("a.example").unwrap()]);
        let mut report = Report::default();
        for (host, port) in [("b.example", 443), ("c.example", 8080), ("b.example", 443)] {
            report.add(Connection {
                host: host.into(),
                port,
                via: Via::Tunnel,
                allowed: false,
                code: Some("not-allowed".into()),
                reason: Some("no".into()),
                address: None,
                upstream: false,
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 0,
            });
        }
        let s = summarize(&Plan::Allow(allow), Some(report), 0).unwrap();
        let hint = s.hint.unwrap();
        assert!(hint.contains("refused b.example:443, c.example:8080"), "{hint}");
        assert!(hint.ends_with("--allow-host b.example,c.example:8080"), "{hint}");
        assert_eq!(s.allow, vec!["a.example".to_string()]);
    }

    #[test]
    fn the_proxy_variables_point_at_the_listener() {
        let env = proxy_env(3128);
        for k in
            ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "CARGO_HTTP_PROXY", "npm_config_https_proxy"]
        {
            assert!(env.iter().any(|(n, v)| n == k && v == "http://127.0.0.1:3128"), "{k}");
        }
        assert!(env.iter().any(|(n, v)| n == "NO_PROXY" && v.contains("127.0.0.1")));
    }
}
