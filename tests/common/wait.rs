//! Polling a deployment's `status --json` until it reaches a state.

use std::time::{Duration, Instant};

use serde_json::Value;

fn restarts(s: &Value) -> u64 {
    s["restarts"].as_u64().unwrap_or(0)
}

/// Poll `status` every `every` until `done(status)`; the last status and the seconds it took.
/// Panics after `limit`, naming `what` and the last status.
pub fn until(
    status: &dyn Fn() -> Value,
    done: &dyn Fn(&Value) -> bool,
    every: Duration,
    limit: Duration,
    what: &str,
) -> (Value, f64) {
    let t = Instant::now();
    loop {
        let s = status();
        if done(&s) {
            return (s, t.elapsed().as_secs_f64());
        }
        assert!(t.elapsed() < limit, "{what} not reached in {limit:?}; last status: {s}");
        std::thread::sleep(every);
    }
}

/// Until the supervisor counts at least `n` restarts (a death or hang detected).
pub fn restarts_at_least(status: &dyn Fn() -> Value, n: u64, limit: Duration) -> (Value, f64) {
    until(status, &|s| restarts(s) >= n, Duration::from_millis(500), limit, &format!("restarts ≥ {n}"))
}

/// Until the state is `want` with at least `min_restarts` restarts.
pub fn state(status: &dyn Fn() -> Value, want: &str, min_restarts: u64, limit: Duration) -> Value {
    let what = format!("state {want} (restarts ≥ {min_restarts})");
    until(status, &|s| s["state"] == want && restarts(s) >= min_restarts, Duration::from_secs(1), limit, &what).0
}
