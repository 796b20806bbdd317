//! The packed-shard header: 4096 bytes, six little-endian `u64` words then zeros.
//!
//! | word | value |
//! |---|---|
//! | 0 | magic `0x31344E4531565344` ("DSV41EN1"; see [`MAGIC`] for the bytes) |
//! | 1 | layer |
//! | 2, 3 | owned rows `[lo, hi)` of the layer's table |
//! | 4 | rows of the whole table |
//! | 5 | record bytes (264: 256 weight ‖ 8 scale) |
//!
//! Records follow at byte 4096, one per owned row, so the file is exactly
//! `4096 + (hi − lo) × 264` bytes and row 0 starts page-aligned. Pure: parse and serialize only.

use super::ROW_BYTES;

/// The reference kit's magic, called "DSV41EN1" there. Written little-endian, its bytes on disk
/// read `DSV1EN41`; the value (not the name) is kept so shards packed by the reference kit's
/// tools are accepted and ours are accepted by them.
pub const MAGIC: u64 = 0x3134_4E45_3156_5344;
/// Header size; records start here.
pub const HEADER_BYTES: usize = 4096;

/// Why bytes are not the packed shard a rank expects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("{file_len} bytes is too short for the {HEADER_BYTES}-byte header")]
    TooShort { file_len: u64 },
    #[error("magic is {found:#018x}, not {MAGIC:#018x} (DSV41EN1): not a packed Engram shard")]
    Magic { found: u64 },
    #[error("record size {found} is not {ROW_BYTES}")]
    RecordSize { found: u64 },
    #[error("range [{lo}, {hi}) does not fit a {rows}-row table")]
    Range { lo: u64, hi: u64, rows: u64 },
    #[error("truncated: {file_len} bytes, but the header's {records} records need {need}")]
    Truncated { file_len: u64, records: u64, need: u64 },
    #[error("{file_len} bytes, but the header's {records} records need exactly {need}")]
    Length { file_len: u64, records: u64, need: u64 },
    #[error("record count overflows")]
    Overflow,
    #[error("holds layer {found}, expected layer {want}")]
    Layer { found: u64, want: u64 },
    #[error(
        "holds rows [{}, {}), but this rank owns [{}, {}) (packed for another rank or tensor-parallel size)",
        found.0, found.1, want.0, want.1
    )]
    Rows { found: (u64, u64), want: (u64, u64) },
    #[error("was packed from a {found}-row table, the checkpoint has {want}")]
    TableRows { found: u64, want: u64 },
}

/// What a packed shard says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PackedHeader {
    pub layer: u64,
    pub lo: u64,
    pub hi: u64,
    /// Rows of the whole table.
    pub rows: u64,
    pub row_bytes: u64,
}

impl PackedHeader {
    /// A header for `layer`'s rows `[lo, hi)` of a `rows`-row table.
    #[must_use]
    pub const fn new(layer: u64, lo: u64, hi: u64, rows: u64) -> Self {
        Self { layer, lo, hi, rows, row_bytes: ROW_BYTES as u64 }
    }

    /// The exact file length a complete shard with this header has.
    #[must_use]
    pub fn file_len(&self) -> Option<u64> {
        self.hi.checked_sub(self.lo)?.checked_mul(self.row_bytes)?.checked_add(HEADER_BYTES as u64)
    }

    /// The 4096 header bytes.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_BYTES];
        for (i, w) in [MAGIC, self.layer, self.lo, self.hi, self.rows, self.row_bytes].into_iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Parse the first bytes of a file of `file_len` bytes.
    ///
    /// # Errors
    /// Not a packed shard (magic), a malformed header, or a length that is not header + records.
    pub fn parse(bytes: &[u8], file_len: u64) -> Result<Self, HeaderError> {
        if bytes.len() < 48 || file_len < HEADER_BYTES as u64 {
            return Err(HeaderError::TooShort { file_len });
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        if word(0) != MAGIC {
            return Err(HeaderError::Magic { found: word(0) });
        }
        let h = Self { layer: word(1), lo: word(2), hi: word(3), rows: word(4), row_bytes: word(5) };
        if h.row_bytes != ROW_BYTES as u64 {
            return Err(HeaderError::RecordSize { found: h.row_bytes });
        }
        if h.lo > h.hi || h.hi > h.rows {
            return Err(HeaderError::Range { lo: h.lo, hi: h.hi, rows: h.rows });
        }
        match h.file_len() {
            Some(n) if n == file_len => Ok(h),
            Some(need) if need > file_len => Err(HeaderError::Truncated { file_len, records: h.hi - h.lo, need }),
            Some(need) => Err(HeaderError::Length { file_len, records: h.hi - h.lo, need }),
            None => Err(HeaderError::Overflow),
        }
    }

    /// Check the header against what the caller expects (layer, range, table rows).
    ///
    /// # Errors
    /// The first field that differs, with both values.
    pub fn expect(&self, want: &Self) -> Result<(), HeaderError> {
        if self.layer != want.layer {
            return Err(HeaderError::Layer { found: self.layer, want: want.layer });
        }
        if (self.lo, self.hi) != (want.lo, want.hi) {
            return Err(HeaderError::Rows { found: (self.lo, self.hi), want: (want.lo, want.hi) });
        }
        if self.rows != want.rows {
            return Err(HeaderError::TableRows { found: self.rows, want: want.rows });
        }
        Ok(())
    }
}

/// File name of a packed shard: `engram-l{layer}-r{rank}of{tp}.bin`.
#[must_use]
pub fn file_name(layer: u32, rank: u32, world: u32) -> String {
    format!("engram-l{layer}-r{rank}of{world}.bin")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layout() {
        let h = PackedHeader::new(14, 100, 250, 1000);
        let b = h.to_bytes();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[..8], b"DSV1EN41");
        assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), 0x3134_4E45_3156_5344);
        assert!(b[48..].iter().all(|&x| x == 0));
        let len = 4096 + 150 * 264;
        assert_eq!(PackedHeader::parse(&b, len).unwrap(), h);
        assert_eq!(file_name(1, 0, 2), "engram-l1-r0of2.bin");
    }

    #[test]
    fn refusals() {
        let h = PackedHeader::new(14, 100, 250, 1000);
        let b = h.to_bytes();
        let len = 4096 + 150 * 264;
        assert!(PackedHeader::parse(&b, len - 1).unwrap_err().to_string().contains("truncated"));
        assert!(PackedHeader::parse(&b, len + 1).unwrap_err().to_string().contains("exactly"));
        assert!(PackedHeader::parse(&b[..40], len).is_err());
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert!(PackedHeader::parse(&bad, len).unwrap_err().to_string().contains("not a packed Engram shard"));
        let mut bad = b.clone();
        bad[40] = 7;
        assert!(PackedHeader::parse(&bad, len).unwrap_err().to_string().contains("record size"));
        let mut bad = b;
        bad[24..32].copy_from_slice(&2000u64.to_le_bytes());
        assert!(PackedHeader::parse(&bad, len).unwrap_err().to_string().contains("does not fit"));
        assert!(h.expect(&PackedHeader::new(1, 100, 250, 1000)).unwrap_err().to_string().contains("layer 1"));
        assert!(h.expect(&PackedHeader::new(14, 0, 100, 1000)).unwrap_err().to_string().contains("another rank"));
        assert!(h.expect(&PackedHeader::new(14, 100, 250, 999)).unwrap_err().to_string().contains("999"));
        assert!(h.expect(&h).is_ok());
    }
}
