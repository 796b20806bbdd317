//! The two listeners (Hub and CDN) and their handlers. Routing is by hand over the raw path so
//! percent-encoded revisions and nested file paths are seen exactly as a client sent them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State as AxState};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::Router;
use sha2::Digest as _;

use super::cdn::cdn_handler;
pub use super::model::Served;
use super::model::{CommitFiles, Dialect, FakeFile, Fault, FaultKind, Log, Repo, Route};

pub(super) struct State {
    pub(super) repos: Mutex<HashMap<String, Repo>>,
    pub(super) faults: Mutex<Vec<Fault>>,
    pub(super) log: Mutex<Log>,
    pub(super) dialect: Mutex<Dialect>,
    pub(super) page_size: AtomicUsize,
    /// Body bytes per second per response (0 = unlimited).
    pub(super) rate: AtomicU64,
    pub(super) ttl_secs: AtomicU64,
    pub(super) commits_made: AtomicU64,
    /// CDN bodies being sent now, and the most at once.
    pub(super) active: AtomicUsize,
    pub(super) peak: AtomicUsize,
    /// CDN bodies being sent now per file, and the most distinct files at once.
    pub(super) active_files: Mutex<HashMap<String, usize>>,
    pub(super) peak_files: AtomicUsize,
    pub(super) hub: String,
    pub(super) cdn: String,
    pub(super) secret: String,
    /// The CAS proxy's URL (what `xet-read-token` hands out) and the CAS behind it.
    pub(super) cas: String,
    /// Another server that serves `/xet-bridge/<sha256>` instead of the CDN listener (bench).
    pub(super) bridge: Mutex<Option<String>>,
    pub(super) cas_upstream: Mutex<Option<String>>,
    /// CAS tokens minted by `xet-read-token` → expiry (unix seconds).
    pub(super) cas_tokens: Mutex<HashMap<String, u64>>,
    pub(super) cas_token_ttl: AtomicU64,
    /// Body bytes the CAS proxy passed on.
    pub(super) cas_bytes: AtomicU64,
    pub(super) http: reqwest::Client,
}

/// A running fake Hub; stops when dropped.
pub struct FakeHub {
    pub endpoint: String,
    pub cdn: String,
    /// The CAS proxy (`casUrl` of `xet-read-token`).
    pub cas: String,
    pub(super) state: Arc<State>,
    pub(super) rt: Option<tokio::runtime::Runtime>,
    /// The local CAS, started by the first `push_xet`.
    pub(super) cas_server: Mutex<Option<super::cas::Cas>>,
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        if let Some(cas) = self.cas_server.lock().unwrap().take() {
            if let Some(rt) = &self.rt {
                let _guard = rt.enter();
                drop(cas);
            }
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn query(uri: &axum::http::Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), decode(v)))
        .collect()
}

pub(super) fn resp(status: u16) -> axum::http::response::Builder {
    Response::builder().status(status)
}

/// A "not found" (or gated) answer as `st`'s dialect writes it: the Hub's own status and
/// `X-Error-Code`, another implementation's `404 EntryNotFound` for everything, or a bare `404`.
fn missing(st: &State, status: u16, code: &str, msg: &str, commit: Option<&str>) -> Response {
    let dialect = *st.dialect.lock().unwrap();
    let b = match dialect {
        Dialect::Hub => {
            let b = resp(status).header("x-error-code", code).header("x-error-message", msg);
            match commit {
                Some(c) => b.header("x-repo-commit", c),
                None => b,
            }
        }
        Dialect::EntryOnly => {
            resp(404).header("x-error-code", "EntryNotFound").header("x-error-message", "Entry not found")
        }
        Dialect::Bare => resp(404),
    };
    b.header("content-type", "application/json").body(Body::from(format!("{{\"error\":\"{msg}\"}}"))).unwrap()
}

pub(super) fn error(status: u16, code: &str, msg: &str) -> Response {
    resp(status)
        .header("x-error-code", code)
        .header("x-error-message", msg)
        .header("content-type", "application/json")
        .body(Body::from(format!("{{\"error\":\"{msg}\"}}")))
        .unwrap()
}

impl FakeHub {
    /// Start both listeners on 127.0.0.1 (ephemeral ports).
    pub fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let hub_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let cdn_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let cas_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        for l in [&hub_l, &cdn_l, &cas_l] {
            l.set_nonblocking(true).unwrap();
        }
        let hub = format!("http://{}", hub_l.local_addr().unwrap());
        let cdn = format!("http://{}", cdn_l.local_addr().unwrap());
        let cas = format!("http://{}", cas_l.local_addr().unwrap());
        let state = Arc::new(State {
            repos: Mutex::new(HashMap::new()),
            faults: Mutex::new(Vec::new()),
            log: Mutex::new(Log::default()),
            dialect: Mutex::new(Dialect::Hub),
            page_size: AtomicUsize::new(2),
            rate: AtomicU64::new(0),
            ttl_secs: AtomicU64::new(3600),
            commits_made: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            active_files: Mutex::new(HashMap::new()),
            peak_files: AtomicUsize::new(0),
            hub: hub.clone(),
            cdn: cdn.clone(),
            secret: format!("s{}", std::process::id()),
            cas: cas.clone(),
            bridge: Mutex::new(None),
            cas_upstream: Mutex::new(None),
            cas_tokens: Mutex::new(HashMap::new()),
            cas_token_ttl: AtomicU64::new(3600),
            cas_bytes: AtomicU64::new(0),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
        });
        let (s1, s2, s3) = (state.clone(), state.clone(), state.clone());
        rt.spawn(async move {
            let l = tokio::net::TcpListener::from_std(cas_l).unwrap();
            axum::serve(l, Router::new().fallback(super::cas::cas_handler).with_state(s3)).await.unwrap();
        });
        rt.spawn(async move {
            let l = tokio::net::TcpListener::from_std(hub_l).unwrap();
            axum::serve(l, Router::new().fallback(hub_handler).with_state(s1)).await.unwrap();
        });
        rt.spawn(async move {
            let l = tokio::net::TcpListener::from_std(cdn_l).unwrap();
            axum::serve(l, Router::new().fallback(cdn_handler).with_state(s2)).await.unwrap();
        });
        Self { endpoint: hub, cdn, cas, state, rt: Some(rt), cas_server: Mutex::new(None) }
    }

    fn new_commit(&self, repo: &str) -> String {
        let n = self.state.commits_made.fetch_add(1, Ordering::SeqCst);
        let mut h = sha1::Sha1::new();
        sha1::Digest::update(&mut h, format!("{repo}/{n}").as_bytes());
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Create (or move) `branch` of `repo` to a new commit holding `files`; returns the commit.
    pub fn push(&self, repo: &str, branch: &str, files: Vec<FakeFile>) -> String {
        let commit = self.new_commit(repo);
        let mut repos = self.state.repos.lock().unwrap();
        let r = repos.entry(repo.to_string()).or_default();
        r.commits.insert(commit.clone(), CommitFiles { files });
        r.branches.insert(branch.to_string(), commit.clone());
        commit
    }

    /// Gate `repo`: `resolve` needs `Authorization: Bearer <token>`.
    pub fn gate(&self, repo: &str, token: &str) {
        self.state.repos.lock().unwrap().entry(repo.to_string()).or_default().gate = Some(token.into());
    }

    /// Add a raw path to `repo`'s listing (a malicious tree).
    pub fn list_extra(&self, repo: &str, raw_path: &str) {
        self.state.repos.lock().unwrap().entry(repo.to_string()).or_default().extra_listing.push(raw_path.into());
    }

    /// How missing repos, revisions and files are reported (default: as the real Hub).
    pub fn set_dialect(&self, d: Dialect) {
        *self.state.dialect.lock().unwrap() = d;
    }

    pub fn fault(&self, f: Fault) {
        self.state.faults.lock().unwrap().push(f);
    }

    pub fn clear_faults(&self) {
        self.state.faults.lock().unwrap().clear();
    }

    /// Cap every response body at `bytes_per_sec` (0 = unlimited).
    pub fn set_rate(&self, bytes_per_sec: u64) {
        self.state.rate.store(bytes_per_sec, Ordering::SeqCst);
    }

    pub fn set_page_size(&self, n: usize) {
        self.state.page_size.store(n, Ordering::SeqCst);
    }

    pub fn set_ttl(&self, secs: u64) {
        self.state.ttl_secs.store(secs, Ordering::SeqCst);
    }

    /// Every CDN answer so far.
    pub fn served(&self) -> Vec<Served> {
        self.state.log.lock().unwrap().served.clone()
    }

    /// `resolve` requests for `path` (HEAD and GET, all repos).
    pub fn resolves(&self, path: &str) -> u32 {
        self.state.log.lock().unwrap().resolves.get(path).copied().unwrap_or(0)
    }

    /// The Authorization header of every request, by listener.
    pub fn auth(&self) -> Vec<(Route, Option<String>)> {
        self.state.log.lock().unwrap().auth.clone()
    }

    /// API calls (revision/tree) in order, as paths with query.
    pub fn api_calls(&self) -> Vec<String> {
        self.state.log.lock().unwrap().api_calls.clone()
    }

    /// The most CDN bodies sent at the same time.
    pub fn peak_connections(&self) -> usize {
        self.state.peak.load(Ordering::SeqCst)
    }

    /// The most distinct files whose CDN bodies were being sent at the same time.
    pub fn peak_files(&self) -> usize {
        self.state.peak_files.load(Ordering::SeqCst)
    }

    /// Faults not fired yet.
    pub fn pending_faults(&self) -> usize {
        self.state.faults.lock().unwrap().iter().filter(|f| f.times > 0).count()
    }
}

/// Take a matching fault, if one is due.
pub(super) fn take_fault(st: &State, route: Route, path: &str) -> Option<FaultKind> {
    let mut faults = st.faults.lock().unwrap();
    for f in faults.iter_mut() {
        if f.route != route || f.times == 0 || f.path.as_deref().is_some_and(|p| p != path) {
            continue;
        }
        if f.skip > 0 {
            f.skip -= 1;
            continue;
        }
        f.times -= 1;
        return Some(f.kind.clone());
    }
    None
}

pub(super) fn auth_of(h: &HeaderMap) -> Option<String> {
    h.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string)
}

#[allow(clippy::result_large_err)] // a test server: the error is the response itself
pub(super) fn find(
    st: &State,
    repo: &str,
    rev: &str,
) -> Result<(String, CommitFiles, Option<String>, Vec<String>), Response> {
    let repos = st.repos.lock().unwrap();
    let Some(r) = repos.get(repo) else {
        return Err(missing(st, 401, "RepoNotFound", "Repository not found", None));
    };
    let commit = r.branches.get(rev).cloned().unwrap_or_else(|| rev.to_string());
    match r.commits.get(&commit) {
        Some(c) => Ok((commit, c.clone(), r.gate.clone(), r.extra_listing.clone())),
        None => Err(missing(st, 404, "RevisionNotFound", &format!("Invalid rev id: {rev}"), None)),
    }
}

pub(super) fn sign(st: &State, sha: &str, expires: u64) -> String {
    let d = sha2::Sha256::digest(format!("{}|{sha}|{expires}", st.secret).as_bytes());
    d.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

async fn hub_handler(AxState(st): AxState<Arc<State>>, req: Request) -> Response {
    let auth = auth_of(req.headers());
    st.log.lock().unwrap().auth.push((Route::Resolve, auth.clone()));
    let raw = req.uri().path().to_string();
    let seg: Vec<&str> = raw.trim_start_matches('/').split('/').collect();
    let head = req.method() == Method::HEAD;
    if seg.len() == 4 && seg[0] == "api" && seg[1] == "models" {
        st.log.lock().unwrap().api_calls.push(req.uri().to_string());
        if let Some(r) = api_fault(&st, "info") {
            return r;
        }
        return repo_info(&st, &format!("{}/{}", seg[2], seg[3]));
    }
    if seg.len() >= 6 && seg[0] == "api" && seg[1] == "models" {
        st.log.lock().unwrap().api_calls.push(req.uri().to_string());
        if let Some(r) = api_fault(&st, seg[4]) {
            return r;
        }
        let repo = format!("{}/{}", seg[2], seg[3]);
        let rev = decode(&seg[5..].join("/"));
        return match seg[4] {
            "revision" => revision(&st, &repo, &rev),
            "tree" => tree(&st, &repo, &decode(seg[5]), &query(req.uri())),
            "xet-read-token" => match find(&st, &repo, &rev) {
                Err(r) => r,
                Ok((_, _, gate, _)) => match gate_check(&repo, gate.as_deref(), auth.as_deref()) {
                    Some(r) => r,
                    None => super::xet::read_token(&st),
                },
            },
            _ => error(404, "NotFound", "no such API"),
        };
    }
    if seg.len() >= 7 && seg[0] == "api" && seg[1] == "resolve-cache" && seg[2] == "models" {
        let repo = format!("{}/{}", seg[3], seg[4]);
        let path = seg[6..].iter().map(|s| decode(s)).collect::<Vec<_>>().join("/");
        return resolve_cache(&st, &repo, seg[5], &path, auth.as_deref(), head);
    }
    if seg.len() >= 5 && seg[2] == "resolve" {
        let repo = format!("{}/{}", seg[0], seg[1]);
        let path = seg[4..].iter().map(|s| decode(s)).collect::<Vec<_>>().join("/");
        *st.log.lock().unwrap().resolves.entry(path.clone()).or_default() += 1;
        return resolve(&st, &repo, &decode(seg[3]), &path, auth.as_deref());
    }
    error(404, "NotFound", "not found")
}

/// A scripted fault on an API route (`revision`, `tree`, `info`).
fn api_fault(st: &State, route: &str) -> Option<Response> {
    match take_fault(st, Route::Api, route)? {
        FaultKind::Status(s) => Some(error(s, "Fault", "scripted")),
        FaultKind::TooMany { retry_after } => Some(
            resp(429).header("retry-after", retry_after.to_string()).body(Body::from("Too Many Requests")).unwrap(),
        ),
        FaultKind::QuotaExhausted { reset } => Some(
            resp(429)
                .header("ratelimit", format!("\"api\";r=0;t={reset}"))
                .body(Body::from("Too Many Requests"))
                .unwrap(),
        ),
        _ => None,
    }
}

/// `GET /api/models/{repo}`: the repo's info (answered for gated repos too, as the Hub does).
fn repo_info(st: &State, repo: &str) -> Response {
    let sha = {
        let repos = st.repos.lock().unwrap();
        repos.get(repo).map(|r| r.branches.get("main").cloned().unwrap_or_default())
    };
    let Some(sha) = sha else { return missing(st, 401, "RepoNotFound", "Repository not found", None) };
    let v = serde_json::json!({"id": repo, "modelId": repo, "sha": sha, "private": false, "siblings": []});
    resp(200).header("content-type", "application/json").body(Body::from(v.to_string())).unwrap()
}

fn revision(st: &State, repo: &str, rev: &str) -> Response {
    let (commit, files, gate, _) = match find(st, repo, rev) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let siblings: Vec<serde_json::Value> = files
        .files
        .iter()
        .map(|f| {
            if f.lfs {
                serde_json::json!({"rfilename": f.path, "size": f.listed_size(), "blobId": f.pointer_oid(),
                    "lfs": {"sha256": f.sha256, "size": f.listed_size(), "pointerSize": 134}})
            } else {
                serde_json::json!({"rfilename": f.path, "size": f.size, "blobId": f.git_sha1})
            }
        })
        .collect();
    let v = serde_json::json!({"id": repo, "modelId": repo, "sha": commit, "private": false,
        "gated": if gate.is_some() { serde_json::json!("manual") } else { serde_json::json!(false) },
        "disabled": false, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings});
    resp(200).header("content-type", "application/json").body(Body::from(v.to_string())).unwrap()
}

fn tree(st: &State, repo: &str, rev: &str, q: &HashMap<String, String>) -> Response {
    let (commit, files, _, extra) = match find(st, repo, rev) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut entries: Vec<serde_json::Value> = Vec::new();
    let mut dirs = std::collections::BTreeSet::new();
    for f in &files.files {
        let mut p = f.path.as_str();
        while let Some((d, _)) = p.rsplit_once('/') {
            dirs.insert(d.to_string());
            p = d;
        }
    }
    for d in dirs {
        entries.push(serde_json::json!({"type": "directory", "oid": "0".repeat(40), "size": 0, "path": d}));
    }
    for f in &files.files {
        entries.push(if f.lfs {
            serde_json::json!({"type": "file", "oid": f.pointer_oid(), "size": f.listed_size(), "path": f.path,
                "lfs": {"oid": f.sha256, "size": f.listed_size(), "pointerSize": 134}})
        } else {
            serde_json::json!({"type": "file", "oid": f.git_sha1, "size": f.size, "path": f.path})
        });
    }
    for p in extra {
        entries.push(serde_json::json!({"type": "file", "oid": "1".repeat(40), "size": 4, "path": p}));
    }
    let page = st.page_size.load(Ordering::SeqCst).max(1);
    let start: usize = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
    let end = (start + page).min(entries.len());
    let mut b = resp(200).header("content-type", "application/json");
    if end < entries.len() {
        b = b.header(
            "link",
            format!("<{}/api/models/{repo}/tree/{commit}?recursive=true&cursor={end}>; rel=\"next\"", st.hub),
        );
    }
    b.body(Body::from(serde_json::Value::Array(entries[start.min(end)..end].to_vec()).to_string())).unwrap()
}

fn gate_check(repo: &str, gate: Option<&str>, auth: Option<&str>) -> Option<Response> {
    let g = gate?;
    if auth == Some(format!("Bearer {g}").as_str()) {
        return None;
    }
    let status = if auth.is_some() { 403 } else { 401 };
    Some(error(status, "GatedRepo", &format!("Access to model {repo} is restricted. You must have access to it and be authenticated to access it. Please log in.")))
}

fn resolve(st: &State, repo: &str, rev: &str, path: &str, auth: Option<&str>) -> Response {
    let (commit, files, gate, _) = match find(st, repo, rev) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Some(r) = gate_check(repo, gate.as_deref(), auth) {
        return r;
    }
    match take_fault(st, Route::Resolve, path) {
        Some(FaultKind::Status(s)) => return error(s, "Fault", "scripted"),
        Some(FaultKind::QuotaExhausted { reset }) => {
            return resp(429)
                .header("ratelimit", format!("\"resolvers\";r=0;t={reset}"))
                .header("ratelimit-policy", "\"fixed window\";\"resolvers\";q=3000;w=300")
                .body(Body::from("Too Many Requests"))
                .unwrap()
        }
        _ => {}
    }
    let Some(f) = files.files.iter().find(|f| f.path == path) else {
        return missing(st, 404, "EntryNotFound", "Entry not found", Some(&commit));
    };
    if f.lfs {
        let xet = f.xet_hash.as_ref().map(|h| (h.clone(), super::xet::auth_link(st, repo, &commit)));
        let expires = now_secs() + st.ttl_secs.load(Ordering::SeqCst);
        let origin = st.bridge.lock().unwrap().clone().unwrap_or_else(|| st.cdn.clone());
        let loc = format!(
            "{origin}/xet-bridge/{}?X-Xet-Signed-Range=&Expires={expires}&Policy=p&Signature={}&Key-Pair-Id=K",
            f.sha256,
            sign(st, &f.sha256, expires)
        );
        let body = format!("Found. Redirecting to {loc}");
        let mut b = resp(302);
        if let Some((hash, link)) = xet {
            b = b.header("x-xet-hash", hash).header("link", link);
        }
        return b
            .header("location", loc)
            .header("x-repo-commit", &commit)
            .header("x-linked-etag", format!("\"{}\"", f.sha256))
            .header("x-linked-size", f.listed_size().to_string())
            .header("etag", format!("\"{}\"", "d".repeat(64)))
            .header("accept-ranges", "bytes")
            .header("ratelimit", "\"resolvers\";r=2999;t=69")
            .header("content-length", body.len().to_string())
            .body(Body::from(body))
            .unwrap();
    }
    let loc = format!(
        "/api/resolve-cache/models/{repo}/{commit}/{}?%2F{repo}%2Fresolve%2F{rev}%2F{}&etag=%22{}%22",
        path,
        path,
        f.git_sha1,
        rev = rev.replace('/', "%2F")
    );
    let body = format!("Temporary Redirect. Redirecting to {loc}");
    resp(307)
        .header("location", loc)
        .header("x-repo-commit", &commit)
        .header("content-length", body.len().to_string())
        .body(Body::from(body))
        .unwrap()
}

fn resolve_cache(st: &State, repo: &str, commit: &str, path: &str, auth: Option<&str>, head: bool) -> Response {
    let (commit, files, gate, _) = match find(st, repo, commit) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Some(r) = gate_check(repo, gate.as_deref(), auth) {
        return r;
    }
    let Some(f) = files.files.iter().find(|f| f.path == path && !f.lfs) else {
        return missing(st, 404, "EntryNotFound", "Entry not found", Some(&commit));
    };
    let data = f.content.read(0, usize::try_from(f.size).unwrap());
    let b = resp(200)
        .header("etag", format!("\"{}\"", f.git_sha1))
        .header("x-repo-commit", commit)
        .header("content-length", f.size.to_string());
    b.body(if head { Body::empty() } else { Body::from(data) }).unwrap()
}
