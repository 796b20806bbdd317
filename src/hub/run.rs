//! One `download`: plan every repo (commit, listing, kit checks), resolve each missing file
//! once, check the disk, fetch, then write refs, the Engram slim directory and the lock entries.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::api::{HubClient, Resolved};
use super::cache::RepoCache;
use super::disk::{free_bytes, needed};
use super::engram::{build_slim, SlimReport};
use super::error::HubError;
use super::fetch::{fetch_repo, Counters, Fetcher, Options};
use super::journal::Journal;
use super::lockfile::LockEntry;
use super::plan::{cross_check, plan, Kind, PlannedFile, Selection};
use super::report::Reporter;
use super::reuse::verify_cached;
use crate::kit::schema::ExpectedFile;

/// Concurrent `resolve` requests during the preflight.
const RESOLVE_CONCURRENCY: usize = 8;

/// Which files of a repo.
#[derive(Debug, Clone)]
pub enum Want {
    /// Every file at the revision; `required` must be among them.
    All { required: Vec<ExpectedFile>, expected_shards: u32 },
    /// Only these files.
    Only(Vec<ExpectedFile>),
}

/// Build the embed-only Engram directory from this repo.
#[derive(Debug, Clone)]
pub struct EngramTarget {
    pub dir: PathBuf,
    pub layers: Vec<u32>,
}

/// One repo to bring into the cache.
#[derive(Debug, Clone)]
pub struct RepoRequest {
    pub repo: String,
    pub revision: String,
    pub want: Want,
    /// The kit key naming the files (`model.files`, `engram.files`), for messages.
    pub key: &'static str,
    pub engram: Option<EngramTarget>,
}

/// The whole job.
#[derive(Debug, Clone)]
pub struct Request {
    pub hf_cache: PathBuf,
    pub repos: Vec<RepoRequest>,
    pub opts: Options,
    pub dry_run: bool,
    /// Re-hash the blobs already in the cache before reusing them (a mismatch is fetched again).
    pub verify_cached: bool,
}

/// A file of the plan, with what is already on disk.
#[derive(Debug, Clone, Serialize)]
pub struct PlanLine {
    #[serde(flatten)]
    pub file: PlannedFile,
    /// Bytes still to fetch (0 when cached).
    pub to_fetch: u64,
}

/// Per repo.
#[derive(Debug, Clone, Serialize)]
pub struct RepoSummary {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub files: Vec<PlanLine>,
    pub bytes: u64,
    pub to_fetch: u64,
    pub engram: Option<SlimReport>,
}

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub dry_run: bool,
    pub verify_cached: bool,
    pub hf_cache: PathBuf,
    pub repos: Vec<RepoSummary>,
    pub files: usize,
    pub bytes: u64,
    pub to_fetch: u64,
    pub downloaded_files: u64,
    pub cached_files: u64,
    /// Cached blobs re-hashed and found intact (`--verify-cached`).
    pub verified_cached: u64,
    /// Cached blobs whose hash did not match: moved aside and fetched again.
    pub repaired_files: u64,
    pub fetched_bytes: u64,
    pub resumed_bytes: u64,
    pub retries: u64,
    pub reresolves: u64,
    pub refetched_files: u64,
    pub discarded_partials: u64,
    /// Files fetched (in whole or in part) through the native Xet protocol.
    pub xet_files: u64,
    pub seconds: f64,
    /// Seconds from the start until the last byte arrived; `seconds` is until every file was
    /// verified and in place.
    pub transfer_seconds: f64,
    #[serde(skip)]
    pub lock: Vec<LockEntry>,
}

/// Bytes of `f` still to fetch given the cache and a matching journal.
fn remaining(cache: &RepoCache, f: &PlannedFile) -> u64 {
    if cache.has_blob(&f.blob, f.size) {
        return 0;
    }
    let partial_ok = std::fs::metadata(cache.partial(&f.blob)).is_ok_and(|m| m.len() == f.size);
    match Journal::load(&cache.journal(&f.blob)) {
        Some(j) if partial_ok && j.matches(&f.blob, f.size) => f.size - j.done.covered(),
        _ => f.size,
    }
}

async fn preflight(
    client: &Arc<HubClient>,
    repo: &str,
    commit: &str,
    files: &[PlannedFile],
    cache: &RepoCache,
) -> Result<HashMap<String, Resolved>, HubError> {
    let sem = Arc::new(tokio::sync::Semaphore::new(RESOLVE_CONCURRENCY));
    let mut set = tokio::task::JoinSet::new();
    for f in files.iter().filter(|f| f.kind == Kind::Lfs && !cache.has_blob(&f.blob, f.size)) {
        let (c, sem, f, repo, commit) = (client.clone(), sem.clone(), f.clone(), repo.to_string(), commit.to_string());
        set.spawn(async move {
            let _permit = sem.acquire_owned().await;
            let r =
                c.resolve(&repo, &commit, &f.path).await.and_then(|r| cross_check(&repo, &commit, &f, &r).map(|()| r));
            (f.path, r)
        });
    }
    let mut out = HashMap::new();
    while let Some(joined) = set.join_next().await {
        let (path, r) = joined.map_err(|e| HubError::Protocol { what: repo.into(), reason: e.to_string() })?;
        out.insert(path, r?);
    }
    Ok(out)
}

/// Plan, check and fetch every repo of `req`.
/// [`download`] from `HF_ENDPOINT` with the token the environment names (`home`: where the
/// Hugging Face token file is looked for), on a runtime of its own.
pub fn download_blocking(
    req: &Request,
    env: &[(String, String)],
    home: &std::path::Path,
    reporter: Arc<dyn Reporter>,
) -> Result<Summary, HubError> {
    let token = super::auth::find_token(env, home, |p| std::fs::read_to_string(p).ok());
    let client = HubClient::new(&super::endpoint(env), token, req.opts.jobs, req.opts.backoff, req.opts.idle)?
        .with_reporter(reporter.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8)))
        .enable_all()
        .build()
        .map_err(HubError::Runtime)?;
    let summary = rt.block_on(download(Arc::new(client), req, reporter));
    drop(rt);
    summary
}

pub async fn download(client: Arc<HubClient>, req: &Request, reporter: Arc<dyn Reporter>) -> Result<Summary, HubError> {
    let started = Instant::now();
    let counters = Arc::new(Counters::default());
    let mut planned = Vec::new();
    for r in &req.repos {
        let section = r.key.split('.').next().unwrap_or("model");
        let commit = client.commit(&r.repo, &r.revision).await.map_err(|e| e.in_kit(section))?;
        let tree = client.tree(&r.repo, &commit).await.map_err(|e| e.in_kit(section))?;
        let sel = match &r.want {
            Want::All { required, expected_shards } => {
                Selection::All { required, expected_shards: *expected_shards, key: r.key }
            }
            Want::Only(files) => Selection::Only { files, key: r.key },
        };
        let files = plan(&r.repo, &commit, &tree, sel)?;
        let cache = RepoCache::new(&req.hf_cache, &r.repo);
        if req.verify_cached && !req.dry_run {
            verify_cached(&cache, &files, &reporter, &counters).await?;
        }
        let lines: Vec<PlanLine> =
            files.iter().map(|f| PlanLine { file: f.clone(), to_fetch: remaining(&cache, f) }).collect();
        let bytes = files.iter().map(|f| f.size).sum();
        let to_fetch = lines.iter().map(|l| l.to_fetch).sum();
        reporter.planned(&r.repo, &commit, files.len(), bytes, to_fetch);
        planned.push((
            r,
            cache,
            commit,
            files,
            RepoSummary {
                repo: r.repo.clone(),
                revision: r.revision.clone(),
                commit: String::new(),
                files: lines,
                bytes,
                to_fetch,
                engram: None,
            },
        ));
    }
    let mut lock = Vec::new();
    let to_fetch: u64 = planned.iter().map(|p| p.4.to_fetch).sum();
    if !req.dry_run {
        let mut resolved = Vec::new();
        for (r, cache, commit, files, _) in &planned {
            resolved.push(preflight(&client, &r.repo, commit, files, cache).await?);
        }
        let (free, dir) = free_bytes(&req.hf_cache).map_err(|e| HubError::io(&req.hf_cache, e))?;
        if free < needed(to_fetch) {
            return Err(HubError::DiskSpace { dir, need: needed(to_fetch), remaining: to_fetch, free });
        }
        for ((r, cache, commit, files, summary), resolved) in planned.iter_mut().zip(resolved) {
            let fetcher = Fetcher {
                client: client.clone(),
                opts: req.opts,
                reporter: reporter.clone(),
                counters: counters.clone(),
            };
            let fetched = fetch_repo(fetcher, cache.clone(), commit.clone(), files.clone(), resolved).await?;
            cache.write_ref(&r.revision, commit)?;
            if let Some(t) = &r.engram {
                let report = build_slim(cache, commit, files, &t.layers, &t.dir)?;
                for c in &report.copied {
                    reporter.note(&format!(
                        "{}: copied {c} into {} (hardlink impossible: another filesystem?)",
                        r.repo,
                        t.dir.display()
                    ));
                }
                summary.engram = Some(report);
            }
            summary.commit = commit.clone();
            let mut entries: Vec<LockEntry> = fetched
                .into_iter()
                .map(|f| LockEntry {
                    repo: r.repo.clone(),
                    revision: r.revision.clone(),
                    commit: commit.clone(),
                    path: f.path,
                    size: f.size,
                    sha256: f.sha256,
                    git_sha1: f.git_sha1,
                })
                .collect();
            entries.sort_by(|a, b| a.path.cmp(&b.path));
            summary.files.iter_mut().for_each(|l| l.to_fetch = 0);
            lock.append(&mut entries);
        }
    }
    for (_, _, commit, _, s) in &mut planned {
        s.commit.clone_from(commit);
    }
    let c = &counters;
    let repos: Vec<RepoSummary> = planned
        .into_iter()
        .map(|(_, _, _, _, mut s)| {
            s.files.sort_by(|a, b| a.file.path.cmp(&b.file.path));
            s
        })
        .collect();
    Ok(Summary {
        dry_run: req.dry_run,
        verify_cached: req.verify_cached,
        hf_cache: req.hf_cache.clone(),
        files: repos.iter().map(|r| r.files.len()).sum(),
        bytes: repos.iter().map(|r| r.bytes).sum(),
        to_fetch,
        repos,
        downloaded_files: c.downloaded_files.load(Ordering::Relaxed),
        cached_files: c.cached_files.load(Ordering::Relaxed),
        verified_cached: c.verified_cached.load(Ordering::Relaxed),
        repaired_files: c.repaired_files.load(Ordering::Relaxed),
        fetched_bytes: c.fetched_bytes.load(Ordering::Relaxed),
        resumed_bytes: c.resumed_bytes.load(Ordering::Relaxed),
        retries: c.retries.load(Ordering::Relaxed) + client.retries(),
        reresolves: c.reresolves.load(Ordering::Relaxed),
        refetched_files: c.refetched_files.load(Ordering::Relaxed),
        xet_files: c.xet_files.load(Ordering::Relaxed),
        discarded_partials: c.discarded_partials.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        transfer_seconds: Duration::from_nanos(c.last_byte_ns.load(Ordering::Relaxed)).as_secs_f64(),
        lock,
    })
}
