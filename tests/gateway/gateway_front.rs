//! The front door as production gateways behave (issue 29): advice that admits when followed,
//! keys before routes, headers kept, clear messages for bad JSON, engine death and engine
//! overload told apart. The gateway in front of the fake vLLM server (tests/gateway_fake/),
//! driven by a real HTTP client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::gateway_fake;

use serde_json::{json, Value};
use spark_kit::gateway::admission::Limits;
use spark_kit::gateway::EngineState;

use gateway_fake::*;

/// The number after `what` in `msg`, if `what` is there.
fn at_most(msg: &str, what: &str) -> Option<usize> {
    let i = msg.find(what)? + what.len();
    msg[i..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Send a chat of `words` prompt words and `max_tokens`; on a 400, follow its advice once
/// (shorten the prompt, lower max_tokens) and send again. Returns the statuses and messages.
async fn follow_advice(url: &str, mut words: usize, mut max_tokens: u64) -> Vec<(u16, String)> {
    let mut seen = Vec::new();
    for _ in 0..2 {
        let mut body = chat_body(words, max_tokens);
        body["interval_ms"] = json!(0);
        let r = send_chat(url, &body).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        seen.push((status, text.clone()));
        if status != 400 {
            break;
        }
        let v: Value = serde_json::from_str(&text).unwrap();
        let msg = v["error"]["message"].as_str().unwrap().to_string();
        if let Some(n) = at_most(&msg, "shorten the prompt to at most ") {
            words = words.min(n);
        }
        if let Some(n) = at_most(&msg, "lower max_tokens to at most ") {
            max_tokens = max_tokens.min(n as u64);
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_advice_followed_gets_200() {
    let (up, _seen) = upstream().await;
    // A KV pool larger than max_model_len, as on a 512-token model with a 65536-token pool.
    let limits = Limits { max_model_len: 100, kv_pool_tokens: Some(1000), safe_max_prompt: Some(60) };
    let g = gateway(&up, |c| c.limits = limits).await;
    for (words, max_tokens) in [(10, 99_999_999), (70, 5), (70, 99_999_999), (59, 50), (5, 96)] {
        let seen = follow_advice(&g.url, words, max_tokens).await;
        let last = seen.last().unwrap();
        assert_eq!(last.0, 200, "prompt {words} words, max_tokens {max_tokens}: {seen:?}");
        assert!(seen.len() <= 2, "{seen:?}");
    }
    // The binding limit is named first: max_model_len, not the larger pool.
    let v: Value = send_chat(&g.url, &chat_body(10, 99_999_999)).await.json().await.unwrap();
    assert_eq!(v["error"]["code"], "max_model_len", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("lower max_tokens to at most 90"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_come_before_routes_and_plain_answers_keep_their_length() {
    let (up, _seen) = upstream().await;
    let g = gateway(&up, |c| c.keys = vec!["sk-k".into()]).await;
    let c = client();
    for (method, path) in [("GET", "/v1/nope"), ("POST", "/admin"), ("GET", "/v1/models"), ("GET", "/tokenize")] {
        let r = c.request(method.parse().unwrap(), format!("{}{path}", g.url)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{method} {path} without a key");
    }
    let r = c.get(format!("{}/v1/nope", g.url)).bearer_auth("sk-k").send().await.unwrap();
    assert_eq!(r.status(), 404, "with the key, an unknown path is 404");
    // A non-streamed answer keeps the engine's Content-Length (not chunked).
    let body = json!({"model": "m", "prompt": "a b", "max_tokens": 2});
    for (path, req) in [("/v1/models", None), ("/v1/completions", Some(&body))] {
        let mut b = c.request(if req.is_some() { "POST" } else { "GET" }.parse().unwrap(), format!("{}{path}", g.url));
        if let Some(v) = req {
            b = b.json(v);
        }
        let r = b.bearer_auth("sk-k").send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let declared = r.headers().get("content-length").map(|v| v.to_str().unwrap().parse::<usize>().unwrap());
        assert!(r.headers().get("transfer-encoding").is_none(), "{path}: {:?}", r.headers());
        let n = r.bytes().await.unwrap().len();
        assert_eq!(declared, Some(n), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_is_told_what_is_wrong() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |_| {}).await;
    let c = client();
    let post = |path: &str, body: &'static str| {
        c.post(format!("{}{path}", g.url)).header("content-type", "application/json").body(body).send()
    };
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let v: Value = post(path, r#"[{"model": "m", "prompt": "hi"}]"#).await.unwrap().json().await.unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("request body is a JSON array, not an object"), "{path}: {msg}");
        assert!(!msg.contains("prompt must be"), "{path}: {msg}");
        let r = post(path, r#"{"model": "m", "prompt": "a\ud800b", "messages": []}"#).await.unwrap();
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("the escape \\ud800 at line 1 column 28 is a lone UTF-16 surrogate"), "{path}: {msg}");
        assert!(!msg.contains("hex escape"), "{path}: {msg}");
    }
    assert_eq!(seen.tokenize.load(std::sync::atomic::Ordering::SeqCst), 0, "bad JSON reached the engine");
}

async fn complete(url: &str, extra: Value) -> reqwest::Response {
    let mut body = json!({"model": "m", "prompt": "a b", "max_tokens": 2});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    client().post(format!("{url}/v1/completions")).json(&body).send().await.unwrap()
}

fn retry_after(r: &reqwest::Response) -> u64 {
    r.headers()["retry-after"].to_str().unwrap().parse().unwrap()
}

/// vLLM's `500 EngineCore encountered an issue` (the second after its engine core died, before
/// the supervisor has noticed) is a restart: 503 + Retry-After at once, never 500, and the
/// gateway stays unavailable through the supervisor's "ready" ticks until it restarts the
/// engine. Retry-After is the last boot's duration less the time this restart has taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_death_answers_503_restarting_never_500() {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let (up, seen) = upstream().await;
    let g = gateway(&up, |c| c.retry_after_s = 60).await;
    // A boot of 2.5 s, timed by the gateway (unavailable → ready).
    g.gw.set_engine_state(EngineState::Unavailable);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    g.gw.set_engine_state(EngineState::Ready);
    let died = Instant::now();
    let r = complete(&g.url, json!({"fail": "engine_dead"})).await;
    assert_eq!(r.status(), 503, "the engine's death answered {}", r.status());
    assert_eq!(retry_after(&r), 3, "the last boot (2.5 s), rounded up");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "unavailable", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("engine core died"), "{v}");
    // The supervisor still says ready (it has not noticed): every request gets 503 at once.
    g.gw.set_engine_state(EngineState::Ready);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let chats_before = seen.chat.load(Ordering::SeqCst);
    let r = send_chat(&g.url, &chat_body(2, 2)).await;
    assert_eq!(r.status(), 503);
    let left = 2.5 - died.elapsed().as_secs_f64();
    assert!((1..=2).contains(&retry_after(&r)), "{} s left of the boot, Retry-After {}", left, retry_after(&r));
    assert_eq!(seen.chat.load(Ordering::SeqCst), chats_before, "a request reached the dead engine");
    assert_eq!(g.gw.engine_state(), EngineState::Unavailable);
    // The supervisor restarts the engine: ready again, served.
    g.gw.set_engine_state(EngineState::Unavailable);
    seen.dead.store(false, Ordering::SeqCst);
    g.gw.set_engine_state(EngineState::Ready);
    assert_eq!(send_chat(&g.url, &chat_body(2, 2)).await.status(), 200);
    let m = g.gw.metrics_text();
    assert!(m.contains("spark_gateway_refused_total{reason=\"engine_dead\"} 1\n"), "{m}");
    assert!(!m.contains("status=\"500\""), "{m}");
    // An error of that shape whose engine then answers /health 200 was no death: served again.
    let r = complete(&g.url, json!({"fail": "engine_dead", "keep_health": true})).await;
    assert_eq!(r.status(), 503);
    assert_eq!(complete(&g.url, json!({})).await.status(), 200, "a false alarm held the gateway down");
    // Any other 500 is the engine's own answer, passed on.
    assert_eq!(complete(&g.url, json!({"fail": "internal"})).await.status(), 500);
    assert_eq!(g.gw.engine_state(), EngineState::Ready);
}

/// Released vLLM's own admission refusal (503, `--max-num-queued-reqs` / `-tokens`) is overload:
/// 429 + Retry-After with vLLM's reason named, never "restarting"; the metrics say which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_s_own_overload_is_429_with_its_reason() {
    let (up, _seen) = upstream().await;
    let g = gateway(&up, |_| {}).await;
    for reason in ["max_num_queued_reqs", "max_num_queued_tokens"] {
        let r = complete(&g.url, json!({"fail": reason})).await;
        assert_eq!(r.status(), 429, "{reason}");
        assert_eq!(retry_after(&r), 5);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], reason, "{v}");
        assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("overloaded") && msg.contains(&format!("--{}", reason.replace('_', "-"))), "{msg}");
        assert_eq!(g.gw.engine_state(), EngineState::Ready, "overload read as a restart");
        assert_eq!(complete(&g.url, json!({})).await.status(), 200);
    }
    let m = g.gw.metrics_text();
    assert!(m.contains("spark_gateway_refused_total{reason=\"engine_max_num_queued_reqs\"} 1\n"), "{m}");
    assert!(m.contains("spark_gateway_refused_total{reason=\"engine_max_num_queued_tokens\"} 1\n"), "{m}");
    assert!(!m.contains("reason=\"unavailable\""), "{m}");
}

/// `/v1/responses` and `/v1/messages` (released vLLM serves both) pass through, keyed, taking a
/// slot; their streams end without `[DONE]` and get no cut-stream event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_messages_pass_through() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |c| c.keys = vec!["sk-k".into()]).await;
    let c = client();
    for path in ["/v1/responses", "/v1/messages"] {
        let url = format!("{}{path}", g.url);
        let body = json!({"model": "m", "input": "hi", "stream": false});
        assert_eq!(c.post(&url).json(&body).send().await.unwrap().status(), 401, "{path} keyed");
        let r = c.post(&url).bearer_auth("sk-k").json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["echo"]["input"], "hi", "{v}");
        let r = c.post(&url).bearer_auth("sk-k").json(&json!({"model": "m", "stream": true})).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        assert_eq!(text.matches("event: ").count(), 3, "{text}");
        assert!(!text.contains("upstream_stream_cut") && !text.contains("[DONE]"), "{text}");
    }
    assert_eq!(seen.passthrough.load(std::sync::atomic::Ordering::SeqCst), 4);
    assert!(g.gw.metrics_text().contains("spark_gateway_streams_cut_total 0\n"));
    until("every slot is released", || g.gw.in_flight() == 0).await;
}

/// Slow and oversized clients: a head not finished within the header timeout, and an idle
/// keep-alive connection, are closed; a head over the size limit gets 431.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_idle_and_oversized_heads_are_cut() {
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (up, _seen) = upstream().await;
    let g = gateway(&up, |c| c.header_timeout = Duration::from_millis(400)).await;
    let addr = g.url.strip_prefix("http://").unwrap().to_string();
    let read_all = |mut s: tokio::net::TcpStream| async move {
        let mut out = Vec::new();
        let t0 = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        (r.is_ok(), t0.elapsed(), String::from_utf8_lossy(&out).into_owned())
    };
    // A head that never ends.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
    let (closed, after, _) = read_all(s).await;
    assert!(closed && after < Duration::from_secs(2), "a slow head held the connection {after:?}");
    // An idle keep-alive connection after a full answer.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let (closed, after, text) = read_all(s).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(closed && after < Duration::from_secs(2), "an idle connection was held {after:?}");
    // A 100 KB header.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let big = format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(100_000));
    let _ = s.write_all(big.as_bytes()).await;
    let (_, _, text) = read_all(s).await;
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
}
