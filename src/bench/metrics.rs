//! The metric definitions, as pure functions (same as the reference kit's, so numbers compare).
//!
//! Times are seconds on one monotonic clock shared by every request of a run.
//! - TTFT = time of the first content or reasoning delta − time the request was sent.
//! - decode tok/s of one stream = (usage.completion_tokens − 1) / (t_last − t_first), where
//!   t_first/t_last are the arrival times of the first/last content or reasoning delta. Token
//!   counts come from the streamed usage block, never from counting events (one event can carry
//!   several tokens under speculative decoding).
//! - aggregate tok/s of a wave = Σ (completion_tokens − 1) / (max t_last − min t_first).
//! - prefill tok/s = (prompt_tokens − cached_tokens) / (TTFT − overhead), where the overhead is
//!   the median TTFT of a few tiny prompts (request handling, scheduling, first decode step).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One finished stream, as the metrics see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamTimes {
    pub sent: f64,
    pub first: f64,
    pub last: f64,
    pub completion_tokens: u64,
}

/// TTFT in seconds.
#[must_use]
pub fn ttft(sent: f64, first: f64) -> f64 {
    first - sent
}

/// Per-stream decode rate; `None` when fewer than two tokens or no time between first and last.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn decode_rate(completion_tokens: u64, first: f64, last: f64) -> Option<f64> {
    let span = last - first;
    (completion_tokens >= 2 && span > 0.0).then(|| (completion_tokens - 1) as f64 / span)
}

/// Aggregate decode rate of streams that ran together; `None` for no streams or no span.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn aggregate_rate(streams: &[StreamTimes]) -> Option<f64> {
    let first = streams.iter().map(|s| s.first).reduce(f64::min)?;
    let last = streams.iter().map(|s| s.last).reduce(f64::max)?;
    let tokens: u64 = streams.iter().map(|s| s.completion_tokens.saturating_sub(1)).sum();
    let span = last - first;
    (tokens > 0 && span > 0.0).then(|| tokens as f64 / span)
}

/// Prefill rate; `None` when the TTFT is not above the calibrated overhead.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn prefill_rate(prompt_tokens: u64, cached_tokens: u64, ttft: f64, overhead: f64) -> Option<f64> {
    let t = ttft - overhead;
    let tokens = prompt_tokens.saturating_sub(cached_tokens);
    (t > 0.0 && tokens > 0).then(|| tokens as f64 / t)
}

/// Median (mean of the middle two for an even count); `None` when empty. NaNs are ignored.
#[must_use]
pub fn median(values: &[f64]) -> Option<f64> {
    percentile(values, 50.0)
}

/// Linear-interpolated percentile `p` (0..=100) of the non-NaN values; `None` when empty.
#[must_use]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = p.clamp(0.0, 100.0) / 100.0 * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(v[lo] + (v[hi] - v[lo]) * (rank - lo as f64))
}

/// Summary statistics of one metric over a set of requests.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Summary {
    /// Number of values.
    #[schemars(range(min = 1))]
    pub n: u64,
    pub mean: f64,
    pub median: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
}

/// Summary of the values, `None` when empty.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    let median = median(&v)?;
    Some(Summary {
        n: v.len() as u64,
        mean: v.iter().sum::<f64>() / v.len() as f64,
        median,
        p90: percentile(&v, 90.0)?,
        min: v.iter().copied().reduce(f64::min)?,
        max: v.iter().copied().reduce(f64::max)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn decode_uses_usage_tokens_minus_one_over_first_to_last() {
        // 31 tokens, first delta at 0.1 s, last at 0.3 s: 30 tokens in 0.2 s.
        assert!(close(decode_rate(31, 0.1, 0.3).unwrap(), 150.0));
        assert_eq!(decode_rate(1, 0.1, 0.3), None);
        assert_eq!(decode_rate(10, 0.3, 0.3), None);
        assert!(close(ttft(1.0, 1.25), 0.25));
    }

    #[test]
    fn aggregate_spans_the_wave() {
        let s = [
            StreamTimes { sent: 0.0, first: 0.1, last: 0.3, completion_tokens: 31 },
            StreamTimes { sent: 0.0, first: 0.2, last: 0.5, completion_tokens: 31 },
        ];
        assert!(close(aggregate_rate(&s).unwrap(), 60.0 / 0.4));
        assert_eq!(aggregate_rate(&[]), None);
    }

    #[test]
    fn prefill_subtracts_overhead_and_cached_tokens() {
        assert!(close(prefill_rate(1000, 0, 0.15, 0.05).unwrap(), 10_000.0));
        assert!(close(prefill_rate(1000, 200, 0.15, 0.05).unwrap(), 8_000.0));
        assert_eq!(prefill_rate(1000, 0, 0.05, 0.05), None);
        assert_eq!(prefill_rate(10, 10, 0.5, 0.05), None);
    }

    #[test]
    fn percentiles() {
        assert_eq!(median(&[]), None);
        assert!(close(median(&[3.0, 1.0, 2.0]).unwrap(), 2.0));
        assert!(close(median(&[4.0, 1.0, 2.0, 3.0]).unwrap(), 2.5));
        assert!(close(percentile(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], 90.0).unwrap(), 10.0));
        assert!(close(median(&[f64::NAN, 5.0]).unwrap(), 5.0));
        let s = summarize(&[1.0, 2.0, 6.0]).unwrap();
        assert_eq!((s.n, s.min, s.max), (3, 1.0, 6.0));
        assert!(close(s.mean, 3.0) && close(s.median, 2.0));
        assert_eq!(summarize(&[]), None);
    }
}
