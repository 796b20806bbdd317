//! Decode waves grouped by concurrency level (pure). A run holds `decode_repeats` waves per
//! level; the table, `bench compare` and the plot show one line per level, over all its waves.

use super::metrics::{median, summarize, Summary};
use super::plausible::{split, Flag};
use super::result::Wave;
use super::spec::{ms_per_step, SpecCounts};

/// Every wave of one concurrency level, summarized together.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    pub concurrency: u32,
    /// Waves at this level.
    pub waves: usize,
    /// Per-stream decode tok/s over the plausible streams of all the waves.
    pub decode_tok_s: Option<Summary>,
    /// Streams whose rate is impossible ([`super::plausible`]): left out of `decode_tok_s`.
    pub flagged: Vec<Flag>,
    /// Median of the waves' aggregate tok/s (each wave's own definition).
    pub aggregate_tok_s: Option<f64>,
    /// TTFT over the streams of all the waves.
    pub ttft_s: Option<Summary>,
    /// Failed requests over all the waves.
    pub failed: u32,
    /// vLLM's spec-decode counters over all the waves (`None` when a wave has none).
    pub spec: Option<SpecCounts>,
    /// Σ (completion tokens − 1) over the streams of all the waves: the tokens decoded.
    pub decoded_tokens: u64,
}

impl Level {
    /// Tokens per engine step: from the spec-decode counters; 1 when the server's `/metrics`
    /// showed no speculation (`counters == Some(false)`); `None` when unknown.
    #[must_use]
    pub fn tokens_per_step(&self, counters: Option<bool>) -> Option<f64> {
        match (self.spec, counters) {
            (Some(s), _) => s.tokens_per_step(self.decoded_tokens),
            (None, Some(false)) => Some(1.0),
            (None, _) => None,
        }
    }

    /// Milliseconds per engine step of the median stream.
    #[must_use]
    pub fn ms_per_step(&self, counters: Option<bool>) -> Option<f64> {
        ms_per_step(self.decode_tok_s.as_ref()?.median, self.tokens_per_step(counters)?)
    }
}

/// The levels present in `waves`, ascending. With one wave per level, each level's numbers are
/// that wave's own.
#[must_use]
pub fn levels(waves: &[Wave]) -> Vec<Level> {
    let mut cs: Vec<u32> = waves.iter().map(|w| w.concurrency).collect();
    cs.sort_unstable();
    cs.dedup();
    cs.into_iter()
        .map(|c| {
            let ws: Vec<&Wave> = waves.iter().filter(|w| w.concurrency == c).collect();
            let mut rates = Vec::new();
            let mut flagged = Vec::new();
            for w in &ws {
                let (ok, flags) = split(w);
                rates.extend(ok);
                flagged.extend(flags);
            }
            let ttfts: Vec<f64> = ws.iter().flat_map(|w| &w.requests).map(|r| r.ttft_s).collect();
            let aggs: Vec<f64> = ws.iter().filter_map(|w| w.aggregate_tok_s).collect();
            Level {
                concurrency: c,
                waves: ws.len(),
                decode_tok_s: summarize(&rates),
                flagged,
                aggregate_tok_s: median(&aggs),
                ttft_s: summarize(&ttfts),
                failed: ws.iter().map(|w| w.failed).sum(),
                spec: ws.iter().map(|w| w.spec_decode).reduce(|a, b| Some(a?.plus(b?))).flatten(),
                decoded_tokens: ws
                    .iter()
                    .flat_map(|w| &w.requests)
                    .map(|r| r.completion_tokens.saturating_sub(1))
                    .sum(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::result::Request;

    fn req(ttft: f64, rate: Option<f64>) -> Request {
        Request {
            sent_s: 0.0,
            first_s: ttft,
            last_s: 1.0,
            ttft_s: ttft,
            decode_tok_s: rate,
            prompt_tokens: 10,
            completion_tokens: 5,
            cached_tokens: 0,
            text_events: 5,
            finish_reason: None,
        }
    }

    fn wave(c: u32, agg: Option<f64>, reqs: Vec<Request>, failed: u32) -> Wave {
        let rates: Vec<f64> = reqs.iter().filter_map(|r| r.decode_tok_s).collect();
        let ttfts: Vec<f64> = reqs.iter().map(|r| r.ttft_s).collect();
        Wave {
            concurrency: c,
            aggregate_tok_s: agg,
            decode_tok_s: summarize(&rates),
            ttft_s: summarize(&ttfts),
            requests: reqs,
            failed,
            spec_decode: None,
        }
    }

    #[test]
    fn one_wave_per_level_keeps_the_waves_numbers() {
        let ws = vec![
            wave(1, Some(10.0), vec![req(0.1, Some(10.0))], 0),
            wave(2, Some(18.0), vec![req(0.2, Some(9.0)), req(0.3, Some(8.0))], 1),
        ];
        let ls = levels(&ws);
        assert_eq!(ls.len(), 2);
        for (l, w) in ls.iter().zip(&ws) {
            assert_eq!((l.concurrency, l.waves, l.failed), (w.concurrency, 1, w.failed));
            assert_eq!((l.decode_tok_s, l.aggregate_tok_s, l.ttft_s), (w.decode_tok_s, w.aggregate_tok_s, w.ttft_s));
        }
    }

    #[test]
    fn repeated_waves_pool_streams_and_take_the_median_aggregate() {
        let ws = vec![
            wave(2, Some(20.0), vec![req(0.1, Some(10.0)), req(0.1, Some(10.0))], 0),
            wave(2, Some(60.0), vec![req(0.3, Some(30.0)), req(0.5, None)], 1),
            wave(2, Some(40.0), vec![req(0.2, Some(20.0)), req(0.2, Some(20.0))], 0),
            wave(4, None, vec![], 4),
        ];
        let ls = levels(&ws);
        assert_eq!(ls.len(), 2);
        let two = &ls[0];
        assert_eq!((two.concurrency, two.waves, two.failed), (2, 3, 1));
        let d = two.decode_tok_s.unwrap();
        assert_eq!((d.n, d.median, d.min, d.max), (5, 20.0, 10.0, 30.0));
        assert_eq!(two.aggregate_tok_s, Some(40.0));
        let t = two.ttft_s.unwrap();
        assert_eq!((t.n, t.median, t.max), (6, 0.2, 0.5));
        assert_eq!((ls[1].concurrency, ls[1].waves, ls[1].failed), (4, 1, 4));
        assert_eq!((ls[1].decode_tok_s, ls[1].aggregate_tok_s), (None, None));
        assert!(levels(&[]).is_empty());
    }

    #[test]
    fn spec_counters_pool_over_waves_and_give_ms_per_step() {
        let spec = SpecCounts { drafts: 4, draft_tokens: 12, accepted_tokens: 2 };
        let mut a = wave(1, Some(10.0), vec![req(0.1, Some(10.0))], 0);
        let mut b = wave(1, Some(10.0), vec![req(0.1, Some(10.0))], 0);
        a.spec_decode = Some(spec);
        b.spec_decode = Some(spec);
        let l = &levels(&[a.clone(), b])[0];
        assert_eq!((l.spec.unwrap().accepted_tokens, l.decoded_tokens), (4, 8));
        // 8 tokens decoded, 4 accepted: 4 steps, 2 tokens a step; 10 tok/s → 200 ms a step.
        assert_eq!(l.tokens_per_step(Some(true)), Some(2.0));
        assert_eq!(l.ms_per_step(Some(true)), Some(200.0));
        // One wave without counters: the level's are unknown, not half of them.
        let c = wave(1, Some(10.0), vec![req(0.1, Some(10.0))], 0);
        let l = &levels(&[a, c.clone()])[0];
        assert_eq!((l.spec, l.ms_per_step(None)), (None, None));
        // No speculation (metrics answered without counters): one token a step.
        assert_eq!(levels(&[c])[0].ms_per_step(Some(false)), Some(100.0));
    }
}
