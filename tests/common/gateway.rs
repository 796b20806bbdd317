//! Clients of the gateway for end-to-end tests: raw SSE streams run by
//! tests/e2e_gateway_client.py with the engine venv's python, and one-shot HTTP/1.0 requests.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::venv_python;

/// The python clients (`python CLIENT PHASE BASE_URL KEY ARGS…`).
pub const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e_gateway_client.py");

/// A raw SSE completion stream of `max_tokens` tokens (`ignore_eos`) in the background, with
/// `key`: its stdout lines ("first-token" as soon as text arrives, then the JSON result).
pub fn spawn_stream(base: &str, key: &str, max_tokens: u32, prompt: &str) -> (Child, Receiver<String>) {
    let mut child = Command::new(venv_python())
        .args([CLIENT, "stream", base, key, &max_tokens.to_string(), prompt])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let rx = super::stdout_lines(&mut child);
    (child, rx)
}

/// Wait until the stream prints `want` (panics after `limit`).
pub fn wait_line(rx: &Receiver<String>, want: &str, limit: Duration) {
    let t = Instant::now();
    while t.elapsed() < limit {
        if rx.recv_timeout(Duration::from_millis(200)).is_ok_and(|l| l == want) {
            return;
        }
    }
    panic!("no {want:?} within {limit:?}");
}

/// The stream's JSON result (panics after `limit`): status, text events, tokens by the usage
/// chunk, finish reason, the terminal error event, `done` ([DONE] seen), a transport error.
pub fn result_of(child: &mut Child, rx: &Receiver<String>, limit: Duration) -> Value {
    let t = Instant::now();
    loop {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if line.starts_with('{') {
                let _ = child.wait();
                return serde_json::from_str(&line).unwrap();
            }
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("stream gave no result within {limit:?}");
        }
    }
}

/// POST a one-token completion over plain HTTP/1.0 with `key`: (status, head, body), or None
/// when the connection itself failed (refused: what the gateway must never do while it serves).
pub fn post(port: u16, key: &str) -> Option<(u16, String, String)> {
    let body = r#"{"model":"tiny-llama","prompt":"hi","max_tokens":1}"#;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let req = format!(
        "POST /v1/completions HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    Some((head.split_whitespace().nth(1)?.parse().ok()?, head.to_string(), body.to_string()))
}
