//! Judging one node from its heartbeats: a dead rank (engine gone for three consecutive
//! checks), a hang while booting (no log line from any rank for `hang_timeout_s`), a stall while
//! serving (a failing probe, or requests running with no new tokens, for `stall_timeout_s`).
//! Pure: the clock is passed in.

use std::time::Instant;

use super::state::{Input, State};

/// Is an engine quiet for `quiet_s` seconds hung under a `limit_s` threshold?
#[must_use]
pub fn is_hung(quiet_s: f64, limit_s: u32) -> bool {
    quiet_s >= f64::from(limit_s)
}

/// The two thresholds, in seconds: silence while booting, a stall while serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub boot_s: u32,
    pub stall_s: u32,
}

impl Limits {
    /// One threshold for both.
    #[must_use]
    pub fn same(s: u32) -> Self {
        Self { boot_s: s, stall_s: s }
    }
}

/// What the supervisor remembers about one node between heartbeats.
#[derive(Debug, Clone, Default)]
pub struct Watch {
    /// Consecutive heartbeats with the engine gone.
    pub dead_checks: u32,
    /// When the engine was last reported started (`None`: not running).
    pub started_at: Option<Instant>,
    /// Since when the node shows no progress while serving.
    pub stalled_since: Option<Instant>,
    /// The last token counter reading.
    pub last_tokens: Option<(Instant, f64)>,
    /// The last tokens-per-second rate computed.
    pub last_rate: Option<f64>,
}

/// One heartbeat, as the judge needs it.
#[derive(Debug, Clone, Copy)]
pub struct Beat {
    pub alive: bool,
    /// Seconds since the last log line of any live rank (while booting a headless worker waits
    /// in silence for the head, so the whole job's quiet counts).
    pub quietest_s: f64,
    pub healthy: Option<bool>,
    /// (requests running, generated tokens so far).
    pub progress: Option<(f64, f64)>,
}

impl Watch {
    /// A fresh start of the node's engine: forget the previous run's readings.
    pub fn restart(&mut self) {
        self.dead_checks = 0;
        self.stalled_since = None;
        self.last_tokens = None;
    }

    /// Generated tokens per second since the previous reading (`None` for the first).
    pub fn tokens_per_s(&mut self, progress: Option<(f64, f64)>, now: Instant) -> Option<f64> {
        let (_, tokens) = progress?;
        let prev = self.last_tokens.replace((now, tokens));
        let (t0, k0) = prev?;
        let dt = now.duration_since(t0).as_secs_f64();
        let rate = (dt > 0.0).then(|| ((tokens - k0) / dt).max(0.0));
        if rate.is_some() {
            self.last_rate = rate;
        }
        rate
    }

    /// The state-machine inputs this heartbeat calls for (`name` names the node in them).
    pub fn judge(&mut self, name: &str, state: State, beat: &Beat, limits: Limits, now: Instant) -> Vec<Input> {
        if self.started_at.is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        // Dead rank: gone for three consecutive checks.
        if beat.alive {
            self.dead_checks = 0;
        } else {
            self.dead_checks += 1;
            if self.dead_checks == 3 {
                out.push(Input::RankDead {
                    node: name.into(),
                    why: "engine not running for 3 consecutive checks".into(),
                });
            }
            return out;
        }
        match state {
            // While booting, progress is log output from any rank: a headless worker legitimately
            // waits in silence while the head loads (the reference kit watched the head's log).
            State::Starting if is_hung(beat.quietest_s, limits.boot_s) => {
                out.push(Input::Hung { node: "every rank".into(), quiet_s: beat.quietest_s });
            }
            State::Ready | State::Degraded => {
                if let Some(h) = beat.healthy {
                    out.push(Input::Health(h));
                }
                // Serving: a failing probe, or requests in flight with no new tokens, is a stall.
                let frozen = self.last_rate == Some(0.0);
                let stalled =
                    beat.healthy == Some(false) || beat.progress.is_some_and(|(running, _)| running > 0.0) && frozen;
                if stalled {
                    let since = *self.stalled_since.get_or_insert(now);
                    let secs = now.duration_since(since).as_secs_f64();
                    if is_hung(secs, limits.stall_s) {
                        out.push(Input::Hung { node: name.into(), quiet_s: secs });
                    }
                } else if beat.healthy.is_some() {
                    self.stalled_since = None;
                }
            }
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn beat(alive: bool, quietest_s: f64, healthy: Option<bool>, progress: Option<(f64, f64)>) -> Beat {
        Beat { alive, quietest_s, healthy, progress }
    }

    fn started(t: Instant) -> Watch {
        Watch { started_at: Some(t), ..Watch::default() }
    }

    #[test]
    fn hung_at_the_limit() {
        assert!(is_hung(420.0, 420) && !is_hung(419.9, 420));
    }

    #[test]
    fn a_node_not_started_is_not_judged() {
        let mut w = Watch::default();
        let t = Instant::now();
        for _ in 0..5 {
            assert!(w.judge("b", State::Ready, &beat(false, 0.0, None, None), Limits::same(10), t).is_empty());
        }
    }

    #[test]
    fn dead_after_three_consecutive_checks_once() {
        let t = Instant::now();
        let mut w = started(t);
        let dead = beat(false, 0.0, None, None);
        assert!(w.judge("b", State::Ready, &dead, Limits::same(10), t).is_empty());
        assert!(w.judge("b", State::Ready, &dead, Limits::same(10), t).is_empty());
        let third = w.judge("b", State::Ready, &dead, Limits::same(10), t);
        assert!(matches!(&third[..], [Input::RankDead { node, .. }] if node == "b"), "{third:?}");
        assert!(w.judge("b", State::Ready, &dead, Limits::same(10), t).is_empty(), "reported once");
        // Alive again resets the count.
        w.judge("b", State::Starting, &beat(true, 0.0, None, None), Limits::same(10), t);
        assert_eq!(w.dead_checks, 0);
    }

    #[test]
    fn boot_silence_and_serving_stall_have_their_own_limits() {
        let t = Instant::now();
        let limits = Limits { boot_s: 300, stall_s: 20 };
        let mut w = Watch { started_at: Some(t), ..Watch::default() };
        let quiet = beat(true, 100.0, None, None);
        assert!(w.judge("a", State::Starting, &quiet, limits, t).is_empty(), "100 s of boot silence is under 300");
        let sick = beat(true, 0.0, Some(false), None);
        w.judge("a", State::Ready, &sick, limits, t);
        assert!(!w.judge("a", State::Ready, &sick, limits, t + Duration::from_secs(19)).iter().any(is_hang));
        let later = w.judge("a", State::Ready, &sick, limits, t + Duration::from_secs(20));
        assert!(later.iter().any(is_hang), "{later:?}");
    }

    fn is_hang(i: &Input) -> bool {
        matches!(i, Input::Hung { .. })
    }

    #[test]
    fn booting_hangs_on_the_whole_jobs_silence() {
        let t = Instant::now();
        let mut w = started(t);
        assert!(w.judge("b", State::Starting, &beat(true, 9.9, None, None), Limits::same(10), t).is_empty());
        let hung = w.judge("b", State::Starting, &beat(true, 10.0, None, None), Limits::same(10), t);
        assert!(matches!(&hung[..], [Input::Hung { node, .. }] if node == "every rank"), "{hung:?}");
    }

    #[test]
    fn serving_stalls_on_a_failing_probe_and_recovers() {
        let t = Instant::now();
        let mut w = started(t);
        let sick = beat(true, 0.0, Some(false), None);
        assert_eq!(w.judge("a", State::Ready, &sick, Limits::same(10), t).len(), 1, "health input only");
        let later = w.judge("a", State::Ready, &sick, Limits::same(10), t + Duration::from_secs(11));
        assert!(later.iter().any(|i| matches!(i, Input::Hung { node, .. } if node == "a")), "{later:?}");
        // A healthy probe clears the stall.
        w.judge("a", State::Ready, &beat(true, 0.0, Some(true), None), Limits::same(10), t + Duration::from_secs(12));
        assert!(w.stalled_since.is_none());
    }

    #[test]
    fn requests_running_without_new_tokens_is_a_stall() {
        let t = Instant::now();
        let mut w = started(t);
        assert_eq!(w.tokens_per_s(Some((1.0, 100.0)), t), None);
        assert_eq!(w.tokens_per_s(Some((1.0, 100.0)), t + Duration::from_secs(1)), Some(0.0));
        let b = beat(true, 0.0, Some(true), Some((1.0, 100.0)));
        w.judge("a", State::Ready, &b, Limits::same(5), t);
        let hung = w.judge("a", State::Ready, &b, Limits::same(5), t + Duration::from_secs(6));
        assert!(hung.iter().any(|i| matches!(i, Input::Hung { .. })), "{hung:?}");
        // Tokens moving again: no stall.
        assert_eq!(w.tokens_per_s(Some((1.0, 150.0)), t + Duration::from_secs(2)), Some(50.0));
        let ok = w.judge("a", State::Ready, &b, Limits::same(5), t + Duration::from_secs(7));
        assert!(!ok.iter().any(|i| matches!(i, Input::Hung { .. })), "{ok:?}");
    }

    #[test]
    fn a_counter_going_backwards_is_no_negative_rate() {
        let t = Instant::now();
        let mut w = Watch::default();
        w.tokens_per_s(Some((0.0, 100.0)), t);
        assert_eq!(w.tokens_per_s(Some((0.0, 10.0)), t + Duration::from_secs(1)), Some(0.0));
        assert_eq!(w.tokens_per_s(None, t + Duration::from_secs(2)), None);
    }
}
