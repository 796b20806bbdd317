//! Parity across nodes: the versions and link settings that must be equal on every node of a
//! kit (driver, kernel, spark-kit, vLLM, fabric MTU and speed). Pure, over all nodes' facts.

use super::checks::{text, Check, Verdict};
use super::facts::NodeFacts;
use super::parse;

/// Parity across nodes: driver, kernel, spark-kit, vLLM versions and link MTU/speed equal.
#[must_use]
pub fn cross_checks(nodes: &[(&str, &NodeFacts)]) -> Vec<Check> {
    let mut out = Vec::new();
    if nodes.len() < 2 {
        return out;
    }
    let driver = |f: &NodeFacts| text(&f.gpu).and_then(|t| parse::gpus(t).first().map(|g| g.driver.clone()));
    let kernel = |f: &NodeFacts| text(&f.uname_r).map(str::to_string);
    let sk = |f: &NodeFacts| text(&f.spark_kit_version).map(str::to_string);
    let vllm = |f: &NodeFacts| f.vllm_version.as_ref().and_then(|r| text(r)).map(str::to_string);
    let mtu = |f: &NodeFacts| f.fabric.mtu.as_ref().and_then(|r| text(r)).map(str::to_string);
    let speed = |f: &NodeFacts| f.fabric.speed.as_ref().and_then(|r| text(r)).map(str::to_string);
    type Get<'a> = &'a dyn Fn(&NodeFacts) -> Option<String>;
    let items: [(&'static str, &str, Get<'_>, &str); 6] = [
        ("same-driver", "NVIDIA driver", &driver, "install the same driver on every node (DGX OS update on both)"),
        ("same-kernel", "kernel", &kernel, "boot the same kernel on every node"),
        (
            "same-spark-kit",
            "spark-kit",
            &sk,
            "`up` pushes the head's binary; or install the same spark-kit on every node",
        ),
        ("same-vllm", "vLLM", &vllm, "run `spark-kit setup` on every node with the same kit"),
        ("same-mtu", "fabric MTU", &mtu, "set the same MTU on both ends of the cable (`ip link set <if> mtu 9000`)"),
        ("same-speed", "fabric link speed", &speed, "check the cable and both ports with `ethtool <if>`"),
    ];
    let all = nodes.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    for (id, what, get, fix) in items {
        let vals: Vec<(&str, Option<String>)> = nodes.iter().map(|(n, f)| (*n, get(f))).collect();
        if vals.iter().all(|(_, v)| v.is_none()) {
            continue;
        }
        let shown =
            vals.iter().map(|(n, v)| format!("{n} {}", v.as_deref().unwrap_or("?"))).collect::<Vec<_>>().join(", ");
        let first = &vals[0].1;
        let (verdict, message, fix) = if vals.iter().any(|(_, v)| v.is_none()) {
            (
                Verdict::NotChecked,
                format!("{what}: not known on every node ({shown})"),
                Some("run preflight where every node answers (the node agent)".to_string()),
            )
        } else if vals.iter().all(|(_, v)| v == first) {
            (Verdict::Pass, format!("{what} {} on {all}", first.as_deref().unwrap_or("")), None)
        } else {
            (Verdict::Fail, format!("{what} differs: {shown}"), Some(fix.to_string()))
        };
        out.push(Check { node: "all".into(), id, verdict, message, fix });
    }
    out
}
