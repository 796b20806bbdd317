//! The human text of the EXL3 structural audit (`verify --structure`, and the first part of
//! `verify --decode`'s report) and of the sampled decode (`verify --decode`).

use std::fmt::Write as _;

use super::decode_check::DecodeReport;
use super::exl3_audit::{AuditReport, Severity};
use crate::kit::bytes::human_size as size;

/// Findings printed in the human report before "… and N more".
const MAX_FINDINGS_SHOWN: usize = 40;

/// The audit of the checkpoint `label` names.
#[must_use]
pub fn audit(r: &AuditReport, label: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{label}: {} shards, {} tensors, {}", r.shards, r.tensors, size(r.total_bytes));
    let codebooks: Vec<String> = r.codebooks.iter().map(|(c, n)| format!("{} {n}", c.name())).collect();
    let _ = writeln!(
        s,
        "packed matrices {}, native tensors {}, codebooks: {}{}",
        r.packed_matrices,
        r.native_tensors,
        if codebooks.is_empty() { "none".to_string() } else { codebooks.join(", ") },
        if r.markers_checked { "" } else { " (marker bytes not checked)" }
    );
    let _ = writeln!(
        s,
        "\n{:<15} {:>7} {:>7} {:>12} {:>6} {:>8}  K",
        "CLASS", "PACKED", "NATIVE", "SIZE", "BPW", "EFF.BPW"
    );
    for c in &r.classes {
        let ks: Vec<String> = c.k_counts.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        let (bpw, eff) = if c.packed_matrices > 0 {
            (format!("{:.3}", c.bpw), format!("{:.3}", c.effective_bpw))
        } else {
            ("-".into(), "-".into())
        };
        let line = format!(
            "{:<15} {:>7} {:>7} {:>12} {:>6} {:>8}  {}",
            c.class.name(),
            c.packed_matrices,
            c.native_tensors,
            size(c.bytes),
            bpw,
            eff,
            ks.join(" ")
        );
        let _ = writeln!(s, "{}", line.trim_end());
    }
    if !r.k_map_disagreements.is_empty() {
        let _ = writeln!(s, "\nK map disagreements (the trellis wins, as at load):");
        for d in &r.k_map_disagreements {
            let layer = d.layer.map(|l| format!(" layer {l}")).unwrap_or_default();
            let _ = writeln!(
                s,
                "  {}{layer}: k_map `{}` = {}, trellis K = {} ({} {}, e.g. `{}`)",
                d.class.name(),
                d.key,
                d.expected,
                d.trellis,
                d.matrices,
                if d.matrices == 1 { "matrix" } else { "matrices" },
                d.example
            );
        }
    }
    if r.findings.is_empty() {
        let _ = writeln!(s, "\nno structural problems");
    } else {
        let _ = writeln!(s);
        for f in r.findings.iter().take(MAX_FINDINGS_SHOWN) {
            let sev = if f.severity == Severity::Error { "error" } else { "warning" };
            let _ = writeln!(s, "{sev}: {}", f.message);
        }
        if r.findings.len() > MAX_FINDINGS_SHOWN {
            let _ = writeln!(s, "… and {} more (see --json)", r.findings.len() - MAX_FINDINGS_SHOWN);
        }
    }
    s
}

/// The sampled decode that took `seconds`.
#[must_use]
pub fn decode(r: &DecodeReport, seconds: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "decode: {} packed matrices, {} block(s) of 128×128 each, {} tiles decoded, {} read in {seconds:.1} s",
        r.matrices,
        r.blocks_per_matrix,
        r.tiles_decoded,
        size(r.bytes_read)
    );
    let _ = writeln!(s, "\n{:<15} {:>8} {:>12} {:>12} {:>12}", "CLASS", "MATRICES", "W RMS MED", "MIN", "MAX");
    for (class, c) in &r.classes {
        let _ = writeln!(
            s,
            "{class:<15} {:>8} {:>12.3e} {:>12.3e} {:>12.3e}",
            c.matrices, c.median_w_rms, c.min_w_rms, c.max_w_rms
        );
    }
    for k in &r.skipped {
        let _ = writeln!(s, "skipped: {}", k.message);
    }
    if r.findings.is_empty() {
        let _ = writeln!(s, "\nno decode problems: every sampled weight is finite and sanely scaled");
    } else {
        let _ = writeln!(s);
        for f in r.findings.iter().take(MAX_FINDINGS_SHOWN) {
            let _ = writeln!(s, "error: {}", f.message);
        }
        if r.findings.len() > MAX_FINDINGS_SHOWN {
            let _ = writeln!(s, "… and {} more (see --json)", r.findings.len() - MAX_FINDINGS_SHOWN);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_clean_decode_says_so_after_its_table() {
        let r = DecodeReport {
            matrices: 2,
            blocks_per_matrix: 1,
            tiles_decoded: 8,
            bytes_read: 2048,
            skipped: vec![],
            findings: vec![],
            classes: BTreeMap::new(),
            samples: vec![],
        };
        let t = decode(&r, 1.5);
        assert!(
            t.starts_with(
                "decode: 2 packed matrices, 1 block(s) of 128×128 each, 8 tiles decoded, 2.0 KiB read in 1.5 s\n"
            ),
            "{t}"
        );
        assert!(t.ends_with("no decode problems: every sampled weight is finite and sanely scaled\n"), "{t}");
    }

    #[test]
    fn the_audit_of_the_modelled_flash_starts_with_its_label() {
        let c = super::super::virtual_ckpt::deepseek_v41_flash_exl3(&Default::default()).unwrap();
        let r = super::super::exl3_audit::audit(&c, &super::super::exl3_audit::AuditOptions { k_map: BTreeMap::new() })
            .unwrap();
        assert!(audit(&r, "virtual").starts_with("virtual: "), "{}", audit(&r, "virtual"));
    }
}
