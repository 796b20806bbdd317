//! The state of one fetch: what the range workers and finalisers share, each open file's
//! progress (finished ranges, ranges being written) and its resume journal.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::super::api::{HubClient, Resolved, XetRef};
use super::super::cache::{BlobLock, RepoCache};
use super::super::error::HubError;
use super::super::journal::{Journal, RangeSet};
use super::super::plan::PlannedFile;
use super::super::report::Reporter;
use super::super::xet::XetSource;
use super::finalise::{spawn_finalize, start_hasher};
use super::{Counters, Fetched, Options, Transport};

/// Files whose ranges are fetched at the same time: enough to keep every connection busy, few
/// enough that each file's hasher trails its download closely (its lag is about
/// `jobs / FILES_IN_FLIGHT` ranges). Files being hashed or finalised do not count.
pub(super) const FILES_IN_FLIGHT: usize = 4;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock means a task panicked; the data (counters, sets) is still consistent
    // enough to report the failure, so keep going instead of panicking again.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) struct Shared {
    pub(super) client: Arc<HubClient>,
    pub(super) cache: RepoCache,
    pub(super) commit: String,
    pub(super) opts: Options,
    pub(super) reporter: Arc<dyn Reporter>,
    pub(super) counters: Arc<Counters>,
    pub(super) abort: AtomicBool,
    pub(super) error: Mutex<Option<HubError>>,
    pub(super) queue: tokio::sync::Mutex<Queue>,
    /// Files opened and not yet finalised.
    pub(super) in_flight: AtomicUsize,
    /// Files opened whose ranges are not all finished (at most [`FILES_IN_FLIGHT`]).
    pub(super) downloading: AtomicUsize,
    pub(super) wake: tokio::sync::Notify,
    pub(super) results: Mutex<Vec<Fetched>>,
    /// The native Xet path, set up by the first file that needs it.
    pub(super) xet: std::sync::OnceLock<XetSource>,
    /// hf-xet's working directory.
    pub(super) scratch: PathBuf,
}

impl Shared {
    /// The Xet source of this repo download (its token route comes from the first Xet file).
    pub(super) fn xet_source(&self, x: &XetRef) -> &XetSource {
        // The Hub token goes to the Hub's own origin only (the token route is there).
        let on_hub = x.token_url.starts_with(&format!("{}/", self.client.endpoint()));
        let auth = if on_hub { self.client.auth_header() } else { None };
        self.xet
            .get_or_init(|| XetSource::new(self.client.http().clone(), x.token_url.clone(), auth, self.scratch.clone()))
    }

    pub(super) fn fail(&self, e: HubError) {
        let mut slot = lock(&self.error);
        if slot.is_none() {
            *slot = Some(e);
        }
        self.abort.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }
}

/// An opened file and its ranges not requested yet, in offset order.
pub(super) type Pending = (Arc<FileState>, VecDeque<(u64, u64)>);

pub(super) struct Queue {
    /// Files not opened yet, in fetch order.
    pub(super) files: VecDeque<(PlannedFile, Resolved)>,
    /// Opened files with ranges still to request.
    pub(super) open: VecDeque<Pending>,
}

pub(super) struct RangeJob {
    pub(super) file: Arc<FileState>,
    pub(super) start: u64,
    pub(super) end: u64,
}

/// Where the bytes of a file are: the signed URL and a generation bumped at each re-resolve,
/// or (`xet`) the native Xet protocol.
pub(super) struct Location {
    pub(super) url: String,
    pub(super) on_hub: bool,
    pub(super) generation: u32,
    pub(super) xet: bool,
}

#[derive(Default)]
pub(super) struct Progress {
    /// Finished ranges (in memory; the journal trails by one fsync).
    pub(super) done: RangeSet,
    /// Ranges being written: start → next byte to write.
    pub(super) active: BTreeMap<u64, u64>,
    /// The hasher must stop (abort or refetch).
    pub(super) stop: bool,
}

impl Progress {
    /// Finished ranges plus the written prefix of every range in progress: what is on disk
    /// once the partial file is fsynced.
    pub(super) fn durable(&self) -> RangeSet {
        let mut d = self.done.clone();
        for (&start, &pos) in &self.active {
            d.insert(start, pos);
        }
        d
    }

    /// End of the contiguous prefix of written bytes.
    pub(super) fn watermark(&self) -> u64 {
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

pub(super) struct FileState {
    pub(super) f: PlannedFile,
    pub(super) file: File,
    pub(super) partial: PathBuf,
    pub(super) journal: PathBuf,
    pub(super) location: tokio::sync::Mutex<Location>,
    /// The file's Xet reference when the native path may be used for it.
    pub(super) xet: Option<XetRef>,
    pub(super) reresolves: AtomicU32,
    pub(super) progress: Mutex<Progress>,
    pub(super) changed: Condvar,
    pub(super) journal_lock: Mutex<()>,
    pub(super) hasher: Mutex<Option<tokio::task::JoinHandle<Option<String>>>>,
    pub(super) refetched: AtomicBool,
    /// Range requests of this file in flight.
    pub(super) inflight: AtomicUsize,
    pub(super) _lock: BlobLock,
}

impl FileState {
    pub(super) async fn location(&self) -> (String, bool, u32, bool) {
        let l = self.location.lock().await;
        (l.url.clone(), l.on_hub, l.generation, l.xet)
    }

    pub(super) fn set_written(&self, start: u64, pos: u64) {
        lock(&self.progress).active.insert(start, pos);
        self.changed.notify_all();
    }

    /// Record a finished range; fsync the data and the journal. Returns whether the file is complete.
    pub(super) fn finish_range(&self, sh: &Shared, start: u64, end: u64) -> Result<bool, HubError> {
        // The journal lock is taken first so journal writes happen in the order ranges were
        // recorded: the write that completes the file is the last one.
        let _g = lock(&self.journal_lock);
        let (done, complete) = {
            let mut p = lock(&self.progress);
            p.active.remove(&start);
            p.done.insert(start, end);
            (p.durable(), p.done.covered() == self.f.size)
        };
        self.changed.notify_all();
        self.save_journal(sh, done)?;
        Ok(complete)
    }

    /// Journal the progress inside the ranges being written (every [`Options::journal_every`]
    /// bytes of a range), so a `kill -9` loses at most that much per connection.
    pub(super) fn checkpoint(&self, sh: &Shared) -> Result<(), HubError> {
        let _g = lock(&self.journal_lock);
        // Taken before the fsync: every byte it names was written before the fsync starts.
        let durable = lock(&self.progress).durable();
        self.save_journal(sh, durable)
    }

    /// fsync the partial file, then record `done` in the journal (atomically replaced).
    fn save_journal(&self, sh: &Shared, done: RangeSet) -> Result<(), HubError> {
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
        .map_err(|e| HubError::io(&self.journal, e))
    }
}

/// Open (or resume) the partial blob of a file and queue its missing ranges.
pub(super) fn open_file(
    sh: &Arc<Shared>,
    f: PlannedFile,
    r: Resolved,
    q: &mut Queue,
) -> Result<Arc<FileState>, HubError> {
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
    let xet = if sh.opts.transport == Transport::Bridge { None } else { r.xet };
    let native = xet.is_some() && sh.opts.transport == Transport::Xet;
    if native {
        sh.counters.xet_files.fetch_add(1, Ordering::Relaxed);
    }
    let state = Arc::new(FileState {
        file,
        partial,
        journal,
        location: tokio::sync::Mutex::new(Location { url: r.location, on_hub: r.on_hub, generation: 0, xet: native }),
        xet,
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
    if !missing.is_empty() {
        sh.downloading.fetch_add(1, Ordering::SeqCst);
    }
    start_hasher(sh, &state);
    if missing.is_empty() {
        spawn_finalize(sh.clone(), state.clone());
    }
    if !missing.is_empty() {
        q.open.push_back((state.clone(), missing.into()));
    }
    Ok(state)
}
