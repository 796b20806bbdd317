//! The memory plan of a kit over a checkpoint (`spark-kit plan`): the weight budget of the
//! checkpoint at the kit's tensor parallelism, the planner's input from the kit, and the
//! assumptions only the checkpoint can name (weights per class, the modelled DeepSeek V4.1
//! Flash's shapes and KV bytes per token).

use super::budget::{weight_budget, BudgetError};
use super::exl3_audit::num_hidden_layers;
use super::names::Class;
use super::reconcile::dense_at_load;
use super::virtual_ckpt::DeepSeekV41Dims;
use super::{Checkpoint, Origin};
use crate::kit::bytes::{human_size, GIB};
use crate::kit::schema::Kit;
use crate::plan::reference::{self as measured, KV_TOKENS_IN_POOL};
use crate::plan::{input_from_kit, kv, kv_tokens, plan, Assumption, DenseLine, Plan, PlanInput};

/// The band of a weight figure from modelled shapes: ±0.5 % (per mille), the tolerance the
/// modelled DeepSeek V4.1 Flash is held to against the reference's measured 99.5 GiB/rank.
const MODELLED_BAND_PER_MILLE: u64 = 5;

/// Whether the kit serves the checkpoint the virtual model describes.
#[must_use]
pub fn is_dsv41_flash_exl3(kit: &Kit) -> bool {
    kit.model.repo.to_ascii_lowercase().contains("deepseek-v4.1-flash-exl3")
}

#[allow(clippy::cast_precision_loss)]
fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

/// The plan of `kit` over `ckpt` (`label`: where the checkpoint came from); `measured`:
/// `(node name, MemTotal, MemAvailable)` of the nodes measured here.
pub fn kit_plan(
    kit: &Kit,
    ckpt: &Checkpoint,
    label: &str,
    measured: &[(String, u64, u64)],
) -> Result<Plan, BudgetError> {
    let layers = num_hidden_layers(&kit.model.k_map);
    let budget = weight_budget(ckpt, kit.tensor_parallel_size, layers)?;
    let dense = dense_at_load(ckpt, kit.tensor_parallel_size, layers);
    let mut source = format!("weight budget at TP {} over {label}", kit.tensor_parallel_size);
    if dense.extra_per_rank > 0 {
        source.push_str(&format!(", + {:.3} GiB of classes served dense at load", gib(dense.extra_per_rank)));
    }
    let per_rank = budget.per_rank_bytes + dense.extra_per_rank;
    let modelled = matches!(ckpt.origin, Origin::Virtual { .. });
    let mut input = input_from_kit(kit, per_rank, source, measured);
    if modelled {
        input.weights_band = per_rank / 1000 * MODELLED_BAND_PER_MILLE;
    }
    let kv_note = derive_kv(kit, &mut input);
    let mut p = plan(&input);
    p.engine = kit.engine_line();
    for c in &dense.classes {
        p.assumptions.push(Assumption {
            name: format!("dense at load: {}", c.class),
            value: format!("+{} per rank", human_size(c.extra_per_rank)),
            source: format!(
                "dense bf16 {} − EXL3 {} per rank over {} EXL3 matrices ({}; vLLM's {}): docs/exl3-overlay.md",
                human_size(c.dense_per_rank),
                human_size(c.exl3_per_rank),
                c.matrices,
                c.split,
                c.vllm_layer
            ),
        });
    }
    p.dense_at_load = dense
        .classes
        .iter()
        .map(|c| DenseLine {
            class: c.class.into(),
            vllm_layer: c.vllm_layer.into(),
            split: c.split.into(),
            exl3_per_rank: c.exl3_per_rank,
            dense_per_rank: c.dense_per_rank,
            extra_per_rank: c.extra_per_rank,
        })
        .collect();
    for c in budget.by_class.iter().filter(|c| c.per_rank_bytes > 0) {
        p.assumptions.push(Assumption {
            name: format!("weights: {}", c.class.name()),
            value: format!("{:.3} GiB per rank", gib(c.per_rank_bytes)),
            source: format!(
                "{:.3} split + {:.3} replicated (checkpoint tensors)",
                gib(c.split_bytes),
                gib(c.replicated_bytes)
            ),
        });
    }
    p.assumptions.extend(kv_note);
    if modelled {
        for (name, value, from) in DeepSeekV41Dims::default().sources() {
            p.assumptions.push(Assumption { name: format!("virtual checkpoint: {name}"), value, source: from.into() });
        }
        if kit.engine.extra_args.iter().any(|a| a == "--language-model-only") {
            p.assumptions.push(Assumption {
                name: "vision tower".into(),
                value: budget
                    .class(Class::Vision)
                    .map_or_else(|| "0".into(), |c| format!("{:.2} GiB counted", gib(c.per_rank_bytes))),
                source: "counted although the kit passes --language-model-only (vLLM then skips it): conservative"
                    .into(),
            });
        }
    }
    Ok(p)
}

/// The plan of `kit` before its checkpoint can be read (a model the engine side makes on its
/// first start): the weights are unknown, so no node has headroom and there is no prefill
/// budget rather than a made-up one. The KV side is [`kit_plan`]'s.
#[must_use]
pub fn plan_without_weights(kit: &Kit) -> Plan {
    let mut input = input_from_kit(kit, 0, "unknown", &[]);
    input.nodes.iter_mut().for_each(|n| n.memory_total = None);
    let kv_note = derive_kv(kit, &mut input);
    let mut p = plan(&input);
    p.engine = kit.engine_line();
    p.assumptions.extend(kv_note);
    p
}

/// The nodes the plan says do not fit (negative headroom, or a boot rule not met).
#[must_use]
pub fn unfit(p: &Plan) -> Vec<&str> {
    p.nodes
        .iter()
        .filter(|n| n.headroom.is_some_and(|h| h < 0) || n.boot.as_ref().is_some_and(|b| !b.ok))
        .map(|n| n.name.as_str())
        .collect()
}

/// For the DeepSeek V4.1 Flash kit without a kit value: KV bytes per token from the model's
/// shapes, with the reference's measured figure as the check. Returns the assumption lines.
fn derive_kv(kit: &Kit, input: &mut PlanInput) -> Vec<Assumption> {
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kit::builtin_kit as kit;

    #[test]
    fn the_modelled_flash_plan_names_its_sources_and_band() {
        let k = kit("dgx-spark-2x-dsv41-exl3");
        let ckpt = super::super::virtual_ckpt::deepseek_v41_flash_exl3(&DeepSeekV41Dims::default()).unwrap();
        let p = kit_plan(&k, &ckpt, "virtual", &[]).unwrap();
        assert!(p.weights_band > 0, "{p:?}");
        assert!(p.weights_source.contains("over virtual"), "{}", p.weights_source);
        assert!(p.assumptions.iter().any(|a| a.name.starts_with("virtual checkpoint: ")), "{:?}", p.assumptions);
        assert!(p.assumptions.iter().any(|a| a.name.starts_with("weights: ")), "{:?}", p.assumptions);
        assert!(p.assumptions.iter().any(|a| a.name == "KV model check"), "{:?}", p.assumptions);
    }
}
