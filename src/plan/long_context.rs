//! Long-context answers: what a context of `target` tokens needs with a given KV record — the
//! pool that holds it, the predicted prefill floor at that length with that pool (pessimistic end
//! of the weight band, the rule [`super::plan`] applies), the largest safe prompt, and what must
//! change when it does not fit. Pure: it re-runs the planner on a copy of the input.

use std::fmt::Write as _;

use serde::Serialize;

use super::gib_i as gib;
use super::reference::gib as gib_u;
use super::{kv_block_bytes, plan, PlanInput, PromptLimit};

/// "speculation off frees ~3.5 GiB" of MemAvailable (reference-kit.md D): the one measured lever
/// of that size short of new hardware.
pub const SPECULATION_OFF_FREES: u64 = 3584 * crate::kit::bytes::MIB;

/// The base model's window: 1M tokens.
pub const ONE_MILLION: u64 = 1_048_576;

/// One record at one target length.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextAnswer {
    /// `fp8_ds_mla` or `nvfp4_ds_mla`.
    pub dtype: String,
    pub bytes_per_token: f64,
    pub target_tokens: u64,
    /// The KV pool per rank that holds `target_tokens` (whole blocks).
    pub pool_bytes: u64,
    /// Predicted MemAvailable floor of a `target_tokens` prefill with that pool (pessimistic;
    /// the worst node).
    pub floor: i64,
    /// The same from the central weight estimate.
    pub floor_central: i64,
    /// What the floor must stay above.
    pub required_floor: i64,
    /// Largest safe prompt with that pool.
    pub safe_prompt: u64,
    pub limited_by: PromptLimit,
    /// Memory to free per node for `target_tokens` to be safe (0 when it is).
    pub short_by: u64,
    /// Why the engine refuses this record on this hardware, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Whether `target_tokens` is safe with this record (memory and engine).
    pub fits: bool,
}

/// The answer for `target` tokens with `bytes_per_token` (`None` when the node memory or the KV
/// figure is unknown). `refused`: why the engine would not run this record here.
#[must_use]
pub fn answer(
    input: &PlanInput,
    dtype: &str,
    bytes_per_token: f64,
    target: u64,
    refused: Option<String>,
) -> Option<ContextAnswer> {
    let block = input.block_size.max(1);
    let per_block = kv_block_bytes(bytes_per_token, block)?;
    let pool = target.div_ceil(u64::from(block)).saturating_mul(per_block);
    let mut at = input.clone();
    at.kv_cache_bytes = pool;
    at.kv_bytes_per_token = bytes_per_token;
    at.max_model_len = target;
    let p = plan(&at);
    let worst = p.nodes.iter().filter_map(|n| n.prefill.as_ref()).min_by_key(|x| x.floor_at_max_model_len)?;
    let short = worst.required_floor.saturating_sub(worst.floor_at_max_model_len).max(0);
    let short_by = u64::try_from(short).unwrap_or(0);
    Some(ContextAnswer {
        dtype: dtype.to_string(),
        bytes_per_token,
        target_tokens: target,
        pool_bytes: pool,
        floor: worst.floor_at_max_model_len,
        floor_central: worst.floor_central_at_max_model_len,
        required_floor: worst.required_floor,
        safe_prompt: worst.safe_max_prompt,
        limited_by: worst.limited_by,
        short_by,
        fits: short_by == 0 && refused.is_none() && worst.safe_max_prompt >= target,
        refused,
    })
}

/// What must change for `a` to fit, in one line (empty when it fits).
#[must_use]
pub fn what_must_change(a: &ContextAnswer) -> String {
    if a.fits {
        return String::new();
    }
    if let Some(why) = &a.refused {
        return format!("{why}: this record needs an SM100 GPU, not a memory change");
    }
    if a.short_by == 0 {
        return format!("the prompt is limited by {} to {} tokens", a.limited_by.name(), a.safe_prompt);
    }
    let spec = if a.short_by <= SPECULATION_OFF_FREES {
        "speculation off (~3.5 GiB, reference-kit.md D) covers it"
    } else {
        "more than speculation off frees (~3.5 GiB, reference-kit.md D): it also needs smaller weights"
    };
    format!(
        "free {:.2} GiB per node (runtime, OS or weights; each GiB freed raises the floor 1:1, \
         then `--set engine.kv_cache_bytes={}MiB --set engine.max_model_len={}`): {spec}",
        gib_u(a.short_by),
        a.pool_bytes.div_ceil(crate::kit::bytes::MIB),
        a.target_tokens
    )
}

/// The answers as a table, one line per record and length, then what must change for each.
#[must_use]
pub fn render(answers: &[ContextAnswer]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<13} {:>9} {:>8} {:>9} {:>20} {:>11} {:>12}  VERDICT",
        "RECORD", "CONTEXT", "B/TOKEN", "POOL", "PREFILL FLOOR (cent.)", "MUST STAY ≥", "SAFE PROMPT"
    );
    for a in answers {
        let verdict = if a.fits {
            "fits".to_string()
        } else if a.refused.is_some() {
            "refused by vLLM here".to_string()
        } else if a.short_by > 0 {
            format!("short by {:.2} GiB", gib_u(a.short_by))
        } else {
            format!("limited by {}", a.limited_by.name())
        };
        let _ = writeln!(
            s,
            "{:<13} {:>9} {:>8} {:>9.2} {:>12.2} ({:>5.2}) {:>11.2} {:>12}  {verdict}",
            a.dtype,
            a.target_tokens,
            a.bytes_per_token,
            gib_u(a.pool_bytes),
            gib(a.floor),
            gib(a.floor_central),
            gib(a.required_floor),
            a.safe_prompt,
        );
    }
    for a in answers.iter().filter(|a| !a.fits) {
        let _ = writeln!(s, "  {} at {}: {}", a.dtype, a.target_tokens, what_must_change(a));
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::kit::bytes::GIB;
    use crate::plan::replay::test_input;

    #[test]
    fn more_pool_for_more_tokens_lowers_the_floor() {
        let input = test_input(99.5, 0.0);
        let fp8 = answer(&input, "fp8_ds_mla", 3510.0, ONE_MILLION, None).unwrap();
        // 16,384 blocks × 224,640 B.
        assert_eq!(fp8.pool_bytes, 16_384 * 224_640);
        assert!(!fp8.fits);
        assert!(fp8.short_by > GIB, "{fp8:?}");
        let nvfp4 = answer(&input, "nvfp4_ds_mla", 1728.0, ONE_MILLION, None).unwrap();
        assert!(nvfp4.pool_bytes < fp8.pool_bytes);
        assert!(nvfp4.floor > fp8.floor);
        assert!(nvfp4.short_by < fp8.short_by);
        let refused = answer(&input, "nvfp4_ds_mla", 1728.0, 128_000, Some("SM100 only".into())).unwrap();
        assert!(!refused.fits && refused.short_by == 0, "{refused:?}");
        let short = answer(&input, "fp8_ds_mla", 3510.0, 128_000, None).unwrap();
        assert!(short.fits, "{short:?}");
        let table = render(&[fp8.clone(), refused]);
        assert!(table.contains("fp8_ds_mla") && table.contains("short by"), "{table}");
        assert!(what_must_change(&fp8).starts_with("free "), "{table}");
        assert!(table.contains("needs an SM100 GPU"), "{table}");
    }
}
