//! A fake of vLLM's OpenAI server for the gateway's tests: a small axum server on loopback
//! (/tokenize, streamed chat, plain paths, /health, /metrics) counting what reached it, and a
//! gateway in front of it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};
use spark_kit::gateway::admission::Limits;
use spark_kit::gateway::{serve, DrainOutcome, EngineState, Gateway, GatewayConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

#[derive(Default)]
pub struct Seen {
    pub tokenize: AtomicUsize,
    pub chat: AtomicUsize,
    /// Non-streamed completions and embeddings the upstream received.
    pub plain: AtomicUsize,
    /// Streams whose body was dropped before it ended (the client went away).
    pub dropped: AtomicUsize,
    /// The engine core "died" (a completion with `"fail": "engine_dead"`): /health answers 503,
    /// as vLLM's does after an `EngineDeadError`.
    pub dead: AtomicBool,
    /// Requests to /v1/responses and /v1/messages.
    pub passthrough: AtomicUsize,
}

pub struct DropGuard(Arc<Seen>, bool);
impl DropGuard {
    fn ended(mut self) {
        self.1 = true;
    }
}
impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

pub fn words(v: &Value) -> u64 {
    let text = match v.get("messages").and_then(Value::as_array) {
        Some(m) => m.iter().filter_map(|x| x["content"].as_str()).collect::<Vec<_>>().join(" "),
        None => v["prompt"].as_str().unwrap_or_default().to_string(),
    };
    text.split_whitespace().count() as u64
}

pub fn json_resp(v: &Value) -> Response {
    Response::builder().header(header::CONTENT_TYPE, "application/json").body(Body::from(v.to_string())).unwrap()
}

pub async fn tokenize(State(seen): State<Arc<Seen>>, body: Bytes) -> Response {
    seen.tokenize.fetch_add(1, Ordering::SeqCst);
    let v: Value = serde_json::from_slice(&body).unwrap();
    json_resp(&json!({"count": words(&v), "max_model_len": 4096, "tokens": []}))
}

pub fn event(content: &str) -> String {
    let c = json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}]});
    format!("data: {c}\n\n")
}

/// `max_tokens` events of one word, `interval_ms` apart, then `[DONE]`; `cut_after`: after that
/// many events, half an event and then a broken connection.
pub async fn chat(State(seen): State<Arc<Seen>>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap();
    seen.chat.fetch_add(1, Ordering::SeqCst);
    let n = v["max_tokens"].as_u64().unwrap_or(4);
    let interval = Duration::from_millis(v["interval_ms"].as_u64().unwrap_or(20));
    let cut = v["cut_after"].as_u64();
    let stream = futures_util::stream::unfold((0u64, DropGuard(seen, false)), move |(i, mut g)| async move {
        if i > n || g.1 {
            g.ended();
            return None;
        }
        tokio::time::sleep(interval).await;
        if cut == Some(i) {
            g.1 = true;
            let half = Ok::<_, std::io::Error>(Bytes::from("data: {\"choices\": [{\"delta\""));
            return Some((half, (n + 1, g)));
        }
        if cut.is_some_and(|c| i > c) {
            g.1 = true;
            return Some((Err(std::io::Error::other("engine died")), (i + 1, g)));
        }
        let item = if i == n { "data: [DONE]\n\n".to_string() } else { event(&format!("w{i} ")) };
        Some((Ok(Bytes::from(item)), (i + 1, g)))
    });
    // After the half event, the next poll yields the error.
    let stream = stream.chain(futures_util::stream::iter(cut.map(|_| Err(std::io::Error::other("engine died")))));
    Response::builder().header(header::CONTENT_TYPE, "text/event-stream").body(Body::from_stream(stream)).unwrap()
}

/// A non-streamed answer after `delay_ms` (a completion or an embedding); a request whose
/// client went away before it is answered counts as dropped.
pub async fn plain(State(seen): State<Arc<Seen>>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap();
    seen.plain.fetch_add(1, Ordering::SeqCst);
    if let Some(r) = vllm_failure(&seen, &v) {
        return r;
    }
    let guard = DropGuard(seen, false);
    tokio::time::sleep(Duration::from_millis(v["delay_ms"].as_u64().unwrap_or(0))).await;
    guard.ended();
    // The `priority` as it arrived (the gateway raises it to the key's).
    json_resp(
        &json!({"object": "list", "data": [{"embedding": [0.5, 0.25]}], "answered": true, "priority": v["priority"]}),
    )
}

/// vLLM's own error answers, by the request's `fail`: `engine_dead` (500, `EngineDeadError`;
/// /health then answers 503 unless `keep_health`), `max_num_queued_reqs` / `max_num_queued_tokens`
/// (503, `QueueOverflowError` / `MaxQueuedTokensError`), `internal` (a plain 500).
pub fn vllm_failure(seen: &Seen, v: &Value) -> Option<Response> {
    let (status, message, kind) = match v["fail"].as_str()? {
        "engine_dead" => {
            if v["keep_health"] != json!(true) {
                seen.dead.store(true, Ordering::SeqCst);
            }
            (500, "EngineCore encountered an issue. See stack trace (above) for the root cause.", "InternalServerError")
        }
        "max_num_queued_reqs" => (
            503,
            "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.",
            "Service Unavailable",
        ),
        "max_num_queued_tokens" => (
            503,
            "The engine has reached its prefill token backlog limit. Please try again later or on a different instance.",
            "Service Unavailable",
        ),
        _ => (500, "Internal server error", "InternalServerError"),
    };
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": status}});
    let mut r = json_resp(&body);
    *r.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
    Some(r)
}

async fn health(State(seen): State<Arc<Seen>>) -> Response {
    let status = if seen.dead.load(Ordering::SeqCst) { 503 } else { 200 };
    let mut r = Response::new(Body::empty());
    *r.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
    r
}

/// /v1/responses and /v1/messages: three events with no `[DONE]` (as those APIs end), then EOF.
async fn passthrough(State(seen): State<Arc<Seen>>, body: Bytes) -> Response {
    seen.passthrough.fetch_add(1, Ordering::SeqCst);
    let v: Value = serde_json::from_slice(&body).unwrap();
    let events =
        ["event: start\ndata: {}\n\n", "event: delta\ndata: {\"text\": \"hi\"}\n\n", "event: stop\ndata: {}\n\n"];
    if v["stream"] == json!(true) {
        let s = futures_util::stream::iter(events.map(|e| Ok::<_, std::io::Error>(Bytes::from(e))));
        return Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .body(Body::from_stream(s))
            .unwrap();
    }
    json_resp(&json!({"object": "response", "echo": v}))
}

pub async fn upstream_on(listener: TcpListener) -> Arc<Seen> {
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route("/tokenize", post(tokenize))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(plain))
        .route("/v1/embeddings", post(plain))
        .route("/v1/models", get(|| async { json_resp(&json!({"object": "list", "data": [{"id": "m"}]})) }))
        .route("/v1/responses", post(passthrough))
        .route("/v1/messages", post(passthrough))
        .route("/health", get(health))
        .route("/metrics", get(|| async { "vllm:num_requests_running 0\n" }))
        .with_state(seen.clone());
    tokio::spawn(async move {
        use axum::serve::ListenerExt as _;
        // TCP_NODELAY as vLLM's server has it (asyncio sets it on every TCP transport): an
        // upstream with Nagle on holds its first event ~40 ms for the ACK of the response head.
        let l = listener.tap_io(|t| {
            let _ = t.set_nodelay(true);
        });
        axum::serve(l, app).await.unwrap()
    });
    seen
}

pub async fn upstream() -> (String, Arc<Seen>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    (url, upstream_on(l).await)
}

pub const LIMITS: Limits = Limits { max_model_len: 100, kv_pool_tokens: Some(80), safe_max_prompt: Some(60) };

pub struct Gw {
    pub url: String,
    pub gw: Arc<Gateway>,
    pub stop: Option<oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<std::io::Result<DrainOutcome>>,
}

pub async fn gateway(upstream: &str, tweak: impl FnOnce(&mut GatewayConfig)) -> Gw {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let mut cfg = GatewayConfig::new(addr, upstream.to_string(), vec![], 4, LIMITS);
    tweak(&mut cfg);
    cfg.validate().unwrap();
    let gw = Gateway::new(cfg, EngineState::Ready).unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(serve(l, gw.clone(), async move {
        let _ = rx.await;
    }));
    Gw { url: format!("http://{addr}"), gw, stop: Some(tx), done }
}

/// Wait (up to 10 s) until `f` holds: the tests order requests by the gateway's own counts.
pub async fn until(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub fn chat_body(prompt_words: usize, max_tokens: u64) -> Value {
    json!({"model": "m", "stream": true, "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": vec!["x"; prompt_words].join(" ")}]})
}

pub async fn send_chat(url: &str, body: &Value) -> reqwest::Response {
    client().post(format!("{url}/v1/chat/completions")).json(body).send().await.unwrap()
}
