//! The plan as text (`spark-kit plan` without `--json`): the weights and KV lines, a table per
//! node, the prefill floors, the assumptions with their sources and the warnings with their fixes.

use std::fmt::Write as _;

use super::Plan;
use crate::kit::bytes::human_size as size;
use crate::kit::bytes::GIB;

#[allow(clippy::cast_precision_loss)]
fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

#[allow(clippy::cast_precision_loss)]
fn gib_i(bytes: i64) -> f64 {
    bytes as f64 / GIB as f64
}

/// The human form of a plan.
#[must_use]
pub fn render(p: &Plan) -> String {
    let mut s = String::new();
    if !p.engine.is_empty() {
        let _ = writeln!(s, "engine: {}", p.engine);
    }
    let band = if p.weights_band > 0 { format!(" ± {}", size(p.weights_band)) } else { String::new() };
    let _ = writeln!(s, "weights per rank: {}{band} ({})", size(p.weights_per_rank), p.weights_source);
    if !p.dense_at_load.is_empty() {
        let parts: Vec<String> =
            p.dense_at_load.iter().map(|d| format!("{} +{}", d.class, size(d.extra_per_rank))).collect();
        let extra: u64 = p.dense_at_load.iter().map(|d| d.extra_per_rank).sum();
        let _ = writeln!(
            s,
            "  of which served dense at load (vLLM builds these without a quant method): +{} = {}",
            size(extra),
            parts.join(", ")
        );
    }
    let tokens = p.kv.tokens.map_or_else(|| "unknown tokens".to_string(), |t| format!("{t} tokens"));
    let _ = writeln!(
        s,
        "KV pool per rank: {} = {tokens} at {} B/token; max_model_len {}",
        size(p.kv.pool_bytes),
        p.kv.bytes_per_token,
        p.max_model_len
    );
    let _ = writeln!(
        s,
        "\n{:<12} {:>5} {:>8} {:>8} {:>6} {:>8} {:>6} {:>9} {:>16} {:>12}",
        "NODE", "RANKS", "MEMORY", "WEIGHTS", "KV", "RUNTIME", "OS", "HEADROOM", "BOOT NEED/HAVE", "SAFE PROMPT"
    );
    for n in &p.nodes {
        let mem = n.memory_total.map_or_else(|| "?".to_string(), |m| format!("{:.2}", gib(m)));
        let head = n.headroom.map_or_else(|| "?".to_string(), |h| format!("{:.2}", gib_i(h)));
        let boot = n.boot.as_ref().map_or_else(
            || "?".to_string(),
            |b| {
                format!(
                    "{:.1}/{:.1} {}",
                    gib(b.required_mem_available),
                    gib(b.mem_available),
                    if b.ok { "ok" } else { "NO" }
                )
            },
        );
        let prompt = n.prefill.as_ref().map_or_else(|| "?".to_string(), |x| x.safe_max_prompt.to_string());
        let _ = writeln!(
            s,
            "{:<12} {:>5} {:>8} {:>8.2} {:>6.2} {:>8.2} {:>6.2} {:>9} {:>16} {:>12}",
            n.name,
            n.ranks,
            mem,
            gib(n.weights),
            gib(n.kv_pool),
            gib(n.runtime_overhead),
            gib(n.os_reserve),
            head,
            boot,
            prompt
        );
    }
    let _ = writeln!(s, "(GiB; memory from: {})", p.nodes.first().map_or("", |n| n.memory_source.as_str()));
    for n in &p.nodes {
        if let Some(x) = &n.prefill {
            let _ = writeln!(
                s,
                "{}: predicted MemAvailable floor during a {}-token prefill {:.2} GiB{} (must stay ≥ {:.2}); prompt limited by {}",
                n.name,
                p.max_model_len,
                gib_i(x.floor_at_max_model_len),
                if p.weights_band > 0 {
                    format!(" at weights + band (central {:.2})", gib_i(x.floor_central_at_max_model_len))
                } else {
                    String::new()
                },
                gib_i(x.required_floor),
                x.limited_by.name()
            );
        }
    }
    if !p.long_context.is_empty() {
        let _ = writeln!(
            s,
            "\n1M context ({} tokens) on these nodes, per KV record (pool sized to hold it; floor at weights + band):",
            super::long_context::ONE_MILLION
        );
        s.push_str(&super::long_context::render(&p.long_context));
    }
    let _ = writeln!(s, "\nassumptions:");
    for a in &p.assumptions {
        let _ = writeln!(s, "  {}: {} — {}", a.name, a.value, a.source);
    }
    if p.warnings.is_empty() {
        let _ = writeln!(s, "\nno warnings");
    } else {
        let _ = writeln!(s);
        for w in &p.warnings {
            let node = w.node.as_ref().map(|n| format!("{n}: ")).unwrap_or_default();
            let _ = writeln!(s, "warning: {node}{}\n  fix: {}", w.message, w.fix);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{input_from_kit, plan};

    #[test]
    fn a_kit_plan_renders_its_table_assumptions_and_warnings() {
        let kit = crate::kit::builtin_kit("tiny-cpu");
        let p = plan(&input_from_kit(&kit, 1 << 30, "test weights", &[]));
        let text = render(&p);
        assert!(text.starts_with("weights per rank: 1.000 GiB (test weights)\n"), "{text}");
        assert!(text.contains("\nNODE ") && text.contains("SAFE PROMPT\n"), "{text}");
        assert!(text.contains("\nassumptions:\n"), "{text}");
        assert!(text.ends_with("no warnings\n") || text.contains("\n  fix: "), "{text}");
    }
}
