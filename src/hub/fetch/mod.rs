//! The data path: one global pool of range requests to the signed CDN URLs, positional writes
//! into pre-sized partial blobs, an fsynced resume journal (also inside a range), SHA-256
//! computed while the bytes arrive, and promotion into the cache only after the hash matched.
//!
//! `worker` holds the range workers, `finalise` the per-file hasher and promotion, `state` what
//! they share; this file plans one repo's fetch and handles cached and small files.

mod counters;
mod finalise;
mod state;
mod worker;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::api::{HubClient, Resolved};
use super::cache::RepoCache;
use super::error::HubError;
use super::hashing::{git_sha1, sha256};
use super::plan::{cross_check, Kind, PlannedFile};
use super::report::Reporter;
use super::retry::Backoff;
use super::xet::scratch;
pub use crate::kit::schema::DownloadTransport as Transport;
pub use counters::Counters;
use state::{lock, Queue, Shared};
use worker::worker;

/// Bytes of a range between two journal updates by default: a `kill -9` loses at most this
/// much per connection.
pub const DEFAULT_JOURNAL_EVERY: u64 = 4 << 20;

/// Tuning of the data path.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Concurrent range requests across all files.
    pub jobs: usize,
    /// Bytes per range request.
    pub range_size: u64,
    /// A request that delivers no byte for this long is abandoned and retried.
    pub idle: Duration,
    pub backoff: Backoff,
    /// Bytes of a range written between two journal updates (each one fsync).
    pub journal_every: u64,
    /// Bridge, native Xet, or the bridge with Xet when it refuses a file.
    pub transport: Transport,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            jobs: 16,
            range_size: 32 << 20,
            idle: Duration::from_secs(60),
            backoff: Backoff::default(),
            journal_every: DEFAULT_JOURNAL_EVERY,
            transport: Transport::Auto,
        }
    }
}

/// A file that is in the cache, verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fetched {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// The git blob id of a regular file.
    pub git_sha1: Option<String>,
    pub blob: String,
}

/// What every fetch of a run shares.
#[derive(Clone)]
pub struct Fetcher {
    pub client: Arc<HubClient>,
    pub opts: Options,
    pub reporter: Arc<dyn Reporter>,
    pub counters: Arc<Counters>,
}

/// Bring every file of one repo into the cache, verified. `resolved` holds the `resolve`
/// answer of each LFS file (checked already).
pub async fn fetch_repo(
    fetcher: Fetcher,
    cache: RepoCache,
    commit: String,
    files: Vec<PlannedFile>,
    mut resolved: HashMap<String, Resolved>,
) -> Result<Vec<Fetched>, HubError> {
    let Fetcher { client, opts, reporter, counters } = fetcher;
    discard_stale(&cache, &commit, &files, &*reporter, &counters);
    let mut out = Vec::with_capacity(files.len());
    let mut lfs = VecDeque::new();
    for f in files {
        if cache.has_blob(&f.blob, f.size) {
            cache.link(&commit, &f.path, &f.blob)?;
            counters.cached_files.fetch_add(1, Ordering::Relaxed);
            out.push(fetched_from_blob(&cache, &f)?);
            continue;
        }
        match f.kind {
            Kind::Regular => {
                let r = client.resolve(&cache.repo, &commit, &f.path).await?;
                cross_check(&cache.repo, &commit, &f, &r)?;
                out.push(fetch_small(&client, &cache, &commit, &f, &r, &*reporter, &counters).await?);
            }
            Kind::Lfs => {
                let r = match resolved.remove(&f.path) {
                    Some(r) => r,
                    None => {
                        let r = client.resolve(&cache.repo, &commit, &f.path).await?;
                        cross_check(&cache.repo, &commit, &f, &r)?;
                        r
                    }
                };
                lfs.push_back((f, r));
            }
        }
    }
    if lfs.is_empty() {
        return Ok(out);
    }
    // hf-xet's working directory (removed below); those of runs killed before removing theirs go.
    let tmp = std::env::temp_dir();
    for d in scratch::remove_stale(&tmp) {
        reporter.note(&format!("removed {}, left by a download that was killed", d.display()));
    }
    let shared = Arc::new(Shared {
        client,
        cache,
        commit,
        opts,
        reporter,
        counters,
        abort: AtomicBool::new(false),
        error: Mutex::new(None),
        queue: tokio::sync::Mutex::new(Queue { files: lfs, open: VecDeque::new() }),
        in_flight: AtomicUsize::new(0),
        downloading: AtomicUsize::new(0),
        wake: tokio::sync::Notify::new(),
        results: Mutex::new(Vec::new()),
        xet: std::sync::OnceLock::new(),
        scratch: scratch::next_dir(&tmp),
    });
    let mut workers = Vec::new();
    for _ in 0..opts.jobs.max(1) {
        workers.push(tokio::spawn(worker(shared.clone())));
    }
    for w in workers {
        let _ = w.await;
    }
    let _ = fs::remove_dir_all(&shared.scratch);
    if let Some(e) = lock(&shared.error).take() {
        return Err(e);
    }
    out.extend(lock(&shared.results).drain(..));
    Ok(out)
}

fn fetched_from_blob(cache: &RepoCache, f: &PlannedFile) -> Result<Fetched, HubError> {
    Ok(match f.kind {
        Kind::Lfs => {
            Fetched { path: f.path.clone(), size: f.size, sha256: f.blob.clone(), git_sha1: None, blob: f.blob.clone() }
        }
        Kind::Regular => {
            let p = cache.blob(&f.blob);
            let bytes = fs::read(&p).map_err(|e| HubError::io(&p, e))?;
            Fetched {
                path: f.path.clone(),
                size: f.size,
                sha256: sha256(&bytes),
                git_sha1: Some(f.blob.clone()),
                blob: f.blob.clone(),
            }
        }
    })
}

/// Remove partials of blobs this plan does not contain that belong to another commit (the
/// branch moved: their bytes will never be wanted again). Partials of the same commit (another
/// kit's selection) and partials another process is writing are left alone.
fn discard_stale(cache: &RepoCache, commit: &str, files: &[PlannedFile], reporter: &dyn Reporter, counters: &Counters) {
    let keep: HashSet<String> = files.iter().map(|f| f.blob.clone()).collect();
    for (blob, partial, journal, j) in cache.stale_partials(&keep) {
        if j.as_ref().is_some_and(|j| j.commit == commit) {
            continue;
        }
        let path = j.as_ref().map_or_else(|| blob.clone(), |j| j.path.clone());
        let Ok(_lock) = cache.lock(&blob, &path) else { continue };
        let what = j.map_or_else(
            || format!("blob {blob} (no journal)"),
            |j| format!("{} ({} bytes done) from commit {}", j.path, j.done.covered(), j.commit),
        );
        let _ = fs::remove_file(&partial);
        let _ = fs::remove_file(&journal);
        counters.discarded_partials.fetch_add(1, Ordering::Relaxed);
        reporter
            .note(&format!("{}: discarded the partial download of {what}: not part of commit {commit}", cache.repo));
    }
}

async fn fetch_small(
    client: &HubClient,
    cache: &RepoCache,
    commit: &str,
    f: &PlannedFile,
    r: &Resolved,
    reporter: &dyn Reporter,
    counters: &Counters,
) -> Result<Fetched, HubError> {
    let _lock = cache.lock(&f.blob, &f.path)?;
    reporter.file_started(&f.path, f.size, 0);
    let mut attempt = 0;
    let bytes = loop {
        attempt += 1;
        let bytes = client.get_small(&cache.repo, commit, &f.path, &r.location, f.size).await?;
        let got = git_sha1(&bytes);
        if bytes.len() as u64 == f.size && got == f.blob {
            break bytes;
        }
        if attempt >= 2 {
            return Err(HubError::Sha1Mismatch {
                repo: cache.repo.clone(),
                path: f.path.clone(),
                expected: f.blob.clone(),
                actual: got,
            });
        }
        counters.retries.fetch_add(1, Ordering::Relaxed);
        reporter.retry(&f.path, attempt, "content does not match its git blob id", Duration::ZERO);
    };
    counters.arrived(bytes.len() as u64);
    reporter.bytes(&f.path, bytes.len() as u64);
    cache.write_blob(&f.blob, &bytes)?;
    cache.link(commit, &f.path, &f.blob)?;
    counters.downloaded_files.fetch_add(1, Ordering::Relaxed);
    reporter.file_done(&f.path);
    Ok(Fetched {
        path: f.path.clone(),
        size: f.size,
        sha256: sha256(&bytes),
        git_sha1: Some(f.blob.clone()),
        blob: f.blob.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::state::Progress;

    #[test]
    fn watermark_follows_contiguous_prefix() {
        let mut p = Progress::default();
        assert_eq!(p.watermark(), 0);
        p.active.insert(0, 5);
        p.active.insert(10, 15);
        assert_eq!(p.watermark(), 5);
        p.active.remove(&0);
        p.done.insert(0, 10);
        assert_eq!(p.watermark(), 15);
        p.done.insert(20, 30);
        assert_eq!(p.watermark(), 15);
        p.active.remove(&10);
        p.done.insert(10, 20);
        assert_eq!(p.watermark(), 30);
    }
}
