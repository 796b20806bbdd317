//! Runner for bench/engram.sh (ignored: it needs a large file on a real disk). Random-row
//! lookups on a packed shard through the Rust row store, `O_DIRECT`, cache off; one JSON line
//! per batch size on stdout.
//!
//!   SPARK_KIT_ENGRAM_BENCH_FILE=… SPARK_KIT_ENGRAM_BENCH_BATCHES=1,64,1024 \
//!   SPARK_KIT_ENGRAM_BENCH_THREADS=16 SPARK_KIT_ENGRAM_BENCH_SECONDS=10 \
//!   cargo test --release --test checkpoint engram_bench:: -- --ignored --exact lookup --nocapture
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use spark_kit::engram::store::{IoReporter, RowStore, StoreOptions};
use spark_kit::engram::table::packed_header;
use spark_kit::engram::ROW_BYTES;

struct Loud;
impl IoReporter for Loud {
    fn buffered_fallback(&self, path: &std::path::Path, reason: &str) {
        panic!("{}: {reason}: the benchmark needs O_DIRECT (put the file on a real disk)", path.display());
    }
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[test]
#[ignore = "benchmark runner for bench/engram.sh"]
fn lookup() {
    let file = std::path::PathBuf::from(env("SPARK_KIT_ENGRAM_BENCH_FILE", ""));
    let threads: usize = env("SPARK_KIT_ENGRAM_BENCH_THREADS", "16").parse().unwrap();
    let seconds: f64 = env("SPARK_KIT_ENGRAM_BENCH_SECONDS", "10").parse().unwrap();
    let batches: Vec<usize> =
        env("SPARK_KIT_ENGRAM_BENCH_BATCHES", "1,64,1024").split(',').map(|b| b.trim().parse().unwrap()).collect();
    // SPARK_KIT_ENGRAM_BENCH_DIRECT=0: page-cache reads of a cached file, i.e. the store's own
    // CPU cost per row with the disk out of the way.
    let direct = env("SPARK_KIT_ENGRAM_BENCH_DIRECT", "1") != "0";
    let header = packed_header(&file, None).unwrap();
    let opts = StoreOptions { direct, threads, cache_bytes: 0, cache_ways: 8, resident_scales: false };
    let store = RowStore::open_packed(&file, &header, opts, &Loud).unwrap();
    assert_eq!(store.is_direct(), direct);
    let span = header.hi - header.lo;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for &batch in &batches {
        let mut ids = vec![0i64; batch];
        let mut out = vec![0u8; batch * ROW_BYTES];
        let (mut rows, started) = (0u64, Instant::now());
        while started.elapsed() < Duration::from_secs_f64(seconds) {
            for id in &mut ids {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *id = (header.lo + x % span) as i64;
            }
            store.lookup(&ids, &mut out).unwrap();
            rows += batch as u64;
        }
        let secs = started.elapsed().as_secs_f64();
        let rate = rows as f64 / secs;
        println!(
            "{}",
            serde_json::json!({"side": "spark-kit", "direct": direct, "batch": batch, "threads": threads, "rows": rows,
                "seconds": secs, "rows_per_s": rate, "gb_per_s": rate * ROW_BYTES as f64 / 1e9})
        );
    }
}
