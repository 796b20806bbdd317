//! The head's probes of its engine's API — `/health`, `/metrics` and the one-token readiness
//! completion (which may take up to 60 s) — on their own thread, off the agent's command loop:
//! a `Stop` is answered at once however long a probe takes. The loop reads the latest result.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::probe::{http_get, one_token, parse_progress};

/// What the probes last saw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Seen {
    /// The last `/health` answered 200.
    pub healthy: bool,
    /// From `/metrics` while healthy: (requests running, generated tokens so far).
    pub progress: Option<(f64, f64)>,
    /// When the first one-token completion succeeded (the engine is ready).
    pub ready_at: Option<Instant>,
}

/// Where and how to probe: the internal address, the served model's name and the API key.
pub struct Target {
    pub host: &'static str,
    pub port: u16,
    pub model: String,
    pub key: Option<String>,
}

/// The probe thread of one engine; dropping it ends the thread after its current probe.
pub struct Prober {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
}

/// Pause between rounds of probes.
const ROUND: Duration = Duration::from_secs(1);

impl Prober {
    /// Start probing `t` every second.
    #[must_use]
    pub fn start(t: Target) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, halt) = (Arc::clone(&seen), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut ready_at = None;
            while !halt.load(Ordering::Relaxed) {
                let healthy = http_get(t.host, t.port, "/health", None).is_some_and(|(c, _)| c == 200);
                let progress = healthy
                    .then(|| http_get(t.host, t.port, "/metrics", t.key.as_deref()))
                    .flatten()
                    .and_then(|(c, body)| (c == 200).then(|| parse_progress(&body)).flatten());
                if healthy && ready_at.is_none() && one_token(t.host, t.port, &t.model, t.key.as_deref()) {
                    ready_at = Some(Instant::now());
                }
                if let Ok(mut g) = s.lock() {
                    *g = Seen { healthy, progress, ready_at };
                }
                let until = Instant::now() + ROUND;
                while Instant::now() < until && !halt.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        Self { seen, stop }
    }

    /// The latest result (never waits for a probe in flight).
    #[must_use]
    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|g| *g).unwrap_or_default()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn target(port: u16) -> Target {
        Target { host: "127.0.0.1", port, model: "m".into(), key: None }
    }

    #[test]
    fn a_probe_that_hangs_never_blocks_the_reader() {
        // An engine that accepts and never answers: every probe waits for its read timeout.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let held = std::thread::spawn(move || l.incoming().take(2).flatten().collect::<Vec<_>>());
        let p = Prober::start(target(port));
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        assert_eq!(p.seen(), Seen::default());
        assert!(t.elapsed() < Duration::from_millis(100), "{:?}", t.elapsed());
        drop(p);
        drop(held);
    }

    #[test]
    fn a_healthy_engine_that_generates_is_ready() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let n = c.read(&mut buf).unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let body = if req.starts_with("GET /metrics") {
                    "vllm:num_requests_running 2\nvllm:generation_tokens_total 40\n"
                } else {
                    "{}"
                };
                let _ = write!(c, "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            }
        });
        let p = Prober::start(target(port));
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.seen().ready_at.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let seen = p.seen();
        assert!(seen.healthy && seen.ready_at.is_some(), "{seen:?}");
        assert_eq!(seen.progress, Some((2.0, 40.0)));
    }
}
