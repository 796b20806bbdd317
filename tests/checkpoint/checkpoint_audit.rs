//! Safetensors header reader and EXL3 structural audit, on generated checkpoints (valid and
//! broken), on the real exllamav3 fixture, and on 10k mutated headers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::common_ckpt;

use std::collections::BTreeMap;
use std::path::Path;

use common_ckpt::{packed, rewrite_header, spec, tiny_deepseek, write_checkpoint, write_safetensors, Marker, Rng};
use serde_json::{json, Value};
use spark_kit::checkpoint::budget::weight_budget;
use spark_kit::checkpoint::exl3_audit::{audit, AuditOptions, AuditReport, Codebook, Severity};
use spark_kit::checkpoint::names::Class;
use spark_kit::checkpoint::safetensors::parse_shard_bytes;
use spark_kit::checkpoint::Checkpoint;

fn run_audit(dir: &Path) -> AuditReport {
    let ckpt = Checkpoint::open(dir).unwrap();
    audit(&ckpt, &AuditOptions::default()).unwrap()
}

fn errors(r: &AuditReport) -> Vec<String> {
    r.findings.iter().filter(|f| f.severity == Severity::Error).map(|f| f.message.clone()).collect()
}

fn tiny_dir(seed: u64) -> (tempfile::TempDir, Vec<std::path::PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let specs = tiny_deepseek(&mut Rng::new(seed));
    let paths = write_checkpoint(dir.path(), &specs, 3);
    (dir, paths)
}

#[test]
fn valid_tiny_checkpoint_audits_clean() {
    let (dir, _) = tiny_dir(1);
    let r = run_audit(dir.path());
    assert_eq!(r.errors(), 0, "{:#?}", r.findings);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert_eq!(r.shards, 3);
    // 2 layers × (6 attention + 1 indexer + 12 routed + 3 shared) + engram + 3 mtp + head.
    assert_eq!(r.packed_matrices, 2 * (6 + 1 + 12 + 3) + 1 + 3 + 1);
    // embed, norm, 2 × (attn_norm, weights_proj, gate w+b, ffn_norm).
    assert_eq!(r.native_tensors, 2 + 2 * 5);
    assert_eq!(r.codebooks.get(&Codebook::Mul1), Some(&r.packed_matrices));
    assert!(r.markers_checked);
    let routed = r.class(Class::RoutedExperts).unwrap();
    assert_eq!(routed.packed_matrices, 24);
    // Half the routed weights at K=3, half at K=2.5.
    assert!((routed.bpw - 2.75).abs() < 1e-9, "{}", routed.bpw);
    assert_eq!(routed.k_counts.get("2.5"), Some(&12));
    assert!((r.class(Class::Head).unwrap().bpw - 6.0).abs() < 1e-9);
    assert!((r.class(Class::Indexer).unwrap().bpw - 8.0).abs() < 1e-9);
    assert!((r.class(Class::Attention).unwrap().bpw - 5.0).abs() < 1e-9);
    assert_eq!(r.class(Class::Mtp).unwrap().packed_matrices, 3);
    assert_eq!(r.class(Class::EngramWkv).unwrap().packed_matrices, 1);
    let total: u64 = r.classes.iter().map(|c| c.bytes).sum();
    assert_eq!(total, r.total_bytes);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["codebooks"]["mul1"], json!(r.packed_matrices));
}

#[test]
fn k_map_disagreements_are_reported_and_the_trellis_wins() {
    let (dir, _) = tiny_dir(2);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let mut k_map = BTreeMap::new();
    k_map.insert("routed".to_string(), 3.0);
    k_map.insert("attention".to_string(), 5.0);
    k_map.insert("shared.1".to_string(), 5.0);
    k_map.insert("bogus".to_string(), 2.0);
    let r = audit(&ckpt, &AuditOptions { k_map }).unwrap();
    let d = &r.k_map_disagreements;
    assert_eq!(d.len(), 2, "{d:#?}");
    let routed = d.iter().find(|x| x.class == Class::RoutedExperts).unwrap();
    assert_eq!((routed.layer, routed.expected, routed.trellis, routed.matrices), (Some(1), 3.0, 2.5, 12));
    assert_eq!(routed.key, "routed");
    let shared = d.iter().find(|x| x.class == Class::SharedExperts).unwrap();
    assert_eq!((shared.key.as_str(), shared.expected, shared.trellis, shared.matrices), ("shared.1", 5.0, 4.0, 3));
    assert!(r.findings.iter().any(|f| f.message.contains("k_map key `bogus` names no matrix class")));
    // The trellis wins: bits per weight are what the trellis says.
    assert!((r.class(Class::RoutedExperts).unwrap().bpw - 2.75).abs() < 1e-9);
}

#[test]
fn budget_splits_tiny_checkpoint() {
    let (dir, _) = tiny_dir(3);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let one = weight_budget(&ckpt, 1, 40).unwrap();
    let two = weight_budget(&ckpt, 2, 40).unwrap();
    assert_eq!(one.per_rank_bytes, one.total_bytes);
    assert!(two.per_rank_bytes < one.per_rank_bytes);
    // Routed experts: trellis split in half; suh of w1/w3 and svh of w2 + markers replicated.
    let r1 = one.class(Class::RoutedExperts).unwrap();
    let r2 = two.class(Class::RoutedExperts).unwrap();
    let per_expert_layer0 = |last: u64| -> u64 {
        let t = 16 * 8 * last * 2; // trellis [16, 8, last] I16 (256×128) and [8, 16, last]
        let vectors = 2 * (256 + 128); // suh + svh of one matrix
        3 * (t + vectors + 4)
    };
    assert_eq!(r1.total_bytes, 4 * per_expert_layer0(48) + 4 * per_expert_layer0(40));
    let replicated_vectors = 4 * (2 * (256 + 256 + 256) + 3 * 4); // per layer: w1/w3 suh, w2 svh, markers
    let split_part = |last: u64| 4 * (3 * 16 * 8 * last + 128 + 128 + 128); // half trellis ×3, half svh/svh/suh
    assert_eq!(r2.per_rank_bytes, 2 * replicated_vectors + split_part(48) + split_part(40));
    assert_eq!(two.excluded_bytes, 0);
}

#[test]
fn index_json_names_the_shards() {
    let (dir, paths) = tiny_dir(4);
    let extra = dir.path().join("ground_truth.safetensors");
    write_safetensors(&extra, &[spec(&mut Rng::new(9), "x", "F16", &[4])]);
    // Without an index, `model-*` shards are used and the stray file is ignored.
    assert_eq!(Checkpoint::open(dir.path()).unwrap().shards.len(), 3);
    let mut weight_map = serde_json::Map::new();
    for p in &paths {
        let header = Checkpoint::open(p).unwrap();
        for t in header.tensors {
            weight_map.insert(t.name, json!(p.file_name().unwrap().to_str().unwrap()));
        }
    }
    let index = dir.path().join("model.safetensors.index.json");
    std::fs::write(&index, json!({"metadata": {}, "weight_map": weight_map}).to_string()).unwrap();
    assert_eq!(Checkpoint::open(dir.path()).unwrap().shards.len(), 3);
    // An index entry whose shard lacks the tensor: the download is incomplete.
    let mut stale = weight_map.clone();
    stale.insert("head.trellis".into(), json!("model-00001-of-00003.safetensors"));
    std::fs::write(&index, json!({"weight_map": stale}).to_string()).unwrap();
    let e = Checkpoint::open(dir.path()).unwrap_err().to_string();
    let want = format!(
        "`weight_map` puts `head.trellis` in `model-00001-of-00003.safetensors`, but it is in `{}`",
        paths[2].display()
    );
    assert!(e.ends_with(&want), "{e}");
    std::fs::write(&index, json!({"metadata": {}, "weight_map": weight_map}).to_string()).unwrap();
    std::fs::remove_file(&paths[1]).unwrap();
    let e = Checkpoint::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("model-00002-of-00003.safetensors") && e.contains("missing"), "{e}");
}

// ---- broken variants: each with the message a user sees ----

fn single_file_with(edit: impl FnOnce(&mut Vec<common_ckpt::Spec>, &mut Rng)) -> (tempfile::TempDir, AuditReport) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(11);
    let mut specs = Vec::new();
    packed(&mut specs, &mut rng, "layers.0.ffn.experts.0.w1", 256, 128, 48, Marker::Mul1);
    packed(&mut specs, &mut rng, "layers.0.ffn.experts.0.w2", 128, 256, 48, Marker::Mul1);
    edit(&mut specs, &mut rng);
    write_safetensors(&dir.path().join("model.safetensors"), &specs);
    let r = run_audit(dir.path());
    (dir, r)
}

#[test]
fn broken_wrong_trellis_last_dim() {
    let (_d, r) = single_file_with(|specs, rng| {
        let i = specs.iter().position(|s| s.name == "layers.0.ffn.experts.0.w1.trellis").unwrap();
        specs[i] = spec(rng, "layers.0.ffn.experts.0.w1.trellis", "I16", &[16, 8, 50]);
    });
    let e = errors(&r);
    assert_eq!(e.len(), 1, "{e:#?}");
    assert_eq!(
        e[0],
        "`layers.0.ffn.experts.0.w1.trellis` last dim 50 is not 16·K for a valid K (16..128 step 16, or 24/40/56 for K 1.5/2.5/3.5)"
    );
    assert_eq!(r.findings[0].tensor.as_deref(), Some("layers.0.ffn.experts.0.w1.trellis"));
}

#[test]
fn broken_marker_of_the_wrong_dtype() {
    let (_d, r) = single_file_with(|specs, _| {
        let m = specs.iter_mut().find(|s| s.name == "layers.0.ffn.experts.0.w2.mul1").unwrap();
        m.dtype = "F32";
    });
    assert_eq!(errors(&r), ["codebook marker `layers.0.ffn.experts.0.w2.mul1` is F32 [], expected a 0-d I32 scalar"]);
}

#[test]
fn broken_marker_value() {
    let (_d, r) = single_file_with(|specs, _| {
        let m = specs.iter_mut().find(|s| s.name == "layers.0.ffn.experts.0.w2.mul1").unwrap();
        m.data = 0x83D6_B12D_u32.to_le_bytes().to_vec(); // the reference kit's wrong constant (E.1)
    });
    assert_eq!(
        errors(&r),
        ["codebook marker `layers.0.ffn.experts.0.w2.mul1` holds 0x83D6B12D, expected 0x83DCD12D (packed ABI mismatch)"]
    );
}

#[test]
fn broken_missing_svh() {
    let (_d, r) = single_file_with(|specs, _| specs.retain(|s| s.name != "layers.0.ffn.experts.0.w1.svh"));
    assert_eq!(
        errors(&r),
        ["packed matrix `layers.0.ffn.experts.0.w1` has no `layers.0.ffn.experts.0.w1.svh` (F16 [128])"]
    );
}

#[test]
fn broken_half_k_without_mul1_and_mixed_codebooks() {
    let (_d, r) = single_file_with(|specs, rng| {
        packed(specs, rng, "layers.0.ffn.experts.1.w1", 256, 128, 40, Marker::Mcg);
    });
    assert_eq!(
        errors(&r),
        ["`layers.0.ffn.experts.1.w1.trellis` has half-integer K = 2.5, which needs a `layers.0.ffn.experts.1.w1.mul1` marker (found mcg)"]
    );
    assert!(r
        .findings
        .iter()
        .any(|f| f.severity == Severity::Warning && f.message.starts_with("mixed codebooks: 2 mul1")));
}

#[test]
fn oddities_orphans_native_beside_trellis_and_native_where_packed_expected() {
    let (_d, r) = single_file_with(|specs, rng| {
        specs.push(spec(rng, "layers.0.ffn.experts.0.w1.weight", "F16", &[128, 256]));
        specs.push(spec(rng, "layers.0.ffn.experts.5.w3.suh", "F16", &[256]));
        specs.push(spec(rng, "layers.0.ffn.experts.2.w1.weight", "BF16", &[128, 256]));
        specs.push(spec(rng, "layers.0.attn_norm.weight", "BF16", &[256]));
    });
    let msgs: Vec<(Severity, String)> = r.findings.iter().map(|f| (f.severity, f.message.clone())).collect();
    assert!(msgs.contains(&(
        Severity::Error,
        "native BF16 [128, 256] where a packed `layers.0.ffn.experts.2.w1.trellis` is expected (routed_experts matrices are EXL3 elsewhere)".into()
    )), "{msgs:#?}");
    assert!(msgs.contains(&(
        Severity::Warning,
        "native `layers.0.ffn.experts.0.w1.weight` beside `layers.0.ffn.experts.0.w1.trellis`: the loader ignores it"
            .into()
    )));
    assert!(
        msgs.contains(&(Severity::Warning, "orphan `suh`: no `layers.0.ffn.experts.5.w3.trellis` beside it".into()))
    );
    assert_eq!(r.errors(), 1);
}

fn open_err(dir: &Path) -> String {
    Checkpoint::open(dir).unwrap_err().to_string()
}

#[test]
fn broken_overlapping_offsets() {
    let (dir, paths) = tiny_dir(5);
    rewrite_header(&paths[0], |h| {
        let embed = h["embed.weight"]["data_offsets"].clone();
        let norm = h.get_mut("layers.0.attn_norm.weight").unwrap();
        let (b, e) = (embed[1].as_u64().unwrap(), norm["data_offsets"][1].as_u64().unwrap());
        let len = e - norm["data_offsets"][0].as_u64().unwrap();
        norm["data_offsets"] = json!([b - 2, b - 2 + len]);
    });
    let e = open_err(dir.path());
    let p = paths[0].display();
    assert!(e.starts_with(&format!("{p}: tensor `layers.0.attn_norm.weight` [")), "{e}");
    assert!(e.ends_with(") overlaps tensor `embed.weight` (ends at 262144)"), "{e}");
}

#[test]
fn broken_truncated_shard() {
    let (dir, paths) = tiny_dir(6);
    let len = std::fs::metadata(&paths[2]).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&paths[2]).unwrap();
    f.set_len(len - 100).unwrap();
    let e = open_err(dir.path());
    assert!(e.starts_with(&format!("{}: tensor `head.trellis`: data ends at byte", paths[2].display())), "{e}");
    assert!(e.ends_with("data bytes (truncated shard?)"), "{e}");
}

#[test]
fn broken_header_length_beyond_the_file() {
    let (dir, paths) = tiny_dir(7);
    let mut bytes = std::fs::read(&paths[1]).unwrap();
    let len = bytes.len() as u64;
    bytes[..8].copy_from_slice(&(len).to_le_bytes());
    std::fs::write(&paths[1], &bytes).unwrap();
    assert_eq!(
        open_err(dir.path()),
        format!(
            "{}: header length {len} runs past the end of the {len}-byte file (truncated or corrupt shard)",
            paths[1].display()
        )
    );
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&paths[1], &bytes).unwrap();
    assert!(open_err(dir.path()).contains("exceeds the 104857600-byte limit"));
}

#[test]
fn header_errors_name_file_and_tensor() {
    let p = Path::new("s.safetensors");
    let file = |json: &str, data: usize| {
        let mut v = (json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        v.resize(v.len() + data, 0);
        v
    };
    let cases = [
        (r#"{"t":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}}"#, "s.safetensors: tensor `t`: unknown dtype `Q8`"),
        (
            r#"{"t":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}}"#,
            "s.safetensors: tensor `t`: F16 [3] needs 6 bytes but data_offsets span 4",
        ),
        (r#"{"t":{"dtype":"F16","shape":[2],"data_offsets":[4,0]}}"#, "s.safetensors: tensor `t`: data_offsets [4, 0] end before they begin"),
        (r#"{"t":{"dtype":"F16","shape":[-1],"data_offsets":[0,0]}}"#, "s.safetensors: tensor `t`: `shape` holds something other than non-negative integers"),
        (r#"{"t":{"dtype":"F16","shape":[2]}}"#, "s.safetensors: tensor `t`: missing array `data_offsets`"),
        (
            r#"{"t":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#,
            "s.safetensors: tensor `t`: U8 [4294967296, 4294967296] overflows a 64-bit byte count",
        ),
        (r#"{"__metadata__":{"a":1}}"#, "s.safetensors: `__metadata__` key `a` is 1, expected a string"),
        (
            r#"{"t":5}"#,
            "s.safetensors: header is not valid JSON: tensor `t`: invalid type: integer `5`, expected a tensor entry object at line 1 column 6",
        ),
        (r#"[1,2]"#, "s.safetensors: header is not valid JSON: invalid type: sequence, expected a JSON object of tensor entries at line 1 column 0"),
    ];
    for (json, want) in cases {
        let e = parse_shard_bytes(p, &file(json, 8)).unwrap_err().to_string();
        assert_eq!(e, want);
    }
    assert_eq!(
        parse_shard_bytes(p, &[1, 2, 3]).unwrap_err().to_string(),
        "s.safetensors: 3 bytes is too short for a safetensors file (needs an 8-byte header length)"
    );
}

/// 10,000 mutated headers: the parser returns Ok or Err, never panics.
#[test]
fn ten_thousand_mutated_headers_never_panic() {
    let mut rng = Rng::new(0xC0FFEE);
    let mut specs = Vec::new();
    packed(&mut specs, &mut rng, "layers.0.attn.wq_a", 128, 128, 40, Marker::Mul1);
    specs.push(spec(&mut rng, "norm.weight", "BF16", &[8]));
    let header = common_ckpt::header_json(&specs);
    let data: Vec<u8> = specs.iter().flat_map(|s| s.data.clone()).collect();
    let tokens = [
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "-1",
        "0",
        "18446744073709551615",
        "1e30",
        "null",
        "\"F8_E8M0\"",
        "\"__metadata__\"",
        "\"data_offsets\"",
        "\"shape\"",
        "\"dtype\"",
        "\\u0000",
        "99999999999999999999",
    ];
    let path = Path::new("fuzz.safetensors");
    let (mut ok, mut err) = (0, 0);
    for i in 0..10_000u32 {
        let mut h = header.clone().into_bytes();
        for _ in 0..=rng.below(4) {
            let at = rng.below(h.len() as u64 + 1) as usize;
            match rng.below(5) {
                0 if !h.is_empty() => {
                    let at = at.min(h.len() - 1);
                    h[at] = rng.next_u64() as u8;
                }
                1 if !h.is_empty() => {
                    let at = at.min(h.len() - 1);
                    let n = (rng.below(16) as usize).min(h.len() - at);
                    h.drain(at..at + n);
                }
                2 => {
                    let t = tokens[rng.below(tokens.len() as u64) as usize];
                    h.splice(at..at, t.bytes());
                }
                3 => {
                    // Swap a digit run for another number.
                    if let Some(pos) = h.iter().skip(at).position(u8::is_ascii_digit) {
                        let p = at + pos;
                        h[p] = b'0' + rng.below(10) as u8;
                    }
                }
                _ => h.truncate(at),
            }
        }
        let mut len = h.len() as u64;
        if i % 17 == 0 {
            len = rng.next_u64() >> rng.below(64); // a wild length prefix
        }
        let mut file = len.to_le_bytes().to_vec();
        file.extend_from_slice(&h);
        let keep = if i % 13 == 0 { rng.below(data.len() as u64) as usize } else { data.len() };
        file.extend_from_slice(&data[..keep]);
        match parse_shard_bytes(path, &file) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(e.to_string().starts_with("fuzz.safetensors: "), "{e}");
                err += 1;
            }
        }
    }
    println!("mutated headers: {ok} accepted, {err} refused");
    assert!(err > 5_000 && ok > 0, "{ok} ok / {err} err");
}

// ---- the real exllamav3 fixture ----

#[test]
fn real_fixture_exl3_tiny_llama_b3() {
    let Some((_tmp, dir)) = common_ckpt::real_fixture() else { return };
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert_eq!(ckpt.shards.len(), 1, "ground_truth_weights.safetensors must not be taken for a shard");
    let r = audit(&ckpt, &AuditOptions::default()).unwrap();
    assert_eq!(r.tensors, 66);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert_eq!(r.packed_matrices, 15);
    assert_eq!(r.native_tensors, 6);
    assert_eq!(r.codebooks, BTreeMap::from([(Codebook::Mul1, 15)]));
    let attn = r.class(Class::Attention).unwrap();
    assert_eq!((attn.packed_matrices, attn.bpw), (8, 3.0));
    let mlp = r.class(Class::DenseMlp).unwrap();
    assert_eq!((mlp.packed_matrices, mlp.bpw), (6, 3.0));
    let head = r.class(Class::Head).unwrap();
    assert_eq!((head.packed_matrices, head.bpw), (1, 6.0));
    assert_eq!(head.bytes, 256 * 1024 * 6 / 8 + 2 * (256 + 1024) + 4);
    assert_eq!(r.class(Class::Embedding).unwrap().native_tensors, 1);
    assert_eq!(r.class(Class::Norm).unwrap().native_tensors, 5);
    let k_map = BTreeMap::from([("attention".to_string(), 3.0), ("dense_mlp".into(), 4.0), ("head".into(), 6.0)]);
    let r = audit(&ckpt, &AuditOptions { k_map }).unwrap();
    assert_eq!(r.k_map_disagreements.len(), 2, "one per layer: {:#?}", r.k_map_disagreements);
    assert!(r.k_map_disagreements.iter().all(|d| d.class == Class::DenseMlp && d.matrices == 3 && d.trellis == 3.0));
    let json: Value = serde_json::to_value(&r).unwrap();
    assert_eq!(json["classes"][0]["class"], "attention");
    let budget = weight_budget(&ckpt, 2, 40).unwrap();
    assert!(budget.per_rank_bytes < budget.total_bytes);
    println!("fixture: {} bytes total, {} per rank at TP2", budget.total_bytes, budget.per_rank_bytes);

    // The quantization_config.json ledger was consistent above; now break it.
    let ledger_path = dir.join("quantization_config.json");
    let mut ledger: Value = serde_json::from_slice(&std::fs::read(&ledger_path).unwrap()).unwrap();
    let ts = ledger["tensor_storage"].as_object_mut().unwrap();
    ts["lm_head"]["bits_per_weight"] = json!(5);
    ts["model.layers.0.mlp.up_proj"]["mul1_multiplier"] = json!(2_212_286_000u64);
    ts["model.layers.1.mlp.down_proj"]["stored_tensors"]["model.layers.1.mlp.down_proj.suh"]["shape"] = json!([1024]);
    ts["model.layers.1.mlp.down_proj"]["stored_tensors"]["model.layers.1.mlp.down_proj.bias"] =
        json!({"shape": [256], "n_bytes": 512, "dtype": "torch.float16"});
    ledger["codebook"] = json!("mcg");
    std::fs::write(&ledger_path, ledger.to_string()).unwrap();
    let r = audit(&Checkpoint::open(&dir).unwrap(), &AuditOptions::default()).unwrap();
    let f = ledger_path.display();
    let msgs: Vec<(Severity, String)> = r.findings.iter().map(|x| (x.severity, x.message.clone())).collect();
    let want = [
        (Severity::Error, format!("`model.layers.1.mlp.down_proj.suh` is [512] in its shard but [1024] in {f} (shards from different conversions?)")),
        (Severity::Error, format!("`model.layers.0.mlp.up_proj`: {f} has mul1_multiplier 2212286000, not the kernel constant 2212286765 (a custom-multiplier file decodes wrongly)")),
        (Severity::Error, format!("{f} lists 1 tensor(s) that no shard holds (incomplete checkpoint?), e.g. `model.layers.1.mlp.down_proj.bias`")),
        (Severity::Warning, format!("{f}: `codebook` is `mcg` but the markers say mul1 (markers decide)")),
        (Severity::Warning, format!("`lm_head`: {f} says bits_per_weight 5, the trellis says K = 6 (the trellis wins)")),
    ];
    for w in &want {
        assert!(msgs.contains(w), "missing {w:?} in {msgs:#?}");
    }
    assert_eq!(msgs.len(), want.len(), "{msgs:#?}");
}

#[test]
fn gaps_beyond_alignment_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    // a: [0, 6), 2 bytes of padding to 8, b: [8, 12), then 20 stray bytes.
    let json = r#"{"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    bytes.resize(bytes.len() + 32, 0);
    std::fs::write(&file, bytes).unwrap();
    let r = run_audit(dir.path());
    assert_eq!(r.gap_bytes, 22);
    let msgs: Vec<&str> = r.findings.iter().map(|f| f.message.as_str()).collect();
    assert_eq!(msgs, [format!("{}: 20 data bytes [12, 32) belong to no tensor", file.display())]);
    assert_eq!(r.findings[0].tensor.as_deref(), Some("b"));
}
