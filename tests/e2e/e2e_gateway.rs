//! End to end through the gateway: `spark-kit up --kit tiny-cpu` (the real binary, vLLM's CPU
//! build behind the gateway on its internal port) and the python `openai` client / raw SSE
//! streams from the engine venv (tests/e2e_gateway_client.py). One deployment, phases in order:
//! the printed `try:` curl, keys from the variable and the file, chat / stream / completion,
//! a prompt over the limit refused before the engine sees it, completion prompts counted in
//! process exactly as vLLM counts them, a client leaving mid-stream (vLLM aborts it), 16 clients
//! streaming for 60 s over 2 slots, `/metrics`, kill -9 of the engine under 16 streams, `down`
//! during a long stream, no key in any log.
//!
//! Needs SPARK_KIT_TEST_E2E=1 and the tiny-cpu engine venv (see tests/e2e/e2e_tiny_cpu.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr, clippy::cast_possible_wrap)]

use crate::common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::gateway::{post, result_of, spawn_stream, wait_line, CLIENT};
use common::up::{e2e_enabled, up_tiny_cpu};
use common::{free_port, group_members, spark_kit, venv_python};
use serde_json::Value;

const KEY_VAR: &str = "SPARK_GW_E2E_KEY";
const ENV_KEY: &str = "gw-key-from-env";
const FILE_KEY: &str = "gw-key-from-file";

/// Run a client phase to its end (at most `limit`): its JSON answer.
fn client(base: &str, args: &[&str], limit: Duration) -> Value {
    let mut child = Command::new(venv_python())
        .arg(CLIENT)
        .arg(args[0])
        .arg(base)
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read while it runs: the load phase's answer is larger than a pipe holds.
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let (out, err) = (read(Box::new(child.stdout.take().unwrap())), read(Box::new(child.stderr.take().unwrap())));
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("client {args:?} hung past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let last = out.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("client {args:?}: {e}: {out}\n{err}"))
}

/// POST a one-token completion: the status, or None when the connection itself failed.
fn post_status(port: u16) -> Option<u16> {
    post(port, ENV_KEY).map(|(status, _, _)| status)
}

/// GET `path` over plain HTTP/1.0 with `key` (if any): (status, body).
fn get(port: u16, path: &str, key: Option<&str>) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n{auth}\r\n").as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), body.to_string())
}

/// POST `body` (JSON) to `path` over plain HTTP/1.0 with `key`: (status, JSON answer).
fn post_json(port: u16, path: &str, key: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// The prompt tokens a refusal message states (`prompt N + max_tokens …`).
fn refused_prompt_tokens(answer: &Value) -> Option<u64> {
    let msg = answer["error"]["message"].as_str()?;
    msg.strip_prefix("prompt ")?.split(' ').next()?.parse().ok()
}

/// The value of the Prometheus sample `series` (name with labels, exactly) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

fn status_json(logs: &Path) -> Value {
    let out = spark_kit()
        .args(["status", "--kit", "tiny-cpu", "--json", "--set", &format!("paths.logs={}", logs.display())])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// Every stream either completed (all its tokens by its usage chunk, no error event, [DONE]) or got 429 with
/// Retry-After, and none hung (past its deadline or silent); returns (completed, refused).
fn check_streams(rs: &[Value], max_tokens: u64) -> (usize, usize) {
    let (mut ok, mut refused) = (0, 0);
    for r in rs {
        assert!(r["hung"].is_null(), "a request hung: {r}");
        match r["status"].as_u64() {
            Some(200) => {
                assert!(r["done"] == true && r["error"].is_null(), "stream did not complete: {r}");
                assert_eq!(r["tokens"].as_u64(), Some(max_tokens), "{r}");
                assert_eq!(r["finish"], "length", "{r}");
                ok += 1;
            }
            Some(429) => {
                assert_eq!(r["body"]["error"]["code"], "queue_full", "{r}");
                assert!(r["retry_after"].is_string(), "429 without Retry-After: {r}");
                refused += 1;
            }
            _ => panic!("stream neither completed nor got 429: {r}"),
        }
    }
    (ok, refused)
}

#[test]
fn the_gateway_fronts_vllm_through_load_restart_and_drain() {
    if !e2e_enabled() {
        return;
    }
    let logs = tempfile::tempdir().unwrap();
    let key_file = logs.path().join("keys");
    std::fs::write(&key_file, format!("{FILE_KEY}\n")).unwrap();
    // The printed curl reads the key from this variable, as a user's shell would.
    std::env::set_var(KEY_VAR, ENV_KEY);
    let (port, internal) = (free_port(), free_port());
    let sets = [
        format!("engine.api_keys.env={KEY_VAR}"),
        format!("engine.api_keys.file={}", key_file.display()),
        format!("engine.internal_port={internal}"),
        "engine.max_num_seqs=2".into(),
        "engine.drain_timeout_s=120".into(),
        // The bursts below judge "completed or 429 queue_full": on a loaded machine a stream queued
        // behind 2 slots can wait past the default 30 s queue wait (then 503 queue_timeout, tested in
        // tests/gateway/gateway_queue.rs), so the wait here is long.
        "engine.queue_wait_s=600".into(),
        "engine.extra_args=[--enable-log-requests]".into(),
    ];
    let mut extra = Vec::new();
    for s in &sets {
        extra.extend(["--set", s.as_str()]);
    }
    let t = Instant::now();
    let mut u = up_tiny_cpu(&extra, logs.path(), port, Duration::from_secs(900));
    let banner = u.banner().to_vec();
    eprintln!("ready through the gateway in {:.1} s", t.elapsed().as_secs_f64());
    let base = format!("http://127.0.0.1:{port}/v1");
    assert!(banner.iter().any(|l| l == &format!("endpoint: {base}")), "{banner:?}");

    // 0. The banner's `try:` curl works as printed (key from the variable, through the gateway).
    let curl = banner.iter().find_map(|l| l.strip_prefix("try:")).expect("a try: line").trim().to_string();
    let out = Command::new("sh").args(["-c", &curl]).output().unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(answer["choices"][0]["message"].is_object(), "the printed curl failed: {curl}\n{answer}");
    // vLLM itself is on loopback on the internal port, keyed with the first key on every route
    // but /health: a local client that is not the gateway (no key, or another key) reads nothing.
    assert!(common::up::http_ok(internal, "/health"));
    for path in ["/metrics", "/version", "/v1/models"] {
        assert_eq!(get(internal, path, None).0, 401, "the engine's {path} without a key");
        assert_eq!(get(internal, path, Some(FILE_KEY)).0, 401, "the engine's {path} with a gateway-only key");
        assert_eq!(get(internal, path, Some(ENV_KEY)).0, 200, "the engine's {path} with its key");
    }
    let tok = serde_json::json!({"model": "tiny-llama", "prompt": "hi"});
    assert_eq!(post_json(internal, "/tokenize", "not-a-key", &tok).0, 401, "the engine's /tokenize without its key");
    assert_eq!(post_json(internal, "/tokenize", ENV_KEY, &tok).0, 200, "the engine's /tokenize with its key");

    // 1. The openai client: chat, stream, completion, with the file's key; a wrong key is 401.
    let r = client(&base, &["basic", FILE_KEY, "not-a-key"], Duration::from_secs(180));
    assert_eq!(r["models"], serde_json::json!(["tiny-llama"]), "{r}");
    assert!(r["chat_stream_chunks"].as_u64().unwrap() > 1, "{r}");
    assert!(r["completion_tokens"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["wrong_key"], 401, "{r}");

    // 2. Over max_model_len (512): 400 from the gateway with the limit and the fix; the
    //    engine never sees it: vLLM logs every request it receives with its sampling params
    //    (`--enable-log-requests`), and the refused request's marker seed is absent while an
    //    admitted request's is there.
    let pid = u64::from(std::process::id());
    let (refused_seed, admitted_seed) = (9_100_000_000 + pid, 9_200_000_000 + pid);
    let r = client(&base, &["over", FILE_KEY, &refused_seed.to_string(), "700"], Duration::from_secs(120));
    assert_eq!(r["status"], 400, "{r}");
    assert_eq!(r["body"]["error"]["code"], "max_model_len", "{r}");
    let msg = r["body"]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("engine.max_model_len is 512 tokens") && msg.contains("shorten the prompt"), "{msg}");
    let r = client(&base, &["over", FILE_KEY, &admitted_seed.to_string(), "5"], Duration::from_secs(120));
    assert_eq!(r["status"], 200, "{r}");
    std::thread::sleep(Duration::from_secs(1));
    let log = std::fs::read_to_string(logs.path().join("tiny-cpu-local-engine.log")).unwrap();
    assert!(log.contains(&format!("seed={admitted_seed}")), "the engine log lacks the admitted request's params");
    assert!(!log.contains(&format!("seed={refused_seed}")), "the refused request reached the engine");

    // 2a. Completion prompts are counted in the gateway with the checkpoint's tokenizer.json,
    //     and the count is vLLM's: for each prompt (and a prompt list, and add_special_tokens
    //     false) an over-limit completion's 400 states the prompt's tokens, which equal the
    //     engine's own /tokenize (forwarded as is by the gateway). None of those refusals sent a
    //     /tokenize to the engine: vLLM's `http_requests_total{handler="/tokenize"}` did not move
    //     (the chat requests above, counted by the engine, moved it), and the gateway's
    //     `spark_gateway_prompt_counts_total{by="engine"}` did not move.
    let counts = |by: &str| {
        let (code, m) = get(port, "/metrics", Some(ENV_KEY));
        assert_eq!(code, 200, "{m}");
        sample(&m, &format!("spark_gateway_prompt_counts_total{{by=\"{by}\"}}")).unwrap_or(-1.0)
    };
    // vLLM's own count of the /tokenize requests it answered (its HTTP series, after the gateway's).
    let tokenize_lines = || {
        let (_, m) = get(port, "/metrics", Some(ENV_KEY));
        m.lines()
            .filter(|l| l.starts_with("http_requests_total{") && l.contains("handler=\"/tokenize\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let prompts = [
        "Hello, world",
        "def main():\n    return 42\n",
        "   three leading spaces",
        " one",
        "héllo wörld → 世界 🎉 naïve café",
        "",
        "<s> a literal BOS in the text",
        "tabs\tand\r\nnewlines\n\n",
    ];
    let (short, long) = ("short one", "a longer prompt, the second of the list, with ünïcode ✓");
    let (_, t) = post_json(port, "/tokenize", ENV_KEY, &serde_json::json!({"model": "tiny-llama", "prompt": long}));
    let long_n = t["count"].as_u64().unwrap();
    let (lines0, tok0, eng0) = (tokenize_lines(), counts("tokenizer"), counts("engine"));
    assert!(lines0 > 0.0, "vLLM's /metrics counts no /tokenize, though the chat requests above used it");
    let mut gateway_counts = Vec::new();
    for p in prompts {
        for special in [true, false] {
            let body = serde_json::json!({"model": "tiny-llama", "prompt": p, "max_tokens": 100_000,
                                          "add_special_tokens": special});
            let (code, answer) = post_json(port, "/v1/completions", ENV_KEY, &body);
            assert_eq!(code, 400, "{p:?}: {answer}");
            gateway_counts.push((p, special, refused_prompt_tokens(&answer).unwrap_or_else(|| panic!("{answer}"))));
        }
    }
    // A list: the longer second prompt is the one over the limit (max_tokens leaves the first room).
    let body = serde_json::json!({"model": "tiny-llama", "prompt": [short, long], "max_tokens": 512 - long_n + 1});
    let (code, answer) = post_json(port, "/v1/completions", ENV_KEY, &body);
    assert_eq!(code, 400, "{answer}");
    assert_eq!(refused_prompt_tokens(&answer), Some(long_n), "the list's second prompt: {answer}");
    assert_eq!(tokenize_lines(), lines0, "an over-limit completion sent /tokenize to the engine");
    #[allow(clippy::cast_precision_loss)]
    let counted = (prompts.len() * 2 + 2) as f64;
    assert_eq!(counts("tokenizer") - tok0, counted, "not every completion prompt was counted in process");
    assert_eq!(counts("engine"), eng0, "a completion prompt was counted by the engine");
    let mut table = Vec::new();
    for (p, special, n) in &gateway_counts {
        let body = serde_json::json!({"model": "tiny-llama", "prompt": p, "add_special_tokens": special});
        let (code, t) = post_json(port, "/tokenize", ENV_KEY, &body);
        assert_eq!(code, 200, "{t}");
        table.push(format!("{p:?}/{special}: {n}"));
        assert_eq!(t["count"].as_u64(), Some(*n), "{p:?} (add_special_tokens {special}): gateway {n}, vLLM {t}");
    }
    eprintln!("prompt tokens, gateway = vLLM /tokenize: {}", table.join(", "));

    // 2b. A client that leaves mid-stream: the gateway drops the engine's request and vLLM
    //     aborts it (its log says so under the request id the client sent), the slot is free.
    let rid = format!("gw-abandon-{pid}");
    let r = client(&base, &["abandon", FILE_KEY, &rid], Duration::from_secs(120));
    assert!(r["status"] == 200 && r["text_events"] == 1, "{r}");
    let t = Instant::now();
    let aborted = loop {
        let log = std::fs::read_to_string(logs.path().join("tiny-cpu-local-engine.log")).unwrap();
        let hit = log.lines().find(|l| l.contains(&rid) && l.contains("aborted")).map(str::to_string);
        if hit.is_some() || t.elapsed() > Duration::from_secs(20) {
            break hit;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let aborted = aborted.expect("vLLM did not abort the request whose client went away (no `Request … aborted.`)");
    eprintln!("client gone mid-stream → engine: {}", aborted.trim());
    let t = Instant::now();
    while status_json(logs.path())["gateway"]["in_flight"] != 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "the abandoned stream still holds its slot");
        std::thread::sleep(Duration::from_millis(200));
    }

    // 3. 16 clients streaming at once for 60 s over 2 slots (queue 8): each client sends one
    //    stream after another until 60 s have passed, and after a 429 waits its Retry-After.
    //    Every request completes or gets 429; none hangs (each has a 120 s deadline, its wait in
    //    the queue included: on a loaded 2-core machine 8 queued 256-token streams behind 2 slots
    //    waited over 60 s); `status` shows the slots full and the queue; afterwards nothing is in
    //    flight or queued.
    const LOAD_TOKENS: u64 = 128;
    let b = base.clone();
    let load = std::thread::spawn(move || {
        client(&b, &["load", FILE_KEY, "16", "60", &LOAD_TOKENS.to_string(), "120"], Duration::from_secs(300))
    });
    let mut seen = (0, 0);
    while !load.is_finished() {
        let g = &status_json(logs.path())["gateway"];
        seen = (seen.0.max(g["in_flight"].as_u64().unwrap_or(0)), seen.1.max(g["queued"].as_u64().unwrap_or(0)));
        std::thread::sleep(Duration::from_millis(500));
    }
    let r = load.join().unwrap();
    let streams = r["streams"].as_array().unwrap();
    let (ok, refused) = check_streams(streams, LOAD_TOKENS);
    let secs = r["seconds"].as_f64().unwrap();
    let longest = streams.iter().filter_map(|s| s["seconds"].as_f64()).fold(0.0, f64::max);
    let clients: std::collections::BTreeSet<u64> = streams.iter().filter_map(|s| s["client"].as_u64()).collect();
    let late = streams.iter().filter_map(|s| s["started"].as_f64()).fold(0.0, f64::max);
    eprintln!(
        "load: 16 clients for {secs:.1} s: {} requests, {ok} completed ({LOAD_TOKENS} tokens each), {refused} got 429; \
         longest request {longest:.1} s; last started at {late:.1} s; status saw {seen:?} (in flight, queued)",
        streams.len()
    );
    assert!(secs >= 60.0, "the load phase lasted {secs} s");
    assert_eq!(clients.len(), 16, "not every client sent: {clients:?}");
    assert!(ok >= 4 && refused >= 1, "{ok} completed, {refused} refused");
    assert_eq!(seen.0, 2, "status never showed both slots in flight");
    assert!(seen.1 >= 1, "status never showed a queued request");
    let t = Instant::now();
    loop {
        let g = status_json(logs.path())["gateway"].clone();
        if g["in_flight"] == 0 && g["queued"] == 0 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "requests left in flight or queued after the load: {g}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let human = spark_kit()
        .args(["status", "--kit", "tiny-cpu", "--set", &format!("paths.logs={}", logs.path().display())])
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains(&format!("gateway 127.0.0.1:{port}  ready  in flight 0  queued 0")), "{human}");

    // 3b. /metrics through the gateway: keyed; the gateway's own series (requests by status,
    //     refused by reason, queue depth, TTFT and inter-token histograms) and then vLLM's.
    assert_eq!(get(port, "/metrics", None).0, 401, "/metrics without a key");
    assert_eq!(get(port, "/health", None).0, 200, "/health is open");
    let (code, m) = get(port, "/metrics", Some(ENV_KEY));
    assert_eq!(code, 200, "{m}");
    let at_least = |series: &str, n: f64| {
        let v = sample(&m, series).unwrap_or_else(|| panic!("no {series} in /metrics"));
        assert!(v >= n, "{series} is {v}, expected at least {n}");
    };
    #[allow(clippy::cast_precision_loss)]
    {
        at_least("spark_gateway_requests_total{status=\"429\"}", refused as f64);
        at_least("spark_gateway_refused_total{reason=\"queue_full\"}", refused as f64);
        at_least("spark_gateway_requests_total{status=\"200\"}", ok as f64);
        at_least("spark_gateway_admitted_total", ok as f64);
        at_least("spark_gateway_ttft_seconds_count", ok as f64);
        at_least("spark_gateway_inter_token_seconds_count", (ok * 100) as f64);
    }
    at_least("spark_gateway_refused_total{reason=\"max_model_len\"}", 1.0);
    at_least("spark_gateway_refused_total{reason=\"unauthorized\"}", 1.0);
    assert_eq!(sample(&m, "spark_gateway_queue_depth"), Some(0.0));
    assert!(m.contains("spark_gateway_ttft_seconds_bucket{le=\"+Inf\"}"), "{m}");
    assert!(m.lines().any(|l| l.starts_with("vllm:")), "vLLM's series not passed through");
    assert!(m.find("spark_gateway_").unwrap() < m.find("\nvllm:").unwrap(), "the gateway's series come first");

    // 4. kill -9 of the engine under load: 16 streams over 2 slots (queue 8). Every in-flight
    //    stream (both slots, each past its first token) ends with the error event and [DONE];
    //    the 8 queued at the kill get 503 and the 6 beyond the queue 429 (all 16 at the gateway
    //    before the kill), each with Retry-After;
    //    new requests get 503 + Retry-After (never a refused connection) until the restart, then 200.
    const KILL_STREAMS: usize = 16;
    let mut load: Vec<_> =
        (0..KILL_STREAMS).map(|i| spawn_stream(&base, FILE_KEY, 480, &format!("# kill {i}\nimport"))).collect();
    let mut streaming = std::collections::BTreeSet::new();
    // The answers of those refused before the kill (429), kept as they come.
    let mut early = std::collections::BTreeMap::new();
    let t = Instant::now();
    loop {
        assert!(t.elapsed() < Duration::from_secs(120), "the kill's load never settled: streaming {streaming:?}");
        for (i, (_, rx)) in load.iter().enumerate() {
            while let Ok(l) = rx.try_recv() {
                if l == "first-token" {
                    streaming.insert(i);
                } else if l.starts_with('{') {
                    early.insert(i, serde_json::from_str::<Value>(&l).unwrap());
                }
            }
        }
        let g = status_json(logs.path())["gateway"].clone();
        // Every request at the gateway: 2 streaming, 8 queued, the other 6 answered 429.
        if streaming.len() == 2 && g["queued"] == 8 && early.len() == KILL_STREAMS - 10 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let before = status_json(logs.path());
    assert_eq!(before["gateway"]["in_flight"], 2, "{before}");
    let pgid = before["nodes"][0]["engine_pgid"].as_i64().unwrap() as i32;
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let t = Instant::now();
    let (mut cut, mut unavailable, mut full) = (0, 0, 0);
    for (i, (child, rx)) in load.iter_mut().enumerate() {
        let r = match early.remove(&i) {
            Some(r) => {
                let _ = child.wait();
                r
            }
            None => result_of(child, rx, Duration::from_secs(60)),
        };
        if streaming.contains(&i) {
            assert_eq!(r["status"], 200, "stream {i} was in flight at the kill: {r}");
            assert_eq!(r["error"]["code"], "upstream_stream_cut", "stream {i} in flight at the kill: {r}");
            assert_eq!(r["done"], true, "stream {i}: no [DONE] after the error event: {r}");
            assert!(r["transport_error"].is_null(), "stream {i}: the socket was cut, not the stream: {r}");
            cut += 1;
        } else {
            assert!(r["retry_after"].is_string(), "stream {i} without Retry-After: {r}");
            match r["status"].as_u64() {
                Some(503) => unavailable += 1,
                Some(429) => full += 1,
                _ => panic!("stream {i} was not in flight at the kill: 503 or 429 expected: {r}"),
            }
        }
    }
    assert_eq!((cut, unavailable, full), (2, 8, 6), "(cut, 503, 429) of the {KILL_STREAMS} streams");
    eprintln!(
        "{KILL_STREAMS} streams at the kill: {cut} in flight ended with the error event, {unavailable} queued got 503, \
         {full} got 429; all answered {:.1} s after the kill",
        t.elapsed().as_secs_f64()
    );
    let mut statuses = Vec::new();
    loop {
        let (s, head, _) = post(port, ENV_KEY).expect("the gateway refused a connection during the restart");
        assert!(s != 503 || head.to_ascii_lowercase().contains("\r\nretry-after: "), "503 without Retry-After: {head}");
        if statuses.last() != Some(&s) {
            statuses.push(s);
        }
        if s == 200 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(600), "not serving again 600 s after the kill: {statuses:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("after the kill: {statuses:?}, serving again after {:.1} s", t.elapsed().as_secs_f64());
    assert!(statuses.contains(&503), "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 503 || *s == 200), "{statuses:?}");
    let s = status_json(logs.path());
    assert_eq!(s["restarts"], 1, "{s}");

    // 5. `down` during a long stream: new requests get 503 (draining), the stream completes,
    //    then everything stops.
    let (mut child, rx) = spawn_stream(&base, FILE_KEY, 490, "# drain\nimport");
    wait_line(&rx, "first-token", Duration::from_secs(120));
    let pgid = status_json(logs.path())["nodes"][0]["engine_pgid"].as_i64().unwrap() as i32;
    let mut down = spark_kit()
        .args(["down", "--kit", "tiny-cpu", "--set", &format!("paths.logs={}", logs.path().display())])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while post_status(port) != Some(503) {
        assert!(t.elapsed() < Duration::from_secs(20), "no 503 while draining");
        std::thread::sleep(Duration::from_millis(50));
    }
    let g = status_json(logs.path())["gateway"].clone();
    assert!(g["state"] == "draining" && g["in_flight"] == 1, "{g}");
    assert!(!group_members(pgid).is_empty(), "the engine stopped before the stream finished");
    let r = result_of(&mut child, &rx, Duration::from_secs(180));
    assert_eq!(r["status"], 200, "{r}");
    assert!(r["done"] == true && r["error"].is_null() && r["finish"] == "length", "the stream was cut by down: {r}");
    assert_eq!(r["tokens"], 490, "{r}");
    let st = down.wait().unwrap();
    assert!(st.success(), "down: {st}");
    let t = Instant::now();
    while !group_members(pgid).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(60), "engine group alive after down");
        std::thread::sleep(Duration::from_millis(200));
    }
    let code = u.child.wait().unwrap();
    assert!(code.success(), "up after down: {code}");

    // 6. Keys are never written: not in the banner, not in any log, snapshot or socket file
    //    (the key file this test wrote is the only place).
    for key in [ENV_KEY, FILE_KEY] {
        assert!(!banner.iter().any(|l| l.contains(key)), "the banner shows a key: {banner:?}");
        let mut dirs = vec![logs.path().to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap().filter_map(Result::ok) {
                let p = e.path();
                let kind = e.file_type().unwrap();
                if kind.is_dir() {
                    dirs.push(p);
                } else if kind.is_file() && p != key_file {
                    let bytes = std::fs::read(&p).unwrap_or_default();
                    let text = String::from_utf8_lossy(&bytes);
                    assert!(!text.contains(key), "{} contains an API key", p.display());
                }
            }
        }
    }
}
