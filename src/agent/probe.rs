//! The node's own view of its engine's API: `/health`, `/metrics` and a one-token completion,
//! over a minimal HTTP/1.0 client with short timeouts (no proxy, no TLS: loopback only).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// `HTTP/1.x 200 …` → 200.
#[must_use]
pub fn status_code(status_line: &str) -> Option<u16> {
    let mut parts = status_line.split_whitespace();
    let proto = parts.next()?;
    if !proto.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

/// A small HTTP/1.0 GET with short timeouts: (status, body). Used on the node itself only.
/// The engine's key, when it has one, opens every route but `/health`.
#[must_use]
pub fn http_get(host: &str, port: u16, path: &str, api_key: Option<&str>) -> Option<(u16, String)> {
    let auth = api_key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    http(host, port, &format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n{auth}\r\n"), Duration::from_secs(3))
}

/// One-token completion: the engine really generates (readiness is more than `/health`).
#[must_use]
pub fn one_token(host: &str, port: u16, model: &str, api_key: Option<&str>) -> bool {
    let body = serde_json::json!({"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}).to_string();
    let auth = api_key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let req = format!(
        "POST /v1/completions HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    http(host, port, &req, Duration::from_secs(60)).is_some_and(|(c, _)| c == 200)
}

fn http(host: &str, port: u16, request: &str, read_timeout: Duration) -> Option<(u16, String)> {
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(read_timeout)).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut buf = Vec::new();
    let _ = s.take(4 << 20).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = status_code(text.lines().next()?)?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

/// (requests running, generated tokens so far) from vLLM's Prometheus text, summed over labels.
#[must_use]
pub fn parse_progress(metrics: &str) -> Option<(f64, f64)> {
    let sum = |name: &str| -> Option<f64> {
        let mut found = false;
        let mut total = 0.0;
        for line in metrics.lines().filter(|l| !l.starts_with('#')) {
            let key = line.split(['{', ' ']).next().unwrap_or_default();
            if key == name {
                if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                    total += v;
                    found = true;
                }
            }
        }
        found.then_some(total)
    };
    Some((sum("vllm:num_requests_running")?, sum("vllm:generation_tokens_total")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_progress() {
        let m = "# HELP x\nvllm:num_requests_running{model_name=\"t\"} 2.0\nvllm:generation_tokens_total{model_name=\"t\"} 1234.0\nvllm:generation_tokens_created 5\n";
        assert_eq!(parse_progress(m), Some((2.0, 1234.0)));
        assert_eq!(parse_progress("vllm:num_requests_running 1\n"), None);
    }

    #[test]
    fn status_lines() {
        assert_eq!(status_code("HTTP/1.1 200 OK"), Some(200));
        assert_eq!(status_code("HTTP/1.0 503 Service Unavailable"), Some(503));
        assert_eq!(status_code("garbage"), None);
    }
}
