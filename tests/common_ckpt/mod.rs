//! Test-data generator: small, shape-faithful EXL3 checkpoints as real safetensors files
//! (real packed shapes, real codebook markers, random bytes elsewhere), the broken variants the
//! audit must catch, and sparse full-size shards laid out from a virtual checkpoint.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use spark_kit::checkpoint::exl3_audit::{MCG_MARKER, MUL1_MARKER};
use spark_kit::checkpoint::Checkpoint;

/// xorshift64*: deterministic random bytes without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// One tensor to write.
#[derive(Clone, Debug)]
pub struct Spec {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
}

fn elem_bytes(dtype: &str) -> u64 {
    match dtype {
        "I16" | "F16" | "BF16" | "U16" => 2,
        "I32" | "F32" | "U32" => 4,
        "I64" | "F64" | "U64" => 8,
        _ => 1,
    }
}

pub fn spec(rng: &mut Rng, name: &str, dtype: &'static str, shape: &[u64]) -> Spec {
    let n = shape.iter().product::<u64>() * elem_bytes(dtype);
    Spec { name: name.to_string(), dtype, shape: shape.to_vec(), data: rng.bytes(n as usize) }
}

/// Which marker a packed matrix gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    Mul1,
    Mcg,
    None,
}

/// One EXL3 linear as exllamav3 writes it: suh, svh, marker, trellis `[Kp/16, Np/16, last]`.
pub fn packed(out: &mut Vec<Spec>, rng: &mut Rng, prefix: &str, in_f: u64, out_f: u64, last: u64, marker: Marker) {
    let (kp, np) = (in_f.div_ceil(128) * 128, out_f.div_ceil(128) * 128);
    out.push(spec(rng, &format!("{prefix}.suh"), "F16", &[kp]));
    out.push(spec(rng, &format!("{prefix}.svh"), "F16", &[np]));
    match marker {
        Marker::Mul1 => {
            out.push(Spec { name: format!("{prefix}.mul1"), dtype: "I32", shape: vec![], data: MUL1_MARKER.to_vec() })
        }
        Marker::Mcg => {
            out.push(Spec { name: format!("{prefix}.mcg"), dtype: "I32", shape: vec![], data: MCG_MARKER.to_vec() })
        }
        Marker::None => {}
    }
    out.push(spec(rng, &format!("{prefix}.trellis"), "I16", &[kp / 16, np / 16, last]));
}

/// Dims of the tiny DeepSeek-named model.
pub const HIDDEN: u64 = 256;
pub const EXPERT_I: u64 = 128;
pub const EXPERTS: u64 = 4;
pub const VOCAB: u64 = 512;

/// A tiny DeepSeek V4.1-named EXL3 checkpoint: 2 layers (+ MTP block 0 at layer index 2 when
/// `num_hidden_layers` = 2), 4 routed experts, shared expert, attention, indexer, Engram wkv on
/// layer 1, head. K: routed 3 (layer 1: 2.5 → half-K, MUL1), shared 4, attention 5, indexer 8,
/// engram 5, mtp 4, head 6.
pub fn tiny_deepseek(rng: &mut Rng) -> Vec<Spec> {
    let mut v = Vec::new();
    v.push(spec(rng, "embed.weight", "BF16", &[VOCAB, HIDDEN]));
    for layer in 0..2u64 {
        let b = format!("layers.{layer}");
        v.push(spec(rng, &format!("{b}.attn_norm.weight"), "BF16", &[HIDDEN]));
        packed(&mut v, rng, &format!("{b}.attn.wq_a"), HIDDEN, 128, 80, Marker::Mul1);
        packed(&mut v, rng, &format!("{b}.attn.wq_b"), 128, 256, 80, Marker::Mul1);
        packed(&mut v, rng, &format!("{b}.attn.wkv"), HIDDEN, 128, 80, Marker::Mul1);
        for g in 0..2 {
            packed(&mut v, rng, &format!("{b}.attn.wo_a.slice.{g}"), 128, 128, 80, Marker::Mul1);
        }
        packed(&mut v, rng, &format!("{b}.attn.wo_b"), 256, HIDDEN, 80, Marker::Mul1);
        packed(&mut v, rng, &format!("{b}.attn.indexer.wk"), HIDDEN, 128, 128, Marker::Mul1);
        v.push(spec(rng, &format!("{b}.attn.indexer.weights_proj.weight"), "BF16", &[4, HIDDEN]));
        if layer == 1 {
            packed(&mut v, rng, &format!("{b}.engram.wkv"), 256, HIDDEN, 80, Marker::Mul1);
        }
        v.push(spec(rng, &format!("{b}.ffn.gate.weight"), "BF16", &[EXPERTS, HIDDEN]));
        v.push(spec(rng, &format!("{b}.ffn.gate.bias"), "F32", &[EXPERTS]));
        let routed_last = if layer == 1 { 40 } else { 48 };
        for e in 0..EXPERTS {
            let p = format!("{b}.ffn.experts.{e}");
            packed(&mut v, rng, &format!("{p}.w1"), HIDDEN, EXPERT_I, routed_last, Marker::Mul1);
            packed(&mut v, rng, &format!("{p}.w3"), HIDDEN, EXPERT_I, routed_last, Marker::Mul1);
            packed(&mut v, rng, &format!("{p}.w2"), EXPERT_I, HIDDEN, routed_last, Marker::Mul1);
        }
        let p = format!("{b}.ffn.shared_experts");
        packed(&mut v, rng, &format!("{p}.w1"), HIDDEN, EXPERT_I, 64, Marker::Mul1);
        packed(&mut v, rng, &format!("{p}.w3"), HIDDEN, EXPERT_I, 64, Marker::Mul1);
        packed(&mut v, rng, &format!("{p}.w2"), EXPERT_I, HIDDEN, 64, Marker::Mul1);
        v.push(spec(rng, &format!("{b}.ffn_norm.weight"), "BF16", &[HIDDEN]));
    }
    packed(&mut v, rng, "mtp.0.main_proj", 2 * HIDDEN, HIDDEN, 64, Marker::Mul1);
    packed(&mut v, rng, "mtp.0.attn.wq_b", 128, 256, 64, Marker::Mul1);
    packed(&mut v, rng, "mtp.0.ffn.experts.0.w1", HIDDEN, EXPERT_I, 64, Marker::Mul1);
    v.push(spec(rng, "norm.weight", "BF16", &[HIDDEN]));
    packed(&mut v, rng, "head", HIDDEN, VOCAB, 96, Marker::Mul1);
    v
}

/// The header JSON exllamav3's writer produces: minified, no `__metadata__`, contiguous data.
pub fn header_json(specs: &[Spec]) -> String {
    let mut map = Map::new();
    let mut off = 0u64;
    for s in specs {
        let end = off + s.data.len() as u64;
        map.insert(s.name.clone(), json!({"dtype": s.dtype, "shape": s.shape, "data_offsets": [off, end]}));
        off = end;
    }
    Value::Object(map).to_string()
}

/// Write one safetensors file.
pub fn write_safetensors(path: &Path, specs: &[Spec]) {
    let header = header_json(specs);
    let mut f = File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    for s in specs {
        f.write_all(&s.data).unwrap();
    }
}

/// Write `specs` as `shards` files `model-0000i-of-0000N.safetensors` (modules kept together).
pub fn write_checkpoint(dir: &Path, specs: &[Spec], shards: usize) -> Vec<PathBuf> {
    let per = specs.len().div_ceil(shards);
    let mut paths = Vec::new();
    let mut start = 0;
    for i in 0..shards {
        let mut end = (start + per).min(specs.len());
        let module = |s: &Spec| s.name.rsplit_once('.').map(|(p, _)| p.to_string());
        while end < specs.len() && end > start && module(&specs[end]) == module(&specs[end - 1]) {
            end += 1;
        }
        let path = dir.join(format!("model-{:05}-of-{:05}.safetensors", i + 1, shards));
        write_safetensors(&path, &specs[start..end]);
        paths.push(path);
        start = end;
    }
    paths
}

/// Rewrite a file's header JSON (keeping the data area), for broken variants.
pub fn rewrite_header(path: &Path, edit: impl FnOnce(&mut Map<String, Value>)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let text = Value::Object(header).to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

/// Full-size shards with real headers and real marker bytes, every other byte a hole: the
/// layout of a virtual checkpoint made real at ~0 disk cost. Returns the apparent total size.
pub fn write_sparse(dir: &Path, ckpt: &Checkpoint, markers: &HashMap<String, [u8; 4]>) -> u64 {
    let mut total = 0;
    for (i, shard) in ckpt.shards.iter().enumerate() {
        let tensors: Vec<_> = ckpt.tensors.iter().filter(|t| t.shard == i).collect();
        let mut map = Map::new();
        for t in &tensors {
            map.insert(
                t.name.clone(),
                json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [t.begin, t.end]}),
            );
        }
        let header = Value::Object(map).to_string();
        let path = dir.join(shard.path.file_name().unwrap());
        let mut f = OpenOptions::new().create(true).truncate(true).write(true).open(&path).unwrap();
        f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
        f.write_all(header.as_bytes()).unwrap();
        let data_start = 8 + header.len() as u64;
        f.set_len(data_start + shard.file_len).unwrap();
        for t in &tensors {
            if let Some(m) = markers.get(&t.name) {
                f.seek(SeekFrom::Start(data_start + t.begin)).unwrap();
                f.write_all(m).unwrap();
            }
        }
        total += data_start + shard.file_len;
    }
    total
}

/// Where the shared fixtures are: `$SPARK_KIT_TEST_FIXTURES`, else `<crate>/../shared/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("SPARK_KIT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures"))
}

/// The real exllamav3 fixture (`exl3-tiny-llama-b3.tar.gz`) extracted into a temp dir: the dir
/// (kept alive by the returned guard) and its `shared-b3-exl3` checkpoint directory. `None`, with
/// a printed reason, when the archive is absent (CI always has it; a bare checkout might not).
pub fn real_fixture() -> Option<(tempfile::TempDir, PathBuf)> {
    let archive = fixtures_dir().join("exl3-tiny-llama-b3.tar.gz");
    if !archive.is_file() {
        println!("SKIPPED: {} not found (set SPARK_KIT_TEST_FIXTURES)", archive.display());
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ok = std::process::Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(tmp.path()).status().unwrap();
    assert!(ok.success(), "cannot extract {}", archive.display());
    let dir = tmp.path().join("shared-b3-exl3");
    // exllamav3's reconstruction of the head is a test artefact, not part of the model: vLLM would
    // load it from the model folder (and the audit flags it there). It lives beside the folder.
    std::fs::rename(dir.join("ground_truth_weights.safetensors"), real_fixture_truth(tmp.path())).unwrap();
    Some((tmp, dir))
}

/// Where [`real_fixture`] keeps exllamav3's reconstructed weights (`ground_truth_weights.safetensors`).
pub fn real_fixture_truth(tmp: &Path) -> PathBuf {
    tmp.join("ground_truth_weights.safetensors")
}
