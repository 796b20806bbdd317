//! An independent EXL3 decoder (docs/exl3-format.md §2), used by `spark-kit verify --decode`.
//!
//! A packed linear is `trellis` int16 `[Kp/16, Np/16, 16·K]`, `suh` fp16 `[Kp]`, `svh` fp16 `[Np]`
//! and a codebook (marker). Decoding gives
//!
//! ```text
//! W_hat (Kp × Np, fp16)  = every 16×16 tile of the trellis through the codebook   (bit-exact)
//! W     (Kp × Np)        = diag(suh) · Hk · W_hat · Hn · diag(svh)
//! ```
//!
//! with W stored as (in, out). Everything here is pure: the caller reads the tensors
//! (`sample` does it for verify) and passes raw little-endian values.

pub mod bitstream;
pub mod codebook;
pub mod fp16;
pub mod hadamard;
pub mod sample;

use self::bitstream::{decode_tile, TileBits, TILE};
use crate::checkpoint::exl3_audit::Codebook;

/// Why a packed matrix cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("`{tensor}`: {why}")]
    Shape { tensor: String, why: String },
}

/// A packed matrix's dimensions: input tiles, output tiles and bits per weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub in_tiles: usize,
    pub out_tiles: usize,
    pub bits: TileBits,
}

impl Dims {
    /// From a trellis shape `[Kp/16, Np/16, 16·K]`; `name` labels errors.
    ///
    /// # Errors
    /// Not rank 3, a zero dimension, or a last dimension that is no valid K.
    pub fn from_shape(shape: &[u64], name: &str) -> Result<Self, DecodeError> {
        let bad = |why: String| DecodeError::Shape { tensor: name.to_string(), why };
        let [t0, t1, w] = shape else {
            return Err(bad(format!("shape {shape:?} is not rank 3 [Kp/16, Np/16, 16·K]")));
        };
        let to = |v: u64| usize::try_from(v).map_err(|_| bad(format!("dimension {v} does not fit in memory")));
        let (t0, t1, w) = (to(*t0)?, to(*t1)?, to(*w)?);
        let bits = TileBits::from_words(w)
            .ok_or_else(|| bad(format!("last dim {w} is not 16·K for K = 1..8 or 1.5/2.5/3.5")))?;
        if t0 == 0 || t1 == 0 {
            return Err(bad(format!("shape {shape:?} has no tiles")));
        }
        Ok(Self { in_tiles: t0, out_tiles: t1, bits })
    }

    /// Padded input features `Kp`.
    #[must_use]
    pub const fn rows(self) -> usize {
        self.in_tiles * TILE
    }

    /// Padded output features `Np`.
    #[must_use]
    pub const fn cols(self) -> usize {
        self.out_tiles * TILE
    }
}

/// W_hat of a whole trellis (`dims.in_tiles · dims.out_tiles · words` int16 words, as u16):
/// fp16 bit patterns, row-major `Kp × Np`.
///
/// # Errors
/// `words` has the wrong length.
pub fn w_hat(words: &[u16], dims: Dims, codebook: Codebook, name: &str) -> Result<Vec<u16>, DecodeError> {
    let per = dims.bits.words();
    let want = dims.in_tiles * dims.out_tiles * per;
    if words.len() != want {
        return Err(DecodeError::Shape {
            tensor: name.to_string(),
            why: format!("{} words, expected {want} for {dims:?}", words.len()),
        });
    }
    let table = codebook::table(codebook);
    let ld = dims.cols();
    let mut out = vec![0u16; dims.rows() * ld];
    for (index, tile) in words.chunks_exact(per).enumerate() {
        let (i, j) = (index / dims.out_tiles, index % dims.out_tiles);
        decode_tile(tile, dims.bits, table, &mut out, ld, TILE * i, TILE * j);
    }
    Ok(out)
}

/// Check a W_hat and its scale vectors fit together and the sides are whole 128-blocks.
fn check_scales(
    rows: usize,
    cols: usize,
    w_len: usize,
    suh: &[u16],
    svh: &[u16],
    name: &str,
) -> Result<(), DecodeError> {
    let bad = |why: String| DecodeError::Shape { tensor: name.to_string(), why };
    if rows % hadamard::BLOCK != 0 || cols % hadamard::BLOCK != 0 || w_len != rows * cols {
        return Err(bad(format!("{rows} × {cols} ({w_len} values) is not made of whole 128 × 128 blocks")));
    }
    if suh.len() != rows || svh.len() != cols {
        return Err(bad(format!("suh has {} values and svh {}, expected {rows} and {cols}", suh.len(), svh.len())));
    }
    Ok(())
}

/// W = diag(suh) · Hk · W_hat · Hn · diag(svh) in `f64` (row-major `rows × cols`, (in, out)).
///
/// # Errors
/// Sizes that do not fit together, or sides that are not multiples of 128.
pub fn full_weight(
    w_hat: &[u16],
    rows: usize,
    cols: usize,
    suh: &[u16],
    svh: &[u16],
    name: &str,
) -> Result<Vec<f64>, DecodeError> {
    check_scales(rows, cols, w_hat.len(), suh, svh, name)?;
    let mut w: Vec<f64> = w_hat.iter().map(|&b| fp16::to_f64(b)).collect();
    hadamard::rows_in_place(&mut w, rows, cols);
    hadamard::cols_in_place(&mut w, cols);
    let sv: Vec<f64> = svh.iter().map(|&b| fp16::to_f64(b)).collect();
    for (row, &su) in w.chunks_exact_mut(cols).zip(suh) {
        let su = fp16::to_f64(su);
        for (v, s) in row.iter_mut().zip(&sv) {
            *v *= su * s;
        }
    }
    Ok(w)
}

/// W in fp16 (bit patterns) rounded the way exllamav3's reconstruction rounds it: each of
/// Hk·W_hat, ×suh (rows), ·Hn, ×svh (columns) in `f32` (the Hadamards as `f32` GEMMs with
/// sequential fused multiply-adds), rounded to fp16 after every step. On a real converted
/// checkpoint this equals exllamav3's `get_weight_tensor()` bit for bit (tests/checkpoint/exl3_decode.rs).
///
/// # Errors
/// As [`full_weight`].
pub fn full_weight_fp16(
    w_hat: &[u16],
    rows: usize,
    cols: usize,
    suh: &[u16],
    svh: &[u16],
    name: &str,
) -> Result<Vec<u16>, DecodeError> {
    check_scales(rows, cols, w_hat.len(), suh, svh, name)?;
    // f32 → fp16 → f32: f32 → f64 is exact, so one rounding.
    let round = |v: f32| fp16::to_f32(fp16::from_f64(f64::from(v)));
    let w: Vec<f32> = w_hat.iter().map(|&b| fp16::to_f32(b)).collect();
    let mut w: Vec<f32> = hadamard::rows_f32_gemm(&w, rows, cols).into_iter().map(round).collect();
    for (row, &su) in w.chunks_exact_mut(cols).zip(suh) {
        let su = fp16::to_f32(su);
        row.iter_mut().for_each(|v| *v = round(*v * su));
    }
    let w: Vec<f32> = hadamard::cols_f32_gemm(&w, cols).into_iter().map(round).collect();
    let sv: Vec<f32> = svh.iter().map(|&b| fp16::to_f32(b)).collect();
    Ok(w.chunks_exact(cols)
        .flat_map(|row| row.iter().zip(&sv).map(|(&v, &s)| fp16::from_f64(f64::from(v * s))))
        .collect())
}
