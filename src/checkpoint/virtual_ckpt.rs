//! Virtual checkpoints: names, dtypes and shapes laid out as the shards would hold them, with no
//! data. The audit and the budget take them exactly like real files, so `plan` works before a
//! 197 GiB download, and tests can model the full DeepSeek V4.1 Flash EXL3 shape.

use std::collections::HashMap;
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

// The DeepSeek V4.1 Flash model lives in `dsv41.rs`; re-exported here for existing callers.
pub use super::dsv41::{deepseek_v41_flash_builder, deepseek_v41_flash_exl3, reference_k_map, DeepSeekV41Dims};
