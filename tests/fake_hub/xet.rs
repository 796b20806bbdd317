//! The Hub's half of Xet: `X-Xet-Hash` and the `xet-auth` link on `resolve` (in serve.rs),
//! `xet-read-token` minting CAS tokens for the proxy in cas.rs, and pushing a commit whose LFS
//! files are put into the CAS by hf-xet's upload path.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::response::Response;

use super::model::{FakeFile, Fault, FaultKind, Route};
use super::serve::{now_secs, resp, FakeHub, State};

/// `Link: <…/xet-read-token/{commit}>; rel="xet-auth"`, as the Hub sends on `resolve`.
pub(super) fn auth_link(st: &State, repo: &str, commit: &str) -> String {
    format!("<{}/api/models/{repo}/xet-read-token/{commit}>; rel=\"xet-auth\"", st.hub)
}

/// `GET /api/models/{repo}/xet-read-token/{rev}`: a fresh CAS token, as the JSON body hf-xet's
/// refresher parses and as the headers huggingface_hub reads.
pub(super) fn read_token(st: &State) -> Response {
    let n = st.cas_tokens.lock().unwrap().len();
    let token = format!("xet-{n}-{}", now_secs());
    let exp = now_secs() + st.cas_token_ttl.load(Ordering::SeqCst);
    st.cas_tokens.lock().unwrap().insert(token.clone(), exp);
    let body = serde_json::json!({"accessToken": token, "exp": exp, "casUrl": st.cas});
    resp(200)
        .header("content-type", "application/json")
        .header("x-xet-cas-url", &st.cas)
        .header("x-xet-access-token", &token)
        .header("x-xet-token-expiration", exp.to_string())
        .body(Body::from(body.to_string()))
        .unwrap()
}

impl FakeHub {
    /// Like [`FakeHub::push`], with every LFS file also put into the local CAS (started on first
    /// use) through hf-xet's upload commit: `resolve` then announces it as Xet-backed.
    pub fn push_xet(&self, repo: &str, branch: &str, mut files: Vec<FakeFile>) -> String {
        let rt = self.rt.as_ref().unwrap();
        let mut guard = self.cas_server.lock().unwrap();
        if guard.is_none() {
            let cas = rt.block_on(super::cas::start());
            *self.state.cas_upstream.lock().unwrap() = Some(cas.upstream.clone());
            *guard = Some(cas);
        }
        let cas = guard.as_ref().unwrap();
        let lfs: Vec<usize> = (0..files.len()).filter(|&i| files[i].lfs).collect();
        let hashes = rt.block_on(super::cas::upload(cas, lfs.iter().map(|&i| files[i].content.clone()).collect()));
        for (i, h) in lfs.into_iter().zip(hashes) {
            files[i].xet_hash = Some(h);
        }
        drop(guard);
        self.push(repo, branch, files)
    }

    /// Redirect LFS files to `origin` + `/xet-bridge/<sha256>` (e.g. nginx serving the files
    /// with a per-connection rate limit) instead of the CDN listener.
    pub fn set_bridge(&self, origin: &str) {
        *self.state.bridge.lock().unwrap() = Some(origin.trim_end_matches('/').to_string());
    }

    /// The bridge (the CDN origin) answers `400` to every request for `path`, as the real one
    /// does for very large files.
    pub fn bridge_refuses(&self, path: &str) {
        self.fault(Fault { times: u32::MAX, ..Fault::cdn(path, FaultKind::Status(400)) });
    }

    /// A scripted fault on the CAS proxy for requests of `kind` (`reconstructions`, `fetch_term`).
    pub fn cas_fault(&self, kind: &str, f: FaultKind, skip: u32, times: u32) {
        self.fault(Fault { route: Route::Cas, path: Some(kind.into()), kind: f, skip, times });
    }

    /// Every CAS token minted so far stops working (the CAS answers 401).
    pub fn revoke_cas_tokens(&self) {
        self.state.cas_tokens.lock().unwrap().values_mut().for_each(|e| *e = 0);
    }

    /// Lifetime of the CAS tokens minted from now on.
    pub fn set_cas_token_ttl(&self, secs: u64) {
        self.state.cas_token_ttl.store(secs, Ordering::SeqCst);
    }

    /// CAS requests so far: (kind, Range header).
    pub fn cas_calls(&self) -> Vec<(String, Option<String>)> {
        self.state.log.lock().unwrap().cas_calls.clone()
    }

    /// Bytes the CAS proxy has sent so far (reconstruction answers and xorb ranges).
    pub fn cas_bytes(&self) -> u64 {
        self.state.cas_bytes.load(Ordering::SeqCst)
    }

    /// `xet-read-token` calls so far.
    pub fn xet_token_calls(&self) -> usize {
        self.api_calls().iter().filter(|c| c.contains("/xet-read-token/")).count()
    }
}
