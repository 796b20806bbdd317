//! The benchmark run: warm-up, calibration, decode waves (ascending), prefill ladder.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::client::{BenchError, ChatRequest, Endpoint, ModelInfo, RequestError, StreamOutcome};
use super::metrics::{aggregate_rate, decode_rate, median, prefill_rate, summarize, ttft, StreamTimes};
use super::plausible::split_requests;
use super::prompt::{close_enough, salted, Tokens, PROBE_WORDS};
use super::result::{
    BenchResult, Calibration, Failure, KitReceipt, ModelReceipt, PrefillStep, Receipt, Request, Settings, Wave, FORMAT,
    VERSION,
};
use super::spec::{self, SpecCounts};
use super::{host, sizes};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Model id; `None` = the only model the server lists.
    pub model: Option<String>,
    pub concurrency: Vec<u32>,
    /// Decode and prefill lengths as asked for (`None` = default, fitted to the model).
    pub lengths: Lengths,
    /// Waves per concurrency level, run back to back.
    pub decode_repeats: u32,
    pub prefill_repeats: u32,
    pub prefill_max_tokens: u64,
    pub calibration_prompt_tokens: u64,
    /// Tiny prompts whose median TTFT is the prefill overhead.
    pub calibration_runs: u32,
    pub temperature: f64,
    pub thinking: bool,
    /// Timeout of one decode request.
    pub request_timeout: Duration,
}

/// Lengths as given on the command line; `None` = the default, fitted to `max_model_len`.
#[derive(Debug, Clone, Default)]
pub struct Lengths {
    pub decode_tokens: Option<u64>,
    pub decode_prompt_tokens: Option<u64>,
    pub prefill: Option<Vec<u64>>,
}

/// Lengths fitted to a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fitted {
    pub decode_tokens: u64,
    pub decode_prompt_tokens: u64,
    pub prefill: Vec<u64>,
}

/// Default decode length and decode prompt length.
pub const DEFAULT_DECODE: u64 = 256;
/// Default prefill ladder.
pub const DEFAULT_PREFILL: [u64; 4] = [1024, 4096, 16_384, 65_536];
/// Tokens of slack for prompts whose real length differs a little from the target.
const SLACK: u64 = 8;

/// The decode request does not fit the model's context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--decode-tokens {decode_tokens} + --decode-prompt-tokens {decode_prompt_tokens} (+{SLACK} slack) exceed the model's \
     max_model_len {max_model_len}"
)]
pub struct TooLong {
    pub decode_tokens: u64,
    pub decode_prompt_tokens: u64,
    pub max_model_len: u64,
}

/// Fit the lengths to the model: defaults shrink to fit `max_model_len`; explicit decode lengths
/// that cannot fit are an error (explicit prefill lengths that cannot fit are skipped later).
pub fn fit_lengths(l: &Lengths, max_model_len: Option<u64>, prefill_max_tokens: u64) -> Result<Fitted, TooLong> {
    let m = max_model_len.unwrap_or(u64::MAX);
    let decode_tokens = l.decode_tokens.unwrap_or_else(|| DEFAULT_DECODE.min(m / 2).max(2));
    let decode_prompt_tokens = l.decode_prompt_tokens.unwrap_or_else(|| DEFAULT_DECODE.min(m / 4).max(16));
    if decode_tokens.saturating_add(decode_prompt_tokens).saturating_add(SLACK) > m {
        return Err(TooLong { decode_tokens, decode_prompt_tokens, max_model_len: m });
    }
    let prefill = match &l.prefill {
        Some(p) => p.clone(),
        None => {
            let fits: Vec<u64> =
                DEFAULT_PREFILL.iter().copied().filter(|&n| n + prefill_max_tokens + SLACK <= m).collect();
            if fits.is_empty() {
                vec![(m / 2).max(16)]
            } else {
                fits
            }
        }
    };
    Ok(Fitted { decode_tokens, decode_prompt_tokens, prefill })
}

/// Progress of a run (the binary prints it; tests may record it).
pub trait BenchReporter {
    /// A phase starts (`warmup`, `calibration`, `decode`, `prefill`).
    fn phase(&mut self, name: &str, detail: &str);
    /// Something the user should know (a fallback, a skipped step).
    fn note(&mut self, message: &str);
    /// One request finished (or failed: `Err` text).
    fn request(&mut self, phase: &str, outcome: Result<&Request, &str>);
}

/// Prefill timeout for a prompt length: min(45 min, 60 s + 8 ms per token).
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn prefill_timeout(tokens: u64) -> Duration {
    Duration::from_secs_f64((60.0 + 0.008 * tokens as f64).min(2700.0))
}

/// The model to measure: the one asked for (must be listed) or the only one listed.
pub fn pick_model(url: &str, wanted: Option<&str>, models: &[ModelInfo]) -> Result<ModelInfo, BenchError> {
    let served = || models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>().join(", ");
    match wanted {
        Some(w) => models.iter().find(|m| m.id == w).cloned().ok_or_else(|| BenchError::ModelNotServed {
            model: w.to_string(),
            url: url.to_string(),
            served: if models.is_empty() { "nothing".into() } else { served() },
        }),
        None => match models {
            [] => Err(BenchError::NoModels { url: url.to_string() }),
            [one] => Ok(one.clone()),
            _ => Err(BenchError::SeveralModels { url: url.to_string(), served: served() }),
        },
    }
}

fn request_record(o: &StreamOutcome) -> Request {
    Request {
        sent_s: o.sent,
        first_s: o.first,
        last_s: o.last,
        ttft_s: ttft(o.sent, o.first),
        decode_tok_s: decode_rate(o.usage.completion_tokens, o.first, o.last),
        prompt_tokens: o.usage.prompt_tokens,
        completion_tokens: o.usage.completion_tokens,
        cached_tokens: o.usage.cached_tokens,
        text_events: o.text_events,
        finish_reason: o.finish_reason.clone(),
    }
}

struct Runner<'a> {
    ep: &'a Endpoint,
    plan: &'a Plan,
    model: String,
    epoch: Instant,
    vendor_params: bool,
    /// `None` until probed.
    tokenize: Option<bool>,
    /// How the server's tokenizer counts salted prompts (probed once).
    tokens: Option<Tokens>,
    /// Filler words that gave each target length last time (the next request starts there).
    words: HashMap<u64, usize>,
    fitted: Fitted,
    failures: Vec<Failure>,
    /// Whether `/metrics` had spec-decode counters at the last read (`None`: it did not answer).
    spec_counters: Option<bool>,
}

impl Runner<'_> {
    fn salt() -> String {
        uuid::Uuid::new_v4().to_string()
    }

    /// The tokenizer model, probed with `/tokenize` once (a guess when the server has none).
    async fn tokens(&mut self) -> Result<Tokens, BenchError> {
        if let Some(t) = self.tokens {
            return Ok(t);
        }
        let salt = Self::salt();
        let small = self.ep.tokenize(&self.model, &salted(&salt, PROBE_WORDS[0])).await?;
        let large = match small {
            Some(_) => self.ep.tokenize(&self.model, &salted(&salt, PROBE_WORDS[1])).await?,
            None => None,
        };
        let t = match (small, large) {
            (Some(a), Some(b)) => Tokens::from_probes(a, b),
            _ => Tokens::guess(),
        };
        self.tokenize = Some(small.is_some() && large.is_some());
        self.tokens = Some(t);
        Ok(t)
    }

    /// A freshly salted prompt of about `target` tokens: with `/tokenize`, the filler is adjusted
    /// for this very salt until the count is close enough (UUIDs tokenize to different lengths).
    async fn prompt(&mut self, target: u64) -> Result<String, BenchError> {
        let model = self.tokens().await?;
        let salt = Self::salt();
        let mut w = self.words.get(&target).copied().unwrap_or_else(|| model.words_for(target));
        if self.tokenize == Some(true) {
            for _ in 0..4 {
                let Some(n) = self.ep.tokenize(&self.model, &salted(&salt, w)).await? else { break };
                if close_enough(target, n) || (w == 0 && n > target) {
                    break;
                }
                w = model.adjust(target, w, n);
            }
        }
        self.words.insert(target, w);
        Ok(salted(&salt, w))
    }

    async fn request_for(&mut self, target: u64, max_tokens: u64) -> Result<ChatRequest, BenchError> {
        let prompt = self.prompt(target).await?;
        Ok(ChatRequest {
            model: self.model.clone(),
            prompt,
            max_tokens,
            fixed_length: true,
            temperature: self.plan.temperature,
            thinking: self.plan.thinking,
            vendor_params: self.vendor_params,
        })
    }

    /// One request; a 400 with vendor parameters is retried once without them (for the rest of the run).
    async fn one(
        &mut self,
        mut req: ChatRequest,
        timeout: Duration,
        rep: &mut dyn BenchReporter,
    ) -> Result<StreamOutcome, RequestError> {
        match self.ep.stream_chat(&req, self.epoch, timeout).await {
            Err(RequestError::BadRequest(body)) if req.vendor_params => {
                self.vendor_params = false;
                rep.note(&format!(
                    "the server rejected the request with HTTP 400 ({body}); retrying without the vendor parameters \
                     ignore_eos/min_tokens/chat_template_kwargs, so decode lengths follow the model's end of text"
                ));
                req.vendor_params = false;
                self.ep.stream_chat(&req, self.epoch, timeout).await
            }
            r => r,
        }
    }

    fn fail(&mut self, phase: &str, e: &RequestError, rep: &mut dyn BenchReporter) {
        let text = e.to_string();
        rep.request(phase, Err(&text));
        self.failures.push(Failure { phase: phase.to_string(), error: text });
    }

    async fn warmup(&mut self, rep: &mut dyn BenchReporter) -> Result<(), BenchError> {
        rep.phase("warmup", "one short request (not measured)");
        let req = self.request_for(self.plan.calibration_prompt_tokens, 16).await?;
        match self.one(req, self.plan.request_timeout, rep).await {
            Ok(o) => {
                rep.request("warmup", Ok(&request_record(&o)));
                Ok(())
            }
            Err(RequestError::Unauthorized) => Err(BenchError::Unauthorized { url: self.ep.base.clone() }),
            Err(RequestError::NoUsage) => Err(BenchError::NoUsage),
            Err(e) => Err(BenchError::FirstRequest(e.to_string())),
        }
    }

    async fn calibrate(&mut self, rep: &mut dyn BenchReporter) -> Result<Calibration, BenchError> {
        let n = self.plan.calibration_runs;
        rep.phase(
            "calibration",
            &format!(
                "{n} tiny prompts (target {} tokens): median TTFT = overhead",
                self.plan.calibration_prompt_tokens
            ),
        );
        let mut requests = Vec::new();
        for _ in 0..n {
            let req = self.request_for(self.plan.calibration_prompt_tokens, self.plan.prefill_max_tokens).await?;
            match self.one(req, self.plan.request_timeout, rep).await {
                Ok(o) => {
                    let r = request_record(&o);
                    rep.request("calibration", Ok(&r));
                    requests.push(r);
                }
                Err(e) => self.fail("calibration", &e, rep),
            }
        }
        let overhead_s = median(&requests.iter().map(|r| r.ttft_s).collect::<Vec<_>>()).unwrap_or(0.0);
        Ok(Calibration { requests, overhead_s })
    }

    /// The `decode_repeats` waves of `c` streams. Every prompt is built (and checked with
    /// `/tokenize`) before the first wave, so the waves follow each other without gaps.
    async fn waves(&mut self, c: u32, rep: &mut dyn BenchReporter) -> Result<Vec<Wave>, BenchError> {
        let repeats = self.plan.decode_repeats.max(1);
        let mut prompts = Vec::new();
        for _ in 0..repeats {
            let mut reqs = Vec::new();
            for _ in 0..c {
                reqs.push(self.request_for(self.fitted.decode_prompt_tokens, self.fitted.decode_tokens).await?);
            }
            prompts.push(reqs);
        }
        let mut waves = Vec::new();
        for (k, reqs) in prompts.into_iter().enumerate() {
            let of = if repeats > 1 { format!(", wave {} of {repeats}", k + 1) } else { String::new() };
            rep.phase(
                "decode",
                &format!(
                    "{c} stream(s) × {} tokens, prompt {} tokens{of}",
                    self.fitted.decode_tokens, self.fitted.decode_prompt_tokens
                ),
            );
            waves.push(self.wave(c, reqs, rep).await);
        }
        Ok(waves)
    }

    /// vLLM's spec-decode counters now (`None`: none, or no `/metrics`); remembers which.
    async fn spec_counts(&mut self) -> Option<SpecCounts> {
        let text = self.ep.metrics().await;
        let counts = text.as_deref().and_then(spec::read);
        self.spec_counters = text.map(|_| counts.is_some()).or(self.spec_counters);
        counts
    }

    /// One wave: the `c` requests start together; the spec-decode counters are read around it.
    async fn wave(&mut self, c: u32, reqs: Vec<ChatRequest>, rep: &mut dyn BenchReporter) -> Wave {
        let before = self.spec_counts().await;
        let mut w = self.wave_streams(c, reqs, rep).await;
        let after = if before.is_some() { self.spec_counts().await } else { None };
        w.spec_decode = before.zip(after).and_then(|(b, a)| spec::delta(b, a));
        w
    }

    async fn wave_streams(&mut self, c: u32, reqs: Vec<ChatRequest>, rep: &mut dyn BenchReporter) -> Wave {
        let phase = format!("decode c={c}");
        let mut set = tokio::task::JoinSet::new();
        for (i, req) in reqs.into_iter().enumerate() {
            let ep = self.ep.clone();
            let (epoch, timeout) = (self.epoch, self.plan.request_timeout);
            set.spawn(async move { (i, ep.stream_chat(&req, epoch, timeout).await) });
        }
        let mut done = Vec::new();
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(x) => done.push(x),
                Err(e) => self.fail(&phase, &RequestError::Stream(format!("request task failed: {e}")), rep),
            }
        }
        done.sort_by_key(|(i, _)| *i);
        let mut requests = Vec::new();
        let mut times = Vec::new();
        let mut failed = 0;
        for (_, r) in done {
            match r {
                Ok(o) => {
                    let rec = request_record(&o);
                    rep.request(&phase, Ok(&rec));
                    times.push(StreamTimes {
                        sent: o.sent,
                        first: o.first,
                        last: o.last,
                        completion_tokens: o.usage.completion_tokens,
                    });
                    requests.push(rec);
                }
                Err(e) => {
                    failed += 1;
                    self.fail(&phase, &e, rep);
                }
            }
        }
        let aggregate_tok_s = aggregate_rate(&times);
        let (rates, _) = split_requests(&requests, aggregate_tok_s);
        let ttfts: Vec<f64> = requests.iter().map(|r| r.ttft_s).collect();
        Wave {
            concurrency: c,
            aggregate_tok_s,
            decode_tok_s: summarize(&rates),
            ttft_s: summarize(&ttfts),
            requests,
            failed,
            spec_decode: None,
        }
    }

    async fn prefill(
        &mut self,
        target: u64,
        max_model_len: Option<u64>,
        overhead: f64,
        rep: &mut dyn BenchReporter,
    ) -> Result<PrefillStep, BenchError> {
        let label = sizes::length_label(target);
        let phase = format!("prefill {label}");
        let mut step = PrefillStep {
            target_tokens: target,
            prefill_tok_s: None,
            ttft_s: None,
            requests: Vec::new(),
            failed: 0,
            skipped: None,
        };
        if let Some(max) = max_model_len.filter(|&m| target + self.plan.prefill_max_tokens > m) {
            let why =
                format!("{target} + {} tokens exceeds the model's max_model_len {max}", self.plan.prefill_max_tokens);
            rep.note(&format!("prefill {label} skipped: {why}"));
            step.skipped = Some(why);
            return Ok(step);
        }
        let timeout = prefill_timeout(target);
        rep.phase(
            "prefill",
            &format!("{label} tokens × {} (timeout {:.0} s each)", self.plan.prefill_repeats, timeout.as_secs_f64()),
        );
        let mut rates = Vec::new();
        for _ in 0..self.plan.prefill_repeats {
            let req = self.request_for(target, self.plan.prefill_max_tokens).await?;
            match self.one(req, timeout, rep).await {
                Ok(o) => {
                    let rec = request_record(&o);
                    rep.request(&phase, Ok(&rec));
                    if let Some(r) = prefill_rate(rec.prompt_tokens, rec.cached_tokens, rec.ttft_s, overhead) {
                        rates.push(r);
                    }
                    step.requests.push(rec);
                }
                Err(e) => {
                    step.failed += 1;
                    self.fail(&phase, &e, rep);
                }
            }
        }
        step.prefill_tok_s = summarize(&rates);
        step.ttft_s = summarize(&step.requests.iter().map(|r| r.ttft_s).collect::<Vec<_>>());
        Ok(step)
    }
}

/// [`run`] on a runtime of its own (the command's thread waits for it).
pub fn run_blocking(
    ep: &Endpoint,
    plan: &Plan,
    kit: Option<KitReceipt>,
    rep: &mut dyn BenchReporter,
) -> Result<BenchResult, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(BenchError::Runtime)?;
    rt.block_on(run(ep, plan, kit, rep))
}

/// Run the whole benchmark against `ep`.
pub async fn run(
    ep: &Endpoint,
    plan: &Plan,
    kit: Option<KitReceipt>,
    rep: &mut dyn BenchReporter,
) -> Result<BenchResult, BenchError> {
    let started_at = host::now_rfc3339();
    let epoch = Instant::now();
    let models = ep.models().await?;
    let model = pick_model(&ep.base, plan.model.as_deref(), &models)?;
    let fitted =
        fit_lengths(&plan.lengths, model.max_model_len, plan.prefill_max_tokens).map_err(BenchError::TooLong)?;
    let server_version = ep.version().await;
    let mut runner = Runner {
        ep,
        plan,
        model: model.id.clone(),
        epoch,
        vendor_params: true,
        tokenize: None,
        tokens: None,
        words: HashMap::new(),
        fitted: fitted.clone(),
        failures: Vec::new(),
        spec_counters: None,
    };
    runner.warmup(rep).await?;
    if runner.tokenize == Some(false) {
        rep.note(
            "the server has no /tokenize: prompt lengths are estimated (the usage block still reports the real ones)",
        );
    }
    let calibration = runner.calibrate(rep).await?;
    let mut decode = Vec::new();
    for &c in &plan.concurrency {
        decode.extend(runner.waves(c, rep).await?);
    }
    let mut prefill = Vec::new();
    for &len in &fitted.prefill {
        prefill.push(runner.prefill(len, model.max_model_len, calibration.overhead_s, rep).await?);
    }
    let settings = Settings {
        concurrency: plan.concurrency.clone(),
        decode_tokens: fitted.decode_tokens,
        decode_prompt_tokens: fitted.decode_prompt_tokens,
        decode_repeats: plan.decode_repeats.max(1),
        prefill_lengths: fitted.prefill.clone(),
        prefill_repeats: plan.prefill_repeats,
        prefill_max_tokens: plan.prefill_max_tokens,
        calibration_prompt_tokens: plan.calibration_prompt_tokens,
        temperature: plan.temperature,
        thinking: plan.thinking,
        vendor_params: runner.vendor_params,
        tokenize: runner.tokenize == Some(true),
        request_timeout_s: plan.request_timeout.as_secs_f64(),
        spec_decode_counters: runner.spec_counters,
    };
    Ok(BenchResult {
        format: FORMAT.into(),
        version: VERSION,
        receipt: Receipt {
            spark_kit_version: env!("CARGO_PKG_VERSION").into(),
            kit,
            endpoint: ep.base.clone(),
            server_version,
            model: ModelReceipt { id: model.id, root: model.root, max_model_len: model.max_model_len },
            host: host::facts(),
            started_at,
            finished_at: host::now_rfc3339(),
            duration_s: epoch.elapsed().as_secs_f64(),
        },
        settings,
        calibration,
        decode,
        prefill,
        failures: runner.failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_timeout_grows_and_caps() {
        assert_eq!(prefill_timeout(0), Duration::from_secs(60));
        assert_eq!(prefill_timeout(100_000), Duration::from_secs(860));
        assert_eq!(prefill_timeout(1_000_000), Duration::from_secs(2700));
    }

    #[test]
    fn lengths_fit_the_model() {
        let none = Lengths::default();
        let f = fit_lengths(&none, None, 8).unwrap();
        assert_eq!((f.decode_tokens, f.decode_prompt_tokens, f.prefill), (256, 256, DEFAULT_PREFILL.to_vec()));
        let f = fit_lengths(&none, Some(512), 8).unwrap();
        assert_eq!((f.decode_tokens, f.decode_prompt_tokens, f.prefill), (256, 128, vec![256]));
        let f = fit_lengths(&none, Some(8192), 8).unwrap();
        assert_eq!(f.prefill, vec![1024, 4096]);
        let big = Lengths { decode_tokens: Some(500), ..Lengths::default() };
        assert!(fit_lengths(&big, Some(512), 8).unwrap_err().to_string().contains("max_model_len 512"));
        let explicit = Lengths { prefill: Some(vec![100_000]), ..Lengths::default() };
        assert_eq!(fit_lengths(&explicit, Some(512), 8).unwrap().prefill, vec![100_000]);
    }

    #[test]
    fn model_choice() {
        let m = |id: &str| ModelInfo { id: id.into(), root: None, max_model_len: None };
        assert_eq!(pick_model("u", None, &[m("a")]).unwrap().id, "a");
        assert!(matches!(pick_model("u", None, &[]), Err(BenchError::NoModels { .. })));
        assert!(matches!(pick_model("u", None, &[m("a"), m("b")]), Err(BenchError::SeveralModels { .. })));
        let e = pick_model("u", Some("x"), &[m("a"), m("b")]).unwrap_err();
        assert_eq!(e.to_string(), "model `x` is not served at u; it serves: a, b");
    }
}
