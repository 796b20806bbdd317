//! Resolve the RoCE v2 GID for an interface's IPv4 from the HCA's GID table — never a fixed
//! index: the index differs per node and drifts on reboot and link events (reference-kit.md
//! E.7), and an all-zero GID dies ~60 s into boot with `ibv_modify_qp` errno 61 (A.3 step 4).

use std::net::Ipv4Addr;

use super::facts::GidEntry;

/// The verdict over a GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GidResolution {
    /// The RoCE v2 entry for the IPv4.
    Found { port: u32, index: u32 },
    /// No table, or every entry is all-zero.
    AllZero,
    /// Only IPv6 GIDs (no IPv4-mapped entry at all).
    Ipv6Only,
    /// The IPv4-mapped GID exists, but only as RoCE v1.
    RoceV1Only { index: u32 },
    /// IPv4-mapped GIDs exist, for other addresses.
    OtherIpv4 { found: Vec<Ipv4Addr> },
}

/// The IPv4 address an IPv4-mapped GID (`0000:…:ffff:c0a8:640a`) carries.
#[must_use]
pub fn mapped_ipv4(gid: &str) -> Option<Ipv4Addr> {
    let groups: Vec<u16> = gid.split(':').map(|g| u16::from_str_radix(g, 16).ok()).collect::<Option<_>>()?;
    if groups.len() != 8 || groups[..5].iter().any(|&g| g != 0) || groups[5] != 0xffff {
        return None;
    }
    let [a, b] = groups[6].to_be_bytes();
    let [c, d] = groups[7].to_be_bytes();
    Some(Ipv4Addr::new(a, b, c, d))
}

fn is_zero(gid: &str) -> bool {
    gid.chars().all(|c| c == '0' || c == ':')
}

/// Find the RoCE v2 GID carrying `ipv4`.
#[must_use]
pub fn resolve(entries: &[GidEntry], ipv4: Ipv4Addr) -> GidResolution {
    let live: Vec<&GidEntry> = entries.iter().filter(|e| !is_zero(&e.gid)).collect();
    if live.is_empty() {
        return GidResolution::AllZero;
    }
    let mine: Vec<&&GidEntry> = live.iter().filter(|e| mapped_ipv4(&e.gid) == Some(ipv4)).collect();
    if let Some(e) = mine.iter().find(|e| e.kind.eq_ignore_ascii_case("RoCE v2")) {
        return GidResolution::Found { port: e.port, index: e.index };
    }
    if let Some(e) = mine.first() {
        return GidResolution::RoceV1Only { index: e.index };
    }
    let mut found: Vec<Ipv4Addr> = live.iter().filter_map(|e| mapped_ipv4(&e.gid)).collect();
    found.sort_unstable();
    found.dedup();
    if found.is_empty() {
        GidResolution::Ipv6Only
    } else {
        GidResolution::OtherIpv4 { found }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(index: u32, gid: &str, kind: &str) -> GidEntry {
        GidEntry { port: 1, index, gid: gid.into(), kind: kind.into(), ndev: None }
    }

    const LINK_LOCAL: &str = "fe80:0000:0000:0000:0e42:a1ff:fe5b:9f10";
    const V4: &str = "0000:0000:0000:0000:0000:ffff:c0a8:640a";

    #[test]
    fn finds_the_roce_v2_entry_whatever_its_index() {
        let t =
            [e(0, LINK_LOCAL, "IB/RoCE v1"), e(1, LINK_LOCAL, "RoCE v2"), e(2, V4, "IB/RoCE v1"), e(5, V4, "RoCE v2")];
        assert_eq!(resolve(&t, Ipv4Addr::new(192, 168, 100, 10)), GidResolution::Found { port: 1, index: 5 });
        assert_eq!(mapped_ipv4(V4), Some(Ipv4Addr::new(192, 168, 100, 10)));
        assert_eq!(mapped_ipv4(LINK_LOCAL), None);
    }

    #[test]
    fn broken_tables() {
        let ip = Ipv4Addr::new(192, 168, 100, 10);
        let zero = "0000:0000:0000:0000:0000:0000:0000:0000";
        assert_eq!(resolve(&[e(0, zero, "RoCE v2")], ip), GidResolution::AllZero);
        assert_eq!(resolve(&[], ip), GidResolution::AllZero);
        assert_eq!(resolve(&[e(0, LINK_LOCAL, "RoCE v2")], ip), GidResolution::Ipv6Only);
        assert_eq!(resolve(&[e(2, V4, "IB/RoCE v1")], ip), GidResolution::RoceV1Only { index: 2 });
        assert_eq!(
            resolve(&[e(3, V4, "RoCE v2")], Ipv4Addr::new(10, 0, 0, 1)),
            GidResolution::OtherIpv4 { found: vec![ip] }
        );
    }
}
