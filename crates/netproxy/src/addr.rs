//! Which addresses are public. An allowed *name* that resolves to anything else (loopback,
//! link-local such as the cloud metadata service, private ranges, documentation, multicast…)
//! is refused unless the address itself is listed: a host name in an allowlist means "that
//! service on the internet", never "whatever the DNS answer says, including this machine's own
//! services" (DNS rebinding). Pure.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `ip` is an ordinary public unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(a) => is_public_v4(a),
        IpAddr::V6(a) => is_public_v6(a),
    }
}

/// IPv4 ranges that are not public unicast (IANA special-purpose registry, RFC 6890 and
/// successors), as (network, prefix length).
const V4_SPECIAL: [([u8; 4], u8); 17] = [
    ([0, 0, 0, 0], 8),       // "this network"
    ([10, 0, 0, 0], 8),      // private
    ([100, 64, 0, 0], 10),   // carrier-grade NAT
    ([127, 0, 0, 0], 8),     // loopback
    ([169, 254, 0, 0], 16),  // link-local: cloud metadata services live here
    ([172, 16, 0, 0], 12),   // private
    ([192, 0, 0, 0], 24),    // IETF protocol assignments
    ([192, 0, 2, 0], 24),    // documentation
    ([192, 31, 196, 0], 24), // AS112
    ([192, 52, 193, 0], 24), // AMT
    ([192, 88, 99, 0], 24),  // deprecated 6to4 relays
    ([192, 168, 0, 0], 16),  // private
    ([198, 18, 0, 0], 15),   // benchmarking
    ([198, 51, 100, 0], 24), // documentation
    ([203, 0, 113, 0], 24),  // documentation
    ([224, 0, 0, 0], 4),     // multicast
    ([240, 0, 0, 0], 4),     // reserved, and the broadcast address
];

fn in_v4(a: Ipv4Addr, net: [u8; 4], len: u8) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
    u32::from(a) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn is_public_v4(a: Ipv4Addr) -> bool {
    !V4_SPECIAL.iter().any(|(net, len)| in_v4(a, *net, *len))
}

fn in_v6(a: Ipv6Addr, net: [u16; 8], len: u8) -> bool {
    let mask = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
    u128::from(a) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

/// The IPv4 address embedded in the last 32 bits.
fn low_v4(a: Ipv6Addr) -> Ipv4Addr {
    Ipv4Addr::from((u128::from(a) & 0xffff_ffff) as u32)
}

fn is_public_v6(a: Ipv6Addr) -> bool {
    // Translation prefixes carry an IPv4 address: public only if that one is.
    if in_v6(a, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) || in_v6(a, [0, 0, 0, 0, 0, 0, 0, 0], 96) {
        return !a.is_unspecified() && a != Ipv6Addr::LOCALHOST && is_public_v4(low_v4(a));
    }
    if in_v6(a, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        let [_, hi, lo, ..] = a.segments();
        return is_public_v4(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    }
    const SPECIAL: [([u16; 8], u8); 10] = [
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),  // local-use translation
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64),      // discard
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),     // IETF protocol assignments (Teredo, ORCHID, …)
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), // documentation
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),     // documentation
        ([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16),     // segment routing
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),      // unique local
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),     // link-local
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),     // site-local (deprecated)
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),      // multicast
    ];
    // Global unicast is 2000::/3; everything else is unassigned or special.
    in_v6(a, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3) && !SPECIAL.iter().any(|(net, len)| in_v6(a, *net, *len))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn public(s: &str) -> bool {
        is_public(s.parse().unwrap())
    }

    #[test]
    fn loopback_link_local_private_and_special_are_not_public() {
        for s in [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "10.1.2.3",
            "100.64.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "192.0.2.1",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2001:db8::1",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "fec0::1",
            "1::",
        ] {
            assert!(!public(s), "{s} must not be public");
        }
    }

    #[test]
    fn ordinary_internet_addresses_are_public() {
        for s in
            ["1.1.1.1", "8.8.8.8", "172.32.0.1", "100.128.0.1", "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::"]
        {
            assert!(public(s), "{s} must be public");
        }
    }
}
