//! The three Hub calls the downloader needs: revision → commit, the (paged) tree, and one
//! `resolve` per file that stops at the signed CDN redirect. All carry the token; nothing that
//! leaves the Hub's origin does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, ACCEPT_ENCODING, AUTHORIZATION, LINK, LOCATION};
use reqwest::{Method, Response, StatusCode, Url};
use serde::Deserialize;

use super::auth::{Token, TokenSource};
use super::error::HubError;
use super::headers::{bare_etag, link_rel, next_link, ratelimit_wait, redact_query, retry_after};
use super::paths::{encode_path, encode_revision, is_commit};
use super::report::{Reporter, Silent};
use super::retry::{jitter, retryable_status, Backoff};

/// Most redirects followed on the Hub's own origin (renamed repo + resolve-cache).
const MAX_HUB_REDIRECTS: usize = 5;
/// Most tree pages (1000 entries each on the Hub) before the listing is declared broken.
const MAX_TREE_PAGES: usize = 10_000;
/// Largest regular (non-LFS) file fetched into memory.
pub const MAX_SMALL_FILE: u64 = 256 << 20;
/// Attempts to connect to a Hub that never answered yet: a refused or unresolvable endpoint is a
/// configuration problem, reported in about a second instead of after the transfer backoff.
const FIRST_CONTACT_ATTEMPTS: u32 = 2;
/// Wait between those attempts.
const FIRST_CONTACT_RETRY: Duration = Duration::from_millis(300);
/// TCP connect timeout (Hub and CDN).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One file of the recursive tree listing.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TreeEntry {
    #[serde(rename = "type")]
    pub kind: String,
    pub path: String,
    #[serde(default)]
    pub size: u64,
    /// Git blob id (for LFS files: of the pointer).
    #[serde(default)]
    pub oid: String,
    #[serde(default)]
    pub lfs: Option<LfsInfo>,
}

/// The LFS part of a tree entry: `oid` is the content SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LfsInfo {
    pub oid: String,
    pub size: u64,
}

/// What `resolve` says about one file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolved {
    pub commit: Option<String>,
    /// `X-Linked-Etag` (LFS sha256), else `ETag`.
    pub etag: Option<String>,
    /// `X-Linked-Size`, else `Content-Length` of a direct `200`.
    pub size: Option<u64>,
    /// Where the bytes are: the signed CDN URL, or the Hub URL for direct answers.
    pub location: String,
    /// Whether `location` is on the Hub's origin (then it may carry the token).
    pub on_hub: bool,
    /// `X-Xet-Hash` and the `xet-auth` token route, when the file is Xet-backed.
    pub xet: Option<XetRef>,
}

/// How to fetch a Xet-backed file natively: its Xet file hash and where its CAS token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XetRef {
    pub hash: String,
    /// `GET` with the Hub token → `{accessToken, exp, casUrl}`.
    pub token_url: String,
}

/// Hub API client (HTTP/1.1 pool, no automatic redirects). Every retry is reported and counted.
pub struct HubClient {
    http: reqwest::Client,
    endpoint: String,
    origin: Url,
    token: Option<Token>,
    token_source: Option<TokenSource>,
    backoff: Backoff,
    idle: Duration,
    reporter: Arc<dyn Reporter>,
    retries: AtomicU64,
    /// Whether the Hub ever answered (until then a connect failure is not retried for long).
    reached: AtomicBool,
}

/// What a failed request asked for: decides how "not found" is read.
#[derive(Clone, Copy)]
enum Asked<'a> {
    /// Revision info or the file listing at `revision`.
    Revision(&'a str),
    /// One file at `commit`.
    File { commit: &'a str, path: &'a str },
    /// The repository's own info (the probe that tells a missing repo from a missing revision).
    Repo,
}

/// The innermost cause of an error (`Connection refused (os error 111)`, not
/// `error sending request for url …`).
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[derive(Deserialize)]
struct RevisionInfo {
    sha: Option<String>,
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

impl HubClient {
    /// `endpoint` is `HF_ENDPOINT` (trailing `/` stripped by the caller or here).
    pub fn new(
        endpoint: &str,
        token: Option<(Token, TokenSource)>,
        pool: usize,
        backoff: Backoff,
        idle: Duration,
    ) -> Result<Self, HubError> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let origin = Url::parse(&endpoint)
            .map_err(|e| HubError::BadEndpoint { endpoint: endpoint.clone(), reason: e.to_string() })?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(idle.min(CONNECT_TIMEOUT))
            .pool_max_idle_per_host(pool.max(1))
            .tcp_nodelay(true)
            .user_agent(concat!("spark-kit/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HubError::Network { what: "HTTP client".into(), reason: e.to_string() })?;
        let (token, token_source) = match token {
            Some((t, s)) => (Some(t), Some(s)),
            None => (None, None),
        };
        Ok(Self {
            http,
            endpoint,
            origin,
            token,
            token_source,
            backoff,
            idle,
            reporter: Arc::new(Silent),
            retries: AtomicU64::new(0),
            reached: AtomicBool::new(false),
        })
    }

    /// Report every retry of a Hub request to `reporter`.
    #[must_use]
    pub fn with_reporter(mut self, reporter: Arc<dyn Reporter>) -> Self {
        self.reporter = reporter;
        self
    }

    /// Hub requests retried so far.
    #[must_use]
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    #[must_use]
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    #[must_use]
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The `Authorization` value for requests to the Hub's own origin.
    pub(crate) fn auth_header(&self) -> Option<String> {
        self.token.as_ref().map(Token::bearer)
    }

    #[must_use]
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    fn same_origin(&self, u: &Url) -> bool {
        u.scheme() == self.origin.scheme()
            && u.host_str() == self.origin.host_str()
            && u.port_or_known_default() == self.origin.port_or_known_default()
    }

    /// One request to the Hub (token attached), retried on transient failures. Returns any
    /// final response, success or not. A Hub that cannot be connected to before it ever
    /// answered fails after [`FIRST_CONTACT_ATTEMPTS`] with [`HubError::Unreachable`].
    async fn send(&self, method: Method, url: &str, what: &str) -> Result<Response, HubError> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let mut rb = self.http.request(method.clone(), url).header(ACCEPT_ENCODING, "identity");
            if let Some(t) = &self.token {
                rb = rb.header(AUTHORIZATION, t.bearer());
            }
            let res = tokio::time::timeout(self.idle, rb.send()).await;
            let (reason, server_wait) = match res {
                Ok(Ok(r)) if retryable_status(r.status().as_u16()) => {
                    self.reached.store(true, Ordering::Relaxed);
                    let h = r.headers();
                    let wait = header(h, "retry-after")
                        .and_then(retry_after)
                        .or_else(|| header(h, "ratelimit").and_then(ratelimit_wait));
                    (format!("HTTP {}", r.status().as_u16()), wait)
                }
                Ok(Ok(r)) => {
                    self.reached.store(true, Ordering::Relaxed);
                    return Ok(r);
                }
                Ok(Err(e)) if e.is_connect() && !self.reached.load(Ordering::Relaxed) => {
                    if attempt >= FIRST_CONTACT_ATTEMPTS {
                        return Err(HubError::Unreachable {
                            endpoint: self.endpoint.clone(),
                            reason: root_cause(&e),
                            default: self.endpoint == super::DEFAULT_ENDPOINT,
                        });
                    }
                    tokio::time::sleep(FIRST_CONTACT_RETRY).await;
                    continue;
                }
                Ok(Err(e)) => (root_cause(&e), None),
                Err(_) => (format!("no answer in {} s", self.idle.as_secs()), None),
            };
            if attempt >= self.backoff.max_attempts {
                return Err(HubError::Network {
                    what: format!("{what} ({})", redact_query(url)),
                    reason: format!("{reason}, after {attempt} attempts"),
                });
            }
            let delay = self.backoff.delay(attempt, jitter(u64::from(attempt)), server_wait);
            self.retries.fetch_add(1, Ordering::Relaxed);
            self.reporter.retry(what, attempt, &reason, delay);
            tokio::time::sleep(delay).await;
        }
    }

    /// The error for a Hub route that refused `path` of `repo` outright (`status` 401 or 403 where
    /// read access is all it needs, e.g. the Xet token route): the token is wrong (401 with one),
    /// missing (401 without) or lacks access (403). None for any other status.
    #[must_use]
    pub fn refused(&self, repo: &str, path: &str, status: u16) -> Option<HubError> {
        match status {
            401 if self.token.is_some() => Some(self.bad_token(repo)),
            401 | 403 => Some(self.gated(repo, path, status)),
            _ => None,
        }
    }

    fn gated(&self, repo: &str, path: &str, status: u16) -> HubError {
        HubError::Gated {
            repo: repo.into(),
            path: path.into(),
            status,
            url: format!("{}/{repo}", self.endpoint),
            with_token: self.token.is_some(),
        }
    }

    fn bad_token(&self, repo: &str) -> HubError {
        HubError::BadToken {
            repo: repo.into(),
            source_name: match &self.token_source {
                Some(TokenSource::Env) => "HF_TOKEN".into(),
                Some(TokenSource::File(p)) => p.display().to_string(),
                None => "none".into(),
            },
        }
    }

    /// The error for a non-success Hub answer. A "not found" of a revision is checked against
    /// the repository's own info (one request, on the failure path only): servers disagree on
    /// `X-Error-Code` (some send none, some `EntryNotFound` for everything), the probe does not.
    async fn fail(&self, r: &Response, repo: &str, asked: Asked<'_>, what: &str) -> HubError {
        let status = r.status().as_u16();
        let h = r.headers();
        let code = header(h, "x-error-code").unwrap_or_default();
        let msg = header(h, "x-error-message").unwrap_or_default();
        let gated = |status| {
            let path = match asked {
                Asked::File { path, .. } => path,
                Asked::Revision(rev) => rev,
                Asked::Repo => "",
            };
            self.gated(repo, path, status)
        };
        if code == "GatedRepo" || status == 403 {
            return gated(status);
        }
        if status == 401 && (msg.contains("Invalid credentials") || msg.contains("Invalid username or password")) {
            return self.bad_token(repo);
        }
        if status != 401 && status != 404 {
            return HubError::Http {
                what: what.into(),
                status,
                message: if msg.is_empty() { String::new() } else { format!(" ({msg})") },
            };
        }
        let repo_missing = || HubError::RepoNotFound { repo: repo.into(), endpoint: self.endpoint.clone(), key: None };
        match asked {
            Asked::Repo => repo_missing(),
            Asked::File { commit, path } if code != "RepoNotFound" => {
                if status == 401 && self.token.is_none() {
                    return gated(status);
                }
                HubError::EntryNotFound {
                    repo: repo.into(),
                    commit: header(h, "x-repo-commit").unwrap_or(commit).into(),
                    path: path.into(),
                }
            }
            Asked::File { .. } => repo_missing(),
            Asked::Revision(revision) => {
                let url = format!("{}/api/models/{repo}", self.endpoint);
                match self.send(Method::GET, &url, &format!("{repo}: repository info")).await {
                    Ok(p) if p.status().is_success() => HubError::RevisionNotFound {
                        repo: repo.into(),
                        revision: revision.into(),
                        endpoint: self.endpoint.clone(),
                        key: None,
                    },
                    Ok(p) => Box::pin(self.fail(&p, repo, Asked::Repo, what)).await,
                    Err(e) => e,
                }
            }
        }
    }

    /// Resolve a branch or tag to its commit (a 40-hex revision is returned as is).
    pub async fn commit(&self, repo: &str, revision: &str) -> Result<String, HubError> {
        if is_commit(revision) {
            return Ok(revision.to_ascii_lowercase());
        }
        let url = format!("{}/api/models/{repo}/revision/{}", self.endpoint, encode_revision(revision));
        let what = format!("{repo}@{revision}: revision info");
        let r = self.send(Method::GET, &url, &what).await?;
        if !r.status().is_success() {
            return Err(self.fail(&r, repo, Asked::Revision(revision), &what).await);
        }
        let info: RevisionInfo =
            r.json().await.map_err(|e| HubError::Protocol { what, reason: format!("bad JSON: {e}") })?;
        match info.sha {
            Some(s) if is_commit(&s) => Ok(s.to_ascii_lowercase()),
            other => Err(HubError::Protocol {
                what: format!("{repo}@{revision}"),
                reason: format!("revision info has no 40-hex `sha` (got {other:?})"),
            }),
        }
    }

    /// Every file at `commit` (follows the `Link: rel="next"` cursors on the Hub's origin).
    pub async fn tree(&self, repo: &str, commit: &str) -> Result<Vec<TreeEntry>, HubError> {
        let mut url = format!("{}/api/models/{repo}/tree/{commit}?recursive=true", self.endpoint);
        let what = format!("{repo}@{commit}: file listing");
        let mut out = Vec::new();
        for _ in 0..MAX_TREE_PAGES {
            let r = self.send(Method::GET, &url, &what).await?;
            if !r.status().is_success() {
                return Err(self.fail(&r, repo, Asked::Revision(commit), &what).await);
            }
            let next = header(r.headers(), LINK.as_str()).and_then(next_link);
            let page: Vec<TreeEntry> = r
                .json()
                .await
                .map_err(|e| HubError::Protocol { what: what.clone(), reason: format!("bad JSON: {e}") })?;
            out.extend(page.into_iter().filter(|e| e.kind == "file"));
            let Some(next) = next else { return Ok(out) };
            let base =
                Url::parse(&url).map_err(|e| HubError::Protocol { what: what.clone(), reason: e.to_string() })?;
            let joined =
                base.join(&next).map_err(|e| HubError::Protocol { what: what.clone(), reason: e.to_string() })?;
            if !self.same_origin(&joined) {
                return Err(HubError::Protocol {
                    what,
                    reason: format!(
                        "next page on another host ({}); not sending the token there",
                        joined.origin().ascii_serialization()
                    ),
                });
            }
            url = joined.to_string();
        }
        Err(HubError::Protocol { what, reason: format!("more than {MAX_TREE_PAGES} pages") })
    }

    fn resolve_url(&self, repo: &str, commit: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{}/{}", self.endpoint, encode_revision(commit), encode_path(path))
    }

    /// `HEAD resolve` for one file: follows redirects on the Hub's origin, stops at the first
    /// redirect elsewhere (the signed CDN URL) and reads the metadata from that answer.
    pub async fn resolve(&self, repo: &str, commit: &str, path: &str) -> Result<Resolved, HubError> {
        let what = format!("{repo}: resolve {path}");
        let mut url = self.resolve_url(repo, commit, path);
        let mut commit_seen: Option<String> = None;
        for _ in 0..=MAX_HUB_REDIRECTS {
            let r = self.send(Method::HEAD, &url, &what).await?;
            let h = r.headers();
            if let Some(c) = header(h, "x-repo-commit") {
                commit_seen = Some(c.to_string());
            }
            let status = r.status();
            if status.is_redirection() {
                let loc = header(h, LOCATION.as_str()).ok_or_else(|| HubError::Protocol {
                    what: what.clone(),
                    reason: format!("{status} without Location"),
                })?;
                let base =
                    Url::parse(&url).map_err(|e| HubError::Protocol { what: what.clone(), reason: e.to_string() })?;
                let next =
                    base.join(loc).map_err(|e| HubError::Protocol { what: what.clone(), reason: e.to_string() })?;
                let linked_etag = header(h, "x-linked-etag").map(bare_etag);
                if self.same_origin(&next) && linked_etag.is_none() {
                    url = next.to_string();
                    continue;
                }
                let xet = self.xet_ref(h, &base, repo, commit);
                return Ok(Resolved {
                    commit: commit_seen,
                    etag: linked_etag.or_else(|| header(h, "etag").map(bare_etag)),
                    size: header(h, "x-linked-size").and_then(|s| s.trim().parse().ok()),
                    on_hub: self.same_origin(&next),
                    location: next.to_string(),
                    xet,
                });
            }
            if status == StatusCode::OK {
                return Ok(Resolved {
                    commit: commit_seen,
                    etag: header(h, "x-linked-etag").or_else(|| header(h, "etag")).map(bare_etag),
                    size: header(h, "x-linked-size")
                        .or_else(|| header(h, "content-length"))
                        .and_then(|s| s.trim().parse().ok()),
                    xet: self.xet_ref(
                        h,
                        &Url::parse(&url)
                            .map_err(|e| HubError::Protocol { what: what.clone(), reason: e.to_string() })?,
                        repo,
                        commit,
                    ),
                    location: url,
                    on_hub: true,
                });
            }
            return Err(self.fail(&r, repo, Asked::File { commit, path }, &what).await);
        }
        Err(HubError::Protocol { what, reason: format!("more than {MAX_HUB_REDIRECTS} redirects") })
    }

    /// The Xet side of a `resolve` answer: `X-Xet-Hash` and the `xet-auth` link (relative links
    /// joined to the answer's URL; without a link, the Hub's documented token route).
    fn xet_ref(&self, h: &HeaderMap, base: &Url, repo: &str, commit: &str) -> Option<XetRef> {
        let hash = header(h, "x-xet-hash")?.trim().to_string();
        let token_url = header(h, LINK.as_str())
            .and_then(|l| link_rel(l, "xet-auth"))
            .and_then(|l| base.join(&l).ok())
            .map_or_else(
                || format!("{}/api/models/{repo}/xet-read-token/{}", self.endpoint, encode_revision(commit)),
                |u| u.to_string(),
            );
        Some(XetRef { hash, token_url })
    }

    /// A whole small file's bytes from `location` (token only when on the Hub's origin).
    pub async fn get_small(
        &self,
        repo: &str,
        commit: &str,
        path: &str,
        location: &str,
        size: u64,
    ) -> Result<Vec<u8>, HubError> {
        let what = format!("{repo}: {path}");
        let mut url = location.to_string();
        for _ in 0..=MAX_HUB_REDIRECTS {
            let parsed =
                Url::parse(&url).map_err(|e| HubError::Protocol { what: what.clone(), reason: e.to_string() })?;
            let r = if self.same_origin(&parsed) {
                self.send(Method::GET, &url, &what).await?
            } else {
                self.http
                    .get(&url)
                    .header(ACCEPT_ENCODING, "identity")
                    .send()
                    .await
                    .map_err(|e| HubError::Network { what: what.clone(), reason: e.to_string() })?
            };
            if r.status().is_redirection() {
                let loc = header(r.headers(), LOCATION.as_str()).ok_or_else(|| HubError::Protocol {
                    what: what.clone(),
                    reason: "redirect without Location".into(),
                })?;
                url = parsed
                    .join(loc)
                    .map_err(|e| HubError::Protocol { what: what.clone(), reason: e.to_string() })?
                    .to_string();
                continue;
            }
            if !r.status().is_success() {
                return Err(self.fail(&r, repo, Asked::File { commit, path }, &what).await);
            }
            if size > MAX_SMALL_FILE {
                return Err(HubError::Protocol {
                    what,
                    reason: format!("{size} bytes is too large for a regular file"),
                });
            }
            let body = tokio::time::timeout(self.idle, r.bytes())
                .await
                .map_err(|_| HubError::Network { what: what.clone(), reason: "body stalled".into() })?
                .map_err(|e| HubError::Network { what: what.clone(), reason: e.to_string() })?;
            return Ok(body.to_vec());
        }
        Err(HubError::Protocol { what, reason: format!("more than {MAX_HUB_REDIRECTS} redirects") })
    }
}
