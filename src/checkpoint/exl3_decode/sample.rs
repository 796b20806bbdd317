//! Sampled decode checks for `spark-kit verify --decode`: which 128×128 blocks of a packed
//! matrix to decode, the statistics of a decoded block, and the verdict over all matrices.
//!
//! Every trellis bitstream decodes to *some* codebook values, so a broken pack shows up only in
//! the numbers: non-finite scales (NaN/inf `suh`/`svh`), constant tiles (a zero-filled or
//! repeating trellis), codebook values whose spread is far from the codebook's own, and a full
//! weight whose RMS is absurd or far from the other matrices of its class.

use serde::Serialize;

use super::bitstream::{TileBits, TILE, TILE_ELEMENTS};
use super::hadamard::BLOCK;
use super::{fp16, full_weight, DecodeError};
use crate::checkpoint::exl3_audit::Codebook;
use crate::checkpoint::names::Class;

/// Tiles per side of a 128×128 block.
pub const TILES_PER_BLOCK: usize = BLOCK / TILE;

/// A tile whose values spread less than this fraction of the codebook's std is "constant".
const FLAT_TILE: f64 = 0.25;
/// A tile with fewer distinct values than this is "repeating" (a real tile of 256 trellis states
/// has well over 100; a periodic bit pattern gives a handful).
const MIN_DISTINCT: usize = 32;
/// W_hat RMS over the sample must lie within [1/x, x] of the codebook's std.
const W_HAT_SPREAD: f64 = 2.0;
/// Full-weight RMS limits: absolute, and relative to the median of the same class.
const W_RMS_MIN: f64 = 1e-5;
const W_RMS_MAX: f64 = 10.0;
const W_RMS_CLASS_RATIO: f64 = 32.0;
/// A class median is used once the class has this many matrices.
const CLASS_MEDIAN_MIN: usize = 3;

/// Std of a codebook's 65,536 values (a uniform state): ≈ 1.24 (3INST, MCG), ≈ 1.00 (MUL1).
#[must_use]
pub fn codebook_std(codebook: Codebook) -> f64 {
    static STD: [std::sync::OnceLock<f64>; 3] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    let slot = match codebook {
        Codebook::ThreeInst => 0,
        Codebook::Mcg => 1,
        Codebook::Mul1 => 2,
    };
    *STD[slot].get_or_init(|| {
        let values: Vec<f64> = super::codebook::table(codebook).iter().map(|&b| fp16::to_f64(b)).collect();
        mean_var(&values).1.sqrt()
    })
}

fn mean_var(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    // Lengths stay far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    (mean, values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n)
}

/// The blocks (row block, column block) to decode from a grid of `rows × cols` blocks: the first,
/// the last, then pseudo-random distinct ones from `seed`; at most `n`, at most all of them.
#[must_use]
pub fn pick_blocks(rows: usize, cols: usize, n: usize, seed: u64) -> Vec<(usize, usize)> {
    let total = rows * cols;
    let want = n.min(total);
    let mut picked: Vec<usize> = Vec::with_capacity(want);
    let push = |k: usize, picked: &mut Vec<usize>| {
        if picked.len() < want && !picked.contains(&k) {
            picked.push(k);
        }
    };
    push(0, &mut picked);
    push(total.saturating_sub(1), &mut picked);
    let mut state = seed | 1;
    let mut guard = 0usize;
    while picked.len() < want && guard < 64 * want + 64 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // The modulus keeps the value below `total`, a usize.
        #[allow(clippy::cast_possible_truncation)]
        let k = (state % total as u64) as usize;
        push(k, &mut picked);
        guard += 1;
    }
    for k in 0..total {
        push(k, &mut picked); // deterministic fill if the generator kept repeating
    }
    picked.into_iter().map(|k| (k / cols, k % cols)).collect()
}

/// FNV-1a of a name: the per-matrix seed of [`pick_blocks`].
#[must_use]
pub fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3))
}

/// Statistics of the decoded sample of one matrix (sums over its blocks).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SampleStats {
    pub blocks: usize,
    pub tiles: usize,
    /// Tiles whose values are (nearly) constant.
    pub flat_tiles: usize,
    /// Non-finite values in the sampled `suh` / `svh` ranges.
    pub nonfinite_suh: usize,
    pub nonfinite_svh: usize,
    /// Non-finite values of the full weight W over the sample.
    pub nonfinite_w: usize,
    /// RMS of the decoded codebook values (W_hat) over the sample.
    pub w_hat_rms: f64,
    /// RMS of the full weight W over the sample (finite values only).
    pub w_rms: f64,
    #[serde(skip)]
    w_hat_sq: f64,
    #[serde(skip)]
    w_sq: f64,
    #[serde(skip)]
    w_count: usize,
}

impl SampleStats {
    /// Add one decoded 128×128 block: `w_hat` (fp16 bits, row-major 128×128) with its `suh` and
    /// `svh` ranges (128 fp16 values each).
    ///
    /// # Errors
    /// Sizes that are not one 128×128 block.
    pub fn add_block(&mut self, w_hat: &[u16], suh: &[u16], svh: &[u16], codebook_std: f64) -> Result<(), DecodeError> {
        let is_bad = |b: &&u16| !fp16::to_f64(**b).is_finite();
        self.nonfinite_suh += suh.iter().filter(is_bad).count();
        self.nonfinite_svh += svh.iter().filter(is_bad).count();
        let w = full_weight(w_hat, BLOCK, BLOCK, suh, svh, "sample block")?;
        for v in &w {
            if v.is_finite() {
                self.w_sq += v * v;
                self.w_count += 1;
            } else {
                self.nonfinite_w += 1;
            }
        }
        let values: Vec<f64> = w_hat.iter().map(|&b| fp16::to_f64(b)).collect();
        self.w_hat_sq += values.iter().map(|v| v * v).sum::<f64>();
        let mut tile = Vec::with_capacity(TILE_ELEMENTS);
        let mut bits = Vec::with_capacity(TILE_ELEMENTS);
        for ti in 0..TILES_PER_BLOCK {
            for tj in 0..TILES_PER_BLOCK {
                tile.clear();
                bits.clear();
                for r in 0..TILE {
                    let row = (ti * TILE + r) * BLOCK + tj * TILE;
                    tile.extend_from_slice(&values[row..row + TILE]);
                    bits.extend_from_slice(&w_hat[row..row + TILE]);
                }
                bits.sort_unstable();
                bits.dedup();
                if mean_var(&tile).1.sqrt() < FLAT_TILE * codebook_std || bits.len() < MIN_DISTINCT {
                    self.flat_tiles += 1;
                }
                self.tiles += 1;
            }
        }
        self.blocks += 1;
        #[allow(clippy::cast_precision_loss)]
        let n = (self.blocks * BLOCK * BLOCK) as f64;
        self.w_hat_rms = (self.w_hat_sq / n).sqrt();
        #[allow(clippy::cast_precision_loss)]
        let m = self.w_count.max(1) as f64;
        self.w_rms = (self.w_sq / m).sqrt();
        Ok(())
    }
}

/// One packed matrix's decode result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MatrixSample {
    /// The matrix prefix (`P` of `P.trellis`).
    pub name: String,
    pub class: Class,
    pub k: f64,
    pub codebook: Codebook,
    #[serde(flatten)]
    pub stats: SampleStats,
}

impl MatrixSample {
    #[must_use]
    pub fn new(name: String, class: Class, bits: TileBits, codebook: Codebook) -> Self {
        Self { name, class, k: bits.k(), codebook, stats: SampleStats::default() }
    }
}

/// One problem found by the sampled decode, naming the tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecodeFinding {
    pub tensor: String,
    pub message: String,
}

/// The verdict over every sampled matrix: one finding per broken matrix (its first problem).
#[must_use]
pub fn judge(samples: &[MatrixSample]) -> Vec<DecodeFinding> {
    let medians = class_medians(samples);
    let mut out = Vec::new();
    for s in samples {
        if let Some(f) = judge_one(s, medians.iter().find(|(c, _)| *c == s.class).map(|(_, m)| *m)) {
            out.push(f);
        }
    }
    out
}

/// Median W RMS per class, over matrices whose own sample is sound.
fn class_medians(samples: &[MatrixSample]) -> Vec<(Class, f64)> {
    let mut by_class: Vec<(Class, Vec<f64>)> = Vec::new();
    for s in samples.iter().filter(|s| s.stats.w_rms.is_finite() && s.stats.w_rms > 0.0) {
        match by_class.iter_mut().find(|(c, _)| *c == s.class) {
            Some((_, v)) => v.push(s.stats.w_rms),
            None => by_class.push((s.class, vec![s.stats.w_rms])),
        }
    }
    by_class
        .into_iter()
        .filter(|(_, v)| v.len() >= CLASS_MEDIAN_MIN)
        .map(|(c, mut v)| {
            v.sort_by(f64::total_cmp);
            (c, v[v.len() / 2])
        })
        .collect()
}

fn judge_one(s: &MatrixSample, class_median: Option<f64>) -> Option<DecodeFinding> {
    let st = &s.stats;
    let p = &s.name;
    let found = |tensor: String, message: String| Some(DecodeFinding { tensor, message });
    if st.nonfinite_suh > 0 {
        return found(
            format!("{p}.suh"),
            format!("`{p}.suh`: {} non-finite value(s) in the sampled range (NaN/inf input scale)", st.nonfinite_suh),
        );
    }
    if st.nonfinite_svh > 0 {
        return found(
            format!("{p}.svh"),
            format!("`{p}.svh`: {} non-finite value(s) in the sampled range (NaN/inf output scale)", st.nonfinite_svh),
        );
    }
    if st.nonfinite_w > 0 {
        return found(
            p.clone(),
            format!(
                "`{p}`: the decoded weight has {} non-finite value(s) (scales overflow fp16 range)",
                st.nonfinite_w
            ),
        );
    }
    if st.flat_tiles > 0 {
        return found(
            format!("{p}.trellis"),
            format!(
                "`{p}.trellis`: {} of {} sampled 16×16 tiles decode to (nearly) constant or repeating values (zero-filled or garbage trellis)",
                st.flat_tiles, st.tiles
            ),
        );
    }
    let std = codebook_std(s.codebook);
    if st.w_hat_rms > W_HAT_SPREAD * std || st.w_hat_rms < std / W_HAT_SPREAD {
        return found(
            format!("{p}.trellis"),
            format!(
                "`{p}.trellis`: decoded {} values have RMS {:.3}, expected about {std:.3} (wrong codebook marker or garbage trellis)",
                s.codebook.name(),
                st.w_hat_rms
            ),
        );
    }
    if !(W_RMS_MIN..=W_RMS_MAX).contains(&st.w_rms) {
        return found(
            p.clone(),
            format!(
                "`{p}`: decoded weight RMS {:.3e} is outside [{W_RMS_MIN:e}, {W_RMS_MAX}] (broken suh/svh scales)",
                st.w_rms
            ),
        );
    }
    if let Some(m) = class_median {
        let ratio = st.w_rms / m;
        if !(1.0 / W_RMS_CLASS_RATIO..=W_RMS_CLASS_RATIO).contains(&ratio) {
            return found(
                p.clone(),
                format!(
                    "`{p}`: decoded weight RMS {:.3e} is {ratio:.3}× the median {m:.3e} of its class {} (broken suh/svh scales)",
                    st.w_rms,
                    s.class.name()
                ),
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_distinct_deterministic_and_bounded() {
        let a = pick_blocks(4, 3, 5, 42);
        assert_eq!(a, pick_blocks(4, 3, 5, 42));
        assert_eq!(a.len(), 5);
        assert_eq!(a[0], (0, 0));
        assert_eq!(a[1], (3, 2));
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(b.len(), 5);
        assert_eq!(pick_blocks(1, 1, 4, 1), vec![(0, 0)]);
        assert_eq!(pick_blocks(2, 2, 9, 7).len(), 4);
    }

    fn sample(name: &str, class: Class, w_hat: &[u16], suh: u16, svh: u16) -> MatrixSample {
        let mut m = MatrixSample::new(name.into(), class, TileBits::from_words(48).unwrap(), Codebook::Mul1);
        m.stats.add_block(w_hat, &[suh; BLOCK], &[svh; BLOCK], codebook_std(Codebook::Mul1)).unwrap();
        m
    }

    fn random_w_hat(seed: u64) -> Vec<u16> {
        let table = super::super::codebook::table(Codebook::Mul1);
        let mut s = seed | 1;
        (0..BLOCK * BLOCK)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                table[(s & 0xFFFF) as usize]
            })
            .collect()
    }

    #[test]
    fn sound_samples_pass_and_each_fault_names_its_tensor() {
        let half = fp16::from_f64(0.02);
        let one = fp16::from_f64(1.0);
        let good: Vec<MatrixSample> =
            (0..4).map(|i| sample(&format!("m{i}"), Class::DenseMlp, &random_w_hat(i + 1), half, one)).collect();
        assert!(good.iter().all(|m| (m.stats.w_rms - 0.02).abs() < 0.005), "{:?}", good[0].stats);
        assert_eq!(judge(&good), vec![]);

        let nan = 0x7E00;
        let zero_trellis = vec![super::super::codebook::table(Codebook::Mul1)[0]; BLOCK * BLOCK];
        // A trellis of one repeated word (0x1234): 16 distinct states per tile, a normal spread.
        let bits = TileBits::from_words(48).unwrap();
        let words = vec![0x1234u16; 64 * 48];
        let repeating =
            super::super::w_hat(&words, super::super::Dims { in_tiles: 8, out_tiles: 8, bits }, Codebook::Mul1, "t")
                .unwrap();
        assert!(mean_var(&repeating.iter().map(|&b| fp16::to_f64(b)).collect::<Vec<_>>()).1.sqrt() > 0.25);
        let cases = [
            (sample("bad", Class::DenseMlp, &random_w_hat(9), nan, one), "bad.suh"),
            (sample("bad", Class::DenseMlp, &random_w_hat(9), half, nan), "bad.svh"),
            (sample("bad", Class::DenseMlp, &zero_trellis, half, one), "bad.trellis"),
            (sample("bad", Class::DenseMlp, &repeating, half, one), "bad.trellis"),
            (sample("bad", Class::DenseMlp, &random_w_hat(9), fp16::from_f64(20.0), one), "bad"),
            (sample("bad", Class::DenseMlp, &random_w_hat(9), fp16::from_f64(1.5), one), "bad"),
        ];
        for (bad, tensor) in cases {
            let mut all = good.clone();
            all.push(bad);
            let f = judge(&all);
            assert_eq!(f.len(), 1, "{f:?}");
            assert_eq!(f[0].tensor, tensor, "{f:?}");
            assert!(f[0].message.starts_with(&format!("`{tensor}`")), "{f:?}");
        }
        // Too far from its class (×40) but within the absolute bounds.
        let mut all = good.clone();
        all.push(sample("far", Class::DenseMlp, &random_w_hat(9), fp16::from_f64(0.8), one));
        let f = judge(&all);
        assert!(f.len() == 1 && f[0].message.contains("median"), "{f:?}");
    }
}
