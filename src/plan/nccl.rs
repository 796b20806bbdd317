//! NCCL's pinned host memory in the plan's runtime overhead. On GB10 pinned host memory is the
//! same pool the weights and the KV cache come from. NCCL's proxy pins its send/receive buffers
//! per connection and channel for the communicator's lifetime (~9.19 MiB each at the defaults,
//! tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark#8, where `NCCL_BUFFSIZE` alone freed ~2.6 GiB);
//! the reference kit's buffer knobs took it from 4.7 to 0.14 GiB per node (reference-kit.md
//! A.2). `memory.runtime_overhead` (the reference's "context/NCCL/graphs ~5–7 GiB") was measured
//! with those knobs set, so a cross-node kit without them needs the difference on top.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::kit::bytes::MIB;

/// The knobs and the values the reference measured with (reference-kit.md A.2).
pub const KNOBS: [(&str, &str); 4] = [
    ("NCCL_BUFFSIZE", "1048576"),
    ("NCCL_LL128_BUFFSIZE", "262144"),
    ("NCCL_PROTO", "^LL128"),
    ("NCCL_MAX_NCHANNELS", "8"),
];
/// Pinned NCCL memory per node at NCCL's defaults, and with [`KNOBS`] (reference-kit.md A.2:
/// "pinned 4.7 → 0.14 GiB").
pub const PINNED_DEFAULT: u64 = 4813 * MIB;
pub const PINNED_WITH_KNOBS: u64 = 143 * MIB;

/// What the kit's NCCL environment costs on top of `memory.runtime_overhead`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NcclMemory {
    /// Pinned bytes per node the plan assumes.
    pub pinned_bytes: u64,
    /// Bytes added to the runtime overhead per rank (0 when the kit sets every knob, or a single
    /// node has no cross-node connection).
    pub extra_bytes: u64,
    /// Knobs the kit does not set to a value at most the reference's.
    pub missing: Vec<&'static str>,
}

/// Whether `value` of `knob` is at most the reference's (a buffer or channel count no larger;
/// the protocol exactly `^LL128`).
fn at_most(knob: &str, value: &str, reference: &str) -> bool {
    match (value.trim().parse::<u64>(), reference.parse::<u64>()) {
        (Ok(v), Ok(r)) => v <= r,
        _ => knob == "NCCL_PROTO" && value.trim() == reference,
    }
}

/// NCCL's pinned memory for a kit with `env` (engine.extra_env) across `nodes` nodes.
#[must_use]
pub fn memory(env: &BTreeMap<String, String>, nodes: usize) -> NcclMemory {
    if nodes < 2 {
        return NcclMemory { pinned_bytes: 0, extra_bytes: 0, missing: Vec::new() };
    }
    let missing: Vec<&'static str> =
        KNOBS.iter().filter(|(k, r)| !env.get(*k).is_some_and(|v| at_most(k, v, r))).map(|(k, _)| *k).collect();
    if missing.is_empty() {
        NcclMemory { pinned_bytes: PINNED_WITH_KNOBS, extra_bytes: 0, missing }
    } else {
        NcclMemory { pinned_bytes: PINNED_DEFAULT, extra_bytes: PINNED_DEFAULT - PINNED_WITH_KNOBS, missing }
    }
}

/// The `--set` arguments that give the kit the reference's knobs.
#[must_use]
pub fn fix(missing: &[&str]) -> String {
    KNOBS
        .iter()
        .filter(|(k, _)| missing.contains(k))
        .map(|(k, v)| format!("--set engine.extra_env.{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
    }

    #[test]
    fn the_reference_knobs_cost_nothing_extra() {
        let m = memory(&env(&KNOBS), 2);
        assert_eq!((m.pinned_bytes, m.extra_bytes), (PINNED_WITH_KNOBS, 0));
        // Smaller buffers are fine too.
        let smaller =
            memory(&env(&[KNOBS[0], ("NCCL_LL128_BUFFSIZE", "122880"), KNOBS[2], ("NCCL_MAX_NCHANNELS", "4")]), 2);
        assert_eq!(smaller.extra_bytes, 0);
    }

    #[test]
    fn a_missing_or_larger_knob_costs_the_default_pinning() {
        let m = memory(&env(&[KNOBS[0], KNOBS[1], KNOBS[2], ("NCCL_MAX_NCHANNELS", "32")]), 2);
        assert_eq!(m.missing, ["NCCL_MAX_NCHANNELS"]);
        assert_eq!(m.extra_bytes, PINNED_DEFAULT - PINNED_WITH_KNOBS);
        assert_eq!(fix(&m.missing), "--set engine.extra_env.NCCL_MAX_NCHANNELS=8");
        assert_eq!(memory(&env(&[]), 2).missing.len(), 4);
    }

    #[test]
    fn one_node_has_no_proxy_connections() {
        assert_eq!(memory(&env(&[]), 1).extra_bytes, 0);
    }
}
