//! The gateway configured from a real kit and its computed plan, in front of the scripted SSE
//! server the bench tests use (tests/fake_sse: raw HTTP/1.1, chunked SSE, its own /tokenize).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_sse;

use fake_sse::{FakeServer, Script, TEMPLATE_TOKENS};
use serde_json::{json, Value};
use spark_kit::gateway::admission::Limits;
use spark_kit::gateway::{serve, ConfigError, EngineState, Gateway, GatewayConfig};
use spark_kit::kit::bytes::GIB;
use spark_kit::kit::schema::Kit;
use spark_kit::plan::{input_from_kit, plan, Plan};
use tokio::net::TcpListener;

fn reference_kit() -> Kit {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/launch-kits/dgx-spark-2x-dsv41-exl3.yaml"))
            .unwrap();
    let mut kit: Kit = serde_yaml::from_str(&text).unwrap();
    // The reference's 2.5 GiB pool at the shapes' 3510 B/token (docs/plan.md), so the plan
    // has a KV pool in tokens.
    kit.engine.kv_cache_bytes.0 = 2_684_354_560;
    kit.engine.kv_bytes_per_token = 3510.0;
    kit
}

/// The reference kit's plan with 99.5 GiB of weights per rank on 121.7 GiB nodes (measured).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
fn reference_plan(kit: &Kit) -> Plan {
    let mut input = input_from_kit(kit, (99.5 * GIB as f64) as u64, "reference-kit.md D: 99.5 GiB", &[]);
    for n in &mut input.nodes {
        n.memory_total = Some((121.7 * GIB as f64) as u64);
    }
    plan(&input)
}

#[test]
fn limits_are_the_plans_numbers() {
    let kit = reference_kit();
    let p = reference_plan(&kit);
    let cfg = GatewayConfig::from_kit(&kit, &p, vec![], 18000).unwrap();
    let safe = p.nodes.iter().map(|n| n.prefill.as_ref().unwrap().safe_max_prompt).min();
    assert_eq!(
        cfg.limits,
        Limits { max_model_len: p.max_model_len, kv_pool_tokens: p.kv.tokens, safe_max_prompt: safe }
    );
    assert!(cfg.limits.kv_pool_tokens.is_some() && safe.is_some(), "{:?}", cfg.limits);
    assert_eq!(cfg.max_in_flight, kit.engine.max_num_seqs as usize);
    assert_eq!(cfg.upstream, "http://127.0.0.1:18000");
    assert_eq!(cfg.bind.port(), kit.engine.port);
}

/// Issue 29 item 2: the head-read (and keep-alive idle) timeout and the queue wait are kit keys.
#[test]
fn the_header_timeout_and_queue_wait_come_from_the_kit() {
    let mut kit = reference_kit();
    let p = reference_plan(&kit);
    let cfg = GatewayConfig::from_kit(&kit, &p, vec![], 18000).unwrap();
    assert_eq!((cfg.header_timeout.as_secs(), cfg.queue_wait.as_secs()), (15, 30));
    kit.engine.header_timeout_s = 4;
    kit.engine.queue_wait_s = 90;
    let cfg = GatewayConfig::from_kit(&kit, &p, vec![], 18000).unwrap();
    assert_eq!((cfg.header_timeout.as_secs(), cfg.queue_wait.as_secs()), (4, 90));
    kit.engine.header_timeout_s = 0;
    let f = spark_kit::kit::validate::validate(&kit);
    assert!(f.iter().any(|f| f.key == "engine.header_timeout_s"), "{f:?}");
}

#[test]
fn an_open_bind_without_keys_is_refused_at_config_load() {
    let mut kit = reference_kit();
    kit.engine.host = "0.0.0.0".into();
    let p = reference_plan(&kit);
    let e = GatewayConfig::from_kit(&kit, &p, vec![], 18000).unwrap_err();
    assert!(matches!(e, ConfigError::OpenBind(_)), "{e}");
    assert!(e
        .to_string()
        .contains("set engine.api_keys.env (or engine.api_keys.file), or set engine.host to 127.0.0.1"));
    assert!(GatewayConfig::from_kit(&kit, &p, vec!["k".into()], 18000).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plans_prefill_budget_admits_and_refuses_through_the_fake_server() {
    let kit = reference_kit();
    let p = reference_plan(&kit);
    let fake = FakeServer::start(Script { max_model_len: 1_000_000, ..Script::default() });
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut cfg = GatewayConfig::from_kit(&kit, &p, vec![], 18000).unwrap();
    cfg.upstream = fake.url.clone();
    cfg.bind = addr;
    cfg.max_body_bytes = 64 << 20;
    // A budget small enough for a test prompt, the rest of the plan as computed.
    cfg.limits.safe_max_prompt = Some(40);
    let gw = Gateway::new(cfg, EngineState::Ready).unwrap();
    tokio::spawn(serve(l, gw.clone(), std::future::pending()));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let chat = |words: usize| {
        json!({"model": "fake-model", "stream": true, "max_tokens": 4, "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": vec!["w"; words].join(" ")}]})
    };
    let url = format!("http://{addr}/v1/chat/completions");
    // 36 words + the template's 5 = 41 tokens > 40.
    let r = client.post(&url).json(&chat(36)).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("prompt is {} tokens", 36 + TEMPLATE_TOKENS)), "{msg}");
    assert!(msg.contains("prefill budget (safe prompt) is 40 tokens"), "{msg}");
    assert!(fake.chat_bodies().is_empty(), "the engine got the refused request");
    let r = client.post(&url).json(&chat(35)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("\"usage\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(fake.chat_bodies().len(), 1);
    let models: Value = client.get(format!("http://{addr}/v1/models")).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "fake-model");
}

/// `spark-kit ARGS` as a user runs it, with a clean environment (no key variables) and HOME in
/// `home`: (exit code, stdout, stderr).
fn spark_kit(home: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spark-kit"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string()
}

/// Nothing was started: no supervisor socket or pid file, no engine or agent log under `logs`.
fn nothing_started(logs: &std::path::Path) {
    let left: Vec<_> = std::fs::read_dir(logs)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "up left {left:?} in the logs directory");
}

#[test]
fn up_refuses_an_unset_key_variable_before_anything_starts() {
    let home = tempfile::tempdir().unwrap();
    let logs = home.path().join("logs");
    let port = free_port();
    let sets =
        ["--set", &format!("paths.logs={}", logs.display()), "--set", "engine.api_keys.env=SPARK_GW_NO_SUCH_KEY"];
    for detach in [false, true] {
        let mut args = vec!["up", "--kit", "tiny-cpu", "--port", &port];
        if detach {
            args.push("--detach");
        }
        args.extend(sets);
        let (code, out, err) = spark_kit(home.path(), &args);
        assert_eq!(code, Some(2), "detach {detach}: a configuration error\n{out}\n{err}");
        let want =
            "error: engine.api_keys.env names the variable SPARK_GW_NO_SUCH_KEY, which is not set: the deployment \
                    would run without API keys; export SPARK_GW_NO_SUCH_KEY=<key> (comma-separated for several), or \
                    remove engine.api_keys.env from the kit\n";
        assert_eq!(err, want, "detach {detach}: one line naming the key, the variable and the fix");
        assert!(!out.contains("gateway on"), "detach {detach}: the gateway started: {out}");
        nothing_started(&logs);
    }
    // The variable set but empty: refused the same way.
    let (code, _, err) = {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spark-kit"))
            .args(["up", "--kit", "tiny-cpu", "--port", &port])
            .args(sets)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("SPARK_GW_NO_SUCH_KEY", "")
            .output()
            .unwrap();
        (out.status.code(), (), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("names the variable SPARK_GW_NO_SUCH_KEY, which is empty"), "{err}");
    nothing_started(&logs);
    // `bench --kit` with the same kit fails closed too, before any request.
    let (code, _, err) = spark_kit(home.path(), &["bench", "--kit", "tiny-cpu", "--port", &port, sets[2], sets[3]]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("error: engine.api_keys.env names the variable SPARK_GW_NO_SUCH_KEY, which is not set"),
        "{err}"
    );
}

#[test]
fn up_refuses_a_non_loopback_bind_without_keys_with_the_fix() {
    let home = tempfile::tempdir().unwrap();
    let logs = home.path().join("logs");
    let port = free_port();
    let logs_set = format!("paths.logs={}", logs.display());
    for detach in [false, true] {
        let mut args =
            vec!["up", "--kit", "tiny-cpu", "--port", &port, "--set", &logs_set, "--set", "engine.host=0.0.0.0"];
        if detach {
            args.push("--detach");
        }
        let (code, out, err) = spark_kit(home.path(), &args);
        assert_eq!(code, Some(2), "detach {detach}\n{out}\n{err}");
        assert_eq!(
            err,
            "error: engine.host 0.0.0.0 is not loopback and engine.api_keys is empty: anyone who can reach the port \
             could use the engine; set engine.api_keys.env (or engine.api_keys.file), or set engine.host to 127.0.0.1\n",
            "detach {detach}"
        );
        assert!(!out.contains("gateway on"), "{out}");
        nothing_started(&logs);
    }
}
