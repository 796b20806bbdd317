//! An optional set-associative row cache with a byte budget: `ways` slots per set (1–16), the
//! set chosen by a hash of the row id, round-robin replacement inside a set. Sets are split
//! over lock stripes so lookups on the pool's threads rarely contend.

use std::sync::Mutex;

use super::ROW_BYTES;

const STRIPES: u64 = 64;
const EMPTY: u64 = u64::MAX;

struct Stripe {
    tags: Vec<u64>,
    rows: Vec<u8>,
    /// Next victim per set.
    next: Vec<u8>,
}

/// The cache. Holds at most `budget` bytes of row data (tags and counters come on top: 9 bytes
/// per slot).
pub struct RowCache {
    ways: usize,
    sets_per_stripe: u64,
    stripes: Vec<Mutex<Stripe>>,
}

/// Counters of one cache.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub slots: u64,
    pub bytes: u64,
}

/// Why a cache cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("cache ways {0} is outside 1–16")]
    Ways(usize),
    #[error("cache too large")]
    TooLarge,
}

impl RowCache {
    /// A cache of at most `budget` bytes with `ways` ways, or `None` when the budget holds
    /// less than one set per stripe.
    ///
    /// # Errors
    /// `ways` outside 1–16.
    pub fn new(budget: u64, ways: usize) -> Result<Option<Self>, CacheError> {
        if !(1..=16).contains(&ways) {
            return Err(CacheError::Ways(ways));
        }
        let sets = budget / (ways as u64 * ROW_BYTES as u64);
        let sets_per_stripe = sets / STRIPES;
        if sets_per_stripe == 0 {
            return Ok(None);
        }
        let slots = usize::try_from(sets_per_stripe * ways as u64).map_err(|_| CacheError::TooLarge)?;
        let stripes = (0..STRIPES)
            .map(|_| {
                Mutex::new(Stripe {
                    tags: vec![EMPTY; slots],
                    rows: vec![0u8; slots * ROW_BYTES],
                    next: vec![0u8; slots / ways],
                })
            })
            .collect();
        Ok(Some(Self { ways, sets_per_stripe, stripes }))
    }

    /// Slots and bytes of row data.
    #[must_use]
    pub fn stats(&self) -> CacheStats {
        let slots = STRIPES * self.sets_per_stripe * self.ways as u64;
        CacheStats { slots, bytes: slots * ROW_BYTES as u64 }
    }

    fn place(&self, id: u64) -> (usize, usize) {
        // SplitMix64 finaliser: neighbouring ids land in unrelated sets.
        let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let stripe = (z % STRIPES) as usize;
        let set = ((z / STRIPES) % self.sets_per_stripe) as usize;
        (stripe, set)
    }

    /// Copy row `id` into `out` if cached.
    pub fn get(&self, id: u64, out: &mut [u8]) -> bool {
        let (s, set) = self.place(id);
        let Ok(st) = self.stripes[s].lock() else { return false };
        let base = set * self.ways;
        for w in base..base + self.ways {
            if st.tags[w] == id {
                out.copy_from_slice(&st.rows[w * ROW_BYTES..(w + 1) * ROW_BYTES]);
                return true;
            }
        }
        false
    }

    /// Insert row `id` (replacing the set's round-robin victim).
    pub fn put(&self, id: u64, row: &[u8]) {
        let (s, set) = self.place(id);
        let Ok(mut st) = self.stripes[s].lock() else { return };
        let base = set * self.ways;
        if st.tags[base..base + self.ways].contains(&id) {
            return;
        }
        let victim = base + st.next[set] as usize;
        st.next[set] = ((st.next[set] as usize + 1) % self.ways) as u8;
        st.tags[victim] = id;
        st.rows[victim * ROW_BYTES..(victim + 1) * ROW_BYTES].copy_from_slice(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u64) -> Vec<u8> {
        (0..ROW_BYTES).map(|i| (id as usize * 7 + i) as u8).collect()
    }

    #[test]
    fn budget_ways_and_replacement() {
        assert!(RowCache::new(1 << 20, 0).is_err());
        assert!(RowCache::new(1 << 20, 17).is_err());
        assert!(RowCache::new(1000, 4).unwrap().is_none());
        let budget = 64 * 4 * 264 * 2; // two sets per stripe, 4 ways
        let c = RowCache::new(budget, 4).unwrap().unwrap();
        assert_eq!(c.stats().bytes, budget);
        let mut out = vec![0u8; ROW_BYTES];
        assert!(!c.get(5, &mut out));
        c.put(5, &row(5));
        assert!(c.get(5, &mut out));
        assert_eq!(out, row(5));
        // Fill far beyond capacity: at most `slots` distinct ids stay, and what is found is right.
        for id in 0..10_000 {
            c.put(id, &row(id));
        }
        let mut hits = 0;
        for id in 0..10_000 {
            if c.get(id, &mut out) {
                assert_eq!(out, row(id));
                hits += 1;
            }
        }
        assert!(hits > 0 && hits <= c.stats().slots, "{hits}");
    }
}
