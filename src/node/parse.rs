//! Pure parsers of recorded command output (nvidia-smi CSV, `ip -o addr`, timedatectl, ufw, nft).

use std::net::Ipv4Addr;

/// One GPU from `nvidia-smi --query-gpu=name,compute_cap,pci.bus_id,driver_version --format=csv,noheader`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub name: String,
    pub compute_cap: String,
    pub bus_id: String,
    pub driver: String,
}

/// Every GPU line.
#[must_use]
pub fn gpus(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f.len() == 4).then(|| Gpu {
                name: f[0].into(),
                compute_cap: f[1].into(),
                bus_id: f[2].into(),
                driver: f[3].into(),
            })
        })
        .collect()
}

/// The major number of a driver version (`580.95.05` → 580).
#[must_use]
pub fn driver_major(v: &str) -> Option<u32> {
    v.split('.').next()?.trim().parse().ok()
}

/// `(pid, name, used memory)` lines of `--query-compute-apps=pid,process_name,used_memory`.
#[must_use]
pub fn gpu_apps(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("No running"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f.len() >= 3).then(|| (f[0].into(), f[1].into(), f[2].into()))
        })
        .collect()
}

/// IPv4 addresses with prefix length from `ip -4 -o addr show`.
#[must_use]
pub fn ipv4_addrs(text: &str) -> Vec<(Ipv4Addr, u8)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|x| *x == "inet")?;
            let (a, p) = w.next()?.split_once('/')?;
            Some((a.parse().ok()?, p.parse().ok()?))
        })
        .collect()
}

/// The network of `addr/prefix`, as `a.b.c.d/p`.
#[must_use]
pub fn subnet(addr: Ipv4Addr, prefix: u8) -> String {
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix.min(32))) };
    format!("{}/{prefix}", Ipv4Addr::from(u32::from(addr) & mask))
}

/// What a firewall dump says about traffic from `subnet` on `interface`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Firewall {
    /// No active filtering of incoming traffic.
    Open,
    /// Filtering is on and a rule names the subnet or the interface.
    Allowed,
    /// Filtering is on (default drop/deny) and nothing names the subnet or the interface.
    Blocking(String),
}

/// `ufw status` output.
#[must_use]
pub fn ufw(text: &str, subnet: &str, interface: &str) -> Firewall {
    if !text.lines().any(|l| l.trim() == "Status: active") {
        return Firewall::Open;
    }
    if text.lines().any(|l| l.contains("ALLOW") && (l.contains(subnet) || l.contains(interface))) {
        Firewall::Allowed
    } else {
        Firewall::Blocking("ufw is active with no ALLOW rule for the subnet or the interface".into())
    }
}

/// `nft list ruleset` output: an input hook chain with policy drop and no rule naming the
/// interface or the subnet blocks it.
#[must_use]
pub fn nft(text: &str, subnet: &str, interface: &str) -> Firewall {
    let mut verdict = Firewall::Open;
    let mut in_input_drop = false;
    let mut chain_name = String::new();
    let mut named = false;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("chain ") {
            chain_name = rest.trim_end_matches('{').trim().to_string();
            in_input_drop = false;
            named = false;
        } else if line.contains("hook input") && line.contains("policy drop") {
            in_input_drop = true;
        } else if in_input_drop && line.contains("accept") && (line.contains(interface) || line.contains(subnet)) {
            named = true;
        } else if line == "}" && in_input_drop {
            verdict = if named {
                Firewall::Allowed
            } else {
                Firewall::Blocking(format!(
                    "nft chain `{chain_name}` drops input and no rule accepts {interface} or {subnet}"
                ))
            };
            if matches!(verdict, Firewall::Blocking(_)) {
                return verdict;
            }
            in_input_drop = false;
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_lines() {
        let g = gpus("NVIDIA GB10, 12.1, 0000000F:01:00.0, 580.95.05\n");
        assert_eq!(g[0].name, "NVIDIA GB10");
        assert_eq!(driver_major(&g[0].driver), Some(580));
        assert_eq!(gpu_apps("1234, VLLM::Worker_TP, 91416 MiB\n").len(), 1);
        assert!(gpu_apps("").is_empty());
    }

    #[test]
    fn ip_addr_and_subnet() {
        let a = ipv4_addrs("5: enp1s0f1np1    inet 192.168.100.10/24 brd 192.168.100.255 scope global enp1s0f1np1\\       valid_lft forever preferred_lft forever\n");
        assert_eq!(a, vec![(Ipv4Addr::new(192, 168, 100, 10), 24)]);
        assert_eq!(subnet(a[0].0, 24), "192.168.100.0/24");
    }

    #[test]
    fn firewalls() {
        assert_eq!(ufw("Status: inactive\n", "10.0.0.0/24", "eth1"), Firewall::Open);
        assert_eq!(
            ufw("Status: active\n\nTo Action From\n22/tcp ALLOW Anywhere\n", "10.0.0.0/24", "eth1"),
            Firewall::Blocking("ufw is active with no ALLOW rule for the subnet or the interface".into())
        );
        assert_eq!(ufw("Status: active\nAnywhere ALLOW 10.0.0.0/24\n", "10.0.0.0/24", "eth1"), Firewall::Allowed);
        let drop = "table inet filter {\n chain input {\n  type filter hook input priority filter; policy drop;\n  tcp dport 22 accept\n }\n}\n";
        assert!(matches!(nft(drop, "10.0.0.0/24", "eth1"), Firewall::Blocking(_)));
        let ok = drop.replace("tcp dport 22 accept", "iifname \"eth1\" accept");
        assert_eq!(nft(&ok, "10.0.0.0/24", "eth1"), Firewall::Allowed);
        assert_eq!(nft("", "10.0.0.0/24", "eth1"), Firewall::Open);
    }
}
