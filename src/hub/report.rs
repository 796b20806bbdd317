//! How a download reports progress: the command layer implements this (bars or log lines).

use std::time::Duration;

/// Progress events. Every method has an empty default; implementations must be cheap and must
/// not block (they are called from the download tasks).
pub trait Reporter: Send + Sync {
    /// A repo's plan: files at `commit`, their total size, and what is still to fetch.
    fn planned(&self, _repo: &str, _commit: &str, _files: usize, _total: u64, _to_fetch: u64) {}
    /// A file starts (or resumes with `resumed` bytes already on disk).
    fn file_started(&self, _path: &str, _size: u64, _resumed: u64) {}
    /// `n` more bytes of `path` arrived.
    fn bytes(&self, _path: &str, _n: u64) {}
    /// `path` is verified and in the cache.
    fn file_done(&self, _path: &str) {}
    /// A request failed and is retried after `delay`.
    fn retry(&self, _path: &str, _attempt: u32, _reason: &str, _delay: Duration) {}
    /// Something the user should know (a discarded partial, a copy instead of a hardlink).
    fn note(&self, _message: &str) {}
}

/// A reporter that reports nothing.
pub struct Silent;

impl Reporter for Silent {}
