//! `spark-kit plan [--kit K] [--json]`: the per-node memory plan.

use std::fmt::Write as _;

use super::checkpoint_source::{checkpoint_in, is_dsv41_flash_exl3};
use super::{io_failure, load, Context};
use crate::checkpoint::budget::weight_budget;
use crate::checkpoint::exl3_audit::num_hidden_layers;
use crate::checkpoint::virtual_ckpt::DeepSeekV41Dims;
use crate::checkpoint::Origin;
use crate::cli::PlanArgs;
use crate::error::Failure;
use crate::kit::bytes::human_size as size;
use crate::kit::bytes::GIB;
use crate::kit::schema::Transport;
use crate::plan::reference::{self as measured, KV_TOKENS_IN_POOL};
use crate::plan::{input_from_kit, kv, kv_tokens, parse_meminfo, plan, Assumption, Plan, PlanInput};

/// The band of a weight figure from modelled shapes: ±0.5 % (per mille), the tolerance the
/// modelled DeepSeek V4.1 Flash is held to against the reference's measured 99.5 GiB/rank.
const MODELLED_BAND_PER_MILLE: u64 = 5;

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
    let modelled = matches!(ckpt.origin, Origin::Virtual { .. });
    let mut input = input_from_kit(kit, budget.per_rank_bytes, source, &measured);
    if modelled {
        input.weights_band = budget.per_rank_bytes / 1000 * MODELLED_BAND_PER_MILLE;
    }
    let kv_note = derive_kv(kit, &mut input);
    let mut p = plan(&input);
    let mut more = Vec::new();
    for c in budget.by_class.iter().filter(|c| c.per_rank_bytes > 0) {
        more.push(Assumption {
            name: format!("weights: {}", c.class.name()),
            value: format!("{:.3} GiB per rank", gib(c.per_rank_bytes)),
            source: format!(
                "{:.3} split + {:.3} replicated (checkpoint tensors)",
                gib(c.split_bytes),
                gib(c.replicated_bytes)
            ),
        });
    }
    more.extend(kv_note);
    if modelled {
        for (name, value, from) in DeepSeekV41Dims::default().sources() {
            more.push(Assumption { name: format!("virtual checkpoint: {name}"), value, source: from.into() });
        }
        if kit.engine.extra_args.iter().any(|a| a == "--language-model-only") {
            more.push(Assumption {
                name: "vision tower".into(),
                value: budget
                    .class(crate::checkpoint::names::Class::Vision)
                    .map_or_else(|| "0".into(), |c| format!("{:.2} GiB counted", gib(c.per_rank_bytes))),
                source: "counted although the kit passes --language-model-only (vLLM then skips it): conservative"
                    .into(),
            });
        }
    }
    p.assumptions.extend(more);
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

/// For the DeepSeek V4.1 Flash kit without a kit value: KV bytes per token from the model's
/// shapes, with the reference's measured figure as the check. Returns the assumption lines.
fn derive_kv(kit: &crate::kit::schema::Kit, input: &mut PlanInput) -> Vec<Assumption> {
    if !is_dsv41_flash_exl3(kit) {
        return Vec::new();
    }
    let shape = DeepSeekV41Dims::default().kv_shape(kit.engine.block_size);
    let Some(d) = kv::derive(&shape) else { return Vec::new() };
    let mut out = Vec::new();
    if input.kv_bytes_per_token == 0.0 {
        input.kv_bytes_per_token = d.bytes_per_token;
        input.kv_bytes_source = format!("derived from the model's shapes: {}", d.explain(&shape));
    }
    let pool = (measured::POOL_GIB * GIB as f64) as u64;
    if let Some(t) = kv_tokens(pool, d.bytes_per_token, 64).filter(|_| kit.engine.block_size == 64) {
        #[allow(clippy::cast_precision_loss)]
        let off = (t as f64 - KV_TOKENS_IN_POOL as f64) / KV_TOKENS_IN_POOL as f64 * 100.0;
        out.push(Assumption {
            name: "KV model check".into(),
            value: format!("{t} tokens in 2.5 GiB at block 64 ({off:+.2} % vs the reference's {KV_TOKENS_IN_POOL})"),
            source: "reference-kit.md D: fp8_ds_mla 774,400 tokens in 2.5 GiB".into(),
        });
    }
    out
}

fn human(p: &Plan) -> String {
    let mut s = String::new();
    let band = if p.weights_band > 0 { format!(" ± {}", size(p.weights_band)) } else { String::new() };
    let _ = writeln!(s, "weights per rank: {}{band} ({})", size(p.weights_per_rank), p.weights_source);
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
