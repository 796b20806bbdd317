//! The Xet side of the fake Hub: xet-core's own local CAS HTTP server (`xet-client`, feature
//! `simulation`), filled through hf-xet's real upload path, behind a thin proxy on its own port.
//! The proxy is what clients are told about (`casUrl`): it checks the CAS token the Hub minted
//! (401 when unknown, expired or revoked), logs every request, and injects faults on the
//! reconstruction API and the xorb fetches. Term URLs point back at the proxy because the CAS
//! builds them from the request's `Host`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State as AxState};
use axum::response::Response;
use xet::xet_session::{Sha256Policy, XetSessionBuilder};
use xet_client::cas_client::{LocalTestServer, LocalTestServerBuilder};

use super::model::{Content, FaultKind, Route};
use super::serve::{auth_of, now_secs, resp, take_fault, State};

/// The CAS server (stops when dropped) and the scratch directory of the uploads' session.
pub(super) struct Cas {
    _server: LocalTestServer,
    pub(super) upstream: String,
    pub(super) scratch: tempfile::TempDir,
}

pub(super) async fn start() -> Cas {
    let server = LocalTestServerBuilder::new().with_ephemeral_disk().start().await;
    let upstream = server.http_endpoint().to_string();
    Cas { _server: server, upstream, scratch: tempfile::tempdir().unwrap() }
}

/// Put every content into the CAS through hf-xet's upload commit (chunking, xorbs, shards: the
/// real client's path) and return each one's Xet file hash, in order.
pub(super) async fn upload(cas: &Cas, items: Vec<Content>) -> Vec<String> {
    let session = XetSessionBuilder::new().with_cache_dir(cas.scratch.path().join("xet")).build().unwrap();
    let commit = session
        .new_upload_commit()
        .unwrap()
        .with_endpoint(cas.upstream.clone())
        .with_token_info("write-token", now_secs() + 3600)
        .build()
        .await
        .unwrap();
    let mut handles = Vec::new();
    for c in items {
        let h = match c {
            Content::Mem(v) => commit.upload_bytes(v.to_vec(), Sha256Policy::Skip, None).await,
            Content::Disk(p) => commit.upload_from_path(p, Sha256Policy::Skip).await,
        };
        handles.push(h.unwrap());
    }
    let mut hashes = Vec::new();
    for h in handles {
        hashes.push(h.finalize_ingestion().await.unwrap().xet_info.hash);
    }
    commit.commit().await.unwrap();
    hashes
}

/// What a CAS request is, for faults and counters: `reconstructions`, `fetch_term` or `other`.
fn kind_of(path: &str) -> &'static str {
    if path.starts_with("/v1/fetch_term") {
        "fetch_term"
    } else if path.contains("/reconstructions") {
        "reconstructions"
    } else {
        "other"
    }
}

/// Whether `auth` carries a CAS token the Hub minted that is neither expired nor revoked.
fn token_ok(st: &State, auth: Option<&str>) -> bool {
    let Some(t) = auth.and_then(|a| a.strip_prefix("Bearer ")) else { return false };
    st.cas_tokens.lock().unwrap().get(t).is_some_and(|exp| *exp > now_secs())
}

pub(super) async fn cas_handler(AxState(st): AxState<Arc<State>>, req: Request) -> Response {
    let auth = auth_of(req.headers());
    let path_q = req.uri().path_and_query().map_or_else(|| "/".to_string(), ToString::to_string);
    let kind = kind_of(req.uri().path());
    {
        let mut log = st.log.lock().unwrap();
        log.auth.push((Route::Cas, auth.clone()));
        log.cas_calls.push((kind.to_string(), req.headers().get("range").map(|v| v.to_str().unwrap_or("").into())));
    }
    // Term URLs stand for presigned storage URLs (no token); everything else needs one.
    if kind != "fetch_term" && !token_ok(&st, auth.as_deref()) {
        return resp(401).body(Body::from("invalid or expired CAS token")).unwrap();
    }
    let fault = take_fault(&st, Route::Cas, kind);
    if let Some(FaultKind::Status(s)) = fault {
        if s == 401 {
            // A revoked token: every token minted so far stops working.
            st.cas_tokens.lock().unwrap().values_mut().for_each(|e| *e = 0);
        }
        return resp(s).body(Body::from("scripted failure")).unwrap();
    }
    let Some(upstream) = st.cas_upstream.lock().unwrap().clone() else {
        return resp(503).body(Body::from("no CAS")).unwrap();
    };
    let host = st.cas.trim_start_matches("http://").to_string();
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes()).unwrap();
    let mut rb = st.http.request(method, format!("{upstream}{path_q}")).header("host", host);
    for h in ["range", "content-type", "authorization"] {
        if let Some(v) = req.headers().get(h) {
            rb = rb.header(h, v.as_bytes());
        }
    }
    let body = axum::body::to_bytes(req.into_body(), 1 << 30).await.unwrap_or_default();
    let up = match rb.body(body.to_vec()).send().await {
        Ok(r) => r,
        Err(e) => return resp(502).body(Body::from(format!("upstream: {e}"))).unwrap(),
    };
    let mut b = resp(up.status().as_u16());
    for h in ["content-type", "content-range"] {
        if let Some(v) = up.headers().get(h) {
            b = b.header(h, v.as_bytes());
        }
    }
    let mut data = up.bytes().await.unwrap_or_default().to_vec();
    st.cas_bytes.fetch_add(data.len() as u64, Ordering::SeqCst);
    let cut_at = match fault {
        Some(FaultKind::CorruptByte) if !data.is_empty() => {
            let mid = data.len() / 2;
            data[mid] ^= 0x5a;
            None
        }
        Some(FaultKind::DropAfter(n)) => Some((n, Duration::from_millis(200))),
        Some(FaultKind::TrickleStall { bytes }) => Some((bytes, Duration::from_secs(30))),
        _ => None,
    };
    let rate = st.rate.load(Ordering::SeqCst);
    if cut_at.is_none() && rate == 0 {
        return b.header("content-length", data.len().to_string()).body(Body::from(data)).unwrap();
    }
    paced(b, data, rate, cut_at)
}

/// Send `data` (announcing all of it) in 64 KiB pieces at `rate` bytes/s (0 = at once); with
/// `cut_at = (n, wait)`, stop after `n` bytes, stay silent `wait`, then break the connection.
fn paced(b: axum::http::response::Builder, data: Vec<u8>, rate: u64, cut_at: Option<(u64, Duration)>) -> Response {
    let len = data.len();
    let stop = cut_at.map_or(len, |(n, _)| usize::try_from(n).unwrap().min(len.saturating_sub(1)));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(2);
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let mut sent = 0;
        while sent < stop {
            let n = (64 << 10).min(stop - sent);
            if rate > 0 {
                #[allow(clippy::cast_precision_loss)]
                let due = Duration::from_secs_f64((sent + n) as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            if tx.send(Ok(Bytes::copy_from_slice(&data[sent..sent + n]))).await.is_err() {
                return;
            }
            sent += n;
        }
        if let Some((_, wait)) = cut_at {
            tokio::time::sleep(wait).await;
            let _ = tx.send(Err(std::io::Error::other("scripted drop"))).await;
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    b.header("content-length", len.to_string()).body(Body::from_stream(stream)).unwrap()
}
