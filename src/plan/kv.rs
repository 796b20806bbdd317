//! KV bytes per token from the model's shapes, for the planner's pool → tokens conversion.
//!
//! The model (DeepSeek V4.1's CSA2 attention on vLLM's packed `*_ds_mla` caches):
//! - one `fp8_ds_mla` entry on GB10 (vLLM keeps the V4 record below SM100) is `nope` FP8 bytes +
//!   `rope` BF16 values + one UE8M0 scale per 64 nope values + 1 pad byte (448 + 128 + 7 + 1 =
//!   584 B for head_dim 512, rope 64), pages aligned to 576 B;
//! - one `nvfp4_ds_mla` entry is the compressed cache as NVFP4: head_dim/2 bytes of e2m1 pairs +
//!   one e4m3 scale per 16 values (256 + 32 = 288 B), pages aligned to 512 B; vLLM builds it only
//!   with the V4.1 records FlashMLA decodes on SM100 (docs/plan.md cites the lines);
//! - only the KV-source layers own a compressed cache (the others read the nearest source's);
//!   a source at compress ratio r holds one entry per r tokens;
//! - vLLM's hybrid allocator gives every KV-cache group one page of `block_size` entries per
//!   block and pads the groups to the largest one (layers with the same ratio share a group), so
//!   the pool spends `groups × largest group` pages per block; a page is padded to 576 B
//!   (FlashMLA alignment);
//! - the indexer's keys are not in the pool: the pinned build keeps them in the indexer
//!   workspace, `max_model_len × factor × 132 B` (reference-kit.md C.3).
//!
//! The reference figure (774,400 tokens in 2.5 GiB at block 64, reference-kit.md D) is the
//! check of this model, not its input.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::kit::schema::KvCacheDtype;

/// FlashMLA's page alignment for the V4 `fp8_ds_mla` record (GB10).
pub const PAGE_ALIGNMENT: u64 = 576;
/// The page alignment of the V4.1 records (`nvfp4_ds_mla`, SM100).
pub const V41_PAGE_ALIGNMENT: u64 = 512;

/// One record layout: bytes per cache entry and page alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvRecord {
    /// `fp8_ds_mla` or `nvfp4_ds_mla` (`auto` resolves to `fp8_ds_mla`).
    pub dtype: &'static str,
    pub entry_bytes: u64,
    pub page_alignment: u64,
}

/// The record vLLM stores for `dtype` at these head dims (`auto` is `fp8_ds_mla`, as vLLM
/// resolves it for DeepSeek V4.1).
#[must_use]
pub const fn record(dtype: KvCacheDtype, head_dim: u64, rope_head_dim: u64) -> KvRecord {
    match dtype {
        KvCacheDtype::Auto | KvCacheDtype::Fp8DsMla => KvRecord {
            dtype: "fp8_ds_mla",
            entry_bytes: fp8_ds_mla_entry(head_dim, rope_head_dim),
            page_alignment: PAGE_ALIGNMENT,
        },
        KvCacheDtype::Nvfp4DsMla => KvRecord {
            dtype: "nvfp4_ds_mla",
            entry_bytes: nvfp4_ds_mla_entry(head_dim),
            page_alignment: V41_PAGE_ALIGNMENT,
        },
    }
}

/// The shapes the KV model reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvShape {
    pub head_dim: u64,
    pub rope_head_dim: u64,
    /// `(layer, compress ratio)` of every layer that owns a compressed-KV cache.
    pub sources: Vec<(u32, u32)>,
    /// Tokens per block (`--block-size`).
    pub block_size: u32,
    /// The record (`--kv-cache-dtype`).
    pub dtype: KvCacheDtype,
}

/// The derivation, step by step (for the plan's assumptions and docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvDerivation {
    /// `fp8_ds_mla` or `nvfp4_ds_mla`.
    pub dtype: &'static str,
    pub entry_bytes: u64,
    pub page_bytes: u64,
    /// Layers per compress ratio.
    pub groups: BTreeMap<u32, u32>,
    /// Pages per block: groups × largest group.
    pub slots: u64,
    pub bytes_per_token: f64,
}

impl KvDerivation {
    /// One line: how the figure was reached.
    #[must_use]
    pub fn explain(&self, shape: &KvShape) -> String {
        let groups: Vec<String> = self.groups.iter().map(|(r, n)| format!("{n} at ratio {r}")).collect();
        format!(
            "{} pages × {} B per {}-token block: entry {} B ({}, head {} / rope {}), KV sources {}",
            self.slots,
            self.page_bytes,
            shape.block_size,
            self.entry_bytes,
            self.dtype,
            shape.head_dim,
            shape.rope_head_dim,
            groups.join(" + ")
        )
    }
}

/// Bytes of one `fp8_ds_mla` entry: nope FP8 + rope BF16 + a UE8M0 scale per 64 nope + 1 pad.
#[must_use]
pub const fn fp8_ds_mla_entry(head_dim: u64, rope_head_dim: u64) -> u64 {
    let nope = head_dim.saturating_sub(rope_head_dim);
    nope + 2 * rope_head_dim + nope / 64 + 1
}

/// Bytes of one `nvfp4_ds_mla` compressed entry: two e2m1 values per byte + one e4m3 scale per
/// 16 values (256 + 32 = 288 B for head_dim 512).
#[must_use]
pub const fn nvfp4_ds_mla_entry(head_dim: u64) -> u64 {
    head_dim / 2 + head_dim / 16
}

/// KV bytes per pool token (`None` when the shape owns no cache or the block size is 0).
#[must_use]
pub fn derive(shape: &KvShape) -> Option<KvDerivation> {
    let mut groups: BTreeMap<u32, u32> = BTreeMap::new();
    for &(_, ratio) in shape.sources.iter().filter(|(_, r)| *r > 0) {
        *groups.entry(ratio).or_default() += 1;
    }
    let largest = u64::from(groups.values().copied().max()?);
    if shape.block_size == 0 {
        return None;
    }
    let block = u64::from(shape.block_size);
    let rec = record(shape.dtype, shape.head_dim, shape.rope_head_dim);
    let entry_bytes = rec.entry_bytes;
    let page_bytes = (block * entry_bytes).div_ceil(rec.page_alignment) * rec.page_alignment;
    let slots = groups.len() as u64 * largest;
    #[allow(clippy::cast_precision_loss)] // far below 2^53
    let bytes_per_token = (slots * page_bytes) as f64 / block as f64;
    Some(KvDerivation { dtype: rec.dtype, entry_bytes, page_bytes, groups, slots, bytes_per_token })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v41(block: u32) -> KvShape {
        KvShape {
            head_dim: 512,
            rope_head_dim: 64,
            sources: vec![(2, 2), (8, 2), (14, 2), (20, 1)],
            block_size: block,
            dtype: KvCacheDtype::Fp8DsMla,
        }
    }

    #[test]
    fn nvfp4_entry_is_vllm_compressed_record() {
        // vLLM's attention.py: "256 B of e2m1 pairs + 32 e4m3 scales" = 288.
        assert_eq!(nvfp4_ds_mla_entry(512), 288);
        let d = derive(&KvShape { dtype: KvCacheDtype::Nvfp4DsMla, ..v41(64) }).unwrap();
        assert_eq!(d.page_bytes, 18_432); // 64 × 288, already a multiple of 512
        assert!((d.bytes_per_token - 1728.0).abs() < 1e-9);
        assert_eq!(d.dtype, "nvfp4_ds_mla");
        // auto is what vLLM resolves it to: fp8_ds_mla.
        let auto = derive(&KvShape { dtype: KvCacheDtype::Auto, ..v41(64) }).unwrap();
        assert!((auto.bytes_per_token - 3510.0).abs() < 1e-9);
    }

    #[test]
    fn entry_is_vllm_head_bytes() {
        // vLLM's DeepseekV4 attention: 448 fp8 NoPE + 64 bf16 RoPE + 7 scale bytes + 1 pad.
        assert_eq!(fp8_ds_mla_entry(512, 64), 584);
    }

    #[test]
    fn v41_flash_at_block_64() {
        let d = derive(&v41(64)).unwrap();
        assert_eq!(d.page_bytes, 37_440); // 64 × 584 = 37,376 → 65 × 576
        assert_eq!(d.slots, 6); // ratio 2: 3 layers, ratio 1: 1 layer padded to 3
        assert!((d.bytes_per_token - 3510.0).abs() < 1e-9);
        assert!(d.explain(&v41(64)).contains("3 at ratio 2"));
    }

    #[test]
    fn no_cache_no_figure() {
        assert_eq!(derive(&KvShape { sources: vec![(0, 0)], ..v41(64) }), None);
        assert_eq!(derive(&v41(0)), None);
    }
}
