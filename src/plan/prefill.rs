//! The long-prefill memory floor and the largest safe prompt (reference-kit.md D): the
//! MemAvailable floor comes during long prefill, each +0.5 GiB of KV pool costs ≈ 1 GiB of it,
//! and the floor must stay above the derived OOM floor + margin (or the guard's hard floor).

use serde::Serialize;

use super::{bytes_of, gib_i, ranks_per_node, reference, PlanInput};

/// What limits the largest safe prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptLimit {
    MaxModelLen,
    KvPool,
    PrefillFloor,
    GuardHardFloor,
}

impl PromptLimit {
    /// Snake-case name, as in JSON.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            PromptLimit::MaxModelLen => "max_model_len",
            PromptLimit::KvPool => "kv_pool",
            PromptLimit::PrefillFloor => "prefill_floor",
            PromptLimit::GuardHardFloor => "guard_hard_floor",
        }
    }
}

/// The long-prefill memory floor and the largest safe prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrefillPlan {
    /// Predicted MemAvailable floor during a prefill of `max_model_len` tokens at the
    /// pessimistic end of the weight band (may be negative): the verdict uses this one.
    pub floor_at_max_model_len: i64,
    /// The same floor from the central weight estimate.
    pub floor_central_at_max_model_len: i64,
    /// MemAvailable the prefill must stay above: the derived OOM floor + safety margin, or the
    /// guard's hard floor if that is higher.
    pub required_floor: i64,
    /// Largest prompt whose pessimistic floor stays at or above `required_floor`.
    pub safe_max_prompt: u64,
    pub limited_by: PromptLimit,
}

/// Predicted prefill floor (GiB) at `tokens` for a node with `headroom_gib` and `pool_gib`.
fn floor_gib(tokens: f64, headroom_gib: f64, pool_gib: f64) -> f64 {
    // Headroom already counts the pool once; the reference's sensitivity is twice that.
    reference::floor_gib(tokens) + (headroom_gib - reference::headroom_gib())
        - (reference::POOL_SENSITIVITY - 1.0) * (pool_gib - reference::POOL_GIB)
}

/// Largest prompt (tokens) whose predicted floor stays at or above `required_gib`.
fn tokens_for_floor(required_gib: f64, headroom_gib: f64, pool_gib: f64) -> u64 {
    let at_zero = floor_gib(0.0, headroom_gib, pool_gib);
    if at_zero < required_gib {
        return 0;
    }
    // The slope is negative: floor(t) = at_zero + slope·t.
    let t = (required_gib - at_zero) / reference::slope();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let t = if t.is_finite() && t > 0.0 { t.min(1e15) as u64 } else { 0 };
    t
}

pub(super) fn prefill_plan(input: &PlanInput, headroom: i64, tokens: Option<u64>) -> PrefillPlan {
    let central_gib = gib_i(headroom);
    // The verdict: more weights than estimated means less headroom, 1:1.
    let headroom_gib = central_gib - reference::gib(input.weights_band) * f64::from(ranks_per_node(input));
    let pool_gib = reference::gib(input.kv_cache_bytes);
    let oom_required = reference::death_floor_gib() + reference::SAFETY_MARGIN_GIB;
    let guard = input.guard_hard_floor.map(reference::gib);
    let (required, floor_limit) = match guard {
        Some(g) if g > oom_required => (g, PromptLimit::GuardHardFloor),
        _ => (oom_required, PromptLimit::PrefillFloor),
    };
    let by_floor = tokens_for_floor(required, headroom_gib, pool_gib);
    let mut limits = vec![(input.max_model_len, PromptLimit::MaxModelLen), (by_floor, floor_limit)];
    if let Some(t) = tokens {
        limits.push((t, PromptLimit::KvPool));
    }
    let (safe, limited_by) = limits.into_iter().min_by_key(|(t, _)| *t).unwrap_or((0, PromptLimit::PrefillFloor));
    #[allow(clippy::cast_precision_loss)]
    let at_max = floor_gib(input.max_model_len as f64, headroom_gib, pool_gib);
    #[allow(clippy::cast_precision_loss)]
    let central = floor_gib(input.max_model_len as f64, central_gib, pool_gib);
    PrefillPlan {
        floor_at_max_model_len: bytes_of(at_max),
        floor_central_at_max_model_len: bytes_of(central),
        required_floor: bytes_of(required),
        safe_max_prompt: safe,
        limited_by,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn death_row_sits_on_the_oom_floor() {
        // 3 GiB pool at 470k sits exactly on the derived OOM floor.
        let h = reference::headroom_gib() - 0.5;
        assert!((floor_gib(470_000.0, h, 3.0) - reference::death_floor_gib()).abs() < 1e-9);
    }
}
