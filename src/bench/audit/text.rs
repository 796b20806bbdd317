//! The audit's table: one line per published row, our figure beside the published one (pure).

use std::fmt::Write as _;

use super::{Audit, Kind, Metric, Row};
use crate::bench::result::BenchResult;
use crate::bench::spec::SpecCounts;

fn num(v: Option<f64>, metric: Metric) -> String {
    match (v, metric) {
        (None, _) => "-".into(),
        (Some(x), Metric::TtftS) => format!("{x:.3}"),
        (Some(x), _) => format!("{x:.1}"),
    }
}

fn shape(r: &Row) -> String {
    let s = r.shape;
    match r.kind {
        Kind::Decode => format!("{}x {}→{}", s.concurrency, s.prompt_tokens, s.output_tokens),
        Kind::Prefill => format!("{} tokens", s.prompt_tokens),
        Kind::ChatDuringPrefill => format!("chat ∥ {}", s.prompt_tokens),
    }
}

fn accept(c: Option<SpecCounts>) -> String {
    match c.and_then(|c| Some((c.acceptance_length()?, c.acceptance_rate()?))) {
        Some((len, rate)) => format!("{len:.2} ({:.0}%)", rate * 100.0),
        None => "-".into(),
    }
}

fn spread(r: &Row) -> String {
    match (r.min, r.max) {
        (Some(a), Some(b)) if r.metric == Metric::TtftS => format!("{a:.3}–{b:.3}"),
        (Some(a), Some(b)) => format!("{a:.1}–{b:.1}"),
        _ => "-".into(),
    }
}

/// Render an audit result: the header (scale, speculation), then one line per row.
#[must_use]
pub fn render(r: &BenchResult, a: &Audit) -> String {
    let mut s = String::new();
    let rc = &r.receipt;
    let _ = writeln!(
        s,
        "AUDIT  {}\nendpoint {}/v1  model {}  kit {}  server {}  spark-kit {}",
        a.source,
        rc.endpoint,
        rc.model.id,
        rc.kit.as_ref().map_or("none (--url)", |k| k.name.as_str()),
        rc.server_version.as_deref().map_or_else(|| "unknown".to_string(), |v| format!("vLLM {v}")),
        rc.spark_kit_version
    );
    let _ =
        writeln!(s, "scale {}: {}", if a.scale >= 1.0 { "1".into() } else { format!("{:.6}", a.scale) }, a.scale_why);
    let _ = writeln!(
        s,
        "speculation {}; overhead {:.0} ms; ours = median over n samples (decode: plausible streams or waves, prefill: \
         rated requests); spread = min–max; published = the reference kit's own figure, same unit",
        match a.speculation {
            Some(true) => "on (vLLM's spec-decode counters)",
            Some(false) => "off",
            None => "unknown",
        },
        r.calibration.overhead_s * 1e3
    );
    let _ = writeln!(
        s,
        "{:<38}  {:<16}  {:>15}  {:>10}  {:>3}  {:>17}  {:>7}  {:>11}  {:>10}  published as",
        "row", "shape", "unit", "ours", "n", "spread", "ms/step", "accept", "published"
    );
    for row in &a.rows {
        let _ = writeln!(
            s,
            "{:<38}  {:<16}  {:>15}  {:>10}  {:>3}  {:>17}  {:>7}  {:>11}  {:>10}  {}",
            row.label,
            shape(row),
            row.metric.unit(),
            num(row.ours, row.metric),
            row.n,
            spread(row),
            row.ms_per_step.map_or_else(|| "-".into(), |m| format!("{m:.1}")),
            accept(row.spec_decode),
            num(row.published, row.metric),
            row.published_text
        );
        match (&row.skipped, &row.note) {
            (Some(why), _) if row.requests.is_empty() && row.waves.is_empty() => {
                let _ = writeln!(s, "  └ not run: {why}");
            }
            (Some(why), _) => {
                let _ = writeln!(s, "  └ no figure: {why}");
            }
            (None, Some(note)) => {
                let _ = writeln!(s, "  └ {note}");
            }
            (None, None) => {}
        }
    }
    if !r.failures.is_empty() {
        let _ = writeln!(s, "\n{} request(s) failed:", r.failures.len());
        for f in &r.failures {
            let _ = writeln!(s, "  {}: {}", f.phase, f.error);
        }
    }
    s
}
