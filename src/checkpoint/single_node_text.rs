//! `spark-kit plan --nodes 1` as text: one line per K map — weights, what is left for the KV
//! pool, the boot rule, the prefill floor at 128k with `fp8_ds_mla` — then, per KV record and
//! length, whether the prefill stays above the floor (or by how much it falls short).

use std::fmt::Write as _;

use super::single_node::{SinglePlan, LENGTHS};
use crate::plan::gib_i as gib;
use crate::plan::reference::gib as gib_u;

fn short_label(t: u64) -> String {
    if t >= 1_000_000 {
        "1M".into()
    } else if t % 1024 == 0 {
        format!("{}k", t / 1024)
    } else {
        format!("{}k", t / 1000)
    }
}

/// The human form of the single-Spark answer.
#[must_use]
pub fn render(p: &SinglePlan) -> String {
    let mut s = String::new();
    let mem = p.memory_total.map_or_else(|| "unknown".into(), |m| format!("{:.2} GiB", gib_u(m)));
    let _ = writeln!(
        s,
        "one Spark ({}): memory {mem}, runtime {:.2} + OS {:.2} GiB, boot rule MemAvailable ≥ weights + {:.2} GiB; {}",
        p.node,
        gib_u(p.runtime_overhead),
        gib_u(p.os_reserve),
        gib_u(p.boot_margin),
        p.weights_source
    );
    if let Some(first) = p.rows.first().filter(|r| r.left_for_kv < 0) {
        let _ = writeln!(
            s,
            "as is: {:.2} GiB of weights, {:.2} GiB more than one Spark holds before any KV pool",
            gib_u(first.weights),
            -gib(first.left_for_kv)
        );
    }
    let yes = p.rows.iter().find(|r| r.boot_ok && r.kv.iter().any(|a| a.fits));
    let _ = writeln!(
        s,
        "{}",
        yes.map_or_else(
            || "no K map tried boots and serves 128k on one Spark".to_string(),
            |r| format!("first K map that boots and serves 128k: {} ({:.2} GiB of weights)", r.label, gib_u(r.weights))
        )
    );
    let mut head =
        format!("\n{:<22} {:>8} {:>9} {:>16} {:>11}", "K MAP", "WEIGHTS", "KV ROOM", "BOOT NEED/HAVE", "FLOOR@128k");
    let records: Vec<&str> = {
        let mut r: Vec<&str> =
            p.rows.first().map(|r| r.kv.iter().map(|a| a.dtype.as_str()).collect()).unwrap_or_default();
        r.dedup();
        r
    };
    for rec in &records {
        for t in LENGTHS {
            let _ = write!(head, " {:>9}", format!("{}@{}", rec.split('_').next().unwrap_or(rec), short_label(t)));
        }
    }
    let _ = writeln!(s, "{}", head.trim_end());
    for r in &p.rows {
        let floor =
            r.kv.iter()
                .find(|a| a.dtype == "fp8_ds_mla" && a.target_tokens == LENGTHS[0])
                .map_or_else(|| "?".into(), |a| format!("{:.2}", gib(a.floor)));
        let mut line = format!(
            "{:<22} {:>8.2} {:>9.2} {:>16}",
            r.label,
            gib_u(r.weights),
            gib(r.left_for_kv),
            format!("{:.1}/{:.1} {}", gib_u(r.boot_need), gib_u(r.boot_have), if r.boot_ok { "ok" } else { "NO" })
        );
        let _ = write!(line, " {floor:>11}");
        for a in &r.kv {
            let cell = if a.refused.is_some() {
                "refused".to_string()
            } else if a.fits && r.boot_ok {
                "ok".to_string()
            } else if a.short_by > 0 {
                format!("-{:.2}", gib_u(a.short_by))
            } else {
                "no".to_string()
            };
            let _ = write!(line, " {cell:>9}");
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
    let _ = writeln!(
        s,
        "(GiB. KV ROOM = memory − weights − runtime − OS, before the pool; negative: the weights alone do not fit by that much.\n \
         fp8/nvfp4@L: ok = a prompt of L tokens stays above the prefill floor with a pool that holds it; -x = short by x GiB;\n \
         refused = vLLM will not run that KV record on GB10.)"
    );
    let _ = writeln!(s, "\nassumptions:");
    for a in &p.assumptions {
        let _ = writeln!(s, "  {}: {} — {}", a.name, a.value, a.source);
    }
    s
}
