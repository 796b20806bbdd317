//! What a model folder claims about itself, checked against its shards:
//! - `config.json`'s `quantization_config.bits` / `head_bits` against the K the trellis shapes say;
//! - the files and tensors vLLM would load: without `model.safetensors.index.json` it loads every
//!   `*.safetensors` file of the folder, with one it loads every tensor of the shards the index
//!   names — a file or tensor that is not part of the model fails the boot with "no module or
//!   parameter named …", so the audit names it first.

use std::path::Path;

use serde_json::Value;

use super::finding::{Finding, Severity};
use super::k_map::k_label;
use super::names::Class;
use super::safetensors::read_shard_header;
use super::{Checkpoint, Folder};

/// Tensors named per finding.
const EXAMPLES: usize = 3;
/// How far the weight-averaged trellis K may be from `quantization_config.bits` (exllamav3 mixes
/// K per tensor to reach a fractional target).
const BITS_TOLERANCE: f64 = 0.25;

/// One valid packed matrix as the audit saw it.
pub(super) struct Matrix<'a> {
    pub prefix: &'a str,
    pub class: Class,
    pub k: f64,
    /// Kp·Np.
    pub weights: u64,
}

fn error(message: String) -> Finding {
    Finding { severity: Severity::Error, tensor: None, message }
}

fn examples<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.take(EXAMPLES).map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// `dir/config.json`'s EXL3 `quantization_config` against the matrices. A config that is not
/// EXL3's, or absent, is not judged.
pub(super) fn config_findings(dir: &Path, matrices: &[Matrix<'_>]) -> Vec<Finding> {
    let path = dir.join("config.json");
    let Ok(bytes) = std::fs::read(&path) else { return Vec::new() };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else { return Vec::new() };
    let Some(q) = v.get("quantization_config") else { return Vec::new() };
    if q.get("quant_method").and_then(Value::as_str) != Some("exl3") {
        return Vec::new();
    }
    let file = path.display();
    let mut out = Vec::new();
    if let Some(hb) = q.get("head_bits").and_then(Value::as_f64) {
        let wrong: Vec<&Matrix<'_>> =
            matrices.iter().filter(|m| m.class == Class::Head && (m.k - hb).abs() > 1e-9).collect();
        if let Some(first) = wrong.first() {
            out.push(error(format!(
                "{file}: `quantization_config.head_bits` is {}, but the head's trellis says K = {} ({}): the config \
                 and the shards disagree (another conversion?); fix head_bits or re-download the shards",
                k_label(hb),
                k_label(first.k),
                examples(wrong.iter().map(|m| m.prefix))
            )));
        }
    }
    if let Some(bits) = q.get("bits").and_then(Value::as_f64) {
        let body: Vec<&Matrix<'_>> = matrices.iter().filter(|m| m.class != Class::Head).collect();
        let weights: u64 = body.iter().map(|m| m.weights).sum();
        if weights > 0 {
            // Weight counts stay far below 2^53: the f64 sums are exact enough for a mean.
            #[allow(clippy::cast_precision_loss)]
            let mean = body.iter().map(|m| m.k * m.weights as f64).sum::<f64>() / weights as f64;
            if (mean - bits).abs() > BITS_TOLERANCE {
                let mut by_distance = body.clone();
                by_distance.sort_by(|a, b| (b.k - bits).abs().total_cmp(&(a.k - bits).abs()));
                out.push(error(format!(
                    "{file}: `quantization_config.bits` is {}, but the trellis says K = {} on average over {} {} \
                     (e.g. {}): the config and the shards disagree (another conversion?)",
                    k_label(bits),
                    k_label((mean * 100.0).round() / 100.0),
                    body.len(),
                    if body.len() == 1 { "matrix" } else { "matrices" },
                    examples(by_distance.iter().map(|m| m.prefix))
                )));
            }
        }
    }
    out
}

/// Files and tensors of the folder that vLLM would load but that are not part of the model.
pub(super) fn folder_findings(ckpt: &Checkpoint, folder: &Folder) -> Vec<Finding> {
    let mut out = Vec::new();
    match &folder.index {
        Some((index, claimed)) => {
            for (i, shard) in ckpt.shards.iter().enumerate() {
                let unclaimed: Vec<&str> = ckpt
                    .tensors
                    .iter()
                    .filter(|t| t.shard == i && !claimed.contains(&t.name))
                    .map(|t| t.name.as_str())
                    .collect();
                if !unclaimed.is_empty() {
                    out.push(error(format!(
                        "{}: {} tensor(s) not in {}'s weight_map ({}): vLLM loads every tensor of the shards the \
                         index names and fails on them (\"no module or parameter named …\"); list them or remove them",
                        shard.path.display(),
                        unclaimed.len(),
                        index.display(),
                        examples(unclaimed.into_iter())
                    )));
                }
            }
            for stray in &folder.strays {
                out.push(Finding {
                    severity: Severity::Warning,
                    tensor: None,
                    message: format!(
                        "{}: not in {}: vLLM skips it, other loaders may not; move it out of the model folder",
                        stray.display(),
                        index.display()
                    ),
                });
            }
        }
        None => {
            for stray in &folder.strays {
                let what = match read_shard_header(stray) {
                    Ok(h) if h.tensors.is_empty() => "no tensors".to_string(),
                    Ok(h) => format!("tensors {}", examples(h.tensors.iter().map(|t| t.name.as_str()))),
                    Err(e) => format!("an unreadable header: {e}"),
                };
                out.push(error(format!(
                    "{}: not part of the model (its shards are {}), but vLLM loads every *.safetensors file of a \
                     folder without model.safetensors.index.json and fails on its {what}; move it out of the folder",
                    stray.display(),
                    examples(ckpt.shards.iter().filter_map(|s| s.path.file_name().and_then(|n| n.to_str())))
                )));
            }
        }
    }
    out
}
