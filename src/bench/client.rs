//! OpenAI-compatible HTTP client for the benchmark: model list, version, tokenize, streamed chat.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::sse::{parse_event, Event, SseParser, Usage};

/// Everything that stops a run (as opposed to one failed request). Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("--url `{0}`: expected http://HOST:PORT (optionally ending in /v1)")]
    BadUrl(String),
    #[error("cannot reach {url}: {detail}")]
    Connect { url: String, detail: String },
    #[error("{url} answered HTTP 401/403: the endpoint needs an API key")]
    Unauthorized { url: String },
    #[error("{url} answered HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("{url} did not answer in {secs} s")]
    Timeout { url: String, secs: u64 },
    #[error("{url}: unexpected answer: {detail}")]
    Protocol { url: String, detail: String },
    #[error("model `{model}` is not served at {url}; it serves: {served}")]
    ModelNotServed { model: String, url: String, served: String },
    #[error("{url} serves no models")]
    NoModels { url: String },
    #[error("{url} serves several models ({served}); pick one")]
    SeveralModels { url: String, served: String },
    #[error("the stream has no usage block, so tokens cannot be counted (stream_options.include_usage was ignored)")]
    NoUsage,
    #[error(transparent)]
    TooLong(#[from] super::run::TooLong),
    #[error("the first request failed: {0}")]
    FirstRequest(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl BenchError {
    /// The fix, one line.
    #[must_use]
    pub fn hint(&self) -> Option<String> {
        Some(match self {
            Self::BadUrl(_) => "pass e.g. --url http://127.0.0.1:8000 or --kit K to use the kit's endpoint".into(),
            Self::Connect { .. } | Self::Timeout { .. } => {
                "is the server up? start it with `spark-kit up --kit K`, or fix --url / --port".into()
            }
            Self::Unauthorized { .. } => {
                "pass the key with --api-key-env NAME or --api-key-file PATH (or --kit K with engine.api_keys)".into()
            }
            Self::Status { .. } | Self::Protocol { .. } => {
                "check that --url points at an OpenAI-compatible server (vLLM: http://HOST:PORT)".into()
            }
            Self::ModelNotServed { .. } | Self::SeveralModels { .. } => {
                "pass --model with one of the served names".into()
            }
            Self::NoModels { .. } => "wait until the server has loaded its model, then retry".into(),
            Self::NoUsage => "use a server that streams usage (vLLM does); event counts are not token counts".into(),
            Self::TooLong(_) => {
                "lower --decode-tokens / --decode-prompt-tokens, or serve with a longer max_model_len".into()
            }
            Self::FirstRequest(_) => "see the error above; try the same request with curl to check the server".into(),
            Self::Runtime(_) => return None,
        })
    }

    /// A problem of the flags (exit 2) rather than of the server.
    #[must_use]
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::BadUrl(_) | Self::TooLong(_))
    }
}

/// One listed model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub id: String,
    pub root: Option<String>,
    pub max_model_len: Option<u64>,
}

/// A chat request as the benchmark sends it.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: String,
    pub prompt: String,
    pub max_tokens: u64,
    /// Ask for exactly `max_tokens` (`min_tokens` + `ignore_eos`).
    pub fixed_length: bool,
    pub temperature: f64,
    pub thinking: bool,
    /// Send the vLLM-specific parameters (`ignore_eos`, `min_tokens`, `chat_template_kwargs`).
    pub vendor_params: bool,
}

impl ChatRequest {
    /// The JSON body.
    #[must_use]
    pub fn body(&self) -> serde_json::Value {
        let mut body = json!({
            "model": self.model,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.vendor_params {
            if let Some(obj) = body.as_object_mut() {
                if self.fixed_length {
                    obj.insert("ignore_eos".into(), json!(true));
                    obj.insert("min_tokens".into(), json!(self.max_tokens));
                }
                // Both spellings: DeepSeek/Qwen templates read `thinking` / `enable_thinking`.
                obj.insert(
                    "chat_template_kwargs".into(),
                    json!({"enable_thinking": self.thinking, "thinking": self.thinking}),
                );
            }
        }
        body
    }
}

/// Timings and counts of one completed stream (seconds since the run's epoch).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamOutcome {
    pub sent: f64,
    pub first: f64,
    pub last: f64,
    pub usage: Usage,
    pub text_events: u64,
    pub finish_reason: Option<String>,
}

/// Why one request failed.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestError {
    /// HTTP 400: the server rejected a parameter (the runner retries without vendor parameters).
    BadRequest(String),
    /// HTTP 401/403.
    Unauthorized,
    /// Other HTTP status.
    Status(u16, String),
    /// Could not connect or the connection broke.
    Transport(String),
    Timeout(f64),
    /// The stream ended without text or without usage, or sent an error.
    Stream(String),
    NoUsage,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BadRequest(b) => write!(f, "HTTP 400: {b}"),
            Self::Unauthorized => f.write_str("HTTP 401/403: API key missing or wrong"),
            Self::Status(s, b) => write!(f, "HTTP {s}: {b}"),
            Self::Transport(e) => write!(f, "connection: {e}"),
            Self::Timeout(s) => write!(f, "no complete answer within {s:.0} s"),
            Self::Stream(e) => write!(f, "stream: {e}"),
            Self::NoUsage => f.write_str("stream ended without a usage block"),
        }
    }
}

/// An OpenAI-compatible server.
#[derive(Clone)]
pub struct Endpoint {
    /// `http://host:port` (no trailing `/`, no `/v1`).
    pub base: String,
    api_key: Option<String>,
    client: reqwest::Client,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is never printed.
        f.debug_struct("Endpoint")
            .field("base", &self.base)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .finish()
    }
}

/// `http://h:p`, `http://h:p/`, `http://h:p/v1/` → `http://h:p`.
pub fn normalize_url(url: &str) -> Result<String, BenchError> {
    let u = url.trim();
    let rest = u.strip_prefix("http://").or_else(|| u.strip_prefix("https://"));
    match rest {
        Some(r) if !r.is_empty() && !r.starts_with('/') => {}
        _ => return Err(BenchError::BadUrl(url.to_string())),
    }
    let mut u = u.trim_end_matches('/').to_string();
    if let Some(s) = u.strip_suffix("/v1") {
        u = s.to_string();
    }
    reqwest::Url::parse(&u).map_err(|_| BenchError::BadUrl(url.to_string()))?;
    Ok(u)
}

const SMALL_TIMEOUT: Duration = Duration::from_secs(30);

fn clip(s: &str) -> String {
    let line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= 200 {
        return line;
    }
    format!("{}…", line.chars().take(200).collect::<String>())
}

impl Endpoint {
    /// A client for `url` (normalized by [`normalize_url`]).
    pub fn new(url: &str, api_key: Option<String>) -> Result<Self, BenchError> {
        let base = normalize_url(url)?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| BenchError::Connect { url: base.clone(), detail: e.to_string() })?;
        Ok(Self { base, api_key, client })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.client.request(method, format!("{}{path}", self.base));
        match &self.api_key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    fn transport(&self, path: &str, e: &reqwest::Error) -> BenchError {
        let url = format!("{}{path}", self.base);
        if e.is_timeout() {
            return BenchError::Timeout { url, secs: SMALL_TIMEOUT.as_secs() };
        }
        // The innermost cause is the useful part ("Connection refused (os error 111)").
        let mut detail = e.to_string();
        let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
        while let Some(s) = src {
            detail = s.to_string();
            src = s.source();
        }
        BenchError::Connect { url, detail }
    }

    /// `GET /v1/models`.
    pub async fn models(&self) -> Result<Vec<ModelInfo>, BenchError> {
        let path = "/v1/models";
        let url = format!("{}{path}", self.base);
        let resp = self
            .request(reqwest::Method::GET, path)
            .timeout(SMALL_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.transport(path, &e))?;
        let status = resp.status().as_u16();
        if status == 401 || status == 403 {
            return Err(BenchError::Unauthorized { url });
        }
        let text = resp.text().await.map_err(|e| self.transport(path, &e))?;
        if status != 200 {
            return Err(BenchError::Status { url, status, body: clip(&text) });
        }
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| BenchError::Protocol { url: url.clone(), detail: format!("not JSON ({e})") })?;
        let data = v
            .get("data")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| BenchError::Protocol { url: url.clone(), detail: "no `data` list".into() })?;
        Ok(data
            .iter()
            .filter_map(|m| {
                Some(ModelInfo {
                    id: m.get("id")?.as_str()?.to_string(),
                    root: m.get("root").and_then(serde_json::Value::as_str).map(str::to_string),
                    max_model_len: m.get("max_model_len").and_then(serde_json::Value::as_u64),
                })
            })
            .collect())
    }

    /// `GET /version` → `version` (vLLM); `None` when absent.
    /// The server's Prometheus `/metrics` text, `None` when it does not answer 200.
    pub async fn metrics(&self) -> Option<String> {
        let resp = self.request(reqwest::Method::GET, "/metrics").timeout(SMALL_TIMEOUT).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.text().await.ok()
    }

    pub async fn version(&self) -> Option<String> {
        let resp = self.request(reqwest::Method::GET, "/version").timeout(SMALL_TIMEOUT).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let v: serde_json::Value = resp.json().await.ok()?;
        v.get("version").and_then(serde_json::Value::as_str).map(str::to_string)
    }

    /// Token count of the chat prompt as the server will see it (`POST /tokenize`, vLLM);
    /// `Ok(None)` when the server has no such route.
    pub async fn tokenize(&self, model: &str, prompt: &str) -> Result<Option<u64>, BenchError> {
        let path = "/tokenize";
        let body = json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "add_generation_prompt": true,
        });
        let resp = self
            .request(reqwest::Method::POST, path)
            .timeout(SMALL_TIMEOUT)
            .json(&body)
            .send()
            .await
            .map_err(|e| self.transport(path, &e))?;
        let status = resp.status().as_u16();
        if matches!(status, 404 | 405 | 501) {
            return Ok(None);
        }
        let text = resp.text().await.map_err(|e| self.transport(path, &e))?;
        if status != 200 {
            // Tokenize is an aid, not a requirement: an error just means "unchecked".
            return Ok(None);
        }
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        Ok(v.get("count").and_then(serde_json::Value::as_u64))
    }

    /// Send one streamed chat request and time it against `epoch`.
    pub async fn stream_chat(
        &self,
        req: &ChatRequest,
        epoch: Instant,
        timeout: Duration,
    ) -> Result<StreamOutcome, RequestError> {
        let secs = timeout.as_secs_f64();
        match tokio::time::timeout(timeout, self.stream_inner(req, epoch)).await {
            Ok(r) => r,
            Err(_) => Err(RequestError::Timeout(secs)),
        }
    }

    async fn stream_inner(&self, req: &ChatRequest, epoch: Instant) -> Result<StreamOutcome, RequestError> {
        let body = req.body();
        let sent = epoch.elapsed().as_secs_f64();
        let mut resp = self
            .request(reqwest::Method::POST, "/v1/chat/completions")
            .json(&body)
            .send()
            .await
            .map_err(|e| RequestError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let text = clip(&resp.text().await.unwrap_or_default());
            return Err(match status {
                400 => RequestError::BadRequest(text),
                401 | 403 => RequestError::Unauthorized,
                s => RequestError::Status(s, text),
            });
        }
        let mut parser = SseParser::new();
        let mut first: Option<f64> = None;
        let mut last = 0.0;
        let mut usage = None;
        let mut text_events = 0;
        let mut finish_reason = None;
        let mut done = false;
        while !done {
            let Some(bytes) = resp.chunk().await.map_err(|e| RequestError::Transport(e.to_string()))? else {
                break;
            };
            let now = epoch.elapsed().as_secs_f64();
            for data in parser.feed(&bytes) {
                match parse_event(&data).map_err(|e| RequestError::Stream(e.to_string()))? {
                    Event::Done => done = true,
                    Event::Chunk(c) => {
                        if let Some(e) = c.error {
                            return Err(RequestError::Stream(format!("server error: {e}")));
                        }
                        if c.has_text() {
                            first.get_or_insert(now);
                            last = now;
                            text_events += 1;
                        }
                        if c.usage.is_some() {
                            usage = c.usage;
                        }
                        if c.finish_reason.is_some() {
                            finish_reason = c.finish_reason;
                        }
                    }
                }
            }
        }
        let first = first.ok_or_else(|| RequestError::Stream("no content or reasoning delta arrived".into()))?;
        let usage = usage.ok_or(RequestError::NoUsage)?;
        Ok(StreamOutcome { sent, first, last, usage, text_events, finish_reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_normalize() {
        for u in ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"] {
            assert_eq!(normalize_url(u).unwrap(), "http://h:1");
        }
        assert_eq!(normalize_url("https://x.example/api").unwrap(), "https://x.example/api");
        for bad in ["h:1", "ftp://h", "http://", "http:///v1"] {
            assert!(matches!(normalize_url(bad), Err(BenchError::BadUrl(_))), "{bad}");
        }
    }

    #[test]
    fn body_vendor_params_and_key_never_in_debug() {
        let mut r = ChatRequest {
            model: "m".into(),
            prompt: "p".into(),
            max_tokens: 64,
            fixed_length: true,
            temperature: 0.0,
            thinking: false,
            vendor_params: true,
        };
        let b = r.body();
        assert_eq!(b["min_tokens"], 64);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["chat_template_kwargs"]["enable_thinking"], false);
        r.vendor_params = false;
        let b = r.body();
        assert!(
            b.get("min_tokens").is_none() && b.get("ignore_eos").is_none() && b.get("chat_template_kwargs").is_none()
        );
        let e = Endpoint::new("http://127.0.0.1:1", Some("sekrit".into())).unwrap();
        assert!(!format!("{e:?}").contains("sekrit"));
    }
}
