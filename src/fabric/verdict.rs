//! One rank's all-reduce figures (the JSON line `all_reduce.py` prints) and what they mean.
//!
//! Thresholds (docs/preflight.md, "Fabric all-reduce"):
//! - NCCL bus bandwidth at 64 MiB: pass ≥ 21.875 GB/s (175 Gb/s, NVIDIA's dgx-spark-playbooks NCCL
//!   pass mark for a healthy CX7 pair); below it a warning; below half of it a failure (one rail,
//!   or sockets instead of RoCE).
//! - NCCL latency: a healthy pair takes 30–35 µs at 8 KB, 37–40 µs at 32 KB and 65–68 µs at 64 KB
//!   (`all_reduce_perf`, NVIDIA/dgx-spark-playbooks#103); through torch a warning above 3× those,
//!   a failure above 10×.
//! - gloo (the CPU kits, veth between network namespaces): no figure thresholds; the collective
//!   must complete with the right sums.

use serde::Deserialize;

/// The playbook's bus-bandwidth pass mark, GB/s.
pub const BUSBW_PASS_GBPS: f64 = 21.875;
/// Healthy NCCL latency through a pair, µs, per message size (upper end of the playbook's runs).
pub const HEALTHY_LATENCY_US: [(u64, f64); 3] = [(8 << 10, 35.0), (32 << 10, 40.0), (64 << 10, 68.0)];
const WARN_FACTOR: f64 = 3.0;
const FAIL_FACTOR: f64 = 10.0;

/// What one rank printed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RankResult {
    pub rank: usize,
    pub world: usize,
    pub backend: String,
    #[serde(default)]
    pub torch: Option<String>,
    /// Message size (bytes, as a string key) → median µs.
    #[serde(default)]
    pub latency_us: std::collections::BTreeMap<String, f64>,
    #[serde(default)]
    pub busbw_gbps: Option<f64>,
    #[serde(default)]
    pub correct: Option<bool>,
    #[serde(default)]
    pub error: Option<String>,
}

/// Pass, warn or fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Pass,
    Warn,
    Fail,
}

/// The verdict on one rank's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub level: Level,
    pub message: String,
    pub fix: Option<String>,
}

/// What the node's link looks like, for naming the cause.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    pub interface: Option<String>,
    pub mtu: Option<u32>,
    /// `NCCL_IB_HCA` as the engine sets it.
    pub hca: Option<String>,
}

/// The last JSON object line of the script's stdout.
///
/// # Errors
/// No line parses as a rank's result (the message says what came instead).
pub fn parse(stdout: &str) -> Result<RankResult, String> {
    stdout.lines().rev().find_map(|l| serde_json::from_str::<RankResult>(l.trim()).ok()).ok_or_else(|| {
        let last = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("nothing");
        format!("the all-reduce printed no result (last line: {})", last.chars().take(200).collect::<String>())
    })
}

fn kb(bytes: u64) -> String {
    format!("{} KB", bytes >> 10)
}

fn figures(r: &RankResult) -> String {
    let lat: Vec<String> = HEALTHY_LATENCY_US
        .iter()
        .filter_map(|(b, _)| r.latency_us.get(&b.to_string()).map(|us| format!("{} {us:.0} µs", kb(*b))))
        .collect();
    let bw = r.busbw_gbps.map_or_else(String::new, |g| format!(", bus bandwidth {g:.2} GB/s at 64 MiB"));
    format!("{} all-reduce over {} ranks: {}{bw}", r.backend, r.world, lat.join(", "))
}

/// The likely cause of a slow or failed NCCL all-reduce on this link.
fn cause(link: &Link, busbw: Option<f64>, error: Option<&str>) -> String {
    let iface = link.interface.as_deref().unwrap_or("the fabric interface");
    if let Some(e) = error {
        let lower = e.to_ascii_lowercase();
        if lower.contains("ibv_modify_qp") || lower.contains("unhandled system error") || lower.contains("gid") {
            return format!(
                "the RoCE GID on {iface}: unset NCCL_IB_GID_INDEX (NCCL then picks each HCA's RoCE v2 IPv4 GID) or set it per node to the index preflight's GID line names"
            );
        }
        return format!(
            "the ranks did not meet over {iface}: check that both nodes' fabric addresses answer (`ping -I {iface}`), that engine.master_port is free on the head, and the firewall"
        );
    }
    match (link.mtu, busbw) {
        (Some(m), _) if m < 9000 => format!("MTU {m} on {iface}: set 9000 on both ends (`ip link set {iface} mtu 9000`)"),
        (_, Some(g)) if g < 5.0 => format!(
            "the data path is on sockets, not RoCE: NCCL_IB_HCA ({}) must name {iface}'s HCAs and NCCL_IB_DISABLE=0; NCCL_DEBUG=INFO must show NET/IB",
            link.hca.as_deref().unwrap_or("unset")
        ),
        _ => format!(
            "one rail: NCCL_IB_HCA ({}) must name both twin HCAs of the cable (e.g. rocep1s0f1,roceP2p1s0f1)",
            link.hca.as_deref().unwrap_or("unset")
        ),
    }
}

/// Judge one rank's result.
#[must_use]
pub fn judge(r: &RankResult, link: &Link) -> Judgement {
    let iface = link.interface.as_deref().unwrap_or("the fabric interface");
    if let Some(e) = &r.error {
        let fix = cause(link, None, Some(e));
        return Judgement {
            level: Level::Fail,
            message: format!("{} all-reduce over {iface} failed: {e}", r.backend),
            fix: Some(fix),
        };
    }
    if r.correct != Some(true) {
        return Judgement {
            level: Level::Fail,
            message: format!("{}: the sums came back wrong", figures(r)),
            fix: Some(format!("data is corrupted crossing {iface}: run `spark-kit preflight` again; if it repeats, reseat the cable and check `ethtool -S {iface}` for errors")),
        };
    }
    if r.backend != "nccl" {
        return Judgement {
            level: Level::Pass,
            message: format!("{} (gloo: no figure thresholds)", figures(r)),
            fix: None,
        };
    }
    let mut level = Level::Pass;
    let mut why = Vec::new();
    for (bytes, healthy) in HEALTHY_LATENCY_US {
        let Some(us) = r.latency_us.get(&bytes.to_string()) else { continue };
        if *us > healthy * FAIL_FACTOR {
            level = Level::Fail;
            why.push(format!("{} takes {us:.0} µs (> {:.0})", kb(bytes), healthy * FAIL_FACTOR));
        } else if *us > healthy * WARN_FACTOR {
            level = level_max(level, Level::Warn);
            why.push(format!("{} takes {us:.0} µs (> {:.0})", kb(bytes), healthy * WARN_FACTOR));
        }
    }
    if let Some(g) = r.busbw_gbps {
        if g < BUSBW_PASS_GBPS / 2.0 {
            level = Level::Fail;
            why.push(format!("bus bandwidth {g:.2} GB/s < {:.2}", BUSBW_PASS_GBPS / 2.0));
        } else if g < BUSBW_PASS_GBPS {
            level = level_max(level, Level::Warn);
            why.push(format!("bus bandwidth {g:.2} GB/s < {BUSBW_PASS_GBPS}"));
        }
    }
    let message = if why.is_empty() { figures(r) } else { format!("{}: {}", figures(r), why.join("; ")) };
    let fix = (level != Level::Pass).then(|| cause(link, r.busbw_gbps, None));
    Judgement { level, message, fix }
}

const fn level_max(a: Level, b: Level) -> Level {
    match (a, b) {
        (Level::Fail, _) | (_, Level::Fail) => Level::Fail,
        (Level::Warn, _) | (_, Level::Warn) => Level::Warn,
        _ => Level::Pass,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn nccl(l8: f64, l32: f64, l64: f64, bw: f64) -> RankResult {
        let line = format!(
            r#"{{"rank":0,"world":2,"backend":"nccl","latency_us":{{"8192":{l8},"32768":{l32},"65536":{l64}}},"busbw_gbps":{bw},"correct":true}}"#
        );
        parse(&format!("NCCL INFO noise\n{line}\n")).unwrap()
    }

    fn link(mtu: u32) -> Link {
        Link { interface: Some("enp1s0f1np1".into()), mtu: Some(mtu), hca: Some("rocep1s0f1".into()) }
    }

    #[test]
    fn a_healthy_pair_passes_on_the_playbooks_figures() {
        // NVIDIA/dgx-spark-playbooks#103: 35 / 40 / 68 µs; 23.74 GB/s measured with both HCAs.
        let j = judge(&nccl(35.15, 39.56, 67.93, 23.74), &link(9000));
        assert_eq!(j.level, Level::Pass, "{j:?}");
        assert!(j.message.contains("8 KB 35 µs") && j.message.contains("23.74 GB/s"), "{}", j.message);
    }

    #[test]
    fn low_bandwidth_names_mtu_then_one_rail_then_sockets() {
        let mtu = judge(&nccl(35.0, 40.0, 68.0, 19.5), &link(1500));
        assert_eq!(mtu.level, Level::Warn);
        assert!(mtu.fix.unwrap().contains("MTU 1500 on enp1s0f1np1"));
        let rail = judge(&nccl(35.0, 40.0, 68.0, 10.5), &link(9000));
        assert_eq!(rail.level, Level::Fail);
        assert!(rail.fix.unwrap().starts_with("one rail: NCCL_IB_HCA (rocep1s0f1)"));
        let sock = judge(&nccl(35.0, 40.0, 68.0, 3.0), &link(9000));
        assert!(sock.fix.unwrap().contains("sockets, not RoCE"));
    }

    #[test]
    fn slow_small_messages_warn_then_fail() {
        assert_eq!(judge(&nccl(120.0, 40.0, 68.0, 23.0), &link(9000)).level, Level::Warn);
        let j = judge(&nccl(400.0, 40.0, 68.0, 23.0), &link(9000));
        assert_eq!(j.level, Level::Fail);
        assert!(j.message.contains("8 KB takes 400 µs (> 350)"), "{}", j.message);
    }

    #[test]
    fn errors_name_the_gid_or_the_rendezvous() {
        let r = |e: &str| RankResult {
            rank: 0,
            world: 2,
            backend: "nccl".into(),
            torch: None,
            latency_us: Default::default(),
            busbw_gbps: None,
            correct: None,
            error: Some(e.into()),
        };
        let gid = judge(&r("DistBackendError: NCCL error: unhandled system error, ibv_modify_qp"), &link(9000));
        assert_eq!(gid.level, Level::Fail);
        assert!(gid.fix.unwrap().contains("GID on enp1s0f1np1"));
        let meet = judge(&r("DistStoreError: Timed out after 60 seconds"), &link(9000));
        assert!(meet.fix.unwrap().contains("`ping -I enp1s0f1np1`"));
        assert!(parse("Traceback\nboom").unwrap_err().contains("last line: boom"));
    }

    #[test]
    fn gloo_passes_when_the_sums_are_right_and_fails_when_not() {
        let ok =
            r#"{"rank":1,"world":2,"backend":"gloo","latency_us":{"8192":399.5},"busbw_gbps":0.64,"correct":true}"#;
        assert_eq!(judge(&parse(ok).unwrap(), &Link::default()).level, Level::Pass);
        let bad = ok.replace("\"correct\":true", "\"correct\":false");
        assert_eq!(judge(&parse(&bad).unwrap(), &Link::default()).level, Level::Fail);
    }
}
