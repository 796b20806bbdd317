//! Request handling: keys, availability, body cap, admission, slots, forwarding.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{json, Value};

use super::admission::{admit, requested_max_tokens};
use super::body::request_object;
use super::framing::error_body;
use super::keys::caller;
use super::state::{EngineState, Gateway, InFlight, KeyHold, SlotRefusal};
use super::stream::{plain_body, sse_body};
use super::upstream::{classify, Verdict, MAX_ERROR_BODY};

/// Headers not forwarded in either direction (hop-by-hop, or the gateway's own).
const DROP: [&str; 8] =
    ["connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "authorization", "content-length"];

pub(crate) fn error(status: StatusCode, message: &str, kind: &str, code: &str, retry_after: Option<u64>) -> Response {
    let mut r = Response::new(Body::from(error_body(message, kind, code).to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(s) = retry_after {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

fn unavailable(gw: &Gateway, why: &str) -> Response {
    let reason = if gw.engine_state() == EngineState::Draining { "draining" } else { "unavailable" };
    gw.metrics.refused(reason);
    let msg = if reason == "draining" {
        "the gateway is stopping and admits no new requests: retry against the restarted deployment".to_string()
    } else {
        format!("the engine is not serving right now ({why}): retry after the Retry-After seconds")
    };
    let retry = if reason == "draining" { gw.cfg.retry_after_s } else { gw.retry_after_s() };
    error(StatusCode::SERVICE_UNAVAILABLE, &msg, "service_unavailable", reason, Some(retry))
}

/// An engine error the gateway answers for itself (see [`classify`]): an engine-core death is a
/// restart (503 + Retry-After, the gateway unavailable from now on), vLLM's own admission
/// refusal is overload (429 + Retry-After naming vLLM's reason). None: pass it on.
fn engine_verdict(gw: &Gateway, status: u16, body: &[u8]) -> Option<Response> {
    match classify(status, body)? {
        Verdict::EngineDead => {
            gw.engine_died();
            gw.metrics.refused("engine_dead");
            Some(unavailable(gw, "its engine core died; the deployment is restarting"))
        }
        Verdict::Overloaded(reason) => {
            gw.metrics.refused(if reason == "max_num_queued_reqs" {
                "engine_max_num_queued_reqs"
            } else {
                "engine_max_num_queued_tokens"
            });
            let msg = format!(
                "the engine is overloaded: vLLM refused the request ({reason}: its own admission limit \
                 --{} is reached); retry after the Retry-After seconds",
                reason.replace('_', "-")
            );
            Some(error(StatusCode::TOO_MANY_REQUESTS, &msg, "rate_limit_error", reason, Some(gw.cfg.retry_after_s)))
        }
    }
}

/// Which kind of route a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Health,
    Metrics,
    /// Chat or text completion: admission + slot.
    Generate {
        chat: bool,
    },
    /// Embeddings: slot, no admission.
    Embed,
    /// OpenAI Responses (`/v1/responses`) and Anthropic Messages (`/v1/messages`), which
    /// released vLLM serves: a slot, no admission (their prompts are not counted), and their
    /// streams passed on as they arrive (they end without `[DONE]`, so no cut-stream event).
    Passthrough,
    /// Models, tokenize: forwarded as is.
    Plain,
}

fn route(method: &Method, path: &str) -> Option<Route> {
    Some(match (method.as_str(), path) {
        ("GET", "/health") => Route::Health,
        ("GET", "/metrics") => Route::Metrics,
        ("POST", "/v1/chat/completions") => Route::Generate { chat: true },
        ("POST", "/v1/completions") => Route::Generate { chat: false },
        ("POST", "/v1/embeddings") => Route::Embed,
        ("POST", "/v1/responses" | "/v1/messages") => Route::Passthrough,
        ("GET", "/v1/models" | "/version") | ("POST", "/tokenize" | "/detokenize") => Route::Plain,
        _ => return None,
    })
}

/// Counts a request whose client went away before its answer (its future dropped: hyper ends a
/// connection whose client closed it) as `499`, nginx's "client closed request". A request
/// queued for a slot then never reaches the engine.
struct Answer<'a> {
    gw: &'a Gateway,
    given: bool,
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        if !self.given {
            self.gw.metrics.status(499);
        }
    }
}

/// Entry point for every request.
pub(crate) async fn handle(gw: Arc<Gateway>, req: Request) -> Response {
    let mut answer = Answer { gw: &gw, given: false };
    let resp = dispatch(&gw, req).await;
    answer.given = true;
    gw.metrics.status(resp.status().as_u16());
    resp
}

async fn dispatch(gw: &Arc<Gateway>, req: Request) -> Response {
    let started = Instant::now();
    let path = req.uri().path().to_string();
    let route = route(req.method(), &path);
    // Keys before routes: a keyless caller learns nothing, not even which paths exist.
    let mut key = None;
    if route != Some(Route::Health) {
        let auth = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let who = caller(&gw.cfg.keys, auth);
        key = who.flatten();
        if who.is_none() {
            gw.metrics.refused("unauthorized");
            let msg =
                "Unauthorized: missing or wrong API key: send the header Authorization: Bearer <key> with a key from \
                       engine.api_keys";
            return error(StatusCode::UNAUTHORIZED, msg, "invalid_request_error", "invalid_api_key", None);
        }
    }
    let Some(route) = route else {
        let msg = format!("{} {path} is not served by this endpoint", req.method());
        return error(StatusCode::NOT_FOUND, &msg, "invalid_request_error", "not_found", None);
    };
    if route == Route::Metrics {
        return metrics(gw).await;
    }
    if gw.engine_state() != EngineState::Ready {
        gw.recheck_death().await;
        if gw.engine_state() != EngineState::Ready {
            return unavailable(gw, "starting or restarting");
        }
    }
    let (parts, body) = req.into_parts();
    let mut body = match read_capped(gw, &parts.headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let takes_slot = matches!(route, Route::Generate { .. } | Route::Embed | Route::Passthrough);
    if takes_slot && gw.saturated() {
        return queue_full(gw, SlotRefusal::QueueFull);
    }
    // The key's own limit, counted from here until the answer is done.
    let hold = match key.filter(|_| takes_slot) {
        Some(i) => match gw.hold_key(i) {
            Some(h) => Some(h),
            None => return key_busy(gw, i),
        },
        None => None,
    };
    let slot = match route {
        Route::Generate { chat } => {
            body = match with_priority(gw, key, body) {
                Ok(b) => b,
                Err((msg, code)) => return bad_request(&msg, code),
            };
            if let Err(r) = admission(gw, chat, &body).await {
                return r;
            }
            match take_slot(gw, hold).await {
                Ok(s) => Some(s),
                Err(r) => return r,
            }
        }
        Route::Embed | Route::Passthrough => match take_slot(gw, hold).await {
            Ok(s) => Some(s),
            Err(r) => return r,
        },
        Route::Health | Route::Metrics | Route::Plain => None,
    };
    let pq = parts.uri.path_and_query().map_or(path.as_str(), |p| p.as_str()).to_string();
    // SSE framed (and timed) from `started`, except where the stream's protocol has no `[DONE]`.
    let framed = (route != Route::Passthrough).then_some(started);
    forward(gw, parts.method, &pq, &parts.headers, body, framed, slot).await
}

async fn read_capped(gw: &Gateway, headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    let cap = gw.cfg.max_body_bytes;
    let too_large = |n: Option<u64>| {
        gw.metrics.refused("body_too_large");
        let fig = n.map_or_else(|| "more than the limit".to_string(), |n| format!("{n} bytes"));
        let msg = format!("request body is {fig}; the gateway accepts at most {cap} bytes: send a smaller request");
        error(StatusCode::PAYLOAD_TOO_LARGE, &msg, "invalid_request_error", "request_too_large", None)
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) {
        return Err(too_large(declared));
    }
    match Limited::new(body, cap).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large(None)),
        Err(e) => {
            let msg = format!("could not read the request body: {e}");
            Err(error(StatusCode::BAD_REQUEST, &msg, "invalid_request_error", "bad_body", None))
        }
    }
}

fn bad_request(msg: &str, code: &str) -> Response {
    error(StatusCode::BAD_REQUEST, msg, "invalid_request_error", code, None)
}

/// Count the prompt (in process or by the engine's `/tokenize`) and check it against the plan.
async fn admission(gw: &Gateway, chat: bool, body: &Bytes) -> Result<(), Response> {
    let v = Value::Object(request_object(body).map_err(|(msg, code)| bad_request(&msg, code))?);
    let counts = prompt_counts(gw, chat, &v).await?;
    let max_tokens = requested_max_tokens(&v);
    for n in counts {
        if let Err(r) = admit(&gw.cfg.limits, n, max_tokens) {
            gw.metrics.refused(r.limit.name());
            return Err(bad_request(&r.message(), r.limit.name()));
        }
    }
    gw.metrics.admitted();
    Ok(())
}

/// Prompt tokens of each sequence the request would start. Chat: the engine's `/tokenize`
/// (the chat template is Jinja, rendered by vLLM). Completion strings: the checkpoint's
/// tokenizer in process when loaded, else `/tokenize`. Token ids: their number.
async fn prompt_counts(gw: &Gateway, chat: bool, v: &Value) -> Result<Vec<u64>, Response> {
    let model = v.get("model").cloned().unwrap_or(Value::Null);
    if chat {
        let mut req = json!({"model": model, "messages": v.get("messages").cloned().unwrap_or(Value::Null),
                             "add_generation_prompt": v.get("add_generation_prompt").cloned().unwrap_or(json!(true))});
        for k in ["continue_final_message", "add_special_tokens", "chat_template", "chat_template_kwargs", "tools"] {
            if let Some(x) = v.get(k) {
                req[k] = x.clone();
            }
        }
        gw.metrics.prompt_counted("engine");
        return Ok(vec![tokenize(gw, &req).await?]);
    }
    // vLLM's completion default (`add_special_tokens: true`, e.g. the BOS), or the request's.
    let special = match v.get("add_special_tokens") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad_request("add_special_tokens must be true or false", "add_special_tokens")),
    };
    let prompt = v.get("prompt").cloned().unwrap_or(Value::Null);
    let is_ids = |a: &[Value]| !a.is_empty() && a.iter().all(Value::is_u64);
    match &prompt {
        Value::String(p) => Ok(vec![count_text(gw, &model, p, special).await?]),
        Value::Array(a) if is_ids(a) => Ok(vec![a.len() as u64]),
        Value::Array(a) => {
            let mut out = Vec::with_capacity(a.len());
            for p in a {
                match p {
                    Value::String(p) => out.push(count_text(gw, &model, p, special).await?),
                    Value::Array(ids) if is_ids(ids) => out.push(ids.len() as u64),
                    _ => return Err(bad_request("prompt must be a string, a list of strings or token ids", "prompt")),
                }
            }
            Ok(out)
        }
        _ => Err(bad_request("prompt must be a string, a list of strings or token ids", "prompt")),
    }
}

/// Tokens of one completion prompt: in process when the checkpoint's tokenizer is loaded (and
/// encodes it), else the engine's `/tokenize` with the same `add_special_tokens`.
async fn count_text(gw: &Gateway, model: &Value, text: &str, special: bool) -> Result<u64, Response> {
    if let Some(n) = gw.counter().and_then(|c| c.count(text, special).ok()) {
        gw.metrics.prompt_counted("tokenizer");
        return Ok(n);
    }
    gw.metrics.prompt_counted("engine");
    tokenize(gw, &json!({"model": model, "prompt": text, "add_special_tokens": special})).await
}

async fn tokenize(gw: &Gateway, req: &Value) -> Result<u64, Response> {
    let url = format!("{}/tokenize", gw.cfg.upstream);
    let resp =
        gw.client.post(url).json(req).send().await.map_err(|_| unavailable(gw, "its /tokenize did not answer"))?;
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(|_| unavailable(gw, "its /tokenize answer was cut"))?;
    if !status.is_success() {
        if let Some(r) = engine_verdict(gw, status.as_u16(), &bytes) {
            return Err(r);
        }
        // The engine's own verdict on the request (bad model, bad messages): passed on as is.
        let mut r = Response::new(Body::from(bytes));
        *r.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Err(r);
    }
    serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v.get("count")?.as_u64())
        .ok_or_else(|| unavailable(gw, "its /tokenize answer has no count"))
}

/// Every slot busy and the queue full: 429 + Retry-After. The queue's wait ran out: 503 +
/// Retry-After (`queue_timeout`; the request never reached the engine).
fn queue_full(gw: &Gateway, why: SlotRefusal) -> Response {
    let n = gw.cfg.max_in_flight;
    let retry = Some(gw.cfg.retry_after_s);
    if why == SlotRefusal::QueueTimeout {
        gw.metrics.refused("queue_timeout");
        let msg = format!(
            "all {n} engine slots stayed busy for the queue's wait ({} s); the request never reached the engine: \
             retry after the Retry-After seconds",
            gw.cfg.queue_wait.as_secs_f64()
        );
        return error(StatusCode::SERVICE_UNAVAILABLE, &msg, "service_unavailable", "queue_timeout", retry);
    }
    gw.metrics.refused("queue_full");
    let msg = format!("all {n} engine slots are busy and the queue is full: retry after the Retry-After seconds");
    error(StatusCode::TOO_MANY_REQUESTS, &msg, "rate_limit_error", "queue_full", retry)
}

/// 429 + Retry-After: the key's own `max_in_flight` is reached.
fn key_busy(gw: &Gateway, key: usize) -> Response {
    gw.metrics.refused("key_max_in_flight");
    let n = gw.cfg.keys.get(key).and_then(|k| k.policy.max_in_flight).unwrap_or(0);
    let msg = format!(
        "this API key already has {n} requests in the gateway, its max_in_flight in engine.api_keys.file: \
         retry after the Retry-After seconds, or send fewer at once"
    );
    error(StatusCode::TOO_MANY_REQUESTS, &msg, "rate_limit_error", "key_max_in_flight", Some(gw.cfg.retry_after_s))
}

/// The body with its `priority` raised to the key's (`priority::apply`), or a 400.
fn with_priority(gw: &Gateway, key: Option<usize>, body: Bytes) -> Result<Bytes, (String, &'static str)> {
    let floor = key.and_then(|i| gw.cfg.keys.get(i)).and_then(|k| k.policy.priority);
    if !gw.cfg.priority && floor.is_none() && !body.windows(10).any(|w| w == b"\"priority\"") {
        return Ok(body);
    }
    let mut v = request_object(&body)?;
    match super::priority::apply(&mut v, gw.cfg.priority, floor) {
        Ok(false) => Ok(body),
        Ok(true) => Ok(Bytes::from(Value::Object(v).to_string())),
        Err(msg) => Err((msg, "priority")),
    }
}

/// A slot, or 429/503; a request that got its slot from the queue after the drain began gets 503.
async fn take_slot(gw: &Arc<Gateway>, key: Option<KeyHold>) -> Result<InFlight, Response> {
    let slot = gw.slot(key).await.map_err(|why| queue_full(gw, why))?;
    if gw.engine_state() != EngineState::Ready {
        drop(slot);
        return Err(unavailable(gw, "it stopped while the request was queued"));
    }
    Ok(slot)
}

async fn forward(
    gw: &Arc<Gateway>,
    method: Method,
    path_query: &str,
    headers: &HeaderMap,
    body: Bytes,
    framed: Option<Instant>,
    slot: Option<InFlight>,
) -> Response {
    let url = format!("{}{path_query}", gw.cfg.upstream);
    let mut req = gw.client.request(method, url).body(body);
    for (k, v) in headers {
        if !DROP.contains(&k.as_str()) {
            req = req.header(k, v);
        }
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(_) => return unavailable(gw, "it did not answer"),
    };
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let mut out_headers = HeaderMap::new();
    for (k, v) in resp.headers() {
        // A plain body is passed on byte for byte: its length stays what the engine said.
        if !DROP.contains(&k.as_str()) || (!sse && k == header::CONTENT_LENGTH) {
            out_headers.append(k.clone(), v.clone());
        }
    }
    let small = resp.content_length().is_some_and(|n| n <= MAX_ERROR_BODY as u64);
    let body = if let (true, Some(started)) = (sse, framed) {
        sse_body(gw.clone(), resp, started, slot)
    } else if status.is_server_error() && small {
        // A short error body: read for what it means (an engine death, vLLM's own overload).
        let Ok(bytes) = resp.bytes().await else { return unavailable(gw, "its answer was cut") };
        if let Some(r) = engine_verdict(gw, status.as_u16(), &bytes) {
            return r;
        }
        Body::from(bytes)
    } else {
        plain_body(resp, slot)
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = out_headers;
    r
}

async fn metrics(gw: &Gateway) -> Response {
    let mut text = gw.metrics_text();
    let url = format!("{}/metrics", gw.cfg.upstream);
    let upstream = match gw.client.get(url).send().await {
        Ok(r) if r.status().is_success() => r.text().await.ok(),
        _ => None,
    };
    match upstream {
        Some(t) => text.push_str(&t),
        None => text.push_str("# the engine's /metrics did not answer; only the gateway's series are shown\n"),
    }
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_version_is_forwarded_and_unknown_paths_are_not() {
        // `bench` reads vLLM's /version into its receipt.
        assert_eq!(route(&Method::GET, "/version"), Some(Route::Plain));
        assert_eq!(route(&Method::GET, "/v1/models"), Some(Route::Plain));
        assert_eq!(route(&Method::POST, "/detokenize"), Some(Route::Plain));
        assert_eq!(route(&Method::POST, "/version"), None);
        assert_eq!(route(&Method::GET, "/v1/internal"), None);
        assert_eq!(route(&Method::POST, "/v1/responses"), Some(Route::Passthrough));
        assert_eq!(route(&Method::POST, "/v1/messages"), Some(Route::Passthrough));
    }
}
