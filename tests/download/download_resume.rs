//! Resume across processes: `kill -9` mid-download then a rerun that re-fetches no finished
//! range; a branch that moved between runs discards the stale partial.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_hub;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fake_hub::harness::{model_files, MODEL};
use fake_hub::{FakeFile, Fault, FaultKind, Setup};

fn journals(s: &Setup) -> HashMap<String, Vec<(u64, u64)>> {
    s.journals(MODEL)
}

#[test]
fn kill_9_then_rerun_fetches_no_finished_range_twice() {
    let s = Setup::new(None);
    s.hub.set_rate(256 << 10);
    let mut child = s
        .cmd(&["download", "--quiet", "--range-size", "128KiB", "--jobs", "4"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let done_at_kill = loop {
        let j = journals(&s);
        if j.values().map(|d| d.iter().map(|(a, b)| b - a).sum::<u64>()).sum::<u64>() >= 2 * (128 << 10) {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            break journals(&s);
        }
        assert!(Instant::now() < deadline, "no range finished in 30 s");
        assert!(child.try_wait().unwrap().is_none(), "download finished before it could be killed");
        std::thread::sleep(Duration::from_millis(10));
    };
    let served_before = s.hub.served().len();
    let journaled: u64 = done_at_kill.values().flatten().map(|(a, b)| b - a).sum();
    assert!(journaled > 0);

    s.hub.set_rate(0);
    let j = s.download_ok(&[]);
    s.assert_model_complete();
    assert!(j["resumed_bytes"].as_u64().unwrap() >= journaled, "{j}");
    assert!(j["fetched_bytes"].as_u64().unwrap() < j["bytes"].as_u64().unwrap());
    // No range the journal recorded as finished was requested again.
    let again: Vec<_> = s.hub.served()[served_before..]
        .iter()
        .filter(|r| {
            let Some((a, b)) = r.range else { return false };
            done_at_kill.get(&r.path).is_some_and(|d| d.iter().any(|&(s, e)| a < e && b + 1 > s))
        })
        .cloned()
        .collect();
    assert!(again.is_empty(), "finished ranges served twice: {again:#?}");
    assert!(s.cmd(&["verify"]).output().unwrap().status.success());
}

#[test]
fn moved_branch_discards_the_stale_partial_and_a_pinned_commit_keeps_old_bytes() {
    const SHARD: &str = "model-00001-of-00003.safetensors";
    let s = Setup::new(None);
    let old = s.commit.clone();
    s.hub.fault(Fault { skip: 2, times: 1000, ..Fault::cdn(SHARD, FaultKind::Status(503)) });
    let out = s.download(&["--retries", "1", "--jobs", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(journals(&s).get(SHARD).is_some_and(|d| !d.is_empty()), "{:?}", journals(&s));

    // main moves: shard 1 gets new content.
    s.hub.clear_faults();
    let mut files = model_files();
    files[2] = FakeFile::bytes(SHARD, fake_hub::harness::seeded("new", 1 << 20), true);
    let new_sha = files[2].sha256.clone();
    let new = s.hub.push(MODEL, "main", files);
    let j = s.download_ok(&[]);
    assert_eq!(j["discarded_partials"], 1, "{j}");
    assert_eq!(j["repos"][0]["commit"], new.as_str());
    let repo = s.repo_dir(MODEL);
    assert_eq!(std::fs::read(repo.join("refs/main")).unwrap(), new.as_bytes());
    assert_eq!(s.cached(MODEL, &new, SHARD), fake_hub::harness::seeded("new", 1 << 20));
    let blobs: Vec<String> = std::fs::read_dir(repo.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!blobs.iter().any(|b| b.contains("spark-partial")), "{blobs:?}");
    assert!(blobs.contains(&new_sha));

    // Pinning the old commit still yields the old bytes.
    let out = s.cmd(&["download", "--quiet", "--set", &format!("model.revision={old}")]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(s.cached(MODEL, &old, SHARD), model_files()[2].content_bytes());
}

#[test]
fn kill_9_mid_range_keeps_the_journaled_part_of_the_range() {
    const BIG: &str = "model-00001-of-00001.safetensors";
    let files = vec![FakeFile::bytes("config.json", b"{}".to_vec(), false), FakeFile::random(BIG, 8 << 20)];
    let s = Setup::with_files(files, None);
    // One 8 MiB range at 2 MiB/s: progress inside the range is journaled every 4 MiB.
    s.hub.set_rate(2 << 20);
    let mut child = s
        .cmd(&["download", "--quiet", "--range-size", "8MiB", "--jobs", "1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let journaled = loop {
        let covered: u64 = journals(&s).get(BIG).map_or(0, |d| d.iter().map(|(a, b)| b - a).sum());
        if covered > 0 {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            break journals(&s)[BIG].clone();
        }
        assert!(Instant::now() < deadline, "nothing journaled inside the range in 30 s");
        assert!(child.try_wait().unwrap().is_none(), "download finished before it could be killed");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        s.hub.served().iter().filter(|r| r.path == BIG).all(|r| !r.complete),
        "the range had finished: this is not progress inside a range"
    );
    assert_eq!(journaled.len(), 1);
    let (start, end) = journaled[0];
    assert_eq!(start, 0);
    assert!(end >= 4 << 20, "journaled {end} bytes");
    let served_before = s.hub.served().len();
    s.hub.set_rate(0);
    let j = s.download_ok(&["--range-size", "8MiB"]);
    assert!(j["resumed_bytes"].as_u64().unwrap() >= end, "{j}");
    let again: Vec<_> = s.hub.served()[served_before..].iter().filter(|r| r.path == BIG).cloned().collect();
    assert_eq!(again.len(), 1, "{again:#?}");
    assert_eq!(again[0].range, Some((end, (8 << 20) - 1)), "{again:#?}");
    assert_eq!(s.cached(MODEL, &s.commit, BIG), fake_hub::harness::seeded(BIG, 8 << 20));
}
