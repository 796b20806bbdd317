//! The per-rank packer: a rank's owned rows of one layer, weight ‖ scale interleaved into 264-byte
//! records after a 4 KiB header, so a lookup miss is one read of local disk.
//!
//! Written to `<name>.partial`, fsynced, renamed, and the directory fsynced: a crash leaves at
//! most a `.partial`, which is never read and is started over. A complete shard whose header
//! matches and whose sampled rows equal the checkpoint's is kept. Free space is checked before
//! writing. Reads use `O_DIRECT` where possible and written pages are dropped from the page
//! cache after each fsync, so packing ~47 GiB does not fill the host's memory.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::direct::{AlignedBuf, RowFile};
use super::error::EngramError;
use super::header::{file_name, PackedHeader, HEADER_BYTES};
use super::layout::Owned;
use super::table::{packed_header, CheckpointTable};
use super::{ROW_BYTES, SCALE_BYTES, WEIGHT_BYTES};

/// Rows per read/write step (16.5 MiB of records).
const CHUNK_ROWS: u64 = 64 * 1024;
/// Bytes written between fsyncs (after which the written pages are dropped from the cache).
const SYNC_EVERY: u64 = 256 << 20;
/// Rows compared with the checkpoint before an existing shard is kept.
const SAMPLES: u64 = 16;

/// How packing reports progress (the command layer draws it).
pub trait PackReporter: Send + Sync {
    /// A shard starts: `bytes` to write.
    fn shard_started(&self, _path: &Path, _bytes: u64) {}
    /// `n` more bytes written.
    fn bytes(&self, _n: u64) {}
    /// Something the user should know (a stale partial or an invalid shard replaced).
    fn note(&self, _message: &str) {}
}

/// Reports nothing.
pub struct Silent;
impl PackReporter for Silent {}

/// One shard to produce.
#[derive(Debug, Clone)]
pub struct PackJob {
    pub table: CheckpointTable,
    pub owned: Owned,
    pub rank: u32,
    /// `tp × dp`.
    pub world: u32,
    pub out_dir: PathBuf,
}

impl PackJob {
    /// Final path of the shard.
    #[must_use]
    pub fn path(&self) -> PathBuf {
        self.out_dir.join(file_name(self.table.layer, self.rank, self.world))
    }

    /// The header the shard must carry.
    #[must_use]
    pub fn header(&self) -> PackedHeader {
        PackedHeader::new(u64::from(self.table.layer), self.owned.lo, self.owned.hi, self.table.rows)
    }
}

/// What happened to one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Written,
    AlreadyComplete,
}

/// The result for one shard.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Packed {
    pub path: PathBuf,
    pub layer: u32,
    pub rank: u32,
    pub world: u32,
    pub lo: u64,
    pub hi: u64,
    pub bytes: u64,
    pub outcome: Outcome,
    pub seconds: f64,
}

/// Compare a packed shard's sampled records with the checkpoint.
///
/// # Errors
/// Read failures, or the first record that differs (naming it).
pub fn check_samples(job: &PackJob, path: &Path) -> Result<(), EngramError> {
    let (packed, _) = RowFile::open(path, false)?;
    let (weight, _) = RowFile::open(&job.table.weight.path, false)?;
    let (scale, _) = RowFile::open(&job.table.scale.path, false)?;
    let n = job.owned.rows();
    let mut scratch = AlignedBuf::default();
    for k in 0..SAMPLES.min(n) {
        let i = if SAMPLES.min(n) == 1 { 0 } else { k * (n - 1) / (SAMPLES.min(n) - 1) };
        let id = job.owned.lo + i;
        let mut rec = [0u8; ROW_BYTES];
        packed.read_exact_at(HEADER_BYTES as u64 + i * ROW_BYTES as u64, &mut rec, &mut scratch)?;
        let mut src = [0u8; ROW_BYTES];
        let (w, s) = src.split_at_mut(WEIGHT_BYTES);
        weight.read_exact_at(job.table.weight.offset + id * WEIGHT_BYTES as u64, w, &mut scratch)?;
        scale.read_exact_at(job.table.scale.offset + id * SCALE_BYTES as u64, s, &mut scratch)?;
        if rec != src {
            return Err(EngramError::Packed {
                path: path.to_path_buf(),
                why: format!(
                    "record of row {id} (offset {}) differs from the checkpoint",
                    HEADER_BYTES as u64 + i * ROW_BYTES as u64
                ),
            });
        }
    }
    Ok(())
}

/// Produce (or keep) one shard.
///
/// # Errors
/// Read/write failures naming the file, too little free space.
pub fn pack(job: &PackJob, rep: &dyn PackReporter) -> Result<Packed, EngramError> {
    let started = Instant::now();
    let path = job.path();
    let want = job.header();
    let len = want.file_len().ok_or_else(|| EngramError::Config("packed shard size overflows".into()))?;
    let result = |outcome| Packed {
        path: path.clone(),
        layer: job.table.layer,
        rank: job.rank,
        world: job.world,
        lo: job.owned.lo,
        hi: job.owned.hi,
        bytes: len,
        outcome,
        seconds: started.elapsed().as_secs_f64(),
    };
    if path.exists() {
        match packed_header(&path, Some(&want)).and_then(|_| check_samples(job, &path)) {
            Ok(()) => return Ok(result(Outcome::AlreadyComplete)),
            Err(e) => rep.note(&format!("replacing {}: {e}", path.display())),
        }
    }
    std::fs::create_dir_all(&job.out_dir).map_err(|e| EngramError::io(&job.out_dir, e))?;
    let partial = path.with_extension("bin.partial");
    let reclaimable = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0)
        + std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    if reclaimable > 0 && partial.exists() {
        rep.note(&format!("starting over: {} was left by an interrupted run", partial.display()));
    }
    let (free, at) = crate::hub::disk::free_bytes(&job.out_dir).map_err(|e| EngramError::io(&job.out_dir, e))?;
    if free.saturating_add(reclaimable) < len {
        return Err(EngramError::NoSpace { path, needed: len, free: free.saturating_add(reclaimable), at });
    }
    rep.shard_started(&path, len);
    write_partial(job, &partial, &want, rep)?;
    std::fs::rename(&partial, &path).map_err(|e| EngramError::io(&path, e))?;
    File::open(&job.out_dir).and_then(|d| d.sync_all()).map_err(|e| EngramError::io(&job.out_dir, e))?;
    Ok(result(Outcome::Written))
}

fn drop_cache(file: &File, offset: u64, len: u64) {
    let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    let _ = nix::fcntl::posix_fadvise(file, off, len, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED);
}

fn write_partial(
    job: &PackJob,
    partial: &Path,
    want: &PackedHeader,
    rep: &dyn PackReporter,
) -> Result<(), EngramError> {
    let werr = |e| EngramError::io(partial, e);
    let mut out = OpenOptions::new().write(true).create(true).truncate(true).open(partial).map_err(werr)?;
    out.write_all(&want.to_bytes()).map_err(werr)?;
    rep.bytes(HEADER_BYTES as u64);
    let (weight, _) = RowFile::open(&job.table.weight.path, true)?;
    let (scale, _) = RowFile::open(&job.table.scale.path, true)?;
    let (mut wscratch, mut sscratch) = (AlignedBuf::default(), AlignedBuf::default());
    let mut wbuf = Vec::new();
    let mut sbuf = Vec::new();
    let mut rec = Vec::new();
    let mut pos = HEADER_BYTES as u64;
    let mut synced = 0u64;
    let mut row = job.owned.lo;
    while row < job.owned.hi {
        let n = CHUNK_ROWS.min(job.owned.hi - row);
        let nu = usize::try_from(n).map_err(|_| EngramError::Config("chunk too large".into()))?;
        wbuf.resize(nu * WEIGHT_BYTES, 0);
        sbuf.resize(nu * SCALE_BYTES, 0);
        let woff = job.table.weight.offset + row * WEIGHT_BYTES as u64;
        let soff = job.table.scale.offset + row * SCALE_BYTES as u64;
        weight.read_exact_at(woff, &mut wbuf, &mut wscratch)?;
        scale.read_exact_at(soff, &mut sbuf, &mut sscratch)?;
        if !weight.is_direct() {
            weight.drop_cache(woff, wbuf.len() as u64);
            scale.drop_cache(soff, sbuf.len() as u64);
        }
        rec.clear();
        for (w, s) in wbuf.chunks_exact(WEIGHT_BYTES).zip(sbuf.chunks_exact(SCALE_BYTES)) {
            rec.extend_from_slice(w);
            rec.extend_from_slice(s);
        }
        out.write_all_at(&rec, pos).map_err(werr)?;
        pos += rec.len() as u64;
        rep.bytes(rec.len() as u64);
        if pos - synced >= SYNC_EVERY {
            out.sync_data().map_err(werr)?;
            drop_cache(&out, synced, pos - synced);
            synced = pos;
        }
        row += n;
    }
    out.flush().map_err(werr)?;
    out.sync_all().map_err(werr)?;
    drop_cache(&out, 0, 0);
    Ok(())
}
