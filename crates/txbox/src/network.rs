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
use txbox_netproxy::preset::Expansion;
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
/// cached in the state base directory `base`). Returns the plan and what to say about presets.
pub fn plan(host_network: bool, specs: &[Spec], base: Option<&Path>) -> (Plan, Expansion) {
    if host_network || specs.is_empty() {
        return (if host_network { Plan::Host } else { Plan::Off }, Expansion::default());
    }
    let mut x = txbox_netproxy::preset::expand(specs, base);
    let allow = std::mem::take(&mut x.allow);
    (if allow.is_empty() { Plan::Off } else { Plan::Allow(allow) }, x)
}

/// What can fail in giving a command its network.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// An `allow_hosts` item of the policy file or of the session does not parse.
    #[error("{0} (in the policy file or the session)")]
    PolicyHosts(#[source] txbox_netproxy::SpecError),
    /// The proxy and its broker could not be started.
    #[error("starting the network proxy: {0}")]
    Start(#[source] std::io::Error),
}

/// The limits a command runs with, its network items completed: the request's, the policy
/// file's `allow_hosts`, and `more` (a session's, from `begin`).
pub fn with_policy_hosts(
    limits: &crate::request::Limits,
    policy: &txbox_policy::Policy,
    more: &[String],
) -> Result<crate::request::Limits, NetworkError> {
    let mut l = limits.clone();
    let extra: Vec<&String> = policy.allow_hosts().iter().chain(more).collect();
    if extra.is_empty() || l.host_network {
        return Ok(l);
    }
    for s in txbox_netproxy::allow::parse_all(&extra).map_err(NetworkError::PolicyHosts)? {
        if !l.allow_hosts.contains(&s) {
            l.allow_hosts.push(s);
        }
    }
    Ok(l)
}

/// The rules a preset stands for here (from the caller's package managers, cached in the
/// state base directory `base`); none when it cannot be derived.
pub fn preset_rules(preset: txbox_netproxy::Preset, base: Option<&Path>) -> Vec<txbox_netproxy::Rule> {
    txbox_netproxy::preset::expand(&[Spec::Preset(preset)], base).allow.rules().to_vec()
}

/// The rule id of a denial for a visible network target.
pub const RULE: &str = "network.allowlist";

/// Deny, before it runs, a command whose program connects to what it names
/// (`txbox_netproxy::targets`) and that names, in a URL of its words, a host its network does
/// not reach. None: nothing visible, or everything visible is allowed (or loopback, the
/// sandbox's own). A preset that cannot be expanded is left for the run to report.
pub fn visible_denial(
    commands: &[Vec<String>],
    host_network: bool,
    specs: &[Spec],
    base: Option<&Path>,
) -> Option<txbox_policy::Decision> {
    if host_network {
        return None;
    }
    let named: Vec<(&str, txbox_netproxy::targets::Target)> = commands
        .iter()
        .flat_map(|argv| {
            let program = argv.first().map(String::as_str).unwrap_or("");
            txbox_netproxy::targets::in_commands(std::slice::from_ref(argv)).into_iter().map(move |t| (program, t))
        })
        .collect();
    if named.is_empty() {
        return None;
    }
    let allow = match plan(false, specs, base).0 {
        Plan::Allow(a) => a,
        _ => Allowlist::default(),
    };
    let (program, t) = named.into_iter().find(|(_, t)| !allow.allows(&t.host, t.port, t.via))?;
    let item = if t.port == t.via.default_port() { t.host.to_string() } else { format!("{}:{}", t.host, t.port) };
    let why = if allow.is_empty() {
        "network is off for this command".to_string()
    } else {
        format!("{}:{} is not in this command's allowlist", t.host, t.port)
    };
    Some(txbox_policy::Decision {
        action: txbox_policy::Action::Deny,
        rule: Some(RULE.to_string()),
        reason: format!("`{program}` would reach {}, but {why}; allow hosts with --allow-host {item}", t.url),
    })
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
    pub fn start(plan: Plan, exe: &Path, spec: &mut SandboxSpec) -> Result<Session, NetworkError> {
        let running = match &plan {
            Plan::Allow(allow) => {
                let config = txbox_netproxy::Config {
                    allow: allow.clone(),
                    upstream: txbox_netproxy::upstream::Upstream::from_env(|k| std::env::var(k).ok()),
                    limits: Default::default(),
                };
                let running = txbox_netproxy::start(exe, &config).map_err(NetworkError::Start)?;
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
    pub fn finish(self, attempts: u64, expansion: Expansion) -> Option<Summary> {
        let report = self.running.map(txbox_netproxy::Running::finish);
        let mut summary = summarize(&self.plan, report, attempts);
        if expansion.notes.is_empty() && expansion.failed.is_empty() {
            return summary;
        }
        let s = summary.get_or_insert_with(|| Summary::off(0, None));
        if !expansion.failed.is_empty() {
            let failed = format!("txbox: no hosts from {}", expansion.failed.join("; "));
            s.hint = Some(match s.hint.take() {
                Some(h) => format!("{h}\n{failed}"),
                None => failed,
            });
        }
        s.notes = expansion.notes.into_iter().chain(expansion.failed).collect();
        summary
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

impl Summary {
    fn off(attempts: u64, hint: Option<String>) -> Summary {
        Summary {
            mode: "off",
            allow: Vec::new(),
            connections: Vec::new(),
            unlisted: 0,
            direct_attempts: attempts,
            hint,
            proxy: String::new(),
            notes: Vec::new(),
            error: None,
        }
    }
}

const PRESETS: &str = "@pypi, @npm, @crates, @go, @github";

/// The summary of a run, None when there is nothing to say (the network was off and the command
/// did not try it, or it had the host's).
pub fn summarize(plan: &Plan, report: Option<Report>, attempts: u64) -> Option<Summary> {
    match plan {
        Plan::Host => None,
        Plan::Off if attempts == 0 => None,
        Plan::Off => Some(Summary::off(
            attempts,
            Some(format!(
                "txbox: the command tried to reach the network, but network is off for this command; \
                 allow hosts with --allow-host HOST (or a preset: {PRESETS})"
            )),
        )),
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
    fn visible_targets_outside_the_list_are_denied_before_running() {
        let cmd = |words: &[&str]| vec![words.iter().map(|w| w.to_string()).collect::<Vec<_>>()];
        let specs = txbox_netproxy::allow::parse_all(&["a.example"]).unwrap();
        let d = visible_denial(&cmd(&["curl", "-fsSL", "https://b.example/x.sh"]), false, &specs, None).unwrap();
        assert_eq!(d.rule.as_deref(), Some(RULE));
        assert!(
            d.reason.contains("`curl` would reach https://b.example") && d.reason.ends_with("--allow-host b.example"),
            "{}",
            d.reason
        );
        assert!(visible_denial(&cmd(&["curl", "https://a.example/x"]), false, &specs, None).is_none());
        assert!(visible_denial(&cmd(&["curl", "http://localhost:8000/"]), false, &[], None).is_none());
        assert!(visible_denial(&cmd(&["curl", "https://b.example/"]), true, &[], None).is_none());
        let d = visible_denial(
            &cmd(&["pip", "install", "--index-url", "http://b.example:8080/simple", "x"]),
            false,
            &[],
            None,
        )
        .unwrap();
        assert!(
            d.reason.contains("network is off") && d.reason.ends_with("--allow-host b.example:8080"),
            "{}",
            d.reason
        );
        assert!(visible_denial(&cmd(&["ls", "-la"]), false, &[], None).is_none());
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
