//! The three Hub calls the downloader needs: revision → commit, the (paged) tree, and one
//! `resolve` per file that stops at the signed CDN redirect. All carry the token; nothing that
//! leaves the Hub's origin does.

use std::time::Duration;

use reqwest::header::{HeaderMap, ACCEPT_ENCODING, AUTHORIZATION, LINK, LOCATION};
use reqwest::{Method, Response, StatusCode, Url};
use serde::Deserialize;

use super::auth::{Token, TokenSource};
use super::error::HubError;
use super::headers::{bare_etag, next_link, ratelimit_wait, redact_query, retry_after};
use super::paths::{encode_path, encode_revision, is_commit};
use super::retry::{jitter, retryable_status, Backoff};

/// Most redirects followed on the Hub's own origin (renamed repo + resolve-cache).
const MAX_HUB_REDIRECTS: usize = 5;
/// Most tree pages (1000 entries each on the Hub) before the listing is declared broken.
const MAX_TREE_PAGES: usize = 10_000;
/// Largest regular (non-LFS) file fetched into memory.
pub const MAX_SMALL_FILE: u64 = 256 << 20;

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
}

/// Hub API client (HTTP/1.1 pool, no automatic redirects).
pub struct HubClient {
    http: reqwest::Client,
    endpoint: String,
    origin: Url,
    token: Option<Token>,
    token_source: Option<TokenSource>,
    backoff: Backoff,
    idle: Duration,
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
            .connect_timeout(idle.min(Duration::from_secs(30)))
            .pool_max_idle_per_host(pool.max(1))
            .tcp_nodelay(true)
            .user_agent(concat!("spark-kit/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HubError::Network { what: "HTTP client".into(), reason: e.to_string() })?;
        let (token, token_source) = match token {
            Some((t, s)) => (Some(t), Some(s)),
            None => (None, None),
        };
        Ok(Self { http, endpoint, origin, token, token_source, backoff, idle })
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
    /// final response, success or not.
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
                    let h = r.headers();
                    let wait = header(h, "retry-after")
                        .and_then(retry_after)
                        .or_else(|| header(h, "ratelimit").and_then(ratelimit_wait));
                    (format!("HTTP {}", r.status().as_u16()), wait)
                }
                Ok(Ok(r)) => return Ok(r),
                Ok(Err(e)) => (e.to_string(), None),
                Err(_) => (format!("no answer in {} s", self.idle.as_secs()), None),
            };
            if attempt >= self.backoff.max_attempts {
                return Err(HubError::Network {
                    what: format!("{what} ({})", redact_query(url)),
                    reason: format!("{reason}, after {attempt} attempts"),
                });
            }
            tokio::time::sleep(self.backoff.delay(attempt, jitter(u64::from(attempt)), server_wait)).await;
        }
    }

    /// The error for a non-success Hub answer.
    fn status_error(&self, r: &Response, repo: &str, path: &str, what: &str) -> HubError {
        let status = r.status().as_u16();
        let h = r.headers();
        let code = header(h, "x-error-code").unwrap_or_default();
        let msg = header(h, "x-error-message").unwrap_or_default();
        let repo_url = format!("{}/{repo}", self.endpoint);
        match (status, code) {
            (_, "GatedRepo") | (403, _) => HubError::Gated {
                repo: repo.into(),
                path: path.into(),
                status,
                url: repo_url,
                with_token: self.token.is_some(),
            },
            (401, _) if msg.contains("Invalid credentials") || msg.contains("Invalid username or password") => {
                HubError::BadToken {
                    repo: repo.into(),
                    source_name: match &self.token_source {
                        Some(TokenSource::Env) => "HF_TOKEN".into(),
                        Some(TokenSource::File(p)) => p.display().to_string(),
                        None => "none".into(),
                    },
                }
            }
            (_, "RepoNotFound") => HubError::RepoNotFound { repo: repo.into(), endpoint: self.endpoint.clone() },
            (401, _) if self.token.is_none() => {
                HubError::Gated { repo: repo.into(), path: path.into(), status, url: repo_url, with_token: false }
            }
            (_, "RevisionNotFound") => HubError::RevisionNotFound { repo: repo.into(), revision: path.into() },
            (404, "EntryNotFound") => HubError::EntryNotFound {
                repo: repo.into(),
                commit: header(h, "x-repo-commit").unwrap_or("?").into(),
                path: path.into(),
            },
            (404, _) => HubError::RepoNotFound { repo: repo.into(), endpoint: self.endpoint.clone() },
            _ => HubError::Http {
                what: what.into(),
                status,
                message: if msg.is_empty() { String::new() } else { format!(" ({msg})") },
            },
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
            let e = self.status_error(&r, repo, revision, &what);
            return Err(match e {
                HubError::EntryNotFound { .. } => {
                    HubError::RevisionNotFound { repo: repo.into(), revision: revision.into() }
                }
                e => e,
            });
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
                return Err(self.status_error(&r, repo, commit, &what));
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
                return Ok(Resolved {
                    commit: commit_seen,
                    etag: linked_etag.or_else(|| header(h, "etag").map(bare_etag)),
                    size: header(h, "x-linked-size").and_then(|s| s.trim().parse().ok()),
                    on_hub: self.same_origin(&next),
                    location: next.to_string(),
                });
            }
            if status == StatusCode::OK {
                return Ok(Resolved {
                    commit: commit_seen,
                    etag: header(h, "x-linked-etag").or_else(|| header(h, "etag")).map(bare_etag),
                    size: header(h, "x-linked-size")
                        .or_else(|| header(h, "content-length"))
                        .and_then(|s| s.trim().parse().ok()),
                    location: url,
                    on_hub: true,
                });
            }
            return Err(self.status_error(&r, repo, path, &what));
        }
        Err(HubError::Protocol { what, reason: format!("more than {MAX_HUB_REDIRECTS} redirects") })
    }

    /// A whole small file's bytes from `location` (token only when on the Hub's origin).
    pub async fn get_small(&self, repo: &str, path: &str, location: &str, size: u64) -> Result<Vec<u8>, HubError> {
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
                return Err(self.status_error(&r, repo, path, &what));
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
