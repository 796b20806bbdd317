//! EXL3 structural audit over header metadata (docs/exl3-format.md §1.6).
//!
//! Tensors are grouped by the prefix before `.trellis`; each packed matrix is checked for
//! `trellis` I16 `[Kp/16, Np/16, 16K]`, `suh` F16 `[Kp]`, `svh` F16 `[Np]`, optional `bias`
//! F16 `[Np]` and at most one codebook marker (0-d I32; its 4 bytes are read, nothing else).
//! K comes from the trellis; a kit K map is only compared against it (the trellis wins, as it
//! does at load, reference-kit.md C.2). Next to real shards, `quantization_config.json`'s ledger is
//! checked too (`quant_ledger`), and `config.json`'s `quantization_config` and the folder's
//! files against what vLLM will load (`claims`).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use super::claims::{config_findings, folder_findings, Matrix};
pub use super::finding::{Codebook, Finding, Severity, MCG_MARKER, MUL1_MARKER};
pub use super::k_map::{
    is_valid_k, k_map_lookup, k_of_last_dim, num_hidden_layers, KDisagreement, DEFAULT_NUM_HIDDEN_LAYERS,
};
use super::k_map::{k_label, k_map_key_findings, record_disagreement};
use super::names::{classify, Class};
use super::packed_check::{check_packed, Parts};
use super::quant_ledger::ledger_findings;
use super::{Checkpoint, CheckpointError, MarkerReader, Origin, Tensor};

/// Alignment padding tolerated between tensors, in bytes.
const GAP_ALIGN: u64 = 8;

/// Per-class totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassStats {
    pub class: Class,
    pub packed_matrices: u64,
    pub native_tensors: u64,
    /// Bytes of every tensor of the class (packed parts and natives).
    pub bytes: u64,
    /// Σ Kp·Np over the class's packed matrices.
    pub packed_weights: u64,
    /// Σ K·Kp·Np / Σ Kp·Np: the K the trellis shapes say (0 when nothing is packed).
    pub bpw: f64,
    /// Packed bytes ×8 / Σ Kp·Np: includes suh/svh/markers/bias (0 when nothing is packed).
    pub effective_bpw: f64,
    /// How many packed matrices have each K (key: K as written, e.g. `3`, `2.5`).
    pub k_counts: BTreeMap<String, u64>,
}

/// The audit result (`spark-kit verify --structure --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditReport {
    pub origin: Origin,
    pub shards: usize,
    pub tensors: usize,
    pub packed_matrices: u64,
    pub native_tensors: u64,
    pub total_bytes: u64,
    pub classes: Vec<ClassStats>,
    /// Packed matrices per codebook.
    pub codebooks: BTreeMap<Codebook, u64>,
    /// False for a virtual checkpoint without recorded marker bytes: marker values were not checked.
    pub markers_checked: bool,
    /// Data-area bytes no tensor covers, over all shards (alignment padding included; padding of
    /// fewer than 8 bytes up to an 8-byte boundary is not reported as a finding).
    pub gap_bytes: u64,
    pub k_map_disagreements: Vec<KDisagreement>,
    pub findings: Vec<Finding>,
}

impl AuditReport {
    /// Number of error findings.
    #[must_use]
    pub fn errors(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error).count()
    }
    /// Stats of one class, if the checkpoint has any of it.
    #[must_use]
    pub fn class(&self, class: Class) -> Option<&ClassStats> {
        self.classes.iter().find(|c| c.class == class)
    }
}

/// Audit settings.
#[derive(Debug, Clone, Default)]
pub struct AuditOptions {
    /// The kit's K map (`model.k_map`); see [`k_map_lookup`] for its keys.
    pub k_map: BTreeMap<String, f64>,
}

/// Name and last component of a tensor name.
#[must_use]
pub fn split_name(name: &str) -> (&str, &str) {
    name.rsplit_once('.').unwrap_or((name, ""))
}

/// Accumulates per-class totals.
#[derive(Default)]
struct Acc {
    packed: u64,
    native: u64,
    bytes: u64,
    weights: u64,
    k_weights: f64,
    packed_bytes: u64,
    k_counts: BTreeMap<String, u64>,
}

/// Run the structural audit.
///
/// # Errors
/// Only I/O while reading 4-byte markers; every structural problem is a [`Finding`].
pub fn audit(ckpt: &Checkpoint, opts: &AuditOptions) -> Result<AuditReport, CheckpointError> {
    let layers = num_hidden_layers(&opts.k_map);
    let mut findings = k_map_key_findings(&opts.k_map);
    let mut groups: HashMap<&str, Parts<'_>> = HashMap::new();
    for t in &ckpt.tensors {
        let (prefix, leaf) = split_name(&t.name);
        if leaf == "trellis" {
            groups.entry(prefix).or_default().trellis = Some(t);
        }
    }
    let mut natives: Vec<&Tensor> = Vec::new();
    for t in &ckpt.tensors {
        let (prefix, leaf) = split_name(&t.name);
        let Some(parts) = groups.get_mut(prefix) else {
            if matches!(leaf, "suh" | "svh" | "su" | "sv" | "mul1" | "mcg") {
                findings.push(Finding {
                    severity: Severity::Warning,
                    tensor: Some(t.name.clone()),
                    message: format!("orphan `{leaf}`: no `{prefix}.trellis` beside it"),
                });
            }
            natives.push(t);
            continue;
        };
        let slot = match leaf {
            "trellis" => continue,
            "suh" => &mut parts.suh,
            "svh" => &mut parts.svh,
            "su" => &mut parts.su,
            "sv" => &mut parts.sv,
            "mul1" => &mut parts.mul1,
            "mcg" => &mut parts.mcg,
            "bias" => &mut parts.bias,
            _ => {
                parts.extra.push(t);
                continue;
            }
        };
        *slot = Some(t);
    }

    let mut acc: BTreeMap<Class, Acc> = BTreeMap::new();
    let mut codebooks: BTreeMap<Codebook, u64> = BTreeMap::new();
    let mut codebook_example: BTreeMap<Codebook, String> = BTreeMap::new();
    let mut disagreements: BTreeMap<(Class, Option<u32>, String, u64, u64), KDisagreement> = BTreeMap::new();
    let mut markers = MarkerReader::new(ckpt);
    let markers_checked = ckpt.has_marker_bytes();
    let mut matrices: BTreeMap<&str, (f64, Codebook)> = BTreeMap::new();
    let mut shapes: Vec<Matrix<'_>> = Vec::new();

    let mut prefixes: Vec<&str> = groups.keys().copied().collect();
    prefixes.sort_unstable();
    for prefix in prefixes {
        let Some(parts) = groups.get(prefix) else { continue };
        let role = classify(prefix, layers);
        let a = acc.entry(role.class).or_default();
        a.packed += 1;
        let all = [parts.trellis, parts.suh, parts.svh, parts.su, parts.sv, parts.mul1, parts.mcg, parts.bias];
        let bytes: u64 = all.iter().flatten().map(|t| t.bytes()).sum();
        a.bytes += bytes;
        for extra in &parts.extra {
            a.native += 1;
            a.bytes += extra.bytes();
            let (_, leaf) = split_name(&extra.name);
            let message = if leaf == "weight" {
                format!("native `{}` beside `{prefix}.trellis`: the loader ignores it", extra.name)
            } else {
                format!("unexpected tensor `{}` beside `{prefix}.trellis`", extra.name)
            };
            findings.push(Finding { severity: Severity::Warning, tensor: Some(extra.name.clone()), message });
        }
        let checked = check_packed(prefix, parts, &mut markers, markers_checked, &mut findings)?;
        let Some((k, kp, np, codebook)) = checked else { continue };
        *codebooks.entry(codebook).or_default() += 1;
        matrices.insert(prefix, (k, codebook));
        shapes.push(Matrix { prefix, class: role.class, k, weights: kp.saturating_mul(np) });
        codebook_example.entry(codebook).or_insert_with(|| prefix.to_string());
        let w = kp.saturating_mul(np);
        a.weights = a.weights.saturating_add(w);
        // Weight counts stay far below 2^53, so the f64 sum is exact enough for a ratio.
        #[allow(clippy::cast_precision_loss)]
        let wf = w as f64;
        a.k_weights += k * wf;
        a.packed_bytes += bytes;
        *a.k_counts.entry(k_label(k)).or_default() += 1;
        record_disagreement(&opts.k_map, role, prefix, k, &mut disagreements);
    }

    let any_packed = !codebooks.is_empty();
    for t in natives {
        let (prefix, leaf) = split_name(&t.name);
        let role = classify(prefix, layers);
        let a = acc.entry(role.class).or_default();
        a.native += 1;
        a.bytes += t.bytes();
        if any_packed && leaf == "weight" && t.shape.len() == 2 && role.base.expects_packed() {
            let severity = if role.class == Class::Head { Severity::Warning } else { Severity::Error };
            findings.push(Finding {
                severity,
                tensor: Some(t.name.clone()),
                message: format!(
                    "native {} {:?} where a packed `{prefix}.trellis` is expected ({} matrices are EXL3 elsewhere)",
                    t.dtype,
                    t.shape,
                    role.class.name()
                ),
            });
        }
    }

    if codebooks.len() > 1 {
        let list: Vec<String> = codebooks
            .iter()
            .map(|(c, n)| format!("{n} {} (e.g. `{}`)", c.name(), codebook_example.get(c).map_or("", String::as_str)))
            .collect();
        findings.push(Finding {
            severity: Severity::Warning,
            tensor: None,
            message: format!("mixed codebooks: {}; a missing marker means 3INST", list.join(", ")),
        });
    }

    if let Origin::Files { dir } = &ckpt.origin {
        findings.extend(ledger_findings(ckpt, dir, &matrices));
        findings.extend(config_findings(dir, &shapes));
    }
    if let Some(folder) = &ckpt.folder {
        findings.extend(folder_findings(ckpt, folder));
    }

    let gap_bytes = ckpt.shards.iter().flat_map(|s| &s.gaps).map(|g| g.end.saturating_sub(g.begin)).sum();
    for shard in &ckpt.shards {
        // Padding that only aligns the next tensor (or the end) to 8 bytes is not a gap.
        for g in shard.gaps.iter().filter(|g| g.end.saturating_sub(g.begin) >= GAP_ALIGN || g.end % GAP_ALIGN != 0) {
            findings.push(Finding {
                severity: Severity::Warning,
                tensor: g.after.clone(),
                message: format!(
                    "{}: {} data bytes [{}, {}) belong to no tensor",
                    shard.path.display(),
                    g.end.saturating_sub(g.begin),
                    g.begin,
                    g.end
                ),
            });
        }
    }

    let classes = acc
        .into_iter()
        .map(|(class, a)| {
            #[allow(clippy::cast_precision_loss)]
            let (w, pb) = (a.weights as f64, a.packed_bytes as f64);
            ClassStats {
                class,
                packed_matrices: a.packed,
                native_tensors: a.native,
                bytes: a.bytes,
                packed_weights: a.weights,
                bpw: if a.weights > 0 { a.k_weights / w } else { 0.0 },
                effective_bpw: if a.weights > 0 { pb * 8.0 / w } else { 0.0 },
                k_counts: a.k_counts,
            }
        })
        .collect::<Vec<_>>();
    let packed_matrices = classes.iter().map(|c| c.packed_matrices).sum();
    let native_tensors = classes.iter().map(|c| c.native_tensors).sum();
    let total_bytes = ckpt.tensors.iter().map(Tensor::bytes).sum();
    findings.sort_by_key(|f| f.severity);
    Ok(AuditReport {
        origin: ckpt.origin.clone(),
        shards: ckpt.shards.len(),
        tensors: ckpt.tensors.len(),
        packed_matrices,
        native_tensors,
        total_bytes,
        classes,
        codebooks,
        markers_checked,
        gap_bytes,
        k_map_disagreements: disagreements.into_values().collect(),
        findings,
    })
}

/// Names of every packed matrix prefix (a tensor `P.trellis` exists).
#[must_use]
pub fn packed_prefixes(ckpt: &Checkpoint) -> HashSet<&str> {
    ckpt.tensors
        .iter()
        .filter_map(|t| match split_name(&t.name) {
            (p, "trellis") => Some(p),
            _ => None,
        })
        .collect()
}
