//! DeepSeek V4.1 Flash as the virtual checkpoint models it: the dimensions of the released
//! `config.json` (`deepseek-ai/DeepSeek-V4.1-Flash`, `text_config` + `vision_config`) and the
//! tensor layout of its EXL3 conversion (reference-kit.md C.1–C.3). `plan` and `verify
//! --virtual` use it before a 197 GiB download; the weight budget and the KV model read the
//! same dimensions.
//!
//! Cross-checks that tie the layout to the reference kit (tests/cli/plan.rs): the model has exactly
//! the 47,900 packed matrices of C.1 (40 × (12 attention + 3 shared + 1,152 routed) + 19 CSA2
//! matrices + 2 Engram `wkv` + 3 DSpark stages × (12 + 3 + 128 × 3) + `main_proj` + `head`),
//! 259 `vision.*` tensors (C.1), and local I = 1152 at TP 2 (C.3).

use std::collections::BTreeMap;

use super::exl3_audit::Codebook;
use super::safetensors::Dtype;
use super::virtual_ckpt::VirtualBuilder;
use super::{Checkpoint, CheckpointError};

/// Where the dimensions come from (one line for `plan`'s assumptions).
pub const CONFIG_SOURCE: &str = "deepseek-ai/DeepSeek-V4.1-Flash config.json (text_config, vision_config)";

/// The vision tower (`vision_config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisionDims {
    pub layers: u64,
    pub dim: u64,
    pub intermediate: u64,
    pub patch: u64,
    /// Aligner unfold factor r: `aligner.w1` reads r² × dim features.
    pub downsample: u64,
}

/// Dimensions of DeepSeek V4.1 Flash (`config.json` key names in the field docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeepSeekV41Dims {
    /// `hidden_size` 5120 (also reference-kit.md C.3, H=5120).
    pub hidden: u64,
    /// `num_hidden_layers` 40 (also C.2).
    pub layers: u32,
    /// `vocab_size` 129,280.
    pub vocab: u64,
    /// `num_attention_heads` 64, one latent KV head (`num_key_value_heads` 1).
    pub heads: u64,
    /// `head_dim` 512, of which `qk_rope_head_dim` 64 rotate.
    pub head_dim: u64,
    pub rope_head_dim: u64,
    /// `q_lora_rank` 1280 (`attn.wq_a` 5120 → 1280).
    pub q_lora_rank: u64,
    /// `o_groups` 8 × `o_lora_rank` 1024 (`attn.wo_a.slice.0..7` 4096 → 1024, `wo_b` 8192 → 5120).
    pub o_groups: u64,
    pub o_lora_rank: u64,
    /// `n_routed_experts` 384, `moe_intermediate_size` 2304 (C.3: local I = 1152 at TP 2).
    pub routed_experts: u64,
    pub expert_intermediate: u64,
    /// `n_shared_experts` 1 × `moe_intermediate_size`.
    pub shared_intermediate: u64,
    /// `compress_ratios`, one per layer incl. the DSpark stages (0 = sliding window only).
    pub compress_ratios: Vec<u32>,
    /// `kv_source_layer_ids`: the layers that own a compressor (and the indexer's keys); the
    /// others read the nearest preceding source's cache.
    pub kv_source_layers: Vec<u32>,
    /// `index_source_layer_ids`: the layers that run the indexer's query side.
    pub index_source_layers: Vec<u32>,
    /// `index_n_heads` 32 × `index_head_dim` 128.
    pub index_heads: u64,
    pub index_head_dim: u64,
    /// `sliding_window` 128.
    pub window: u64,
    /// `hc_mult` 4 hyper-connection streams.
    pub hc_mult: u64,
    /// `engram_layer_ids` [1, 14]; `engram_n_heads` 8 × `engram_head_dim` 256 over
    /// `engram_max_ngram_size` − 1 = 3 n-gram sizes: `engram.wkv` reads 24 × 256 = 6144.
    pub engram_layers: Vec<u32>,
    pub engram_heads: u64,
    pub engram_head_dim: u64,
    pub engram_max_ngram: u64,
    /// `num_nextn_predict_layers` 3 DSpark stages (`mtp.0..2`), each routing over
    /// `dspark_n_routed_experts` 128; `dspark_target_layer_ids` has 3 layers (`main_proj` reads
    /// 3 × 5120); `dspark_markov_rank` 256.
    pub mtp_layers: u32,
    pub mtp_routed_experts: u64,
    pub dspark_targets: u64,
    pub markov_rank: u64,
    /// `vision_config`; `None` models a text-only checkpoint.
    pub vision: Option<VisionDims>,
}

impl Default for DeepSeekV41Dims {
    fn default() -> Self {
        let mut compress_ratios = vec![0, 0];
        compress_ratios.extend([2; 18]);
        compress_ratios.extend([1; 20]);
        compress_ratios.extend([0; 3]);
        Self {
            hidden: 5120,
            layers: 40,
            vocab: 129_280,
            heads: 64,
            head_dim: 512,
            rope_head_dim: 64,
            q_lora_rank: 1280,
            o_groups: 8,
            o_lora_rank: 1024,
            routed_experts: 384,
            expert_intermediate: 2304,
            shared_intermediate: 2304,
            compress_ratios,
            kv_source_layers: vec![2, 8, 14, 20],
            index_source_layers: vec![2, 8, 14, 20, 24, 28, 32, 36],
            index_heads: 32,
            index_head_dim: 128,
            window: 128,
            hc_mult: 4,
            engram_layers: vec![1, 14],
            engram_heads: 8,
            engram_head_dim: 256,
            engram_max_ngram: 4,
            mtp_layers: 3,
            mtp_routed_experts: 128,
            dspark_targets: 3,
            markov_rank: 256,
            vision: Some(VisionDims { layers: 32, dim: 1024, intermediate: 2816, patch: 14, downsample: 3 }),
        }
    }
}

impl DeepSeekV41Dims {
    /// Compression ratio of `layer` (0 when unknown: sliding window only).
    #[must_use]
    pub fn ratio(&self, layer: u32) -> u32 {
        usize::try_from(layer).ok().and_then(|l| self.compress_ratios.get(l)).copied().unwrap_or(0)
    }

    /// The shapes the planner's KV model reads, at `block_size` tokens per block, for `dtype`.
    #[must_use]
    pub fn kv_shape(&self, block_size: u32, dtype: crate::kit::schema::KvCacheDtype) -> crate::plan::kv::KvShape {
        crate::plan::kv::KvShape {
            head_dim: self.head_dim,
            rope_head_dim: self.rope_head_dim,
            sources: self.kv_source_layers.iter().map(|&l| (l, self.ratio(l))).collect(),
            block_size,
            dtype,
        }
    }

    /// Width of the Engram hash rows `engram.wkv` reads.
    #[must_use]
    pub fn engram_in(&self) -> u64 {
        self.engram_max_ngram.saturating_sub(1) * self.engram_heads * self.engram_head_dim
    }

    /// Each dimension with its value and where it comes from, for `plan`'s assumption list.
    #[must_use]
    pub fn sources(&self) -> Vec<(&'static str, String, &'static str)> {
        let vision = self.vision.as_ref().map_or_else(
            || "none".to_string(),
            |v| format!("{} layers × {} (MLP {}), aligner r={}", v.layers, v.dim, v.intermediate, v.downsample),
        );
        vec![
            (
                "hidden × layers × vocab",
                format!("{} × {} × {}", self.hidden, self.layers, self.vocab),
                "config.json; reference-kit.md C.2/C.3 (H=5120, 40 layers)",
            ),
            (
                "attention",
                format!(
                    "{} heads × {} (rope {}), q low-rank {}, {} output groups × {}",
                    self.heads, self.head_dim, self.rope_head_dim, self.q_lora_rank, self.o_groups, self.o_lora_rank
                ),
                "config.json",
            ),
            (
                "experts",
                format!(
                    "{} routed × {} + 1 shared × {}",
                    self.routed_experts, self.expert_intermediate, self.shared_intermediate
                ),
                "config.json; reference-kit.md C.3 (local I=1152 at TP2)",
            ),
            (
                "CSA2 sources",
                format!(
                    "KV (compressor + indexer keys) at {:?}, indexer queries ({} × {}) at {:?}",
                    self.kv_source_layers, self.index_heads, self.index_head_dim, self.index_source_layers
                ),
                "config.json kv_source_layer_ids, index_source_layer_ids",
            ),
            (
                "Engram",
                format!(
                    "layers {:?}, wkv {} → {}",
                    self.engram_layers,
                    self.engram_in(),
                    (self.hc_mult + 1) * self.hidden
                ),
                "config.json; tables file-backed (reference-kit.md C.4)",
            ),
            (
                "DSpark stages",
                format!(
                    "{} × {} routed experts, main_proj {} → {}, Markov head rank {}",
                    self.mtp_layers,
                    self.mtp_routed_experts,
                    self.dspark_targets * self.hidden,
                    self.hidden,
                    self.markov_rank
                ),
                "config.json num_nextn_predict_layers, dspark_*",
            ),
            ("vision tower", vision, "config.json vision_config; C.1: 259 vision.* natives"),
            (
                "K per class",
                "routed 3 (layers 18–22: 2), shared 5/4/5, attention 5, indexer 8, Engram 5/4, MTP 4, head 6".into(),
                "reference-kit.md C.2 k-map, incl. its noted exceptions; indexer queries assumed K 8 like its keys",
            ),
        ]
    }
}

/// The reference kit's K map (reference-kit.md C.2) in `model.k_map` form. `shared` layers
/// 30–39 are read as 5 (C.2 elides them after `"30":5,…`).
#[must_use]
pub fn reference_k_map() -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    m.insert("routed".to_string(), 3.0);
    for l in 18..=22 {
        m.insert(format!("routed.{l}"), 2.0);
    }
    for l in 0..40u32 {
        let k = if (11..=29).contains(&l) { 4.0 } else { 5.0 };
        m.insert(format!("shared.{l}"), k);
    }
    m.insert("engram.1".into(), 5.0);
    m.insert("engram.14".into(), 4.0);
    m.insert("mtp".into(), 4.0);
    m.insert("attn".into(), 5.0);
    m.insert("indexer".into(), 8.0);
    m.insert("head".into(), 6.0);
    m.insert("num_hidden_layers".into(), 40.0);
    m
}

/// K of each matrix as the trellis has it. Follows the K map except where C.2 says the real
/// checkpoint differs: layer 0 `wq_a`/`wkv` are K=6 and layer 29's shared `down_proj` (w2) K=5.
fn deepseek_k(role: &str, layer: u32, leaf: &str) -> f64 {
    match role {
        "routed" if (18..=22).contains(&layer) => 2.0,
        "routed" => 3.0,
        "shared" if layer == 29 && leaf == "w2" => 5.0,
        "shared" if (11..=29).contains(&layer) => 4.0,
        "shared" => 5.0,
        "attn" if layer == 0 && (leaf == "wq_a" || leaf == "wkv") => 6.0,
        "attn" => 5.0,
        "indexer" => 8.0,
        _ => 4.0,
    }
}

/// Attention, CSA2 and Engram parts of one block.
fn attention(
    b: &mut VirtualBuilder,
    d: &DeepSeekV41Dims,
    base: &str,
    layer: u32,
    mtp: bool,
) -> Result<(), CheckpointError> {
    let cb = Codebook::Mul1;
    let k = |role: &str, leaf: &str| if mtp { 4.0 } else { deepseek_k(role, layer, leaf) };
    let h = d.hidden;
    let q = d.heads * d.head_dim;
    b.native(format!("{base}.attn_norm.weight"), Dtype::BF16, &[h]);
    b.packed(&format!("{base}.attn.wq_a"), h, d.q_lora_rank, k("attn", "wq_a"), cb)?;
    b.native(format!("{base}.attn.q_norm.weight"), Dtype::BF16, &[d.q_lora_rank]);
    b.packed(&format!("{base}.attn.wq_b"), d.q_lora_rank, q, k("attn", "wq_b"), cb)?;
    b.packed(&format!("{base}.attn.wkv"), h, d.head_dim, k("attn", "wkv"), cb)?;
    b.native(format!("{base}.attn.kv_norm.weight"), Dtype::BF16, &[d.head_dim]);
    for g in 0..d.o_groups {
        b.packed(&format!("{base}.attn.wo_a.slice.{g}"), q / d.o_groups, d.o_lora_rank, k("attn", "wo_a"), cb)?;
    }
    b.packed(&format!("{base}.attn.wo_b"), d.o_groups * d.o_lora_rank, h, k("attn", "wo_b"), cb)?;
    b.native(format!("{base}.attn.attn_sink"), Dtype::F32, &[d.heads]);
    if mtp {
        return Ok(());
    }
    if d.kv_source_layers.contains(&layer) {
        b.packed(&format!("{base}.attn.compressor.wkv"), h, d.head_dim, k("attn", "wkv"), cb)?;
        b.native(format!("{base}.attn.compressor.norm.weight"), Dtype::BF16, &[d.head_dim]);
        // Ratio 1 keeps every position: no group to weight.
        if d.ratio(layer) > 1 {
            b.packed(&format!("{base}.attn.compressor.wgate"), h, d.head_dim, k("attn", "wgate"), cb)?;
        }
        b.packed(&format!("{base}.attn.indexer.wk"), d.head_dim, d.index_head_dim, k("indexer", "wk"), cb)?;
        b.native(format!("{base}.attn.indexer.k_norm.weight"), Dtype::BF16, &[d.index_head_dim]);
    }
    if d.index_source_layers.contains(&layer) {
        let iq = d.index_heads * d.index_head_dim;
        b.packed(&format!("{base}.attn.indexer.wq_b"), d.q_lora_rank, iq, k("indexer", "wq_b"), cb)?;
        b.native(format!("{base}.attn.indexer.weights_proj.weight"), Dtype::BF16, &[d.index_heads, h]);
    }
    if d.engram_layers.contains(&layer) {
        let ke = if layer == 1 { 5.0 } else { 4.0 };
        b.packed(&format!("{base}.engram.wkv"), d.engram_in(), (d.hc_mult + 1) * h, ke, cb)?;
        b.native(format!("{base}.engram.k_weight"), Dtype::BF16, &[d.hc_mult, h]);
        b.native(format!("{base}.engram.q_weight"), Dtype::BF16, &[d.hc_mult, h]);
    }
    Ok(())
}

/// One transformer block: hyper-connections, attention (+ CSA2, Engram), router, shared and
/// routed experts. DSpark stages (`mtp`) carry no CSA2 or Engram and route over their own bank.
fn block(
    b: &mut VirtualBuilder,
    d: &DeepSeekV41Dims,
    base: &str,
    layer: u32,
    mtp: bool,
) -> Result<(), CheckpointError> {
    let cb = Codebook::Mul1;
    let k = |role: &str, leaf: &str| if mtp { 4.0 } else { deepseek_k(role, layer, leaf) };
    let h = d.hidden;
    let hc = d.hc_mult;
    for part in ["attn", "ffn"] {
        b.native(format!("{base}.hc_{part}_fn"), Dtype::F32, &[(2 + hc) * hc, hc * h]);
        b.native(format!("{base}.hc_{part}_base"), Dtype::F32, &[(2 + hc) * hc]);
        b.native(format!("{base}.hc_{part}_scale"), Dtype::F32, &[3]);
    }
    attention(b, d, base, layer, mtp)?;
    let experts = if mtp { d.mtp_routed_experts } else { d.routed_experts };
    b.native(format!("{base}.ffn_norm.weight"), Dtype::BF16, &[h]);
    b.native(format!("{base}.ffn.gate.weight"), if mtp { Dtype::F32 } else { Dtype::BF16 }, &[experts, h]);
    b.native(format!("{base}.ffn.gate.bias"), Dtype::F32, &[experts]);
    if d.vision.is_some() {
        b.native(format!("{base}.ffn.gate.bias_vl"), Dtype::F32, &[experts]);
    }
    let p = format!("{base}.ffn.shared_experts");
    b.packed(&format!("{p}.w1"), h, d.shared_intermediate, k("shared", "w1"), cb)?;
    b.packed(&format!("{p}.w3"), h, d.shared_intermediate, k("shared", "w3"), cb)?;
    b.packed(&format!("{p}.w2"), d.shared_intermediate, h, k("shared", "w2"), cb)?;
    for e in 0..experts {
        let p = format!("{base}.ffn.experts.{e}");
        b.packed(&format!("{p}.w1"), h, d.expert_intermediate, k("routed", "w1"), cb)?;
        b.packed(&format!("{p}.w3"), h, d.expert_intermediate, k("routed", "w3"), cb)?;
        b.packed(&format!("{p}.w2"), d.expert_intermediate, h, k("routed", "w2"), cb)?;
    }
    Ok(())
}

/// The ViT, the aligner and the three image delimiters (natives, BF16).
fn vision(b: &mut VirtualBuilder, d: &DeepSeekV41Dims, v: &VisionDims) {
    let (vd, vi) = (v.dim, v.intermediate);
    b.native("vision.patch_embed.proj.weight", Dtype::BF16, &[vd, 3 * v.patch * v.patch]);
    b.native("vision.patch_embed.proj.bias", Dtype::BF16, &[vd]);
    for i in 0..v.layers {
        let p = format!("vision.blocks.{i}");
        b.native(format!("{p}.norm1.weight"), Dtype::BF16, &[vd]);
        b.native(format!("{p}.attn.wqkv.weight"), Dtype::BF16, &[3 * vd, vd]);
        b.native(format!("{p}.attn.wqkv.bias"), Dtype::BF16, &[3 * vd]);
        b.native(format!("{p}.attn.wo.weight"), Dtype::BF16, &[vd, vd]);
        b.native(format!("{p}.attn.wo.bias"), Dtype::BF16, &[vd]);
        b.native(format!("{p}.norm2.weight"), Dtype::BF16, &[vd]);
        // Fused SwiGLU gate + up.
        b.native(format!("{p}.mlp.w1.weight"), Dtype::BF16, &[2 * vi, vd]);
        b.native(format!("{p}.mlp.w2.weight"), Dtype::BF16, &[vd, vi]);
    }
    b.native("vision.norm.weight", Dtype::BF16, &[vd]);
    let h = d.hidden;
    b.native("aligner.w1.weight", Dtype::BF16, &[h, vd * v.downsample * v.downsample]);
    b.native("aligner.w1.bias", Dtype::BF16, &[h]);
    b.native("aligner.w2.weight", Dtype::BF16, &[h, h]);
    b.native("aligner.w2.bias", Dtype::BF16, &[h]);
    for t in ["image_start", "image_end", "image_newline"] {
        b.native(t, Dtype::BF16, &[h]);
    }
}

/// All tensors of the DeepSeek V4.1 Flash EXL3 checkpoint (`Mia-AiLab/DeepSeek-V4.1-Flash-EXL3-2.9bpw`,
/// reference-kit.md B) as modelled by `dims`, MUL1 markers recorded.
///
/// # Errors
/// Only if `dims` produce an invalid matrix (they do not for the defaults).
pub fn deepseek_v41_flash_builder(dims: &DeepSeekV41Dims) -> Result<VirtualBuilder, CheckpointError> {
    let mut b = VirtualBuilder::new("DeepSeek-V4.1-Flash-EXL3-2.9bpw (modelled)");
    let h = dims.hidden;
    b.native("embed.weight", Dtype::BF16, &[dims.vocab, h]);
    for layer in 0..dims.layers {
        block(&mut b, dims, &format!("layers.{layer}"), layer, false)?;
    }
    for i in 0..dims.mtp_layers {
        let base = format!("mtp.{i}");
        if i == 0 {
            b.packed(&format!("{base}.main_proj"), dims.dspark_targets * h, h, 4.0, Codebook::Mul1)?;
            b.native(format!("{base}.main_norm.weight"), Dtype::BF16, &[h]);
        }
        block(&mut b, dims, &base, dims.layers + i, true)?;
        if i + 1 == dims.mtp_layers {
            let r = dims.markov_rank;
            b.native(format!("{base}.norm.weight"), Dtype::BF16, &[h]);
            b.native(format!("{base}.markov_head.embed.weight"), Dtype::BF16, &[dims.vocab, r]);
            b.native(format!("{base}.markov_head.head.weight"), Dtype::BF16, &[dims.vocab, r]);
            b.native(format!("{base}.confidence_head.proj.weight"), Dtype::BF16, &[1, h + r]);
        }
    }
    b.native("norm.weight", Dtype::BF16, &[h]);
    b.packed("head", h, dims.vocab, 6.0, Codebook::Mul1)?;
    if let Some(v) = &dims.vision {
        vision(&mut b, dims, v);
    }
    Ok(b)
}

/// The full DeepSeek V4.1 Flash EXL3 shape over 39 shards (reference-kit.md B: 39 shards).
///
/// # Errors
/// Only if `dims` produce an invalid matrix (they do not for the defaults).
pub fn deepseek_v41_flash_exl3(dims: &DeepSeekV41Dims) -> Result<Checkpoint, CheckpointError> {
    deepseek_v41_flash_builder(dims)?.build(39)
}
