//! A scripted OpenAI-compatible server on loopback with known timings and usage, for the bench tests.
//!
//! Real HTTP/1.1 over TCP: `GET /v1/models`, `GET /version`, `POST /tokenize`, and streamed
//! `POST /v1/chat/completions` (chunked SSE, `data: {...}` events, usage chunk, `[DONE]`).
//! One "token" is one whitespace-separated word of the user message, plus `TEMPLATE_TOKENS`.
//! Timeline of a chat request, from the moment its body is read:
//! `ttft_base + prompt_tokens / prefill_rate` → a role-only chunk and the first text chunk (1
//! token) → one text chunk every `interval` carrying `tokens_per_event` tokens until
//! `max_tokens` → finish chunk → usage chunk → `[DONE]`. Events are scheduled at absolute times,
//! so the span first→last text is exactly `ceil((max_tokens − 1) / tokens_per_event) × interval`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Chat template overhead added to every prompt's word count.
pub const TEMPLATE_TOKENS: u64 = 5;

#[derive(Debug, Clone)]
pub struct Script {
    pub model: String,
    pub max_model_len: u64,
    pub ttft_base: Duration,
    /// Prompt tokens per second of "prefill" added to the TTFT.
    pub prefill_rate: f64,
    pub interval: Duration,
    pub tokens_per_event: u64,
    /// Answer 400 when the request has ignore_eos / min_tokens / chat_template_kwargs.
    pub reject_vendor: bool,
    /// Require `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    pub tokenize: bool,
    /// Send the usage chunk when asked for.
    pub usage: bool,
    pub version: Option<String>,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            model: "fake-model".into(),
            max_model_len: 8192,
            ttft_base: Duration::from_millis(100),
            prefill_rate: 20_000.0,
            interval: Duration::from_millis(40),
            tokens_per_event: 3,
            reject_vendor: false,
            api_key: None,
            tokenize: true,
            usage: true,
            version: Some("0.0.0-fake".into()),
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub body: Value,
}

pub struct FakeServer {
    pub url: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeServer {
    pub fn start(script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s2, script) = (seen.clone(), Arc::new(script));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (seen, script) = (s2.clone(), script.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, &script, &seen);
                });
            }
        });
        Self { url, seen }
    }

    pub fn chat_bodies(&self) -> Vec<Value> {
        self.seen.lock().unwrap().iter().filter(|s| s.path == "/v1/chat/completions").map(|s| s.body.clone()).collect()
    }
}

pub fn count_tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64 + TEMPLATE_TOKENS
}

fn user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .map_or_else(String::new, |m| m.iter().filter_map(|x| x["content"].as_str()).collect::<Vec<_>>().join(" "))
}

fn respond(stream: &mut TcpStream, status: &str, body: &Value) -> std::io::Result<()> {
    let text = body.to_string();
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )
}

fn chunk(stream: &mut TcpStream, data: &str) -> std::io::Result<()> {
    let payload = format!("data: {data}\n\n");
    write!(stream, "{:x}\r\n{payload}\r\n", payload.len())?;
    stream.flush()
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn serve(mut stream: TcpStream, script: &Script, seen: &Mutex<Vec<Seen>>) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut length = 0usize;
    let mut authorization = None;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = v.trim().parse().unwrap_or(0),
                "authorization" => authorization = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    let mut raw = vec![0; length];
    reader.read_exact(&mut raw)?;
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let received = Instant::now();
    seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        authorization: authorization.clone(),
        body: body.clone(),
    });

    if let Some(key) = &script.api_key {
        if authorization.as_deref() != Some(&format!("Bearer {key}")) {
            return respond(&mut stream, "401 Unauthorized", &json!({"error": {"message": "Unauthorized"}}));
        }
    }
    match (method.as_str(), path.as_str()) {
        ("GET", "/v1/models") => respond(
            &mut stream,
            "200 OK",
            &json!({"object": "list", "data": [{"id": script.model, "object": "model", "root": "/models/fake",
                     "max_model_len": script.max_model_len}]}),
        ),
        ("GET", "/version") => match &script.version {
            Some(v) => respond(&mut stream, "200 OK", &json!({"version": v})),
            None => respond(&mut stream, "404 Not Found", &json!({"detail": "Not Found"})),
        },
        ("POST", "/tokenize") if script.tokenize => {
            let n = count_tokens(&user_text(&body));
            respond(&mut stream, "200 OK", &json!({"count": n, "max_model_len": script.max_model_len, "tokens": []}))
        }
        ("POST", "/v1/chat/completions") => chat(&mut stream, script, &body, received),
        _ => respond(&mut stream, "404 Not Found", &json!({"detail": "Not Found"})),
    }
}

fn chat(stream: &mut TcpStream, script: &Script, body: &Value, received: Instant) -> std::io::Result<()> {
    if body["model"].as_str() != Some(script.model.as_str()) {
        return respond(
            stream,
            "404 Not Found",
            &json!({"error": {"message": format!("The model `{}` does not exist.", body["model"])}}),
        );
    }
    let vendor = ["ignore_eos", "min_tokens", "chat_template_kwargs"].iter().any(|k| body.get(*k).is_some());
    if script.reject_vendor && vendor {
        return respond(
            stream,
            "400 Bad Request",
            &json!({"error": {"message": "Extra inputs are not permitted: ignore_eos"}}),
        );
    }
    let prompt_tokens = count_tokens(&user_text(body));
    let completion_tokens = body["max_tokens"].as_u64().unwrap_or(16);
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )?;
    let head = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": script.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    #[allow(clippy::cast_precision_loss)]
    let first_at = received + script.ttft_base + Duration::from_secs_f64(prompt_tokens as f64 / script.prefill_rate);
    sleep_until(first_at);
    chunk(stream, &head(json!({"role": "assistant", "content": ""}), Value::Null))?;
    chunk(stream, &head(json!({"content": "w"}), Value::Null))?;
    let mut sent = 1;
    let mut k = 0;
    while sent < completion_tokens {
        k += 1;
        sleep_until(first_at + script.interval * k);
        let n = script.tokens_per_event.min(completion_tokens - sent);
        chunk(stream, &head(json!({"content": " w".repeat(n as usize)}), Value::Null))?;
        sent += n;
    }
    chunk(stream, &head(json!({}), json!("length")))?;
    if script.usage && body["stream_options"]["include_usage"] == json!(true) {
        let usage = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
                           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                     "total_tokens": prompt_tokens + completion_tokens}});
        chunk(stream, &usage.to_string())?;
    }
    chunk(stream, "[DONE]")?;
    write!(stream, "0\r\n\r\n")?;
    stream.flush()
}
