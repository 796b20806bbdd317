//! The terminal table of one result (pure: result in, text out).

use std::fmt::Write as _;

use super::levels::levels;
use super::noise::{overhead_spread_s, step_trust};
use super::result::BenchResult;
use super::sizes::length_label;
use super::spec::SpecCounts;

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.digits$}"))
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{:.0}", x * 1000.0))
}

/// What the `ms/step` and `accept` columns come from.
fn spec_line(counters: Option<bool>) -> &'static str {
    match counters {
        Some(true) => {
            "speculation on (vLLM's spec-decode counters over each level's waves): accept = mean acceptance length \
             (1 + accepted/drafts) and rate (accepted/draft tokens); ms/step = 1000 × tokens per step / tok/s/stream"
        }
        Some(false) => {
            "speculation off (the server's /metrics has no spec-decode counters): ms/step = 1000 / tok/s/stream"
        }
        None => "speculation unknown (the server's /metrics did not answer): no ms/step, no acceptance",
    }
}

/// The acceptance cell: `1.33 (11%)`, `off` without speculation, `-` when unknown.
fn accept(spec: Option<SpecCounts>, counters: Option<bool>) -> String {
    match (spec, counters) {
        (Some(c), _) => match (c.acceptance_length(), c.acceptance_rate()) {
            (Some(len), Some(rate)) => format!("{len:.2} ({:.0}%)", rate * 100.0),
            _ => "no drafts".into(),
        },
        (None, Some(false)) => "off".into(),
        (None, _) => "-".into(),
    }
}

/// Render the result as a human-readable table.
#[must_use]
pub fn render(r: &BenchResult) -> String {
    if let Some(a) = &r.audit {
        return super::audit::text::render(r, a);
    }
    let mut s = String::new();
    let rc = &r.receipt;
    let _ = writeln!(
        s,
        "endpoint {}/v1  model {}  server {}  spark-kit {}",
        rc.endpoint,
        rc.model.id,
        rc.server_version.as_deref().map_or_else(|| "unknown".to_string(), |v| format!("vLLM {v}")),
        rc.spark_kit_version
    );
    let st = &r.settings;
    let _ = writeln!(
        s,
        "temperature {}  thinking {}  fixed lengths {}  prompt lengths {}",
        st.temperature,
        if st.thinking { "on" } else { "off" },
        if st.vendor_params { "yes (ignore_eos + min_tokens)" } else { "no (server rejected them)" },
        if st.tokenize { "checked with /tokenize" } else { "estimated" },
    );
    let lens: Vec<u64> = r.calibration.requests.iter().map(|q| q.prompt_tokens).collect();
    let (lo, hi) = (lens.iter().min().copied().unwrap_or(0), lens.iter().max().copied().unwrap_or(0));
    let _ = writeln!(
        s,
        "overhead {} ms (median TTFT of {} tiny prompts, {} tokens)",
        ms(Some(r.calibration.overhead_s)),
        lens.len(),
        if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }
    );
    if !r.decode.is_empty() {
        let waves = if st.decode_repeats > 1 {
            format!(", {} waves per level (all their streams)", st.decode_repeats)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "\nDECODE  {} tokens per stream, prompt {} tokens{waves}",
            st.decode_tokens, st.decode_prompt_tokens
        );
        let _ = writeln!(
            s,
            "tok/s/stream = (completion tokens − 1) / (last − first token) of one stream; aggregate tok/s = \
             Σ (completion tokens − 1) / (last token − first token of the wave); n = streams measured"
        );
        let _ = writeln!(s, "{}", spec_line(st.spec_decode_counters));
        let _ = writeln!(
            s,
            "{:>7}  {:>4}  {:>14}  {:>10}  {:>10}  {:>16}  {:>8}  {:>12}  {:>11}  {:>8}  {:>6}",
            "streams",
            "n",
            "tok/s/stream",
            "min",
            "max",
            "aggregate tok/s",
            "ms/step",
            "accept",
            "TTFT ms",
            "p90 ms",
            "failed"
        );
        for w in &levels(&r.decode) {
            let d = w.decode_tok_s.as_ref();
            let t = w.ttft_s.as_ref();
            let _ = writeln!(
                s,
                "{:>7}  {:>4}  {:>14}  {:>10}  {:>10}  {:>16}  {:>8}  {:>12}  {:>11}  {:>8}  {:>6}",
                w.concurrency,
                d.map_or(0, |x| x.n),
                opt(d.map(|x| x.median), 1),
                opt(d.map(|x| x.min), 1),
                opt(d.map(|x| x.max), 1),
                opt(w.aggregate_tok_s, 1),
                opt(w.ms_per_step(st.spec_decode_counters), 1),
                accept(w.spec, st.spec_decode_counters),
                ms(t.map(|x| x.median)),
                ms(t.map(|x| x.p90)),
                w.failed
            );
        }
        for w in levels(&r.decode).iter().filter(|w| !w.flagged.is_empty()) {
            let streams: usize =
                r.decode.iter().filter(|x| x.concurrency == w.concurrency).map(|x| x.requests.len()).sum();
            let _ = writeln!(
                s,
                "  decode x{}: {} of {streams} stream rate(s) impossible, left out of n, median, min, max and the plot \
                 (first: {})",
                w.concurrency,
                w.flagged.len(),
                w.flagged[0].describe()
            );
        }
    }
    if !r.prefill.is_empty() {
        let _ = writeln!(
            s,
            "\nPREFILL  {} request(s) per length, {} output tokens",
            st.prefill_repeats, st.prefill_max_tokens
        );
        let _ = writeln!(
            s,
            "prefill tok/s = (prompt − cached tokens) / (TTFT − {} ms overhead); n = requests with a rate / requests run",
            ms(Some(r.calibration.overhead_s))
        );
        let _ = writeln!(
            s,
            "{:>7}  {:>13}  {:>5}  {:>10}  {:>14}  {:>10}  {:>6}",
            "length", "prompt tokens", "n", "TTFT s", "prefill tok/s", "min", "failed"
        );
        let mut notes = Vec::new();
        let spread = overhead_spread_s(&r.calibration);
        for p in &r.prefill {
            let label = length_label(p.target_tokens);
            if let Some(why) = &p.skipped {
                let _ = writeln!(s, "{label:>7}  skipped: {why}");
                continue;
            }
            let trust = step_trust(p, &r.calibration);
            let prompt = p.requests.first().map_or_else(|| "-".to_string(), |q| q.prompt_tokens.to_string());
            let mark = if trust.within_noise { " ~" } else { "" };
            let _ = writeln!(
                s,
                "{label:>7}  {prompt:>13}  {:>5}  {:>10}  {:>14}  {:>10}  {:>6}",
                format!("{}/{}", trust.rated, trust.ran),
                opt(p.ttft_s.as_ref().map(|x| x.median), 3),
                format!("{}{mark}", opt(p.prefill_tok_s.as_ref().map(|x| x.median), 1)),
                opt(p.prefill_tok_s.as_ref().map(|x| x.min), 1),
                p.failed
            );
            if trust.dropped > 0 {
                notes.push(format!(
                    "prefill {label}: {} of {} sample(s) dropped: TTFT not above the {} ms overhead (no prefill time left to divide by)",
                    trust.dropped,
                    trust.ran,
                    ms(Some(r.calibration.overhead_s))
                ));
            }
            if trust.within_noise {
                notes.push(format!(
                    "prefill {label} ~ within noise: median TTFT − overhead = {} ms, not above the overhead's own spread of {} ms; the rate can be off by 2x or more (use a longer prompt)",
                    ms(trust.margin_s),
                    ms(Some(spread))
                ));
            }
        }
        for n in notes {
            let _ = writeln!(s, "  {n}");
        }
    }
    if !r.failures.is_empty() {
        let _ = writeln!(s, "\n{} request(s) failed:", r.failures.len());
        for f in &r.failures {
            let _ = writeln!(s, "  {}: {}", f.phase, f.error);
        }
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req(ttft: f64, prompt: u64, completion: u64) -> serde_json::Value {
        serde_json::json!({"sent_s": 1.0, "first_s": 1.0 + ttft, "last_s": 1.1 + ttft, "ttft_s": ttft,
            "decode_tok_s": 70.0, "prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": 0,
            "text_events": completion, "finish_reason": "length"})
    }

    /// Issue 21 item 10's run: prefill 128 where two of three TTFTs were within the overhead.
    fn result() -> BenchResult {
        let summary =
            |v: f64, n: u64| serde_json::json!({"n": n, "mean": v, "median": v, "p90": v, "min": v, "max": v});
        serde_json::from_value(serde_json::json!({
            "format": "spark-kit-bench", "version": 1,
            "receipt": {"spark_kit_version": "0.1.0", "kit": null, "endpoint": "http://127.0.0.1:8000",
                "server_version": "0.1", "model": {"id": "m", "root": null, "max_model_len": 4096},
                "host": {"hostname": "h", "os": null, "kernel": null, "arch": "x86_64", "cpu": null, "cpus": 2,
                    "memory_bytes": null},
                "started_at": "2026-12-03T10:00:00Z", "finished_at": "2026-12-03T10:01:00Z", "duration_s": 60.0},
            "settings": {"concurrency": [1], "decode_tokens": 32, "decode_prompt_tokens": 64, "prefill_lengths": [128, 2048],
                "prefill_repeats": 3, "prefill_max_tokens": 8, "calibration_prompt_tokens": 16, "temperature": 0.0,
                "thinking": false, "vendor_params": true, "tokenize": true, "request_timeout_s": 60.0},
            "calibration": {"requests": [req(0.010, 16, 8), req(0.012, 16, 8), req(0.016, 16, 8)], "overhead_s": 0.012},
            "decode": [{"concurrency": 1, "aggregate_tok_s": 70.0, "decode_tok_s": summary(70.0, 1),
                "ttft_s": summary(0.02, 1), "requests": [req(0.02, 64, 32)], "failed": 0}],
            "prefill": [
                {"target_tokens": 128, "prefill_tok_s": summary(16_623.4, 1), "ttft_s": summary(0.012, 3),
                 "requests": [req(0.011, 128, 8), req(0.012, 128, 8), req(0.0197, 128, 8)], "failed": 0, "skipped": null},
                {"target_tokens": 2048, "prefill_tok_s": summary(10_240.0, 3), "ttft_s": summary(0.212, 3),
                 "requests": [req(0.212, 2048, 8), req(0.212, 2048, 8), req(0.212, 2048, 8)], "failed": 0, "skipped": null}
            ],
            "failures": []
        }))
        .unwrap()
    }

    #[test]
    fn n_dropped_noise_and_what_each_rate_divides() {
        let t = render(&result());
        // Every rate says what it divides.
        assert!(t.contains("tok/s/stream = (completion tokens − 1) / (last − first token)"), "{t}");
        assert!(t.contains("prefill tok/s = (prompt − cached tokens) / (TTFT − 12 ms overhead)"), "{t}");
        // n in the table: 1 of 3 rated at 128, 3 of 3 at 2048; the decode level's streams.
        let line = |label: &str| t.lines().find(|l| l.trim_start().starts_with(label)).unwrap().to_string();
        let p128 = line("128 ");
        assert!(p128.contains(" 1/3 ") && p128.contains("16623.4 ~"), "{p128}");
        let p2k = line("2k ");
        assert!(p2k.contains(" 3/3 ") && !p2k.contains('~'), "{p2k}");
        assert!(t.contains("streams     n    tok/s/stream"), "{t}");
        // Dropped samples counted and said; the point within noise marked and explained.
        assert!(t.contains("prefill 128: 2 of 3 sample(s) dropped: TTFT not above the 12 ms overhead"), "{t}");
        assert!(t.contains("prefill 128 ~ within noise: median TTFT − overhead = 0 ms, not above the overhead's own spread of 6 ms"), "{t}");
        assert!(!t.contains("prefill 2k ~"), "{t}");
    }
}
