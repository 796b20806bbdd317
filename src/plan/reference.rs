//! The reference kit's measurements the prefill model is calibrated on (reference-kit.md D), and
//! the measured runs the plan is replayed against (`tests/cli/plan_table.rs`, docs/plan.md).

use crate::kit::bytes::GIB;

/// "Memory per node (121.7 GiB)".
pub const MEMORY_GIB: f64 = 121.7;
/// "weights/rank 99.5 GiB".
pub const WEIGHTS_GIB: f64 = 99.5;
/// "KV 2.5" GiB pool.
pub const POOL_GIB: f64 = 2.5;
/// "context/NCCL/graphs ~5–7" GiB: midpoint.
pub const OVERHEAD_GIB: f64 = 6.0;
/// "processes/OS/desktop ~9" GiB.
pub const OS_GIB: f64 = 9.0;
/// "long-prefill floor 2.56 at 455k / 2.1 at 601k" (head MemAvailable, GiB).
pub const FLOOR_A: (f64, f64) = (455_000.0, 2.56);
pub const FLOOR_B: (f64, f64) = (601_000.0, 2.10);
/// "+0.5 GiB pool ≈ −1 GiB prefill margin": GiB of floor lost per GiB of pool.
pub const POOL_SENSITIVITY: f64 = 2.0;
/// "A 3 GiB pool dies at ~470k of 600k".
pub const DEATH_POOL_GIB: f64 = 3.0;
pub const DEATH_TOKENS: f64 = 470_000.0;
/// spark-kit's margin above the derived OOM floor: half the swing that +0.5 GiB of pool causes.
pub const SAFETY_MARGIN_GIB: f64 = 0.5;
/// "fp8_ds_mla 774,400 tokens in 2.5 GiB" at block 64: the check of the KV model.
pub const KV_TOKENS_IN_POOL: u64 = 774_400;

/// Planned headroom of the reference configuration.
#[must_use]
pub fn headroom_gib() -> f64 {
    MEMORY_GIB - WEIGHTS_GIB - POOL_GIB - OVERHEAD_GIB - OS_GIB
}

/// Slope of the floor with prompt length, GiB per token.
#[must_use]
pub fn slope() -> f64 {
    (FLOOR_B.1 - FLOOR_A.1) / (FLOOR_B.0 - FLOOR_A.0)
}

/// Floor of the reference configuration at `tokens`, GiB.
#[must_use]
pub fn floor_gib(tokens: f64) -> f64 {
    FLOOR_A.1 + slope() * (tokens - FLOOR_A.0)
}

/// The floor at which the 3 GiB pool died (GiB): the reference floor at ~470k, less the pool effect.
#[must_use]
pub fn death_floor_gib() -> f64 {
    floor_gib(DEATH_TOKENS) - POOL_SENSITIVITY * (DEATH_POOL_GIB - POOL_GIB)
}

#[allow(clippy::cast_precision_loss)]
#[must_use]
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

/// What happened in a measured run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Served the prompt; `floor_gib` is the lowest MemAvailable seen.
    Alive,
    /// The node ran out of memory during the prefill.
    Died,
    /// Not measured: the plan's prediction is all there is.
    Unmeasured,
}

/// One measured run of the reference kit (DeepSeek V4.1 Flash EXL3, TP2 on 2× GB10).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MeasuredRow {
    /// KV pool per rank, GiB (`--kv-cache-memory-bytes`).
    pub pool_gib: f64,
    /// Prompt length the run reached (alive) or died at.
    pub tokens: u64,
    pub outcome: Outcome,
    /// Lowest head MemAvailable measured, GiB (alive runs).
    pub floor_gib: Option<f64>,
    /// Where the row comes from.
    pub source: &'static str,
}

/// The reference kit's measured long-prefill runs (reference-kit.md D, "Memory per node"), plus
/// the 3.5 GiB pool nobody ran, for which only the plan speaks.
pub const MEASURED_ROWS: [MeasuredRow; 4] = [
    MeasuredRow {
        pool_gib: 2.5,
        tokens: 455_000,
        outcome: Outcome::Alive,
        floor_gib: Some(2.56),
        source: "reference-kit.md D: long-prefill floor 2.56 at 455k",
    },
    MeasuredRow {
        pool_gib: 2.5,
        tokens: 601_000,
        outcome: Outcome::Alive,
        floor_gib: Some(2.10),
        source: "reference-kit.md D: long-prefill floor 2.1 at 601k",
    },
    MeasuredRow {
        pool_gib: 3.0,
        tokens: 470_000,
        outcome: Outcome::Died,
        floor_gib: None,
        source: "reference-kit.md D: a 3 GiB pool dies at ~470k of 600k",
    },
    MeasuredRow {
        pool_gib: 3.5,
        tokens: 470_000,
        outcome: Outcome::Unmeasured,
        floor_gib: None,
        source: "not measured (+0.5 GiB past the pool that died)",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_model_reproduces_its_own_anchors() {
        assert!((floor_gib(455_000.0) - 2.56).abs() < 1e-9);
        assert!((floor_gib(601_000.0) - 2.10).abs() < 1e-9);
        // Empty-prompt floor ≈ MemAvailable after warm-up (4.07–4.21 GiB, reference-kit.md D).
        let idle = floor_gib(0.0);
        assert!((3.9..4.3).contains(&idle), "{idle}");
        assert!((death_floor_gib() - 1.5127).abs() < 1e-3, "{}", death_floor_gib());
    }
}
