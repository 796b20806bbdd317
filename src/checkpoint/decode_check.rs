//! `verify --decode` over a checkpoint on disk: for every packed matrix, read and decode a sample
//! of 128×128 blocks (64 tiles each) with the Rust decoder, then judge the numbers
//! (`exl3_decode::sample`). Reads only the sampled trellis rows and scale ranges.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use super::exl3_audit::{split_name, Codebook, DEFAULT_NUM_HIDDEN_LAYERS};
use super::exl3_decode::bitstream::TileBits;
use super::exl3_decode::sample::{
    codebook_std, judge, name_seed, pick_blocks, DecodeFinding, MatrixSample, TILES_PER_BLOCK,
};
use super::exl3_decode::{hadamard::BLOCK, w_hat, Dims};
use super::names::classify;
use super::safetensors::Dtype;
use super::tensor_data::{le_u16, TensorData};
use super::{Checkpoint, CheckpointError, Tensor};

/// Settings of the sampled decode.
#[derive(Debug, Clone, Copy)]
pub struct DecodeOptions {
    /// 128×128 blocks decoded per matrix (the first, the last, then pseudo-random ones).
    pub blocks_per_matrix: usize,
    /// Worker threads.
    pub threads: usize,
    /// Layers past this are MTP blocks (for the class of a name).
    pub num_hidden_layers: u32,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self { blocks_per_matrix: 2, threads: 4, num_hidden_layers: DEFAULT_NUM_HIDDEN_LAYERS }
    }
}

/// Progress of the sampled decode (called from worker threads).
pub trait DecodeProgress: Sync {
    /// `done` of `total` matrices decoded.
    fn matrices(&self, done: usize, total: usize);
}

impl<F: Fn(usize, usize) + Sync> DecodeProgress for F {
    fn matrices(&self, done: usize, total: usize) {
        self(done, total);
    }
}

/// Result of `verify --decode` (the `decode` field of `verify --decode --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeReport {
    pub matrices: usize,
    pub blocks_per_matrix: usize,
    pub tiles_decoded: usize,
    pub bytes_read: u64,
    /// Matrices that could not be sampled (structure broken; the structural audit names why).
    pub skipped: Vec<DecodeFinding>,
    pub findings: Vec<DecodeFinding>,
    /// Per class: matrices and the median / min / max RMS of the decoded weight.
    pub classes: BTreeMap<String, ClassRms>,
    pub samples: Vec<MatrixSample>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassRms {
    pub matrices: usize,
    pub median_w_rms: f64,
    pub min_w_rms: f64,
    pub max_w_rms: f64,
}

/// What one matrix needs for decoding.
struct Packed<'a> {
    name: &'a str,
    trellis: &'a Tensor,
    dims: Dims,
    suh: &'a Tensor,
    svh: &'a Tensor,
    codebook: Codebook,
}

/// Matrices to sample; those whose tensors cannot be decoded are returned as skipped.
fn packed_matrices(ckpt: &Checkpoint) -> (Vec<Packed<'_>>, Vec<DecodeFinding>) {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    for t in &ckpt.tensors {
        let (prefix, leaf) = split_name(&t.name);
        if leaf != "trellis" {
            continue;
        }
        let skip = |why: String| DecodeFinding { tensor: t.name.clone(), message: why };
        let dims = match (t.dtype, Dims::from_shape(&t.shape, &t.name)) {
            (Dtype::I16, Ok(d)) if d.in_tiles % TILES_PER_BLOCK == 0 && d.out_tiles % TILES_PER_BLOCK == 0 => d,
            (_, Err(e)) => {
                skipped.push(skip(e.to_string()));
                continue;
            }
            _ => {
                skipped.push(skip(format!("`{}`: {} {:?} is not a decodable trellis", t.name, t.dtype, t.shape)));
                continue;
            }
        };
        let vector = |leaf: &str, len: usize| {
            ckpt.get(&format!("{prefix}.{leaf}"))
                .filter(|v| v.dtype == Dtype::F16 && v.shape.len() == 1 && usize::try_from(v.shape[0]) == Ok(len))
        };
        let (Some(suh), Some(svh)) = (vector("suh", dims.rows()), vector("svh", dims.cols())) else {
            skipped.push(skip(format!(
                "`{prefix}`: no F16 suh [{}] / svh [{}] to decode with",
                dims.rows(),
                dims.cols()
            )));
            continue;
        };
        let has = |leaf: &str| ckpt.get(&format!("{prefix}.{leaf}")).is_some();
        let codebook = if has("mul1") {
            Codebook::Mul1
        } else if has("mcg") {
            Codebook::Mcg
        } else {
            Codebook::ThreeInst
        };
        out.push(Packed { name: prefix, trellis: t, dims, suh, svh, codebook });
    }
    (out, skipped)
}

/// Decode the sample of one matrix.
fn sample_matrix(
    data: &mut TensorData<'_>,
    m: &Packed<'_>,
    opts: &DecodeOptions,
    bytes: &mut u64,
) -> Result<MatrixSample, CheckpointError> {
    let bits: TileBits = m.dims.bits;
    let class = classify(m.name, opts.num_hidden_layers).class;
    let mut sample = MatrixSample::new(m.name.to_string(), class, bits, m.codebook);
    let std = codebook_std(m.codebook);
    let words = bits.words() as u64;
    let (rows, cols) = (m.dims.in_tiles / TILES_PER_BLOCK, m.dims.out_tiles / TILES_PER_BLOCK);
    for (bi, bj) in pick_blocks(rows, cols, opts.blocks_per_matrix, name_seed(m.name)) {
        let mut tiles = Vec::with_capacity(TILES_PER_BLOCK * TILES_PER_BLOCK * bits.words());
        for r in 0..TILES_PER_BLOCK {
            let i = (bi * TILES_PER_BLOCK + r) as u64;
            let first = i * m.dims.out_tiles as u64 + (bj * TILES_PER_BLOCK) as u64;
            let (begin, end) = (first * words * 2, (first + TILES_PER_BLOCK as u64) * words * 2);
            tiles.extend(le_u16(&data.read(m.trellis, begin, end)?));
            *bytes += end - begin;
        }
        let block = Dims { in_tiles: TILES_PER_BLOCK, out_tiles: TILES_PER_BLOCK, bits };
        let w = w_hat(&tiles, block, m.codebook, &m.trellis.name).map_err(|e| decode_error(m, &e))?;
        let range = |k: usize| ((k * BLOCK * 2) as u64, ((k + 1) * BLOCK * 2) as u64);
        let (s0, s1) = range(bi);
        let (v0, v1) = range(bj);
        let suh = le_u16(&data.read(m.suh, s0, s1)?);
        let svh = le_u16(&data.read(m.svh, v0, v1)?);
        *bytes += (s1 - s0) + (v1 - v0);
        sample.stats.add_block(&w, &suh, &svh, std).map_err(|e| decode_error(m, &e))?;
    }
    Ok(sample)
}

fn decode_error(m: &Packed<'_>, e: &super::exl3_decode::DecodeError) -> CheckpointError {
    CheckpointError::Decode { tensor: m.trellis.name.clone(), why: e.to_string() }
}

/// Decode a sample of every packed matrix and judge it.
///
/// # Errors
/// I/O failures reading tensor data (they name the shard and tensor).
pub fn decode_check(
    ckpt: &Checkpoint,
    opts: &DecodeOptions,
    progress: &dyn DecodeProgress,
) -> Result<DecodeReport, CheckpointError> {
    let (matrices, skipped) = packed_matrices(ckpt);
    let total = matrices.len();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, MatrixSample)>> = Mutex::new(Vec::with_capacity(total));
    let failure: Mutex<Option<CheckpointError>> = Mutex::new(None);
    let bytes = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..opts.threads.max(1).min(total.max(1)) {
            scope.spawn(|| {
                let mut data = TensorData::new(ckpt);
                let mut read = 0u64;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(m) = matrices.get(i) else { break };
                    if failure.lock().map(|f| f.is_some()).unwrap_or(true) {
                        break;
                    }
                    match sample_matrix(&mut data, m, opts, &mut read) {
                        Ok(s) => {
                            if let Ok(mut r) = results.lock() {
                                r.push((i, s));
                            }
                        }
                        Err(e) => {
                            if let Ok(mut f) = failure.lock() {
                                f.get_or_insert(e);
                            }
                            break;
                        }
                    }
                    progress.matrices(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                }
                bytes.fetch_add(usize::try_from(read).unwrap_or(usize::MAX), Ordering::Relaxed);
            });
        }
    });
    if let Some(e) = failure.into_inner().ok().flatten() {
        return Err(e);
    }
    let mut results = results.into_inner().unwrap_or_default();
    results.sort_by_key(|(i, _)| *i);
    let samples: Vec<MatrixSample> = results.into_iter().map(|(_, s)| s).collect();
    let findings = judge(&samples);
    Ok(DecodeReport {
        matrices: samples.len(),
        blocks_per_matrix: opts.blocks_per_matrix,
        tiles_decoded: samples.iter().map(|s| s.stats.tiles).sum(),
        bytes_read: bytes.into_inner() as u64,
        skipped,
        findings,
        classes: class_rms(&samples),
        samples,
    })
}

fn class_rms(samples: &[MatrixSample]) -> BTreeMap<String, ClassRms> {
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in samples {
        by.entry(s.class.name().to_string()).or_default().push(s.stats.w_rms);
    }
    by.into_iter()
        .map(|(c, mut v)| {
            v.sort_by(f64::total_cmp);
            let r = ClassRms {
                matrices: v.len(),
                median_w_rms: v[v.len() / 2],
                min_w_rms: v[0],
                max_w_rms: v[v.len() - 1],
            };
            (c, r)
        })
        .collect()
}
