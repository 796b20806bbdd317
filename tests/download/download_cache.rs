//! `spark-kit download` / `verify` against the fake Hub: the cache layout offline readers need,
//! the lock file, the Engram slim directory, dry run, gated repos, traversal, disk space.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_hub;

use std::os::unix::fs::MetadataExt;

use fake_hub::harness::{tree, ENGRAM, MODEL};
use fake_hub::{FakeFile, Route, Setup};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn layout_lock_and_verify() {
    let s = Setup::new(None);
    let j = s.download_ok(&[]);
    assert_eq!(j["files"], 6);
    assert_eq!(j["downloaded_files"], 6);
    assert_eq!(j["retries"], 0);
    assert_eq!(j["repos"][0]["commit"], s.commit.as_str());
    s.assert_model_complete();

    let repo = s.repo_dir(MODEL);
    // refs/main: the commit, no newline.
    assert_eq!(std::fs::read(repo.join("refs/main")).unwrap(), s.commit.as_bytes());
    // Relative symlinks into blobs/, named by sha256 (LFS) or git sha1 (regular).
    let snap = repo.join("snapshots").join(&s.commit);
    let link = std::fs::read_link(snap.join("extra/nested.bin")).unwrap();
    assert!(link.to_str().unwrap().starts_with("../../../blobs/"), "{link:?}");
    let cfg = std::fs::read_link(snap.join("config.json")).unwrap();
    let f = fake_hub::harness::model_files();
    assert_eq!(cfg.to_str().unwrap(), format!("../../blobs/{}", f[0].git_sha1));
    let shard = std::fs::read_link(snap.join("model-00001-of-00003.safetensors")).unwrap();
    assert_eq!(shard.to_str().unwrap(), format!("../../blobs/{}", f[2].sha256));
    // No trees/, no partials or journals left, locks in .locks/.
    let all = tree(&s.cache());
    assert!(!all.iter().any(|p| p.contains("trees") || p.contains("spark-partial") || p.contains(".tmp")), "{all:#?}");
    assert!(all.iter().any(|p| p.starts_with(".locks/models--test-org--tiny-model/")), "{all:#?}");
    // One resolve per file, the tree was paged, and the CDN never saw a token.
    for f in &f {
        assert_eq!(s.hub.resolves(&f.path), 1, "{}", f.path);
    }
    assert!(s.hub.api_calls().iter().any(|c| c.contains("cursor=")), "{:?}", s.hub.api_calls());
    assert!(s.hub.auth().iter().filter(|(r, _)| *r == Route::Cdn).all(|(_, a)| a.is_none()));
    let peak = s.hub.peak_connections();
    assert!((1..=4).contains(&peak), "peak CDN connections {peak} with --jobs 4");

    // The lock file lists every file with its sha256.
    let lock: serde_json::Value = serde_json::from_slice(&std::fs::read(s.lock_file()).unwrap()).unwrap();
    assert_eq!(lock["files"].as_array().unwrap().len(), 6);
    assert_eq!(lock["files"][0]["commit"], s.commit.as_str());

    // verify, verify --fast, --json.
    let out = s.cmd(&["verify"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("6 of 6 files ok (sha256"));
    let out = s.cmd(&["verify", "--fast", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["mode"].as_str(), v["ok"].as_u64(), v["failed"].as_u64()), (Some("sizes"), Some(6), Some(0)));

    // Second run: everything cached, nothing fetched.
    let j2 = s.download_ok(&[]);
    assert_eq!((j2["cached_files"].as_u64(), j2["fetched_bytes"].as_u64()), (Some(6), Some(0)));

    // A flipped byte in a blob: verify names the file and fails with exit 1; --fast does not see it.
    let blob = repo.join("blobs").join(&f[3].sha256);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[1000] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let out = s.cmd(&["verify"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAILED test-org/tiny-model model-00002-of-00003.safetensors: sha256"), "{text}");
    assert!(s.cmd(&["verify", "--fast"]).output().unwrap().status.success());
}

#[test]
fn verify_without_lock_is_a_usage_error() {
    let s = Setup::new(None);
    let out = s.cmd(&["verify"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no lock file") && stderr(&out).contains("spark-kit download"), "{}", stderr(&out));
}

#[test]
fn engram_slim_directory() {
    let s = Setup::new(Some(fake_hub::harness::engram_files(false)));
    let j = s.download_ok(&["--only", "engram"]);
    assert_eq!(j["repos"].as_array().unwrap().len(), 1);
    assert_eq!(j["files"], 4, "only the listed Engram files");
    let e = &j["repos"][0]["engram"];
    assert_eq!(e["tensors"], 4);
    let slim = s.dir.path().join("engram");
    let mut names = tree(&slim);
    names.sort();
    assert_eq!(
        names,
        [
            "config.json",
            "model-00047-of-00048.safetensors",
            "model-00048-of-00048.safetensors",
            "model.safetensors.index.json"
        ]
    );
    // Hardlinks: same inode as the cache blob.
    let commit = j["repos"][0]["commit"].as_str().unwrap().to_string();
    let snap = s.repo_dir(ENGRAM).join("snapshots").join(&commit).join("model-00047-of-00048.safetensors");
    assert_eq!(
        std::fs::metadata(&snap).unwrap().ino(),
        std::fs::metadata(slim.join("model-00047-of-00048.safetensors")).unwrap().ino()
    );
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(slim.join("model.safetensors.index.json")).unwrap()).unwrap();
    let keys: Vec<&String> = idx["weight_map"].as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 4);
    assert!(keys.iter().all(|k| k.ends_with(".engram.embed.weight") || k.ends_with(".engram.embed.scale")));
    assert!(!s.repo_dir(MODEL).exists(), "--only engram fetched the model");
}

#[test]
fn engram_tensor_outside_the_shards_fails() {
    let s = Setup::new(Some(fake_hub::harness::engram_files(true)));
    let out = s.download(&["--only", "engram"]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(e.contains("model.layers.1.engram.embed.scale") && e.contains("model-00001-of-00048.safetensors"), "{e}");
    assert!(!s.dir.path().join("engram").exists());
}

#[test]
fn dry_run_writes_nothing() {
    let s = Setup::new(None);
    let out = s.cmd(&["download", "--dry-run"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("model-00001-of-00003.safetensors") && text.contains("to fetch"), "{text}");
    assert!(text.contains("dry run: 6 files"), "{text}");
    assert!(tree(&s.cache()).iter().all(|p| !p.contains("blobs/")), "{:?}", tree(&s.cache()));
    assert!(s.hub.served().is_empty());
}

#[test]
fn gated_repo_needs_the_token_and_never_shows_it() {
    let s = Setup::new(None);
    s.hub.gate(MODEL, "hf_sEcReT123");
    let out = s.download(&[]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    let want = format!("accept the licence at {}/{MODEL} or set HF_TOKEN", s.hub.endpoint);
    assert!(e.contains(&want), "{e}");
    assert!(!s.repo_dir(MODEL).join("snapshots").exists());

    let out = s.cmd(&["download", "--json"]).env("HF_TOKEN", "hf_sEcReT123").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    for text in [String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)] {
        assert!(!text.contains("sEcReT"), "token leaked: {text}");
    }
    let auth = s.hub.auth();
    assert!(auth.iter().any(|(r, a)| *r == Route::Resolve && a.as_deref() == Some("Bearer hf_sEcReT123")));
    assert!(auth.iter().filter(|(r, _)| *r == Route::Cdn).all(|(_, a)| a.is_none()), "token sent to the CDN");
    // HF_TOKEN_PATH works too (fresh cache).
    std::fs::remove_dir_all(s.cache()).unwrap();
    let tok = s.dir.path().join("tok");
    std::fs::write(&tok, "hf_sEcReT123\n").unwrap();
    let out = s.cmd(&["download", "--quiet"]).env("HF_TOKEN_PATH", &tok).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn path_traversal_is_refused() {
    for bad in ["../escape.json", "/etc/evil.json", "a/../../escape.json", "sub/./x"] {
        let s = Setup::new(None);
        s.hub.list_extra(MODEL, bad);
        let out = s.download(&[]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let e = stderr(&out);
        assert!(e.contains(bad) && e.contains("refusing to write outside the cache"), "{bad}: {e}");
        assert!(!s.dir.path().join("escape.json").exists());
        assert!(tree(s.dir.path()).iter().all(|p| !p.contains("escape") && !p.contains("evil")), "{bad}");
        assert!(s.hub.served().is_empty(), "{bad}: fetched bytes before refusing");
    }
}

#[test]
fn not_enough_disk_space() {
    let mut files = fake_hub::harness::model_files();
    files[2].claimed_size = Some(1 << 60);
    let s = Setup::with_files(files, None);
    let out = s.download(&[]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(e.contains("not enough disk space") && e.contains("free"), "{e}");
    assert!(s.hub.served().is_empty());
}

#[test]
fn kit_mismatch_is_a_config_error() {
    let mut files = fake_hub::harness::model_files();
    files.push(FakeFile::random("model-extra.safetensors", 10));
    let s = Setup::with_files(files, None);
    // The kit expects the shard count of model_files() + 1 … make it expect one fewer.
    let kit = std::fs::read_to_string(&s.kit).unwrap().replace("expected_shards: 4", "expected_shards: 3");
    std::fs::write(&s.kit, kit).unwrap();
    let out = s.download(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("model.files.expected_shards"), "{}", stderr(&out));
}

#[test]
fn bad_input_is_a_usage_error() {
    let s = Setup::new(None);
    let cases: [(&[&str], &str); 4] = [
        (&["download", "--jobs", "0"], "--jobs 0 is out of range"),
        (&["download", "--range-size", "1"], "--range-size is below 4KiB"),
        (&["download", "--only", "engram"], "has no `engram` section"),
        (&["verify", "--jobs", "0"], "no lock file"),
    ];
    for (args, want) in cases {
        let out = s.cmd(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let e = stderr(&out);
        assert!(e.starts_with("error: ") && e.contains(want) && e.contains("hint: "), "{args:?}: {e}");
    }
    // A kit whose model is made locally has nothing to download.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spark-kit"))
        .args(["download", "--kit", "tiny-cpu"])
        .env_clear()
        .env("HOME", s.dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("names nothing on the Hub"), "{}", stderr(&out));
    // A malformed HF_ENDPOINT names the variable.
    let out = s.cmd(&["download"]).env("HF_ENDPOINT", "not a url").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("HF_ENDPOINT `not a url` is not a URL"), "{}", stderr(&out));
}
