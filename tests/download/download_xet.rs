//! The native Xet path of `spark-kit download` against the test Hub's Xet side (xet-core's local
//! CAS, files put in by hf-xet's upload path, behind the token-checking proxy): the fallback when
//! the bridge refuses a file, `model.transport`, and the faults of the Xet path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_hub;

use fake_hub::harness::{model_files, MODEL};
use fake_hub::{Fault, FaultKind, Route, Setup};

const SHARD: &str = "model-00001-of-00003.safetensors";

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn lfs_files() -> u64 {
    model_files().iter().filter(|f| f.lfs).count() as u64
}

#[test]
fn a_bridge_refusal_falls_back_to_xet_once_per_file() {
    let s = Setup::xet();
    s.hub.bridge_refuses(SHARD);
    let out = s.download(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    s.assert_model_complete();
    assert_eq!(j["xet_files"], 1, "{j}");
    let note = format!("{SHARD}: the bridge refused it (HTTP 400 from ");
    assert_eq!(stderr(&out).matches(&note).count(), 1, "{}", stderr(&out));
    assert!(s.hub.cas_calls().iter().any(|(k, _)| k == "fetch_term"));
    // The other files came through the bridge; the token went to the Hub only.
    assert!(s.hub.served().iter().any(|r| r.path != SHARD && r.status == 206));
    assert!(s.hub.xet_token_calls() >= 1);
    assert!(s.cmd(&["verify"]).output().unwrap().status.success());
}

#[test]
fn transport_xet_fetches_every_xet_file_natively() {
    let s = Setup::xet();
    s.set_transport("xet");
    let j = s.download_ok(&[]);
    s.assert_model_complete();
    assert_eq!(j["xet_files"], lfs_files(), "{j}");
    assert!(s.hub.served().is_empty(), "the bridge was used: {:?}", s.hub.served());
    // Reconstructions are asked for the requested ranges only (128 KiB here).
    assert!(s.hub.cas_calls().iter().any(|(k, r)| k == "reconstructions" && r.is_some()), "{:?}", s.hub.cas_calls());
}

#[test]
fn transport_bridge_fails_on_a_refusal() {
    let s = Setup::xet();
    s.set_transport("bridge");
    s.hub.bridge_refuses(SHARD);
    let out = s.download(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("400"), "{}", stderr(&out));
    assert!(s.hub.cas_calls().is_empty());
}

/// A Xet-only download of the model with one scripted CAS fault; returns the summary.
fn xet_with(kind: &str, fault: FaultKind, skip: u32, times: u32) -> (Setup, serde_json::Value) {
    let s = Setup::xet();
    s.set_transport("xet");
    s.hub.cas_fault(kind, fault, skip, times);
    let j = s.download_ok(&[]);
    s.assert_model_complete();
    assert_eq!(s.hub.pending_faults(), 0, "the fault never fired");
    (s, j)
}

#[test]
fn xorb_5xx_is_retried() {
    // Three 503s from the xorb store: asked again (by hf-xet or by the range worker, whichever
    // sees it first), never fatal; the file is whole and verified.
    let (s, _) = xet_with("fetch_term", FaultKind::Status(503), 1, 3);
    let terms = s.hub.cas_calls().iter().filter(|(k, _)| k == "fetch_term").count();
    assert!(terms > 3 + lfs_files() as usize, "{terms} xorb fetches");
}

#[test]
fn reconstruction_5xx_is_retried() {
    // Four 500s in a row from the reconstruction API: asked again (by hf-xet's reconstructor or
    // by the range worker, whichever sees it), never fatal; the file is whole and verified.
    let (s, _) = xet_with("reconstructions", FaultKind::Status(500), 0, 4);
    assert!(s.hub.cas_calls().iter().filter(|(k, _)| k == "reconstructions").count() > 4);
}

#[test]
fn a_dropped_xorb_connection_is_recovered() {
    // hf-xet re-requests a xorb range whose connection broke (a fresh reconstruction for its
    // term) before our range worker sees an error; either way the file is whole and verified.
    let (s, _) = xet_with("fetch_term", FaultKind::DropAfter(10_000), 0, 1);
    let terms = s.hub.cas_calls().iter().filter(|(k, _)| k == "fetch_term").count();
    assert!(terms > lfs_files() as usize, "{terms} xorb fetches");
}

#[test]
fn a_stalled_xorb_fetch_is_abandoned_after_the_idle_timeout() {
    let t = std::time::Instant::now();
    let (_, j) = xet_with("fetch_term", FaultKind::TrickleStall { bytes: 1000 }, 0, 1);
    assert!(j["retries"].as_u64().unwrap() >= 1, "{j}");
    assert!(t.elapsed() < std::time::Duration::from_secs(25), "waited for the stall to end");
}

#[test]
fn a_corrupted_xorb_byte_is_never_accepted() {
    let clean = xet_with("fetch_term", FaultKind::Status(200), 0, 0).0.hub.cas_calls().len();
    let (s, j) = xet_with("fetch_term", FaultKind::CorruptByte, 0, 1);
    // The bad xorb range was asked for again — by hf-xet (its chunk failed to decode or verify),
    // by the range worker (a retry), or for the whole file after the SHA-256 named it (a refetch);
    // the cache holds the Hub's bytes (checked in `xet_with`).
    let caught = j["retries"].as_u64().unwrap() + j["refetched_files"].as_u64().unwrap();
    assert!(caught >= 1 || s.hub.cas_calls().len() > clean, "{j}");
}

#[test]
fn a_revoked_token_is_fetched_again() {
    let (s, j) = xet_with("reconstructions", FaultKind::Status(401), 1, 1);
    assert!(s.hub.xet_token_calls() >= 2, "token calls: {}", s.hub.xet_token_calls());
    assert!(j["retries"].as_u64().unwrap() >= 1, "{j}");
}

#[test]
fn another_client_error_is_not_taken_for_a_refused_token() {
    // hf-xet files a CAS 401 and any other 4xx (here a 400) alike as `Network`, the status only
    // in its text: the CAS, asked once with the same token (a one-byte reconstruction), says it
    // is fine, so no new token is fetched; the range is simply retried.
    let (s, j) = xet_with("reconstructions", FaultKind::Status(400), 0, 1);
    let calls = s.hub.cas_calls();
    assert!(j["retries"].as_u64().unwrap() >= 1, "{j}\n{calls:?}");
    assert!(calls.iter().any(|(k, r)| k == "reconstructions" && r.as_deref() == Some("bytes=0-0")), "{calls:?}");
    assert_eq!(s.hub.xet_token_calls(), 1, "a 400 renewed the token");
}

/// The Hub's token route itself says 401 (no token, or one without access): asking again cannot
/// help, so the download ends at once with the gated error and its HF_TOKEN hint, not after the
/// range workers' retries (it was 8 attempts of each range before).
#[test]
fn a_token_route_refusal_ends_the_download_at_once_naming_hf_token() {
    let s = Setup::xet();
    s.set_transport("xet");
    s.hub.fault(Fault { route: Route::Api, times: u32::MAX, ..Fault::cdn("xet-read-token", FaultKind::Status(401)) });
    let t = std::time::Instant::now();
    let out = s.download(&[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("gated: the Hub answered 401"), "{err}");
    assert!(err.contains("set HF_TOKEN"), "{err}");
    assert!(!err.contains("retry"), "a refusal was retried: {err}");
    // At most one token call per range worker that was already asking (--jobs 4).
    let calls = s.hub.xet_token_calls();
    assert!((1..=4).contains(&calls), "{calls} token calls");
    assert!(t.elapsed() < std::time::Duration::from_secs(20), "took {:?}", t.elapsed());
    assert!(s.hub.cas_calls().is_empty(), "the CAS was asked without a token");
}

#[test]
fn a_token_about_to_expire_is_refreshed_before_exp() {
    let s = Setup::xet();
    s.set_transport("xet");
    // hf-xet refreshes within 30 s of `exp`: a 31 s token is refreshed before it is refused
    // (the download is paced to last a few seconds; no request fails, so nothing is retried).
    s.hub.set_cas_token_ttl(31);
    s.hub.set_rate(1 << 20);
    let j = s.download_ok(&["--jobs", "1"]);
    s.assert_model_complete();
    assert!(s.hub.xet_token_calls() >= 2, "token calls: {}", s.hub.xet_token_calls());
    assert_eq!(j["retries"], 0, "{j}");
}

#[test]
fn kill_9_mid_reconstruction_then_rerun_resumes() {
    use std::time::{Duration, Instant};
    const BIG: &str = "model-00001-of-00001.safetensors";
    let files = vec![
        fake_hub::FakeFile::bytes("config.json", b"{\"model_type\": \"llama\"}".to_vec(), false),
        fake_hub::FakeFile::random(BIG, 6 << 20),
    ];
    let want = files[1].content_bytes();
    let s = Setup::build(files, None, true);
    s.set_transport("xet");
    s.hub.set_rate(1 << 20); // every CAS answer paced at 1 MiB/s
    let mut child = s
        .cmd(&["download", "--quiet", "--range-size", "1MiB", "--jobs", "2", "--idle-timeout", "5"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let journaled = loop {
        let done: u64 = s.journals(MODEL).values().flatten().map(|(a, b)| b - a).sum();
        if done >= 2 << 20 {
            child.kill().unwrap(); // SIGKILL, in the middle of reconstructions
            child.wait().unwrap();
            break s.journals(MODEL).values().flatten().map(|(a, b)| b - a).sum::<u64>();
        }
        assert!(Instant::now() < deadline, "no 2 MiB journaled in 60 s");
        assert!(child.try_wait().unwrap().is_none(), "download finished before it could be killed");
        std::thread::sleep(Duration::from_millis(20));
    };
    // hf-xet's working directory of the killed run is still there (it could not remove it).
    let scratch = |pid: u32| -> Vec<String> {
        let prefix = format!("spark-kit-xet-{pid}-");
        let names = std::fs::read_dir(s.tmp()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned());
        names.filter(|n| n.starts_with(&prefix)).collect()
    };
    assert!(!scratch(child.id()).is_empty(), "no working directory of the killed run in {}", s.tmp().display());
    s.hub.set_rate(0);
    let cas_before = s.hub.cas_bytes();
    let out = s.download(&["--range-size", "1MiB"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The rerun removed it, and said so.
    assert_eq!(scratch(child.id()), Vec::<String>::new());
    assert!(stderr(&out).contains("left by a download that was killed"), "{}", stderr(&out));
    assert!(j["resumed_bytes"].as_u64().unwrap() >= journaled, "{j}");
    assert!(j["fetched_bytes"].as_u64().unwrap() <= (6 << 20) - journaled, "{j}");
    // What the CAS sent for the rest (reconstruction answers and xorb ranges): a resumed range
    // asks for its reconstruction from the journaled byte on, so no more than the missing bytes
    // plus the partial chunks at each range's two ends (chunks are at most 128 KiB) and the
    // answers' JSON.
    let cas = s.hub.cas_bytes() - cas_before;
    let missing = (6 << 20) - journaled;
    eprintln!("resume after kill -9: journaled {journaled} B, CAS sent {cas} B for the {missing} B missing");
    assert!(cas <= missing + 6 * (2 * (128 << 10) + (16 << 10)), "CAS sent {cas} B for {missing} B missing");
    assert!(s.cached(MODEL, &s.commit, BIG) == want, "resumed file differs");
    assert!(s.cmd(&["verify"]).output().unwrap().status.success());
}

#[test]
fn the_summary_says_how_many_files_came_through_xet() {
    let s = Setup::xet();
    s.set_transport("xet");
    let out = s.cmd(&["download", "--quiet", "--range-size", "128KiB"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("{} through the Xet protocol", lfs_files())), "{text}");
}

#[test]
fn a_gated_repo_gets_its_cas_token_with_the_hub_token_which_never_reaches_the_cas() {
    let s = Setup::xet();
    s.set_transport("xet");
    s.hub.gate(MODEL, "hf_sEcReT123");
    let out =
        s.cmd(&["download", "--quiet", "--range-size", "128KiB"]).env("HF_TOKEN", "hf_sEcReT123").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    s.assert_model_complete();
    let auth = s.hub.auth();
    let cas: Vec<_> = auth.iter().filter(|(r, _)| *r == fake_hub::Route::Cas).collect();
    assert!(!cas.is_empty());
    assert!(cas.iter().all(|(_, a)| a.as_deref() != Some("Bearer hf_sEcReT123")), "Hub token sent to the CAS");
}
