//! EXL3 structural audit over header metadata (docs/exl3-format.md §1.6).
//!
//! Tensors are grouped by the prefix before `.trellis`; each packed matrix is checked for
//! `trellis` I16 `[Kp/16, Np/16, 16K]`, `suh` F16 `[Kp]`, `svh` F16 `[Np]`, optional `bias`
//! F16 `[Np]` and at most one codebook marker (0-d I32; its 4 bytes are read, nothing else).
//! K comes from the trellis; a kit K map is only compared against it (the trellis wins, as it
//! does at load, reference-kit.md C.2). Next to real shards, `quantization_config.json`'s ledger is
//! checked too (`quant_ledger`).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use super::names::{classify, Class, Role};
use super::quant_ledger::ledger_findings;
use super::safetensors::Dtype;
use super::{Checkpoint, CheckpointError, MarkerReader, Origin, Tensor};

/// MUL1 marker, `0x83DCD12D` little-endian (exl3-format.md §1.4).
pub const MUL1_MARKER: [u8; 4] = 0x83DC_D12D_u32.to_le_bytes();
/// MCG marker, `0xCBAC1FED` little-endian.
pub const MCG_MARKER: [u8; 4] = 0xCBAC_1FED_u32.to_le_bytes();
/// Decoder layers of DeepSeek V4.1 Flash (reference-kit.md C.2 `num_hidden_layers`), the default
/// boundary past which `layers.N` names an MTP block.
pub const DEFAULT_NUM_HIDDEN_LAYERS: u32 = 40;

/// Alignment padding tolerated between tensors, in bytes.
const GAP_ALIGN: u64 = 8;

/// Valid trellis last dimensions: 16·K for K = 1..8, and 24/40/56 for K = 1.5/2.5/3.5.
const TRELLIS_LAST_DIMS: [u64; 11] = [16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128];

/// The codebook of a packed matrix, from its marker (absent = 3INST).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Codebook {
    #[serde(rename = "mul1")]
    Mul1,
    #[serde(rename = "mcg")]
    Mcg,
    #[serde(rename = "3inst")]
    ThreeInst,
}

impl Codebook {
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Codebook::Mul1 => "mul1",
            Codebook::Mcg => "mcg",
            Codebook::ThreeInst => "3inst",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The checkpoint will not load, or will load wrongly.
    Error,
    /// Odd but loadable.
    Warning,
}

/// One problem found, naming the tensor it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub tensor: Option<String>,
    pub message: String,
}

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

/// A K-map entry the trellis contradicts, aggregated over the matrices it covers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KDisagreement {
    pub class: Class,
    pub layer: Option<u32>,
    /// The K-map key that applied.
    pub key: String,
    pub expected: f64,
    /// What the trellis says (this is what loads).
    pub trellis: f64,
    pub matrices: u64,
    /// The first such matrix, by name.
    pub example: String,
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

/// K from a trellis last dimension, if valid.
#[must_use]
pub fn k_of_last_dim(last: u64) -> Option<f64> {
    // Values are ≤ 128, exactly representable.
    #[allow(clippy::cast_precision_loss)]
    TRELLIS_LAST_DIMS.contains(&last).then(|| last as f64 / 16.0)
}

/// Whether `k` is a K some trellis can have.
#[must_use]
pub fn is_valid_k(k: f64) -> bool {
    TRELLIS_LAST_DIMS.iter().any(|&d| k_of_last_dim(d).is_some_and(|v| (v - k).abs() < 1e-9))
}

/// Format K the way users write it: `3`, `2.5`.
#[must_use]
pub fn k_label(k: f64) -> String {
    format!("{k}")
}

/// K-map key aliases per class: our class names, plus the key names of the reference kit's
/// `exl3_k_map.json` (reference-kit.md C.2).
const K_MAP_ALIASES: &[(Class, &[&str])] = &[
    (Class::RoutedExperts, &["routed_experts", "routed"]),
    (Class::SharedExperts, &["shared_experts", "shared"]),
    (Class::Attention, &["attention", "attn", "attn_default"]),
    (Class::Indexer, &["indexer", "indexer_wk_bits"]),
    (Class::EngramWkv, &["engram_wkv", "engram"]),
    (Class::Mtp, &["mtp", "mtp_bits"]),
    (Class::Head, &["head", "head_bits"]),
    (Class::DenseMlp, &["dense_mlp", "mlp"]),
];
/// K-map keys that are settings, not K values.
const K_MAP_SETTINGS: &[&str] = &["num_hidden_layers", "mul1_marker_i32"];

/// The K-map entry for a class and layer: `<class>.<layer>` wins over `<class>`.
/// Keys: `routed` / `routed_experts`, `shared`, `attn` / `attn_default`, `indexer`, `engram`,
/// `mtp`, `head`, `dense_mlp`, each optionally followed by `.<layer>`.
#[must_use]
pub fn k_map_lookup(k_map: &BTreeMap<String, f64>, class: Class, layer: Option<u32>) -> Option<(String, f64)> {
    let aliases = K_MAP_ALIASES.iter().find(|(c, _)| *c == class)?.1;
    if let Some(layer) = layer {
        for alias in aliases {
            let key = format!("{alias}.{layer}");
            if let Some(k) = k_map.get(&key) {
                return Some((key, *k));
            }
        }
    }
    aliases.iter().find_map(|alias| k_map.get(*alias).map(|k| ((*alias).to_string(), *k)))
}

/// Decoder layer count from the K map (`num_hidden_layers`), else DeepSeek V4.1's 40.
#[must_use]
pub fn num_hidden_layers(k_map: &BTreeMap<String, f64>) -> u32 {
    k_map
        .get("num_hidden_layers")
        .filter(|v| v.is_finite() && **v >= 1.0 && **v <= f64::from(u32::MAX) && v.fract() == 0.0)
        // Checked above: a whole number within u32's range.
        .map_or(DEFAULT_NUM_HIDDEN_LAYERS, |v| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = *v as u32;
            n
        })
}

fn k_map_key_findings(k_map: &BTreeMap<String, f64>) -> Vec<Finding> {
    let known = |key: &str| {
        let base = match key.rsplit_once('.') {
            Some((b, l)) if l.parse::<u32>().is_ok() => b,
            _ => key,
        };
        K_MAP_SETTINGS.contains(&key) || K_MAP_ALIASES.iter().any(|(_, a)| a.contains(&base))
    };
    let mut out = Vec::new();
    for (key, k) in k_map {
        if !known(key) {
            out.push(Finding {
                severity: Severity::Warning,
                tensor: None,
                message: format!("k_map key `{key}` names no matrix class (known: routed, shared, attn, indexer, engram, mtp, head, dense_mlp, optionally `.<layer>`)"),
            });
        } else if !K_MAP_SETTINGS.contains(&key.as_str()) && !is_valid_k(*k) {
            out.push(Finding {
                severity: Severity::Warning,
                tensor: None,
                message: format!("k_map key `{key}` = {k} is not a valid EXL3 K (1..8, 1.5, 2.5, 3.5)"),
            });
        }
    }
    out
}

/// The parts of one packed matrix, by leaf name.
#[derive(Default)]
struct Parts<'a> {
    trellis: Option<&'a Tensor>,
    suh: Option<&'a Tensor>,
    svh: Option<&'a Tensor>,
    su: Option<&'a Tensor>,
    sv: Option<&'a Tensor>,
    mul1: Option<&'a Tensor>,
    mcg: Option<&'a Tensor>,
    bias: Option<&'a Tensor>,
    extra: Vec<&'a Tensor>,
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

fn record_disagreement(
    k_map: &BTreeMap<String, f64>,
    role: Role,
    prefix: &str,
    k: f64,
    out: &mut BTreeMap<(Class, Option<u32>, String, u64, u64), KDisagreement>,
) {
    let Some((key, expected)) = k_map_lookup(k_map, role.class, role.layer) else { return };
    if (expected - k).abs() < 1e-9 {
        return;
    }
    let entry =
        out.entry((role.class, role.layer, key.clone(), expected.to_bits(), k.to_bits())).or_insert_with(|| {
            KDisagreement {
                class: role.class,
                layer: role.layer,
                key,
                expected,
                trellis: k,
                matrices: 0,
                example: prefix.to_string(),
            }
        });
    entry.matrices += 1;
}

fn err(findings: &mut Vec<Finding>, tensor: &str, message: String) {
    findings.push(Finding { severity: Severity::Error, tensor: Some(tensor.to_string()), message });
}

/// Check one packed matrix; returns (K, Kp, Np, codebook) when the trellis itself is valid.
fn check_packed(
    prefix: &str,
    parts: &Parts<'_>,
    markers: &mut MarkerReader<'_>,
    markers_checked: bool,
    findings: &mut Vec<Finding>,
) -> Result<Option<(f64, u64, u64, Codebook)>, CheckpointError> {
    let Some(trellis) = parts.trellis else { return Ok(None) };
    let name = &trellis.name;
    if trellis.dtype != Dtype::I16 {
        err(findings, name, format!("`{name}` is {}, expected I16", trellis.dtype));
        return Ok(None);
    }
    let [t0, t1, last] = trellis.shape[..] else {
        err(findings, name, format!("`{name}` has shape {:?}, expected rank 3 [Kp/16, Np/16, 16·K]", trellis.shape));
        return Ok(None);
    };
    let Some(k) = k_of_last_dim(last) else {
        err(
            findings,
            name,
            format!(
                "`{name}` last dim {last} is not 16·K for a valid K (16..128 step 16, or 24/40/56 for K 1.5/2.5/3.5)"
            ),
        );
        return Ok(None);
    };
    if t0 % 8 != 0 || t1 % 8 != 0 || t0 == 0 || t1 == 0 {
        err(
            findings,
            name,
            format!(
                "`{name}` shape {:?}: dims 0 and 1 must be non-zero multiples of 8 (features padded to 128)",
                trellis.shape
            ),
        );
        return Ok(None);
    }
    let (kp, np) = (16 * t0, 16 * t1);

    check_vector(findings, prefix, "suh", parts.suh, parts.su, kp, t0);
    check_vector(findings, prefix, "svh", parts.svh, parts.sv, np, t1);
    if let Some(bias) = parts.bias {
        if bias.dtype != Dtype::F16 || bias.shape != [np] {
            err(
                findings,
                &bias.name,
                format!("`{}` is {} {:?}, expected F16 [{np}]", bias.name, bias.dtype, bias.shape),
            );
        }
    }

    let codebook = match (parts.mul1, parts.mcg) {
        (Some(a), Some(_)) => {
            err(
                findings,
                &a.name,
                format!("`{prefix}` has both `mul1` and `mcg` markers; they are mutually exclusive"),
            );
            Codebook::Mul1
        }
        (Some(m), None) => {
            check_marker(m, MUL1_MARKER, markers, markers_checked, findings)?;
            Codebook::Mul1
        }
        (None, Some(m)) => {
            check_marker(m, MCG_MARKER, markers, markers_checked, findings)?;
            Codebook::Mcg
        }
        (None, None) => Codebook::ThreeInst,
    };
    if last % 16 == 8 && codebook != Codebook::Mul1 {
        err(
            findings,
            name,
            format!(
                "`{name}` has half-integer K = {k}, which needs a `{prefix}.mul1` marker (found {})",
                codebook.name()
            ),
        );
    }
    Ok(Some((k, kp, np, codebook)))
}

/// `suh`/`svh` (F16 `[16·tiles]`) or legacy `su`/`sv` (I16 `[tiles]`).
fn check_vector(
    findings: &mut Vec<Finding>,
    prefix: &str,
    leaf: &str,
    modern: Option<&Tensor>,
    legacy: Option<&Tensor>,
    len: u64,
    tiles: u64,
) {
    match (modern, legacy) {
        (Some(t), _) => {
            if t.dtype != Dtype::F16 || t.shape != [len] {
                err(findings, &t.name, format!("`{}` is {} {:?}, expected F16 [{len}]", t.name, t.dtype, t.shape));
            }
        }
        (None, Some(t)) => {
            if t.dtype != Dtype::I16 || t.shape != [tiles] {
                err(
                    findings,
                    &t.name,
                    format!("legacy `{}` is {} {:?}, expected I16 [{tiles}]", t.name, t.dtype, t.shape),
                );
            }
        }
        (None, None) => {
            let expected = format!("{prefix}.{leaf}");
            err(findings, &expected, format!("packed matrix `{prefix}` has no `{expected}` (F16 [{len}])"));
        }
    }
}

fn check_marker(
    t: &Tensor,
    expected: [u8; 4],
    markers: &mut MarkerReader<'_>,
    markers_checked: bool,
    findings: &mut Vec<Finding>,
) -> Result<(), CheckpointError> {
    if t.dtype != Dtype::I32 || !t.shape.is_empty() {
        err(
            findings,
            &t.name,
            format!("codebook marker `{}` is {} {:?}, expected a 0-d I32 scalar", t.name, t.dtype, t.shape),
        );
        return Ok(());
    }
    if !markers_checked {
        return Ok(());
    }
    match markers.first4(t)? {
        Some(bytes) if bytes == expected => {}
        Some(bytes) => err(
            findings,
            &t.name,
            format!(
                "codebook marker `{}` holds 0x{:08X}, expected 0x{:08X} (packed ABI mismatch)",
                t.name,
                u32::from_le_bytes(bytes),
                u32::from_le_bytes(expected)
            ),
        ),
        None => {
            if matches!(markers.origin(), Origin::Virtual { .. }) {
                err(findings, &t.name, format!("virtual checkpoint recorded no value for marker `{}`", t.name));
            }
        }
    }
    Ok(())
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
