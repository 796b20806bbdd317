//! `spark-kit plan [--kit K] [--json]`: the per-node memory plan.

use std::fmt::Write as _;

use super::verify::{checkpoint_in, size};
use super::{io_failure, load, Context};
use crate::checkpoint::budget::weight_budget;
use crate::checkpoint::exl3_audit::num_hidden_layers;
use crate::checkpoint::virtual_ckpt::DeepSeekV41Dims;
use crate::checkpoint::Origin;
use crate::cli::PlanArgs;
use crate::error::Failure;
use crate::kit::bytes::GIB;
use crate::kit::schema::Transport;
use crate::plan::{input_from_kit, parse_meminfo, plan, Assumption, Plan};

#[allow(clippy::cast_precision_loss)]
fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

#[allow(clippy::cast_precision_loss)]
fn gib_i(bytes: i64) -> f64 {
    bytes as f64 / GIB as f64
}

pub fn run(args: &PlanArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let resolved = load::resolve(&args.kit, &ctx.env)?;
    let kit = &resolved.kit;
    let (ckpt, label) = checkpoint_in(kit, &ctx.env, args.model.as_ref(), args.r#virtual, true)?;
    let budget = weight_budget(&ckpt, kit.tensor_parallel_size, num_hidden_layers(&kit.model.k_map))
        .map_err(|e| Failure::usage(e.to_string()))?;
    let mut measured = Vec::new();
    if args.measure {
        let text = std::fs::read_to_string("/proc/meminfo")
            .map_err(|e| Failure::runtime(format!("--measure: cannot read /proc/meminfo: {e}")))?;
        let (total, available) = parse_meminfo(&text)
            .ok_or_else(|| Failure::runtime("--measure: /proc/meminfo has no MemTotal/MemAvailable"))?;
        let local = kit.nodes.iter().find(|n| n.transport == Transport::Local).map_or("local", |n| n.name.as_str());
        measured.push((local.to_string(), total, available));
    }
    let source = format!("weight budget at TP {} over {label}", kit.tensor_parallel_size);
    let mut p = plan(&input_from_kit(kit, budget.per_rank_bytes, source, &measured));
    if matches!(ckpt.origin, Origin::Virtual { .. }) {
        for (name, value, from) in DeepSeekV41Dims::default().sources() {
            p.assumptions.push(Assumption { name: format!("virtual checkpoint: {name}"), value, source: from.into() });
        }
    }
    let text = if args.json {
        serde_json::to_string_pretty(&p).map_err(|e| Failure::runtime(e.to_string()))?
    } else {
        human(&p)
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))?;
    let unfit: Vec<&str> = p
        .nodes
        .iter()
        .filter(|n| n.headroom.is_some_and(|h| h < 0) || n.boot.as_ref().is_some_and(|b| !b.ok))
        .map(|n| n.name.as_str())
        .collect();
    if unfit.is_empty() {
        Ok(())
    } else {
        Err(Failure::runtime(format!("the plan does not fit on: {}", unfit.join(", ")))
            .with_hint("see the warnings above for what to change"))
    }
}

fn human(p: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "weights per rank: {} ({})", size(p.weights_per_rank), p.weights_source);
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
                "{}: predicted MemAvailable floor during a {}-token prefill {:.2} GiB (must stay ≥ {:.2}); prompt limited by {}",
                n.name,
                p.max_model_len,
                gib_i(x.floor_at_max_model_len),
                gib_i(x.required_floor),
                x.limited_by.name()
            );
        }
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
