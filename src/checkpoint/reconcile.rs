//! What the overlay's reconciliation with released vLLM costs per rank (docs/exl3-overlay.md,
//! "DeepSeek V4.1: how each class is served"). vLLM's `DeepseekV41ForCausalLM` builds `lm_head`,
//! `indexer.wk` and the compressor's `wkv`/`wgate` without a quantization method, and its CUDA
//! o-projection reads `wo_a.weight` itself. The overlay serves `lm_head` and `wo_a` packed in
//! EXL3 (version-checked hooks), and decodes the two small ones, `indexer.wk` and the compressor,
//! to dense bf16 at load: each such matrix then holds `in × out × 2` bytes instead of its EXL3
//! bytes, replicated on each rank. Pure, over the checkpoint's shapes.

use std::collections::BTreeMap;

use serde::Serialize;

use super::budget::{rank_share, share};
use super::exl3_audit::{packed_prefixes, split_name};
use super::Checkpoint;

/// The classes still decoded to dense at load, and how vLLM splits each (`lm_head` and `wo_a`
/// are served packed: docs/exl3-overlay.md).
const DENSE_AT_LOAD: [(&str, &str, Split); 2] = [
    ("attn.indexer.wk", "indexer.wk (ReplicatedLinear, quant_config=None)", Split::Replicated),
    ("attn.compressor", "compressor fused_wkv_wgate (disable_tp, quant_config=None)", Split::Replicated),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    /// Split along the output dimension over the ranks (none of today's classes).
    #[allow(dead_code)]
    Out,
    Replicated,
}

/// Which dense-at-load class a packed matrix belongs to (`None`: it keeps its EXL3 method).
fn class_of(prefix: &str) -> Option<usize> {
    let module = prefix.split_once(".attn.").map_or(prefix, |(_, m)| m);
    let key = if module == "indexer.wk" {
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
    /// The checkpoint's class (`attn.indexer.wk`, `attn.compressor`).
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
        // lm_head and wo_a are served packed (EXL3): not dense at load.
        let names: Vec<&str> = d.classes.iter().map(|c| c.class).collect();
        assert_eq!(names, ["attn.indexer.wk", "attn.compressor"]);
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
        // The overlay's table: about +24 MiB per rank at T = 2 (compressor +24 MiB, indexer.wk +0.25 MiB).
        let mib = d.extra_per_rank as f64 / MIB as f64;
        assert!((20.0..30.0).contains(&mib), "{mib}");
    }

    #[test]
    fn replicated_classes_do_not_shrink_with_the_ranks() {
        let (one, two) = (at(1), at(2));
        assert_eq!(class(&one, "attn.compressor").dense_per_rank, class(&two, "attn.compressor").dense_per_rank);
        assert_eq!(class(&one, "attn.indexer.wk").dense_per_rank, class(&two, "attn.indexer.wk").dense_per_rank);
    }
}
