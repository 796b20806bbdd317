//! Interop with Python `huggingface_hub` (the engine venv's): after `spark-kit download`, with
//! `HF_HUB_OFFLINE=1`, `snapshot_download` and `hf_hub_download` resolve every file from our
//! cache and `scan_cache_dir` sees a complete repo; online, `hf cache verify` against the fake
//! Hub reports no mismatch. Needs SPARK_KIT_TEST_E2E=1 and the tiny-cpu engine venv.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;
use crate::fake_hub;

use std::path::PathBuf;

use fake_hub::harness::{model_files, MODEL};
use fake_hub::Setup;

const SCRIPT: &str = r#"
import hashlib, json, os, sys
from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download
repo, expected = sys.argv[1], json.loads(sys.argv[2])
snap = snapshot_download(repo)
vllm_like = snapshot_download(repo, allow_patterns=["*.safetensors", "*.json"], local_files_only=True)
assert vllm_like == snap, (vllm_like, snap)
for path, sha in expected.items():
    p = hf_hub_download(repo, path)
    assert os.path.realpath(p) == os.path.realpath(os.path.join(snap, path)), path
    assert hashlib.sha256(open(p, "rb").read()).hexdigest() == sha, path
info = [r for r in scan_cache_dir().repos if r.repo_id == repo][0]
assert info.nb_files == len(expected), (info.nb_files, len(expected))
assert not [w for w in scan_cache_dir().warnings], scan_cache_dir().warnings
print("offline ok", len(expected))
"#;

fn venv_python() -> Option<PathBuf> {
    if std::env::var("SPARK_KIT_TEST_E2E").ok().as_deref() != Some("1") {
        eprintln!(
            "skipped: set SPARK_KIT_TEST_E2E=1 to run the huggingface_hub interop test (needs the tiny-cpu venv)"
        );
        return None;
    }
    let py = common::venv_python();
    if !py.exists() {
        eprintln!("skipped: no engine venv python at {}", py.display());
        return None;
    }
    Some(py)
}

#[test]
fn python_huggingface_hub_reads_our_cache_offline() {
    let Some(py) = venv_python() else { return };
    let s = Setup::new(None);
    s.download_ok(&[]);
    let expected: serde_json::Map<String, serde_json::Value> =
        model_files().iter().map(|f| (f.path.clone(), serde_json::Value::String(f.sha256.clone()))).collect();
    let out = std::process::Command::new(&py)
        .args(["-c", SCRIPT, MODEL, &serde_json::Value::Object(expected).to_string()])
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", s.cache())
        .env("HF_HOME", s.dir.path().join("hf-home"))
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("offline ok 6"));

    // Online against the fake Hub: the CLI's checksum verification agrees with our cache.
    let hf = py.with_file_name("hf");
    let out = std::process::Command::new(&hf)
        .args(["cache", "verify", MODEL, "--cache-dir"])
        .arg(s.cache())
        .env("HF_ENDPOINT", &s.hub.endpoint)
        .env("HF_HOME", s.dir.path().join("hf-home"))
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("hf cache verify: {}", text.trim());
    assert!(out.status.success(), "hf cache verify failed:\n{text}");
    assert!(text.contains("Verified 6 file(s)") && text.contains("All checksums match"), "{text}");
}
