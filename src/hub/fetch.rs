//! The data path: one global pool of range requests to the signed CDN URLs, positional writes
//! into pre-sized partial blobs, an fsynced resume journal, SHA-256 computed while the bytes
//! arrive, and promotion into the cache only after the hash matched.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_RANGE, RANGE};
use serde::Serialize;
use sha2::Digest as _;

use super::api::{HubClient, Resolved};
use super::cache::{BlobLock, RepoCache};
use super::error::HubError;
use super::hashing::{drop_cached, git_sha1, hex, sha256};
use super::headers::{content_range, ratelimit_wait, redact_query, retry_after};
use super::journal::{Journal, RangeSet};
use super::plan::{cross_check, Kind, PlannedFile};
use super::report::Reporter;
use super::retry::{jitter, retryable_status, Backoff};

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
}

impl Default for Options {
    fn default() -> Self {
        Self { jobs: 16, range_size: 32 << 20, idle: Duration::from_secs(60), backoff: Backoff::default() }
    }
}

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
        }
    }
}

impl Counters {
    fn arrived(&self, n: u64) {
        self.fetched_bytes.fetch_add(n, Ordering::Relaxed);
        let ns = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_byte_ns.fetch_max(ns, Ordering::Relaxed);
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

/// Re-resolves allowed per file (signed URLs expire; each costs one `resolve`).
const MAX_RERESOLVES: u32 = 8;
/// Bytes buffered per request before a positional write.
const WRITE_BUF: usize = 1 << 20;
/// Read size of the trailing hasher.
const HASH_READ: usize = 4 << 20;

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
        wake: tokio::sync::Notify::new(),
        results: Mutex::new(Vec::new()),
    });
    let mut workers = Vec::new();
    for _ in 0..opts.jobs.max(1) {
        workers.push(tokio::spawn(worker(shared.clone())));
    }
    for w in workers {
        let _ = w.await;
    }
    if let Some(e) = lock(&shared.error).take() {
        return Err(e);
    }
    out.extend(lock(&shared.results).drain(..));
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock means a task panicked; the data (counters, sets) is still consistent
    // enough to report the failure, so keep going instead of panicking again.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

struct Shared {
    client: Arc<HubClient>,
    cache: RepoCache,
    commit: String,
    opts: Options,
    reporter: Arc<dyn Reporter>,
    counters: Arc<Counters>,
    abort: AtomicBool,
    error: Mutex<Option<HubError>>,
    queue: tokio::sync::Mutex<Queue>,
    /// Files opened and not yet finalised.
    in_flight: AtomicUsize,
    wake: tokio::sync::Notify,
    results: Mutex<Vec<Fetched>>,
}

impl Shared {
    fn fail(&self, e: HubError) {
        let mut slot = lock(&self.error);
        if slot.is_none() {
            *slot = Some(e);
        }
        self.abort.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }
}

/// Files fetched at the same time: enough to keep every connection busy, few enough that each
/// file's hasher trails its download closely (its lag is about `jobs / FILES_IN_FLIGHT` ranges).
const FILES_IN_FLIGHT: usize = 4;

/// An opened file and its ranges not requested yet, in offset order.
type Pending = (Arc<FileState>, VecDeque<(u64, u64)>);

struct Queue {
    /// Files not opened yet, in fetch order.
    files: VecDeque<(PlannedFile, Resolved)>,
    /// Opened files with ranges still to request.
    open: VecDeque<Pending>,
}

struct RangeJob {
    file: Arc<FileState>,
    start: u64,
    end: u64,
}

/// Where the bytes of a file are: the signed URL and a generation bumped at each re-resolve.
struct Location {
    url: String,
    on_hub: bool,
    generation: u32,
}

#[derive(Default)]
struct Progress {
    /// Finished ranges (in memory; the journal trails by one fsync).
    done: RangeSet,
    /// Ranges being written: start → next byte to write.
    active: BTreeMap<u64, u64>,
    /// The hasher must stop (abort or refetch).
    stop: bool,
}

impl Progress {
    /// End of the contiguous prefix of written bytes.
    fn watermark(&self) -> u64 {
        let mut at = 0;
        loop {
            if let Some(&(_, b)) = self.done.intervals().iter().find(|&&(a, b)| a <= at && b > at) {
                at = b;
                continue;
            }
            if let Some(&w) = self.active.get(&at) {
                at = w;
            }
            return at;
        }
    }
}

struct FileState {
    f: PlannedFile,
    file: File,
    partial: PathBuf,
    journal: PathBuf,
    location: tokio::sync::Mutex<Location>,
    reresolves: AtomicU32,
    progress: Mutex<Progress>,
    changed: Condvar,
    journal_lock: Mutex<()>,
    hasher: Mutex<Option<tokio::task::JoinHandle<Option<String>>>>,
    refetched: AtomicBool,
    /// Range requests of this file in flight.
    inflight: AtomicUsize,
    _lock: BlobLock,
}

impl FileState {
    async fn location(&self) -> (String, bool, u32) {
        let l = self.location.lock().await;
        (l.url.clone(), l.on_hub, l.generation)
    }

    fn set_written(&self, start: u64, pos: u64) {
        lock(&self.progress).active.insert(start, pos);
        self.changed.notify_all();
    }

    /// Record a finished range; fsync the data and the journal. Returns whether the file is complete.
    fn finish_range(&self, sh: &Shared, start: u64, end: u64) -> Result<bool, HubError> {
        // The journal lock is taken first so journal writes happen in the order ranges were
        // recorded: the write that completes the file is the last one.
        let _g = lock(&self.journal_lock);
        let (done, complete) = {
            let mut p = lock(&self.progress);
            p.active.remove(&start);
            p.done.insert(start, end);
            (p.done.clone(), p.done.covered() == self.f.size)
        };
        self.changed.notify_all();
        self.file.sync_data().map_err(|e| HubError::io(&self.partial, e))?;
        Journal {
            version: Journal::VERSION,
            repo: sh.cache.repo.clone(),
            path: self.f.path.clone(),
            commit: sh.commit.clone(),
            etag: self.f.blob.clone(),
            size: self.f.size,
            done,
        }
        .save(&self.journal)
        .map_err(|e| HubError::io(&self.journal, e))?;
        Ok(complete)
    }
}

/// Open (or resume) the partial blob of a file and queue its missing ranges.
fn open_file(sh: &Arc<Shared>, f: PlannedFile, r: Resolved, q: &mut Queue) -> Result<Arc<FileState>, HubError> {
    let cache = &sh.cache;
    let blob_lock = cache.lock(&f.blob, &f.path)?;
    let partial = cache.partial(&f.blob);
    let journal = cache.journal(&f.blob);
    let mut done = RangeSet::default();
    let existing = fs::metadata(&partial).ok().map(|m| m.len());
    match Journal::load(&journal) {
        Some(j) if j.matches(&f.blob, f.size) && existing == Some(f.size) => done = j.done,
        Some(j) => {
            sh.reporter.note(&format!(
                "{}: {}: discarded a partial download that does not match this file (size {} → {}, commit {})",
                cache.repo, f.path, j.size, f.size, j.commit
            ));
            sh.counters.discarded_partials.fetch_add(1, Ordering::Relaxed);
        }
        None => {}
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(done.covered() == 0)
        .open(&partial)
        .map_err(|e| HubError::io(&partial, e))?;
    file.set_len(f.size).map_err(|e| HubError::io(&partial, e))?;
    let resumed = done.covered();
    sh.counters.resumed_bytes.fetch_add(resumed, Ordering::Relaxed);
    sh.reporter.file_started(&f.path, f.size, resumed);
    let missing = done.missing(f.size, sh.opts.range_size);
    let state = Arc::new(FileState {
        file,
        partial,
        journal,
        location: tokio::sync::Mutex::new(Location { url: r.location, on_hub: r.on_hub, generation: 0 }),
        reresolves: AtomicU32::new(0),
        progress: Mutex::new(Progress { done, active: BTreeMap::new(), stop: false }),
        changed: Condvar::new(),
        journal_lock: Mutex::new(()),
        hasher: Mutex::new(None),
        refetched: AtomicBool::new(false),
        inflight: AtomicUsize::new(0),
        _lock: blob_lock,
        f,
    });
    sh.in_flight.fetch_add(1, Ordering::SeqCst);
    start_hasher(sh, &state);
    if missing.is_empty() {
        spawn_finalize(sh.clone(), state.clone());
    }
    if !missing.is_empty() {
        q.open.push_back((state.clone(), missing.into()));
    }
    Ok(state)
}

/// Hash the file's contiguous written prefix as it grows (on a blocking thread).
fn start_hasher(sh: &Arc<Shared>, st: &Arc<FileState>) {
    let st2 = st.clone();
    let sh2 = sh.clone();
    let handle = tokio::task::spawn_blocking(move || {
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; HASH_READ];
        let mut pos = 0u64;
        while pos < st2.f.size {
            let wm = {
                let mut p = lock(&st2.progress);
                loop {
                    if p.stop || sh2.abort.load(Ordering::SeqCst) {
                        return None;
                    }
                    let wm = p.watermark();
                    if wm > pos {
                        break wm;
                    }
                    p = st2
                        .changed
                        .wait_timeout(p, Duration::from_millis(500))
                        .map_or_else(|e| e.into_inner().0, |r| r.0);
                }
            };
            while pos < wm {
                let n = usize::try_from(wm - pos).map_or(HASH_READ, |n| n.min(HASH_READ));
                if st2.file.read_exact_at(&mut buf[..n], pos).is_err() {
                    return None;
                }
                h.update(&buf[..n]);
                // Start writeback of what is hashed and let clean pages go: hundreds of GiB
                // through the page cache must not crowd out a unified-memory GPU host.
                drop_cached(&st2.file, pos, n as u64);
                pos += n as u64;
            }
        }
        Some(hex(&h.finalize()))
    });
    *lock(&st.hasher) = Some(handle);
}

fn spawn_finalize(sh: Arc<Shared>, st: Arc<FileState>) {
    tokio::spawn(async move {
        if let Err(e) = finalize(&sh, &st).await {
            sh.fail(e);
        }
        sh.wake.notify_waiters();
    });
}

/// Wait for the hash, then promote, link and report — or refetch once on a mismatch.
async fn finalize(sh: &Arc<Shared>, st: &Arc<FileState>) -> Result<(), HubError> {
    let handle = lock(&st.hasher).take();
    let got = match handle {
        Some(h) => h.await.ok().flatten(),
        None => None,
    };
    let Some(got) = got else {
        sh.in_flight.fetch_sub(1, Ordering::SeqCst);
        if sh.abort.load(Ordering::SeqCst) {
            // Another file failed: leave the partial and journal for the next run.
            return Ok(());
        }
        return Err(HubError::Protocol {
            what: format!("{}: {}", sh.cache.repo, st.f.path),
            reason: format!("could not read back {} to hash it", st.partial.display()),
        });
    };
    if got != st.f.blob {
        if st.refetched.swap(true, Ordering::SeqCst) {
            let _ = fs::remove_file(&st.partial);
            let _ = fs::remove_file(&st.journal);
            sh.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(HubError::HashMismatch {
                repo: sh.cache.repo.clone(),
                path: st.f.path.clone(),
                expected: st.f.blob.clone(),
                actual: got,
            });
        }
        sh.counters.refetched_files.fetch_add(1, Ordering::Relaxed);
        sh.reporter.retry(
            &st.f.path,
            1,
            &format!("SHA-256 mismatch (got {got}); fetching the file again"),
            Duration::ZERO,
        );
        let _ = fs::remove_file(&st.journal);
        *lock(&st.progress) = Progress::default();
        start_hasher(sh, st);
        let mut q = sh.queue.lock().await;
        q.open.push_front((st.clone(), RangeSet::default().missing(st.f.size, sh.opts.range_size).into()));
        drop(q);
        sh.wake.notify_waiters();
        return Ok(());
    }
    st.file.sync_data().map_err(|e| HubError::io(&st.partial, e))?;
    drop_cached(&st.file, 0, st.f.size);
    sh.cache.promote(&st.partial, &st.f.blob)?;
    {
        let _g = lock(&st.journal_lock);
        let _ = fs::remove_file(&st.journal);
    }
    sh.cache.link(&sh.commit, &st.f.path, &st.f.blob)?;
    sh.counters.downloaded_files.fetch_add(1, Ordering::Relaxed);
    sh.reporter.file_done(&st.f.path);
    lock(&sh.results).push(Fetched {
        path: st.f.path.clone(),
        size: st.f.size,
        sha256: got,
        git_sha1: None,
        blob: st.f.blob.clone(),
    });
    sh.in_flight.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// The next range: from the earliest open file below its share of connections, opening the
/// next file when all are at their share; at the tail, any open file's range.
async fn next_job(sh: &Arc<Shared>) -> Result<Option<RangeJob>, HubError> {
    let share = sh.opts.jobs.div_ceil(FILES_IN_FLIGHT).max(1);
    let mut q = sh.queue.lock().await;
    q.open.retain(|(_, pending)| !pending.is_empty());
    loop {
        let pick = q.open.iter().position(|(f, _)| f.inflight.load(Ordering::SeqCst) < share);
        let pick = match pick {
            Some(i) => Some(i),
            None if !q.files.is_empty() => {
                let (f, r) = q
                    .files
                    .pop_front()
                    .ok_or_else(|| HubError::Kit("internal: the file queue emptied while locked".into()))?;
                open_file(sh, f, r, &mut q)?;
                continue;
            }
            None if q.open.is_empty() => return Ok(None),
            None => Some(0),
        };
        let Some((file, pending)) = pick.and_then(|i| q.open.get_mut(i)) else { return Ok(None) };
        let Some((start, end)) = pending.pop_front() else {
            q.open.retain(|(_, p)| !p.is_empty());
            continue;
        };
        file.inflight.fetch_add(1, Ordering::SeqCst);
        return Ok(Some(RangeJob { file: file.clone(), start, end }));
    }
}

async fn worker(sh: Arc<Shared>) {
    loop {
        if sh.abort.load(Ordering::SeqCst) {
            return;
        }
        let job = match next_job(&sh).await {
            Ok(j) => j,
            Err(e) => return sh.fail(e),
        };
        let Some(job) = job else {
            if sh.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            // A finalising file may queue a refetch; wait for news (bounded, no lost wake-ups).
            let _ = tokio::time::timeout(Duration::from_millis(200), sh.wake.notified()).await;
            continue;
        };
        let fetched = fetch_range(&sh, &job).await;
        job.file.inflight.fetch_sub(1, Ordering::SeqCst);
        match fetched {
            Ok(true) => {
                // fsync + journal off the async threads.
                let (sh2, file, (start, end)) = (sh.clone(), job.file.clone(), (job.start, job.end));
                let done = tokio::task::spawn_blocking(move || file.finish_range(&sh2, start, end)).await;
                match done {
                    Ok(Ok(true)) => spawn_finalize(sh.clone(), job.file.clone()),
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => return sh.fail(e),
                    Err(e) => {
                        return sh.fail(HubError::Protocol { what: job.file.f.path.clone(), reason: e.to_string() })
                    }
                }
            }
            Ok(false) => return,
            Err(e) => return sh.fail(e),
        }
    }
}

/// What one request for a range achieved.
enum Attempt {
    Done,
    Failed { reason: String, wait: Option<Duration> },
    Expired,
}

/// Fetch `[start, end)` with retries. `Ok(false)` when the run was aborted meanwhile.
async fn fetch_range(sh: &Arc<Shared>, job: &RangeJob) -> Result<bool, HubError> {
    let st = &job.file;
    let mut pos = job.start;
    let mut attempts = 0u32;
    loop {
        if sh.abort.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let before = pos;
        let (url, on_hub, generation) = st.location().await;
        let outcome = attempt(sh, st, job, &url, on_hub, &mut pos).await?;
        let reason = match outcome {
            Attempt::Done => return Ok(true),
            Attempt::Expired => {
                reresolve(sh, st, generation).await?;
                continue;
            }
            Attempt::Failed { reason, wait } => (reason, wait),
        };
        if pos > before {
            attempts = 0;
        }
        attempts += 1;
        if attempts >= sh.opts.backoff.max_attempts {
            return Err(HubError::Network {
                what: format!("{}: {} bytes {}-{}", sh.cache.repo, st.f.path, pos, job.end - 1),
                reason: format!("{}, after {attempts} attempts", reason.0),
            });
        }
        let delay = sh.opts.backoff.delay(attempts, jitter(pos ^ u64::from(attempts)), reason.1);
        sh.counters.retries.fetch_add(1, Ordering::Relaxed);
        sh.reporter.retry(&st.f.path, attempts, &reason.0, delay);
        tokio::time::sleep(delay).await;
    }
}

async fn reresolve(sh: &Arc<Shared>, st: &Arc<FileState>, generation: u32) -> Result<(), HubError> {
    let mut loc = st.location.lock().await;
    if loc.generation != generation {
        return Ok(()); // another range already did it
    }
    if st.reresolves.fetch_add(1, Ordering::SeqCst) >= MAX_RERESOLVES {
        return Err(HubError::Http {
            what: format!("{}: {} (signed URL)", sh.cache.repo, st.f.path),
            status: 403,
            message: format!(" (still refused after {MAX_RERESOLVES} fresh links)"),
        });
    }
    let r = sh.client.resolve(&sh.cache.repo, &sh.commit, &st.f.path).await?;
    cross_check(&sh.cache.repo, &sh.commit, &st.f, &r)?;
    sh.counters.reresolves.fetch_add(1, Ordering::Relaxed);
    sh.reporter.note(&format!("{}: signed link expired; resolved a fresh one", st.f.path));
    *loc = Location { url: r.location, on_hub: r.on_hub, generation: generation + 1 };
    Ok(())
}

fn failed(reason: impl Into<String>) -> Attempt {
    Attempt::Failed { reason: reason.into(), wait: None }
}

/// One ranged GET for `[pos, end)`; advances `pos` over every byte written.
async fn attempt(
    sh: &Arc<Shared>,
    st: &Arc<FileState>,
    job: &RangeJob,
    url: &str,
    on_hub: bool,
    pos: &mut u64,
) -> Result<Attempt, HubError> {
    let idle = sh.opts.idle;
    let mut rb = sh
        .client
        .http()
        .get(url)
        .header(RANGE, format!("bytes={}-{}", *pos, job.end - 1))
        .header(ACCEPT_ENCODING, "identity");
    if on_hub {
        if let Some(auth) = sh.client.auth_header() {
            rb = rb.header(AUTHORIZATION, auth);
        }
    }
    let mut resp = match tokio::time::timeout(idle, rb.send()).await {
        Err(_) => return Ok(failed(format!("no response in {} s", idle.as_secs_f32()))),
        Ok(Err(e)) => return Ok(failed(format!("request failed: {e}"))),
        Ok(Ok(r)) => r,
    };
    let status = resp.status().as_u16();
    match status {
        206 => {}
        200 => return Ok(failed("server ignored the Range header (200 with the whole file); nothing appended")),
        403 => return Ok(Attempt::Expired),
        s if retryable_status(s) => {
            let h = resp.headers();
            let wait = h
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(retry_after)
                .or_else(|| h.get("ratelimit").and_then(|v| v.to_str().ok()).and_then(ratelimit_wait));
            return Ok(Attempt::Failed { reason: format!("HTTP {s}"), wait });
        }
        s => {
            return Err(HubError::Http {
                what: format!("{}: {} from {}", sh.cache.repo, st.f.path, redact_query(url)),
                status: s,
                message: String::new(),
            })
        }
    }
    let cr = resp.headers().get(CONTENT_RANGE).and_then(|v| v.to_str().ok()).and_then(content_range);
    if cr != Some((*pos, job.end - 1, Some(st.f.size))) {
        return Ok(failed(format!(
            "wrong Content-Range {:?} for bytes {}-{}/{}; discarded",
            resp.headers().get(CONTENT_RANGE),
            *pos,
            job.end - 1,
            st.f.size
        )));
    }
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BUF);
    let mut result = None;
    loop {
        match tokio::time::timeout(idle, resp.chunk()).await {
            Err(_) => {
                result = Some(failed(format!("no data for {} s", idle.as_secs_f32())));
                break;
            }
            Ok(Err(e)) => {
                result = Some(failed(format!("connection broken: {e}")));
                break;
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(bytes))) => {
                let room = job.end - *pos - buf.len() as u64;
                let take = usize::try_from(room).map_or(bytes.len(), |r| r.min(bytes.len()));
                buf.extend_from_slice(&bytes[..take]);
                if take < bytes.len() {
                    result = Some(failed("body longer than the requested range; extra bytes dropped"));
                    break;
                }
                if buf.len() >= WRITE_BUF {
                    write(sh, st, job, pos, &mut buf)?;
                }
            }
        }
    }
    write(sh, st, job, pos, &mut buf)?;
    if *pos == job.end {
        return Ok(Attempt::Done);
    }
    Ok(result.unwrap_or_else(|| failed(format!("body ended at byte {} of {}-{}", *pos, job.start, job.end - 1))))
}

fn write(sh: &Shared, st: &FileState, job: &RangeJob, pos: &mut u64, buf: &mut Vec<u8>) -> Result<(), HubError> {
    if buf.is_empty() {
        return Ok(());
    }
    st.file.write_all_at(buf, *pos).map_err(|e| HubError::io(&st.partial, e))?;
    let n = buf.len() as u64;
    *pos += n;
    buf.clear();
    st.set_written(job.start, *pos);
    sh.counters.arrived(n);
    sh.reporter.bytes(&st.f.path, n);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
