//! Preflight verdicts: pure functions over one node's [`NodeFacts`] (and, for parity, over all
//! nodes' facts). Each check is pass / warn / fail with a one-line fix (gb10-ops.md §4,
//! reference-kit.md A.3).

use std::net::Ipv4Addr;

use serde::Serialize;

use super::facts::{NodeFacts, Probed};
use super::gid::{resolve, GidResolution};
use super::parse::{self, Firewall};
use super::probe::ProbeError;
pub use super::vllm_check::VllmSource;
use crate::memguard::meminfo;

const GIB: u64 = 1 << 30;

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Pass,
    /// Not applicable to this kit.
    Skip,
    Warn,
    /// Could not run from here (e.g. a remote node without the node agent). Never a pass.
    NotChecked,
    Fail,
}

impl Verdict {
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Skip => "skip",
            Verdict::Warn => "warn",
            Verdict::NotChecked => "not checked",
            Verdict::Fail => "FAIL",
        }
    }
}

/// One check on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub node: String,
    pub id: &'static str,
    pub verdict: Verdict,
    pub message: String,
    /// What to do about a warn or fail.
    pub fix: Option<String>,
}

/// What the kit expects of one node.
#[derive(Debug, Clone, Default)]
pub struct NodeSpec {
    pub name: String,
    pub head: bool,
    /// The kit runs on GB10 GPUs (false for the CPU kits: GPU checks are skipped).
    pub gpu: bool,
    pub ranks: u32,
    /// Weights per rank, when the weight budget is known.
    pub weights_per_rank: Option<u64>,
    /// Bytes the checkpoint needs on disk, when known.
    pub weights_on_disk: Option<u64>,
    pub boot_margin: u64,
    pub ipv4: Option<Ipv4Addr>,
    /// `NCCL_IB_GID_INDEX` if the kit sets it for this node.
    pub nccl_gid_index: Option<String>,
    /// The kit's `engine.vllm_version` (empty = any supported).
    pub vllm_version: String,
    /// The kit's own deployment runs (`PreflightInput::running`).
    pub running: Option<String>,
    /// Where the engine's vLLM is read from on this node.
    pub vllm_source: VllmSource,
    /// What to do when that vLLM is missing or the wrong one, for this runtime.
    pub vllm_fix: String,
    /// The kit's model is made on this machine on the first start (the tiny kits): its weights
    /// are unknown before and a few MB after, so no download fix applies.
    pub made_locally: bool,
    /// The kit has one node: no other clock to agree with.
    pub single_node: bool,
}

pub(super) struct Out<'a> {
    node: &'a str,
    checks: Vec<Check>,
}

impl Out<'_> {
    pub(super) fn push(&mut self, id: &'static str, verdict: Verdict, message: impl Into<String>, fix: Option<String>) {
        self.checks.push(Check { node: self.node.to_string(), id, verdict, message: message.into(), fix });
    }
    pub(super) fn pass(&mut self, id: &'static str, m: impl Into<String>) {
        self.push(id, Verdict::Pass, m, None);
    }
    pub(super) fn warn(&mut self, id: &'static str, m: impl Into<String>, fix: impl Into<String>) {
        self.push(id, Verdict::Warn, m, Some(fix.into()));
    }
    pub(super) fn fail(&mut self, id: &'static str, m: impl Into<String>, fix: impl Into<String>) {
        self.push(id, Verdict::Fail, m, Some(fix.into()));
    }
    pub(super) fn skip(&mut self, id: &'static str, m: impl Into<String>) {
        self.push(id, Verdict::Skip, m, None);
    }
}

#[allow(clippy::cast_precision_loss)]
fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / GIB as f64)
}

pub(super) fn text(p: &Probed) -> Option<&str> {
    p.as_ref().ok().map(|s| s.trim())
}

/// Every per-node check.
#[must_use]
pub fn node_checks(spec: &NodeSpec, f: &NodeFacts) -> Vec<Check> {
    let mut o = Out { node: &spec.name, checks: Vec::new() };
    platform(&mut o, spec, f);
    memory(&mut o, spec, f);
    leftovers(&mut o, spec, f);
    disk(&mut o, spec, f);
    super::vllm_check::versions(&mut o, spec, f);
    fabric(&mut o, spec, f);
    reachability(&mut o, spec, f);
    clock_and_firewall(&mut o, spec, f);
    o.checks
}

fn platform(o: &mut Out<'_>, spec: &NodeSpec, f: &NodeFacts) {
    if !spec.gpu {
        o.skip("gpu", "the kit runs on the CPU: no GB10 needed");
        return;
    }
    let arch = text(&f.uname_m).unwrap_or("?");
    if arch != "aarch64" {
        o.fail(
            "gpu",
            format!("`uname -m` is {arch}, not aarch64: this is not a DGX Spark"),
            "run the GB10 kit on DGX Spark nodes, or use a CPU kit (--kit tiny-cpu)",
        );
        return;
    }
    match &f.gpu {
        Err(ProbeError::NotFound(_)) => {
            o.fail("gpu", "nvidia-smi is not installed", "install the NVIDIA driver (DGX OS ships it)");
        }
        Err(e) => o.fail("gpu", format!("nvidia-smi failed: {e}"), "check the driver: `nvidia-smi` must list the GB10"),
        Ok(t) => {
            let gpus = parse::gpus(t);
            match gpus.iter().find(|g| g.name.contains("GB10")) {
                None => o.fail(
                    "gpu",
                    format!(
                        "no NVIDIA GB10 in nvidia-smi ({})",
                        if gpus.is_empty() {
                            "no GPU listed".into()
                        } else {
                            gpus.iter().map(|g| g.name.as_str()).collect::<Vec<_>>().join(", ")
                        }
                    ),
                    "run on a DGX Spark (GB10); check `nvidia-smi -L`",
                ),
                Some(g) if g.compute_cap != "12.1" => o.fail(
                    "gpu",
                    format!("{} reports compute capability {}, expected 12.1", g.name, g.compute_cap),
                    "update the driver; the kit's kernels are built for sm_121",
                ),
                Some(g) => match parse::driver_major(&g.driver) {
                    Some(m) if m < 580 => o.fail(
                        "gpu",
                        format!("{} (12.1) with driver {}: older than 580 (CUDA 13.0)", g.name, g.driver),
                        "update DGX OS / the NVIDIA driver to 580 or newer",
                    ),
                    Some(590) => o.warn(
                        "gpu",
                        format!("{} (12.1), driver {}: one report of a CUDA-graph issue on 590", g.name, g.driver),
                        "if capture fails, try driver 580 or set engine.enforce_eager",
                    ),
                    _ => o.pass("gpu", format!("{} compute capability 12.1, driver {}", g.name, g.driver)),
                },
            }
        }
    }
}

fn memory(o: &mut Out<'_>, spec: &NodeSpec, f: &NodeFacts) {
    let Some(m) = text(&f.meminfo).and_then(|t| meminfo::parse(t.as_bytes())) else {
        o.fail("memory", "cannot read MemAvailable from /proc/meminfo", "check /proc is mounted");
        return;
    };
    if spec.gpu && m.mem_total < 115 * GIB {
        o.fail(
            "memory",
            format!("MemTotal {} is below 115 GiB: not a full GB10 node", gib(m.mem_total)),
            "check the node (a GB10 reports ≈ 121.7 GiB)",
        );
        return;
    }
    if let Some(r) = &spec.running {
        o.skip(
            "memory",
            format!(
                "MemAvailable {}; {r}: its weights are loaded, the boot margin is not checked",
                gib(m.mem_available)
            ),
        );
        return;
    }
    match spec.weights_per_rank {
        None if spec.made_locally => o.skip(
            "memory",
            format!(
                "MemAvailable {}; the kit's tiny model is made on the first start (a few MB): boot margin not checked",
                gib(m.mem_available)
            ),
        ),
        None => o.warn(
            "memory",
            format!(
                "MemAvailable {} (MemFree {}); weights per rank unknown, boot margin not checked",
                gib(m.mem_available),
                gib(m.mem_free)
            ),
            "set model.path (or download the model) so the weight budget is known",
        ),
        Some(w) => {
            let need = w.saturating_mul(u64::from(spec.ranks.max(1))).saturating_add(spec.boot_margin);
            if m.mem_available >= need {
                o.pass(
                    "memory",
                    format!(
                        "MemAvailable {} ≥ weights {} + boot margin {}",
                        gib(m.mem_available),
                        gib(need - spec.boot_margin),
                        gib(spec.boot_margin)
                    ),
                );
            } else {
                o.fail(
                    "memory",
                    format!("MemAvailable {} < weights {} + boot margin {} (short by {})", gib(m.mem_available), gib(need - spec.boot_margin), gib(spec.boot_margin), gib(need - m.mem_available)),
                    "stop what uses the memory (see `ps aux --sort=-rss`), then `sync; echo 3 > /proc/sys/vm/drop_caches` once; reboot if UMA stays trapped",
                );
            }
        }
    }
    match &f.pressure {
        Ok(_) => o.pass("psi", "memory pressure (PSI) available: the guard wakes on stalls"),
        Err(_) => o.warn(
            "psi",
            "no /proc/pressure/memory: the guard falls back to plain sampling",
            "boot with psi=1 (CONFIG_PSI) for stall wake-ups",
        ),
    }
}

fn is_engine_comm(c: &str) -> bool {
    c.starts_with("VLLM::") || c.starts_with("ray::") || c == "vllm"
}

fn leftovers(o: &mut Out<'_>, spec: &NodeSpec, f: &NodeFacts) {
    if let Some(r) = &spec.running {
        o.skip("leftovers", format!("{r}: its engine processes are not leftovers"));
        return;
    }
    let mut found: Vec<String> =
        f.processes.iter().filter(|(_, c)| is_engine_comm(c)).map(|(p, c)| format!("{p} ({c})")).collect();
    if spec.gpu {
        match &f.gpu_apps {
            Ok(t) => found.extend(parse::gpu_apps(t).into_iter().map(|(p, n, m)| format!("{p} ({n}, {m} GPU)"))),
            Err(e) => {
                o.fail(
                    "leftovers",
                    format!("cannot list GPU processes: {e}"),
                    "check `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv`",
                );
                return;
            }
        }
    }
    found.sort();
    found.dedup();
    if found.is_empty() {
        o.pass(
            "leftovers",
            if spec.gpu {
                "no GPU processes and no leftover vLLM/Ray processes"
            } else {
                "no leftover vLLM/Ray processes"
            },
        );
    } else {
        let n = found.len();
        let shown: Vec<String> = found.into_iter().take(5).collect();
        let fix = "stop them (`spark-kit down`, or kill their process group) and wait for MemAvailable to recover";
        if spec.gpu {
            o.fail("leftovers", format!("{n} leftover engine/GPU process(es): {}", shown.join(", ")), fix);
        } else {
            // A CPU kit's engine memory is ordinary memory the kernel can see and reclaim: another
            // vLLM on this machine only competes for cores.
            o.warn("leftovers", format!("{n} other vLLM/Ray process(es) on this node: {}", shown.join(", ")), fix);
        }
    }
}

fn disk(o: &mut Out<'_>, spec: &NodeSpec, f: &NodeFacts) {
    if f.weights_present {
        o.pass("disk", format!("weights already in {}", f.disk_path));
        return;
    }
    let Some(need) = spec.weights_on_disk else {
        o.skip("disk", "the checkpoint size is unknown (made locally or not pinned)");
        return;
    };
    let need = need + need / 10;
    match &f.disk_free {
        Ok(free) if *free >= need => o.pass(
            "disk",
            format!("{} free for the weights (+10 %): {} needed at {}", gib(*free), gib(need), f.disk_path),
        ),
        Ok(free) => o.fail(
            "disk",
            format!("{} free at {}, the weights need {} (+10 %)", gib(*free), f.disk_path, gib(need)),
            "free space there, or point paths.hf_cache / model.path at a larger disk",
        ),
        Err(e) => o.fail(
            "disk",
            format!("cannot measure free space at {}: {e}", f.disk_path),
            "check the path exists and is readable",
        ),
    }
}

fn read_num(p: Option<&Probed>) -> Option<u64> {
    p.and_then(|r| text(r)).and_then(|t| t.parse().ok())
}

fn fabric(o: &mut Out<'_>, spec: &NodeSpec, f: &NodeFacts) {
    let fab = &f.fabric;
    let Some(iface) = &fab.interface else {
        o.skip("link", "no fabric interface in the kit (one node)");
        return;
    };
    match fab.operstate.as_ref().map(|r| r.as_ref().map(|s| s.trim().to_string())) {
        Some(Ok(s)) if s == "up" => {
            let speed = read_num(fab.speed.as_ref());
            let mtu = read_num(fab.mtu.as_ref());
            let desc = format!(
                "{iface} up, {} Mb/s, MTU {}",
                speed.map_or("?".into(), |s| s.to_string()),
                mtu.map_or("?".into(), |m| m.to_string())
            );
            if spec.gpu && speed.is_some_and(|s| s < 200_000) {
                o.fail(
                    "link",
                    format!("{desc}: below 200000 Mb/s"),
                    format!("reseat/replace the QSFP cable and check `ethtool {iface}` on both ends"),
                );
            } else if mtu == Some(1500) {
                o.warn(
                    "link",
                    format!("{desc}: jumbo frames off"),
                    format!("set MTU 9000 on both ends: `ip link set {iface} mtu 9000`"),
                );
            } else {
                o.pass("link", desc);
            }
        }
        Some(Ok(s)) => o.fail(
            "link",
            format!("{iface} is {s}, not up"),
            format!("connect the cable and `ip link set {iface} up` on both nodes"),
        ),
        Some(Err(ProbeError::NotFound(_))) | None => o.fail(
            "link",
            format!("no interface {iface} on this node"),
            "fix nodes[].fabric.interface (see `ip -br link`)",
        ),
        Some(Err(e)) => o.fail("link", format!("cannot read {iface} state: {e}"), "check /sys/class/net"),
    }
    let addrs = fab.ip_addr.as_ref().and_then(|r| text(r)).map(parse::ipv4_addrs).unwrap_or_default();
    let ip = spec.ipv4.or_else(|| addrs.first().map(|a| a.0));
    match (spec.ipv4, addrs.is_empty()) {
        (Some(want), _) if !addrs.iter().any(|a| a.0 == want) => o.fail(
            "ipv4",
            format!(
                "{iface} does not carry the kit's address {want} (has: {})",
                if addrs.is_empty() {
                    "none".into()
                } else {
                    addrs.iter().map(|a| a.0.to_string()).collect::<Vec<_>>().join(", ")
                }
            ),
            format!("`ip addr add {want}/24 dev {iface}` (or fix nodes[].fabric.ipv4)"),
        ),
        (None, true) => o.fail(
            "ipv4",
            format!("{iface} has no IPv4 address"),
            format!("assign one: `ip addr add <addr>/24 dev {iface}`"),
        ),
        _ => o.pass("ipv4", format!("{iface} has {}", ip.map_or_else(String::new, |i| i.to_string()))),
    }
    let Some(hca) = &fab.hca else {
        o.skip("roce-gid", "no HCA in the kit (fabric over TCP)");
        return;
    };
    if let Some(e) = &fab.gid_error {
        o.fail(
            "roce-gid",
            format!("cannot read the GID table of {hca}: {e}"),
            "fix nodes[].fabric.hca (see `ls /sys/class/infiniband`) and load mlx5_ib",
        );
        return;
    }
    let Some(ip) = ip else {
        o.fail(
            "roce-gid",
            format!("{hca}: no IPv4 to look up a RoCE v2 GID for"),
            format!("assign an IPv4 to {iface}"),
        );
        return;
    };
    let dump =
        || fab.gids.iter().take(8).map(|g| format!("{}={} {}", g.index, g.gid, g.kind)).collect::<Vec<_>>().join("; ");
    match resolve(&fab.gids, ip) {
        GidResolution::Found { port, index } => match &spec.nccl_gid_index {
            Some(set) if set.trim() != index.to_string() => o.fail(
                "roce-gid",
                format!("the kit sets NCCL_IB_GID_INDEX={set}, but this node's RoCE v2 GID for {ip} is index {index}"),
                "remove NCCL_IB_GID_INDEX from the kit: the index differs per node and drifts, spark-kit resolves it per node",
            ),
            _ => o.pass("roce-gid", format!("{hca} port {port} GID index {index}: RoCE v2 ::ffff:{ip}")),
        },
        GidResolution::AllZero => o.fail(
            "roce-gid",
            format!("{hca}: every GID is all-zero (NCCL would die ~60 s into boot with errno 61)"),
            format!("bring {iface} up with its IPv4, then check `cat /sys/class/infiniband/{hca}/ports/1/gids/*`"),
        ),
        GidResolution::Ipv6Only => o.fail(
            "roce-gid",
            format!("{hca}: only IPv6 GIDs, none for {ip} ({})", dump()),
            format!("assign {ip} to {iface}; the IPv4-mapped RoCE v2 GID appears with it"),
        ),
        GidResolution::RoceV1Only { index } => o.fail(
            "roce-gid",
            format!("{hca}: ::ffff:{ip} exists only as RoCE v1 (index {index}); NCCL needs RoCE v2"),
            format!("enable RoCE v2 on {hca} (e.g. `cma_roce_mode -d {hca} -p 1 -m 2`) and check the mlx5 firmware settings"),
        ),
        GidResolution::OtherIpv4 { found } => o.fail(
            "roce-gid",
            format!("{hca}: GIDs map {} but not {ip}", found.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
            format!("make nodes[].fabric.hca the HCA of {iface}, or fix nodes[].fabric.ipv4"),
        ),
    }
}

/// The kit key a port's bind address comes from (src/node/preflight.rs `request_for`).
#[must_use]
pub fn address_key(what: &str) -> &'static str {
    if what.starts_with("master") {
        "nodes[].fabric.ipv4"
    } else {
        "engine.host"
    }
}

/// The fix for a port that could not be checked (the bind address is not on this node).
fn unbindable_fix(spec: &NodeSpec, f: &NodeFacts, what: &str) -> String {
    let key = address_key(what);
    match (key, spec.ipv4, &f.fabric.interface) {
        ("nodes[].fabric.ipv4", Some(ip), Some(iface)) => format!(
            "the address comes from {key} ({ip}): assign it to {iface} (`ip addr add {ip}/24 dev {iface}`) or fix {key} for node `{}`",
            spec.name
        ),
        ("nodes[].fabric.ipv4", _, _) => format!("set {key} for node `{}` to an address of this node", spec.name),
        _ => format!("check {key} is an address of this node (see `ip -br addr`)"),
    }
}

fn reachability(o: &mut Out<'_>, spec: &NodeSpec, f: &NodeFacts) {
    if let (Some(r), true) = (&spec.running, spec.head) {
        o.skip("ports", format!("{r}: its ports are in use by it, not checked free"));
    }
    for (port, what, free) in &f.ports {
        match free {
            Ok(true) => o.pass("ports", format!("{what} port {port} is free")),
            Ok(false) => o.fail(
                "ports",
                format!("{what} port {port} is in use"),
                format!("stop what listens there (`ss -ltnp 'sport = :{port}'`) or change the port in the kit"),
            ),
            Err(e) => o.fail("ports", format!("cannot check {what} port {port}: {e}"), unbindable_fix(spec, f, what)),
        }
    }
    for (node, r) in &f.ssh {
        match r {
            Ok(_) => o.pass("ssh", format!("ssh to {node} in batch mode works")),
            Err(e) => o.fail(
                "ssh",
                format!("ssh to {node} in batch mode failed: {e}"),
                format!("set up key login: `ssh-copy-id` to {node}, then `ssh -o BatchMode=yes {node} true`"),
            ),
        }
    }
}

fn clock_and_firewall(o: &mut Out<'_>, spec: &NodeSpec, f: &NodeFacts) {
    match text(&f.ntp) {
        Some("yes") => o.pass("clock", "clock synchronised (NTP)"),
        Some(v) => o.warn(
            "clock",
            format!("clock not synchronised (NTPSynchronized={v})"),
            "enable NTP: `timedatectl set-ntp true`",
        ),
        None => {
            let why = match &f.ntp {
                Err(ProbeError::NotFound(_)) => "timedatectl is not installed".to_string(),
                Err(e) => e.to_string(),
                Ok(_) => "empty answer".to_string(),
            };
            if spec.single_node {
                o.skip("clock", format!("not checked ({why}): one node, no other clock to agree with"));
            } else {
                o.warn(
                    "clock",
                    format!("cannot tell whether the clock is synchronised ({why})"),
                    "check NTP/chrony is running (`chronyc tracking`)",
                );
            }
        }
    }
    let Some(iface) = &f.fabric.interface else {
        o.skip("firewall", "no fabric interface in the kit");
        return;
    };
    // Rules for an interface that is missing or down say nothing about the link NCCL will use.
    if o.checks.iter().any(|c| c.id == "link" && c.verdict == Verdict::Fail) {
        o.skip("firewall", format!("not checked: the link check of {iface} failed (fix that first)"));
        return;
    }
    let addrs = f.fabric.ip_addr.as_ref().and_then(|r| text(r)).map(parse::ipv4_addrs).unwrap_or_default();
    let sub = spec
        .ipv4
        .map(|ip| (ip, addrs.iter().find(|a| a.0 == ip).map_or(24, |a| a.1)))
        .or_else(|| addrs.first().copied())
        .map_or_else(|| "?".to_string(), |(ip, p)| parse::subnet(ip, p));
    let mut blocking = Vec::new();
    if let Some(t) = text(&f.ufw) {
        if let Firewall::Blocking(why) = parse::ufw(t, &sub, iface) {
            blocking.push(why);
        }
    }
    if let Some(t) = text(&f.nft) {
        if let Firewall::Blocking(why) = parse::nft(t, &sub, iface) {
            blocking.push(why);
        }
    }
    if blocking.is_empty() {
        o.pass("firewall", format!("nothing blocks {sub} on {iface}"));
    } else {
        o.warn(
            "firewall",
            blocking.join("; "),
            format!("allow the peer: `ufw allow in on {iface} from {sub}` or an nft rule `iifname \"{iface}\" accept`"),
        );
    }
}
