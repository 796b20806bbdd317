//! Counters of one download run, shared by every task (the summary reads them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Counters of one run, shared by all tasks.
#[derive(Debug)]
pub struct Counters {
    /// When the run started.
    pub epoch: Instant,
    /// Nanoseconds after `epoch` when the last byte arrived (time-to-downloaded).
    pub last_byte_ns: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub resumed_bytes: AtomicU64,
    pub retries: AtomicU64,
    pub reresolves: AtomicU64,
    pub refetched_files: AtomicU64,
    pub discarded_partials: AtomicU64,
    pub downloaded_files: AtomicU64,
    pub cached_files: AtomicU64,
    /// Cached blobs re-hashed (`--verify-cached`) and found intact.
    pub verified_cached: AtomicU64,
    /// Cached blobs that failed that check, were moved aside and fetched again.
    pub repaired_files: AtomicU64,
    /// Files fetched (in whole or in part) through the native Xet protocol.
    pub xet_files: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            last_byte_ns: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            resumed_bytes: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            reresolves: AtomicU64::new(0),
            refetched_files: AtomicU64::new(0),
            discarded_partials: AtomicU64::new(0),
            downloaded_files: AtomicU64::new(0),
            cached_files: AtomicU64::new(0),
            verified_cached: AtomicU64::new(0),
            repaired_files: AtomicU64::new(0),
            xet_files: AtomicU64::new(0),
        }
    }
}

impl Counters {
    pub(super) fn arrived(&self, n: u64) {
        self.fetched_bytes.fetch_add(n, Ordering::Relaxed);
        let ns = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_byte_ns.fetch_max(ns, Ordering::Relaxed);
    }
}
