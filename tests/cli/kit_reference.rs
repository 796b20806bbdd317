//! docs/configuration.md is generated from the schema and must not drift.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

#[test]
fn configuration_md_matches_schema() {
    let shape = spark_kit::kit::shape::kit_shape().unwrap();
    let want = spark_kit::kit::reference::markdown(&shape);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    // The environment section after it is generated from src/envvars.rs (tests/rules/envvars.rs).
    if std::env::var_os("SPARK_KIT_TEST_BLESS").is_some() {
        std::fs::write(&path, spark_kit::envvars::splice(&want, &spark_kit::envvars::markdown())).unwrap();
    }
    let have = spark_kit::envvars::without_section(&std::fs::read_to_string(&path).unwrap_or_default());
    assert!(
        have.trim_end() == want.trim_end(),
        "docs/configuration.md is out of date; regenerate: SPARK_KIT_TEST_BLESS=1 cargo test --test cli kit_reference::"
    );
}

#[test]
fn every_key_is_documented_in_the_reference() {
    let shape = spark_kit::kit::shape::kit_shape().unwrap();
    let md = spark_kit::kit::reference::markdown(&shape);
    for key in ["engine.port", "engine.kv_cache_bytes", "nodes[].fabric.ipv4", "memory.guard.policy", "paths.logs"] {
        assert!(md.contains(&format!("| `{key}` |")), "{key} missing");
    }
}
