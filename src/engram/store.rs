//! The row store: `lookup(ids) -> rows` for one layer and one rank's owned rows, read from the
//! checkpoint's weight and scale tensors or from this rank's packed shard.
//!
//! - Output rows are 264 bytes, weight ‖ scale, exactly as stored (FP8 E4M3 and E8M0 bytes).
//! - Id −1 is padding and ids the rank does not own are zero-filled (the tensor-parallel
//!   reduction sums the ranks); an id outside the table is an error naming file and offset.
//! - Misses go to a small persistent thread pool (the caller works too; fewer than
//!   [`SERIAL_BELOW`] misses are read on the caller's thread), one row per ticket so the queue
//!   depth equals the thread count.
//! - Optional set-associative cache ([`RowCache`]) and resident scales (checkpoint source: the
//!   owned rows' scales in RAM, 8 bytes a row, so a miss costs one read instead of two).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use super::cache::RowCache;
use super::direct::{AlignedBuf, RowFile};
use super::error::EngramError;
use super::header::{PackedHeader, HEADER_BYTES};
use super::layout::Owned;
use super::table::{packed_header, CheckpointTable};
use super::{ROW_BYTES, SCALE_BYTES, WEIGHT_BYTES};

/// Fewer misses than this are read on the caller's thread.
pub const SERIAL_BELOW: usize = 8;

/// How the store tells its user about I/O choices (never printed by the library).
pub trait IoReporter: Send + Sync {
    /// `O_DIRECT` was refused for `path`; reads go through the page cache. Called once per store.
    fn buffered_fallback(&self, _path: &Path, _reason: &str) {}
}

/// Reports nothing.
pub struct Silent;
impl IoReporter for Silent {}

/// Store settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// Read with `O_DIRECT` where the filesystem allows it.
    pub direct: bool,
    /// Reader threads including the caller (1 = no pool).
    pub threads: usize,
    /// Cache budget in bytes of row data (0 = no cache).
    pub cache_bytes: u64,
    /// Cache ways (1–16).
    pub cache_ways: usize,
    /// Keep the owned rows' scales in RAM (checkpoint source only).
    pub resident_scales: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self { direct: true, threads: 16, cache_bytes: 0, cache_ways: 8, resident_scales: false }
    }
}

/// What one lookup did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LookupStats {
    pub read: usize,
    pub cached: usize,
    pub zero_filled: usize,
}

enum Backing {
    Checkpoint { weight: RowFile, w_off: u64, scale: RowFile, s_off: u64, resident: Option<Vec<u8>> },
    Packed { file: RowFile },
}

struct Inner {
    layer: u32,
    rows: u64,
    owned: Owned,
    backing: Backing,
    cache: Option<RowCache>,
}

impl Inner {
    /// Read owned row `id` into `out` (264 bytes).
    fn read_row(&self, id: u64, out: &mut [u8], scratch: &mut AlignedBuf) -> Result<(), EngramError> {
        match &self.backing {
            Backing::Packed { file } => {
                let off = HEADER_BYTES as u64 + (id - self.owned.lo) * ROW_BYTES as u64;
                file.read_exact_at(off, out, scratch)
            }
            Backing::Checkpoint { weight, w_off, scale, s_off, resident } => {
                let (w, s) = out.split_at_mut(WEIGHT_BYTES);
                weight.read_exact_at(w_off + id * WEIGHT_BYTES as u64, w, scratch)?;
                match resident {
                    Some(r) => {
                        let i = usize::try_from(id - self.owned.lo).unwrap_or(usize::MAX) * SCALE_BYTES;
                        s.copy_from_slice(&r[i..i + SCALE_BYTES]);
                        Ok(())
                    }
                    None => scale.read_exact_at(s_off + id * SCALE_BYTES as u64, s, scratch),
                }
            }
        }
    }

    fn read_through(&self, id: u64, out: &mut [u8], scratch: &mut AlignedBuf) -> Result<(), EngramError> {
        self.read_row(id, out, scratch)?;
        if let Some(c) = &self.cache {
            c.put(id, out);
        }
        Ok(())
    }

    fn primary_path(&self) -> &Path {
        match &self.backing {
            Backing::Packed { file } => file.path(),
            Backing::Checkpoint { weight, .. } => weight.path(),
        }
    }

    /// Where row `id` would be read (for error messages).
    fn offset_of(&self, id: i64) -> i128 {
        match &self.backing {
            Backing::Packed { .. } => {
                HEADER_BYTES as i128 + (i128::from(id) - i128::from(self.owned.lo)) * ROW_BYTES as i128
            }
            Backing::Checkpoint { w_off, .. } => i128::from(*w_off) + i128::from(id) * WEIGHT_BYTES as i128,
        }
    }
}

/// Rows read by one thread, with their output positions.
type ReadRows = Result<Vec<(usize, [u8; ROW_BYTES])>, EngramError>;

/// One batch of misses shared with the pool.
struct Job {
    inner: Arc<Inner>,
    misses: Vec<(usize, u64)>,
    next: AtomicUsize,
    failed: AtomicBool,
    done: Mutex<mpsc::Sender<ReadRows>>,
}

impl Job {
    /// Take tickets until none are left; the rows read, with their output positions.
    fn work(&self, scratch: &mut AlignedBuf) -> ReadRows {
        let mut got = Vec::new();
        loop {
            let t = self.next.fetch_add(1, Ordering::Relaxed);
            if t >= self.misses.len() || self.failed.load(Ordering::Relaxed) {
                return Ok(got);
            }
            let (pos, id) = self.misses[t];
            let mut row = [0u8; ROW_BYTES];
            if let Err(e) = self.inner.read_through(id, &mut row, scratch) {
                self.failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
            got.push((pos, row));
        }
    }
}

struct Pool {
    tx: Option<mpsc::Sender<Arc<Job>>>,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    fn new(workers: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Arc<Job>>();
        let rx = Arc::new(Mutex::new(rx));
        let handles = (0..workers)
            .map(|_| {
                let rx = Arc::clone(&rx);
                std::thread::spawn(move || {
                    let mut scratch = AlignedBuf::default();
                    loop {
                        let job = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        let Ok(job) = job else { return };
                        let result = job.work(&mut scratch);
                        let sender = job.done.lock().map(|d| d.clone());
                        if let Ok(done) = sender {
                            let _ = done.send(result);
                        }
                    }
                })
            })
            .collect();
        Self { tx: Some(tx), handles }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.tx.take();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Rows of one layer for one rank.
pub struct RowStore {
    inner: Arc<Inner>,
    pool: Pool,
    workers: usize,
    direct: bool,
}

impl RowStore {
    /// Serve `owned` rows of `table` from the checkpoint's weight and scale tensors.
    ///
    /// # Errors
    /// Unopenable files, an owned range outside the table, `threads` 0, bad cache ways.
    pub fn open_checkpoint(
        table: &CheckpointTable,
        owned: Owned,
        opts: StoreOptions,
        rep: &dyn IoReporter,
    ) -> Result<Self, EngramError> {
        if owned.hi > table.rows {
            return Err(EngramError::Table {
                path: table.weight.path.clone(),
                why: format!(
                    "owned rows [{}, {}) exceed the {}-row table of layer {}",
                    owned.lo, owned.hi, table.rows, table.layer
                ),
            });
        }
        let mut reported = false;
        let mut open = |p: &PathBuf| -> Result<RowFile, EngramError> {
            let (f, why) = RowFile::open(p, opts.direct)?;
            if let (Some(why), false) = (why, reported) {
                rep.buffered_fallback(p, &why);
                reported = true;
            }
            Ok(f)
        };
        let weight = open(&table.weight.path)?;
        let scale = open(&table.scale.path)?;
        let resident = if opts.resident_scales {
            let n = usize::try_from(owned.rows() * SCALE_BYTES as u64)
                .map_err(|_| EngramError::Config("owned scales do not fit in memory".into()))?;
            let mut v = vec![0u8; n];
            let mut scratch = AlignedBuf::default();
            let chunk = 8 << 20;
            for (i, part) in v.chunks_mut(chunk).enumerate() {
                let off = table.scale.offset + owned.lo * SCALE_BYTES as u64 + (i * chunk) as u64;
                scale.read_exact_at(off, part, &mut scratch)?;
            }
            Some(v)
        } else {
            None
        };
        let direct = weight.is_direct();
        let backing =
            Backing::Checkpoint { weight, w_off: table.weight.offset, scale, s_off: table.scale.offset, resident };
        Self::build(Inner { layer: table.layer, rows: table.rows, owned, backing, cache: None }, opts, direct)
    }

    /// Serve a packed shard; `want` (layer, range, table rows) must match its header.
    ///
    /// # Errors
    /// Unopenable file, a header that is not `want`, truncation.
    pub fn open_packed(
        path: &Path,
        want: &PackedHeader,
        opts: StoreOptions,
        rep: &dyn IoReporter,
    ) -> Result<Self, EngramError> {
        let h = packed_header(path, Some(want))?;
        let (file, why) = RowFile::open(path, opts.direct)?;
        if let Some(why) = why {
            rep.buffered_fallback(path, &why);
        }
        let layer = u32::try_from(h.layer)
            .map_err(|_| EngramError::Packed { path: path.into(), why: "layer overflows".into() })?;
        let owned = Owned { lo: h.lo, hi: h.hi, head_start: 0, head_end: 0 };
        let direct = file.is_direct();
        Self::build(Inner { layer, rows: h.rows, owned, backing: Backing::Packed { file }, cache: None }, opts, direct)
    }

    fn build(mut inner: Inner, opts: StoreOptions, direct: bool) -> Result<Self, EngramError> {
        if opts.threads == 0 {
            return Err(EngramError::Config("reader threads must be at least 1".into()));
        }
        inner.cache = RowCache::new(opts.cache_bytes, opts.cache_ways)?;
        let workers = opts.threads - 1;
        Ok(Self { inner: Arc::new(inner), pool: Pool::new(workers), workers, direct })
    }

    /// The owned rows `[lo, hi)`.
    #[must_use]
    pub fn owned(&self) -> Owned {
        self.inner.owned
    }

    /// Rows of the whole table.
    #[must_use]
    pub fn rows(&self) -> u64 {
        self.inner.rows
    }

    /// Whether reads bypass the page cache.
    #[must_use]
    pub const fn is_direct(&self) -> bool {
        self.direct
    }

    /// Bytes of row data the cache can hold (0 without a cache).
    #[must_use]
    pub fn cache_bytes(&self) -> u64 {
        self.inner.cache.as_ref().map_or(0, |c| c.stats().bytes)
    }

    /// Fill `out` (`ids.len() × 264` bytes) with the rows of `ids`.
    ///
    /// # Errors
    /// An id outside the table (other than −1), a failed or short read, a wrong `out` size.
    pub fn lookup(&self, ids: &[i64], out: &mut [u8]) -> Result<LookupStats, EngramError> {
        let inner = &self.inner;
        if out.len() != ids.len() * ROW_BYTES {
            return Err(EngramError::Config(format!(
                "lookup output holds {} bytes, {} ids need {}",
                out.len(),
                ids.len(),
                ids.len() * ROW_BYTES
            )));
        }
        let mut stats = LookupStats::default();
        let mut misses = Vec::new();
        for (pos, (&id, row)) in ids.iter().zip(out.chunks_exact_mut(ROW_BYTES)).enumerate() {
            if id == -1 {
                row.fill(0);
                stats.zero_filled += 1;
                continue;
            }
            let Some(uid) = u64::try_from(id).ok().filter(|&u| u < inner.rows) else {
                return Err(EngramError::OutOfRange {
                    path: inner.primary_path().to_path_buf(),
                    layer: inner.layer,
                    id,
                    rows: inner.rows,
                    offset: inner.offset_of(id),
                });
            };
            if !inner.owned.contains(uid) {
                row.fill(0);
                stats.zero_filled += 1;
            } else if inner.cache.as_ref().is_some_and(|c| c.get(uid, row)) {
                stats.cached += 1;
            } else {
                misses.push((pos, uid));
            }
        }
        stats.read = misses.len();
        if misses.is_empty() {
            return Ok(stats);
        }
        let mut scratch = AlignedBuf::default();
        let helpers = self.workers.min(misses.len() - 1);
        if misses.len() < SERIAL_BELOW || helpers == 0 {
            for &(pos, id) in &misses {
                inner.read_through(id, &mut out[pos * ROW_BYTES..(pos + 1) * ROW_BYTES], &mut scratch)?;
            }
            return Ok(stats);
        }
        let (done_tx, done_rx) = mpsc::channel();
        let job = Arc::new(Job {
            inner: Arc::clone(inner),
            misses,
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            done: Mutex::new(done_tx),
        });
        let mut sent = 0;
        if let Some(tx) = &self.pool.tx {
            for _ in 0..helpers {
                if tx.send(Arc::clone(&job)).is_ok() {
                    sent += 1;
                }
            }
        }
        let mut first_err = None;
        let mut place = |r: ReadRows| match r {
            Ok(rows) => {
                for (pos, row) in rows {
                    out[pos * ROW_BYTES..(pos + 1) * ROW_BYTES].copy_from_slice(&row);
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        };
        place(job.work(&mut scratch));
        for _ in 0..sent {
            match done_rx.recv() {
                Ok(r) => place(r),
                Err(_) => break,
            }
        }
        match first_err {
            Some(e) => Err(e),
            None if job.next.load(Ordering::Relaxed) < job.misses.len() => {
                Err(EngramError::Config("a reader thread stopped before its rows were read".into()))
            }
            None => Ok(stats),
        }
    }
}
