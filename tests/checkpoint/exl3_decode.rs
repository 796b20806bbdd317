//! The Rust EXL3 decoder (src/checkpoint/exl3_decode) against three independent truths:
//! exllamav3's kernels (committed fixture cases from python_overlay/tests/gpu/), the Python reference decoder on
//! random packs from its packer, and exllamav3's reconstruction of a real converted checkpoint's
//! head. Tensors are read with the project's own safetensors parser.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::common;
use crate::common_ckpt;

use std::path::{Path, PathBuf};
use std::process::Command;

use spark_kit::checkpoint::exl3_audit::Codebook;
use spark_kit::checkpoint::exl3_decode::{fp16, full_weight, full_weight_fp16, w_hat, Dims};
use spark_kit::checkpoint::tensor_data::{le_u16, TensorData};
use spark_kit::checkpoint::Checkpoint;

fn u16s(ckpt: &Checkpoint, name: &str) -> Vec<u16> {
    let t = ckpt.get(name).unwrap_or_else(|| panic!("{name} missing"));
    le_u16(&TensorData::new(ckpt).read_all(t).unwrap())
}

fn f32s(ckpt: &Checkpoint, name: &str) -> Vec<f32> {
    let t = ckpt.get(name).unwrap();
    TensorData::new(ckpt)
        .read_all(t)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn codebook(name: &str) -> Codebook {
    match name {
        "3inst" => Codebook::ThreeInst,
        "mcg" => Codebook::Mcg,
        "mul1" => Codebook::Mul1,
        other => panic!("codebook {other}"),
    }
}

fn decode(ckpt: &Checkpoint, prefix: &str, cb: Codebook) -> (Dims, Vec<u16>) {
    let dims = Dims::from_shape(&ckpt.get(&format!("{prefix}.trellis")).unwrap().shape, prefix).unwrap();
    let w = w_hat(&u16s(ckpt, &format!("{prefix}.trellis")), dims, cb, prefix).unwrap();
    (dims, w)
}

/// max |a − b| / max |b|.
fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    let num = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    num / b.iter().map(|y| y.abs()).fold(0.0, f64::max)
}

#[test]
fn kernel_fixture_cases_are_bit_exact() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("python_overlay/tests/data/exl3_kernel_cases.safetensors");
    let ckpt = Checkpoint::open(&path).unwrap();
    let mut cases: Vec<&str> = ckpt.tensors.iter().filter_map(|t| t.name.strip_suffix(".trellis")).collect();
    cases.sort_unstable();
    assert_eq!(cases.len(), 8, "{cases:?}");
    let mut fused = 0;
    for case in cases {
        let cb = codebook(case.split('_').next().unwrap());
        let (dims, ours) = decode(&ckpt, case, cb);
        let theirs = u16s(&ckpt, &format!("{case}.w_hat"));
        let diff = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count();
        assert_eq!(diff, 0, "{case}: {diff} of {} W_hat values differ from exllamav3's", theirs.len());
        // Another codebook must not match (the check can fail).
        let other = if cb == Codebook::Mul1 { Codebook::Mcg } else { Codebook::Mul1 };
        let (_, wrong) = decode(&ckpt, case, other);
        assert!(wrong.iter().zip(&theirs).filter(|(a, b)| a != b).count() > theirs.len() / 2, "{case}");
        let key = format!("{case}.w_full_fused");
        if ckpt.get(&key).is_some() {
            let (suh, svh) = (u16s(&ckpt, &format!("{case}.suh")), u16s(&ckpt, &format!("{case}.svh")));
            let w = full_weight(&ours, dims.rows(), dims.cols(), &suh, &svh, case).unwrap();
            let kernel: Vec<f64> = u16s(&ckpt, &key).iter().map(|&b| fp16::to_f64(b)).collect();
            let rel = rel_err(&w, &kernel);
            println!("{case}: full W vs exllamav3's fused reconstruction: max rel err {rel:.2e}");
            assert!(rel < 2e-3, "{case}: {rel}");
            fused += 1;
        }
    }
    assert_eq!(fused, 3);
}

const MAKE_PACKS: &str = r#"
import sys, torch
from safetensors.torch import save_file
from spark_overlay import exl3
gen = torch.Generator().manual_seed(int(sys.argv[2]))
out = {}
for cb in exl3.CODEBOOKS:
    for k in list(range(1, 9)) + ([1.5, 2.5, 3.5] if cb == "mul1" else []):
        key = f"{cb}_k{str(k).replace('.', 'p')}"
        valid, _ = exl3.random_trellis(16, 8, k, gen)
        raw = torch.randint(-32768, 32768, (8, 16, int(16 * k)), generator=gen, dtype=torch.int32).to(torch.int16)
        for kind, tr in (("valid", valid), ("raw", raw)):
            n_in, n_out = 16 * tr.shape[0], 16 * tr.shape[1]
            suh = (torch.randn(n_in, generator=gen) * 0.05).to(torch.float16)
            svh = (torch.randn(n_out, generator=gen)).to(torch.float16)
            p = f"{key}.{kind}"
            out[f"{p}.trellis"] = tr
            out[f"{p}.suh"], out[f"{p}.svh"] = suh, svh
            out[f"{p}.w_hat"] = exl3.weight_hat(tr, cb)
            out[f"{p}.w_full"] = exl3.full_weight(tr, suh, svh, cb)
            out[f"{p}.w_full_fp16"] = exl3.full_weight_fp16(tr, suh, svh, cb)
save_file(out, sys.argv[1])
print(len(out))
"#;

fn venv_python() -> Option<PathBuf> {
    if std::env::var("SPARK_KIT_TEST_E2E").ok().as_deref() != Some("1") {
        println!(
            "SKIPPED: set SPARK_KIT_TEST_E2E=1 to compare with the Python decoder (needs the tiny-cpu engine venv)"
        );
        return None;
    }
    let py = common::venv_python();
    if !py.exists() {
        println!("SKIPPED: no engine venv python at {}", py.display());
        return None;
    }
    Some(py)
}

#[test]
fn rust_equals_python_on_random_packs() {
    let Some(py) = venv_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("packs.safetensors");
    let overlay = Path::new(env!("CARGO_MANIFEST_DIR")).join("python_overlay");
    let out = Command::new(py)
        .args(["-c", MAKE_PACKS])
        .arg(&file)
        .arg("20261202")
        .env("PYTHONPATH", &overlay)
        .output()
        .unwrap();
    assert!(out.status.success(), "python: {}", String::from_utf8_lossy(&out.stderr));
    let ckpt = Checkpoint::open(&file).unwrap();
    let mut prefixes: Vec<&str> = ckpt.tensors.iter().filter_map(|t| t.name.strip_suffix(".trellis")).collect();
    prefixes.sort_unstable();
    assert_eq!(prefixes.len(), 2 * (8 + 8 + 11), "{prefixes:?}");
    let (mut values, mut fp16_diff, mut worst) = (0usize, 0usize, 0f64);
    for p in prefixes {
        let cb = codebook(p.split('_').next().unwrap());
        let (dims, ours) = decode(&ckpt, p, cb);
        let theirs = u16s(&ckpt, &format!("{p}.w_hat"));
        assert_eq!(ours.len(), theirs.len());
        let diff = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count();
        assert_eq!(diff, 0, "{p}: {diff} W_hat values differ from the Python decoder");
        values += ours.len();
        let (suh, svh) = (u16s(&ckpt, &format!("{p}.suh")), u16s(&ckpt, &format!("{p}.svh")));
        let w = full_weight(&ours, dims.rows(), dims.cols(), &suh, &svh, p).unwrap();
        let py_w: Vec<f64> = f32s(&ckpt, &format!("{p}.w_full")).into_iter().map(f64::from).collect();
        let rel = rel_err(&w, &py_w);
        worst = worst.max(rel);
        assert!(rel < 1e-5, "{p}: full W rel err {rel} (float32 reference)");
        let w16 = full_weight_fp16(&ours, dims.rows(), dims.cols(), &suh, &svh, p).unwrap();
        let py16 = u16s(&ckpt, &format!("{p}.w_full_fp16"));
        fp16_diff += w16.iter().zip(&py16).filter(|(a, b)| a != b).count();
    }
    println!("{values} W_hat values bit-exact; full W max rel err {worst:.2e}; fp16 W: {fp16_diff} values differ");
    assert_eq!(fp16_diff, 0, "fp16 W (exllamav3 rounding) differs from the Python decoder's");
}

#[test]
fn real_checkpoint_head_reproduces_exllamav3() {
    let Some((tmp, dir)) = common_ckpt::real_fixture() else { return };
    let ckpt = Checkpoint::open(&dir.join("model.safetensors")).unwrap();
    let truth = Checkpoint::open(&common_ckpt::real_fixture_truth(tmp.path())).unwrap();
    let (dims, ours) = decode(&ckpt, "lm_head", Codebook::Mul1);
    assert_eq!((dims.rows(), dims.cols(), dims.bits.k()), (256, 1024, 6.0));
    let (suh, svh) = (u16s(&ckpt, "lm_head.suh"), u16s(&ckpt, "lm_head.svh"));
    let w16 = full_weight_fp16(&ours, 256, 1024, &suh, &svh, "lm_head").unwrap();
    let theirs = u16s(&truth, "lm_head.weight_exllamav3");
    assert_eq!(theirs.len(), w16.len());
    let differ = w16.iter().zip(&theirs).filter(|(a, b)| a != b).count();
    let w = full_weight(&ours, 256, 1024, &suh, &svh, "lm_head").unwrap();
    let t: Vec<f64> = theirs.iter().map(|&b| fp16::to_f64(b)).collect();
    let rel = rel_err(&w, &t);
    println!("lm_head: fp16 W differs from exllamav3's reconstruction in {differ} of {} values; exact W max rel err {rel:.2e}", theirs.len());
    assert_eq!(differ, 0);
    assert!(rel < 2e-3, "{rel}");
}
