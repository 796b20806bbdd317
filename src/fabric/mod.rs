//! The fabric checked for real: preflight runs one all-reduce rank per node through the engine's
//! own Python and torch (NCCL on GPU kits, gloo on the CPU kits), timing small messages (latency)
//! and one large one (bus bandwidth), and judges the figures against documented thresholds
//! ([`verdict`]). This module builds each node's request and the command that runs it; the
//! script is `python_overlay/tools/all_reduce.py`, embedded in the binary and run with `-c`.

use serde::{Deserialize, Serialize};

use crate::kit::schema::{Kit, Role};

pub mod verdict;

/// The rank script (docs/preflight.md, "Fabric all-reduce").
pub const SCRIPT: &str = include_str!("../../python_overlay/tools/all_reduce.py");
/// Latency message sizes, bytes (a decode step's all-reduces are 8–64 KB).
pub const LATENCY_SIZES: [u64; 3] = [8 << 10, 32 << 10, 64 << 10];
/// Bus-bandwidth message size, bytes.
pub const BW_BYTES: u64 = 64 << 20;
/// Seconds one rank may take, torch's import and the rendezvous included.
pub const TIMEOUT_S: u64 = 90;

/// What one node runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllReduceRequest {
    /// The engine's Python, as a command prefix (the venv's `bin/python`).
    pub python: Vec<String>,
    pub rank: usize,
    pub world: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// `nccl` or `gloo`.
    pub backend: String,
    /// The engine's environment on this node (`NCCL_*`, `GLOO_*`, …), the overlay path left out.
    pub env: Vec<(String, String)>,
    /// The interface the data should cross (for the verdict's fix).
    pub interface: Option<String>,
    pub timeout_s: u64,
}

impl AllReduceRequest {
    /// The command: `env K=V… <python> -c <script> --rank …`.
    #[must_use]
    pub fn argv(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["env".into()];
        a.extend(self.env.iter().map(|(k, v)| format!("{k}={v}")));
        a.extend(self.python.iter().cloned());
        a.extend(["-c".into(), SCRIPT.into()]);
        let sizes: Vec<String> = LATENCY_SIZES.iter().map(u64::to_string).collect();
        for (k, v) in [
            ("--rank", self.rank.to_string()),
            ("--world", self.world.to_string()),
            ("--master-addr", self.master_addr.clone()),
            ("--master-port", self.master_port.to_string()),
            ("--backend", self.backend.clone()),
            ("--sizes", sizes.join(",")),
            ("--bw-bytes", BW_BYTES.to_string()),
            ("--timeout-s", self.timeout_s.saturating_sub(30).max(10).to_string()),
        ] {
            a.push(k.into());
            a.push(v);
        }
        a
    }
}

/// Why a kit gets no all-reduce (the check's skip line), or `None` when it does.
#[must_use]
pub fn skip_reason(kit: &Kit, python: Option<&str>) -> Option<String> {
    if kit.nodes.len() < 2 {
        Some("one node: no cross-node all-reduce".into())
    } else if !crate::runtime::of(kit).vllm_in_venv(kit) {
        Some("the engine's torch is inside the image: run the all-reduce with the venv runtime (or engine.docker_mount_venv)".into())
    } else if python.is_none() {
        Some("the engine venv is not built here yet".into())
    } else {
        None
    }
}

/// The request of node `index` of `kit` (`python`: the engine venv's python), or `None` when
/// [`skip_reason`] says why not. `env`: that node's engine environment.
#[must_use]
pub fn request_for(
    kit: &Kit,
    index: usize,
    rank: usize,
    python: Option<&str>,
    env: &std::collections::BTreeMap<String, String>,
) -> Option<AllReduceRequest> {
    if skip_reason(kit, python).is_some() {
        return None;
    }
    let node = kit.nodes.get(index)?;
    let head = kit.nodes.iter().find(|n| n.role == Role::Head)?;
    Some(AllReduceRequest {
        python: vec![python?.to_string()],
        rank,
        world: kit.nodes.len(),
        master_addr: head.fabric.ipv4.clone().unwrap_or_else(|| "127.0.0.1".into()),
        master_port: kit.engine.master_port,
        backend: if kit.needs_gpu() { "nccl" } else { "gloo" }.into(),
        // The engine's own environment for this node, less the overlay (the script needs none).
        env: env.iter().filter(|(k, _)| k.as_str() != "PYTHONPATH").map(|(k, v)| (k.clone(), v.clone())).collect(),
        interface: node.fabric.interface.clone(),
        timeout_s: TIMEOUT_S,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::builtin_kit;

    #[test]
    fn two_node_kits_get_one_rank_each_on_the_heads_address() {
        let kit = builtin_kit("tiny-cpu-2node");
        let env: std::collections::BTreeMap<String, String> =
            [("GLOO_SOCKET_IFNAME", "veth-spark2"), ("PYTHONPATH", "/o")].map(|(k, v)| (k.into(), v.into())).into();
        let r = request_for(&kit, 1, 1, Some("/v/bin/python"), &env).unwrap();
        assert_eq!((r.rank, r.world, r.master_addr.as_str(), r.backend.as_str()), (1, 2, "10.77.0.1", "gloo"));
        assert_eq!(r.env, [("GLOO_SOCKET_IFNAME".to_string(), "veth-spark2".to_string())]);
        let argv = r.argv();
        assert_eq!(&argv[..3], ["env", "GLOO_SOCKET_IFNAME=veth-spark2", "/v/bin/python"]);
        assert!(argv.windows(2).any(|w| w == ["--sizes", "8192,32768,65536"]), "{argv:?}");
        let spark = builtin_kit("dgx-spark-2x-dsv41-exl3");
        assert_eq!(request_for(&spark, 0, 0, Some("/p"), &env).unwrap().backend, "nccl");
        assert!(skip_reason(&builtin_kit("tiny-cpu"), Some("/p")).is_some());
        assert!(request_for(&kit, 0, 0, None, &env).is_none());
    }
}
