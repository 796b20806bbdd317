//! Where a layer's Engram table is: `layers.{L}.engram.embed.weight` (F8_E4M3 `[rows, 256]`) and
//! `.scale` (F8_E8M0 `[rows, 8]`) located through the safetensors headers, or a packed shard.

use std::path::{Path, PathBuf};

use super::error::EngramError;
use super::header::{PackedHeader, HEADER_BYTES};
use super::layout::Geometry;
use super::{SCALE_BYTES, WEIGHT_BYTES};
use crate::checkpoint::safetensors::Dtype;
use crate::checkpoint::{Checkpoint, Tensor};

/// A tensor's bytes: the file and the absolute offset of its first byte.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Span {
    pub path: PathBuf,
    pub offset: u64,
}

/// One layer's table inside the original checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointTable {
    pub layer: u32,
    pub rows: u64,
    pub weight: Span,
    pub scale: Span,
}

/// Tensor names of a layer's table (`layers.{L}.engram.embed.{weight,scale}`).
#[must_use]
pub fn tensor_names(layer: u32) -> (String, String) {
    (format!("layers.{layer}.engram.embed.weight"), format!("layers.{layer}.engram.embed.scale"))
}

/// A tensor called `name` or `<prefix>.name`.
fn find<'a>(ckpt: &'a Checkpoint, name: &str) -> Option<&'a Tensor> {
    ckpt.get(name).or_else(|| {
        let tail = format!(".{name}");
        ckpt.tensors.iter().find(|t| t.name.ends_with(&tail))
    })
}

/// Find and check `layer`'s weight and scale in an opened checkpoint.
///
/// # Errors
/// A missing tensor, a wrong dtype or shape, weight and scale row counts that differ.
pub fn checkpoint_table(ckpt: &Checkpoint, dir: &Path, layer: u32) -> Result<CheckpointTable, EngramError> {
    let (wname, sname) = tensor_names(layer);
    let table_err = |why: String| EngramError::Table { path: dir.to_path_buf(), why };
    let w = find(ckpt, &wname).ok_or_else(|| table_err(format!("no tensor `{wname}` in the checkpoint headers")))?;
    let s = find(ckpt, &sname).ok_or_else(|| table_err(format!("no tensor `{sname}` in the checkpoint headers")))?;
    let check = |t: &Tensor, dtype: Dtype, width: usize| -> Result<u64, EngramError> {
        let path = ckpt.shard_path(t);
        match (t.dtype == dtype, t.shape.as_slice()) {
            (true, [rows, w]) if *w == width as u64 => Ok(*rows),
            _ => Err(EngramError::Table {
                path,
                why: format!("tensor `{}` is {} {:?}, expected {dtype} [rows, {width}]", t.name, t.dtype, t.shape),
            }),
        }
    };
    let rows = check(w, Dtype::F8E4M3, WEIGHT_BYTES)?;
    let srows = check(s, Dtype::F8E8M0, SCALE_BYTES)?;
    if rows != srows {
        return Err(table_err(format!("`{wname}` has {rows} rows but `{sname}` has {srows}")));
    }
    let span = |t: &Tensor| {
        let shard = &ckpt.shards[t.shard];
        Span { path: shard.path.clone(), offset: shard.data_start + t.begin }
    };
    Ok(CheckpointTable { layer, rows, weight: span(w), scale: span(s) })
}

/// Open the Engram source directory: its `config.json` geometry and its checkpoint headers.
///
/// # Errors
/// No or malformed `config.json`, unreadable or malformed shards or index.
pub fn open_source(dir: &Path) -> Result<(Geometry, Checkpoint), EngramError> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read(&cfg_path).map_err(|e| EngramError::io(&cfg_path, e))?;
    let value: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| EngramError::Table { path: cfg_path.clone(), why: format!("not valid JSON: {e}") })?;
    let geometry = Geometry::from_config(&value).map_err(|source| EngramError::Geometry { path: cfg_path, source })?;
    let ckpt = Checkpoint::open(dir).map_err(|e| EngramError::Table { path: dir.to_path_buf(), why: e.to_string() })?;
    Ok((geometry, ckpt))
}

/// Read and check a packed shard's header against what this rank expects.
///
/// # Errors
/// Unreadable file, bad magic, truncation, a layer / range / table size that differs.
pub fn packed_header(path: &Path, want: Option<&PackedHeader>) -> Result<PackedHeader, EngramError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| EngramError::io(path, e))?;
    let len = f.metadata().map_err(|e| EngramError::io(path, e))?.len();
    let mut buf = vec![0u8; HEADER_BYTES.min(usize::try_from(len).unwrap_or(HEADER_BYTES))];
    f.read_exact(&mut buf).map_err(|e| EngramError::io(path, e))?;
    let packed = |source| EngramError::Header { path: path.to_path_buf(), source };
    let h = PackedHeader::parse(&buf, len).map_err(packed)?;
    if let Some(w) = want {
        h.expect(w).map_err(packed)?;
    }
    Ok(h)
}
