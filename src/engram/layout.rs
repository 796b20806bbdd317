//! Hash-head ownership, exactly as the runtime (vLLM's DeepSeek V4.1 Engram layout) computes it.
//!
//! Each Engram layer hashes a position into `(max_ngram_size − 1) × n_heads` columns ("hash
//! heads"); every head owns a prime-sized bucket range of the layer's table. The primes are
//! drawn in order — layer by layer, n-gram by n-gram, head by head — each the smallest prime
//! above `engram_vocab_size − 1` not handed out before, so the ranges never collide.
//!
//! A rank owns whole heads: `part = ceil(heads / (tp × dp))`, rank `r` owns heads
//! `[r·part, (r+1)·part)` (clamped to the head count), i.e. table rows
//! `[sum(sizes[..start]), sum(sizes[..end]))`. Everything here is pure.

use serde::Serialize;

/// The Engram geometry of a checkpoint, from its `config.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Geometry {
    /// Layers carrying an Engram table, in table order.
    pub layer_ids: Vec<u32>,
    /// Rows of each layer's table (same order as `layer_ids`).
    pub num_embeddings: Vec<u64>,
    pub max_ngram_size: u32,
    pub n_heads: u32,
    pub head_dim: u32,
    /// Base bucket size: every head's prime is the next unused prime above `vocab_size − 1`.
    pub vocab_size: u64,
}

/// Rows `[lo, hi)` of a layer's table owned by one rank, and the heads behind them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Owned {
    pub lo: u64,
    pub hi: u64,
    pub head_start: u32,
    pub head_end: u32,
}

impl Owned {
    /// Rows owned.
    #[must_use]
    pub const fn rows(&self) -> u64 {
        self.hi - self.lo
    }
    /// Whether a global row id is owned.
    #[must_use]
    pub const fn contains(&self, id: u64) -> bool {
        id >= self.lo && id < self.hi
    }
}

/// Why a `config.json` does not describe Engram tables, or a rank owns no rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    #[error(
        "config.json has no {0} (at the top level or under text_config): not a DeepSeek V4.1 checkpoint with Engram tables"
    )]
    Missing(String),
    #[error("config.json `{0}` is not a non-negative integer")]
    NotUint(String),
    #[error("config.json `{0}` is not a list of non-negative integers")]
    NotList(String),
    #[error("config.json `{key}` = {value} is too large")]
    TooLarge { key: String, value: u64 },
    #[error(
        "config.json lists {layers} engram_layer_ids but {tables} engram_num_embeddings (need one table size per layer)"
    )]
    Lengths { layers: usize, tables: usize },
    #[error(
        "config.json engram geometry is degenerate (max_ngram_size {max_ngram_size}, n_heads {n_heads}, vocab_size {vocab_size})"
    )]
    Degenerate { max_ngram_size: u32, n_heads: u32, vocab_size: u64 },
    #[error("layer {layer} has no Engram table (config.json engram_layer_ids = {ids:?})")]
    NoTable { layer: u32, ids: Vec<u32> },
    #[error(
        "layer {layer}: the hash heads need {total} rows but engram_num_embeddings says {rows} (config.json disagrees with itself)"
    )]
    HeadsExceed { layer: u32, total: u64, rows: u64 },
    #[error("tp {tp} × dp {dp} is not a rank count")]
    RankCount { tp: u32, dp: u32 },
    #[error("rank {rank} is out of range for tp {tp} × dp {dp} (ranks 0..{last})")]
    RankRange { rank: u32, tp: u32, dp: u32, last: u32 },
    #[error("too many hash heads")]
    TooManyHeads,
}

const KEYS: [&str; 6] = [
    "engram_layer_ids",
    "engram_num_embeddings",
    "engram_max_ngram_size",
    "engram_n_heads",
    "engram_head_dim",
    "engram_vocab_size",
];

impl Geometry {
    /// Read the geometry from a parsed `config.json` (top level, or under `text_config`).
    ///
    /// # Errors
    /// A missing or mistyped key, named with the fix; lists of different lengths.
    pub fn from_config(config: &serde_json::Value) -> Result<Self, GeometryError> {
        let root = if config.get("engram_layer_ids").is_some() {
            config
        } else {
            config.get("text_config").filter(|t| t.get("engram_layer_ids").is_some()).unwrap_or(config)
        };
        let missing: Vec<&str> = KEYS.iter().copied().filter(|k| root.get(k).is_none()).collect();
        if !missing.is_empty() {
            return Err(GeometryError::Missing(missing.join(", ")));
        }
        let uint = |key: &str| -> Result<u64, GeometryError> {
            root.get(key).and_then(serde_json::Value::as_u64).ok_or_else(|| GeometryError::NotUint(key.into()))
        };
        let list = |key: &str| -> Result<Vec<u64>, GeometryError> {
            root.get(key)
                .and_then(serde_json::Value::as_array)
                .and_then(|a| a.iter().map(serde_json::Value::as_u64).collect::<Option<Vec<u64>>>())
                .ok_or_else(|| GeometryError::NotList(key.into()))
        };
        let small =
            |key: &str, v: u64| u32::try_from(v).map_err(|_| GeometryError::TooLarge { key: key.into(), value: v });
        let layer_ids = list("engram_layer_ids")?
            .into_iter()
            .map(|v| small("engram_layer_ids", v))
            .collect::<Result<Vec<u32>, GeometryError>>()?;
        let num_embeddings = list("engram_num_embeddings")?;
        if layer_ids.len() != num_embeddings.len() || layer_ids.is_empty() {
            return Err(GeometryError::Lengths { layers: layer_ids.len(), tables: num_embeddings.len() });
        }
        let g = Self {
            layer_ids,
            num_embeddings,
            max_ngram_size: small("engram_max_ngram_size", uint("engram_max_ngram_size")?)?,
            n_heads: small("engram_n_heads", uint("engram_n_heads")?)?,
            head_dim: small("engram_head_dim", uint("engram_head_dim")?)?,
            vocab_size: uint("engram_vocab_size")?,
        };
        if g.max_ngram_size < 2 || g.n_heads == 0 || g.vocab_size < 2 {
            return Err(GeometryError::Degenerate {
                max_ngram_size: g.max_ngram_size,
                n_heads: g.n_heads,
                vocab_size: g.vocab_size,
            });
        }
        Ok(g)
    }

    /// Hash heads per layer: `(max_ngram_size − 1) × n_heads`.
    #[must_use]
    pub const fn heads(&self) -> u32 {
        (self.max_ngram_size - 1) * self.n_heads
    }

    /// Index of `layer` in the table order.
    #[must_use]
    pub fn index_of(&self, layer: u32) -> Option<usize> {
        self.layer_ids.iter().position(|&l| l == layer)
    }

    /// Every layer's head sizes (primes), in table order.
    #[must_use]
    pub fn head_sizes(&self) -> Vec<Vec<u64>> {
        let mut handed_out = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(self.layer_ids.len());
        for _ in &self.layer_ids {
            let mut sizes = Vec::with_capacity(self.heads() as usize);
            for _ in 1..self.max_ngram_size {
                let mut current = self.vocab_size - 1;
                for _ in 0..self.n_heads {
                    current = next_prime_above(current, &handed_out);
                    handed_out.insert(current);
                    sizes.push(current);
                }
            }
            out.push(sizes);
        }
        out
    }

    /// The rows `rank` owns in `layer`'s table with `tp × dp` ranks.
    ///
    /// # Errors
    /// An unknown layer, `rank ≥ tp × dp`, head sizes that exceed the table.
    pub fn owned(&self, layer: u32, tp: u32, dp: u32, rank: u32) -> Result<Owned, GeometryError> {
        let i = self.index_of(layer).ok_or_else(|| GeometryError::NoTable { layer, ids: self.layer_ids.clone() })?;
        let sizes = self.head_sizes().swap_remove(i);
        let rows = self.num_embeddings[i];
        let total: u64 = sizes.iter().sum();
        if total > rows {
            return Err(GeometryError::HeadsExceed { layer, total, rows });
        }
        owned_range(&sizes, tp, dp, rank)
    }
}

/// Rows owned by `rank` of `tp × dp` given the head sizes of one layer.
///
/// # Errors
/// `tp` or `dp` zero, `rank` out of range.
pub fn owned_range(head_sizes: &[u64], tp: u32, dp: u32, rank: u32) -> Result<Owned, GeometryError> {
    let world = tp.checked_mul(dp).filter(|&w| w > 0).ok_or(GeometryError::RankCount { tp, dp })?;
    if rank >= world {
        return Err(GeometryError::RankRange { rank, tp, dp, last: world - 1 });
    }
    let heads = u32::try_from(head_sizes.len()).map_err(|_| GeometryError::TooManyHeads)?;
    let part = heads.div_ceil(world);
    let head_start = (rank * part).min(heads);
    let head_end = (head_start + part).min(heads);
    let lo = head_sizes[..head_start as usize].iter().sum();
    let hi = head_sizes[..head_end as usize].iter().sum();
    Ok(Owned { lo, hi, head_start, head_end })
}

/// The smallest prime above `start` that is not in `taken`.
#[must_use]
pub fn next_prime_above(start: u64, taken: &std::collections::HashSet<u64>) -> u64 {
    let mut c = start.saturating_add(1);
    while !is_prime(c) || taken.contains(&c) {
        c = c.saturating_add(1);
    }
    c
}

/// Deterministic Miller–Rabin for every `u64`.
#[must_use]
pub fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    for p in [2u64, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37] {
        if n % p == 0 {
            return n == p;
        }
    }
    let mul = |a: u64, b: u64| (u128::from(a) * u128::from(b) % u128::from(n)) as u64;
    let pow = |mut b: u64, mut e: u64| {
        let mut r = 1u64;
        while e > 0 {
            if e & 1 == 1 {
                r = mul(r, b);
            }
            b = mul(b, b);
            e >>= 1;
        }
        r
    };
    let (mut d, mut s) = (n - 1, 0);
    while d % 2 == 0 {
        d /= 2;
        s += 1;
    }
    'witness: for a in [2u64, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37] {
        let mut x = pow(a, d);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = mul(x, x);
            if x == n - 1 {
                continue 'witness;
            }
        }
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vocab: u64, rows: Vec<u64>) -> serde_json::Value {
        serde_json::json!({"text_config": {
            "engram_layer_ids": [1, 14], "engram_num_embeddings": rows, "engram_max_ngram_size": 4,
            "engram_n_heads": 8, "engram_head_dim": 256, "engram_vocab_size": vocab }})
    }

    #[test]
    fn primes() {
        let small: Vec<u64> = (0..60).filter(|&n| is_prime(n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59]);
        assert!(is_prime(4_294_967_291));
        assert!(!is_prime(3_215_031_751)); // strong pseudoprime to bases 2, 3, 5, 7
        assert!(is_prime(18_446_744_073_709_551_557));
    }

    #[test]
    fn heads_are_distinct_primes_in_order() {
        let g = Geometry::from_config(&cfg(100, vec![10_000, 10_000])).unwrap();
        assert_eq!(g.heads(), 24);
        let sizes = g.head_sizes();
        // n-gram 2 of layer 1: the first 8 primes above 99; n-gram 3 continues (never reused).
        assert_eq!(&sizes[0][..9], &[101, 103, 107, 109, 113, 127, 131, 137, 139]);
        let mut all: Vec<u64> = sizes.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 48);
        assert!(sizes[1][0] > *sizes[0].iter().max().unwrap());
    }

    #[test]
    fn pinned_values_shared_with_the_python_overlay() {
        // Same numbers in python_overlay/tests/test_engram.py::test_pinned_values_shared_with_rust.
        let g = Geometry::from_config(&cfg(4000, vec![97_968, 102_814])).unwrap();
        let s = g.head_sizes();
        assert_eq!(&s[0][..10], &[4001, 4003, 4007, 4013, 4019, 4021, 4027, 4049, 4051, 4057]);
        assert_eq!(&s[1][21..], &[4363, 4373, 4391]);
        assert_eq!((s[0].iter().sum::<u64>(), s[1].iter().sum::<u64>()), (97_968, 102_814));
        let o = g.owned(14, 2, 1, 1).unwrap();
        assert_eq!((o.lo, o.hi, o.head_start, o.head_end), (50_836, 102_814, 12, 24));
    }

    #[test]
    fn ranks_cover_every_head_row_once() {
        let g = Geometry::from_config(&cfg(1000, vec![1_000_000, 1_000_000])).unwrap();
        let sizes = g.head_sizes();
        for (tp, dp) in [(1, 1), (2, 1), (4, 1), (2, 2), (5, 1), (7, 1)] {
            let mut next = 0;
            for r in 0..tp * dp {
                let o = g.owned(14, tp, dp, r).unwrap();
                assert_eq!(o.lo, next, "tp {tp} dp {dp} rank {r}");
                next = o.hi;
            }
            assert_eq!(next, sizes[1].iter().sum::<u64>());
        }
        let o = g.owned(1, 2, 1, 1).unwrap();
        assert_eq!((o.head_start, o.head_end), (12, 24));
        assert_eq!(o.lo, sizes[0][..12].iter().sum::<u64>());
        // 24 heads over 5 ranks: part 5, the last rank gets 4 heads.
        let o = g.owned(1, 5, 1, 4).unwrap();
        assert_eq!((o.head_start, o.head_end), (20, 24));
        // 24 heads over 32 ranks: ranks past the heads own nothing.
        assert_eq!(g.owned(1, 32, 1, 30).unwrap().rows(), 0);
    }

    #[test]
    fn bad_inputs_are_named() {
        let g = Geometry::from_config(&cfg(1000, vec![1_000_000, 1_000_000])).unwrap();
        assert!(g.owned(2, 2, 1, 0).unwrap_err().to_string().contains("layer 2"));
        assert!(g.owned(1, 2, 1, 2).unwrap_err().to_string().contains("rank 2 is out of range"));
        assert!(g.owned(1, 0, 1, 0).is_err());
        let tight = Geometry::from_config(&cfg(1000, vec![100, 100])).unwrap();
        assert!(tight.owned(1, 2, 1, 0).unwrap_err().to_string().contains("engram_num_embeddings"));
        let e = Geometry::from_config(&serde_json::json!({"hidden_size": 1})).unwrap_err().to_string();
        assert!(e.contains("engram_layer_ids") && e.contains("engram_vocab_size"), "{e}");
        let mut c = cfg(1000, vec![1]);
        assert!(Geometry::from_config(&c).unwrap_err().to_string().contains("one table size per layer"));
        c["text_config"]["engram_n_heads"] = serde_json::json!("8");
        assert!(Geometry::from_config(&c).is_err());
    }
}
