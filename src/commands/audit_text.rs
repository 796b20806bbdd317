//! The human text of the EXL3 structural audit (`verify --structure`, and the first part of
//! `verify --decode`'s report).

use std::fmt::Write as _;

use crate::checkpoint::exl3_audit::{AuditReport, Severity};
use crate::kit::bytes::human_size as size;

/// Findings printed in the human report before "… and N more".
const MAX_FINDINGS_SHOWN: usize = 40;

pub(super) fn human(r: &AuditReport, label: &str) -> String {
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
