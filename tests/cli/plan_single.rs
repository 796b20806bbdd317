//! `spark-kit plan` beyond the pair's own plan: the 1M answer per KV record, the KV record the
//! kit passes, NCCL's pinned buffers, and `--nodes 1` (the single-Spark answer), all on the
//! Spark kit's virtual checkpoint through the real binary.

use crate::common::spark_kit;

fn plan(args: &[&str]) -> (i32, String, String) {
    let home = tempfile::tempdir().unwrap();
    let out = spark_kit()
        .arg("plan")
        .args(args)
        .env("HOME", home.path())
        .env("SPARK_KIT_CACHE", home.path().join("cache"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_pair_answers_the_1m_question_for_each_kv_record() {
    let (_, out, err) = plan(&["--virtual", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    let lc = v["long_context"].as_array().unwrap();
    let rec = |d: &str| lc.iter().find(|a| a["dtype"] == d).unwrap();
    let fp8 = rec("fp8_ds_mla");
    assert_eq!(fp8["target_tokens"], 1_048_576);
    assert_eq!(fp8["bytes_per_token"], 3510.0);
    // 16,384 blocks of 6 × 37,440 B.
    assert_eq!(fp8["pool_bytes"], 16_384u64 * 224_640);
    assert_eq!(fp8["fits"], false);
    assert!(fp8["short_by"].as_u64().unwrap() > 0);
    let nvfp4 = rec("nvfp4_ds_mla");
    assert_eq!(nvfp4["bytes_per_token"], 1728.0);
    assert!(nvfp4["refused"].as_str().unwrap().contains("SM100"), "{nvfp4}");
    let (_, text, _) = plan(&["--virtual"]);
    assert!(text.contains("1M context (1048576 tokens)") && text.contains("short by"), "{text}");
}

#[test]
fn the_kv_record_is_the_kits_and_nvfp4_is_refused_on_gb10() {
    let (_, out, _) = plan(&["--virtual", "--set", "engine.kv_cache_dtype=nvfp4_ds_mla", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["kv"]["bytes_per_token"], 1728.0);
    let a = v["assumptions"].as_array().unwrap();
    assert!(a.iter().any(|x| x["name"] == "KV record on GB10"), "{a:?}");
    let w = v["warnings"].as_array().unwrap();
    let refused = w.iter().find(|x| x["message"].as_str().unwrap().starts_with("engine.kv_cache_dtype nvfp4_ds_mla"));
    assert!(refused.unwrap()["fix"].as_str().unwrap().contains("--set engine.kv_cache_dtype=fp8_ds_mla"), "{w:?}");
    let (code, _, err) = plan(&["--virtual", "--set", "engine.kv_cache_dtype=fp4"]);
    assert_ne!(code, 0);
    assert!(err.contains("engine.kv_cache_dtype"), "{err}");
}

#[test]
fn nccl_buffers_missing_from_the_kit_cost_runtime_and_the_fix_runs() {
    let (_, base, _) = plan(&["--virtual", "--json"]);
    let (_, wide, _) = plan(&["--virtual", "--set", "engine.extra_env.NCCL_MAX_NCHANNELS=32", "--json"]);
    let b: serde_json::Value = serde_json::from_str(&base).unwrap();
    let w: serde_json::Value = serde_json::from_str(&wide).unwrap();
    let runtime = |v: &serde_json::Value| v["nodes"][0]["runtime_overhead"].as_u64().unwrap();
    assert_eq!(runtime(&w) - runtime(&b), (4813 - 143) << 20);
    let warn = w["warnings"].as_array().unwrap().iter().find(|x| x["message"].as_str().unwrap().contains("NCCL pins"));
    let fix = warn.unwrap()["fix"].as_str().unwrap();
    let set = fix.split_once(": ").unwrap().1;
    // The printed fix, run as printed on top of the wide setting, brings the overhead back.
    let mut args = vec!["--virtual", "--set", "engine.extra_env.NCCL_MAX_NCHANNELS=32"];
    args.extend(set.split(' '));
    args.push("--json");
    let (_, fixed, _) = plan(&args);
    let f: serde_json::Value = serde_json::from_str(&fixed).unwrap();
    assert_eq!(runtime(&f), runtime(&b));
}

#[test]
fn one_spark_table_and_json() {
    let (code, text, err) = plan(&["--nodes", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.starts_with("one Spark (spark-1): memory 121.69 GiB"), "{text}");
    assert!(text.contains("more than one Spark holds before any KV pool"), "{text}");
    assert!(text.contains("first K map that boots and serves 128k: routed ≤1 ("), "{text}");
    let (_, out, _) = plan(&["--nodes", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows[0]["label"], "as is");
    assert!(rows[0]["left_for_kv"].as_i64().unwrap() < 0);
    assert_eq!(rows[0]["kv"].as_array().unwrap().len(), 6);
    let (code, _, err) = plan(&["--nodes", "3"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--nodes 3") && err.contains("--nodes 1"), "{err}");
}
