//! Which per-stream decode rates are impossible, and so are flagged and left out of medians and
//! plots (pure, from the result alone, so older result files render the same way).
//!
//! A stream's rate is impossible when
//! - it is **above its wave's aggregate**: the aggregate divides every stream's tokens by the
//!   span of the whole wave, which contains this stream's span, so one stream cannot beat it
//!   while the streams run together; or
//! - its **decode span is below the timer's resolution** ([`RESOLUTION_S`]): the deltas arrived in
//!   one burst (a client or API process starved of CPU), and the span measures the read loop,
//!   not the decode.
//!
//! Both happened on tiny-cpu at 2 streams (a per-stream median of 37,573 tok/s beside an
//! aggregate of 822). The raw samples stay in the result; only summaries skip them.

use super::result::{Request, Wave};

/// Resolution of the arrival stamps, seconds: the client stamps a text delta when its
/// single-threaded runtime reads it, whose timers tick in milliseconds; first and last deltas of a
/// multi-token stream less than this apart came in one read burst.
pub const RESOLUTION_S: f64 = 0.001;

/// Slack on the aggregate bound for rounding (a single stream's rate equals its aggregate).
const SLACK: f64 = 1.01;

/// Why a stream's decode rate was left out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Flag {
    /// Its rate beats the wave's aggregate.
    AboveAggregate { rate: f64, aggregate: f64 },
    /// Its first-to-last span is under [`RESOLUTION_S`].
    BelowResolution { span_s: f64 },
}

impl Flag {
    /// One line for the table: what was seen and why it cannot be a decode rate.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Self::AboveAggregate { rate, aggregate } => {
                format!("{rate:.1} tok/s/stream above the wave's aggregate {aggregate:.1} tok/s")
            }
            Self::BelowResolution { span_s } => format!(
                "first-to-last span {:.3} ms under the timer's {:.0} ms resolution (the deltas came in one burst)",
                span_s * 1e3,
                RESOLUTION_S * 1e3
            ),
        }
    }
}

/// The flag of one stream of a wave whose aggregate is `aggregate`; `None` = plausible (or no rate).
#[must_use]
pub fn judge(req: &Request, aggregate: Option<f64>) -> Option<Flag> {
    let rate = req.decode_tok_s?;
    let span_s = req.last_s - req.first_s;
    if span_s < RESOLUTION_S {
        return Some(Flag::BelowResolution { span_s });
    }
    match aggregate {
        Some(aggregate) if rate > aggregate * SLACK => Some(Flag::AboveAggregate { rate, aggregate }),
        _ => None,
    }
}

/// The plausible per-stream rates of a wave, and the flags of the others.
#[must_use]
pub fn split(w: &Wave) -> (Vec<f64>, Vec<Flag>) {
    split_requests(&w.requests, w.aggregate_tok_s)
}

/// [`split`] on a wave's requests and aggregate (before the wave is built).
#[must_use]
pub fn split_requests(reqs: &[Request], aggregate: Option<f64>) -> (Vec<f64>, Vec<Flag>) {
    let mut ok = Vec::new();
    let mut flags = Vec::new();
    for r in reqs {
        match (judge(r, aggregate), r.decode_tok_s) {
            (Some(f), _) => flags.push(f),
            (None, Some(rate)) => ok.push(rate),
            (None, None) => {}
        }
    }
    (ok, flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream as `bench` recorded it: 16 tokens, first and last delta at these times.
    fn stream(first: f64, last: f64) -> Request {
        Request {
            sent_s: first - 0.05,
            first_s: first,
            last_s: last,
            ttft_s: 0.05,
            decode_tok_s: crate::bench::metrics::decode_rate(16, first, last),
            prompt_tokens: 64,
            completion_tokens: 16,
            cached_tokens: 0,
            text_events: 16,
            finish_reason: Some("length".into()),
        }
    }

    #[test]
    fn the_tiny_cpu_burst_is_flagged_and_left_out() {
        // Issue 29 item 8's wave: two streams, one delivered in a burst of 0.4 ms (37,573 tok/s),
        // the other decoding normally; the wave's aggregate was 822 tok/s.
        let burst = stream(1.0, 1.0 + 15.0 / 37_573.0);
        let normal = stream(0.98, 0.98 + 15.0 / 420.0);
        let (ok, flags) = split_requests(&[burst.clone(), normal], Some(822.0));
        assert_eq!(ok.len(), 1);
        assert!((ok[0] - 420.0).abs() < 1e-6);
        assert!(matches!(flags[..], [Flag::BelowResolution { span_s }] if span_s < 0.0005), "{flags:?}");
        // A burst just over the resolution is still caught by the aggregate bound.
        let fast = stream(1.0, 1.0 + 15.0 / 9_000.0);
        assert!(matches!(judge(&fast, Some(822.0)), Some(Flag::AboveAggregate { .. })));
        assert!(judge(&fast, Some(822.0)).unwrap().describe().contains("above the wave's aggregate 822.0"));
        assert!(judge(&burst, None).unwrap().describe().contains("under the timer's 1 ms resolution"));
    }

    #[test]
    fn a_single_stream_equals_its_aggregate_and_is_kept() {
        let s = stream(0.1, 0.3);
        let agg = crate::bench::metrics::aggregate_rate(&[crate::bench::metrics::StreamTimes {
            sent: s.sent_s,
            first: s.first_s,
            last: s.last_s,
            completion_tokens: 16,
        }]);
        assert_eq!(judge(&s, agg), None);
        // No rate (fewer than two tokens): neither kept nor flagged.
        let one = Request { decode_tok_s: None, ..s };
        assert_eq!(split_requests(&[one], agg), (vec![], vec![]));
    }
}
