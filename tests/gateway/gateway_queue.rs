//! Queue semantics as production gateways have them (issue 29 item 5): the queue's wait ends
//! in 503 + Retry-After, a client that leaves while queued is counted as 499 and never reaches
//! the engine, `priority` is raised to its key's, each key has its own in-flight limit. The
//! gateway in front of the fake vLLM server (tests/gateway_fake/), driven by real HTTP clients.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::gateway_fake;

use serde_json::{json, Value};
use spark_kit::gateway::keys::{ApiKey, KeyPolicy};

use gateway_fake::*;

/// A non-streamed completion that the fake engine answers after `delay_ms`.
fn completion(delay_ms: u64) -> Value {
    json!({"model": "m", "prompt": "a b c", "max_tokens": 5, "delay_ms": delay_ms})
}

async fn post(url: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut r = client().post(format!("{url}/v1/completions")).json(body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap()
}

async fn error_code(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    (status, v["error"]["code"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_wait_ends_in_503_with_retry_after() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |c| {
        c.max_in_flight = 1;
        c.queue_wait = Duration::from_millis(300);
    })
    .await;
    let url = g.url.clone();
    let holder = tokio::spawn(async move { post(&url, None, &completion(1500)).await.status().as_u16() });
    until("the slot is taken", || g.gw.in_flight() == 1).await;
    let r = post(&g.url, None, &completion(0)).await;
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "5");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_timeout", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("never reached the engine"), "{v}");
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(seen.plain.load(Ordering::SeqCst), 1, "the timed-out request reached the engine");
    assert!(g.gw.metrics_text().contains("spark_gateway_refused_total{reason=\"queue_timeout\"} 1\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_queued_is_499_and_never_reaches_the_engine() {
    let (up, seen) = upstream().await;
    let g = gateway(&up, |c| c.max_in_flight = 1).await;
    let url = g.url.clone();
    let holder = tokio::spawn(async move { post(&url, None, &completion(1500)).await.status().as_u16() });
    until("the slot is taken", || g.gw.in_flight() == 1).await;
    // A raw client that sends its request, waits in the queue, and hangs up.
    let body = completion(0).to_string();
    let addr = g.url.strip_prefix("http://").unwrap().to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    until("the request is queued", || g.gw.queued() == 1).await;
    drop(s);
    until("the queue is empty again", || g.gw.queued() == 0).await;
    assert_eq!(holder.await.unwrap(), 200);
    let text = g.gw.metrics_text();
    assert!(text.contains("spark_gateway_requests_total{status=\"499\"} 1\n"), "{text}");
    assert_eq!(seen.plain.load(Ordering::SeqCst), 1, "the request whose client left reached the engine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_is_raised_to_the_keys_and_refused_without_priority_scheduling() {
    let (up, seen) = upstream().await;
    let low = KeyPolicy { priority: Some(5), max_in_flight: None };
    let g = gateway(&up, |c| {
        c.keys = vec![ApiKey::new("sk-low", low), "sk-any".into()];
        c.priority = true;
    })
    .await;
    let sent = |key: &'static str, p: Option<i64>| {
        let url = g.url.clone();
        async move {
            let mut b = completion(0);
            if let Some(p) = p {
                b["priority"] = json!(p);
            }
            let r = post(&url, Some(key), &b).await;
            assert_eq!(r.status().as_u16(), 200);
            r.json::<Value>().await.unwrap()["priority"].clone()
        }
    };
    assert_eq!(sent("sk-low", Some(0)).await, json!(5), "a key may not jump ahead of its priority");
    assert_eq!(sent("sk-low", None).await, json!(5));
    assert_eq!(sent("sk-low", Some(9)).await, json!(9), "a later priority is kept");
    assert_eq!(sent("sk-any", Some(-3)).await, json!(-3));
    assert_eq!(sent("sk-any", None).await, Value::Null);

    // First come, first served: a priority is refused with the fix, before the engine sees it.
    let before = seen.plain.load(Ordering::SeqCst);
    let fcfs = gateway(&up, |_| {}).await;
    let mut b = completion(0);
    b["priority"] = json!(2);
    let r = post(&fcfs.url, None, &b).await;
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("priority")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("engine.scheduling_policy"), "{v}");
    assert_eq!(seen.plain.load(Ordering::SeqCst), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_has_its_own_in_flight_limit() {
    let (up, seen) = upstream().await;
    let one = KeyPolicy { priority: None, max_in_flight: Some(1) };
    let g = gateway(&up, |c| c.keys = vec![ApiKey::new("sk-one", one), "sk-two".into()]).await;
    let url = g.url.clone();
    let holder = tokio::spawn(async move { post(&url, Some("sk-one"), &completion(1000)).await.status().as_u16() });
    until("the first request is in flight", || g.gw.in_flight() == 1).await;
    let (status, code) = error_code(post(&g.url, Some("sk-one"), &completion(0)).await).await;
    assert_eq!((status, code.as_str()), (429, "key_max_in_flight"));
    assert_eq!(post(&g.url, Some("sk-two"), &completion(0)).await.status(), 200, "another key is not held back");
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(post(&g.url, Some("sk-one"), &completion(0)).await.status(), 200, "the key's count went down");
    assert_eq!(seen.plain.load(Ordering::SeqCst), 3);
}
