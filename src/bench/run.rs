//! The benchmark run: warm-up, calibration, decode waves (ascending), prefill ladder.

use std::time::Duration;

use super::client::{BenchError, Endpoint, ModelInfo};
use super::result::{BenchResult, KitReceipt, LockReceipt, Request};
use super::runner::Session;

/// Where the endpoint's model and engine came from, for the receipt.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    pub kit: Option<KitReceipt>,
    pub lock: Option<LockReceipt>,
}

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

/// [`run`] on a runtime of its own (the command's thread waits for it).
pub fn run_blocking(
    ep: &Endpoint,
    plan: &Plan,
    provenance: Provenance,
    rep: &mut dyn BenchReporter,
) -> Result<BenchResult, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(BenchError::Runtime)?;
    rt.block_on(run(ep, plan, provenance, rep))
}

/// Run the whole benchmark against `ep`.
pub async fn run(
    ep: &Endpoint,
    plan: &Plan,
    provenance: Provenance,
    rep: &mut dyn BenchReporter,
) -> Result<BenchResult, BenchError> {
    let mut s = Session::open(ep, plan, rep).await?;
    let mut decode = Vec::new();
    for &c in &plan.concurrency {
        decode.extend(s.runner.waves(c, rep).await?);
    }
    let mut prefill = Vec::new();
    for len in s.runner.fitted.prefill.clone() {
        prefill.push(s.runner.prefill(len, s.model.max_model_len, s.calibration.overhead_s, rep).await?);
    }
    Ok(s.finish(provenance, decode, prefill, None))
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
