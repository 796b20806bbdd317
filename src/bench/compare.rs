//! `spark-kit bench compare A.json B.json`: matching metrics side by side with B/A ratios (pure).

use std::fmt::Write as _;

use serde::Serialize;

use super::levels::{levels, Level};
use super::result::BenchResult;
use super::sizes::length_label;

/// One compared metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub metric: String,
    pub unit: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// b / a, when both exist and a ≠ 0.
    pub ratio: Option<f64>,
}

fn row(metric: String, unit: &str, a: Option<f64>, b: Option<f64>) -> Row {
    let ratio = match (a, b) {
        (Some(a), Some(b)) if a != 0.0 => Some(b / a),
        _ => None,
    };
    Row { metric, unit: unit.into(), a, b, ratio }
}

/// `bench compare --json`: the two files and the rows.
#[must_use]
pub fn json(a_name: &str, b_name: &str, rows: &[Row]) -> serde_json::Value {
    serde_json::json!({"a": a_name, "b": b_name, "rows": rows})
}

/// The rows: overhead, then per concurrency level present in either, then per prefill length.
#[must_use]
pub fn rows(a: &BenchResult, b: &BenchResult) -> Vec<Row> {
    let mut out = vec![row(
        "overhead (tiny-prompt TTFT)".into(),
        "ms",
        Some(a.calibration.overhead_s * 1e3),
        Some(b.calibration.overhead_s * 1e3),
    )];
    let (la, lb) = (levels(&a.decode), levels(&b.decode));
    let mut cs: Vec<u32> = la.iter().chain(&lb).map(|l| l.concurrency).collect();
    cs.sort_unstable();
    cs.dedup();
    for c in cs {
        let wa = la.iter().find(|l| l.concurrency == c);
        let wb = lb.iter().find(|l| l.concurrency == c);
        let per = |w: Option<&Level>| w.and_then(|w| w.decode_tok_s.as_ref()).map(|s| s.median);
        let agg = |w: Option<&Level>| w.and_then(|w| w.aggregate_tok_s);
        let ttft = |w: Option<&Level>| w.and_then(|w| w.ttft_s.as_ref()).map(|s| s.median * 1e3);
        out.push(row(format!("decode x{c} per stream"), "tok/s", per(wa), per(wb)));
        out.push(row(format!("decode x{c} aggregate"), "tok/s", agg(wa), agg(wb)));
        out.push(row(format!("decode x{c} TTFT"), "ms", ttft(wa), ttft(wb)));
    }
    let mut lengths: Vec<u64> = a.prefill.iter().chain(&b.prefill).map(|p| p.target_tokens).collect();
    lengths.sort_unstable();
    lengths.dedup();
    for n in lengths {
        let get = |r: &BenchResult| {
            r.prefill.iter().find(|p| p.target_tokens == n).and_then(|p| p.prefill_tok_s.as_ref()).map(|s| s.median)
        };
        out.push(row(format!("prefill {}", length_label(n)), "tok/s", get(a), get(b)));
    }
    out.extend(audit_rows(a, b));
    out
}

/// Audit rows (`bench --audit`) matched by id, in the order of A then B's extra ones.
fn audit_rows(a: &BenchResult, b: &BenchResult) -> Vec<Row> {
    let rows = |r: &BenchResult| r.audit.as_ref().map(|x| x.rows.clone()).unwrap_or_default();
    let (ra, rb) = (rows(a), rows(b));
    let mut ids: Vec<&super::audit::Row> = ra.iter().collect();
    ids.extend(rb.iter().filter(|x| !ra.iter().any(|y| y.id == x.id)));
    ids.iter()
        .map(|x| {
            let ours = |rs: &[super::audit::Row]| rs.iter().find(|y| y.id == x.id).and_then(|y| y.ours);
            row(format!("audit {}", x.id), x.metric.unit(), ours(&ra), ours(&rb))
        })
        .collect()
}

/// The rows as a table; `a_name`/`b_name` head the value columns.
#[must_use]
pub fn render(a_name: &str, b_name: &str, a: &BenchResult, b: &BenchResult, rows: &[Row]) -> String {
    let mut s = String::new();
    let who = |r: &BenchResult| {
        format!(
            "{} on {} ({}, {})",
            r.receipt.model.id,
            r.receipt.endpoint,
            r.receipt
                .server_version
                .as_deref()
                .map_or_else(|| "server version unknown".into(), |v| format!("vLLM {v}")),
            r.receipt.started_at
        )
    };
    let _ = writeln!(s, "A = {a_name}: {}", who(a));
    let _ = writeln!(s, "B = {b_name}: {}", who(b));
    let _ = writeln!(s, "\n{:<30}  {:>6}  {:>12}  {:>12}  {:>7}", "metric", "unit", "A", "B", "B/A");
    let f = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.1}"));
    for r in rows {
        let ratio = r.ratio.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
        let _ = writeln!(s, "{:<34}  {:>15}  {:>12}  {:>12}  {:>7}", r.metric, r.unit, f(r.a), f(r.b), ratio);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_needs_both_and_nonzero_a() {
        assert_eq!(row("x".into(), "u", Some(2.0), Some(3.0)).ratio, Some(1.5));
        assert_eq!(row("x".into(), "u", None, Some(3.0)).ratio, None);
        assert_eq!(row("x".into(), "u", Some(0.0), Some(3.0)).ratio, None);
    }
}
