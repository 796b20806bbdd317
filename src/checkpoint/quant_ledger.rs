//! `quantization_config.json` against the shard headers (docs/exl3-format.md §1.3, §1.6 step 6).
//!
//! exllamav3 writes a `tensor_storage` ledger: per module, the stored tensors (shape, bytes,
//! torch dtype) and, for EXL3 linears, `bits_per_weight` and the codebook multiplier. A ledger
//! entry no shard holds means an incomplete download; a shape or dtype that differs means shards
//! from different conversions; a multiplier other than the kernel constants means a file from
//! the experimental custom-multiplier era that decodes wrongly today. The trellis still decides K.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::finding::{Codebook, Finding, Severity};
use super::safetensors::Dtype;
use super::Checkpoint;

/// MUL1 multiplier as the ledger writes it (`0x83DCD12D`).
const MUL1_MULTIPLIER: u64 = 0x83DC_D12D;
/// MCG multiplier as the ledger writes it (`0xCBAC1FED`).
const MCG_MULTIPLIER: u64 = 0xCBAC_1FED;
/// Largest ledger we read (the DeepSeek one is tens of MiB, reference-kit.md B).
const MAX_LEDGER_BYTES: u64 = 512 * 1024 * 1024;
/// Examples named in an aggregated finding.
const EXAMPLES: usize = 3;

/// Header dtype of a torch dtype name, when there is one.
fn dtype_of_torch(name: &str) -> Option<Dtype> {
    Some(match name.strip_prefix("torch.").unwrap_or(name) {
        "float16" | "half" => Dtype::F16,
        "bfloat16" => Dtype::BF16,
        "float32" | "float" => Dtype::F32,
        "float64" | "double" => Dtype::F64,
        "int8" => Dtype::I8,
        "uint8" => Dtype::U8,
        "int16" | "short" => Dtype::I16,
        "int32" | "int" => Dtype::I32,
        "int64" | "long" => Dtype::I64,
        "bool" => Dtype::Bool,
        "float8_e4m3fn" => Dtype::F8E4M3,
        "float8_e5m2" => Dtype::F8E5M2,
        "float8_e8m0fnu" => Dtype::F8E8M0,
        _ => return None,
    })
}

fn finding(severity: Severity, tensor: Option<&str>, message: String) -> Finding {
    Finding { severity, tensor: tensor.map(str::to_string), message }
}

/// Check `dir/quantization_config.json`, if present, against the checkpoint. `matrices` maps each
/// valid packed matrix prefix to its trellis K and codebook.
#[must_use]
pub fn ledger_findings(ckpt: &Checkpoint, dir: &Path, matrices: &BTreeMap<&str, (f64, Codebook)>) -> Vec<Finding> {
    let path = dir.join("quantization_config.json");
    let file = path.display().to_string();
    let Ok(meta) = std::fs::metadata(&path) else { return Vec::new() };
    if meta.len() > MAX_LEDGER_BYTES {
        return vec![finding(Severity::Warning, None, format!("{file}: {} bytes, too large to check", meta.len()))];
    }
    let parsed = std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()));
    match parsed {
        Ok(v) => check(ckpt, &file, &v, matrices),
        Err(e) => vec![finding(
            Severity::Error,
            None,
            format!("{file}: cannot be read as JSON ({e}); the EXL3 loader reads it"),
        )],
    }
}

fn check(ckpt: &Checkpoint, file: &str, v: &Value, matrices: &BTreeMap<&str, (f64, Codebook)>) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(cb) = v.get("codebook").and_then(Value::as_str) {
        let seen: Vec<&str> = {
            let mut s: Vec<&str> = matrices.values().map(|(_, c)| c.name()).collect();
            s.sort_unstable();
            s.dedup();
            s
        };
        if !seen.is_empty() && !seen.contains(&cb) {
            out.push(finding(
                Severity::Warning,
                None,
                format!("{file}: `codebook` is `{cb}` but the markers say {} (markers decide)", seen.join("/")),
            ));
        }
    }
    let Some(storage) = v.get("tensor_storage").and_then(Value::as_object) else { return out };
    let mut missing: Vec<&str> = Vec::new();
    for (module, entry) in storage {
        if let Some(stored) = entry.get("stored_tensors").and_then(Value::as_object) {
            for (name, info) in stored {
                check_stored(ckpt, file, name, info, &mut missing, &mut out);
            }
        }
        if entry.get("quant_format").and_then(Value::as_str) == Some("exl3") {
            check_exl3(file, module, entry, matrices.get(module.as_str()).copied(), &mut out);
        }
    }
    if !missing.is_empty() {
        let examples: Vec<String> = missing.iter().take(EXAMPLES).map(|n| format!("`{n}`")).collect();
        out.push(finding(
            Severity::Error,
            missing.first().copied(),
            format!(
                "{file} lists {} tensor(s) that no shard holds (incomplete checkpoint?), e.g. {}",
                missing.len(),
                examples.join(", ")
            ),
        ));
    }
    out
}

fn check_stored<'a>(
    ckpt: &Checkpoint,
    file: &str,
    name: &'a str,
    info: &Value,
    missing: &mut Vec<&'a str>,
    out: &mut Vec<Finding>,
) {
    let Some(t) = ckpt.get(name) else {
        missing.push(name);
        return;
    };
    let shape: Option<Vec<u64>> =
        info.get("shape").and_then(Value::as_array).and_then(|a| a.iter().map(Value::as_u64).collect());
    if let Some(shape) = shape.filter(|s| *s != t.shape) {
        out.push(finding(
            Severity::Error,
            Some(name),
            format!(
                "`{name}` is {:?} in its shard but {shape:?} in {file} (shards from different conversions?)",
                t.shape
            ),
        ));
        return;
    }
    if let Some(dtype) = info.get("dtype").and_then(Value::as_str).and_then(dtype_of_torch).filter(|d| *d != t.dtype) {
        out.push(finding(
            Severity::Error,
            Some(name),
            format!("`{name}` is {} in its shard but {dtype} in {file}", t.dtype),
        ));
        return;
    }
    if let Some(n) = info.get("n_bytes").and_then(Value::as_u64).filter(|n| *n != t.bytes()) {
        out.push(finding(
            Severity::Error,
            Some(name),
            format!("`{name}` holds {} bytes in its shard but {n} in {file}", t.bytes()),
        ));
    }
}

fn check_exl3(file: &str, module: &str, entry: &Value, matrix: Option<(f64, Codebook)>, out: &mut Vec<Finding>) {
    let Some((k, codebook)) = matrix else { return };
    if let Some(bpw) = entry.get("bits_per_weight").and_then(Value::as_f64) {
        if (bpw - k).abs() > 1e-9 {
            out.push(finding(
                Severity::Warning,
                Some(module),
                format!("`{module}`: {file} says bits_per_weight {bpw}, the trellis says K = {k} (the trellis wins)"),
            ));
        }
    }
    let ledger =
        [("mul1_multiplier", Codebook::Mul1, MUL1_MULTIPLIER), ("mcg_multiplier", Codebook::Mcg, MCG_MULTIPLIER)]
            .into_iter()
            .find_map(|(key, cb, constant)| entry.get(key).map(|m| (key, cb, constant, m.as_u64())));
    match ledger {
        Some((key, _, constant, value)) if value != Some(constant) => out.push(finding(
            Severity::Error,
            Some(module),
            format!(
                "`{module}`: {file} has {key} {}, not the kernel constant {constant} (a custom-multiplier file decodes wrongly)",
                value.map_or_else(|| "of the wrong type".to_string(), |v| v.to_string())
            ),
        )),
        Some((key, cb, _, _)) if cb != codebook => out.push(finding(
            Severity::Error,
            Some(module),
            format!("`{module}`: {file} has {key} but the marker says {} (packed ABI mismatch)", codebook.name()),
        )),
        None if codebook != Codebook::ThreeInst => out.push(finding(
            Severity::Warning,
            Some(module),
            format!("`{module}`: {file} names no multiplier but the marker says {}", codebook.name()),
        )),
        _ => {}
    }
}
