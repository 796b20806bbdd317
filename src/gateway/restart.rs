//! How long a restart is expected to take: the last boot's duration (engine unavailable → ready)
//! less the time already spent in this one, for `Retry-After`. Also the latch set when an
//! engine error shows the engine died before the supervisor has said so. Pure (times passed in).

use std::time::{Duration, Instant};

use super::state::EngineState;

/// Boot timing and the engine-death latch.
#[derive(Debug, Clone, Default)]
pub struct Timing {
    /// When the engine last stopped serving (None while serving).
    down_since: Option<Instant>,
    /// How long the last boot took, unavailable → ready.
    last_boot: Option<Duration>,
    /// When an engine error said the engine died, while the supervisor still said ready.
    died: Option<Instant>,
    /// The last `/health` check of a latched death.
    pub probed: Option<Instant>,
}

impl Timing {
    /// Timing for a gateway that starts in `initial` at `now`.
    #[must_use]
    pub fn new(initial: EngineState, now: Instant) -> Self {
        Self { down_since: (initial == EngineState::Unavailable).then_some(now), ..Self::default() }
    }

    /// The supervisor's state (told on every tick). Ready after unavailable ends a boot; ready
    /// while the latch is set does not (the supervisor has not seen the death yet).
    pub fn observe(&mut self, s: EngineState, now: Instant) {
        match s {
            EngineState::Ready if self.died.is_none() => {
                if let Some(t) = self.down_since.take() {
                    self.last_boot = Some(now.saturating_duration_since(t));
                }
            }
            EngineState::Ready | EngineState::Draining => {}
            EngineState::Unavailable => {
                // The supervisor knows now; the restart runs from the death, if that came first.
                self.died = None;
                self.down_since.get_or_insert(now);
            }
        }
    }

    /// An engine error said the engine died.
    pub fn died(&mut self, now: Instant) {
        if self.died.is_none() {
            self.probed = None;
        }
        self.died.get_or_insert(now);
        self.down_since.get_or_insert(now);
    }

    /// The latched death was not one (the engine's `/health` answers 200): serving again.
    pub fn alive(&mut self) {
        if self.died.take().is_some() {
            self.down_since = None;
        }
    }

    /// Whether an engine error has latched a death the supervisor has not reported.
    #[must_use]
    pub fn dead(&self) -> bool {
        self.died.is_some()
    }

    /// `Retry-After` seconds while unavailable: what remains of the last boot's duration, at
    /// least 1; `default` when no boot has been timed or this one already took longer.
    #[must_use]
    pub fn retry_after(&self, now: Instant, default: u64) -> u64 {
        let (Some(since), Some(boot)) = (self.down_since, self.last_boot) else { return default };
        let left = boot.saturating_sub(now.saturating_duration_since(since));
        if left.is_zero() {
            return default;
        }
        left.as_secs() + u64::from(left.subsec_nanos() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn retry_after_is_the_last_boot_less_the_time_spent() {
        let t0 = Instant::now();
        let mut t = Timing::new(EngineState::Unavailable, t0);
        assert_eq!(t.retry_after(t0 + S(1), 5), 5, "no boot timed yet");
        t.observe(EngineState::Unavailable, t0 + S(10));
        t.observe(EngineState::Ready, t0 + S(30));
        t.observe(EngineState::Ready, t0 + S(40));
        // The engine dies at 100; the supervisor notices at 101.
        t.observe(EngineState::Unavailable, t0 + S(101));
        assert_eq!(t.retry_after(t0 + S(101), 5), 30);
        assert_eq!(t.retry_after(t0 + S(112) + Duration::from_millis(500), 5), 19, "rounded up");
        assert_eq!(t.retry_after(t0 + S(140), 5), 5, "overdue: the default");
        t.observe(EngineState::Ready, t0 + S(125));
        assert_eq!(t.retry_after(t0 + S(126), 5), 5, "serving");
        t.observe(EngineState::Unavailable, t0 + S(200));
        assert_eq!(t.retry_after(t0 + S(200), 5), 24, "the last boot, 101 → 125");
    }

    #[test]
    fn a_latched_death_outlasts_ready_ticks_until_the_supervisor_sees_it() {
        let t0 = Instant::now();
        let mut t = Timing::new(EngineState::Unavailable, t0);
        t.observe(EngineState::Ready, t0 + S(20));
        t.died(t0 + S(50));
        t.observe(EngineState::Ready, t0 + S(50) + Duration::from_millis(300));
        assert!(t.dead(), "a ready tick before the supervisor noticed cleared the latch");
        assert_eq!(t.retry_after(t0 + S(51), 5), 19, "the restart counts from the death");
        t.observe(EngineState::Unavailable, t0 + S(51));
        assert!(!t.dead());
        assert_eq!(t.retry_after(t0 + S(52), 5), 18);
        t.observe(EngineState::Ready, t0 + S(75));
        assert_eq!(t.last_boot, Some(S(25)));
    }

    #[test]
    fn a_false_death_clears_on_health() {
        let t0 = Instant::now();
        let mut t = Timing::new(EngineState::Ready, t0);
        t.died(t0 + S(1));
        t.alive();
        assert!(!t.dead());
        assert_eq!(t.down_since, None);
        assert_eq!(t.last_boot, None);
    }
}
