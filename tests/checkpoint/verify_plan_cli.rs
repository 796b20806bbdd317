//! `spark-kit verify --structure` and `spark-kit plan` through the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common_ckpt;

use std::process::{Command, Output};

use common_ckpt::{packed, write_safetensors, Marker, Rng};

fn spark(args: &[&str]) -> Output {
    spark_env(args, &[])
}

fn spark_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spark-kit"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("SPARK_KIT_") || k.starts_with("HF_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn verify_structure_clean_and_broken() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(5);
    let mut specs = Vec::new();
    packed(&mut specs, &mut rng, "model.layers.0.mlp.gate_proj", 256, 512, 48, Marker::Mul1);
    packed(&mut specs, &mut rng, "lm_head", 256, 1024, 96, Marker::Mul1);
    let file = dir.path().join("model.safetensors");
    write_safetensors(&file, &specs);
    let dir_s = dir.path().to_str().unwrap();

    let o = spark(&["verify", "--structure", "--kit", "tiny-cpu", "--model", dir_s]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("packed matrices 2, native tensors 0, codebooks: mul1 2"), "{out}");
    assert!(out.contains("no structural problems"), "{out}");

    let o = spark(&["verify", "--structure", "--json", "--kit", "tiny-cpu", "--model", dir_s]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["packed_matrices"], 2);
    assert_eq!(json["classes"][0]["class"], "head");

    specs.retain(|s| s.name != "lm_head.svh");
    write_safetensors(&file, &specs);
    let o = spark(&["verify", "--structure", "--kit", "tiny-cpu", "--model", dir_s]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stdout).contains("error: packed matrix `lm_head` has no `lm_head.svh` (F16 [1024])"));
    assert!(text(&o.stderr).contains("error: 1 structural error(s) in the checkpoint"), "{}", text(&o.stderr));
}

#[test]
fn verify_header_error_names_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    std::fs::write(&file, 1_000_000u64.to_le_bytes()).unwrap();
    let o = spark(&["verify", "--structure", "--kit", "tiny-cpu", "--model", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr).lines().next().unwrap(),
        format!(
            "error: {}: header length 1000000 runs past the end of the 8-byte file (truncated or corrupt shard)",
            file.display()
        )
    );
}

#[test]
fn plan_for_the_default_kit_uses_the_virtual_checkpoint() {
    let o = spark(&["plan", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // KV bytes per token derived from the shapes (the kit sets none).
    assert_eq!(json["kv"]["tokens"], 764_736);
    assert_eq!(json["kv"]["bytes_per_token"], 3510.0);
    assert_eq!(json["nodes"].as_array().unwrap().len(), 2);
    assert!(json["weights_source"].as_str().unwrap().contains("virtual DeepSeek V4.1 Flash"));
    // Modelled shapes carry a ±0.5 % band.
    let (w, band) = (json["weights_per_rank"].as_u64().unwrap(), json["weights_band"].as_u64().unwrap());
    assert_eq!(band, w / 1000 * 5);
    let assumptions = json["assumptions"].as_array().unwrap();
    let hidden = assumptions.iter().find(|a| a["name"] == "virtual checkpoint: hidden × layers × vocab").unwrap();
    assert_eq!(hidden["value"].as_str(), Some("5120 × 40 × 129280"));
    assert!(assumptions.iter().any(|a| a["name"] == "weights: vision"));
    assert!(assumptions.iter().any(|a| a["name"] == "KV model check"
        && a["value"].as_str().unwrap().contains("(-1.25 % vs the reference's 774400)")));
    assert!(assumptions.iter().all(|a| !a["source"].as_str().unwrap().is_empty()));
    let o = spark(&["plan", "--kv-cache-bytes", "3GiB", "--set", "memory.os_reserve=12GiB"]);
    let out = text(&o.stdout);
    assert!(out.contains("warning: spark-1: a 600000-token prefill is predicted"), "{out}");
    assert!(out.contains("no prompt length is safe"), "{out}");
    assert!(
        out.contains("  fix: shrink engine.kv_cache_bytes by") && out.contains("`--set engine.kv_cache_bytes="),
        "{out}"
    );
    // Issue 21 item 1: the exact command of the report. The reference's 3 GiB pool died at ~470k
    // of a 600k prompt: the plan must not call 470k safe (it said 600000 before).
    let o = spark(&["plan", "--set", "engine.kv_cache_bytes=3GiB", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for n in json["nodes"].as_array().unwrap() {
        let safe = n["prefill"]["safe_max_prompt"].as_u64().unwrap();
        assert!(safe < 470_000, "{safe}");
    }
    // The printed pool fix, run as printed, leaves no prefill warning.
    let o = spark(&["plan", "--set", "engine.kv_cache_bytes=3.5GiB"]);
    let out = text(&o.stdout);
    let fix = out
        .lines()
        .find(|l| l.contains("fix: shrink engine.kv_cache_bytes") && l.contains("`--set engine.kv_cache_bytes="))
        .unwrap_or_else(|| panic!("{out}"));
    let set = fix.split("`--set ").nth(1).unwrap().split('`').next().unwrap().to_string();
    let o = spark(&["plan", "--set", &set]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{set}: {out}{}", text(&o.stderr));
    assert!(!out.contains("-token prefill is predicted"), "{set}: {out}");
    // tiny-cpu's model is made by `up` on its first start: before that, `plan` says so (#28).
    let home = tempfile::tempdir().unwrap();
    let o = spark_env(&["plan", "--kit", "tiny-cpu"], &[("HOME", home.path().to_str().unwrap())]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(err.contains("its model is made by `spark-kit up` on the first start and is not made yet"), "{err}");
    assert!(
        err.contains("hint: run `spark-kit up --kit tiny-cpu` once (it makes the model), or pass --model DIR"),
        "{err}"
    );
}

fn tiny_cpu() -> spark_kit::kit::schema::Kit {
    spark_kit::kit::resolve(spark_kit::kit::source(Some("tiny-cpu")).unwrap(), &[], &[]).unwrap().kit
}

/// A checkpoint of one packed matrix with its `config.json`, in `dir`.
fn small_checkpoint(dir: &std::path::Path, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Rng::new(seed);
    let mut specs = Vec::new();
    packed(&mut specs, &mut rng, "model.layers.0.self_attn.q_proj", 256, 256, 48, Marker::Mul1);
    write_safetensors(&dir.join("model.safetensors"), &specs);
    std::fs::write(dir.join("config.json"), "{}").unwrap();
}

/// #28: `plan --kit tiny-cpu` plans the checkpoint `up` made (it said "names no local checkpoint
/// directory" and pointed at `download`, which has nothing to fetch for this kit).
#[test]
fn plan_reads_the_tiny_model_up_made() {
    let home = tempfile::tempdir().unwrap();
    let d = spark_kit::deploy::Deployment::resolve(&tiny_cpu(), &[("HOME".into(), home.path().display().to_string())])
        .unwrap();
    let kit = tiny_cpu();
    let made = spark_kit::engine::model::served_dir(&kit, &d, &spark_kit::engine::overlay::tag()).unwrap();
    small_checkpoint(&made, 3);
    let o = spark_env(&["plan", "--kit", "tiny-cpu"], &[("HOME", home.path().to_str().unwrap())]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(out.contains(&format!("over checkpoint headers in {}", made.display())), "{out}");
}

/// #28: the snapshot `plan` / `verify` read is the one the engine serves: `refs/<revision>`,
/// also when `spark-kit.lock` records another commit (they read the lock's commit before).
#[test]
fn plan_and_the_engine_read_one_snapshot() {
    let home = tempfile::tempdir().unwrap();
    let env = [("HOME".to_string(), home.path().display().to_string())];
    let mut kit = tiny_cpu();
    kit.model.source = spark_kit::kit::schema::ModelSource::Hub;
    kit.model.repo = "acme/tiny-exl3".into();
    kit.model.revision = "main".into();
    let d = spark_kit::deploy::Deployment::resolve(&kit, &env).unwrap();
    let (old, new) = ("a".repeat(40), "b".repeat(40));
    let repo = d.repo_dir(&kit.model.repo);
    small_checkpoint(&repo.join("snapshots").join(&old), 4);
    small_checkpoint(&repo.join("snapshots").join(&new), 5);
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), &new).unwrap();
    std::fs::create_dir_all(d.lock_file.parent().unwrap()).unwrap();
    let lock = serde_json::json!({"version": 1, "kit": "tiny-cpu", "files": [{
        "repo": "acme/tiny-exl3", "revision": "main", "commit": old, "path": "model.safetensors",
        "size": 1, "sha256": "00"}]});
    std::fs::write(&d.lock_file, lock.to_string()).unwrap();
    let served = spark_kit::engine::model::served_dir(&kit, &d, "").unwrap();
    assert_eq!(served, repo.join("snapshots").join(&new));
    let sets = ["--set", "model.source=hub", "--set", "model.repo=acme/tiny-exl3", "--set", "model.revision=main"];
    let o = spark_env(&[&["plan", "--kit", "tiny-cpu"][..], &sets].concat(), &[("HOME", &env[0].1)]);
    let out = text(&o.stdout);
    assert!(out.contains(&format!("over checkpoint headers in {}", served.display())), "{out}{}", text(&o.stderr));
}

#[test]
fn verify_structure_finds_the_downloaded_snapshot() {
    let home = tempfile::tempdir().unwrap();
    let hub = home.path().join("hub");
    let snapshot = hub.join("models--acme--tiny-exl3/snapshots/0123abcd");
    std::fs::create_dir_all(&snapshot).unwrap();
    let mut rng = Rng::new(8);
    let mut specs = Vec::new();
    packed(&mut specs, &mut rng, "model.layers.0.self_attn.q_proj", 256, 256, 48, Marker::Mul1);
    write_safetensors(&snapshot.join("model.safetensors"), &specs);
    std::fs::write(snapshot.join("config.json"), "{}").unwrap();
    // What `download` writes beside the lock: the ref the served snapshot is read by.
    std::fs::create_dir_all(hub.join("models--acme--tiny-exl3/refs")).unwrap();
    std::fs::write(hub.join("models--acme--tiny-exl3/refs/main"), "0123abcd").unwrap();
    let lock_dir = home.path().join(".cache/spark-kit/data/tiny-cpu");
    std::fs::create_dir_all(&lock_dir).unwrap();
    let lock = serde_json::json!({"version": 1, "kit": "tiny-cpu", "files": [{
        "repo": "acme/tiny-exl3", "revision": "main", "commit": "0123abcd", "path": "model.safetensors",
        "size": 1, "sha256": "00"}]});
    std::fs::write(lock_dir.join("spark-kit.lock"), lock.to_string()).unwrap();
    let env = [("HOME", home.path().to_str().unwrap()), ("HF_HUB_CACHE", hub.to_str().unwrap())];
    let args = [
        "verify",
        "--structure",
        "--kit",
        "tiny-cpu",
        "--set",
        "model.source=hub",
        "--set",
        "model.repo=acme/tiny-exl3",
        "--set",
        "model.revision=main",
    ];
    let o = spark_env(&args, &env);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.starts_with(&format!("checkpoint headers in {}", snapshot.display())), "{out}");
    assert!(out.contains("packed matrices 1"), "{out}");
}
