//! `verify --repair`: move the blobs of files that failed verification aside, fetch exactly those
//! files again at the commit the lock file recorded, and check them once more.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::cache::RepoCache;
use super::error::HubError;
use super::fetch::Options;
use super::lockfile::LockEntry;
use super::report::Reporter;
use super::run::{download_blocking, RepoRequest, Request, Want};
use super::verify::{verify, Checked};
use crate::kit::schema::ExpectedFile;

/// The cache blob of a lock entry: named by the git blob id (regular files) or the SHA-256.
#[must_use]
pub fn blob_name(e: &LockEntry) -> &str {
    e.git_sha1.as_deref().unwrap_or(&e.sha256)
}

/// Move the blob of `e` aside when it is there; returns (blob, where it went).
///
/// # Errors
/// The blob cannot be moved (or its lock is held by a running download).
pub fn move_aside(hf_cache: &Path, e: &LockEntry) -> Result<Option<(PathBuf, PathBuf)>, HubError> {
    let cache = RepoCache::new(hf_cache, &e.repo);
    let name = blob_name(e);
    let blob = cache.blob(name);
    if std::fs::symlink_metadata(&blob).is_err() {
        return Ok(None);
    }
    cache.move_aside(name, &e.path).map(|aside| Some((blob, aside)))
}

/// One request per repo and commit for exactly these files, checked against the lock's size and
/// SHA-256.
#[must_use]
pub fn requests(entries: &[&LockEntry]) -> Vec<RepoRequest> {
    let mut by: BTreeMap<(&str, &str), Vec<ExpectedFile>> = BTreeMap::new();
    for e in entries {
        by.entry((&e.repo, &e.commit)).or_default().push(ExpectedFile {
            path: e.path.clone(),
            size: Some(e.size),
            sha256: Some(e.sha256.clone()),
        });
    }
    by.into_iter()
        .map(|((repo, commit), files)| RepoRequest {
            repo: repo.to_string(),
            revision: commit.to_string(),
            want: Want::Only(files),
            key: "spark-kit.lock",
            engram: None,
        })
        .collect()
}

/// After [`move_aside`]: fetch `repos` (what `kit_files::repair_requests` says for `bad`) and
/// check `bad` again with `threads` readers.
pub fn refetch(
    hf_cache: &Path,
    bad: &[&LockEntry],
    repos: Vec<RepoRequest>,
    threads: usize,
    (env, home): (&[(String, String)], &Path),
    reporter: std::sync::Arc<dyn Reporter>,
) -> Result<Vec<Checked>, HubError> {
    let req = Request {
        hf_cache: hf_cache.to_path_buf(),
        repos,
        opts: Options::default(),
        dry_run: false,
        verify_cached: false,
    };
    download_blocking(&req, env, home, reporter)?;
    let entries: Vec<LockEntry> = bad.iter().map(|e| (*e).clone()).collect();
    Ok(verify(hf_cache, &entries, false, threads, &|_| {}))
}
