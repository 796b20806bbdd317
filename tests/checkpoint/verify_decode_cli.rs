//! `spark-kit verify --decode` through the real binary: the real exllamav3 checkpoint decodes
//! clean; deliberately broken packs (NaN scale, zeroed trellis, blown-up scale) exit 1 naming
//! the tensor.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::common_ckpt;

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use spark_kit::checkpoint::Checkpoint;

fn spark(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spark-kit"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("SPARK_KIT_") || k.starts_with("HF_") {
            cmd.env_remove(k);
        }
    }
    cmd.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The fixture's EXL3 checkpoint, extracted; `None` (with a printed reason) when absent.
fn fixture() -> Option<(tempfile::TempDir, PathBuf)> {
    common_ckpt::real_fixture()
}

/// Overwrite bytes of `tensor` starting `at` bytes into its data.
fn patch(dir: &Path, tensor: &str, at: u64, bytes: &[u8]) {
    let ckpt = Checkpoint::open(dir).unwrap();
    let t = ckpt.get(tensor).unwrap();
    let shard = &ckpt.shards[t.shard];
    let mut f = std::fs::OpenOptions::new().write(true).open(&shard.path).unwrap();
    f.seek(SeekFrom::Start(shard.data_start + t.begin + at)).unwrap();
    f.write_all(bytes).unwrap();
}

fn decode(dir: &Path, json: bool) -> Output {
    let d = dir.to_str().unwrap();
    let mut args = vec!["verify", "--decode", "--kit", "tiny-cpu", "--model", d];
    if json {
        args.push("--json");
    }
    spark(&args)
}

#[test]
fn real_checkpoint_decodes_clean_with_json_field() {
    let Some((_tmp, dir)) = fixture() else { return };
    let out = decode(&dir, false);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("decode: 15 packed matrices"), "{stdout}");
    assert!(stdout.contains("no decode problems"), "{stdout}");
    let out = decode(&dir, true);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["packed_matrices"], 15, "the structural report is kept");
    let d = &v["decode"];
    assert_eq!(d["matrices"], 15);
    assert_eq!(d["findings"].as_array().unwrap().len(), 0);
    assert_eq!(d["tiles_decoded"], 15 * 2 * 64);
    // The source model is N(0, 0.02): every decoded linear lands there.
    for s in d["samples"].as_array().unwrap() {
        let rms = s["w_rms"].as_f64().unwrap();
        assert!((0.015..0.025).contains(&rms), "{s}");
        assert_eq!(s["codebook"], "mul1");
    }
    let head = d["samples"].as_array().unwrap().iter().find(|s| s["name"] == "lm_head").unwrap();
    assert_eq!(head["k"], 6.0);
}

#[test]
fn broken_packs_exit_1_naming_the_tensor() {
    let Some((_tmp, dir)) = fixture() else { return };
    let pristine = std::fs::read(dir.join("model.safetensors")).unwrap();
    let nan = 0x7E00u16.to_le_bytes();
    let cases: [(&str, u64, Vec<u8>, &str); 5] = [
        // NaN in the first input scale (block (0, 0) is always sampled).
        ("model.layers.1.mlp.down_proj.suh", 0, nan.to_vec(), "`model.layers.1.mlp.down_proj.suh`: 1 non-finite"),
        // NaN output scale.
        ("lm_head.svh", 2 * 5, nan.to_vec(), "`lm_head.svh`: 1 non-finite"),
        // The first tile row of a trellis zero-filled (a hole in a download).
        (
            "model.layers.0.self_attn.q_proj.trellis",
            0,
            vec![0u8; 16 * 48 * 2],
            "`model.layers.0.self_attn.q_proj.trellis`: 8 of 128 sampled 16×16 tiles decode to (nearly) constant or repeating",
        ),
        // Garbage: one word repeated over the first 8 tiles of the head (16 distinct states per tile).
        (
            "lm_head.trellis",
            0,
            0x1234u16.to_le_bytes().repeat(8 * 96),
            "`lm_head.trellis`: 8 of 128 sampled 16×16 tiles decode to (nearly) constant or repeating",
        ),
        // Every output scale of one attention matrix ×64 (fp16 0x5400 = 64): far off its class.
        ("model.layers.1.self_attn.o_proj.svh", 0, [0x00u8, 0x54].repeat(256), "`model.layers.1.self_attn.o_proj`: decoded weight RMS"),
    ];
    for (tensor, at, bytes, want) in cases {
        std::fs::write(dir.join("model.safetensors"), &pristine).unwrap();
        patch(&dir, tensor, at, &bytes);
        let out = decode(&dir, false);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{tensor}: {stdout}\n{stderr}");
        assert!(stdout.contains(&format!("error: {want}")), "{tensor}: {stdout}");
        let line = stderr.lines().find(|l| l.contains("broken pack")).unwrap_or_default();
        assert!(line.contains(want), "{tensor}: {stderr}");
        println!("{tensor}: {line}");
        let out = decode(&dir, true);
        assert_eq!(out.status.code(), Some(1));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let findings = v["decode"]["findings"].as_array().unwrap();
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(tensor.starts_with(findings[0]["tensor"].as_str().unwrap()), "{findings:?}");
    }
}

#[test]
fn decode_refuses_virtual_and_zero_blocks() {
    let out = spark(&["verify", "--decode", "--virtual"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let Some((_tmp, dir)) = fixture() else { return };
    let out =
        spark(&["verify", "--decode", "--decode-blocks", "0", "--kit", "tiny-cpu", "--model", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--decode-blocks 0"), "{}", text(&out.stderr));
}
