//! The resume journal beside a partial blob: which byte ranges are durably on disk.
//!
//! `blobs/<sha256>.spark-partial` is pre-sized and written with positional writes;
//! `blobs/<sha256>.spark-partial.json` lists the finished ranges. A range enters the journal
//! only after the partial file was fsynced, so every journaled byte is on disk.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Half-open byte intervals `[start, end)`, sorted and merged. Pure.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSet(Vec<(u64, u64)>);

impl RangeSet {
    /// Add `[start, end)`, merging neighbours.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(a, b) in &self.0 {
            if b < s || a > e {
                out.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        out.push((s, e));
        out.sort_unstable();
        self.0 = out;
    }

    #[must_use]
    pub fn covered(&self) -> u64 {
        self.0.iter().map(|(a, b)| b - a).sum()
    }

    #[must_use]
    pub fn intervals(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// Whether the set is a valid description of a file of `size` bytes.
    #[must_use]
    pub fn fits(&self, size: u64) -> bool {
        self.0.iter().all(|&(a, b)| a < b && b <= size) && self.0.windows(2).all(|w| w[0].1 < w[1].0)
    }

    /// The missing parts of `[0, size)`, cut into pieces of at most `piece` bytes aligned to `piece`.
    #[must_use]
    pub fn missing(&self, size: u64, piece: u64) -> Vec<(u64, u64)> {
        let piece = piece.max(1);
        let mut gaps = Vec::new();
        let mut at = 0;
        for &(a, b) in &self.0 {
            if a > at {
                gaps.push((at, a.min(size)));
            }
            at = at.max(b);
        }
        if at < size {
            gaps.push((at, size));
        }
        let mut out = Vec::new();
        for (mut s, e) in gaps {
            while s < e {
                let next = ((s / piece) + 1) * piece;
                let end = next.min(e);
                out.push((s, end));
                s = end;
            }
        }
        out
    }
}

/// What the journal records about one partial blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub version: u32,
    pub repo: String,
    pub path: String,
    pub commit: String,
    /// The blob name: LFS SHA-256 (or git sha1 for regular files).
    pub etag: String,
    pub size: u64,
    /// Finished, fsynced ranges.
    pub done: RangeSet,
}

impl Journal {
    pub const VERSION: u32 = 1;

    /// Read a journal; `None` when absent or unreadable (the partial is then started over).
    #[must_use]
    pub fn load(path: &Path) -> Option<Self> {
        let text = fs::read(path).ok()?;
        let j: Self = serde_json::from_slice(&text).ok()?;
        (j.version == Self::VERSION && j.done.fits(j.size)).then_some(j)
    }

    /// Whether this journal describes the same bytes as `etag`/`size` (the commit may differ:
    /// the blob is content-addressed).
    #[must_use]
    pub fn matches(&self, etag: &str, size: u64) -> bool {
        self.etag == etag && self.size == size
    }

    /// Write atomically: temp file, fsync, rename.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(self).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_and_missing() {
        let mut r = RangeSet::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(20, 30);
        assert_eq!(r.intervals(), &[(10, 40)]);
        r.insert(0, 5);
        assert_eq!(r.covered(), 35);
        assert_eq!(r.missing(50, 16), vec![(5, 10), (40, 48), (48, 50)]);
        assert_eq!(RangeSet::default().missing(33, 16), vec![(0, 16), (16, 32), (32, 33)]);
        assert!(r.fits(40) && !r.fits(39));
        let mut full = RangeSet::default();
        full.insert(0, 50);
        assert!(full.missing(50, 16).is_empty());
    }

    #[test]
    fn roundtrip_and_match() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.spark-partial.json");
        let mut done = RangeSet::default();
        done.insert(0, 8);
        let j = Journal {
            version: Journal::VERSION,
            repo: "o/n".into(),
            path: "a".into(),
            commit: "c".into(),
            etag: "e".into(),
            size: 16,
            done,
        };
        j.save(&p).unwrap();
        let back = Journal::load(&p).unwrap();
        assert_eq!(back, j);
        assert!(back.matches("e", 16) && !back.matches("e", 17) && !back.matches("f", 16));
        fs::write(&p, b"{not json").unwrap();
        assert!(Journal::load(&p).is_none());
    }

    /// The two Engram shards of the original DeepSeek V4.1 Flash repo, at their real sizes:
    /// ranges tile the file exactly, a resume after a kill asks for exactly the rest, and the
    /// journal keeps offsets past 4 GiB and 50 GB exact.
    #[test]
    fn engram_shards_at_their_real_sizes() {
        let d = tempfile::tempdir().unwrap();
        for (size, ranges) in [(101_535_150_936_u64, 3026), (101_537_926_640, 3027)] {
            let piece = 32 << 20;
            let all = RangeSet::default().missing(size, piece);
            assert_eq!(all.len() as u64, size.div_ceil(piece));
            assert_eq!(all.len(), ranges);
            assert_eq!(all[0], (0, piece));
            assert_eq!(all.last().map(|r| r.1), Some(size));
            assert!(all.windows(2).all(|w| w[0].1 == w[1].0 && w[0].1 % piece == 0));
            // A kill -9: the first 1000 ranges done, 4 MiB journaled inside a range past
            // 50 GB, the last bytes done.
            let mut done = RangeSet::default();
            for &(a, b) in &all[..1000] {
                done.insert(a, b);
            }
            let (mid, _) = all[2000];
            assert!(mid > 50_000_000_000);
            done.insert(mid, mid + (4 << 20));
            done.insert(size - 100, size);
            assert!(done.fits(size));
            let rest = done.missing(size, piece);
            assert_eq!(rest.iter().map(|(a, b)| b - a).sum::<u64>() + done.covered(), size);
            assert_eq!(rest[0], (1000 * piece, 1001 * piece));
            assert!(rest.contains(&(mid + (4 << 20), mid + piece)));
            assert!(rest.iter().all(|&(a, b)| b <= size && b - a <= piece));
            let p = d.path().join(format!("{size}.spark-partial.json"));
            let j = Journal {
                version: Journal::VERSION,
                repo: "deepseek-ai/DeepSeek-V4.1-Flash".into(),
                path: "model-00047-of-00048.safetensors".into(),
                commit: "c".into(),
                etag: "e".into(),
                size,
                done,
            };
            j.save(&p).unwrap();
            assert_eq!(Journal::load(&p), Some(j));
        }
    }
}
