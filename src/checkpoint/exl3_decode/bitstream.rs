//! One trellis tile (docs/exl3-format.md §2.2–§2.3): a circular bitstream of 16·K int16 words
//! holding 256 overlapping 16-bit states, placed into a 16×16 block by the tensor-core order.
//!
//! The words are read as little-endian `u32` pairs, each consumed most-significant bit first.
//! Position `t` owns `D(t)` bits ending at `S(t) = D(0) + … + D(t)`; its state is the 16-bit
//! window of the stream ending there, wrapping around the end of the stream.

/// Positions (weights) per 16×16 tile.
pub const TILE_ELEMENTS: usize = 256;
/// Side of a tile.
pub const TILE: usize = 16;
/// Bit pattern of the extra bit of half-integer K: odd positions (t mod 16) take one more bit.
const HALF_PATTERN: u32 = 0xAAAA;

/// Bits per weight of a trellis, kept as its words per tile (16·K: 16..128, or 24/40/56).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TileBits {
    words: usize,
}

impl TileBits {
    /// From a trellis last dimension; `None` unless it is 16·K for K = 1..8 or 1.5/2.5/3.5.
    #[must_use]
    pub const fn from_words(words: usize) -> Option<Self> {
        match words {
            16 | 32 | 48 | 64 | 80 | 96 | 112 | 128 | 24 | 40 | 56 => Some(Self { words }),
            _ => None,
        }
    }

    /// int16 words per tile.
    #[must_use]
    pub const fn words(self) -> usize {
        self.words
    }

    /// K as a number (3.0, 2.5, …).
    #[must_use]
    pub fn k(self) -> f64 {
        // words ≤ 128: exact.
        #[allow(clippy::cast_precision_loss)]
        let w = self.words as f64;
        w / 16.0
    }

    /// Whether K is half-integer (needs the MUL1 codebook).
    #[must_use]
    pub const fn is_half(self) -> bool {
        self.words % 16 == 8
    }

    /// Bits consumed by position `t`.
    #[must_use]
    pub const fn width(self, t: usize) -> u32 {
        // words / 16 ≤ 8.
        #[allow(clippy::cast_possible_truncation)]
        let base = (self.words / 16) as u32;
        if self.is_half() {
            base + ((HALF_PATTERN >> (t % 16)) & 1)
        } else {
            base
        }
    }

    /// Length of the circular stream in bits (256·K).
    #[must_use]
    pub const fn stream_bits(self) -> usize {
        self.words * 16
    }
}

/// Row and column inside the tile (row along in-features, column along out-features) of the
/// weight stream position `t` decodes to.
#[must_use]
pub const fn position(t: usize) -> (usize, usize) {
    let lane = t >> 3;
    let j = t & 7;
    let r = 2 * (lane & 3) + (j & 1) + 8 * ((j >> 1) & 1);
    let c = (lane >> 2) + 8 * ((j >> 2) & 1);
    (r, c)
}

/// The 256 states of one tile in stream order. `words` holds exactly `bits.words()` values.
#[must_use]
pub fn tile_states(words: &[u16], bits: TileBits) -> [u16; TILE_ELEMENTS] {
    // Big-endian-by-bit view: U[m] = words[2m] | words[2m+1] << 16, MSB first.
    let stream: Vec<u32> = words.chunks_exact(2).map(|p| u32::from(p[0]) | (u32::from(p[1]) << 16)).collect();
    let n = stream.len();
    let total = bits.stream_bits();
    let mut states = [0u16; TILE_ELEMENTS];
    let mut end = 0usize;
    for (t, state) in states.iter_mut().enumerate() {
        end += bits.width(t) as usize;
        // The window [end − 16, end), taken mod the stream length; it spans ≤ 2 words.
        let start = (end + total - 16) % total;
        let (w, off) = (start / 32, start % 32);
        let pair = (u64::from(stream[w]) << 32) | u64::from(stream[(w + 1) % n]);
        // Stream bit `start` is bit 63 − off of `pair`; keep the 16 bits from there.
        #[allow(clippy::cast_possible_truncation)] // masked to 16 bits
        let s = ((pair >> (48 - off)) & 0xFFFF) as u16;
        *state = s;
    }
    states
}

/// Decode one tile into `out` (a row-major matrix `ld` elements wide) at (row0, col0), looking
/// every state up in `table` (fp16 bits).
pub fn decode_tile(words: &[u16], bits: TileBits, table: &[u16], out: &mut [u16], ld: usize, row0: usize, col0: usize) {
    for (t, &s) in tile_states(words, bits).iter().enumerate() {
        let (r, c) = position(t);
        out[(row0 + r) * ld + col0 + c] = table[usize::from(s)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_matches_the_documented_prefix_and_is_a_bijection() {
        let perm: Vec<usize> = (0..TILE_ELEMENTS)
            .map(|t| {
                let (r, c) = position(t);
                16 * r + c
            })
            .collect();
        assert_eq!(&perm[..16], &[0, 16, 128, 144, 8, 24, 136, 152, 32, 48, 160, 176, 40, 56, 168, 184]);
        let mut seen = perm.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..TILE_ELEMENTS).collect::<Vec<_>>());
    }

    #[test]
    fn widths_sum_to_the_stream() {
        for words in [16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128] {
            let b = TileBits::from_words(words).unwrap();
            let sum: usize = (0..TILE_ELEMENTS).map(|t| b.width(t) as usize).sum();
            assert_eq!(sum, b.stream_bits(), "words {words}");
        }
        assert!(TileBits::from_words(20).is_none() && TileBits::from_words(0).is_none());
        assert_eq!(TileBits::from_words(40).unwrap().k(), 2.5);
        // 2.5: even positions 2 bits, odd 3.
        let b = TileBits::from_words(40).unwrap();
        assert_eq!((b.width(0), b.width(1), b.width(14), b.width(15)), (2, 3, 2, 3));
    }

    /// Pack states the documented way (§2.2 "Packing"): the low D(t) bits of each state,
    /// concatenated MSB-first, grouped into u32 MSB-first, stored as LE int16 pairs.
    fn pack(states: &[u16; TILE_ELEMENTS], bits: TileBits) -> Vec<u16> {
        let mut stream = vec![false; bits.stream_bits()];
        let mut pos = 0;
        for (t, &s) in states.iter().enumerate() {
            let d = bits.width(t);
            for q in (0..d).rev() {
                stream[pos] = (s >> q) & 1 == 1;
                pos += 1;
            }
        }
        let mut words = Vec::new();
        for chunk in stream.chunks(32) {
            let u = chunk.iter().fold(0u32, |acc, &b| (acc << 1) | u32::from(b));
            words.push((u & 0xFFFF) as u16);
            words.push((u >> 16) as u16);
        }
        words
    }

    #[test]
    fn valid_tail_biting_states_survive_pack_and_decode() {
        let mut seed = 0x1234_5678_9ABC_DEF0u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for words in [16, 24, 40, 48, 56, 96, 128] {
            let bits = TileBits::from_words(words).unwrap();
            // Random symbols → the unique tail-biting states (two sweeps settle the wrap).
            let symbols: Vec<u16> =
                (0..TILE_ELEMENTS).map(|t| (next() as u16) & ((1u16 << bits.width(t)) - 1)).collect();
            let mut states = [0u16; TILE_ELEMENTS];
            let mut s = 0u32;
            for _ in 0..2 {
                for t in 0..TILE_ELEMENTS {
                    s = ((s << bits.width(t)) | u32::from(symbols[t])) & 0xFFFF;
                    states[t] = s as u16;
                }
            }
            let packed = pack(&states, bits);
            assert_eq!(packed.len(), words);
            assert_eq!(tile_states(&packed, bits), states, "words {words}");
        }
    }

    #[test]
    fn first_state_wraps_to_the_stream_end() {
        // K = 1: 16 words; only the last stream bit set → state 0's window is the last 15 bits + bit 0.
        let bits = TileBits::from_words(16).unwrap();
        let mut words = vec![0u16; 16];
        // Stream bit 255 = bit 0 (LSB) of U[7] = low bit of words[14].
        words[14] = 1;
        let s = tile_states(&words, bits);
        assert_eq!(s[0], 0b10); // window bits 241..255, 0: the set bit is second to last
        assert_eq!(s[255], 1);
        assert_eq!(s[254], 0);
    }
}
