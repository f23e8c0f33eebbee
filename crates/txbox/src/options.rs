//! The options of one execution, defined once. [`LimitArgs`] derives clap (the CLI flags of
//! `run`, `exec`, and the operator's ceilings of `serve` and `mcp`), serde (HTTP bodies, MCP tool
//! arguments, the configuration file) and schemars (the MCP tool schema, generated, never
//! written by hand). Every value is checked for its range when it is parsed, by its type, so a
//! front end cannot forget to: a `LimitArgs` that exists is valid.
//!
//! Owns: the option types, their ranges and the narrowing rule ([`LimitArgs::within`]).
//! Touches nothing: no I/O.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize};

use crate::request::Limits;

/// A value out of its range, or not a value of its kind; the message names the option and
/// the accepted range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RangeError(pub String);

/// Seconds of wall-clock or CPU time: a finite number in `(0, MAX_SECONDS]`.
pub const MAX_SECONDS: f64 = 30.0 * 24.0 * 3600.0;

/// A wall-clock duration in seconds, `0 < s <= 30 days` (fractions allowed).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
pub struct Seconds(f64);

impl Seconds {
    pub fn new(s: f64) -> Result<Seconds, RangeError> {
        if s.is_finite() && s > 0.0 && s <= MAX_SECONDS {
            Ok(Seconds(s))
        } else {
            Err(RangeError(format!("timeout must be a number of seconds in (0, {MAX_SECONDS}], not {s:e}")))
        }
    }

    pub fn duration(self) -> Duration {
        // In range by construction: no panic in from_secs_f64.
        Duration::from_secs_f64(self.0)
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

impl FromStr for Seconds {
    type Err = RangeError;
    fn from_str(s: &str) -> Result<Seconds, RangeError> {
        let out_of_range =
            || RangeError(format!("timeout must be a number of seconds in (0, {MAX_SECONDS}], not `{s}`"));
        let v: f64 = s.trim().parse().map_err(|_| out_of_range())?;
        Seconds::new(v).map_err(|_| out_of_range())
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Seconds, D::Error> {
        let v = f64::deserialize(d)?;
        Seconds::new(v).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Seconds {
    fn schema_name() -> Cow<'static, str> {
        "Seconds".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS})
    }
}

/// Whether a bounded quantity is written as a size (`512M`) or a plain count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Count,
}

/// The name and range of one bounded quantity.
pub trait Bound {
    const NAME: &'static str;
    const MIN: u64;
    const MAX: u64;
    const UNIT: Unit;
}

/// A quantity within `B::MIN..=B::MAX`: bytes (a number, or a string with a suffix: `512M`,
/// `2G`, `4GiB`) or a count.
pub struct Bounded<B: Bound>(u64, std::marker::PhantomData<B>);

impl<B: Bound> Bounded<B> {
    pub fn new(v: u64) -> Result<Self, RangeError> {
        if (B::MIN..=B::MAX).contains(&v) {
            Ok(Bounded(v, std::marker::PhantomData))
        } else {
            Err(Self::out_of_range(&v.to_string()))
        }
    }

    pub fn get(&self) -> u64 {
        self.0
    }

    fn show(v: u64) -> String {
        match B::UNIT {
            Unit::Count => v.to_string(),
            Unit::Bytes => crate::size::show_size(v),
        }
    }

    fn range() -> String {
        format!("between {} and {}", Self::show(B::MIN), Self::show(B::MAX))
    }

    fn out_of_range(given: &str) -> RangeError {
        let what = match B::UNIT {
            Unit::Bytes => "a size",
            Unit::Count => "a whole number",
        };
        RangeError(format!("{} must be {what} {}, not `{given}`", B::NAME, Self::range()))
    }
}

// Derives would demand `B: Clone` etc. of the marker.
impl<B: Bound> Clone for Bounded<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Bound> Copy for Bounded<B> {}
impl<B: Bound> PartialEq for Bounded<B> {
    fn eq(&self, o: &Self) -> bool {
        self.0 == o.0
    }
}
impl<B: Bound> fmt::Debug for Bounded<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", B::NAME, self.0)
    }
}
impl<B: Bound> fmt::Display for Bounded<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&Self::show(self.0))
    }
}

impl<B: Bound> FromStr for Bounded<B> {
    type Err = RangeError;
    fn from_str(s: &str) -> Result<Self, RangeError> {
        let v = match B::UNIT {
            Unit::Bytes => crate::size::parse_size(s).map_err(|_| Self::out_of_range(s))?,
            Unit::Count => s.trim().parse::<u64>().map_err(|_| Self::out_of_range(s))?,
        };
        Self::new(v).map_err(|_| Self::out_of_range(s))
    }
}

impl<B: Bound> Serialize for Bounded<B> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de, B: Bound> Deserialize<'de> for Bounded<B> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<B>(std::marker::PhantomData<B>);
        impl<B: Bound> serde::de::Visitor<'_> for V<B> {
            type Value = Bounded<B>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match B::UNIT {
                    Unit::Bytes => write!(f, "{}: a size in bytes, or a string such as \"512M\"", B::NAME),
                    Unit::Count => write!(f, "{}: a whole number", B::NAME),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Bounded<B>, E> {
                Bounded::new(v).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Bounded<B>, E> {
                Err(E::custom(Bounded::<B>::out_of_range(&v.to_string())))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Bounded<B>, E> {
                Err(E::custom(Bounded::<B>::out_of_range(&v.to_string())))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Bounded<B>, E> {
                match B::UNIT {
                    Unit::Bytes => v.parse().map_err(E::custom),
                    Unit::Count => Err(E::invalid_type(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

impl<B: Bound> JsonSchema for Bounded<B> {
    fn schema_name() -> Cow<'static, str> {
        B::NAME.into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        match B::UNIT {
            Unit::Count => json_schema!({"type": "integer", "minimum": B::MIN, "maximum": B::MAX}),
            Unit::Bytes => json_schema!({
                "type": ["integer", "string"],
                "minimum": B::MIN,
                "maximum": B::MAX,
                "pattern": "^[0-9]+ *([KkMmGgTtPp]([iI]?[bB])?|[bB])?$"
            }),
        }
    }
}

macro_rules! bound {
    ($ty:ident, $alias:ident, $name:literal, $unit:ident, $min:expr, $max:expr) => {
        #[derive(Debug)]
        pub struct $ty;
        impl Bound for $ty {
            const NAME: &'static str = $name;
            const MIN: u64 = $min;
            const MAX: u64 = $max;
            const UNIT: Unit = Unit::$unit;
        }
        pub type $alias = Bounded<$ty>;
    };
}

// Below 4 MiB the sandbox's own processes cannot start; the largest values are far beyond any
// machine, there only so that arithmetic on them cannot overflow.
bound!(MemoryBound, Memory, "memory", Bytes, 4 << 20, 1 << 50);
// Stage 2 and the sandbox's init count too: with 3 the command is one process.
bound!(PidsBound, Pids, "pids", Count, 3, 4_194_304);
bound!(CpuBound, CpuSeconds, "cpu", Count, 1, 30 * 24 * 3600);
// Output is held in memory until the command ends.
bound!(OutputBound, MaxOutput, "max_output", Bytes, 1, 1 << 30);
bound!(WriteBound, MaxWrite, "max_write", Bytes, 1, 1 << 50);

/// Network access of the command.
#[derive(clap::ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// A private network namespace with loopback only.
    None,
    /// The host's network.
    Host,
}

// `Isolation` is part of the request (`crate::request`); it is parsed here like every option.
pub use crate::request::Isolation;

/// A plain string enumeration (the variants' documentation is for `--help`; the field's
/// description says the rest).
macro_rules! string_enum_schema {
    ($ty:ident, $($v:literal),+) => {
        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                stringify!($ty).into()
            }
            fn inline_schema() -> bool {
                true
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({"type": "string", "enum": [$($v),+]})
            }
        }
    };
}
string_enum_schema!(Network, "none", "host");
string_enum_schema!(Isolation, "read-committed", "strict");

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read-committed",
            Isolation::Strict => "strict",
        }
    }
}

/// Resource limits and network access of one execution: `run`/`exec` flags, HTTP and MCP
/// request fields, configuration keys, and, given to `serve` or `mcp`, the operator's ceilings.
#[derive(clap::Args, Serialize, Deserialize, JsonSchema, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct LimitArgs {
    /// Wall-clock limit in seconds (up to 30 days); on expiry the whole process tree is killed and every change is rolled back (exit 124).
    #[arg(long, value_name = "SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Seconds>,
    /// Memory limit of the whole process tree (cgroup), in bytes or with a suffix: 512M, 2G (at least 4M); exceeding it kills and rolls back.
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Most processes at once, the sandbox's own two included (cgroup; at least 3).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<Pids>,
    /// CPU time limit in whole seconds per process (RLIMIT_CPU).
    #[arg(long, value_name = "SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuSeconds>,
    /// Output limit per stream (suffixes K, M, G; at most 1G): exceeding it kills and rolls back.
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output: Option<MaxOutput>,
    /// Most bytes the command may write into the workspace view (suffixes K, M, G).
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_write: Option<MaxWrite>,
    /// Network: `none` (the default) gives a private namespace with loopback only; `host` the host's network.
    #[arg(long, value_enum, value_name = "NET")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// No package caches: pip, npm, cargo and go see their default cache locations read-only (by default txbox's own persistent caches are mounted there, outside the transaction).
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_caches: bool,
    /// Hosts the command may reach through txbox's proxy (HTTP and HTTPS, with the proxy variables txbox sets), with network `none`: `host`, `*.domain`, `host:port`, an address, or a preset `@pypi` `@npm` `@crates` `@go` `@github` (from the caller's package manager configuration); each value a comma list. Every connection, allowed or refused, is in the result's `network`.
    #[arg(long = "allow-host", value_name = "SPEC")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<HostItems>>,
}

/// One `--allow-host` value (a comma list of items), checked when parsed; kept as written.
#[derive(Debug, Clone, PartialEq)]
pub struct HostItems {
    text: String,
    specs: Vec<txbox_netproxy::Spec>,
}

impl HostItems {
    pub fn specs(&self) -> &[txbox_netproxy::Spec] {
        &self.specs
    }
}

impl FromStr for HostItems {
    type Err = RangeError;
    fn from_str(s: &str) -> Result<HostItems, RangeError> {
        let specs = txbox_netproxy::allow::parse_specs(s).map_err(|e| RangeError(format!("allow_hosts: {e}")))?;
        Ok(HostItems { text: s.trim().to_string(), specs })
    }
}

impl fmt::Display for HostItems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for HostItems {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for HostItems {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HostItems, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|e: RangeError| serde::de::Error::custom(e.0))
    }
}

impl JsonSchema for HostItems {
    fn schema_name() -> Cow<'static, str> {
        "HostItems".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string"})
    }
}

/// Every item of several `--allow-host` values, each once, in order.
pub fn host_specs(items: &[HostItems]) -> Vec<txbox_netproxy::Spec> {
    let mut out: Vec<txbox_netproxy::Spec> = Vec::new();
    for s in items.iter().flat_map(|i| i.specs.iter()) {
        if !out.contains(s) {
            out.push(s.clone());
        }
    }
    out
}

/// What a preset stands for, for [`LimitArgs::within_expanding`]: its rules, or `None` when it
/// cannot be told here (then a preset asked for must be named by the ceiling itself).
pub type Expand<'a> = &'a dyn Fn(txbox_netproxy::Preset) -> Option<Vec<txbox_netproxy::Rule>>;

/// The allowlist asked for under the ceiling's: absent asks for the ceiling's; each item asked
/// for must be one the ceiling names, or lie within it (a host under its `*.domain`, a port
/// its `host:*` allows, a preset whose every host it allows). No ceiling is no network.
fn narrow_hosts(
    asked: Option<&Vec<HostItems>>,
    ceiling: Option<&Vec<HostItems>>,
    expand: Expand<'_>,
) -> Result<Option<Vec<HostItems>>, Exceeds> {
    use txbox_netproxy::{Allowlist, Spec};
    let Some(asked) = asked else { return Ok(ceiling.cloned()) };
    let limit_specs = host_specs(ceiling.map_or(&[][..], Vec::as_slice));
    let shown = if limit_specs.is_empty() {
        "none (the network is off)".to_string()
    } else {
        limit_specs.iter().map(Spec::to_string).collect::<Vec<_>>().join(",")
    };
    let mut limit: Option<Allowlist> = None;
    for spec in host_specs(asked) {
        if limit_specs.contains(&spec) {
            continue;
        }
        let exceeds = |item: String| Exceeds { what: "allow_hosts", asked: item, ceiling: shown.clone() };
        if limit_specs.is_empty() {
            return Err(exceeds(spec.to_string()));
        }
        let rules = match &spec {
            Spec::Rule(r) => vec![r.clone()],
            Spec::Preset(p) => expand(*p).ok_or_else(|| exceeds(spec.to_string()))?,
        };
        let limit = limit.get_or_insert_with(|| {
            Allowlist::new(limit_specs.iter().flat_map(|s| match s {
                Spec::Rule(r) => vec![r.clone()],
                Spec::Preset(p) => expand(*p).unwrap_or_default(),
            }))
        });
        if let Some(r) = rules.iter().find(|r| !limit.covers(r)) {
            let item = if matches!(spec, Spec::Preset(_)) { format!("{spec} ({r})") } else { spec.to_string() };
            return Err(exceeds(item));
        }
    }
    Ok(Some(asked.clone()))
}

/// A request that asks for more than the operator's ceiling allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {asked} exceeds the operator's ceiling of {ceiling} (set with `txbox serve`/`txbox mcp` flags or the configuration file)")]
pub struct Exceeds {
    pub what: &'static str,
    pub asked: String,
    pub ceiling: String,
}

/// One limit under its ceiling: absent asks for the ceiling; more than it is refused.
fn narrow<T: Copy + fmt::Display>(
    what: &'static str,
    asked: Option<T>,
    ceiling: Option<T>,
    le: impl Fn(&T, &T) -> bool,
) -> Result<Option<T>, Exceeds> {
    match (asked, ceiling) {
        (None, c) => Ok(c),
        (Some(a), None) => Ok(Some(a)),
        (Some(a), Some(c)) if le(&a, &c) => Ok(Some(a)),
        (Some(a), Some(c)) => Err(Exceeds { what, asked: a.to_string(), ceiling: c.to_string() }),
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Network::None => "none",
            Network::Host => "host",
        })
    }
}

impl LimitArgs {
    /// These limits as asked, under `ceiling` (the operator's): a limit not asked for is the
    /// ceiling's; one above it is refused; network `host` needs a ceiling of `host`.
    /// The allowlist narrows too: presets only as the ceiling names them (no I/O here; see
    /// [`within_expanding`](Self::within_expanding)).
    pub fn within(&self, ceiling: &LimitArgs) -> Result<LimitArgs, Exceeds> {
        self.within_expanding(ceiling, &|_| None)
    }

    /// [`within`](Self::within), with presets expanded by `expand` to compare them by host.
    pub fn within_expanding(&self, ceiling: &LimitArgs, expand: Expand<'_>) -> Result<LimitArgs, Exceeds> {
        let by_value = |a: &u64, c: &u64| a <= c;
        let net_ceiling = ceiling.network.unwrap_or(Network::None);
        let network = match self.network {
            Some(n) if n > net_ceiling => {
                return Err(Exceeds { what: "network", asked: n.to_string(), ceiling: net_ceiling.to_string() })
            }
            Some(n) => Some(n),
            None => ceiling.network,
        };
        Ok(LimitArgs {
            timeout: narrow("timeout", self.timeout, ceiling.timeout, |a, c| a.get() <= c.get())?,
            memory: narrow("memory", self.memory, ceiling.memory, |a, c| by_value(&a.get(), &c.get()))?,
            pids: narrow("pids", self.pids, ceiling.pids, |a, c| by_value(&a.get(), &c.get()))?,
            cpu: narrow("cpu", self.cpu, ceiling.cpu, |a, c| by_value(&a.get(), &c.get()))?,
            max_output: narrow("max_output", self.max_output, ceiling.max_output, |a, c| by_value(&a.get(), &c.get()))?,
            max_write: narrow("max_write", self.max_write, ceiling.max_write, |a, c| by_value(&a.get(), &c.get()))?,
            allow_hosts: narrow_hosts(self.allow_hosts.as_ref(), ceiling.allow_hosts.as_ref(), expand)?,
            network,
            // Without caches only narrows: the operator's `no_caches` holds for every request.
            no_caches: self.no_caches || ceiling.no_caches,
        })
    }

    /// Values given here win over `fallback`'s (flags over the configuration file).
    pub fn or(&self, fallback: &LimitArgs) -> LimitArgs {
        LimitArgs {
            timeout: self.timeout.or(fallback.timeout),
            memory: self.memory.or(fallback.memory),
            pids: self.pids.or(fallback.pids),
            cpu: self.cpu.or(fallback.cpu),
            max_output: self.max_output.or(fallback.max_output),
            max_write: self.max_write.or(fallback.max_write),
            network: self.network.or(fallback.network),
            no_caches: self.no_caches || fallback.no_caches,
            allow_hosts: self.allow_hosts.clone().or_else(|| fallback.allow_hosts.clone()),
        }
    }

    /// What the engine enforces.
    pub fn to_limits(&self) -> Limits {
        Limits {
            timeout: self.timeout.map(Seconds::duration),
            memory: self.memory.map(|m| m.get()),
            pids: self.pids.map(|p| p.get()),
            cpu_seconds: self.cpu.map(|c| c.get()),
            max_output: self.max_output.map(|m| m.get()),
            max_write: self.max_write.map(|m| m.get()),
            host_network: self.network == Some(Network::Host),
            caches: !self.no_caches,
            // With the host's network there is nothing to allow.
            allow_hosts: match self.network {
                Some(Network::Host) => Vec::new(),
                _ => host_specs(self.allow_hosts.as_deref().unwrap_or_default()),
            },
            hide: Vec::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_numeric_option_refuses_zero_negative_huge_nan_inf_and_garbage() {
        for bad in ["0", "-1", "-0.5", "1e308", "NaN", "inf", "-inf", "", "abc", "1e", "99999999999999999999999"] {
            assert!(bad.parse::<Seconds>().is_err(), "timeout {bad}");
            assert!(bad.parse::<CpuSeconds>().is_err(), "cpu {bad}");
            assert!(bad.parse::<Pids>().is_err(), "pids {bad}");
            assert!(bad.parse::<Memory>().is_err(), "memory {bad}");
            assert!(bad.parse::<MaxOutput>().is_err(), "max_output {bad}");
            assert!(bad.parse::<MaxWrite>().is_err(), "max_write {bad}");
        }
        for bad in ["1K", "1M", "2P", "99999999T"] {
            assert!(bad.parse::<Memory>().is_err(), "memory {bad}");
        }
        assert!("2G".parse::<MaxOutput>().is_err());
        assert!("2".parse::<Pids>().is_err());
        let e = "1e308".parse::<Seconds>().unwrap_err().0;
        assert!(e.contains("(0, 2592000]"), "{e}");
        let e = "1K".parse::<Memory>().unwrap_err().0;
        assert!(e.contains("memory") && e.contains("between 4M and 1P"), "{e}");
    }

    #[test]
    fn good_values_parse() {
        assert_eq!("0.5".parse::<Seconds>().map(Seconds::duration), Ok(Duration::from_millis(500)));
        assert_eq!("2G".parse::<Memory>().map(|m| m.get()), Ok(2 << 30));
        assert_eq!("3".parse::<Pids>().map(|m| m.get()), Ok(3));
        assert_eq!("1".parse::<MaxWrite>().map(|m| m.get()), Ok(1));
    }

    #[test]
    fn json_wrong_types_and_ranges_are_errors() {
        let bad = [
            r#"{"timeout": "10"}"#,
            r#"{"timeout": -1}"#,
            r#"{"timeout": 0}"#,
            r#"{"timeout": 1e308}"#,
            r#"{"timeout": true}"#,
            r#"{"memory": 0}"#,
            r#"{"memory": -5}"#,
            r#"{"memory": 1.5}"#,
            r#"{"memory": "1K"}"#,
            r#"{"memory": [1]}"#,
            r#"{"pids": "8"}"#,
            r#"{"pids": 1}"#,
            r#"{"pids": 18446744073709551615}"#,
            r#"{"cpu": 0}"#,
            r#"{"max_output": 0}"#,
            r#"{"max_write": {}}"#,
            r#"{"network": "all"}"#,
            r#"{"network": 1}"#,
        ];
        for b in bad {
            assert!(serde_json::from_str::<LimitArgs>(b).is_err(), "{b}");
        }
        let ok: LimitArgs =
            serde_json::from_str(r#"{"timeout": 1.5, "memory": "512M", "pids": 64, "network": "host"}"#)
                .unwrap_or_default();
        assert_eq!(ok.memory.map(|m| m.get()), Some(512 << 20));
        assert_eq!(ok.network, Some(Network::Host));
    }

    #[test]
    fn requests_narrow_the_ceiling_never_widen_it() {
        let ceiling: LimitArgs = serde_json::from_str(r#"{"timeout": 60, "memory": "1G"}"#).unwrap_or_default();
        let asked: LimitArgs = serde_json::from_str(r#"{"timeout": 10}"#).unwrap_or_default();
        let got = asked.within(&ceiling).unwrap_or_default();
        assert_eq!(got.timeout.map(Seconds::get), Some(10.0));
        assert_eq!(got.memory.map(|m| m.get()), Some(1 << 30), "the ceiling applies when nothing is asked");
        let more: LimitArgs = serde_json::from_str(r#"{"timeout": 61}"#).unwrap_or_default();
        let e = more.within(&ceiling).unwrap_err();
        assert_eq!(e.what, "timeout");
        let host: LimitArgs = serde_json::from_str(r#"{"network": "host"}"#).unwrap_or_default();
        assert_eq!(host.within(&ceiling).unwrap_err().what, "network");
        let open = LimitArgs { network: Some(Network::Host), ..LimitArgs::default() };
        assert_eq!(host.within(&open).map(|l| l.network), Ok(Some(Network::Host)));
        let none: LimitArgs = serde_json::from_str(r#"{"network": "none"}"#).unwrap_or_default();
        assert_eq!(none.within(&open).map(|l| l.network), Ok(Some(Network::None)));
    }

    #[test]
    fn an_allowlist_asked_for_only_narrows_the_ceiling() {
        let items = |v: &[&str]| Some(v.iter().map(|s| s.parse::<HostItems>().unwrap()).collect::<Vec<_>>());
        let args = |v: &[&str]| LimitArgs { allow_hosts: items(v), ..LimitArgs::default() };
        let ceiling = args(&["*.example.com", "reg.example:8080"]);
        assert_eq!(
            LimitArgs::default().within(&ceiling).unwrap().allow_hosts,
            ceiling.allow_hosts,
            "absent: the ceiling"
        );
        let asked = |v: &[&str]| args(v).within(&ceiling);
        assert_eq!(asked(&["a.example.com", "reg.example:8080"]).unwrap().to_limits().allow_hosts.len(), 2);
        assert!(asked(&[]).unwrap().to_limits().allow_hosts.is_empty(), "asking for nothing turns the network off");
        for wider in ["example.com", "evil.example", "reg.example", "reg.example:*", "*.com", "127.0.0.1", "@npm"] {
            let e = asked(&[wider]).unwrap_err();
            assert_eq!(e.what, "allow_hosts", "{wider}");
            assert!(e.to_string().contains(wider.trim_start_matches('@')), "{wider}: {e}");
        }
        let e = args(&["a.example"]).within(&LimitArgs::default()).unwrap_err();
        assert!(e.to_string().contains("the network is off"), "{e}");
        // Presets: named by the ceiling, or, expanded, within it.
        let pypi = args(&["@pypi"]);
        assert!(pypi.within(&pypi).is_ok());
        assert!(pypi.within(&ceiling).is_err(), "a preset that cannot be expanded here is not assumed inside");
        let expand = |_| Some(vec!["files.example.com".parse::<txbox_netproxy::Rule>().unwrap()]);
        assert!(pypi.within_expanding(&ceiling, &expand).is_ok());
        let outside = |_| Some(vec!["files.example.net".parse::<txbox_netproxy::Rule>().unwrap()]);
        assert!(pypi.within_expanding(&ceiling, &outside).unwrap_err().asked.contains("files.example.net"));
        let host = args(&["files.example.com"]);
        assert!(host.within_expanding(&pypi, &expand).is_ok());
        assert!(host.within(&pypi).is_err());
        // With the host's network there is nothing to allow; flags win over the configuration.
        let both = LimitArgs { network: Some(Network::Host), ..args(&["a.example"]) };
        assert!(both.to_limits().allow_hosts.is_empty());
        assert_eq!(args(&["b.example"]).or(&args(&["a.example"])).allow_hosts, items(&["b.example"]));
        assert_eq!(LimitArgs::default().or(&args(&["a.example"])).allow_hosts, items(&["a.example"]));
    }

    #[test]
    fn allow_host_values_are_checked_when_parsed() {
        for bad in ["", "*", "a b", "@nope", "ftp://a.example/", "a.example:0", "a.example:99999"] {
            assert!(bad.parse::<HostItems>().is_err(), "{bad}");
            assert!(serde_json::from_str::<LimitArgs>(&format!("{{\"allow_hosts\": [{bad:?}]}}")).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<LimitArgs>(r#"{"allow_hosts": "a.example"}"#).is_err(), "a list, not a string");
        let ok: LimitArgs = serde_json::from_str(r#"{"allow_hosts": ["a.example, *.b.example", "@pypi"]}"#).unwrap();
        assert_eq!(ok.to_limits().allow_hosts.len(), 3);
    }
}
