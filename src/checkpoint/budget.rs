//! Weight bytes per tensor-parallel rank (what `weight_budget.py --tp N` reports in the
//! reference kit, reference-kit.md A.3 step 9).
//!
//! Rules (reference-kit.md C.3 for the MoE, vLLM's linear layers for the rest):
//! - routed and shared experts: `w1`/`w3` (gate/up) column-split — trellis dim 1, `svh`, `bias`;
//!   `w2` (down) row-split — trellis dim 0, `suh`; the other vectors and the marker are replicated;
//! - attention: `wq_b`, `wo_a` (and Llama `q/k/v_proj`) column-split, `wo_b`/`o_proj` row-split,
//!   `wq_a`/`wkv` replicated (low-rank / single-head projections);
//! - head: vocabulary (column) split; embedding: vocabulary rows split;
//! - indexer `wk`, Engram `wkv`, routers, norms, vision and everything else: replicated;
//! - Engram tables (`*.engram.embed.*`): excluded, they are served from files (C.4).
//!
//! Splits happen in whole 16×16 tiles (exl3-format.md §2.5); when the tiles do not divide evenly,
//! rank 0 gets the extra tile and its share is reported (the largest rank).

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use super::exl3_audit::split_name;
use super::names::{classify, Class, Split};
use super::{Checkpoint, Tensor};

/// Bytes of one class on the largest rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClassBudget {
    pub class: Class,
    /// Bytes in the checkpoint.
    pub total_bytes: u64,
    /// Bytes on the largest rank.
    pub per_rank_bytes: u64,
    /// Of `per_rank_bytes`: split parts (column, row or vocabulary).
    pub split_bytes: u64,
    /// Of `per_rank_bytes`: full copies.
    pub replicated_bytes: u64,
    /// Not loaded at all (Engram tables).
    pub excluded_bytes: u64,
}

/// The per-rank weight budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Budget {
    pub tensor_parallel_size: u32,
    /// Weights on the largest rank.
    pub per_rank_bytes: u64,
    /// Every tensor of the checkpoint.
    pub total_bytes: u64,
    /// Bytes excluded from GPU memory (file-backed Engram tables).
    pub excluded_bytes: u64,
    pub by_class: Vec<ClassBudget>,
}

impl Budget {
    /// One class's line, if present.
    #[must_use]
    pub fn class(&self, class: Class) -> Option<&ClassBudget> {
        self.by_class.iter().find(|c| c.class == class)
    }
}

/// Why a budget cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("tensor parallel size must be at least 1")]
    ZeroTensorParallel,
}

/// The largest rank's share of `bytes` made of `units` equal slices split over `tp` ranks.
#[must_use]
pub fn rank_share(bytes: u64, units: u64, tp: u32) -> u64 {
    if units == 0 || tp <= 1 {
        return bytes;
    }
    let per_unit = bytes / units;
    per_unit * units.div_ceil(u64::from(tp)) + (bytes % units)
}

/// How a tensor splits: the number of equal slices along the split dimension, or `None` when
/// it is replicated (`Some(0)` = excluded).
fn slices(t: &Tensor, leaf: &str, packed: bool, split: Split) -> Option<u64> {
    let dim = |d: usize| t.shape.get(d).copied();
    let tiles = |len: Option<u64>| len.map(|n| if n % 16 == 0 { n / 16 } else { n });
    match (split, packed) {
        (Split::Excluded, _) => Some(0),
        (Split::Replicated, _) => None,
        // Packed matrices: W is stored as (in, out).
        (Split::Column, true) => match leaf {
            "trellis" => dim(1),
            "svh" | "bias" => tiles(dim(0)),
            "sv" => dim(0),
            _ => None,
        },
        (Split::Row, true) => match leaf {
            "trellis" => dim(0),
            "suh" => tiles(dim(0)),
            "su" => dim(0),
            _ => None,
        },
        // A quantized embedding (`E.trellis [vocab, …]`) and native embeddings split by rows.
        (Split::VocabRows, _) => dim(0),
        // Native linears are `nn.Linear.weight` = [out, in].
        (Split::Column, false) => dim(0),
        (Split::Row, false) => {
            if t.shape.len() >= 2 {
                dim(1)
            } else {
                None
            }
        }
    }
}

#[derive(Default)]
struct Acc {
    total: u64,
    split: u64,
    replicated: u64,
    excluded: u64,
}

/// What one tensor puts on the largest rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Not loaded (file-backed Engram tables).
    Excluded,
    /// Its largest rank's part of a split, in bytes.
    Split(u64),
    /// A full copy on every rank.
    Replicated,
}

impl Share {
    /// Bytes on the largest rank (`bytes`: the whole tensor's).
    #[must_use]
    pub const fn bytes(self, bytes: u64) -> u64 {
        match self {
            Self::Excluded => 0,
            Self::Split(b) => b,
            Self::Replicated => bytes,
        }
    }
}

/// How tensor `t` (part of a packed EXL3 matrix when `packed`) lands on the ranks at `tp`.
#[must_use]
pub fn share(t: &Tensor, packed: bool, num_hidden_layers: u32, tp: u32) -> Share {
    let (prefix, leaf) = split_name(&t.name);
    match slices(t, leaf, packed, classify(prefix, num_hidden_layers).split) {
        Some(0) => Share::Excluded,
        Some(units) => Share::Split(rank_share(t.bytes(), units, tp)),
        None => Share::Replicated,
    }
}

/// Bytes per rank for tensor parallel size `tp`, by class.
///
/// # Errors
/// [`BudgetError::ZeroTensorParallel`].
pub fn weight_budget(ckpt: &Checkpoint, tp: u32, num_hidden_layers: u32) -> Result<Budget, BudgetError> {
    if tp == 0 {
        return Err(BudgetError::ZeroTensorParallel);
    }
    let packed: HashSet<&str> = super::exl3_audit::packed_prefixes(ckpt);
    let mut acc: BTreeMap<Class, Acc> = BTreeMap::new();
    for t in &ckpt.tensors {
        let (prefix, _) = split_name(&t.name);
        let a = acc.entry(classify(prefix, num_hidden_layers).class).or_default();
        let bytes = t.bytes();
        a.total += bytes;
        match share(t, packed.contains(prefix), num_hidden_layers, tp) {
            Share::Excluded => a.excluded += bytes,
            Share::Split(b) => a.split += b,
            Share::Replicated => a.replicated += bytes,
        }
    }
    let by_class: Vec<ClassBudget> = acc
        .into_iter()
        .map(|(class, a)| ClassBudget {
            class,
            total_bytes: a.total,
            per_rank_bytes: a.split + a.replicated,
            split_bytes: a.split,
            replicated_bytes: a.replicated,
            excluded_bytes: a.excluded,
        })
        .collect();
    Ok(Budget {
        tensor_parallel_size: tp,
        per_rank_bytes: by_class.iter().map(|c| c.per_rank_bytes).sum(),
        total_bytes: by_class.iter().map(|c| c.total_bytes).sum(),
        excluded_bytes: by_class.iter().map(|c| c.excluded_bytes).sum(),
        by_class,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_tiles_give_rank_zero_the_extra() {
        assert_eq!(rank_share(100, 10, 2), 50);
        assert_eq!(rank_share(90, 9, 2), 50);
        assert_eq!(rank_share(90, 9, 1), 90);
        assert_eq!(rank_share(7, 0, 4), 7);
    }
}
