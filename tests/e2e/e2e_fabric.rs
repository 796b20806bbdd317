//! The fabric checked for real (issue 31 item 4): `spark-kit preflight` on the two-namespace pair
//! (tests/common/netns.rs) runs one all-reduce rank per node through the engine venv's torch —
//! gloo over the veth pair, the same path NCCL takes on the Spark kits — and prints latency at
//! 8/32/64 KB and bus bandwidth at 64 MiB for each node.
//!
//! Needs root, `ip`, `sshd` and the engine venv: runs in CI (`tests/run-all.sh` sets
//! SPARK_KIT_TEST_E2E=1); otherwise prints why it skips.

use crate::common;

use std::time::Instant;

use common::netns::{self, Net};

const NS: [&str; 2] = ["sparkf1", "sparkf2"];
const KIT: &str = "tiny-cpu-2node";

#[test]
fn preflight_runs_an_all_reduce_between_the_namespaces() {
    if let Some(why) = netns::skip_reason() {
        eprintln!("skipping: {why}");
        return;
    }
    let _ = common::venv_python();
    let net = Net::up(NS, ["", ""]);
    let t = Instant::now();
    let out = net.spark(KIT, &["preflight", "--json"]).output().unwrap();
    let secs = t.elapsed().as_secs_f64();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(out.status.success(), "preflight: {r}\n{}", String::from_utf8_lossy(&out.stderr));
    for node in ["node-a", "node-b"] {
        let c: Vec<&serde_json::Value> =
            r["checks"].as_array().unwrap().iter().filter(|c| c["node"] == node && c["id"] == "all-reduce").collect();
        assert_eq!(c.len(), 1, "{r}");
        let msg = c[0]["message"].as_str().unwrap();
        assert_eq!(c[0]["verdict"], "pass", "{msg}");
        assert!(msg.starts_with("gloo all-reduce over 2 ranks: 8 KB "), "{msg}");
        assert!(msg.contains(", 32 KB ") && msg.contains(", 64 KB ") && msg.contains("GB/s at 64 MiB"), "{msg}");
        eprintln!("{node}: {msg}");
    }
    eprintln!("preflight with the all-reduce took {secs:.1} s");
    net.assert_no_leftovers();
}
