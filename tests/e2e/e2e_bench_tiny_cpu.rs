//! End to end: `spark-kit bench` against a real `spark-kit up --kit tiny-cpu` endpoint (vLLM on
//! the CPU). The JSON validates against docs/bench-result.schema.json and the PNG plot opens.
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
    let server = up_tiny_cpu(&[], dir.path(), port, Duration::from_secs(600));
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
    let pre = &r["prefill"][0];
    assert_eq!(pre["target_tokens"], 128);
    assert!(pre["requests"][0]["prompt_tokens"].as_u64().unwrap().abs_diff(128) <= 2);

    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((w, h), (1200, 500));
    server.interrupt();
}
