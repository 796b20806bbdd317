//! Long-context answers: what a context of `target` tokens needs with a given KV record — the
//! pool that holds it, the predicted prefill floor at that length with that pool (pessimistic end
//! of the weight band, the rule [`super::plan`] applies), the largest safe prompt, and what must
//! change when it does not fit. Pure: it re-runs the planner on a copy of the input.

use serde::Serialize;

use super::{kv_block_bytes, plan, PlanInput, PromptLimit};

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
    }
}
