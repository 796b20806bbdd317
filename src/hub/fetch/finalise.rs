//! The finaliser of each file: a hasher trailing the contiguous written prefix, then, once the
//! last range is in, the SHA-256 check, promotion into `blobs/`, the snapshot link — or one
//! refetch of the whole file on a mismatch.

use std::fs;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sha2::Digest as _;

use super::super::error::HubError;
use super::super::hashing::drop_cached;
use super::super::journal::RangeSet;
use super::state::{lock, FileState, Progress, Shared};
use super::Fetched;
use crate::hex::encode as hex;

/// Read size of the trailing hasher.
const HASH_READ: usize = 4 << 20;

/// Hash the file's contiguous written prefix as it grows (on a blocking thread).
pub(super) fn start_hasher(sh: &Arc<Shared>, st: &Arc<FileState>) {
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

pub(super) fn spawn_finalize(sh: Arc<Shared>, st: Arc<FileState>) {
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
        sh.downloading.fetch_add(1, Ordering::SeqCst);
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
