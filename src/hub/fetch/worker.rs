//! The range workers: `--jobs` tasks, each taking the next byte range (see [`next_job`]),
//! fetching it from the signed URL with retries, writing it in place, journaling it.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_RANGE, RANGE};
use xet::xet_session::{SessionError, XetDownloadStream};

use super::super::error::HubError;
use super::super::headers::{content_range, ratelimit_wait, redact_query, retry_after};
use super::super::plan::cross_check;
use super::super::retry::{jitter, retryable_status};
use super::finalise::spawn_finalize;
use super::state::{open_file, FileState, Location, RangeJob, Shared, FILES_IN_FLIGHT};

/// Re-resolves allowed per file (signed URLs expire; each costs one `resolve`).
const MAX_RERESOLVES: u32 = 8;
/// Bytes buffered per request before a positional write.
const WRITE_BUF: usize = 1 << 20;

/// The next range: from the earliest open file below its share of connections; else from a
/// newly opened file while fewer than [`FILES_IN_FLIGHT`] are downloading; else any open file's
/// range (a connection never idles while some file has ranges left).
async fn next_job(sh: &Arc<Shared>) -> Result<Option<RangeJob>, HubError> {
    let share = sh.opts.jobs.div_ceil(FILES_IN_FLIGHT).max(1);
    let mut q = sh.queue.lock().await;
    loop {
        q.open.retain(|(_, pending)| !pending.is_empty());
        let below_share = q.open.iter().position(|(f, _)| f.inflight.load(Ordering::SeqCst) < share);
        let pick = match below_share {
            Some(i) => i,
            None if !q.files.is_empty() && sh.downloading.load(Ordering::SeqCst) < FILES_IN_FLIGHT => {
                let (f, r) = q.files.pop_front().ok_or(HubError::Internal("the file queue emptied while locked"))?;
                open_file(sh, f, r, &mut q)?;
                continue;
            }
            None if q.open.is_empty() => return Ok(None),
            None => 0,
        };
        let Some((file, pending)) = q.open.get_mut(pick) else { return Ok(None) };
        let Some((start, end)) = pending.pop_front() else { continue };
        file.inflight.fetch_add(1, Ordering::SeqCst);
        return Ok(Some(RangeJob { file: file.clone(), start, end }));
    }
}

pub(super) async fn worker(sh: Arc<Shared>) {
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
                // fsync + journal off the async threads, without holding this connection idle.
                let (sh2, file, (start, end)) = (sh.clone(), job.file.clone(), (job.start, job.end));
                tokio::task::spawn_blocking(move || match file.finish_range(&sh2, start, end) {
                    Ok(true) => {
                        sh2.downloading.fetch_sub(1, Ordering::SeqCst);
                        spawn_finalize(sh2.clone(), file);
                    }
                    Ok(false) => {}
                    Err(e) => sh2.fail(e),
                });
            }
            Ok(false) => return,
            Err(e) => return sh.fail(e),
        }
    }
}

/// What one request for a range achieved.
enum Attempt {
    Done,
    Failed {
        reason: String,
        wait: Option<Duration>,
        /// hf-xet's typed error, when it failed there.
        cause: Option<SessionError>,
    },
    Expired,
    /// The bridge refused a Xet-backed file (a 4xx): fetch it natively.
    Refused(String),
}

/// Fetch `[start, end)` with retries. `Ok(false)` when the run was aborted meanwhile.
async fn fetch_range(sh: &Arc<Shared>, job: &RangeJob) -> Result<bool, HubError> {
    let st = &job.file;
    let mut pos = job.start;
    // The position up to which this range's bytes are journaled.
    let mut journaled = job.start;
    let mut attempts = 0u32;
    loop {
        if sh.abort.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let before = pos;
        let (url, on_hub, generation, native) = st.location().await;
        let outcome = if native {
            attempt_xet(sh, st, job, (&mut pos, &mut journaled)).await?
        } else {
            attempt(sh, st, job, &url, on_hub, (&mut pos, &mut journaled)).await?
        };
        let reason = match outcome {
            Attempt::Done => return Ok(true),
            Attempt::Expired => {
                reresolve(sh, st, generation).await?;
                continue;
            }
            Attempt::Refused(why) => {
                switch_to_xet(sh, st, &why).await;
                continue;
            }
            Attempt::Failed { reason, wait, .. } => (reason, wait),
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
    *loc = Location { url: r.location, on_hub: r.on_hub, generation: generation + 1, xet: loc.xet };
    Ok(())
}

/// From now on fetch `st` through the native Xet protocol; said once per file.
async fn switch_to_xet(sh: &Shared, st: &FileState, why: &str) {
    let mut loc = st.location.lock().await;
    if !loc.xet {
        loc.xet = true;
        sh.counters.xet_files.fetch_add(1, Ordering::Relaxed);
        sh.reporter.note(&format!(
            "{}: the bridge refused it ({why}); fetching it through the Xet protocol (CAS reconstruction)",
            st.f.path
        ));
    }
}

fn failed(reason: impl Into<String>) -> Attempt {
    Attempt::Failed { reason: reason.into(), wait: None, cause: None }
}

/// One ranged GET for `[pos, end)`; advances `pos` over every byte written (and `journaled`
/// over every byte journaled).
async fn attempt(
    sh: &Arc<Shared>,
    st: &Arc<FileState>,
    job: &RangeJob,
    url: &str,
    on_hub: bool,
    (pos, journaled): (&mut u64, &mut u64),
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
    let resp = match tokio::time::timeout(idle, rb.send()).await {
        Err(_) => return Ok(failed(format!("no response in {} s", idle.as_secs_f32()))),
        Ok(Err(e)) => return Ok(failed(format!("request failed: {e}"))),
        Ok(Ok(r)) => r,
    };
    let status = resp.status().as_u16();
    match status {
        206 => {}
        200 => return Ok(failed("server ignored the Range header (200 with the whole file); nothing appended")),
        403 => return Ok(Attempt::Expired),
        s if (400..500).contains(&s) && !retryable_status(s) && st.xet.is_some() => {
            return Ok(Attempt::Refused(format!("HTTP {s} from {}", host_of(url))))
        }
        s if retryable_status(s) => {
            let h = resp.headers();
            let wait = h
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(retry_after)
                .or_else(|| h.get("ratelimit").and_then(|v| v.to_str().ok()).and_then(ratelimit_wait));
            return Ok(Attempt::Failed { reason: format!("HTTP {s}"), wait, cause: None });
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
    receive(sh, st, job, &mut Body::Http(resp), (pos, journaled)).await
}

/// One ranged stream of `[pos, end)` of a Xet-backed file from hf-xet (reconstruction, xorb
/// range GETs, chunk decode), written like a ranged GET's body. A refused CAS token (judged
/// from hf-xet's typed error, see `xet::token`) renews the Xet source: a fresh `xet-read-token`
/// on the next attempt.
async fn attempt_xet(
    sh: &Arc<Shared>,
    st: &Arc<FileState>,
    job: &RangeJob,
    (pos, journaled): (&mut u64, &mut u64),
) -> Result<Attempt, HubError> {
    let x = st.xet.as_ref().ok_or(HubError::Internal("a file on the Xet path has no Xet hash"))?;
    let src = sh.xet_source(x);
    let idle = sh.opts.idle;
    let (stream, generation) = match tokio::time::timeout(idle, src.stream(&x.hash, st.f.size, *pos..job.end)).await {
        Err(_) => return Ok(failed(format!("Xet: no reconstruction in {} s", idle.as_secs_f32()))),
        Ok(Err(e)) => {
            if let Some(err) = e.refused.and_then(|status| sh.client.refused(&sh.cache.repo, &st.f.path, status)) {
                return Err(err);
            }
            if let Some(cause) = &e.cause {
                src.judge(e.generation, cause, &x.hash).await;
            }
            return Ok(failed(format!("Xet: {}", e.reason)));
        }
        Ok(Ok(s)) => s,
    };
    let outcome = receive(sh, st, job, &mut Body::Xet(stream), (pos, journaled)).await?;
    if let Attempt::Failed { cause: Some(cause), .. } = &outcome {
        src.judge(generation, cause, &x.hash).await;
    }
    Ok(outcome)
}

/// Where a range's bytes come from.
enum Body {
    Http(reqwest::Response),
    Xet(XetDownloadStream),
}

impl Body {
    async fn chunk(&mut self) -> Result<Option<bytes::Bytes>, Attempt> {
        match self {
            Body::Http(r) => r.chunk().await.map_err(|e| failed(format!("connection broken: {e}"))),
            Body::Xet(s) => s.next().await.map_err(|e| Attempt::Failed {
                reason: format!("Xet reconstruction failed: {e}"),
                wait: None,
                cause: Some(e),
            }),
        }
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        if let Body::Xet(s) = self {
            s.cancel();
        }
    }
}

/// Write a range's body at its offset, journaling every `journal_every` bytes; advances `pos`
/// over every byte written (and `journaled` over every byte journaled).
async fn receive(
    sh: &Arc<Shared>,
    st: &Arc<FileState>,
    job: &RangeJob,
    body: &mut Body,
    (pos, journaled): (&mut u64, &mut u64),
) -> Result<Attempt, HubError> {
    let idle = sh.opts.idle;
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BUF);
    let mut result = None;
    loop {
        match tokio::time::timeout(idle, body.chunk()).await {
            Err(_) => {
                result = Some(failed(format!("no data for {} s", idle.as_secs_f32())));
                break;
            }
            Ok(Err(e)) => {
                result = Some(e);
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
                    if *pos - *journaled >= sh.opts.journal_every {
                        checkpoint(st, sh).await?;
                        *journaled = *pos;
                    }
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

/// The host of a URL (for messages: signed URLs carry secrets in their query).
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// Journal the progress of the ranges being written (fsync off the async threads).
async fn checkpoint(st: &Arc<FileState>, sh: &Arc<Shared>) -> Result<(), HubError> {
    let (st2, sh2) = (st.clone(), sh.clone());
    tokio::task::spawn_blocking(move || st2.checkpoint(&sh2))
        .await
        .map_err(|e| HubError::Protocol { what: st.f.path.clone(), reason: e.to_string() })?
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
