//! What the overlay's reconciliation with released vLLM costs per rank (docs/exl3-overlay.md,
//! "DeepSeek V4.1: how each class is served"). vLLM's `DeepseekV41ForCausalLM` builds `lm_head`,
//! `indexer.wk` and the compressor's `wkv`/`wgate` without a quantization method, and its CUDA
//! o-projection reads `wo_a.weight` itself; the overlay decodes those EXL3 matrices to dense bf16
//! at load (the eight `attn.wo_a.slice.{g}` stacked into vLLM's one `wo_a`). Each such matrix
//! then holds `in × out × 2` bytes instead of its EXL3 bytes, split the way vLLM splits the layer:
//! `lm_head` by vocabulary and `wo_a` by output (column-parallel) over the ranks, `indexer.wk` and
//! the compressor replicated on each. Pure, over the checkpoint's shapes.

use std::collections::BTreeMap;

use serde::Serialize;

use super::budget::{rank_share, share};
use super::exl3_audit::{packed_prefixes, split_name};
use super::Checkpoint;

/// The classes vLLM builds without an EXL3 method, and how vLLM splits each.
const DENSE_AT_LOAD: [(&str, &str, Split); 4] = [
    ("head", "lm_head (ParallelLMHead, quant_config=None)", Split::Out),
    ("attn.wo_a", "wo_a (ColumnParallelLinear, is_bmm; read by the o-projection)", Split::Out),
    ("attn.indexer.wk", "indexer.wk (ReplicatedLinear, quant_config=None)", Split::Replicated),
    ("attn.compressor", "compressor fused_wkv_wgate (disable_tp, quant_config=None)", Split::Replicated),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    /// Split along the output dimension over the ranks (vocabulary for the head).
    Out,
    Replicated,
}

/// Which dense-at-load class a packed matrix belongs to (`None`: it keeps its EXL3 method).
fn class_of(prefix: &str) -> Option<usize> {
    let module = prefix.split_once(".attn.").map_or(prefix, |(_, m)| m);
    let key = if prefix == "head" {
        "head"
    } else if module.starts_with("wo_a.slice.") {
        "attn.wo_a"
    } else if module == "indexer.wk" {
        "attn.indexer.wk"
    } else if module == "compressor.wkv" || module == "compressor.wgate" {
        "attn.compressor"
    } else {
        return None;
    };
    DENSE_AT_LOAD.iter().position(|(k, _, _)| *k == key)
}

/// Whether the packed matrix `prefix` is decoded to dense bf16 at load (its K then costs nothing).
#[must_use]
pub fn is_dense_at_load(prefix: &str) -> bool {
    class_of(prefix).is_some()
}

/// One class decoded to dense bf16 at load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DenseClass {
    /// The checkpoint's class (`head`, `attn.wo_a`, `attn.indexer.wk`, `attn.compressor`).
    pub class: &'static str,
    /// The vLLM layer that holds it.
    pub vllm_layer: &'static str,
    /// `split` (over the ranks) or `replicated` (a full copy on each).
    pub split: &'static str,
    /// EXL3 matrices of the class in the checkpoint.
    pub matrices: u64,
    /// What its EXL3 tensors would take on the largest rank.
    pub exl3_per_rank: u64,
    /// What its dense bf16 weights take on the largest rank.
    pub dense_per_rank: u64,
    /// `dense_per_rank − exl3_per_rank`.
    pub extra_per_rank: u64,
}

/// The cost of the reconciliation at one tensor-parallel size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct DenseAtLoad {
    pub classes: Vec<DenseClass>,
    /// Sum of the classes' `extra_per_rank`: what serving them dense adds to each rank.
    pub extra_per_rank: u64,
}

/// The classes of `ckpt` the overlay serves dense at load on DeepSeek V4.1 (none on other
/// models: their checkpoints have no `attn.wo_a.slice.*`), at tensor parallel size `tp`.
#[must_use]
pub fn dense_at_load(ckpt: &Checkpoint, tp: u32, num_hidden_layers: u32) -> DenseAtLoad {
    let packed = packed_prefixes(ckpt);
    if !packed.iter().any(|p| p.contains(".attn.wo_a.slice.")) {
        return DenseAtLoad::default();
    }
    // (matrices, EXL3 bytes on the largest rank, dense bytes on the largest rank) per class.
    let mut acc: BTreeMap<usize, (u64, u64, u64)> = BTreeMap::new();
    for t in &ckpt.tensors {
        let (prefix, leaf) = split_name(&t.name);
        let Some(i) = packed.contains(prefix).then(|| class_of(prefix)).flatten() else { continue };
        let a = acc.entry(i).or_default();
        a.1 += share(t, true, num_hidden_layers, tp).bytes(t.bytes());
        if leaf == "trellis" {
            // trellis [in/16, out/16, 16·K]: the dense matrix is in × out bf16.
            let (tiles_in, tiles_out) = (t.shape.first().copied().unwrap_or(0), t.shape.get(1).copied().unwrap_or(0));
            let dense = tiles_in * 16 * tiles_out * 16 * 2;
            a.0 += 1;
            a.2 += match DENSE_AT_LOAD[i].2 {
                Split::Out => rank_share(dense, tiles_out, tp),
                Split::Replicated => dense,
            };
        }
    }
    let classes: Vec<DenseClass> = acc
        .into_iter()
        .map(|(i, (matrices, exl3, dense))| {
            let (class, vllm_layer, split) = DENSE_AT_LOAD[i];
            DenseClass {
                class,
                vllm_layer,
                split: if split == Split::Out { "split" } else { "replicated" },
                matrices,
                exl3_per_rank: exl3,
                dense_per_rank: dense,
                extra_per_rank: dense.saturating_sub(exl3),
            }
        })
        .collect();
    DenseAtLoad { extra_per_rank: classes.iter().map(|c| c.extra_per_rank).sum(), classes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::dsv41::{deepseek_v41_flash_exl3, DeepSeekV41Dims};
    use crate::checkpoint::exl3_audit::num_hidden_layers;
    use crate::kit::builtin_kit;

    const MIB: u64 = 1 << 20;

    fn at(tp: u32) -> DenseAtLoad {
        let kit = builtin_kit("dgx-spark-2x-dsv41-exl3");
        let ckpt = deepseek_v41_flash_exl3(&DeepSeekV41Dims::default()).unwrap();
        dense_at_load(&ckpt, tp, num_hidden_layers(&kit.model.k_map))
    }

    fn class<'a>(d: &'a DenseAtLoad, name: &str) -> &'a DenseClass {
        d.classes.iter().find(|c| c.class == name).unwrap()
    }

    #[test]
    fn the_virtual_flash_at_tp2_costs_what_the_overlay_table_says() {
        let d = at(2);
        // lm_head: V 129,280 × H 5120 bf16, vocabulary-split over 2 ranks = 631.25 MiB.
        let head = class(&d, "head");
        assert_eq!((head.matrices, head.dense_per_rank), (1, 129_280 * 5120 * 2 / 2));
        assert_eq!(head.dense_per_rank / MIB, 631);
        // wo_a: 43 layers (40 + 3 DSpark) × 8 slices of 4096 × 1024, column-split: 32 MiB a layer.
        let wo_a = class(&d, "attn.wo_a");
        assert_eq!((wo_a.matrices, wo_a.dense_per_rank), (43 * 8, 43 * 8 * 4096 * 1024 * 2 / 2));
        assert_eq!(wo_a.dense_per_rank / MIB, 1376);
        // indexer.wk (512 → 128) and the compressor (5120 → 512, wgate at ratio 2): replicated.
        let wk = class(&d, "attn.indexer.wk");
        assert_eq!(wk.dense_per_rank, wk.matrices * 512 * 128 * 2);
        assert_eq!(wk.split, "replicated");
        let comp = class(&d, "attn.compressor");
        assert_eq!(comp.dense_per_rank, comp.matrices * 5120 * 512 * 2);
        for c in &d.classes {
            assert!(c.dense_per_rank > c.exl3_per_rank, "{c:?}");
            assert_eq!(c.extra_per_rank, c.dense_per_rank - c.exl3_per_rank);
        }
        assert_eq!(d.extra_per_rank, d.classes.iter().map(|c| c.extra_per_rank).sum::<u64>());
        // The overlay's table: about +1.34 GiB per rank at T = 2 (wo_a +952, head +394 MiB, …).
        let gib = d.extra_per_rank as f64 / (1u64 << 30) as f64;
        assert!((1.30..1.40).contains(&gib), "{gib}");
    }

    #[test]
    fn split_classes_halve_with_the_ranks_and_replicated_ones_do_not() {
        let (one, two) = (at(1), at(2));
        assert_eq!(class(&one, "head").dense_per_rank, 2 * class(&two, "head").dense_per_rank);
        assert_eq!(class(&one, "attn.wo_a").dense_per_rank, 2 * class(&two, "attn.wo_a").dense_per_rank);
        assert_eq!(class(&one, "attn.compressor").dense_per_rank, class(&two, "attn.compressor").dense_per_rank);
    }
}
