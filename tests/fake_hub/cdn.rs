//! The fake CDN: signed, expiring URLs serving ranges (`a-b`, `a-`, `-n`), `416`, scripted
//! faults and pacing, with a log of every answer and the connections in flight.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State as AxState};
use axum::http::Method;
use axum::response::Response;

use super::model::{FaultKind, Route, Served};
use super::serve::{auth_of, error, now_secs, query, resp, sign, take_fault, State};

/// Parse `bytes=a-b`, `a-`, `-n` against `size` → inclusive range; `Err` = unsatisfiable.
fn parse_range(v: &str, size: u64) -> Result<(u64, u64), ()> {
    let spec = v.trim().strip_prefix("bytes=").ok_or(())?;
    let (a, b) = spec.split_once('-').ok_or(())?;
    let r = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().map_err(|_| ())?;
            (size.saturating_sub(n), size - 1)
        }
        (a, "") => (a.parse().map_err(|_| ())?, size - 1),
        (a, b) => (a.parse().map_err(|_| ())?, b.parse::<u64>().map_err(|_| ())?.min(size - 1)),
    };
    if r.0 > r.1 || r.0 >= size {
        return Err(());
    }
    Ok(r)
}

pub(super) async fn cdn_handler(AxState(st): AxState<Arc<State>>, req: Request) -> Response {
    st.log.lock().unwrap().auth.push((Route::Cdn, auth_of(req.headers())));
    let raw = req.uri().path().to_string();
    let Some(sha) = raw.strip_prefix("/xet-bridge/") else { return error(404, "NotFound", "not found") };
    let q = query(req.uri());
    let expires: u64 = q.get("Expires").and_then(|e| e.parse().ok()).unwrap_or(0);
    if q.get("Signature").map(String::as_str) != Some(sign(&st, sha, expires).as_str()) {
        return resp(403).body(Body::from("Invalid signature")).unwrap();
    }
    let file = {
        let repos = st.repos.lock().unwrap();
        repos.values().flat_map(|r| r.commits.values()).flat_map(|c| c.files.iter()).find(|f| f.sha256 == sha).cloned()
    };
    let Some(f) = file else { return resp(404).body(Body::from("NoSuchKey")).unwrap() };
    let range_hdr = req.headers().get("range").and_then(|v| v.to_str().ok()).map(str::to_string);
    let mut fault = take_fault(&st, Route::Cdn, &f.path);
    if expires < now_secs() || fault == Some(FaultKind::Expire) {
        log_served(&st, &f.path, None, 403, 0, false);
        return resp(403).body(Body::from("Request has expired")).unwrap();
    }
    let range = match &range_hdr {
        None => None,
        Some(v) => match parse_range(v, f.size) {
            Ok(r) => Some(r),
            Err(()) => {
                log_served(&st, &f.path, None, 416, 0, false);
                return resp(416).header("content-range", format!("bytes */{}", f.size)).body(Body::empty()).unwrap();
            }
        },
    };
    match fault {
        Some(FaultKind::Status(s)) => {
            log_served(&st, &f.path, range, s, 0, false);
            return resp(s).body(Body::from("scripted failure")).unwrap();
        }
        Some(FaultKind::TooMany { retry_after }) => {
            log_served(&st, &f.path, range, 429, 0, false);
            return resp(429)
                .header("retry-after", retry_after.to_string())
                .body(Body::from("Too Many Requests"))
                .unwrap();
        }
        _ => {}
    }
    let (status, span) = match (range, &fault) {
        (_, Some(FaultKind::IgnoreRange)) | (None, _) => (200u16, (0, f.size - 1)),
        (Some(r), _) => (206, r),
    };
    if fault == Some(FaultKind::IgnoreRange) {
        fault = None;
    }
    let len = span.1 - span.0 + 1;
    let mut b = resp(status)
        .header("content-length", len.to_string())
        .header("accept-ranges", "bytes")
        .header("etag", format!("\"{}\"", "e".repeat(64)));
    if status == 206 {
        let shown = if fault == Some(FaultKind::WrongContentRange) { (span.0 + 1, span.1 + 1) } else { span };
        b = b.header("content-range", format!("bytes {}-{}/{}", shown.0, shown.1, f.size));
    }
    let idx = log_served(&st, &f.path, range, status, 0, false);
    if req.method() == Method::HEAD {
        return b.body(Body::empty()).unwrap();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let st2 = st.clone();
    let now = st.active.fetch_add(1, Ordering::SeqCst) + 1;
    st.peak.fetch_max(now, Ordering::SeqCst);
    {
        let mut files = st.active_files.lock().unwrap();
        *files.entry(f.path.clone()).or_default() += 1;
        st.peak_files.fetch_max(files.len(), Ordering::SeqCst);
    }
    tokio::spawn(async move {
        let rate = st2.rate.load(Ordering::SeqCst);
        let started = Instant::now();
        let mut sent = 0u64;
        let mut ok = true;
        while sent < len {
            let chunk = if rate > 0 && rate < (16 << 20) { 32u64 << 10 } else { 256 << 10 };
            let mut n = chunk.min(len - sent);
            match fault {
                Some(FaultKind::DropAfter(k)) if sent + n > k => {
                    n = k.saturating_sub(sent);
                    if n == 0 {
                        // Let the bytes already handed over reach the socket, then cut it.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let _ = tx.send(Err(std::io::Error::other("scripted drop"))).await;
                        ok = false;
                        break;
                    }
                }
                Some(FaultKind::TrickleStall { bytes }) => {
                    if sent >= bytes {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        ok = false;
                        break;
                    }
                    n = n.min(1024);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                _ => {}
            }
            let mut data = f.content.read(span.0 + sent, usize::try_from(n).unwrap());
            if fault == Some(FaultKind::CorruptByte) && sent == 0 {
                data[0] ^= 0x5a;
            }
            if rate > 0 {
                // Pace before sending: the connection never runs ahead of `rate`.
                #[allow(clippy::cast_precision_loss)]
                let due = Duration::from_secs_f64((sent + n) as f64 / rate as f64);
                let el = started.elapsed();
                if el < due {
                    tokio::time::sleep(due - el).await;
                }
            }
            if tx.send(Ok(Bytes::from(data))).await.is_err() {
                ok = false;
                break;
            }
            sent += n;
            st2.log.lock().unwrap().served[idx].bytes = sent;
        }
        st2.log.lock().unwrap().served[idx].complete = ok && sent == len;
        {
            let mut files = st2.active_files.lock().unwrap();
            if let Some(n) = files.get_mut(&f.path) {
                *n -= 1;
                if *n == 0 {
                    files.remove(&f.path);
                }
            }
        }
        st2.active.fetch_sub(1, Ordering::SeqCst);
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    b.body(Body::from_stream(stream)).unwrap()
}

fn log_served(st: &State, path: &str, range: Option<(u64, u64)>, status: u16, bytes: u64, complete: bool) -> usize {
    let mut log = st.log.lock().unwrap();
    log.served.push(Served { path: path.into(), range, status, bytes, complete });
    log.served.len() - 1
}
