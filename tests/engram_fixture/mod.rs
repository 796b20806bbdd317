//! Synthetic Engram shards written as real safetensors: layers 1 and 14, `F8_E4M3 [rows, 256]`
//! weights and `F8_E8M0 [rows, 8]` scales behind a small BF16 tensor (so the tables start at
//! unaligned offsets), `model.safetensors.index.json` and a `config.json` with the Engram
//! geometry. Every byte is a known function of (layer, row, column).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;

pub const LAYERS: [u32; 2] = [1, 14];

/// Weight byte `j` of `row` in `layer`'s table.
#[must_use]
pub fn weight_byte(layer: u32, row: u64, j: usize) -> u8 {
    let h = row.wrapping_mul(2_654_435_761) ^ (j as u64).wrapping_mul(40_503) ^ u64::from(layer) << 40;
    (h >> 3) as u8
}

/// Scale byte `j` of `row` (finite scales 100..139).
#[must_use]
pub fn scale_byte(layer: u32, row: u64, j: usize) -> u8 {
    100 + ((row * 8 + j as u64 + u64::from(layer)) % 40) as u8
}

/// The 264-byte record of a row.
#[must_use]
pub fn record(layer: u32, row: u64) -> Vec<u8> {
    let mut r: Vec<u8> = (0..256).map(|j| weight_byte(layer, row, j)).collect();
    r.extend((0..8).map(|j| scale_byte(layer, row, j)));
    r
}

/// The config.json of a geometry with `vocab` as the bucket base, tables of `rows` rows each.
#[must_use]
pub fn config(vocab: u64, rows: &[u64]) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["DeepseekV41ForCausalLM"],
        "text_config": {
            "engram_layer_ids": LAYERS, "engram_num_embeddings": rows, "engram_max_ngram_size": 4,
            "engram_n_heads": 8, "engram_head_dim": 256, "engram_vocab_size": vocab,
            "engram_compressed_vocab_size": 100, "engram_pad_token_id": 2
        }
    })
}

/// Write the directory; returns the rows of each layer's table (= the sum of its head sizes).
pub fn write(dir: &Path, vocab: u64) -> Vec<u64> {
    let probe = spark_kit::engram::layout::Geometry::from_config(&config(vocab, &[1, 1])).unwrap();
    let rows: Vec<u64> = probe.head_sizes().iter().map(|s| s.iter().sum()).collect();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config(vocab, &rows)).unwrap()).unwrap();
    let mut weight_map = serde_json::Map::new();
    for (i, (&layer, &n)) in LAYERS.iter().zip(&rows).enumerate() {
        let file = format!("model-{:05}-of-00048.safetensors", 47 + i);
        let wkv = format!("layers.{layer}.engram.wkv.weight");
        let w = format!("layers.{layer}.engram.embed.weight");
        let s = format!("layers.{layer}.engram.embed.scale");
        let (wb, sb) = (n * 256, n * 8);
        let header = serde_json::json!({
            "__metadata__": {"format": "pt"},
            wkv.clone(): {"dtype": "BF16", "shape": [3, 5], "data_offsets": [0, 30]},
            w.clone(): {"dtype": "F8_E4M3", "shape": [n, 256], "data_offsets": [30, 30 + wb]},
            s.clone(): {"dtype": "F8_E8M0", "shape": [n, 8], "data_offsets": [30 + wb, 30 + wb + sb]},
        });
        let h = serde_json::to_vec(&header).unwrap();
        let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(dir.join(&file)).unwrap());
        f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
        f.write_all(&h).unwrap();
        f.write_all(&[7u8; 30]).unwrap();
        let mut buf = vec![0u8; 256];
        for r in 0..n {
            for (j, b) in buf.iter_mut().enumerate() {
                *b = weight_byte(layer, r, j);
            }
            f.write_all(&buf).unwrap();
        }
        for r in 0..n {
            let s: Vec<u8> = (0..8).map(|j| scale_byte(layer, r, j)).collect();
            f.write_all(&s).unwrap();
        }
        f.flush().unwrap();
        for t in [w, s] {
            weight_map.insert(t, file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    rows
}
