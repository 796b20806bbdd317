//! `spark-kit bench` against a scripted SSE server with known timings and usage: the reported
//! TTFT, decode, aggregate and prefill numbers are the scripted ones (tolerance only for
//! scheduling jitter), the JSON validates against docs/bench-result.schema.json, plots open.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::fake_sse;

use std::path::Path;
use std::time::Duration;

use common::spark_kit;
use fake_sse::{FakeServer, Script, TEMPLATE_TOKENS};
use serde_json::Value;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn bench(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = spark_kit();
    cmd.arg("bench").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

pub(crate) fn schema_errors(v: &Value) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/bench-result.schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    validator.iter_errors(v).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

/// Within [want − 2 ms, want + slack]: the client can only see events after the server sends them.
fn assert_time(name: &str, got: f64, want: f64, slack: f64) {
    assert!(got >= want - 0.002 && got <= want + slack, "{name}: got {got:.4} s, want {want:.4} s (+{slack})");
}

fn assert_rel(name: &str, got: f64, want: f64, tol: f64) {
    assert!((got - want).abs() <= want * tol, "{name}: got {got:.2}, want {want:.2} ± {:.0} %", tol * 100.0);
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn reports_the_scripted_ttft_decode_aggregate_and_prefill() {
    let script = Script { prefill_rate: 5000.0, ..Script::default() };
    let (base, rate, interval) = (script.ttft_base.as_secs_f64(), script.prefill_rate, script.interval.as_secs_f64());
    let srv = FakeServer::start(script);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let svg = dir.path().join("r.svg");
    let o = bench(
        &[
            "--url",
            &srv.url,
            "--concurrency",
            "2,1",
            "--decode-tokens",
            "31",
            "--decode-prompt-tokens",
            "64",
            "--prefill",
            "1000,2000",
            "--prefill-repeats",
            "2",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.code, 0, "stderr: {}", o.stderr);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(schema_errors(&r), Vec::<String>::new());
    assert_eq!(r["format"], "spark-kit-bench");
    assert_eq!(r["receipt"]["server_version"], "0.0.0-fake");
    assert_eq!(r["receipt"]["model"]["id"], "fake-model");
    assert_eq!(r["receipt"]["model"]["max_model_len"], 8192);
    assert!(r["receipt"]["kit"].is_null(), "no kit was used");
    assert_eq!(r["settings"]["vendor_params"], true);
    assert_eq!(r["settings"]["tokenize"], true);
    assert_eq!(r["failures"], serde_json::json!([]));
    assert!(r["settings"].get("decode_repeats").is_none(), "one wave per level: the version-1 layout, unchanged");

    // Calibration: 16-token prompts → TTFT = base + 16 / rate; the overhead is their median.
    let overhead = f(&r["calibration"]["overhead_s"]);
    assert_time("overhead", overhead, base + 16.0 / rate, 0.03);

    // Decode: 31 tokens in 11 text events (3 tokens per event after the first), 10 intervals apart.
    let span = 10.0 * interval;
    let waves = r["decode"].as_array().unwrap();
    assert_eq!(waves.iter().map(|w| w["concurrency"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1, 2], "ascending");
    for w in waves {
        for q in w["requests"].as_array().unwrap() {
            assert_eq!(q["prompt_tokens"], 64, "the prompt was fitted with /tokenize");
            assert_eq!(q["completion_tokens"], 31);
            assert_eq!(q["text_events"], 11, "fewer events than tokens: counting events would undercount 2.8x");
            assert_time("decode TTFT", f(&q["ttft_s"]), base + 64.0 / rate, 0.03);
            assert_rel("decode tok/s", f(&q["decode_tok_s"]), 30.0 / span, 0.05);
        }
        let c = f(&w["concurrency"]);
        assert_rel("aggregate tok/s", f(&w["aggregate_tok_s"]), c * 30.0 / span, 0.06);
        assert_rel("median tok/s", f(&w["decode_tok_s"]["median"]), 30.0 / span, 0.05);
    }

    // Prefill: (prompt tokens) / (TTFT − overhead) = rate · P / (P − 16).
    let steps = r["prefill"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    for s in steps {
        let p = f(&s["target_tokens"]);
        let reqs = s["requests"].as_array().unwrap();
        assert_eq!(reqs.len(), 2);
        for q in reqs {
            assert_eq!(f(&q["prompt_tokens"]), p);
            assert_time("prefill TTFT", f(&q["ttft_s"]), base + p / rate, 0.03);
        }
        assert_rel("prefill tok/s", f(&s["prefill_tok_s"]["median"]), rate * p / (p - 16.0), 0.05);
    }

    // Every chat request asked for streamed usage, fixed lengths and no thinking, each with its own salt.
    let bodies = srv.chat_bodies();
    assert_eq!(bodies.len(), 1 + 3 + 1 + 2 + 4, "warmup, calibration, waves, prefill");
    let mut salts: Vec<String> = bodies
        .iter()
        .map(|b| b["messages"][0]["content"].as_str().unwrap().split_whitespace().next().unwrap().to_string())
        .collect();
    salts.sort();
    salts.dedup();
    assert_eq!(salts.len(), bodies.len(), "every prompt starts with a fresh UUID");
    for b in &bodies {
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["min_tokens"], b["max_tokens"]);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["chat_template_kwargs"]["enable_thinking"], false);
    }
    assert_eq!(TEMPLATE_TOKENS, 5);

    // The table and the plot.
    assert!(o.stdout.contains("DECODE") && o.stdout.contains("PREFILL"), "{}", o.stdout);
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert_eq!(doc.root_element().attribute("width"), Some("1200"));
    let texts: String = doc.descendants().filter_map(|n| n.text()).collect();
    assert!(texts.contains("Decode") && texts.contains("Prefill"), "{texts}");
}

#[test]
fn decode_repeats_run_waves_back_to_back_and_the_table_pools_them() {
    let script = Script::default();
    let span = 10.0 * script.interval.as_secs_f64(); // 31 tokens, 3 per event after the first
    let srv = FakeServer::start(script);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = bench(
        &[
            "--url",
            &srv.url,
            "--concurrency",
            "2,1",
            "--decode-repeats",
            "3",
            "--decode-tokens",
            "31",
            "--decode-prompt-tokens",
            "64",
            "--prefill",
            "none",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.code, 0, "stderr: {}", o.stderr);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(schema_errors(&r), Vec::<String>::new());
    assert_eq!(r["settings"]["decode_repeats"], 3);
    let waves = r["decode"].as_array().unwrap();
    let levels: Vec<u64> = waves.iter().map(|w| w["concurrency"].as_u64().unwrap()).collect();
    assert_eq!(levels, vec![1, 1, 1, 2, 2, 2], "ascending levels, three waves each, in run order");
    for w in waves {
        assert_eq!(w["requests"].as_array().unwrap().len() as u64, w["concurrency"].as_u64().unwrap());
        for q in w["requests"].as_array().unwrap() {
            assert_rel("decode tok/s", f(&q["decode_tok_s"]), 30.0 / span, 0.05);
        }
        assert_rel("aggregate tok/s", f(&w["aggregate_tok_s"]), f(&w["concurrency"]) * 30.0 / span, 0.06);
    }
    // One wave after the other: a wave is sent only when the previous one has finished.
    for pair in waves.windows(2) {
        let last = pair[0]["requests"].as_array().unwrap().iter().map(|q| f(&q["last_s"])).fold(0.0, f64::max);
        let sent = pair[1]["requests"].as_array().unwrap().iter().map(|q| f(&q["sent_s"])).fold(f64::MAX, f64::min);
        assert!(sent >= last, "a wave started at {sent:.3} s before the previous one ended at {last:.3} s");
    }
    // Every prompt of a level is fitted with /tokenize before its first wave, so no /tokenize
    // call falls between the waves of a level.
    let seen = srv.seen.lock().unwrap().clone();
    let salt = |b: &Value| b["messages"][0]["content"].as_str().unwrap().split_whitespace().next().unwrap().to_string();
    let decode: Vec<usize> = (0..seen.len())
        .filter(|&i| seen[i].path == "/v1/chat/completions" && seen[i].body["max_tokens"] == 31)
        .collect();
    assert_eq!(decode.len(), 9, "3 waves of 1, then 3 waves of 2");
    for (c, level) in [(1, &decode[..3]), (2, &decode[3..])] {
        let salts: Vec<String> = level.iter().map(|&i| salt(&seen[i].body)).collect();
        let last_tokenize = (0..seen.len())
            .filter(|&i| seen[i].path == "/tokenize" && salts.contains(&salt(&seen[i].body)))
            .max()
            .unwrap();
        assert!(last_tokenize < level[0], "level {c}: a /tokenize call came after its first wave started");
    }
    drop(seen);
    // The table pools each level's waves into one line.
    assert!(o.stdout.contains("3 waves per level"), "{}", o.stdout);
    let rows: Vec<&str> =
        o.stdout.lines().skip_while(|l| !l.starts_with("DECODE")).skip(4).take_while(|l| !l.is_empty()).collect();
    assert_eq!(rows.len(), 2, "one row per level: {rows:?}");
    assert!(rows[1].trim_start().starts_with('2'), "{rows:?}");

    let o = bench(&["--url", &srv.url, "--decode-repeats", "0", "--prefill", "none"], &[]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("--decode-repeats 0: out of range") && o.stderr.contains("hint:"), "{}", o.stderr);
}

#[test]
fn plot_png_has_the_declared_size_and_compare_prints_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, interval) in [40u64, 80].into_iter().enumerate() {
        let srv = FakeServer::start(Script { interval: Duration::from_millis(interval), ..Script::default() });
        let json = dir.path().join(format!("{i}.json"));
        let png = dir.path().join(format!("{i}.png"));
        let o = bench(
            &[
                "--url",
                &srv.url,
                "--model",
                "fake-model",
                "--concurrency",
                "1",
                "--decode-tokens",
                "16",
                "--decode-prompt-tokens",
                "32",
                "--prefill",
                "256",
                "--prefill-repeats",
                "1",
                "--json",
                json.to_str().unwrap(),
                "--plot",
                png.to_str().unwrap(),
                "--quiet",
            ],
            &[],
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        assert!(!o.stderr.contains("==> decode"), "--quiet: {}", o.stderr);
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&bytes[12..16], b"IHDR");
        let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
        assert_eq!((w, h), (1200, 500));
        files.push(json);
    }
    let o = spark_kit().args(["bench", "compare"]).args(&files).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // B decodes at half the speed of A (80 ms vs 40 ms between events).
    let line = out.lines().find(|l| l.starts_with("decode x1 per stream")).unwrap();
    let ratio: f64 = line.split_whitespace().last().unwrap().parse().unwrap();
    assert_rel("B/A decode", ratio, 0.5, 0.06);
    let o = spark_kit().args(["bench", "compare", "--json"]).args(&files).output().unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["rows"].as_array().unwrap().iter().any(|r| r["metric"] == "prefill 256"));

    // Not a result: a usage error naming the file.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"format\": \"other\"}").unwrap();
    let o = spark_kit().args(["bench", "compare"]).arg(&files[0]).arg(&bad).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.json: not a spark-kit bench result") && err.contains("hint:"), "{err}");
}

#[test]
fn vendor_parameters_rejected_with_400_are_dropped_and_recorded() {
    let srv = FakeServer::start(Script { reject_vendor: true, ..Script::default() });
    let o = bench(
        &["--url", &srv.url, "--concurrency", "1", "--decode-tokens", "8", "--prefill", "none", "--json", "-"],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("HTTP 400") && o.stderr.contains("retrying without"), "{}", o.stderr);
    let r: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(r["settings"]["vendor_params"], false);
    assert_eq!(r["decode"][0]["requests"][0]["completion_tokens"], 8);
    let bodies = srv.chat_bodies();
    assert!(bodies[0].get("ignore_eos").is_some() && bodies[1].get("ignore_eos").is_none());
    assert!(bodies[1..].iter().all(|b| b.get("min_tokens").is_none()));
}

#[test]
fn api_key_is_sent_as_bearer_and_never_printed() {
    let key = "sk-test-0123456789";
    let srv = FakeServer::start(Script { api_key: Some(key.into()), ..Script::default() });
    let args = ["--url", srv.url.as_str(), "--concurrency", "1", "--decode-tokens", "4", "--prefill", "none"];
    let o = bench(&args, &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("needs an API key") && o.stderr.contains("--api-key-env"), "{}", o.stderr);

    let o = bench(&[&args[..], &["--api-key-env", "BENCH_KEY", "--json", "-"]].concat(), &[("BENCH_KEY", key)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stdout.contains(key) && !o.stderr.contains(key), "the key leaked");
    let seen = srv.seen.lock().unwrap();
    assert!(seen
        .iter()
        .filter(|s| s.path == "/v1/chat/completions")
        .all(|s| s.authorization.as_deref() == Some(&*format!("Bearer {key}"))));
    drop(seen);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, format!("\n{key}\n")).unwrap();
    let o = bench(&[&args[..], &["--api-key-file", file.to_str().unwrap()]].concat(), &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stdout.contains(key) && !o.stderr.contains(key));

    let o = bench(&[&args[..], &["--api-key-env", "BENCH_KEY_UNSET"]].concat(), &[]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("--api-key-env BENCH_KEY_UNSET: the variable is not set"), "{}", o.stderr);
}

#[test]
fn wrong_url_model_and_missing_usage_fail_with_the_fix() {
    let port = common::free_port();
    let o = bench(&["--url", &format!("http://127.0.0.1:{port}"), "--prefill", "none"], &[]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains(&format!("error: cannot reach http://127.0.0.1:{port}/v1/models")), "{}", o.stderr);
    assert!(o.stderr.contains("hint: is the server up?"), "{}", o.stderr);

    let srv = FakeServer::start(Script::default());
    let o = bench(&["--url", &srv.url, "--model", "nope", "--prefill", "none"], &[]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("model `nope` is not served") && o.stderr.contains("it serves: fake-model"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("hint: pass --model"), "{}", o.stderr);

    let srv = FakeServer::start(Script { usage: false, ..Script::default() });
    let o = bench(&["--url", &srv.url, "--prefill", "none"], &[]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("no usage block"), "{}", o.stderr);
}

#[test]
fn bad_flags_are_usage_errors_before_any_request() {
    let srv = FakeServer::start(Script::default());
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/r.json");
    for (args, want) in [
        (vec!["--concurrency", "0"], "--concurrency 0: 0 streams is out of range"),
        (vec!["--prefill", "8q"], "--prefill 8q: `8q` is not a token count"),
        (vec!["--plot", "x.gif"], "--plot x.gif: the file name must end in .svg or .png"),
        (vec!["--json", missing.to_str().unwrap()], "does not exist"),
        (vec!["--timeout", "0"], "--timeout 0: must be a positive number"),
        (vec!["--decode-tokens", "9000"], "exceed the model's max_model_len 8192"),
        (vec!["--url", "localhost:8000"], "--url `localhost:8000`: expected http://HOST:PORT"),
    ] {
        let mut a = args.clone();
        if args[0] != "--url" {
            a.extend(["--url", srv.url.as_str()]);
        }
        let o = bench(&a, &[]);
        assert_eq!(o.code, 2, "{a:?}: {}", o.stderr);
        assert!(o.stderr.contains(want) && o.stderr.contains("hint:"), "{a:?}: {}", o.stderr);
    }
    assert!(srv.chat_bodies().is_empty(), "no chat request for bad input");
}

#[test]
fn kit_supplies_url_model_and_receipt_hash() {
    let srv = FakeServer::start(Script::default());
    let port = srv.url.rsplit(':').next().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let o = bench(
        &[
            "--kit",
            "tiny-cpu",
            "--port",
            &port,
            "--served-model-name",
            "fake-model",
            "--concurrency",
            "1",
            "--decode-tokens",
            "4",
            "--prefill",
            "none",
            "--json",
            "-",
            "--quiet",
        ],
        &[("SPARK_KIT_CACHE", dir.path().to_str().unwrap())],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let r: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(r["receipt"]["endpoint"], srv.url.as_str());
    assert_eq!(r["receipt"]["kit"]["name"], "tiny-cpu");
    assert_eq!(r["receipt"]["kit"]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(schema_errors(&r), Vec::<String>::new());
}

#[test]
fn plot_and_progress_say_n_what_each_rate_divides_and_where_it_ran() {
    // Issue 21 item 10: the plot title names kit, host and versions; every point says its n;
    // the prefill progress line prints no decode rate.
    let srv = FakeServer::start(Script::default());
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("r.svg");
    let json = dir.path().join("r.json");
    let o = bench(
        &[
            "--url",
            &srv.url,
            "--concurrency",
            "1",
            "--decode-tokens",
            "16",
            "--decode-prompt-tokens",
            "32",
            "--prefill",
            "500,1000",
            "--prefill-repeats",
            "2",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.code, 0, "stderr: {}", o.stderr);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let host = r["receipt"]["host"]["hostname"].as_str().unwrap_or("unknown").to_string();
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    let all = texts.join("\n");
    let title = texts.iter().find(|t| t.contains("fake-model · kit ")).unwrap_or_else(|| panic!("{all}"));
    assert!(title.contains("kit none (--url)"), "{title}");
    assert!(title.contains(&format!("host {host}")), "{title}");
    assert!(title.contains(&format!("spark-kit {}", env!("CARGO_PKG_VERSION"))), "{title}");
    assert!(title.contains("server vLLM 0.0.0-fake"), "{title}");
    assert!(all.contains("n=1"), "decode point without its n: {all}");
    assert!(all.contains("n=2/2"), "prefill point without its n: {all}");
    assert!(all.contains("(prompt − cached) / (TTFT − overhead)"), "{all}");
    assert!(all.contains("(completion tokens − 1) / (last − first token)"), "{all}");
    // Progress: decode lines say which rate; prefill lines carry none.
    let lines: Vec<&str> = o.stderr.lines().filter(|l| l.trim_start().starts_with("prefill ")).collect();
    assert!(!lines.is_empty(), "{}", o.stderr);
    assert!(lines.iter().all(|l| !l.contains("tok/s")), "{lines:#?}");
    assert!(
        o.stderr.lines().any(|l| l.contains("decode c=1:") && l.contains("decode ") && l.contains("tok/s/stream")),
        "{}",
        o.stderr
    );
    // The table shows n for both phases.
    assert!(o.stdout.contains(" 2/2 "), "{}", o.stdout);
}
