//! K of a trellis and the kit's K map (`model.k_map`): valid K values, the map's keys per matrix
//! class, and the disagreements between the map and what the trellis says (the trellis wins).

use std::collections::BTreeMap;

use serde::Serialize;

use super::finding::{Finding, Severity};
use super::names::{Class, Role};

/// Decoder layers of DeepSeek V4.1 Flash (reference-kit.md C.2 `num_hidden_layers`), the default
/// boundary past which `layers.N` names an MTP block.
pub const DEFAULT_NUM_HIDDEN_LAYERS: u32 = 40;

/// Valid trellis last dimensions: 16·K for K = 1..8, and 24/40/56 for K = 1.5/2.5/3.5.
const TRELLIS_LAST_DIMS: [u64; 11] = [16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128];

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

pub(super) fn k_map_key_findings(k_map: &BTreeMap<String, f64>) -> Vec<Finding> {
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

/// Count `prefix` (K `k`) against the K-map entry of its class and layer, when they differ.
pub(super) fn record_disagreement(
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
