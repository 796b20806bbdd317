//! The fake Hub as a standalone server for `bench/download.sh` (ignored in normal test runs).
//! Serves every file of `SPARK_KIT_BENCH_DIR/files/` as LFS files of `bench-org/model`, each
//! response capped at `SPARK_KIT_BENCH_RATE` bytes/s; writes the endpoint to
//! `SPARK_KIT_BENCH_DIR/endpoint` and runs until `SPARK_KIT_BENCH_DIR/stop` exists.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::fake_hub;

use std::time::Duration;

use fake_hub::{FakeFile, FakeHub};

#[test]
#[ignore = "run by bench/download.sh"]
fn serve() {
    let Ok(dir) = std::env::var("SPARK_KIT_BENCH_DIR") else {
        eprintln!("skipped: SPARK_KIT_BENCH_DIR is not set (bench/download.sh sets it)");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let rate: u64 = std::env::var("SPARK_KIT_BENCH_RATE").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
    let mut files = vec![FakeFile::bytes("config.json", b"{\"model_type\": \"bench\"}".to_vec(), false)];
    let mut names: Vec<_> = std::fs::read_dir(dir.join("files")).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for p in names {
        let sha = spark_kit::hub::hashing::sha256_file(&std::fs::File::open(&p).unwrap(), |_| {}).unwrap().0;
        let size = std::fs::metadata(&p).unwrap().len();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        files.push(FakeFile::disk(&name, p, size, &sha));
    }
    let hub = FakeHub::start();
    hub.set_page_size(1000);
    hub.set_rate(rate);
    hub.push("bench-org/model", "main", files);
    std::fs::write(dir.join("endpoint.tmp"), &hub.endpoint).unwrap();
    std::fs::rename(dir.join("endpoint.tmp"), dir.join("endpoint")).unwrap();
    while !dir.join("stop").exists() {
        std::thread::sleep(Duration::from_millis(100));
    }
}
