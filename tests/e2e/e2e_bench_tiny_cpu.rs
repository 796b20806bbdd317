//! End to end: `spark-kit bench` against a real `spark-kit up --kit tiny-cpu` endpoint (vLLM on
//! the CPU) that speculates (ngram prompt lookup): the JSON validates against
//! docs/bench-result.schema.json, the waves carry vLLM's spec-decode counters (acceptance and
//! ms/step in the table), the PNG plot opens; then `bench --audit reference` replays the
//! reference kit's table scaled to the kit, rows that cannot run (speculation off) left empty.
//!
//! Gated on SPARK_KIT_TEST_E2E=1 (`tests/run-all.sh` sets it after building the engine venv);
//! without it the test prints why and skips. The load is tiny: a few short requests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::time::{Duration, Instant};

use common::up::{e2e_enabled, up_tiny_cpu};
use common::{free_port, spark_kit};
use serde_json::Value;

#[test]
fn bench_measures_the_tiny_cpu_endpoint() {
    if !e2e_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let spec = ["--set", "engine.speculative.method=ngram", "--set", "engine.speculative.tokens=3"];
    let server = up_tiny_cpu(&spec, dir.path(), port, Duration::from_secs(600));
    let json = dir.path().join("bench.json");
    let png = dir.path().join("bench.png");
    let t = Instant::now();
    let o = spark_kit()
        .args(["bench", "--kit", "tiny-cpu", "--port", &port.to_string()])
        .args(["--concurrency", "1,2", "--decode-tokens", "16", "--decode-prompt-tokens", "64"])
        .args(["--prefill", "128", "--prefill-repeats", "1"])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&png)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    eprintln!("bench took {:.1} s\n{stderr}{}", t.elapsed().as_secs_f64(), String::from_utf8_lossy(&o.stdout));
    assert!(o.status.success(), "bench failed: {stderr}");

    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let schema_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/bench-result.schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(schema_path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&r).map(|e| format!("{}: {e}", e.instance_path())).collect();
    assert!(errors.is_empty(), "schema: {errors:?}");

    let rc = &r["receipt"];
    assert_eq!(rc["model"]["id"], "tiny-llama");
    assert_eq!(rc["kit"]["name"], "tiny-cpu");
    assert!(rc["server_version"].as_str().is_some_and(|v| !v.is_empty()), "vLLM /version: {rc}");
    assert_eq!(r["settings"]["vendor_params"], true, "vLLM accepts ignore_eos/min_tokens");
    assert_eq!(r["settings"]["tokenize"], true, "vLLM has /tokenize");
    assert_eq!(r["failures"], serde_json::json!([]));
    for w in r["decode"].as_array().unwrap() {
        assert!(w["aggregate_tok_s"].as_f64().unwrap() > 0.0);
        for q in w["requests"].as_array().unwrap() {
            assert_eq!(q["completion_tokens"], 16, "fixed decode length: {q}");
            let p = q["prompt_tokens"].as_u64().unwrap();
            assert!(p.abs_diff(64) <= 2, "prompt fitted with /tokenize: {p}");
            assert!(q["decode_tok_s"].as_f64().unwrap() > 0.0);
        }
    }
    // Speculation measured, not assumed: vLLM's counters over every wave, acceptance in the table.
    assert_eq!(r["settings"]["spec_decode_counters"], true, "{}", r["settings"]);
    for w in r["decode"].as_array().unwrap() {
        let s = &w["spec_decode"];
        assert!(s["drafts"].as_u64().is_some() && s["accepted_tokens"].as_u64().is_some(), "{w}");
    }
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("speculation on (vLLM's spec-decode counters"), "{stdout}");
    let pre = &r["prefill"][0];
    assert_eq!(pre["target_tokens"], 128);
    assert!(pre["requests"][0]["prompt_tokens"].as_u64().unwrap().abs_diff(128) <= 2);

    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((w, h), (1200, 500));

    audit(port, dir.path(), &validator);
    server.interrupt();
}

/// `bench --audit reference` on the same endpoint: every row answered (a figure or why not).
fn audit(port: u16, dir: &std::path::Path, validator: &jsonschema::Validator) {
    let json = dir.join("audit.json");
    let svg = dir.join("audit.svg");
    let t = Instant::now();
    let o = spark_kit()
        .args(["bench", "--kit", "tiny-cpu", "--port", &port.to_string(), "--audit", "reference"])
        .args(["--prefill-repeats", "1", "--quiet", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    eprintln!("audit took {:.1} s\n{stderr}{stdout}", t.elapsed().as_secs_f64());
    assert!(o.status.success(), "audit failed: {stderr}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let errors: Vec<String> = validator.iter_errors(&r).map(|e| format!("{}: {e}", e.instance_path())).collect();
    assert!(errors.is_empty(), "schema: {errors:?}");
    assert_eq!(r["receipt"]["kit"]["name"], "tiny-cpu");
    assert!(r["receipt"]["lock"]["path"].as_str().is_some_and(|p| p.ends_with("spark-kit.lock")), "{}", r["receipt"]);
    let a = &r["audit"];
    assert_eq!((a["table"].as_str(), a["speculation"].as_bool()), (Some("reference"), Some(true)));
    let rows = a["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 20);
    for row in rows {
        let (ours, skipped) = (&row["ours"], &row["skipped"]);
        assert!(ours.is_number() != skipped.is_string(), "a figure or a reason, never both or neither: {row}");
        let id = row["id"].as_str().unwrap();
        if id.contains("spec-off") {
            assert!(skipped.as_str().unwrap().contains("speculates") && row["waves"] == serde_json::json!([]), "{row}");
        }
    }
    for id in ["decode-x1-spec-on", "decode-x2-spec-on", "decode-x4-spec-on"] {
        let row = rows.iter().find(|x| x["id"] == id).unwrap();
        assert!(row["ours"].as_f64().unwrap() > 0.0 && row["ms_per_step"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["spec_decode"]["drafts"].as_u64().is_some(), "{row}");
    }
    assert!(stdout.starts_with("AUDIT  reference kit"), "{stdout}");
    assert!(stdout.contains("not run: the engine in use speculates"), "{stdout}");
    let doc = std::fs::read_to_string(&svg).unwrap();
    assert!(roxmltree::Document::parse(&doc).is_ok() && doc.contains("Prefill ladder"));
}
