//! `spark-kit plan --nodes 1`: the single-Spark answer. At tensor parallel 1 every weight is on
//! the one GB10; the checkpoint as is, and the same checkpoint with lower K (bits per weight) for
//! the routed experts and for the other EXL3 classes, each against the node's memory: the weights,
//! what is left for the KV pool, the boot rule, and for each KV record the prefill floor at 128k,
//! 600k and 1M tokens. Pure, over the checkpoint's shapes.
//!
//! A trellis of K bits holds `Kp × Np × K / 8` bytes (exl3-format.md §1.5), so a lower K scales
//! each matrix's trellis exactly; `suh`/`svh` and the natives keep their size. Matrices vLLM
//! serves dense at load (`reconcile`) hold bf16 whatever their K, so a lower K saves nothing
//! there. The Engram tables are file-backed and not counted (as at TP 2).

use std::collections::BTreeMap;

use serde::Serialize;

use super::budget::{weight_budget, BudgetError};
use super::exl3_audit::{num_hidden_layers, split_name};
use super::kit_plan::{at_lengths, is_dsv41_flash_exl3, MODELLED_BAND_PER_MILLE};
use super::names::{classify, Class};
use super::reconcile::{dense_at_load, is_dense_at_load};
use super::{Checkpoint, Origin};
use crate::kit::schema::Kit;
use crate::plan::long_context::ContextAnswer;
use crate::plan::{input_from_kit, Assumption};

/// The context lengths a single-Spark owner asks about.
pub const LENGTHS: [u64; 3] = [131_072, 600_000, crate::plan::long_context::ONE_MILLION];
/// Routed-expert K ceilings tried (EXL3's MUL1 codebook has 1.5 and 2.5).
pub const ROUTED_K: [Option<f64>; 5] = [None, Some(2.5), Some(2.0), Some(1.5), Some(1.0)];
/// Ceilings tried for every other EXL3 class (shared experts, attention, indexer, Engram `wkv`,
/// MTP, head).
pub const OTHER_K: [Option<f64>; 3] = [None, Some(4.0), Some(3.0)];

/// One K map: `None` keeps the checkpoint's K.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KCeiling {
    pub routed: Option<f64>,
    pub others: Option<f64>,
}

impl KCeiling {
    /// `as is`, `routed ≤2`, `routed ≤2, rest ≤4`.
    #[must_use]
    pub fn label(&self) -> String {
        match (self.routed, self.others) {
            (None, None) => "as is".into(),
            (Some(r), None) => format!("routed ≤{r}"),
            (None, Some(o)) => format!("rest ≤{o}"),
            (Some(r), Some(o)) => format!("routed ≤{r}, rest ≤{o}"),
        }
    }
}

/// One K map on one GB10.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SingleRow {
    pub k_map: KCeiling,
    pub label: String,
    /// Weights on the one rank (the dense-at-load classes included).
    pub weights: u64,
    /// memory − weights − runtime − OS: what is left for the KV pool and the prefill (negative:
    /// the weights alone do not fit, by that much).
    pub left_for_kv: i64,
    /// MemAvailable the boot rule needs (weights + boot margin) and what the node has
    /// (memory − OS reserve).
    pub boot_need: u64,
    pub boot_have: u64,
    pub boot_ok: bool,
    /// For each KV record and length in [`LENGTHS`].
    pub kv: Vec<ContextAnswer>,
}

/// The single-Spark answer (`spark-kit plan --nodes 1 --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SinglePlan {
    pub node: String,
    pub memory_total: Option<u64>,
    pub weights_source: String,
    /// ± bytes of each row's weights (0 when read from files).
    pub weights_band_per_mille: u64,
    pub runtime_overhead: u64,
    pub os_reserve: u64,
    pub boot_margin: u64,
    pub rows: Vec<SingleRow>,
    pub assumptions: Vec<Assumption>,
}

/// Per class: (trellis bytes as the checkpoint has them, what they become under `ceil`).
fn trellis_saving(ckpt: &Checkpoint, layers: u32, ceil: KCeiling) -> u64 {
    let mut saved = 0u64;
    for t in ckpt.tensors.iter().filter(|t| t.name.ends_with(".trellis") && t.shape.len() == 3) {
        let (prefix, _) = split_name(&t.name);
        if is_dense_at_load(prefix) {
            continue;
        }
        let role = classify(prefix, layers);
        let cap = if role.base == Class::RoutedExperts && role.class != Class::Mtp { ceil.routed } else { ceil.others };
        let Some(cap) = cap else { continue };
        // Last dimension 16·K; bytes = s0·s1·16K·2 = 32·s0·s1·K.
        #[allow(clippy::cast_precision_loss)]
        let k = t.shape[2] as f64 / 16.0;
        if cap < k {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let new = (t.shape[0] * t.shape[1] * 32) as f64 * cap;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let new = new.round() as u64;
            saved += t.bytes().saturating_sub(new);
        }
    }
    saved
}

/// The single-Spark plan of `kit`'s head node over `ckpt` (`label`: where it came from).
///
/// # Errors
/// A checkpoint the weight budget cannot split.
pub fn single_node(kit: &Kit, ckpt: &Checkpoint, label: &str) -> Result<SinglePlan, BudgetError> {
    let layers = num_hidden_layers(&kit.model.k_map);
    let budget = weight_budget(ckpt, 1, layers)?;
    let as_is = budget.per_rank_bytes + dense_at_load(ckpt, 1, layers).extra_per_rank;
    let modelled = matches!(ckpt.origin, Origin::Virtual { .. });
    let band_per_mille = if modelled { MODELLED_BAND_PER_MILLE } else { 0 };
    let mut one = kit.clone();
    one.nodes.retain(|n| n.role == crate::kit::schema::Role::Head);
    one.nodes.truncate(1);
    one.tensor_parallel_size = 1;
    let base = input_from_kit(&one, as_is, label, &[]);
    let memory_total = base.nodes.first().and_then(|n| n.memory_total);
    let mut seen: BTreeMap<u64, ()> = BTreeMap::new();
    let mut rows = Vec::new();
    for routed in ROUTED_K {
        for others in OTHER_K {
            let ceil = KCeiling { routed, others };
            let weights = as_is - trellis_saving(ckpt, layers, ceil).min(as_is);
            // A ceiling above every K of its class changes nothing: one row per distinct size.
            if seen.insert(weights, ()).is_some() {
                continue;
            }
            let mut input = base.clone();
            input.weights_per_rank = weights;
            input.weights_band = weights / 1000 * band_per_mille;
            let total = memory_total.unwrap_or(0);
            let fixed = i128::from(weights) + i128::from(input.runtime_overhead) + i128::from(input.os_reserve);
            let left_for_kv = i64::try_from(i128::from(total) - fixed).unwrap_or(i64::MIN);
            let boot_need = weights + input.boot_margin;
            let boot_have = total.saturating_sub(input.os_reserve);
            let kv = if is_dsv41_flash_exl3(kit) { at_lengths(kit, &input, &LENGTHS) } else { Vec::new() };
            rows.push(SingleRow {
                k_map: ceil,
                label: ceil.label(),
                weights,
                left_for_kv,
                boot_need,
                boot_have,
                boot_ok: memory_total.is_some() && boot_have >= boot_need,
                kv,
            });
        }
    }
    Ok(SinglePlan {
        node: base.nodes.first().map_or_else(|| "local".into(), |n| n.name.clone()),
        memory_total,
        weights_source: format!("weight budget at TP 1 over {label}"),
        weights_band_per_mille: band_per_mille,
        runtime_overhead: base.runtime_overhead,
        os_reserve: base.os_reserve,
        boot_margin: base.boot_margin,
        rows,
        assumptions: assumptions(modelled),
    })
}

fn assumptions(modelled: bool) -> Vec<Assumption> {
    let a = |name: &str, value: &str, source: &str| Assumption {
        name: name.into(),
        value: value.into(),
        source: source.into(),
    };
    let mut v = vec![
        a(
            "lower K",
            "each trellis re-sized to Kp × Np × K / 8 bytes; suh/svh and natives unchanged",
            "exl3-format.md §1.5 (trellis [Kp/16, Np/16, 16K] of int16)",
        ),
        a(
            "served dense at load",
            "indexer.wk, compressor: bf16 whatever their K (head and attn.wo_a are served packed)",
            "docs/exl3-overlay.md; src/checkpoint/reconcile.rs",
        ),
        a("Engram tables", "file-backed, not counted", "reference-kit.md C.4"),
        a(
            "prefill floor at TP 1",
            "the TP 2 model (reference-kit.md D) on one node's headroom",
            "not measured on one Spark: a single rank holds whole activations, so the real floor is lower (optimistic)",
        ),
        a(
            "runtime overhead",
            "the kit's memory.runtime_overhead, NCCL included",
            "one node has no cross-node NCCL buffers: conservative by ~0.14 GiB",
        ),
    ];
    if modelled {
        v.push(a(
            "weights error band",
            "±0.5 % of each row's weights; floors at weights + band",
            "the modelled checkpoint's tolerance against the reference's measured 99.5 GiB/rank",
        ));
    }
    v
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::checkpoint::virtual_ckpt::{deepseek_v41_flash_exl3, DeepSeekV41Dims};
    use crate::kit::builtin_kit;
    use crate::kit::bytes::GIB;

    fn spark_single() -> SinglePlan {
        let ckpt = deepseek_v41_flash_exl3(&DeepSeekV41Dims::default()).unwrap();
        single_node(&builtin_kit("dgx-spark-2x-dsv41-exl3"), &ckpt, "virtual").unwrap()
    }

    #[test]
    fn the_checkpoint_as_is_does_not_fit_one_spark() {
        let p = spark_single();
        let as_is = &p.rows[0];
        assert_eq!(as_is.label, "as is");
        // Twice the TP 2 share, less what is replicated: ~197 GiB on the one rank.
        assert!(as_is.weights > 190 * GIB && as_is.weights < 205 * GIB, "{}", as_is.weights);
        assert!(as_is.left_for_kv < -80 * i64::try_from(GIB).unwrap(), "{}", as_is.left_for_kv);
        assert!(!as_is.boot_ok);
        assert!(as_is.kv.iter().all(|a| !a.fits));
    }

    #[test]
    fn lower_k_shrinks_the_weights_and_routed_experts_dominate() {
        let p = spark_single();
        let w = |label: &str| p.rows.iter().find(|r| r.label == label).map(|r| r.weights).unwrap();
        assert!(w("routed ≤2") < w("as is"));
        assert!(w("routed ≤1") < w("routed ≤1.5"));
        assert!(w("routed ≤2, rest ≤4") < w("routed ≤2"));
        // Routed experts at K 3 → 1 free more than every other class at ≤3.
        assert!(w("as is") - w("routed ≤1") > w("as is") - w("rest ≤3"));
        // One row per distinct weight figure, three KV lengths × two records each.
        assert!(p.rows.iter().all(|r| r.kv.len() == 6), "{:?}", p.rows[0].kv);
        // nvfp4_ds_mla never fits on GB10: vLLM refuses it.
        assert!(p.rows.iter().flat_map(|r| &r.kv).filter(|a| a.dtype == "nvfp4_ds_mla").all(|a| !a.fits));
    }

    #[test]
    fn only_routed_experts_at_k1_boot_on_one_spark() {
        let p = spark_single();
        let boots: Vec<&str> = p.rows.iter().filter(|r| r.boot_ok).map(|r| r.label.as_str()).collect();
        assert_eq!(boots, ["routed ≤1", "routed ≤1, rest ≤4", "routed ≤1, rest ≤3"]);
        // The nearest miss: routed 1.5 with the rest at 3 leaves under 1 GiB for the pool and fails the boot rule.
        let near = p.rows.iter().find(|r| r.label == "routed ≤1.5, rest ≤3").unwrap();
        assert!(near.left_for_kv < i64::try_from(GIB).unwrap() && !near.boot_ok, "{near:?}");
        // What boots serves 1M with fp8_ds_mla (on the TP 2 floor model).
        let k1 = p.rows.iter().find(|r| r.label == "routed ≤1").unwrap();
        assert!(k1.kv.iter().filter(|a| a.dtype == "fp8_ds_mla").all(|a| a.fits), "{k1:?}");
        let text = crate::checkpoint::single_node_text::render(&p);
        assert!(text.contains("first K map that boots and serves 128k: routed ≤1 ("), "{text}");
        assert!(text.contains("fp8@128k"), "{text}");
    }
}
