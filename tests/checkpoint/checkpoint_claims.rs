//! What the audit checks beyond the packed matrices themselves: `config.json`'s
//! `quantization_config` (`bits`, `head_bits`) against the K the trellis shapes say, and
//! `*.safetensors` files or tensors in the model folder that are not part of the model (vLLM
//! loads them and fails with "no module or parameter named …").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::common_ckpt;

use std::path::Path;

use common_ckpt::{packed, spec, tiny_deepseek, write_checkpoint, write_safetensors, Marker, Rng};
use serde_json::json;
use spark_kit::checkpoint::exl3_audit::{audit, AuditOptions, AuditReport, Severity};
use spark_kit::checkpoint::Checkpoint;

fn run_audit(dir: &Path) -> AuditReport {
    audit(&Checkpoint::open(dir).unwrap(), &AuditOptions::default()).unwrap()
}

fn messages(r: &AuditReport, sev: Severity) -> Vec<String> {
    r.findings.iter().filter(|f| f.severity == sev).map(|f| f.message.clone()).collect()
}

fn tiny_dir(seed: u64) -> (tempfile::TempDir, Vec<std::path::PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_checkpoint(dir.path(), &tiny_deepseek(&mut Rng::new(seed)), 3);
    (dir, paths)
}

fn write_config(dir: &Path, q: serde_json::Value) {
    std::fs::write(dir.join("config.json"), json!({"model_type": "deepseek_v4", "quantization_config": q}).to_string())
        .unwrap();
}

#[test]
fn head_bits_in_config_must_match_the_head_trellis() {
    let (dir, _) = tiny_dir(11);
    // The tiny checkpoint's head is K = 6.
    write_config(dir.path(), json!({"quant_method": "exl3", "head_bits": 6}));
    assert!(run_audit(dir.path()).findings.is_empty(), "{:#?}", run_audit(dir.path()).findings);
    write_config(dir.path(), json!({"quant_method": "exl3", "head_bits": 4}));
    let errs = messages(&run_audit(dir.path()), Severity::Error);
    let cfg = dir.path().join("config.json");
    let want =
        format!("{}: `quantization_config.head_bits` is 4, but the head's trellis says K = 6 (`head`)", cfg.display());
    assert!(errs.iter().any(|m| m.starts_with(&want)), "{errs:#?}");
}

#[test]
fn bits_in_config_must_match_the_trellis() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(12);
    let mut specs = Vec::new();
    for l in 0..2 {
        packed(&mut specs, &mut rng, &format!("model.layers.{l}.mlp.down_proj"), 256, 256, 48, Marker::Mul1);
    }
    packed(&mut specs, &mut rng, "lm_head", 256, 512, 96, Marker::Mul1);
    write_safetensors(&dir.path().join("model.safetensors"), &specs);
    write_config(dir.path(), json!({"quant_method": "exl3", "bits": 3.0, "head_bits": 6}));
    assert!(run_audit(dir.path()).findings.is_empty(), "{:#?}", run_audit(dir.path()).findings);
    write_config(dir.path(), json!({"quant_method": "exl3", "bits": 4.0, "head_bits": 6}));
    let errs = messages(&run_audit(dir.path()), Severity::Error);
    assert!(
        errs.iter().any(|m| m.contains("`quantization_config.bits` is 4, but the trellis says K = 3")
            && m.contains("2 matrices")
            && m.contains("`model.layers.0.mlp.down_proj`")),
        "{errs:#?}"
    );
    // A config that is not EXL3's (or has no quantization_config) is not judged.
    write_config(dir.path(), json!({"quant_method": "fp8", "bits": 8}));
    assert!(run_audit(dir.path()).findings.is_empty());
}

#[test]
fn stray_safetensors_without_an_index_is_an_error_naming_the_file() {
    let (dir, _) = tiny_dir(13);
    let stray = dir.path().join("ground_truth.safetensors");
    write_safetensors(&stray, &[spec(&mut Rng::new(9), "lm_head.weight_exllamav3", "F16", &[4])]);
    let r = run_audit(dir.path());
    let errs = messages(&r, Severity::Error);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].starts_with(&format!("{}: not part of the model", stray.display()))
            && errs[0].contains("`lm_head.weight_exllamav3`")
            && errs[0].contains("move it out"),
        "{errs:#?}"
    );
    // Next to a single model.safetensors too.
    let dir = tempfile::tempdir().unwrap();
    let mut specs = Vec::new();
    packed(&mut specs, &mut Rng::new(3), "lm_head", 256, 512, 96, Marker::Mul1);
    write_safetensors(&dir.path().join("model.safetensors"), &specs);
    write_safetensors(&dir.path().join("extra.safetensors"), &[spec(&mut Rng::new(4), "x", "F16", &[4])]);
    let errs = messages(&run_audit(dir.path()), Severity::Error);
    assert!(errs.len() == 1 && errs[0].contains("extra.safetensors") && errs[0].contains("`x`"), "{errs:#?}");
}

#[test]
fn tensors_the_index_does_not_claim_are_an_error_and_unlisted_files_a_warning() {
    let (dir, paths) = tiny_dir(14);
    let mut weight_map = serde_json::Map::new();
    for p in &paths {
        for t in Checkpoint::open(p).unwrap().tensors {
            weight_map.insert(t.name, json!(p.file_name().unwrap().to_str().unwrap()));
        }
    }
    let index = dir.path().join("model.safetensors.index.json");
    std::fs::write(&index, json!({"metadata": {}, "weight_map": weight_map}).to_string()).unwrap();
    assert!(run_audit(dir.path()).findings.is_empty(), "{:#?}", run_audit(dir.path()).findings);
    // A file the index does not name: vLLM skips it (it filters by the index), so a warning.
    let stray = dir.path().join("ground_truth.safetensors");
    write_safetensors(&stray, &[spec(&mut Rng::new(9), "x", "F16", &[4])]);
    let r = run_audit(dir.path());
    assert!(messages(&r, Severity::Error).is_empty(), "{:#?}", r.findings);
    let warns = messages(&r, Severity::Warning);
    assert!(warns.iter().any(|m| m.starts_with(&format!("{}: not in", stray.display()))), "{warns:#?}");
    // A tensor in a listed shard that the weight_map does not claim: vLLM loads it and fails.
    let (first, _) = weight_map.iter().next().map(|(k, v)| (k.clone(), v.clone())).unwrap();
    weight_map.remove(&first);
    std::fs::write(&index, json!({"metadata": {}, "weight_map": weight_map}).to_string()).unwrap();
    let errs = messages(&run_audit(dir.path()), Severity::Error);
    assert!(
        errs.iter().any(|m| m.contains(&format!("`{first}`")) && m.contains("not in") && m.contains("weight_map")),
        "{errs:#?}"
    );
}

#[test]
fn real_fixture_with_its_ground_truth_inside_is_flagged() {
    let Some((tmp, dir)) = common_ckpt::real_fixture() else { return };
    assert!(run_audit(&dir).findings.is_empty(), "{:#?}", run_audit(&dir).findings);
    let inside = dir.join("ground_truth_weights.safetensors");
    std::fs::copy(common_ckpt::real_fixture_truth(tmp.path()), &inside).unwrap();
    let errs = messages(&run_audit(&dir), Severity::Error);
    assert!(
        errs.len() == 1 && errs[0].starts_with(&format!("{}: not part of the model", inside.display())),
        "{errs:#?}"
    );
    std::fs::remove_file(&inside).unwrap();
    // The fixture's config.json says bits 3.0, head_bits 6: consistent. Claim head_bits 4.
    let cfg = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["quantization_config"]["head_bits"] = json!(4);
    std::fs::write(&cfg, v.to_string()).unwrap();
    let errs = messages(&run_audit(&dir), Severity::Error);
    assert!(
        errs.iter().any(|m| m.contains("`quantization_config.head_bits` is 4") && m.contains("`lm_head`")),
        "{errs:#?}"
    );
}

#[test]
fn k_map_disagreement_of_one_matrix_says_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let mut specs = Vec::new();
    packed(&mut specs, &mut Rng::new(5), "lm_head", 256, 1024, 96, Marker::Mul1);
    write_safetensors(&dir.path().join("model.safetensors"), &specs);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spark-kit"))
        .args(["verify", "--structure", "--kit", "tiny-cpu", "--set", "model.k_map.head=4", "--model"])
        .arg(dir.path())
        .env_clear()
        .env("HOME", dir.path())
        .output()
        .unwrap();
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{o}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(o.contains("k_map `head` = 4, trellis K = 6 (1 matrix, e.g. `lm_head`)"), "{o}");
}
