//! `verify --structure` speed: the header-only audit over a 39-shard checkpoint of the real
//! DeepSeek V4.1 Flash EXL3 layout (47,892 packed matrices, ~197 GiB apparent size). Shards are
//! sparse files: real headers and real marker bytes, holes elsewhere, so the test needs no disk.
//! Re-run: `cargo test --release --test checkpoint checkpoint_timing:: -- --nocapture`; add
//! `SPARK_KIT_SPARSE_DIR=/tmp/dsv41-sparse` to keep the shards for `spark-kit verify --structure --model`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::common_ckpt;

use std::time::Instant;

use spark_kit::checkpoint::exl3_audit::{audit, AuditOptions};
use spark_kit::checkpoint::virtual_ckpt::{deepseek_v41_flash_builder, reference_k_map, DeepSeekV41Dims};
use spark_kit::checkpoint::Checkpoint;

#[test]
fn header_only_audit_of_39_realistic_shards() {
    let builder = deepseek_v41_flash_builder(&DeepSeekV41Dims::default()).unwrap();
    let markers = builder.markers().clone();
    let layout = builder.build(39).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // SPARK_KIT_SPARSE_DIR=<dir> keeps the shards there, to time `spark-kit verify --structure --model <dir>`.
    let keep = std::env::var_os("SPARK_KIT_SPARSE_DIR").map(std::path::PathBuf::from);
    let out = keep.as_deref().unwrap_or(dir.path());
    std::fs::create_dir_all(out).unwrap();
    let t0 = Instant::now();
    let apparent = common_ckpt::write_sparse(out, &layout, &markers);
    println!("generated 39 sparse shards in {:.2} s", t0.elapsed().as_secs_f64());

    let start = Instant::now();
    let ckpt = Checkpoint::open(out).unwrap();
    let opened = start.elapsed();
    let report = audit(&ckpt, &AuditOptions { k_map: reference_k_map() }).unwrap();
    let total = start.elapsed();

    assert_eq!(ckpt.shards.len(), 39);
    assert_eq!(report.packed_matrices, 47_900);
    assert_eq!(report.errors(), 0, "{:#?}", &report.findings[..report.findings.len().min(3)]);
    assert!(report.markers_checked);
    println!(
        "verify --structure: 39 shards, {} tensors, {:.1} GiB apparent: headers {:.3} s, audit incl. {} marker reads {:.3} s total ({:.1} ms/shard)",
        ckpt.tensors.len(),
        apparent as f64 / (1u64 << 30) as f64,
        opened.as_secs_f64(),
        report.codebooks.values().sum::<u64>(),
        total.as_secs_f64(),
        total.as_secs_f64() * 1000.0 / 39.0
    );
    assert!(total.as_secs_f64() < 39.0, "should be well under a second per shard: {total:?}");
}
