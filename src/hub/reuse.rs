//! Blobs already in the cache. `download` reuses a blob whose size matches (it was verified
//! when it entered the cache); with `--verify-cached` it re-hashes each one first, and a blob
//! whose content no longer matches its name is moved aside and fetched again.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::cache::RepoCache;
use super::error::HubError;
use super::fetch::Counters;
use super::hashing::{git_sha1, sha256_file};
use super::plan::{Kind, PlannedFile};
use super::report::Reporter;

/// Blobs hashed at the same time.
const HASH_THREADS: usize = 4;

/// The content hash of a cached blob as its name spells it (SHA-256 for LFS, git blob sha1 for
/// regular files).
///
/// # Errors
/// The blob cannot be read.
pub fn blob_hash(cache: &RepoCache, f: &PlannedFile) -> Result<String, HubError> {
    let path = cache.blob(&f.blob);
    match f.kind {
        Kind::Lfs => {
            let file = File::open(&path).map_err(|e| HubError::io(&path, e))?;
            sha256_file(&file, |_| {}).map(|(h, _)| h).map_err(|e| HubError::io(&path, e))
        }
        Kind::Regular => std::fs::read(&path).map(|b| git_sha1(&b)).map_err(|e| HubError::io(&path, e)),
    }
}

/// Re-hash every cached blob of `files`; move the ones that do not match aside (they then count
/// as missing and are fetched again). Counts into `verified_cached` / `repaired_files`.
///
/// # Errors
/// A blob cannot be read or moved.
pub async fn verify_cached(
    cache: &RepoCache,
    files: &[PlannedFile],
    reporter: &Arc<dyn Reporter>,
    counters: &Counters,
) -> Result<(), HubError> {
    let sem = Arc::new(tokio::sync::Semaphore::new(HASH_THREADS));
    let mut set = tokio::task::JoinSet::new();
    for f in files.iter().filter(|f| cache.has_blob(&f.blob, f.size)) {
        let (cache, f, sem) = (cache.clone(), f.clone(), sem.clone());
        set.spawn(async move {
            let _permit = sem.acquire_owned().await;
            tokio::task::spawn_blocking(move || blob_hash(&cache, &f).map(|h| (f, h))).await
        });
    }
    while let Some(joined) = set.join_next().await {
        let (f, actual) = joined
            .map_err(|e| HubError::Protocol { what: cache.repo.clone(), reason: e.to_string() })?
            .map_err(|e| HubError::Protocol { what: cache.repo.clone(), reason: e.to_string() })??;
        if actual == f.blob {
            counters.verified_cached.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let aside = cache.move_aside(&f.blob, &f.path)?;
        counters.repaired_files.fetch_add(1, Ordering::Relaxed);
        reporter.note(&format!(
            "{}: {}: the cached blob hashes to {actual}, not {}; moved it aside to {} and fetching it again",
            cache.repo,
            f.path,
            f.blob,
            aside.display()
        ));
    }
    Ok(())
}
