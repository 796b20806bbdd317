//! Each scripted fault of the fake Hub, one test each: the download still completes with the
//! exact bytes (or fails clearly), and the Hub's counters show how it recovered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_hub;

use std::time::{Duration, Instant};

use fake_hub::harness::MODEL;
use fake_hub::{Fault, FaultKind, Route, Served, Setup};

const SHARD: &str = "model-00001-of-00003.safetensors";
/// The range size the harness asks for (`--range-size 128KiB`).
const RANGE: u64 = 128 << 10;

fn shard_requests(s: &Setup) -> Vec<Served> {
    s.hub.served().into_iter().filter(|r| r.path == SHARD).collect()
}

fn run_with(fault: FaultKind) -> (Setup, serde_json::Value) {
    let s = Setup::new(None);
    s.hub.fault(Fault::cdn(SHARD, fault));
    let j = s.download_ok(&[]);
    assert_eq!(s.hub.pending_faults(), 0, "the fault never fired");
    s.assert_model_complete();
    (s, j)
}

#[test]
fn connection_dropped_mid_body_resumes_from_the_last_byte() {
    let (s, j) = run_with(FaultKind::DropAfter(50_000));
    assert!(j["retries"].as_u64().unwrap() >= 1);
    // The broken request delivered 50,000 bytes of its range; the retry asked for the rest only.
    let reqs = shard_requests(&s);
    let broken = reqs.iter().find(|r| !r.complete && r.bytes == 50_000).expect("the dropped request");
    let (start, end) = broken.range.unwrap();
    let again: Vec<_> = reqs.iter().filter(|r| r.range.is_some_and(|(_, e)| e == end) && r.complete).collect();
    assert!(again.iter().any(|r| r.range == Some((start + 50_000, end))), "{again:#?}");
}

#[test]
fn server_error_is_retried() {
    let s = Setup::new(None);
    s.hub.fault(Fault { times: 2, ..Fault::cdn(SHARD, FaultKind::Status(500)) });
    let j = s.download_ok(&[]);
    s.assert_model_complete();
    assert!(j["retries"].as_u64().unwrap() >= 2);
    assert_eq!(shard_requests(&s).iter().filter(|r| r.status == 500).count(), 2);
}

#[test]
fn persistent_server_error_fails_clearly_and_keeps_finished_ranges() {
    let s = Setup::new(None);
    s.hub.fault(Fault { skip: 3, times: 1000, ..Fault::cdn(SHARD, FaultKind::Status(503)) });
    let out = s.download(&["--retries", "2", "--jobs", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("HTTP 503, after 2 attempts") && e.contains(SHARD), "{e}");
    assert!(e.contains("hint: rerun the same command"), "{e}");
    // The partial and its journal are kept; nothing unverified is in blobs/ under its final name.
    let blobs = s.repo_dir(MODEL).join("blobs");
    let names: Vec<String> =
        std::fs::read_dir(&blobs).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().any(|n| n.ends_with(".spark-partial.json")), "{names:?}");
    let sha = &fake_hub::harness::model_files()[2].sha256;
    assert!(!names.contains(sha), "unverified shard promoted");
}

#[test]
fn rate_limited_429_waits_for_retry_after() {
    let t = Instant::now();
    let (s, j) = run_with(FaultKind::TooMany { retry_after: 2 });
    assert!(t.elapsed() >= Duration::from_secs(2), "did not wait for Retry-After");
    assert!(j["retries"].as_u64().unwrap() >= 1);
    assert_eq!(shard_requests(&s).iter().filter(|r| r.status == 429).count(), 1);
}

#[test]
fn wrong_content_range_is_discarded() {
    let (s, j) = run_with(FaultKind::WrongContentRange);
    assert!(j["retries"].as_u64().unwrap() >= 1);
    assert_eq!(j["refetched_files"], 0, "the bad body must not be written");
    assert!(shard_requests(&s).iter().all(|r| r.status == 206));
}

#[test]
fn ignored_range_is_never_appended() {
    let (s, j) = run_with(FaultKind::IgnoreRange);
    assert!(j["retries"].as_u64().unwrap() >= 1);
    assert_eq!(j["refetched_files"], 0);
    assert_eq!(shard_requests(&s).iter().filter(|r| r.status == 200).count(), 1);
}

#[test]
fn corrupted_byte_is_caught_by_the_hash_and_refetched() {
    let (s, j) = run_with(FaultKind::CorruptByte);
    assert_eq!(j["refetched_files"], 1);
    // Every range of the shard was fetched twice: once corrupt, once clean.
    let ranges = shard_requests(&s).into_iter().filter(|r| r.complete).count() as u64;
    assert_eq!(ranges, 2 * (1u64 << 20).div_ceil(RANGE));
}

#[test]
fn trickle_then_stall_hits_the_idle_timeout() {
    let t = Instant::now();
    let (s, j) = run_with(FaultKind::TrickleStall { bytes: 4096 });
    assert!(t.elapsed() < Duration::from_secs(20), "stalled for {:?}", t.elapsed());
    assert!(j["retries"].as_u64().unwrap() >= 1);
    // The retry continued after the trickled bytes.
    let reqs = shard_requests(&s);
    let stalled = reqs.iter().find(|r| !r.complete && r.bytes == 4096).expect("the stalled request");
    let (start, end) = stalled.range.unwrap();
    assert!(reqs.iter().any(|r| r.range == Some((start + 4096, end)) && r.complete), "{reqs:#?}");
}

#[test]
fn expired_signed_link_is_resolved_again() {
    let (s, j) = run_with(FaultKind::Expire);
    assert_eq!(j["reresolves"], 1);
    assert_eq!(s.hub.resolves(SHARD), 2, "one resolve plus one for the expiry");
    assert_eq!(s.hub.resolves("model-00002-of-00003.safetensors"), 1);
}

#[test]
fn signed_links_really_expire() {
    // A 1 s link lifetime and a slow CDN: later ranges meet real expiry and re-resolve.
    let s = Setup::new(None);
    s.hub.set_ttl(1);
    s.hub.set_rate(256 << 10);
    let j = s.download_ok(&["--jobs", "2"]);
    s.assert_model_complete();
    assert!(j["reresolves"].as_u64().unwrap() >= 1, "{j}");
    assert!(s.hub.served().iter().any(|r| r.status == 403));
}

#[test]
fn resolve_errors_and_quota_are_retried() {
    let s = Setup::new(None);
    s.hub.fault(Fault { route: Route::Resolve, ..Fault::cdn(SHARD, FaultKind::Status(503)) });
    let other = "model-00002-of-00003.safetensors";
    s.hub.fault(Fault { route: Route::Resolve, ..Fault::cdn(other, FaultKind::QuotaExhausted { reset: 2 }) });
    let t = Instant::now();
    s.download_ok(&[]);
    assert!(t.elapsed() >= Duration::from_secs(2), "did not wait for the RateLimit reset");
    assert_eq!(s.hub.pending_faults(), 0);
    s.assert_model_complete();
    assert_eq!((s.hub.resolves(SHARD), s.hub.resolves(other)), (2, 2));
}
