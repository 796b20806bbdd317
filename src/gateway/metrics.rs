//! The gateway's own Prometheus series, rendered as text exposition format. The counting is
//! behind a mutex; [`render`] is pure over a [`Snapshot`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bucket upper bounds, seconds (TTFT and inter-token latency).
pub const BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A cumulative histogram.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Per bucket of [`BUCKETS`], observations ≤ the bound (not cumulative; rendered cumulative).
    pub counts: [u64; BUCKETS.len()],
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += s;
    }
}

/// Everything the gateway counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Responses by HTTP status.
    pub requests: BTreeMap<u16, u64>,
    pub admitted: u64,
    /// Refusals by reason (`kv_pool`, `queue_full`, `unavailable`, …).
    pub refused: BTreeMap<&'static str, u64>,
    pub queue_depth: u64,
    pub in_flight: u64,
    /// Streams the upstream cut (ended with the terminal error event).
    pub streams_cut: u64,
    pub ttft: Histogram,
    pub inter_token: Histogram,
    /// Prompts counted for admission, by who counted: `tokenizer` (in process) or `engine` (`/tokenize`).
    pub prompt_counts: BTreeMap<&'static str, u64>,
    /// Why prompts are counted by the engine, when the checkpoint's tokenizer could not be had.
    pub counting_note: Option<String>,
}

/// Thread-safe counters.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Snapshot>,
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Snapshot)) {
        // A poisoned lock only means another thread panicked mid-update: the counts stay usable.
        let mut g = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut g);
    }

    pub fn status(&self, code: u16) {
        self.with(|s| *s.requests.entry(code).or_default() += 1);
    }
    pub fn admitted(&self) {
        self.with(|s| s.admitted += 1);
    }
    pub fn refused(&self, reason: &'static str) {
        self.with(|s| *s.refused.entry(reason).or_default() += 1);
    }
    pub fn prompt_counted(&self, by: &'static str) {
        self.with(|s| *s.prompt_counts.entry(by).or_default() += 1);
    }
    pub fn stream_cut(&self) {
        self.with(|s| s.streams_cut += 1);
    }
    pub fn ttft(&self, d: Duration) {
        self.with(|s| s.ttft.observe(d));
    }
    pub fn inter_token(&self, d: Duration) {
        self.with(|s| s.inter_token.observe(d));
    }

    /// A copy of the counts, with the live gauges filled in.
    #[must_use]
    pub fn snapshot(&self, queue_depth: u64, in_flight: u64) -> Snapshot {
        let mut out = Snapshot::default();
        self.with(|s| out = s.clone());
        out.queue_depth = queue_depth;
        out.in_flight = in_flight;
        out
    }
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cum = 0;
    for (b, c) in BUCKETS.iter().zip(h.counts) {
        cum += c;
        let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", h.count, h.sum, h.count);
}

/// Prometheus text of the gateway's series.
#[must_use]
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    out.push_str("# HELP spark_gateway_requests_total Responses sent by the gateway, by HTTP status (499: the client went away first).\n");
    out.push_str("# TYPE spark_gateway_requests_total counter\n");
    for (code, n) in &s.requests {
        let _ = writeln!(out, "spark_gateway_requests_total{{status=\"{code}\"}} {n}");
    }
    out.push_str("# HELP spark_gateway_admitted_total Generation requests admitted to the engine.\n");
    let _ = writeln!(out, "# TYPE spark_gateway_admitted_total counter\nspark_gateway_admitted_total {}", s.admitted);
    out.push_str("# HELP spark_gateway_refused_total Requests refused by the gateway, by reason.\n");
    out.push_str("# TYPE spark_gateway_refused_total counter\n");
    for (reason, n) in &s.refused {
        let _ = writeln!(out, "spark_gateway_refused_total{{reason=\"{reason}\"}} {n}");
    }
    out.push_str("# HELP spark_gateway_queue_depth Requests waiting for an engine slot.\n");
    let _ = writeln!(out, "# TYPE spark_gateway_queue_depth gauge\nspark_gateway_queue_depth {}", s.queue_depth);
    out.push_str("# HELP spark_gateway_in_flight Requests holding an engine slot.\n");
    let _ = writeln!(out, "# TYPE spark_gateway_in_flight gauge\nspark_gateway_in_flight {}", s.in_flight);
    out.push_str("# HELP spark_gateway_streams_cut_total Streams the upstream cut, ended with an error event.\n");
    let _ = writeln!(
        out,
        "# TYPE spark_gateway_streams_cut_total counter\nspark_gateway_streams_cut_total {}",
        s.streams_cut
    );
    out.push_str(
        "# HELP spark_gateway_prompt_counts_total Prompts counted for admission, by who counted: the checkpoint's \
         tokenizer.json in the gateway, or the engine's /tokenize.\n",
    );
    out.push_str("# TYPE spark_gateway_prompt_counts_total counter\n");
    for by in ["tokenizer", "engine"] {
        let n = s.prompt_counts.get(by).copied().unwrap_or(0);
        let _ = writeln!(out, "spark_gateway_prompt_counts_total{{by=\"{by}\"}} {n}");
    }
    if let Some(note) = &s.counting_note {
        let _ = writeln!(out, "# {}", note.replace('\n', " "));
    }
    histogram(
        &mut out,
        "spark_gateway_ttft_seconds",
        "Request arrival to first generated text, at the gateway.",
        &s.ttft,
    );
    histogram(&mut out, "spark_gateway_inter_token_seconds", "Gap between text events of a stream.", &s.inter_token);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_cumulative_buckets() {
        let m = Metrics::default();
        m.status(200);
        m.status(200);
        m.status(429);
        m.refused("queue_full");
        m.admitted();
        m.prompt_counted("tokenizer");
        m.ttft(Duration::from_millis(3));
        m.ttft(Duration::from_millis(40));
        let text = render(&m.snapshot(2, 1));
        assert!(text.contains("spark_gateway_requests_total{status=\"200\"} 2\n"), "{text}");
        assert!(text.contains("spark_gateway_requests_total{status=\"429\"} 1\n"), "{text}");
        assert!(text.contains("spark_gateway_refused_total{reason=\"queue_full\"} 1\n"), "{text}");
        assert!(text.contains("spark_gateway_queue_depth 2\n"), "{text}");
        assert!(text.contains("spark_gateway_prompt_counts_total{by=\"tokenizer\"} 1\n"), "{text}");
        assert!(text.contains("spark_gateway_prompt_counts_total{by=\"engine\"} 0\n"), "{text}");
        assert!(text.contains("spark_gateway_in_flight 1\n"), "{text}");
        assert!(text.contains("spark_gateway_ttft_seconds_bucket{le=\"0.0025\"} 0\n"), "{text}");
        assert!(text.contains("spark_gateway_ttft_seconds_bucket{le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("spark_gateway_ttft_seconds_bucket{le=\"0.05\"} 2\n"), "{text}");
        assert!(text.contains("spark_gateway_ttft_seconds_bucket{le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("spark_gateway_ttft_seconds_count 2\n"), "{text}");
    }

    #[test]
    fn over_the_last_bucket_counts_only_in_inf() {
        let mut h = Histogram::default();
        h.observe(Duration::from_secs(60));
        assert_eq!(h.counts.iter().sum::<u64>(), 0);
        assert_eq!(h.count, 1);
    }
}
