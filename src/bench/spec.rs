//! Speculative decoding, measured rather than assumed (pure): vLLM's spec-decode counters read
//! from its Prometheus `/metrics` before and after a decode wave, and what they say.
//!
//! Counter names as vLLM 0.32–0.34 export them (`vllm/v1/spec_decode/metrics.py`,
//! `SpecDecodingProm`; prometheus_client adds `_total`), one series per engine, summed here:
//! - `vllm:spec_decode_num_drafts_total`: drafts proposed (one per request per step that had one);
//! - `vllm:spec_decode_num_draft_tokens_total`: tokens proposed;
//! - `vllm:spec_decode_num_accepted_tokens_total`: proposed tokens the target model accepted.
//!
//! From their change over a wave:
//! - acceptance rate = accepted / draft tokens;
//! - mean acceptance length = 1 + accepted / drafts (vLLM's definition, bonus token included);
//! - tokens per step = decoded tokens / (decoded tokens − accepted): each step of a request
//!   yields one token of its own plus the drafts it accepted, also when a step had no draft;
//! - ms per step of one stream = 1000 × tokens per step / its tok/s (1000 / tok/s without
//!   speculation).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The three counters' names in the exposition text.
pub const DRAFTS: &str = "vllm:spec_decode_num_drafts_total";
pub const DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens_total";
pub const ACCEPTED: &str = "vllm:spec_decode_num_accepted_tokens_total";

/// The spec-decode counters (or their change over a wave).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpecCounts {
    /// `vllm:spec_decode_num_drafts_total`.
    pub drafts: u64,
    /// `vllm:spec_decode_num_draft_tokens_total`.
    pub draft_tokens: u64,
    /// `vllm:spec_decode_num_accepted_tokens_total`.
    pub accepted_tokens: u64,
}

/// The counters in a `/metrics` text, summed over their label sets; `None` when the text has
/// none of them (the engine does not speculate).
#[must_use]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn read(text: &str) -> Option<SpecCounts> {
    let mut c = SpecCounts::default();
    let mut seen = false;
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let slot = match &line[..name_end] {
            DRAFTS => &mut c.drafts,
            DRAFT_TOKENS => &mut c.draft_tokens,
            ACCEPTED => &mut c.accepted_tokens,
            _ => continue,
        };
        // The value follows the labels (whose values may hold spaces): the last field but an
        // optional timestamp; counters are whole numbers printed as floats (`12.0`).
        let after = line.rfind('}').map_or(&line[name_end..], |i| &line[i + 1..]);
        let Some(v) = after.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if v.is_finite() && v >= 0.0 {
            *slot += v.round() as u64;
            seen = true;
        }
    }
    seen.then_some(c)
}

/// The change from `before` to `after` (a counter that went down, as after an engine restart,
/// gives `None`: the wave's numbers are unknown).
#[must_use]
pub fn delta(before: SpecCounts, after: SpecCounts) -> Option<SpecCounts> {
    Some(SpecCounts {
        drafts: after.drafts.checked_sub(before.drafts)?,
        draft_tokens: after.draft_tokens.checked_sub(before.draft_tokens)?,
        accepted_tokens: after.accepted_tokens.checked_sub(before.accepted_tokens)?,
    })
}

impl SpecCounts {
    /// Sum of counts (waves of one level).
    #[must_use]
    pub fn plus(self, o: Self) -> Self {
        Self {
            drafts: self.drafts + o.drafts,
            draft_tokens: self.draft_tokens + o.draft_tokens,
            accepted_tokens: self.accepted_tokens + o.accepted_tokens,
        }
    }

    /// accepted / draft tokens; `None` without drafts.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.draft_tokens > 0).then(|| self.accepted_tokens as f64 / self.draft_tokens as f64)
    }

    /// 1 + accepted / drafts; `None` without drafts.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn acceptance_length(&self) -> Option<f64> {
        (self.drafts > 0).then(|| 1.0 + self.accepted_tokens as f64 / self.drafts as f64)
    }

    /// Tokens per engine step for `decoded` tokens (Σ completion tokens − 1 over the streams);
    /// `None` when the counts cannot belong to them.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn tokens_per_step(&self, decoded: u64) -> Option<f64> {
        let steps = decoded.checked_sub(self.accepted_tokens).filter(|s| *s > 0)?;
        Some(decoded as f64 / steps as f64)
    }
}

/// Milliseconds per engine step of a stream decoding `tok_s` with `tokens_per_step` tokens a step
/// (1 without speculation).
#[must_use]
pub fn ms_per_step(tok_s: f64, tokens_per_step: f64) -> Option<f64> {
    (tok_s > 0.0).then(|| 1000.0 * tokens_per_step / tok_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_engines_and_missing_ones_mean_no_speculation() {
        let text = "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n\
            # TYPE vllm:spec_decode_num_drafts_total counter\n\
            vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m x\"} 10.0\n\
            vllm:spec_decode_num_drafts_total{engine=\"1\",model_name=\"m x\"} 2.0\n\
            vllm:spec_decode_num_drafts_created{engine=\"0\",model_name=\"m x\"} 1.7e9\n\
            vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m x\"} 36.0 1733300000000\n\
            vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m x\"} 9.0\n\
            vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m x\",position=\"0\"} 7.0\n";
        let c = read(text).unwrap();
        assert_eq!(c, SpecCounts { drafts: 12, draft_tokens: 36, accepted_tokens: 9 });
        assert_eq!(read("vllm:num_requests_running{engine=\"0\"} 0.0\n"), None);
        assert_eq!(read(""), None);
    }

    /// `/metrics` of vLLM 0.32.0 (CPU build, the tiny-cpu venv) serving the tiny Llama with
    /// `--speculative-config '{"method":"ngram","num_speculative_tokens":3,…}'` after two
    /// 32-token completions; 0.34.0's `vllm/v1/spec_decode/metrics.py` exports the same names.
    const RECORDED: &str = include_str!("../../tests/bench/fixtures/vllm-0.32.0-cpu-ngram-metrics.txt");

    #[test]
    fn the_counters_of_a_real_vllm_metrics_page() {
        let c = read(RECORDED).unwrap();
        assert_eq!(c, SpecCounts { drafts: 18, draft_tokens: 50, accepted_tokens: 28 });
        // 2 × 31 tokens decoded with 28 accepted drafts: 34 steps; vLLM's mean acceptance length
        // counts only the steps that had a draft.
        assert_eq!(c.tokens_per_step(62), Some(62.0 / 34.0));
        assert!((c.acceptance_length().unwrap() - (1.0 + 28.0 / 18.0)).abs() < 1e-12);
        assert!((c.acceptance_rate().unwrap() - 0.56).abs() < 1e-12);
        // The same page without the spec-decode series (an engine that does not speculate).
        let off: String = RECORDED.lines().filter(|l| !l.contains("spec_decode")).map(|l| format!("{l}\n")).collect();
        assert!(off.contains("vllm:num_requests_running"), "the page keeps its other series");
        assert_eq!(read(&off), None);
    }

    #[test]
    fn acceptance_and_ms_per_step() {
        let before = SpecCounts { drafts: 5, draft_tokens: 15, accepted_tokens: 4 };
        let after = SpecCounts { drafts: 25, draft_tokens: 75, accepted_tokens: 24 };
        let d = delta(before, after).unwrap();
        assert_eq!(d, SpecCounts { drafts: 20, draft_tokens: 60, accepted_tokens: 20 });
        assert_eq!(d.acceptance_rate(), Some(20.0 / 60.0));
        assert_eq!(d.acceptance_length(), Some(2.0));
        // 60 tokens decoded, 20 of them accepted drafts: 40 steps, 1.5 tokens a step; at 30 tok/s
        // a step takes 50 ms.
        assert_eq!(d.tokens_per_step(60), Some(1.5));
        assert_eq!(ms_per_step(30.0, 1.5), Some(50.0));
        assert_eq!(ms_per_step(25.0, 1.0), Some(40.0));
        assert_eq!(d.tokens_per_step(20), None);
        assert_eq!(delta(after, before), None, "a restart resets the counters");
        assert_eq!(SpecCounts::default().acceptance_rate(), None);
        assert_eq!(d.plus(d).drafts, 40);
    }
}
