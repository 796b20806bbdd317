//! The gateway in front of a real HTTP upstream on loopback (a small axum server standing in for
//! vLLM's OpenAI server: /tokenize, streamed chat, /health, /metrics), driven by a real client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::gateway_fake;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use futures_util::StreamExt;
use serde_json::{json, Value};
use spark_kit::gateway::{DrainOutcome, EngineState};
use tokio::net::TcpListener;

use gateway_fake::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_passes_through_event_by_event() {
    let (up, _seen) = upstream().await;
    let g = gateway(&up, |_| {}).await;
    let mut body = chat_body(3, 5);
    body["interval_ms"] = json!(150);
    let t0 = Instant::now();
    let resp = send_chat(&g.url, &body).await;
    assert_eq!(resp.status(), 200);
    let mut s = resp.bytes_stream();
    let first = s.next().await.unwrap().unwrap();
    let first_at = t0.elapsed();
    assert_eq!(first, Bytes::from(event("w0 ")), "the first event arrives alone");
    let mut all = first.to_vec();
    while let Some(c) = s.next().await {
        all.extend_from_slice(&c.unwrap());
    }
    let total = t0.elapsed();
    // Six 150 ms steps upstream: the first event must not wait for the rest.
    assert!(total - first_at >= Duration::from_millis(600), "first {first_at:?}, total {total:?}");
    let text = String::from_utf8(all).unwrap();
    let expect: String = (0..5).map(|i| event(&format!("w{i} "))).collect::<String>() + "data: [DONE]\n\n";
    assert_eq!(text, expect);
    let m = client().get(format!("{}/metrics", g.url)).send().await.unwrap().text().await.unwrap();
    assert!(m.contains("spark_gateway_ttft_seconds_count 1\n"), "{m}");
    assert!(m.contains("spark_gateway_inter_token_seconds_count 4\n"), "{m}");
    assert!(m.contains("spark_gateway_admitted_total 1\n"), "{m}");
    assert!(m.contains("vllm:num_requests_running 0\n"), "engine series passed through: {m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_plan_is_400_and_the_engine_never_sees_it() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |_| {}).await;
    // 50 prompt + 40 = 90 > the KV pool's 80.
    let resp = send_chat(&g.url, &chat_body(50, 40)).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("prompt 50 + max_tokens 40 = 90 tokens; the KV pool holds 80 tokens"), "{msg}");
    assert!(msg.contains("lower max_tokens to at most 30"), "{msg}");
    assert_eq!(v["error"]["code"], "kv_pool");
    // 61 prompt > the prefill budget of 60.
    let v: Value = send_chat(&g.url, &chat_body(61, 1)).await.json().await.unwrap();
    assert_eq!(v["error"]["code"], "prefill_budget", "{v}");
    assert_eq!(seen.chat.load(Ordering::SeqCst), 0, "the engine got a refused request");
    assert_eq!(seen.tokenize.load(Ordering::SeqCst), 2, "prompts counted by the engine's /tokenize");
    let ok = send_chat(&g.url, &chat_body(50, 30)).await;
    assert_eq!(ok.status(), 200);
    assert!(ok.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    assert_eq!(seen.chat.load(Ordering::SeqCst), 1);
    let m = g.gw.metrics_text();
    assert!(m.contains("spark_gateway_refused_total{reason=\"kv_pool\"} 1\n"), "{m}");
    assert!(m.contains("spark_gateway_refused_total{reason=\"prefill_budget\"} 1\n"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_slots_and_queue_is_429_with_retry_after() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |c| {
        c.max_in_flight = 1;
        c.queue_len = 1;
    })
    .await;
    let mut body = chat_body(2, 4);
    body["interval_ms"] = json!(100);
    let (u, b) = (g.url.clone(), body.clone());
    let first = tokio::spawn(async move { send_chat(&u, &b).await.text().await.unwrap() });
    until("the first request holds the slot", || g.gw.in_flight() == 1).await;
    let (u, b) = (g.url.clone(), body.clone());
    let second = tokio::spawn(async move { send_chat(&u, &b).await.text().await.unwrap() });
    until("the second request is queued", || g.gw.queued() == 1).await;
    assert_eq!((g.gw.in_flight(), g.gw.queued()), (1, 1));
    let third = send_chat(&g.url, &body).await;
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers()["retry-after"], "5");
    let v: Value = third.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("all 1 engine slots are busy"), "{v}");
    assert_eq!(seen.tokenize.load(Ordering::SeqCst), 2, "the refused request cost the engine a /tokenize");
    assert!(first.await.unwrap().ends_with("data: [DONE]\n\n"));
    assert!(second.await.unwrap().ends_with("data: [DONE]\n\n"), "the queued request ran after the first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_down_is_503_with_retry_after_then_serves() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let g = gateway(&format!("http://{addr}"), |_| {}).await;
    for path in ["/v1/models", "/health"] {
        let r = client().get(format!("{}{path}", g.url)).send().await.unwrap();
        assert_eq!(r.status(), 503, "{path}");
        assert_eq!(r.headers()["retry-after"], "5");
    }
    let r = send_chat(&g.url, &chat_body(2, 2)).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "service_unavailable");
    // The supervisor says restarting: 503 even though the engine is back.
    let _seen = upstream_on(TcpListener::bind(addr).await.unwrap()).await;
    g.gw.set_engine_state(EngineState::Unavailable);
    assert_eq!(client().get(format!("{}/v1/models", g.url)).send().await.unwrap().status(), 503);
    g.gw.set_engine_state(EngineState::Ready);
    assert_eq!(client().get(format!("{}/health", g.url)).send().await.unwrap().status(), 200);
    assert_eq!(send_chat(&g.url, &chat_body(2, 2)).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_stream_ends_with_an_error_event_and_done() {
    let (up, _seen) = upstream().await;
    let g = gateway(&up, |_| {}).await;
    let mut body = chat_body(2, 10);
    body["cut_after"] = json!(3);
    let resp = send_chat(&g.url, &body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text.split_terminator("\n\n").collect();
    assert_eq!(events.len(), 5, "three events, the error, [DONE]; the half event dropped: {text}");
    assert_eq!(format!("{}\n\n", events[2]), event("w2 "));
    let err: Value = serde_json::from_str(events[3].strip_prefix("data: ").unwrap()).unwrap();
    assert!(err["error"]["message"].as_str().unwrap().contains("ended before [DONE]"), "{err}");
    assert_eq!(events[4], "data: [DONE]");
    assert!(g.gw.metrics_text().contains("spark_gateway_streams_cut_total 1\n"));
    assert_eq!(g.gw.in_flight(), 0, "the slot was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_drops_the_engine_request() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |_| {}).await;
    let mut body = chat_body(2, 50);
    body["interval_ms"] = json!(50);
    let resp = send_chat(&g.url, &body).await;
    let mut s = resp.bytes_stream();
    s.next().await.unwrap().unwrap();
    drop(s);
    let t0 = Instant::now();
    while seen.dropped.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.dropped.load(Ordering::SeqCst), 1, "the engine's stream was not dropped");
    assert_eq!(g.gw.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_finishes_in_flight_and_refuses_new() {
    let (up, _seen) = upstream().await;
    let mut g = gateway(&up, |_| {}).await;
    let mut body = chat_body(2, 8);
    body["interval_ms"] = json!(100);
    let resp = send_chat(&g.url, &body).await;
    let long = tokio::spawn(async move { resp.text().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(150)).await;
    g.stop.take().unwrap().send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = send_chat(&g.url, &chat_body(2, 2)).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "draining");
    assert!(long.await.unwrap().ends_with(&format!("{}data: [DONE]\n\n", event("w7 "))), "the stream completed");
    assert_eq!(g.done.await.unwrap().unwrap(), DrainOutcome::Idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_ends_open_streams_with_the_error_event() {
    let (up, _seen) = upstream().await;
    let mut g = gateway(&up, |c| c.drain_timeout = Duration::from_millis(200)).await;
    let mut body = chat_body(2, 40);
    body["interval_ms"] = json!(100);
    let resp = send_chat(&g.url, &body).await;
    let long = tokio::spawn(async move { resp.text().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(150)).await;
    g.stop.take().unwrap().send(()).unwrap();
    let text = long.await.unwrap();
    assert!(text.contains("the drain timeout passed"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(g.done.await.unwrap().unwrap(), DrainOutcome::TimedOut(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_body_cap_and_open_health() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |c| {
        c.keys = vec!["sk-right".into()];
        c.max_body_bytes = 1000;
    })
    .await;
    let c = client();
    let r = c.get(format!("{}/v1/models", g.url)).bearer_auth("sk-wrong").send().await.unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert!(!v.to_string().contains("sk-right") && !v.to_string().contains("sk-wrong"));
    assert_eq!(c.get(format!("{}/metrics", g.url)).send().await.unwrap().status(), 401);
    assert_eq!(c.get(format!("{}/health", g.url)).send().await.unwrap().status(), 200, "/health is open");
    let r = c.get(format!("{}/v1/models", g.url)).bearer_auth("sk-right").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let big = chat_body(600, 1);
    let r = c.post(format!("{}/v1/chat/completions", g.url)).bearer_auth("sk-right").json(&big).send().await.unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("at most 1000 bytes"), "{v}");
    assert_eq!(seen.tokenize.load(Ordering::SeqCst), 0);
    let r = c.post(format!("{}/v1/nope", g.url)).bearer_auth("sk-right").send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_when_the_drain_begins_gets_503_not_the_engine() {
    let (up, seen) = upstream().await;
    let mut g = gateway(&up, |c| {
        c.max_in_flight = 1;
        c.queue_len = 1;
    })
    .await;
    let mut body = chat_body(2, 4);
    body["interval_ms"] = json!(100);
    let (u, b) = (g.url.clone(), body.clone());
    let first = tokio::spawn(async move { send_chat(&u, &b).await.text().await.unwrap() });
    until("the first request holds the slot", || g.gw.in_flight() == 1).await;
    let (u, b) = (g.url.clone(), body.clone());
    let queued = tokio::spawn(async move { send_chat(&u, &b).await });
    until("the second request is queued", || g.gw.queued() == 1).await;
    g.stop.take().unwrap().send(()).unwrap();
    assert!(first.await.unwrap().ends_with("data: [DONE]\n\n"), "the in-flight stream completed");
    let r = queued.await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(seen.chat.load(Ordering::SeqCst), 1, "the queued request reached the engine");
    assert_eq!(g.done.await.unwrap().unwrap(), DrainOutcome::Idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_client_that_goes_away_leaves_the_queue() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |c| {
        c.max_in_flight = 1;
        c.queue_len = 1;
    })
    .await;
    let mut body = chat_body(2, 20);
    body["interval_ms"] = json!(100);
    let (u, b) = (g.url.clone(), body.clone());
    let first = tokio::spawn(async move { send_chat(&u, &b).await.text().await.unwrap() });
    until("the first request holds the slot", || g.gw.in_flight() == 1).await;
    // Queued, then its client gives up.
    let impatient = reqwest::Client::builder().no_proxy().timeout(Duration::from_millis(300)).build().unwrap();
    let r = impatient.post(format!("{}/v1/chat/completions", g.url)).json(&body).send().await;
    assert!(r.is_err(), "the queued request answered within 300 ms: {r:?}");
    until("the gone client's place in the queue is freed", || g.gw.queued() == 0).await;
    // The queue (of one) takes a request again rather than answering 429.
    let (u, b) = (g.url.clone(), chat_body(2, 2));
    let next = tokio::spawn(async move { send_chat(&u, &b).await });
    until("the next request is queued", || g.gw.queued() == 1).await;
    assert!(first.await.unwrap().ends_with("data: [DONE]\n\n"));
    let next = next.await.unwrap();
    assert_eq!(next.status(), 200);
    assert!(next.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    assert_eq!(seen.chat.load(Ordering::SeqCst), 2, "the gone client's request reached the engine");
    until("every slot is released", || (g.gw.in_flight(), g.gw.queued()) == (0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_a_plain_answer_drops_the_engine_request() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |_| {}).await;
    let impatient = reqwest::Client::builder().no_proxy().timeout(Duration::from_millis(300)).build().unwrap();
    let body = json!({"model": "m", "prompt": "a b", "max_tokens": 2, "delay_ms": 5000});
    let r = impatient.post(format!("{}/v1/completions", g.url)).json(&body).send().await;
    assert!(r.is_err(), "answered within 300 ms: {r:?}");
    assert_eq!(seen.plain.load(Ordering::SeqCst), 1, "the completion never reached the engine");
    let t0 = Instant::now();
    while seen.dropped.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.dropped.load(Ordering::SeqCst), 1, "the engine's request was not dropped with the client");
    until("the slot is released", || g.gw.in_flight() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_take_a_slot_without_admission() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |c| c.keys = vec!["sk-e".into()]).await;
    // Far over every limit if it were counted: embeddings are not admitted by the plan.
    let input = vec!["x"; 500].join(" ");
    let body = json!({"model": "m", "input": input, "delay_ms": 300});
    let c = client();
    let url = format!("{}/v1/embeddings", g.url);
    assert_eq!(c.post(&url).json(&body).send().await.unwrap().status(), 401, "embeddings are keyed");
    let req = c.post(&url).bearer_auth("sk-e").json(&body).send();
    let pending = tokio::spawn(req);
    until("the embedding holds a slot", || g.gw.in_flight() == 1).await;
    let r = pending.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["data"][0]["embedding"], json!([0.5, 0.25]), "{v}");
    assert_eq!(seen.plain.load(Ordering::SeqCst), 1);
    assert_eq!(seen.tokenize.load(Ordering::SeqCst), 0, "an embedding was counted for admission");
    until("the slot is released", || g.gw.in_flight() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_over_the_cap_is_413_before_the_engine() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |c| c.max_body_bytes = 1000).await;
    // No Content-Length: 20 chunks of 100 bytes, the cap found while reading.
    let chunks = futures_util::stream::iter((0..20).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 100]))));
    let r = client()
        .post(format!("{}/v1/completions", g.url))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "request_too_large", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("at most 1000 bytes"), "{v}");
    assert_eq!(seen.tokenize.load(Ordering::SeqCst) + seen.plain.load(Ordering::SeqCst), 0);
    assert!(g.gw.metrics_text().contains("spark_gateway_refused_total{reason=\"body_too_large\"} 1\n"));
}

/// Time to the first event of a streamed chat: the gateway (its /tokenize round trip included)
/// against the same upstream straight, interleaved. With Nagle on the gateway's accepted sockets
/// the first event waited for the client's delayed ACK: +40 ms (measured, TCP_NODELAY off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_event_is_not_held_by_the_gateway() {
    let (up, _seen) = upstream().await;
    let g = gateway(&up, |_| {}).await;
    let mut body = chat_body(20, 2);
    body["interval_ms"] = json!(0);
    let c = client();
    let (mut via, mut direct) = (Vec::new(), Vec::new());
    for round in 0..45 {
        for (side, base) in [(&mut via, g.url.as_str()), (&mut direct, up.as_str())] {
            let t0 = Instant::now();
            let mut s = c.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap().bytes_stream();
            s.next().await.unwrap().unwrap();
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            while s.next().await.is_some() {}
            // The first rounds warm the connection pools.
            if round >= 5 {
                side.push(ms);
            }
        }
    }
    let p50 = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (g50, d50) = (p50(&mut via), p50(&mut direct));
    eprintln!("first event p50: through the gateway {g50:.2} ms, straight {d50:.2} ms");
    assert!(g50 < d50 + 15.0, "the gateway holds the first event: p50 {g50:.2} ms vs {d50:.2} ms straight");
}
