//! The real Python Xet client (huggingface_hub 2.4.0 with hf_xet 1.8.0, tests/xet-requirements.txt,
//! venv by tests/xet-venv.sh) run against the test Hub: what `hf download` writes, judged or used
//! by the tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::harness::Setup;

/// One worker: huggingface_hub 2.4.0 publishes to its shared blob store best-effort, and on a
/// fresh cache its parallel workers race to mark the store (`utils/_shared_blobs.py`:
/// `_ensure_shared_blobs_dir` deletes another worker's marker temporary), so with the default 8
/// workers some LFS files stay plain blobs (seen in a loaded CI run: 2 of 4 shared). Serially
/// every LFS file is published, which the layout assertions need.
const SNAPSHOT: &str = r#"
import sys
import huggingface_hub, hf_xet
from huggingface_hub import snapshot_download
print(snapshot_download(sys.argv[1], max_workers=1))
print("huggingface_hub", huggingface_hub.__version__, file=sys.stderr)
"#;

/// The venv's python, or `None` (skipped, with the reason) outside the end-to-end runs.
pub fn xet_python() -> Option<PathBuf> {
    if std::env::var("SPARK_KIT_TEST_E2E").ok().as_deref() != Some("1") {
        eprintln!("skipped: set SPARK_KIT_TEST_E2E=1 to run the Python Xet client (builds its venv once)");
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash").arg(root.join("tests/xet-venv.sh")).output().unwrap();
    assert!(out.status.success(), "tests/xet-venv.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    Some(PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()))
}

/// `snapshot_download(args…)` against the test Hub (or offline) with a clean environment (its
/// own HF_HOME), `cache` as HF_HUB_CACHE; returns stdout (the snapshot directory last).
pub fn snapshot(py: &Path, s: &Setup, cache: &Path, offline: bool, args: &[&str]) -> String {
    let out = Command::new(py)
        .env_clear()
        .env("HF_HUB_OFFLINE", if offline { "1" } else { "0" })
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", s.dir.path())
        .env("HF_ENDPOINT", &s.hub.endpoint)
        .env("HF_HOME", s.dir.path().join("py-home"))
        .env("HF_HUB_CACHE", cache)
        .env("HF_XET_CACHE", s.dir.path().join("py-home/xet"))
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .args(["-c", SNAPSHOT])
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python failed:\n{}\n{err}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", err.trim());
    String::from_utf8(out.stdout).unwrap()
}
