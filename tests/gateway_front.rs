//! The front door as production gateways behave (issue 29): advice that admits when followed,
//! keys before routes, headers kept, clear messages for bad JSON, engine death and engine
//! overload told apart. The gateway in front of the fake vLLM server (tests/gateway_fake/),
//! driven by a real HTTP client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_fake;

use serde_json::{json, Value};
use spark_kit::gateway::admission::Limits;

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
