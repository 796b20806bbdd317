//! docs/bench-result.schema.json is generated from the result types and must not drift.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

#[test]
fn schema_file_matches_the_result_types() {
    let want = spark_kit::bench::result::schema_json();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/bench-result.schema.json");
    if std::env::var_os("SPARK_KIT_TEST_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/bench-result.schema.json is out of date; regenerate: SPARK_KIT_TEST_BLESS=1 cargo test --test bench bench_schema::"
    );
}

#[test]
fn schema_rejects_what_it_should() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/bench-result.schema.json");
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    assert!(!v.is_valid(&serde_json::json!({"format": "spark-kit-bench", "version": 1})), "missing fields");
    assert!(!v.is_valid(&serde_json::json!({})));
}
