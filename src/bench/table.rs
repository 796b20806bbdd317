//! The terminal table of one result (pure: result in, text out).

use std::fmt::Write as _;

use super::levels::levels;
use super::result::BenchResult;
use super::sizes::length_label;

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.digits$}"))
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{:.0}", x * 1000.0))
}

/// Render the result as a human-readable table.
#[must_use]
pub fn render(r: &BenchResult) -> String {
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
            "{:>7}  {:>14}  {:>10}  {:>10}  {:>16}  {:>11}  {:>8}  {:>6}",
            "streams", "tok/s/stream", "min", "max", "aggregate tok/s", "TTFT ms", "p90 ms", "failed"
        );
        for w in &levels(&r.decode) {
            let d = w.decode_tok_s.as_ref();
            let t = w.ttft_s.as_ref();
            let _ = writeln!(
                s,
                "{:>7}  {:>14}  {:>10}  {:>10}  {:>16}  {:>11}  {:>8}  {:>6}",
                w.concurrency,
                opt(d.map(|x| x.median), 1),
                opt(d.map(|x| x.min), 1),
                opt(d.map(|x| x.max), 1),
                opt(w.aggregate_tok_s, 1),
                ms(t.map(|x| x.median)),
                ms(t.map(|x| x.p90)),
                w.failed
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
            "{:>7}  {:>13}  {:>10}  {:>14}  {:>10}  {:>6}",
            "length", "prompt tokens", "TTFT s", "prefill tok/s", "min", "failed"
        );
        for p in &r.prefill {
            if let Some(why) = &p.skipped {
                let _ = writeln!(s, "{:>7}  skipped: {why}", length_label(p.target_tokens));
                continue;
            }
            let prompt = p.requests.first().map_or_else(|| "-".to_string(), |q| q.prompt_tokens.to_string());
            let _ = writeln!(
                s,
                "{:>7}  {:>13}  {:>10}  {:>14}  {:>10}  {:>6}",
                length_label(p.target_tokens),
                prompt,
                opt(p.ttft_s.as_ref().map(|x| x.median), 3),
                opt(p.prefill_tok_s.as_ref().map(|x| x.median), 1),
                opt(p.prefill_tok_s.as_ref().map(|x| x.min), 1),
                p.failed
            );
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
