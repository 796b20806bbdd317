//! Readiness: `/health` answers 200. Connection refused just means "not listening yet".

use std::time::{Duration, Instant};

/// Outcome of one readiness wait.
#[derive(Debug, Clone, PartialEq)]
pub enum Ready {
    /// `/health` returned 200 after this many seconds.
    Healthy(f64),
    /// The check said stop waiting (e.g. the engine exited).
    Aborted,
    /// No 200 within the limit.
    TimedOut,
}

/// Poll `url` every `every` until it answers 200, `abort()` returns true, or `limit` passes.
pub async fn wait_healthy(url: &str, limit: Duration, every: Duration, mut abort: impl FnMut() -> bool) -> Ready {
    let started = Instant::now();
    let client = match reqwest::Client::builder().timeout(Duration::from_secs(5)).no_proxy().build() {
        Ok(c) => c,
        Err(_) => return Ready::Aborted,
    };
    loop {
        if abort() {
            return Ready::Aborted;
        }
        if let Ok(resp) = client.get(url).send().await {
            if resp.status().as_u16() == 200 {
                return Ready::Healthy(started.elapsed().as_secs_f64());
            }
        }
        if started.elapsed() >= limit {
            return Ready::TimedOut;
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refused_port_times_out_and_abort_stops() {
        // A port nothing listens on: bind then drop to get a free one.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/health");
        let r = wait_healthy(&url, Duration::from_millis(300), Duration::from_millis(50), || false).await;
        assert_eq!(r, Ready::TimedOut);
        let r = wait_healthy(&url, Duration::from_secs(5), Duration::from_millis(50), || true).await;
        assert_eq!(r, Ready::Aborted);
    }
}
