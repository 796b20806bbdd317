//! Admission's prompt count in process (the checkpoint's `tokenizer.json`) and its fallback to
//! the engine's `/tokenize`, through the gateway in front of the fake upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::gateway_fake;

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use gateway_fake::*;

/// A word-level `tokenizer.json` with a BOS post-processor: "w0 … wN-1" is N tokens (+ BOS).
fn word_tokenizer(dir: &std::path::Path) -> std::path::PathBuf {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>"].iter().enumerate() {
        vocab.insert((*t).to_string(), json!(i));
    }
    for i in 0..200 {
        let n = vocab.len();
        vocab.insert(format!("w{i}"), json!(n));
    }
    let t = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
                          "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "decoder": null,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    let p = dir.join("tokenizer.json");
    std::fs::write(&p, t.to_string()).unwrap();
    p
}

fn prompt_words(n: usize) -> String {
    (0..n).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ")
}

async fn send_completion(url: &str, body: &Value) -> (u16, Value) {
    let r = client().post(format!("{url}/v1/completions")).json(body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_prompts_are_counted_in_process_with_the_checkpoints_tokenizer() {
    let (up, seen) = upstream().await;
    let d = tempfile::tempdir().unwrap();
    let path = word_tokenizer(d.path());
    let g = gateway(&up, |c| c.tokenizer = Some(path)).await;
    // 60 words + the BOS = 61 > the prefill budget of 60: the BOS counts, as vLLM counts it.
    let (code, v) = send_completion(&g.url, &json!({"model": "m", "prompt": prompt_words(60), "max_tokens": 1})).await;
    assert_eq!((code, v["error"]["code"].as_str()), (400, Some("prefill_budget")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("prompt is 61 tokens"), "{v}");
    // Without special tokens the same prompt is 60 and admitted.
    let body = json!({"model": "m", "prompt": prompt_words(60), "max_tokens": 1, "add_special_tokens": false});
    assert_eq!(send_completion(&g.url, &body).await.0, 200);
    // A list: each prompt counted; token ids by their number.
    let body = json!({"model": "m", "prompt": ["w1 w2", prompt_words(70), [5, 6]], "max_tokens": 1});
    let (code, v) = send_completion(&g.url, &body).await;
    assert_eq!(code, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("prompt is 71 tokens"), "{v}");
    assert_eq!(seen.tokenize.load(Ordering::SeqCst), 0, "a completion prompt was sent to the engine's /tokenize");
    // Chat keeps the engine's count (the template is rendered by vLLM).
    assert_eq!(send_chat(&g.url, &chat_body(5, 1)).await.status(), 200);
    assert_eq!(seen.tokenize.load(Ordering::SeqCst), 1);
    let m = g.gw.metrics_text();
    assert!(m.contains("spark_gateway_prompt_counts_total{by=\"tokenizer\"} 4\n"), "{m}");
    assert!(m.contains("spark_gateway_prompt_counts_total{by=\"engine\"} 1\n"), "{m}");
    assert!(!m.contains("# prompts are counted by the engine"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_usable_tokenizer_the_engine_counts_and_the_metrics_say_why() {
    let (up, seen) = upstream().await;
    let d = tempfile::tempdir().unwrap();
    let bad = d.path().join("tokenizer.json");
    std::fs::write(&bad, "{ not a tokenizer").unwrap();
    for (path, why) in [(d.path().join("absent/tokenizer.json"), "does not exist"), (bad, "could not be loaded")] {
        let before = seen.tokenize.load(Ordering::SeqCst);
        let g = gateway(&up, |c| c.tokenizer = Some(path.clone())).await;
        let (code, v) =
            send_completion(&g.url, &json!({"model": "m", "prompt": prompt_words(61), "max_tokens": 1})).await;
        assert_eq!((code, v["error"]["code"].as_str()), (400, Some("prefill_budget")), "{v}");
        assert_eq!(seen.tokenize.load(Ordering::SeqCst), before + 1, "not counted by the engine");
        let m = g.gw.metrics_text();
        assert!(m.contains("spark_gateway_prompt_counts_total{by=\"engine\"} 1\n"), "{m}");
        let note = m.lines().find(|l| l.starts_with("# prompts are counted by the engine's /tokenize")).unwrap();
        assert!(note.contains(&path.display().to_string()) && note.contains(why), "{note}");
    }
}
