//! What `download` says when the Hub cannot give it what the kit names: an unknown revision, a
//! repository that does not exist, an endpoint nobody listens on — against the Hub's own error
//! headers and against servers that send none (another Hub implementation, a plain mirror). Also:
//! every retry of an API or `resolve` request is printed and counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_hub;

use std::time::{Duration, Instant};

use fake_hub::harness::MODEL;
use fake_hub::{Dialect, Fault, FaultKind, Route, Setup};

const UNKNOWN: &str = "0123456789abcdef0123456789abcdef01234567";
const DIALECTS: [Dialect; 3] = [Dialect::Hub, Dialect::EntryOnly, Dialect::Bare];

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn unknown_commit_is_a_missing_revision_and_exit_2() {
    for d in DIALECTS {
        let s = Setup::new(None);
        s.hub.set_dialect(d);
        let rev = format!("model.revision={UNKNOWN}");
        let out = s.download(&["--set", &rev]);
        let e = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{d:?}: {e}");
        assert!(e.contains(&format!("error: revision `{UNKNOWN}` not found in {MODEL}")), "{d:?}: {e}");
        assert!(e.contains("hint: ") && e.contains("model.revision"), "{d:?}: {e}");
        assert!(!e.contains("has no file"), "{d:?}: {e}");
        // The hint's example, as printed.
        let example = e.split("(e.g. ").nth(1).and_then(|t| t.split(')').next()).unwrap_or_else(|| panic!("{e}"));
        assert_eq!(example, "--set model.revision=main");
        let args: Vec<&str> = example.split(' ').collect();
        s.download_ok(&args);
    }
}

#[test]
fn unknown_branch_is_a_missing_revision() {
    for d in DIALECTS {
        let s = Setup::new(None);
        s.hub.set_dialect(d);
        let out = s.download(&["--set", "model.revision=no-such-branch"]);
        let e = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{d:?}: {e}");
        assert!(e.contains(&format!("revision `no-such-branch` not found in {MODEL}")), "{d:?}: {e}");
    }
}

#[test]
fn missing_repository_is_named_as_such() {
    for d in DIALECTS {
        let s = Setup::new(None);
        s.hub.set_dialect(d);
        let out = s.download(&["--set", "model.repo=test-org/no-such-model"]);
        let e = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{d:?}: {e}");
        assert!(e.contains("error: repository test-org/no-such-model not found"), "{d:?}: {e}");
        assert!(!e.contains("revision `main` not found"), "{d:?}: {e}");
        assert!(e.contains("hint: ") && e.contains("model.repo") && e.contains("HF_TOKEN"), "{d:?}: {e}");
    }
}

#[test]
fn gated_repository_says_so_from_the_error_code() {
    let s = Setup::new(None);
    s.hub.gate(MODEL, "hf_tok");
    let out = s.download(&[]);
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(e.contains(&format!("{MODEL} is gated")) && e.contains("accept the licence at"), "{e}");
}

/// A loopback port nobody listens on (connection refused).
fn dead_endpoint() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

#[test]
fn unreachable_endpoint_fails_in_seconds() {
    let s = Setup::new(None);
    let dead = dead_endpoint();
    for dry in [false, true] {
        let mut args = vec!["download", "--json"];
        if dry {
            args.push("--dry-run");
        }
        let t = Instant::now();
        let out = s.cmd(&args).env("HF_ENDPOINT", &dead).output().unwrap();
        let took = t.elapsed();
        let e = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "dry-run {dry}: {e}");
        assert!(took < Duration::from_secs(8), "dry-run {dry}: took {took:?}: {e}");
        assert!(e.contains(&format!("error: cannot reach HF_ENDPOINT={dead}")), "dry-run {dry}: {e}");
        assert!(e.contains("hint: ") && e.contains("HF_ENDPOINT"), "dry-run {dry}: {e}");
        assert!(!e.contains("resumes"), "a resume hint for a server never reached: {e}");
        assert!(out.stdout.is_empty(), "dry-run {dry}: printed a summary");
    }
}

#[test]
fn api_and_resolve_retries_are_printed_and_counted() {
    const SHARD: &str = "model-00001-of-00003.safetensors";
    let s = Setup::new(None);
    s.hub.fault(Fault { route: Route::Resolve, times: 2, ..Fault::cdn(SHARD, FaultKind::Status(503)) });
    s.hub.fault(Fault { route: Route::Api, ..Fault::cdn("tree", FaultKind::Status(500)) });
    s.hub.fault(Fault { route: Route::Api, ..Fault::cdn("revision", FaultKind::TooMany { retry_after: 1 }) });
    let out = s.download(&[]);
    let e = stderr(&out);
    assert!(out.status.success(), "{e}");
    assert_eq!(s.hub.pending_faults(), 0);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["retries"], 4, "{j}\n{e}");
    let lines: Vec<&str> = e.lines().filter(|l| l.starts_with("download: retry ")).collect();
    assert_eq!(lines.len(), 4, "{e}");
    assert!(lines.iter().any(|l| l.contains(SHARD) && l.contains("HTTP 503")), "{e}");
    assert!(lines.iter().any(|l| l.contains("file listing") && l.contains("HTTP 500")), "{e}");
    assert!(lines.iter().any(|l| l.contains("revision info") && l.contains("HTTP 429")), "{e}");
}
