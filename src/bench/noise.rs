//! How far a prefill number can be trusted (pure, from the result alone, so old result files
//! render the same way):
//! - a sample is **dropped** when its TTFT is not above the calibrated overhead: there is no
//!   prefill time left to divide the prompt by;
//! - a step is **within noise** when its median TTFT exceeds the overhead by no more than the
//!   overhead's own spread (max − min TTFT of the calibration prompts): the time the rate divides
//!   by is jitter, and the rate can be off by 2× or more.

use super::metrics::{median, prefill_rate};
use super::result::{Calibration, PrefillStep};

/// The jitter of the overhead: max − min TTFT of the calibration requests (0 with fewer than two).
#[must_use]
pub fn overhead_spread_s(c: &Calibration) -> f64 {
    let t = c.requests.iter().map(|r| r.ttft_s);
    match (t.clone().reduce(f64::min), t.reduce(f64::max)) {
        (Some(lo), Some(hi)) if c.requests.len() > 1 => hi - lo,
        _ => 0.0,
    }
}

/// The trust of one prefill step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTrust {
    /// Requests that completed.
    pub ran: usize,
    /// Of them, with a prefill rate.
    pub rated: usize,
    /// Of them, dropped (TTFT not above the overhead).
    pub dropped: usize,
    /// Median TTFT − overhead, seconds (None when nothing completed).
    pub margin_s: Option<f64>,
    /// `margin_s` ≤ the overhead's spread.
    pub within_noise: bool,
}

/// Judge one step against the run's calibration.
#[must_use]
pub fn step_trust(step: &PrefillStep, cal: &Calibration) -> StepTrust {
    let ran = step.requests.len();
    let rated = step
        .requests
        .iter()
        .filter(|q| prefill_rate(q.prompt_tokens, q.cached_tokens, q.ttft_s, cal.overhead_s).is_some())
        .count();
    let margin_s = median(&step.requests.iter().map(|q| q.ttft_s).collect::<Vec<_>>()).map(|m| m - cal.overhead_s);
    let within_noise = rated > 0 && margin_s.is_some_and(|m| m <= overhead_spread_s(cal));
    StepTrust { ran, rated, dropped: ran - rated, margin_s, within_noise }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::result::Request;

    pub(crate) fn req(ttft: f64, prompt: u64) -> Request {
        Request {
            sent_s: 0.0,
            first_s: ttft,
            last_s: ttft + 0.01,
            ttft_s: ttft,
            decode_tok_s: Some(700.0),
            prompt_tokens: prompt,
            completion_tokens: 8,
            cached_tokens: 0,
            text_events: 8,
            finish_reason: Some("length".into()),
        }
    }

    fn step(ttfts: &[f64]) -> PrefillStep {
        PrefillStep {
            target_tokens: 128,
            prefill_tok_s: None,
            ttft_s: None,
            requests: ttfts.iter().map(|&t| req(t, 128)).collect(),
            failed: 0,
            skipped: None,
        }
    }

    #[test]
    fn dropped_and_noise() {
        let cal = Calibration { requests: vec![req(0.010, 16), req(0.012, 16), req(0.016, 16)], overhead_s: 0.012 };
        assert!((overhead_spread_s(&cal) - 0.006).abs() < 1e-12);
        // Two of three TTFTs at or below the overhead: dropped; the third 4 ms above: within noise.
        let t = step_trust(&step(&[0.011, 0.012, 0.016]), &cal);
        assert_eq!((t.ran, t.rated, t.dropped, t.within_noise), (3, 1, 2, true));
        // Well clear of the overhead: trusted.
        let t = step_trust(&step(&[0.112, 0.113]), &cal);
        assert_eq!((t.rated, t.dropped, t.within_noise), (2, 0, false));
        // Nothing rated: not "within noise", just dropped.
        let t = step_trust(&step(&[0.005]), &cal);
        assert_eq!((t.rated, t.dropped, t.within_noise), (0, 1, false));
    }
}
