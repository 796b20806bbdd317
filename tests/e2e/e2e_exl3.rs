//! End to end on CPU: the tiny EXL3 model served through the overlay's `exl3` quantization gives
//! the same greedy tokens as its dense twin (the decoded weights) served without quantization.
//!
//! `spark-kit up --kit tiny-cpu --set model.source=tiny-exl3` makes the EXL3 model with
//! `tools/make_tiny_exl3.py` (and the twin beside it, `<dir>-dense`), then serves it; the twin is
//! served with `model.source=local`. Gated like the other e2e tests on SPARK_KIT_TEST_E2E (set by
//! `tests/run-all.sh`, which builds the engine venv).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::up::{e2e_enabled, up_tiny_cpu, Serving};
use common::{free_port, venv_python};
use spark_kit::engine::process::untagged;

/// `up` with `extra` settings on `port` until it serves; its process and engine group.
fn up(extra: &[&str], logs: &Path, port: u16) -> Serving {
    up_tiny_cpu(extra, logs, port, Duration::from_secs(900))
}

/// Greedy completions for 10 prompts: token strings of each (16 tokens, EOS ignored).
const CLIENT: &str = r##"
import json, sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1], api_key="none")
prompts = ["def main(", "import os\n", "class Foo:", "for i in range(", "return self.", "# Copyright",
           "if __name__ ==", "raise ValueError(", "with open(", "print("]
out = []
for p in prompts:
    r = c.completions.create(model="tiny-llama", prompt=p, max_tokens=16, temperature=0, logprobs=1,
                             extra_body={"ignore_eos": True})
    out.append({"prompt": p, "text": r.choices[0].text, "tokens": r.choices[0].logprobs.tokens,
                "logprobs": r.choices[0].logprobs.token_logprobs})
print(json.dumps(out))
"##;

fn greedy(port: u16) -> Vec<serde_json::Value> {
    let out =
        Command::new(venv_python()).args(["-c", CLIENT, &format!("http://127.0.0.1:{port}/v1")]).output().unwrap();
    assert!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The model directory vLLM was started with, from its argument line in the engine log.
fn served_model(log: &str) -> PathBuf {
    let line = log.lines().find(|l| l.contains("non-default args:")).expect("vLLM argument line in the engine log");
    let rest = line.split("'model': '").nth(1).expect("model argument");
    PathBuf::from(rest.split('\'').next().unwrap())
}

/// Per vLLM worker pid (from `(Worker… pid=N)` prefixes): the number of `exl3: … ready on cpu`
/// lines and whether it logged the first EXL3 forward.
fn exl3_activity(log: &str) -> BTreeMap<String, (usize, bool)> {
    let mut per = BTreeMap::new();
    for line in log.lines().map(untagged) {
        let Some(head) = line.strip_prefix('(') else { continue };
        let Some((who, _)) = head.split_once(')') else { continue };
        if !who.starts_with("Worker") && !who.contains("Worker_TP") {
            continue;
        }
        let pid = who.rsplit("pid=").next().unwrap_or_default().to_string();
        let entry = per.entry(pid).or_insert((0, false));
        if line.contains("exl3: ") && line.contains(" ready on cpu ") {
            entry.0 += 1;
        }
        if line.contains("exl3: first cpu forward through") {
            entry.1 = true;
        }
    }
    per
}

#[test]
fn tiny_exl3_serves_the_same_greedy_tokens_as_its_dense_twin() {
    if !e2e_enabled() {
        return;
    }
    let logs = tempfile::tempdir().unwrap();
    let exl3_logs = logs.path().join("exl3");
    let port = free_port();
    let server = up(&["--set", "model.source=tiny-exl3"], &exl3_logs, port);
    let exl3 = greedy(port);
    server.interrupt();
    let log = std::fs::read_to_string(exl3_logs.join("tiny-cpu-local-engine.log")).unwrap();
    let model = served_model(&log);
    assert!(model.file_name().unwrap().to_string_lossy().starts_with("tiny-exl3-"), "{}", model.display());
    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    assert!(config.contains("\"quant_method\": \"exl3\""), "{config}");
    assert!(log.contains("quantization=exl3"), "vLLM did not pick the exl3 method");

    // Every worker decoded all 9 EXL3 layers (2 x qkv, o, gate_up, down + lm_head) and ran them.
    let activity = exl3_activity(&log);
    eprintln!("exl3 activity per worker pid: {activity:?}");
    assert!(!activity.is_empty(), "no vLLM worker lines in the engine log");
    for (pid, (ready, ran)) in &activity {
        assert_eq!(*ready, 9, "worker {pid}: {ready} EXL3 layers ready, want 9");
        assert!(*ran, "worker {pid} never ran an EXL3 forward");
    }

    let twin = model.with_file_name(format!("{}-dense", model.file_name().unwrap().to_string_lossy()));
    let dense_logs = logs.path().join("dense");
    let port = free_port();
    let server =
        up(&["--set", "model.source=local", "--set", &format!("model.path={}", twin.display())], &dense_logs, port);
    let dense = greedy(port);
    server.interrupt();
    let dense_log = std::fs::read_to_string(dense_logs.join("tiny-cpu-local-engine.log")).unwrap();
    assert!(!dense_log.contains("exl3: "), "the dense twin went through the exl3 method");
    assert!(dense_log.contains("quantization=None"), "the dense twin was served quantized");

    assert_eq!(exl3.len(), 10);
    let mut max_dlogp = 0.0f64;
    for (a, b) in exl3.iter().zip(&dense) {
        assert_eq!(a["tokens"], b["tokens"], "greedy tokens differ for {}", a["prompt"]);
        for (x, y) in a["logprobs"].as_array().unwrap().iter().zip(b["logprobs"].as_array().unwrap()) {
            max_dlogp = max_dlogp.max((x.as_f64().unwrap() - y.as_f64().unwrap()).abs());
        }
    }
    eprintln!("10/10 prompts: same 16 greedy tokens; max |logprob(exl3) - logprob(dense twin)| = {max_dlogp:.2e}");
    assert!(max_dlogp < 1e-3, "log-probs differ by {max_dlogp}");
}
