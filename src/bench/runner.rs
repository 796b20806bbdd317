//! One run's client state (the model, its tokenizer probe, the vendor-parameter fallback, the
//! failures so far) and the requests every phase is made of: warm-up, calibration, a decode wave
//! (with the spec-decode counters read around it), a prefill step. [`Session`] opens a run and
//! turns what it measured into the result.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::client::{BenchError, ChatRequest, Endpoint, ModelInfo, RequestError, StreamOutcome};
use super::metrics::{aggregate_rate, decode_rate, median, prefill_rate, summarize, ttft, StreamTimes};
use super::plausible::split_requests;
use super::prompt::{salted, Fit, FitStep, Tokens, PROBE_WORDS};
use super::result::{
    Audit, BenchResult, Calibration, Failure, ModelReceipt, PrefillStep, Receipt, Request, Settings, Wave, FORMAT,
    VERSION,
};
use super::run::{fit_lengths, pick_model, prefill_timeout, BenchReporter, Fitted, Plan, Provenance};
use super::spec::{self, SpecCounts};
use super::{host, sizes};

pub(crate) fn request_record(o: &StreamOutcome) -> Request {
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

pub(crate) struct Runner<'a> {
    pub(crate) ep: &'a Endpoint,
    pub(crate) plan: &'a Plan,
    model: String,
    pub(crate) epoch: Instant,
    pub(crate) vendor_params: bool,
    /// `None` until probed.
    tokenize: Option<bool>,
    /// How the server's tokenizer counts salted prompts (probed once).
    tokens: Option<Tokens>,
    /// Filler words that gave each target length last time (the next request starts there).
    words: HashMap<u64, usize>,
    pub(crate) fitted: Fitted,
    failures: Vec<Failure>,
    /// Whether `/metrics` had spec-decode counters at the last read (`None`: it did not answer).
    pub(crate) spec_counters: Option<bool>,
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
        let start = self.words.get(&target).copied().unwrap_or_else(|| model.words_for(target));
        let mut salts = vec![Self::salt()];
        if self.tokenize != Some(true) {
            return Ok(salted(&salts[0], start));
        }
        let mut fit = Fit::new(target, model, start);
        let mut step = fit.first();
        let (salt, words) = loop {
            match step {
                FitStep::Measure { salt, words } => {
                    while salts.len() <= salt {
                        salts.push(Self::salt());
                    }
                    let Some(n) = self.ep.tokenize(&self.model, &salted(&salts[salt], words)).await? else {
                        break (salt, words);
                    };
                    step = fit.measured(words, n);
                }
                FitStep::Done { salt, words } => break (salt, words),
            }
        };
        self.words.insert(target, words);
        Ok(salted(&salts[salt], words))
    }

    pub(crate) async fn request_for(&mut self, target: u64, max_tokens: u64) -> Result<ChatRequest, BenchError> {
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
    pub(crate) async fn one(
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

    pub(crate) fn fail(&mut self, phase: &str, e: &RequestError, rep: &mut dyn BenchReporter) {
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
    pub(crate) async fn waves(&mut self, c: u32, rep: &mut dyn BenchReporter) -> Result<Vec<Wave>, BenchError> {
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
    pub(crate) async fn spec_counts(&mut self) -> Option<SpecCounts> {
        let text = self.ep.metrics().await;
        let counts = text.as_deref().and_then(spec::read);
        self.spec_counters = text.map(|_| counts.is_some()).or(self.spec_counters);
        counts
    }

    /// One wave: the `c` requests start together; the spec-decode counters are read around it.
    pub(crate) async fn wave(&mut self, c: u32, reqs: Vec<ChatRequest>, rep: &mut dyn BenchReporter) -> Wave {
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

    pub(crate) async fn prefill(
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

/// An opened run: model picked, lengths fitted, warm-up and calibration done.
pub(crate) struct Session<'a> {
    pub(crate) runner: Runner<'a>,
    pub(crate) model: ModelInfo,
    pub(crate) calibration: Calibration,
    started_at: String,
    server_version: Option<String>,
}

impl<'a> Session<'a> {
    /// `/v1/models`, `/version`, the warm-up request and the calibration prompts.
    pub(crate) async fn open(
        ep: &'a Endpoint,
        plan: &'a Plan,
        rep: &mut dyn BenchReporter,
    ) -> Result<Session<'a>, BenchError> {
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
            fitted,
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
        Ok(Session { runner, model, calibration, started_at, server_version })
    }

    /// The result of what ran.
    pub(crate) fn finish(
        self,
        provenance: Provenance,
        decode: Vec<Wave>,
        prefill: Vec<PrefillStep>,
        audit: Option<Audit>,
    ) -> BenchResult {
        let (r, plan) = (&self.runner, self.runner.plan);
        let settings = Settings {
            concurrency: plan.concurrency.clone(),
            decode_tokens: r.fitted.decode_tokens,
            decode_prompt_tokens: r.fitted.decode_prompt_tokens,
            decode_repeats: plan.decode_repeats.max(1),
            prefill_lengths: r.fitted.prefill.clone(),
            prefill_repeats: plan.prefill_repeats,
            prefill_max_tokens: plan.prefill_max_tokens,
            calibration_prompt_tokens: plan.calibration_prompt_tokens,
            temperature: plan.temperature,
            thinking: plan.thinking,
            vendor_params: r.vendor_params,
            tokenize: r.tokenize == Some(true),
            request_timeout_s: plan.request_timeout.as_secs_f64(),
            spec_decode_counters: r.spec_counters,
        };
        let m = self.model;
        BenchResult {
            format: FORMAT.into(),
            version: VERSION,
            receipt: Receipt {
                spark_kit_version: env!("CARGO_PKG_VERSION").into(),
                kit: provenance.kit,
                lock: provenance.lock,
                endpoint: r.ep.base.clone(),
                server_version: self.server_version,
                model: ModelReceipt { id: m.id, root: m.root, max_model_len: m.max_model_len },
                host: host::facts(),
                started_at: self.started_at,
                finished_at: host::now_rfc3339(),
                duration_s: r.epoch.elapsed().as_secs_f64(),
            },
            settings,
            calibration: self.calibration,
            decode,
            prefill,
            failures: self.runner.failures,
            audit,
        }
    }
}
