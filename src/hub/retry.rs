//! Retry policy: which failures are retried and how long to wait. Pure.

use std::time::Duration;

/// Exponential backoff with jitter, capped; a server's `Retry-After`/`RateLimit` wait wins when longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    /// Attempts per range (the counter restarts whenever bytes arrive).
    pub max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_millis(500), cap: Duration::from_secs(30), max_attempts: 8 }
    }
}

impl Backoff {
    /// The wait before attempt `attempt + 1` (`attempt` ≥ 1 failed so far). `jitter` in [0, 1)
    /// adds up to half the exponential delay; `server` is the server's advertised wait.
    #[must_use]
    pub fn delay(&self, attempt: u32, jitter: f64, server: Option<Duration>) -> Duration {
        let exp = self.base.saturating_mul(1u32 << attempt.saturating_sub(1).min(16)).min(self.cap);
        let own = exp + exp.mul_f64(jitter.clamp(0.0, 1.0) / 2.0);
        match server {
            // A little past the advertised instant, never earlier.
            Some(s) => own.max(s + Duration::from_millis(100)).min(self.cap.max(s + Duration::from_secs(1))),
            None => own,
        }
    }
}

/// Statuses worth another try (timeouts, rate limits, server errors).
#[must_use]
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

/// A cheap jitter source in [0, 1) from a counter and the clock (no RNG dependency needed).
#[must_use]
pub fn jitter(seed: u64) -> f64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let mut x = seed ^ u64::from(nanos) ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    #[allow(clippy::cast_precision_loss)]
    let f = (x >> 11) as f64 / (1u64 << 53) as f64;
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps() {
        let b = Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(8), max_attempts: 5 };
        assert_eq!(b.delay(1, 0.0, None), Duration::from_secs(1));
        assert_eq!(b.delay(2, 0.0, None), Duration::from_secs(2));
        assert_eq!(b.delay(3, 0.0, None), Duration::from_secs(4));
        assert_eq!(b.delay(10, 0.0, None), Duration::from_secs(8));
        assert_eq!(b.delay(1, 0.999_999, None).as_millis(), 1499);
    }

    #[test]
    fn server_wait_wins() {
        let b = Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(8), max_attempts: 5 };
        assert!(b.delay(1, 0.0, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
        // A server wait beyond the cap is still honoured.
        assert!(b.delay(1, 0.0, Some(Duration::from_secs(30))) >= Duration::from_secs(30));
        assert!(retryable_status(429) && retryable_status(503) && !retryable_status(404));
        let j = jitter(7);
        assert!((0.0..1.0).contains(&j));
    }
}
