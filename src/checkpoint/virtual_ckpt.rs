//! Virtual checkpoints: names, dtypes and shapes laid out as the shards would hold them, with no
//! data. The audit and the budget take them exactly like real files, so `plan` works before a
//! 197 GiB download, and tests can model the full DeepSeek V4.1 Flash EXL3 shape.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use super::exl3_audit::{is_valid_k, Codebook, MCG_MARKER, MUL1_MARKER};
use super::safetensors::{numel, Dtype};
use super::{Checkpoint, CheckpointError, Origin, Shard, Tensor};

/// One tensor of a virtual checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

/// Collects tensors in file order, then lays them out into shards.
#[derive(Debug, Clone, Default)]
pub struct VirtualBuilder {
    name: String,
    tensors: Vec<VirtualTensor>,
    markers: HashMap<String, [u8; 4]>,
}

/// `ceil(n / 128) * 128` (exl3-format.md §1.5: features are padded to 128).
#[must_use]
pub const fn pad128(n: u64) -> u64 {
    n.div_ceil(128) * 128
}

impl VirtualBuilder {
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), ..Self::default() }
    }

    /// Add a native (unquantized) tensor.
    pub fn native(&mut self, name: impl Into<String>, dtype: Dtype, shape: &[u64]) {
        self.tensors.push(VirtualTensor { name: name.into(), dtype, shape: shape.to_vec() });
    }

    /// Add one EXL3 linear `prefix` (in → out features, K bits, codebook) as exllamav3 writes it:
    /// `suh` F16 `[Kp]`, `svh` F16 `[Np]`, the marker (recorded value), `trellis` I16 `[Kp/16, Np/16, 16K]`.
    ///
    /// # Errors
    /// `k` is not a valid EXL3 K, or half-integer K without MUL1.
    pub fn packed(
        &mut self,
        prefix: &str,
        in_features: u64,
        out_features: u64,
        k: f64,
        codebook: Codebook,
    ) -> Result<(), CheckpointError> {
        let bad = |why: String| CheckpointError::Virtual { name: self.name.clone(), why };
        if !is_valid_k(k) {
            return Err(bad(format!("`{prefix}`: K = {k} is not a valid EXL3 K")));
        }
        if k.fract() != 0.0 && codebook != Codebook::Mul1 {
            return Err(bad(format!("`{prefix}`: half-integer K = {k} needs the mul1 codebook")));
        }
        let (kp, np) = (pad128(in_features), pad128(out_features));
        // K ∈ {1..8, 1.5, 2.5, 3.5}, so 16·K is an exact small integer.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let last = (k * 16.0).round() as u64;
        self.native(format!("{prefix}.suh"), Dtype::F16, &[kp]);
        self.native(format!("{prefix}.svh"), Dtype::F16, &[np]);
        let marker = match codebook {
            Codebook::Mul1 => Some(("mul1", MUL1_MARKER)),
            Codebook::Mcg => Some(("mcg", MCG_MARKER)),
            Codebook::ThreeInst => None,
        };
        if let Some((leaf, bytes)) = marker {
            let name = format!("{prefix}.{leaf}");
            self.markers.insert(name.clone(), bytes);
            self.native(name, Dtype::I32, &[]);
        }
        self.native(format!("{prefix}.trellis"), Dtype::I16, &[kp / 16, np / 16, last]);
        Ok(())
    }

    /// The tensors added so far, in file order.
    #[must_use]
    pub fn tensors(&self) -> &[VirtualTensor] {
        &self.tensors
    }

    /// Recorded marker bytes by tensor name.
    #[must_use]
    pub fn markers(&self) -> &HashMap<String, [u8; 4]> {
        &self.markers
    }

    /// Lay the tensors out contiguously over `shards` shards of about equal size (a module's
    /// tensors stay in one shard), named `model-0000i-of-0000N.safetensors`.
    ///
    /// # Errors
    /// `shards == 0`, a size that overflows, or a name used twice.
    pub fn build(self, shards: usize) -> Result<Checkpoint, CheckpointError> {
        let bad = |why: String| CheckpointError::Virtual { name: self.name.clone(), why };
        if shards == 0 {
            return Err(bad("needs at least one shard".into()));
        }
        let sizes = self
            .tensors
            .iter()
            .map(|t| {
                numel(&t.shape)
                    .and_then(|n| t.dtype.bytes_for(n))
                    .ok_or_else(|| bad(format!("`{}`: {} {:?} has no byte size", t.name, t.dtype, t.shape)))
            })
            .collect::<Result<Vec<u64>, _>>()?;
        let total: u64 =
            sizes.iter().try_fold(0u64, |a, &b| a.checked_add(b)).ok_or_else(|| bad("size overflow".into()))?;
        let shard_count = u64::try_from(shards).map_err(|_| bad("too many shards".into()))?;
        let target = total.div_ceil(shard_count).max(1);
        let mut out_shards: Vec<Shard> = Vec::with_capacity(shards);
        let mut out_tensors = Vec::with_capacity(self.tensors.len());
        let mut shard = 0usize;
        let mut offset = 0u64;
        let mut done = 0u64;
        let mut last_module: Option<String> = None;
        let path = |i: usize| PathBuf::from(format!("model-{:05}-of-{:05}.safetensors", i + 1, shards));
        for (t, size) in self.tensors.into_iter().zip(sizes) {
            let module = t.name.rsplit_once('.').map_or(t.name.as_str(), |(p, _)| p).to_string();
            let new_module = last_module.as_deref() != Some(module.as_str());
            let limit = target.saturating_mul(u64::try_from(shard + 1).unwrap_or(u64::MAX));
            if new_module && done >= limit && shard + 1 < shards {
                out_shards.push(Shard { path: path(shard), data_start: 0, file_len: offset, gaps: Vec::new() });
                shard += 1;
                offset = 0;
            }
            out_tensors.push(Tensor {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                shard,
                begin: offset,
                end: offset + size,
            });
            offset += size;
            done += size;
            last_module = Some(module);
        }
        out_shards.push(Shard { path: path(shard), data_start: 0, file_len: offset, gaps: Vec::new() });
        while out_shards.len() < shards {
            out_shards.push(Shard { path: path(out_shards.len()), data_start: 0, file_len: 0, gaps: Vec::new() });
        }
        Checkpoint::assemble(Origin::Virtual { name: self.name }, out_shards, out_tensors, self.markers)
    }
}

/// Dimensions of DeepSeek V4.1 Flash as modelled here. Each field says where it comes from;
/// "assumed" means the reference docs do not give it and the value is our estimate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeepSeekV41Dims {
    /// Hidden size 5120: reference-kit.md C.3 ("H=5120").
    pub hidden: u64,
    /// 40 decoder layers: reference-kit.md C.2 (`num_hidden_layers` 40).
    pub layers: u32,
    /// 1 MTP block (`mtp.0.*`; vLLM `model.layers.40`): assumed. C.1 says MTP exists; C.3's
    /// "42 MoE layers" would mean 2, but 47,900 packed matrices (C.1) leave room for only one
    /// block of 384 experts × 3 (40×1152 + 1152 = 47,232), and ~197 GiB (B) fits one, not two.
    pub mtp_layers: u32,
    /// 384 routed experts per MoE layer: reference-kit.md C.3.
    pub routed_experts: u64,
    /// Routed expert intermediate 2304: reference-kit.md C.3 ("local I=1152 at TP2" ⇒ 2×1152).
    pub expert_intermediate: u64,
    /// Shared expert intermediate 2304: assumed (one shared expert as wide as a routed one, the
    /// DeepSeek V3 pattern; C.1 lists `shared_experts.w{1,2,3}` without sizes).
    pub shared_intermediate: u64,
    /// Vocabulary 129,280: assumed (the DeepSeek V3 tokenizer; not in the docs).
    pub vocab: u64,
    /// Query low-rank 1024 (`attn.wq_a` 5120→1024): assumed.
    pub q_lora_rank: u64,
    /// 64 attention heads: assumed.
    pub heads: u64,
    /// Head dim 512 with one shared latent KV head (`attn.wkv` 5120→512): assumed; consistent with
    /// MLA's 512-wide latent stored by `fp8_ds_mla` (D: ~3.4 KiB/token over 40 compressed layers).
    pub head_dim: u64,
    /// 8 output groups (`attn.wo_a.slice.0..7`, C.1 names the slices): assumed count.
    pub o_groups: u64,
    /// Output low-rank 1024 per group (`wo_a.slice.i` 4096→1024, `wo_b` 8192→5120): assumed.
    pub o_lora_rank: u64,
    /// Indexer key dim 128 (`attn.indexer.wk` 5120→128): assumed (DeepSeek V3.2's indexer head dim).
    pub indexer_head_dim: u64,
    /// Indexer heads 64 (`attn.indexer.weights_proj` native [64, 5120]): assumed.
    pub indexer_heads: u64,
    /// Engram layers 1 and 14: reference-kit.md C.1/C.2 (`layers.{1,14}.engram.wkv`).
    pub engram_layers: Vec<u32>,
    /// Engram value width 6144 (`engram.wkv` 6144→5120): assumed = 24 hash heads (C.4: 12 per
    /// rank at TP2) × 256-wide rows (C.4).
    pub engram_dim: u64,
    /// Hyper-connection streams 4 (`hc_*` natives, C.1 names them): assumed.
    pub hc_mult: u64,
}

impl Default for DeepSeekV41Dims {
    fn default() -> Self {
        Self {
            hidden: 5120,
            layers: 40,
            mtp_layers: 1,
            routed_experts: 384,
            expert_intermediate: 2304,
            shared_intermediate: 2304,
            vocab: 129_280,
            q_lora_rank: 1024,
            heads: 64,
            head_dim: 512,
            o_groups: 8,
            o_lora_rank: 1024,
            indexer_head_dim: 128,
            indexer_heads: 64,
            engram_layers: vec![1, 14],
            engram_dim: 6144,
            hc_mult: 4,
        }
    }
}

impl DeepSeekV41Dims {
    /// Each dimension with its value and where it comes from, for `plan`'s assumption list.
    #[must_use]
    pub fn sources(&self) -> Vec<(&'static str, String, &'static str)> {
        vec![
            ("hidden size", self.hidden.to_string(), "reference-kit.md C.3 (H=5120)"),
            ("decoder layers", self.layers.to_string(), "reference-kit.md C.2 (num_hidden_layers)"),
            (
                "MTP blocks",
                self.mtp_layers.to_string(),
                "assumed: 47,900 packed matrices (C.1) and ~197 GiB (B) fit one block of 384 experts",
            ),
            ("routed experts", self.routed_experts.to_string(), "reference-kit.md C.3"),
            ("expert intermediate", self.expert_intermediate.to_string(), "reference-kit.md C.3 (local I=1152 at TP2)"),
            (
                "shared expert intermediate",
                self.shared_intermediate.to_string(),
                "assumed = expert intermediate (DeepSeek V3 pattern)",
            ),
            ("vocabulary", self.vocab.to_string(), "assumed (DeepSeek V3 tokenizer)"),
            ("q low-rank", self.q_lora_rank.to_string(), "assumed"),
            (
                "attention heads × head dim",
                format!("{} × {}", self.heads, self.head_dim),
                "assumed (one 512-wide latent KV head, fp8_ds_mla)",
            ),
            (
                "output groups × low-rank",
                format!("{} × {}", self.o_groups, self.o_lora_rank),
                "assumed (C.1 names wo_a slices)",
            ),
            (
                "indexer key dim / heads",
                format!("{} / {}", self.indexer_head_dim, self.indexer_heads),
                "assumed (DeepSeek V3.2 indexer)",
            ),
            ("Engram layers", format!("{:?}", self.engram_layers), "reference-kit.md C.1/C.2"),
            ("Engram wkv input", self.engram_dim.to_string(), "assumed: 24 hash heads (C.4: 12 per rank at TP2) × 256"),
            ("hyper-connection streams", self.hc_mult.to_string(), "assumed"),
            (
                "K per class",
                "routed 3 (layers 18–22: 2), shared 5/4/5, attention 5, indexer 8, Engram 5/4, MTP 4, head 6".into(),
                "reference-kit.md C.2 k-map, incl. its noted exceptions",
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
        "routed" => {
            if (18..=22).contains(&layer) {
                2.0
            } else {
                3.0
            }
        }
        "shared" => {
            if layer == 29 && leaf == "w2" {
                5.0
            } else if (11..=29).contains(&layer) {
                4.0
            } else {
                5.0
            }
        }
        "attn" => {
            if layer == 0 && (leaf == "wq_a" || leaf == "wkv") {
                6.0
            } else {
                5.0
            }
        }
        "indexer" => 8.0,
        _ => 4.0,
    }
}

/// One transformer block: attention, indexer, MoE (routed + shared), router, norms, hyper-connections.
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
    b.packed(&format!("{base}.attn.indexer.wk"), h, d.indexer_head_dim, k("indexer", "wk"), cb)?;
    b.native(format!("{base}.attn.indexer.weights_proj.weight"), Dtype::BF16, &[d.indexer_heads, h]);
    let hc = d.hc_mult;
    for part in ["attn", "ffn"] {
        b.native(format!("{base}.hc_{part}_fn"), Dtype::F32, &[(2 + hc) * hc, hc * h]);
        b.native(format!("{base}.hc_{part}_base"), Dtype::F32, &[(2 + hc) * hc]);
        b.native(format!("{base}.hc_{part}_scale"), Dtype::F32, &[3]);
    }
    if !mtp && d.engram_layers.contains(&layer) {
        let ke = if layer == 1 { 5.0 } else { 4.0 };
        b.packed(&format!("{base}.engram.wkv"), d.engram_dim, h, ke, cb)?;
        b.native(format!("{base}.engram.k_weight"), Dtype::BF16, &[d.engram_dim]);
        b.native(format!("{base}.engram.q_weight"), Dtype::BF16, &[d.engram_dim]);
    }
    b.native(format!("{base}.ffn_norm.weight"), Dtype::BF16, &[h]);
    b.native(format!("{base}.ffn.gate.weight"), Dtype::BF16, &[d.routed_experts, h]);
    b.native(format!("{base}.ffn.gate.bias"), Dtype::F32, &[d.routed_experts]);
    for e in 0..d.routed_experts {
        let p = format!("{base}.ffn.experts.{e}");
        b.packed(&format!("{p}.w1"), h, d.expert_intermediate, k("routed", "w1"), cb)?;
        b.packed(&format!("{p}.w3"), h, d.expert_intermediate, k("routed", "w3"), cb)?;
        b.packed(&format!("{p}.w2"), d.expert_intermediate, h, k("routed", "w2"), cb)?;
    }
    let p = format!("{base}.ffn.shared_experts");
    b.packed(&format!("{p}.w1"), h, d.shared_intermediate, k("shared", "w1"), cb)?;
    b.packed(&format!("{p}.w3"), h, d.shared_intermediate, k("shared", "w3"), cb)?;
    b.packed(&format!("{p}.w2"), d.shared_intermediate, h, k("shared", "w2"), cb)?;
    Ok(())
}

/// All tensors of the DeepSeek V4.1 Flash EXL3 checkpoint (`Mia-AiLab/DeepSeek-V4.1-Flash-EXL3-2.9bpw`,
/// reference-kit.md B) as modelled by `dims`, MUL1 markers recorded. The vision tower
/// (259 `vision.*`/`aligner.*` natives, C.1) is not modelled: the docs give none of its sizes.
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
        b.native(format!("{base}.enorm.weight"), Dtype::BF16, &[h]);
        b.native(format!("{base}.hnorm.weight"), Dtype::BF16, &[h]);
        b.packed(&format!("{base}.main_proj"), 2 * h, h, 4.0, Codebook::Mul1)?;
        block(&mut b, dims, &base, dims.layers + i, true)?;
        b.native(format!("{base}.norm.weight"), Dtype::BF16, &[h]);
    }
    b.native("norm.weight", Dtype::BF16, &[h]);
    let hc = dims.hc_mult;
    b.native("hc_head_fn", Dtype::F32, &[hc, hc * h]);
    b.native("hc_head_base", Dtype::F32, &[hc]);
    b.native("hc_head_scale", Dtype::F32, &[1]);
    b.packed("head", h, dims.vocab, 6.0, Codebook::Mul1)?;
    Ok(b)
}

/// The full DeepSeek V4.1 Flash EXL3 shape over 39 shards (reference-kit.md B: 39 shards).
///
/// # Errors
/// Only if `dims` produce an invalid matrix (they do not for the defaults).
pub fn deepseek_v41_flash_exl3(dims: &DeepSeekV41Dims) -> Result<Checkpoint, CheckpointError> {
    deepseek_v41_flash_builder(dims)?.build(39)
}
