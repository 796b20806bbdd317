//! A blob already in the cache is reused by size: the summary says "cached", not "verified";
//! `download --verify-cached` re-hashes what it reuses and fetches a corrupt blob again;
//! `verify --repair` moves a bad blob aside and fetches it again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_hub;

use fake_hub::harness::{model_files, MODEL};
use fake_hub::Setup;

fn flip(s: &Setup, sha: &str) -> std::path::PathBuf {
    let blob = s.repo_dir(MODEL).join("blobs").join(sha);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[1000] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    blob
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn reused_blobs_are_cached_not_verified() {
    let s = Setup::new(None);
    s.download_ok(&[]);
    flip(&s, &model_files()[3].sha256);
    let out = s.cmd(&["download", "--quiet"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(!t.contains("verified"), "a reused blob reported as verified: {t}");
    assert!(t.contains("6 already cached (size checked, not re-hashed"), "{t}");
    assert!(t.contains("--verify-cached"), "{t}");
}

#[test]
fn verify_cached_rehashes_and_fetches_a_corrupt_blob_again() {
    let s = Setup::new(None);
    s.download_ok(&[]);
    let f = &model_files()[3];
    let blob = flip(&s, &f.sha256);
    let j = s.download_ok(&["--verify-cached"]);
    assert_eq!(j["verified_cached"], 5, "{j}");
    assert_eq!(j["repaired_files"], 1, "{j}");
    assert_eq!(j["downloaded_files"], 1, "{j}");
    assert_eq!(j["fetched_bytes"], f.size, "{j}");
    s.assert_model_complete();
    let aside = blob.with_file_name(format!("{}.spark-bad", f.sha256));
    assert!(aside.exists(), "the corrupt blob was not kept aside");
    assert!(s.cmd(&["verify"]).output().unwrap().status.success());
    // Human summary: what was re-hashed.
    let out = s.cmd(&["download", "--quiet", "--verify-cached"]).output().unwrap();
    let t = text(&out.stdout);
    assert!(t.contains("6 already cached (re-hashed: 6 ok)"), "{t}");
}

#[test]
fn verify_repair_moves_the_bad_blob_aside_and_fetches_it_again() {
    let s = Setup::new(None);
    s.download_ok(&[]);
    let f = &model_files()[3];
    let blob = flip(&s, &f.sha256);
    let out = s.cmd(&["verify"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    // The hint's command, run as printed.
    let hint = e.lines().find(|l| l.starts_with("hint: ")).unwrap_or_else(|| panic!("no hint: {e}"));
    let printed = hint.split('`').nth(1).unwrap_or_else(|| panic!("no command in {hint}"));
    assert_eq!(printed, format!("spark-kit verify --repair --kit {}", s.kit.display()), "{hint}");
    let args: Vec<&str> = printed.split(' ').skip(1).collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spark-kit"))
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", s.dir.path())
        .env("HF_ENDPOINT", &s.hub.endpoint)
        .output()
        .unwrap();
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}\n{e}");
    let aside = blob.with_file_name(format!("{}.spark-bad", f.sha256));
    assert!(o.contains(&format!("moved {} aside to {}", blob.display(), aside.display())), "{o}");
    assert!(o.contains("repaired 1 of 1 file"), "{o}");
    assert!(aside.exists());
    s.assert_model_complete();
    let out = s.cmd(&["verify"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn verify_repair_of_an_engram_shard_rebuilds_the_slim_directory() {
    use fake_hub::harness::{engram_files, ENGRAM};
    let s = Setup::new(Some(engram_files(false)));
    s.download_ok(&[]);
    let shard = engram_files(false).into_iter().find(|f| f.path == "model-00047-of-00048.safetensors").unwrap();
    let blob = s.repo_dir(ENGRAM).join("blobs").join(&shard.sha256);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let slim = s.dir.path().join("engram/model-00047-of-00048.safetensors");
    assert!(std::fs::read(&slim).unwrap() != shard.content_bytes(), "the slim dir is a hardlink of the blob");
    let out = s.cmd(&["verify", "--repair"]).output().unwrap();
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(std::fs::read(&slim).unwrap() == shard.content_bytes(), "the slim dir still holds the bad bytes");
    assert!(s.cmd(&["verify"]).output().unwrap().status.success());
}
