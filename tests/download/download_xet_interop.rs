//! The test Hub's Xet side judged by the real client: huggingface_hub 2.4.0 with hf_xet 1.8.0
//! (tests/xet-requirements.txt, venv by tests/xet-venv.sh) downloads a repo whose LFS files are
//! in xet-core's local CAS, through `resolve` → `xet-read-token` → reconstruction → xorb
//! fetches, byte-exact, never touching the bridge. Needs SPARK_KIT_TEST_E2E=1 (PyPI once, for
//! the venv; tests/run-all.sh builds it first).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::fake_hub;

use std::path::{Path, PathBuf};

use fake_hub::harness::{model_files, MODEL};
use fake_hub::python::{snapshot, xet_python};
use fake_hub::{Route, Setup};

#[test]
fn huggingface_hub_with_hf_xet_downloads_from_the_test_cas_byte_exact() {
    let Some(py) = xet_python() else { return };
    let s = Setup::xet();
    let cache = s.dir.path().join("py-cache");
    let snap = snapshot(&py, &s, &cache, false, &[MODEL]);
    assert_snapshot(&snap);
    // The bytes came through the CAS: no bridge request, xorb fetches on the proxy, the token
    // from the Hub, and the client's shared blob store holds each LFS file under its Xet hash.
    assert!(s.hub.served().is_empty(), "the bridge was used: {:?}", s.hub.served());
    assert!(s.hub.cas_calls().iter().any(|(k, _)| k == "fetch_term"), "{:?}", s.hub.cas_calls());
    assert!(s.hub.cas_calls().iter().any(|(k, _)| k == "reconstructions"));
    assert!(s.hub.xet_token_calls() >= 1);
    let lfs = model_files().into_iter().filter(|f| f.lfs).count();
    let shared: Vec<_> = walk(&cache.join("blobs"))
        .into_iter()
        .filter(|p| p.parent().is_some_and(|d| d != cache.join("blobs")) && p.extension().is_none())
        .collect();
    assert_eq!(shared.len(), lfs, "shared blob store: {shared:?}");
    assert!(s.hub.auth().iter().filter(|(r, _)| *r == Route::Cas).count() > 0);
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Every file of the snapshot directory printed last in `out` holds the Hub's bytes.
fn assert_snapshot(out: &str) {
    let snap = PathBuf::from(out.lines().last().unwrap().trim());
    for f in model_files() {
        let got = std::fs::read(snap.join(&f.path)).unwrap();
        assert!(got == f.content_bytes(), "{} differs from what the Hub holds", f.path);
    }
}

#[test]
fn a_cache_written_by_hf_with_shared_blobs_is_reused_verified_and_a_dangling_link_named() {
    let Some(py) = xet_python() else { return };
    let s = Setup::xet();
    // `hf` fills the cache spark-kit uses: blobs/<sha256> are links into blobs/<2hex>/<xet hash>.
    snapshot(&py, &s, &s.cache(), false, &[MODEL]);
    let shard = &model_files()[2];
    let link = s.repo_dir(MODEL).join("blobs").join(&shard.sha256);
    let target = std::fs::read_link(&link).unwrap();
    assert!(target.starts_with("../../blobs/"), "{}", target.display());
    let j = s.download_ok(&[]);
    assert_eq!(j["fetched_bytes"], 0, "{j}");
    assert_eq!(j["cached_files"], model_files().len(), "{j}");
    assert!(s.cmd(&["verify"]).output().unwrap().status.success());
    // The shared store loses a payload: verify names the file and the dangling link.
    std::fs::remove_file(link.parent().unwrap().join(&target)).unwrap();
    let out = s.cmd(&["verify"]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains(&shard.path) && text.contains("dangling symlink"), "{text}");
    // A rerun of download brings the payload back as a plain blob.
    s.download_ok(&[]);
    assert!(s.cmd(&["verify"]).output().unwrap().status.success());
}

#[test]
fn a_cache_spark_kit_filled_over_xet_is_read_offline_by_huggingface_hub() {
    let Some(py) = xet_python() else { return };
    let s = Setup::xet();
    s.set_transport("xet");
    s.download_ok(&[]);
    let out = snapshot(&py, &s, &s.cache(), true, &[MODEL]);
    assert_snapshot(&out);
}
