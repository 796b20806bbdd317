//! What is in flight (docs/download.md, "Resume, retries, timeouts"): at most four files have
//! ranges in flight, and every one of `--jobs` connections is busy while there is work.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_hub;

use fake_hub::{FakeFile, Setup};

#[test]
fn four_files_and_all_jobs_in_flight() {
    let mut files = vec![FakeFile::bytes("config.json", b"{}".to_vec(), false)];
    for i in 1..=10 {
        files.push(FakeFile::random(&format!("model-{i:05}-of-00010.safetensors"), 1 << 20));
    }
    for jobs in [8usize, 16] {
        let s = Setup::with_files(files.clone(), None);
        // 64 KiB ranges at 1 MiB/s per response: every file has 16 ranges, each lasting ~60 ms.
        s.hub.set_rate(1 << 20);
        let j = s.download_ok(&["--range-size", "64KiB", "--jobs", &jobs.to_string()]);
        assert_eq!(j["downloaded_files"], 11);
        let (files_peak, conns_peak) = (s.hub.peak_files(), s.hub.peak_connections());
        assert!(files_peak <= 4, "--jobs {jobs}: {files_peak} files in flight");
        assert_eq!(conns_peak, jobs, "--jobs {jobs}: at most {conns_peak} ranges in flight");
    }
}
