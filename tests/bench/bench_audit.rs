//! `bench --audit reference` on a recorded run (tests/bench/fixtures/audit-…json: spark-kit bench
//! --audit reference against vLLM 0.32.0 on the CPU serving the tiny Llama with ngram
//! speculation): the result validates against the schema, rows that could not run are empty and
//! say why, the table puts ours beside the published figure, `bench compare` matches the rows,
//! and the plot's ladder has a log axis. The live run is tests/e2e/e2e_bench_tiny_cpu.rs.

use std::path::Path;

use spark_kit::bench::audit::{Kind, Metric};
use spark_kit::bench::result::{parse, BenchResult};
use spark_kit::bench::{compare, plot, table};

use crate::bench_fake::schema_errors;

fn recorded() -> (serde_json::Value, BenchResult) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bench/fixtures/audit-tiny-llama-vllm-0.32.0-ngram.json");
    let text = std::fs::read_to_string(path).unwrap();
    (serde_json::from_str(&text).unwrap(), parse(&text).unwrap())
}

#[test]
fn the_recorded_audit_validates_and_leaves_rows_that_cannot_run_empty() {
    let (json, r) = recorded();
    let errors = schema_errors(&json);
    assert!(errors.is_empty(), "schema: {errors:?}");
    let a = r.audit.as_ref().unwrap();
    assert_eq!((a.table.as_str(), a.speculation), ("reference", Some(true)));
    assert!(a.scale < 0.001 && a.scale_why.contains("max_model_len 512"), "{}", a.scale_why);
    assert_eq!(a.rows.len(), 20);
    for row in &a.rows {
        if row.skipped.is_some() {
            assert_eq!((row.ours, row.n, row.min, row.max, row.ms_per_step), (None, 0, None, None, None), "{}", row.id);
        }
        if row.id.contains("spec-off") {
            assert!(row.skipped.as_deref().unwrap().contains("speculates"), "{}", row.id);
            assert!(row.waves.is_empty() && row.requests.is_empty(), "{}: never filled", row.id);
        }
        // Every figure keeps its raw samples.
        if row.ours.is_some() {
            assert!(!row.waves.is_empty() || !row.requests.is_empty(), "{}", row.id);
        }
    }
    // The speculating decode rows carry the counters, acceptance and ms/step.
    let x2 = a.rows.iter().find(|x| x.id == "decode-x2-spec-on").unwrap();
    assert_eq!((x2.kind, x2.metric, x2.shape.concurrency), (Kind::Decode, Metric::Aggregate, 2));
    let spec = x2.spec_decode.unwrap();
    assert!(spec.drafts > 0 && spec.accepted_tokens > 0, "{spec:?}");
    assert!(x2.ms_per_step.unwrap() > 0.0);
    assert!(x2.waves.iter().all(|w| w.spec_decode.is_some()));
}

#[test]
fn the_table_puts_ours_beside_the_published_figure_and_says_why_a_row_is_empty() {
    let (_, r) = recorded();
    let t = table::render(&r);
    assert!(t.starts_with("AUDIT  reference kit"), "{t}");
    assert!(t.contains("scale 0.000799: max_model_len 512 < 131072"), "{t}");
    let line = |label: &str| t.lines().find(|l| l.starts_with(label)).unwrap().to_string();
    let x1 = line("decode x1, speculation on ");
    assert!(x1.contains("tok/s/stream") && x1.contains("31.6 (TTFT 221 ms)") && x1.contains("(100%)"), "{x1}");
    let off = t.lines().skip_while(|l| !l.starts_with("decode x1, speculation off")).nth(1).unwrap();
    assert!(off.contains("not run: the engine in use speculates: restart it with --set engine.speculative.method=none"));
    let p601 = line("prefill 601k ");
    assert!(p601.contains("480 tokens") && p601.contains("810 (742 s)"), "{p601}");
}

#[test]
fn compare_matches_audit_rows_by_id() {
    let (_, a) = recorded();
    let mut b = a.clone();
    let rows = b.audit.as_mut().unwrap();
    rows.rows.retain(|x| x.id != "prefill-601k");
    let out = compare::rows(&a, &b);
    let x4 = out.iter().find(|x| x.metric == "audit decode-x4-spec-on").unwrap();
    assert_eq!((x4.unit.as_str(), x4.ratio), ("tok/s aggregate", Some(1.0)));
    let p = out.iter().find(|x| x.metric == "audit prefill-601k").unwrap();
    assert!(p.a.is_some() && p.b.is_none() && p.ratio.is_none(), "{p:?}");
    let off = out.iter().find(|x| x.metric == "audit decode-x1-spec-off").unwrap();
    assert_eq!((off.a, off.b), (None, None));
}

#[test]
fn the_plot_draws_the_ladder_on_a_log_axis() {
    let (_, r) = recorded();
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("audit.svg");
    plot::draw(&r, &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    // The published ladder (grey points, right panel): 8k, 16k, 32k, 64k are equally spaced.
    let mut xs: Vec<f64> = doc
        .descendants()
        .filter(|n| n.has_tag_name("circle") && n.attribute("fill") == Some("#787878"))
        .map(|n| n.attribute("cx").unwrap().parse::<f64>().unwrap())
        .filter(|x| *x > 600.0)
        .collect();
    xs.sort_by(f64::total_cmp);
    assert_eq!(xs.len(), 10, "{xs:?}");
    let gaps: Vec<f64> = xs[..4].windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|g| (g - gaps[0]).abs() <= 2.0 && *g > 10.0), "not a log axis: {gaps:?}");
    assert!(text.contains("Decode rows") && text.contains("Prefill ladder"), "panels");
}
