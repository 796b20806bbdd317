//! The per-node memory plan (`spark-kit plan`): pure functions over numbers from the kit, the
//! checkpoint headers (weight budget) and, when run on a node, its measured memory.
//!
//! Per node: weights (per rank × ranks on the node) + KV pool + runtime overhead (CUDA context,
//! NCCL, graphs) + OS reserve, against the node's memory → headroom. The boot rule is the
//! reference kit's: MemAvailable ≥ weights + boot margin (reference-kit.md A.3 step 9). The
//! largest safe prompt comes from the reference kit's measured prefill floor (reference-kit.md D):
//! the MemAvailable floor comes during long prefill, each +0.5 GiB of KV pool costs ≈ 1 GiB of
//! it, and a 3 GiB pool died at ~470k tokens of a 600k prompt.
//!
//! A weight figure from modelled shapes (no files) carries an error band
//! ([`PlanInput::weights_band`]); the floor and the safe prompt use its pessimistic end.
//!
//! Every number that is not an input carries its source in [`Plan::assumptions`]; every warning
//! carries a fix.

use serde::Serialize;

pub mod kv;
pub mod long_context;
pub mod nccl;
mod prefill;
pub mod reference;
pub mod replay;
pub mod text;

use prefill::prefill_plan;
pub use prefill::{PrefillPlan, PromptLimit};

use crate::kit::bytes::{GIB, MIB};
use crate::kit::schema::{GuardPolicy, Kit};

/// A value the plan relies on and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assumption {
    pub name: String,
    pub value: String,
    pub source: String,
}

/// Something that will go wrong, and what to change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    pub node: Option<String>,
    pub message: String,
    pub fix: String,
}

/// One node as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeInput {
    pub name: String,
    /// Total memory (kit `memory_total`, or MemTotal measured on the node).
    pub memory_total: Option<u64>,
    /// Where `memory_total` came from.
    pub memory_source: String,
    /// MemAvailable measured on the node now, if `plan` runs there.
    pub mem_available: Option<u64>,
}

/// Everything the planner needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanInput {
    /// Weights on the largest rank (from the weight budget).
    pub weights_per_rank: u64,
    /// Where that number came from (a checkpoint directory, a virtual checkpoint, …).
    pub weights_source: String,
    /// ± bytes of uncertainty of `weights_per_rank` (0 when read from checkpoint headers).
    pub weights_band: u64,
    pub tensor_parallel_size: u32,
    pub nodes: Vec<NodeInput>,
    /// KV pool per rank (`--kv-cache-memory-bytes`).
    pub kv_cache_bytes: u64,
    /// KV bytes per token (0 = unknown); may be fractional.
    pub kv_bytes_per_token: f64,
    /// Where `kv_bytes_per_token` came from.
    pub kv_bytes_source: String,
    /// KV block size in tokens: the pool holds whole blocks.
    pub block_size: u32,
    pub max_model_len: u64,
    /// Per rank.
    pub runtime_overhead: u64,
    /// Per node.
    pub os_reserve: u64,
    pub boot_margin: u64,
    /// The memory guard's hard floor, `None` when the guard is off.
    pub guard_hard_floor: Option<u64>,
}

/// The KV pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvPlan {
    pub pool_bytes: u64,
    pub bytes_per_token: f64,
    pub block_size: u32,
    /// Whole blocks of `block_size` tokens that fit (None when bytes per token is unknown).
    pub tokens: Option<u64>,
}

/// The boot margin check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootCheck {
    /// Weights on the node + boot margin.
    pub required_mem_available: u64,
    pub mem_available: u64,
    /// `measured` or how it was estimated.
    pub mem_available_source: String,
    pub ok: bool,
}

/// One node's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodePlan {
    pub name: String,
    pub ranks: u32,
    pub memory_total: Option<u64>,
    pub memory_source: String,
    pub weights: u64,
    pub kv_pool: u64,
    pub runtime_overhead: u64,
    pub os_reserve: u64,
    /// weights + kv_pool + runtime_overhead + os_reserve.
    pub committed: u64,
    /// memory_total − committed (None when the memory is unknown).
    pub headroom: Option<i64>,
    pub boot: Option<BootCheck>,
    pub prefill: Option<PrefillPlan>,
}

/// One class of weights the engine serves dense although the checkpoint packs it (what that
/// costs on the largest rank; `checkpoint::reconcile`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DenseLine {
    pub class: String,
    /// The vLLM layer that holds it.
    pub vllm_layer: String,
    /// `split` over the ranks or `replicated` on each.
    pub split: String,
    pub exl3_per_rank: u64,
    pub dense_per_rank: u64,
    pub extra_per_rank: u64,
}

/// The whole plan (`spark-kit plan --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// What the engine runs (`Kit::engine_line`): the vLLM release and the runtime.
    pub engine: String,
    /// Weights on the largest rank, the classes served dense at load included.
    pub weights_per_rank: u64,
    pub weights_source: String,
    /// ± bytes of `weights_per_rank` (0 = read from files).
    pub weights_band: u64,
    pub tensor_parallel_size: u32,
    pub kv: KvPlan,
    pub max_model_len: u64,
    pub nodes: Vec<NodePlan>,
    pub assumptions: Vec<Assumption>,
    pub warnings: Vec<Warning>,
    /// Classes the checkpoint packs that the engine serves dense (their extra is in
    /// `weights_per_rank`); empty for models without such classes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dense_at_load: Vec<DenseLine>,
    /// The 1M-token question for each KV record (kits whose model has a 1M window).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub long_context: Vec<long_context::ContextAnswer>,
}

/// Signed bytes → GiB.
#[allow(clippy::cast_precision_loss)]
#[must_use]
pub fn gib_i(bytes: i64) -> f64 {
    bytes as f64 / GIB as f64
}

/// GiB → bytes, rounded toward zero; saturates far outside any real memory size.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
fn bytes_of(gib: f64) -> i64 {
    (gib * GIB as f64) as i64
}

fn fmt_gib(bytes: u64) -> String {
    format!("{:.2} GiB", reference::gib(bytes))
}

fn fmt_gib_i(bytes: i64) -> String {
    format!("{:.2} GiB", gib_i(bytes))
}

/// Planner input from a kit: node memory from the kit (or measured, via `measured`:
/// `(node name, MemTotal, MemAvailable)`), weights from a budget.
#[must_use]
pub fn input_from_kit(
    kit: &Kit,
    weights_per_rank: u64,
    weights_source: impl Into<String>,
    measured: &[(String, u64, u64)],
) -> PlanInput {
    let node_input = |name: &str, kit_total: Option<u64>| {
        let m = measured.iter().find(|(n, _, _)| n == name);
        let (memory_total, memory_source) = match (m, kit_total) {
            (Some((_, total, _)), _) => (Some(*total), "measured: /proc/meminfo MemTotal".to_string()),
            (None, Some(t)) => (Some(t), "kit: nodes[].memory_total".to_string()),
            (None, None) => (None, "unknown: the kit sets no nodes[].memory_total".to_string()),
        };
        NodeInput { name: name.to_string(), memory_total, memory_source, mem_available: m.map(|(_, _, a)| *a) }
    };
    let nodes = if kit.nodes.is_empty() {
        vec![node_input("local", None)]
    } else {
        kit.nodes.iter().map(|n| node_input(&n.name, n.memory_total.map(|b| b.bytes()))).collect()
    };
    PlanInput {
        weights_per_rank,
        weights_source: weights_source.into(),
        weights_band: 0,
        tensor_parallel_size: kit.tensor_parallel_size,
        nodes,
        kv_cache_bytes: kit.engine.kv_cache_bytes.bytes(),
        kv_bytes_per_token: kit.engine.kv_bytes_per_token,
        kv_bytes_source: "kit: engine.kv_bytes_per_token".into(),
        block_size: kit.engine.block_size,
        max_model_len: kit.engine.max_model_len,
        runtime_overhead: kit.memory.runtime_overhead.bytes(),
        os_reserve: kit.memory.os_reserve.bytes(),
        boot_margin: kit.memory.boot_margin.bytes(),
        guard_hard_floor: (kit.memory.guard.policy != GuardPolicy::Off).then(|| kit.memory.guard.hard_floor.bytes()),
    }
}

/// `(MemTotal, MemAvailable)` in bytes from the text of `/proc/meminfo` (`None` if MemTotal,
/// MemFree or MemAvailable is missing).
#[must_use]
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    // One /proc/meminfo parser for the crate: the memory guard's (allocation-free).
    crate::memguard::meminfo::parse(text.as_bytes()).map(|m| (m.mem_total, m.mem_available))
}

/// Bytes of one KV block: `ceil(bytes_per_token × block_size)` (None when unknown).
#[must_use]
pub fn kv_block_bytes(bytes_per_token: f64, block_size: u32) -> Option<u64> {
    if !(bytes_per_token.is_finite() && bytes_per_token > 0.0) || block_size == 0 {
        return None;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // positive, finite, far below 2^53
    let per_block = (bytes_per_token * f64::from(block_size)).ceil() as u64;
    Some(per_block)
}

/// KV tokens in a pool: whole blocks, as vLLM allocates them (None when bytes per token is unknown).
#[must_use]
pub fn kv_tokens(pool_bytes: u64, bytes_per_token: f64, block_size: u32) -> Option<u64> {
    let per_block = kv_block_bytes(bytes_per_token, block_size)?;
    Some(pool_bytes / per_block * u64::from(block_size))
}

/// The sources every plan relies on.
fn base_assumptions(input: &PlanInput) -> Vec<Assumption> {
    let a = |name: &str, value: String, source: &str| Assumption {
        name: name.to_string(),
        value,
        source: source.to_string(),
    };
    vec![
        a("weights per rank", fmt_gib(input.weights_per_rank), &input.weights_source),
        a(
            "weights error band",
            format!("± {}", fmt_gib(input.weights_band)),
            if input.weights_band == 0 {
                "none: tensor bytes read from checkpoint headers"
            } else {
                "modelled shapes, not files: ±0.5 % of the per-rank weights; floor and safe prompt use weights + band"
            },
        ),
        a("KV pool per rank", fmt_gib(input.kv_cache_bytes), "kit: engine.kv_cache_bytes"),
        a("KV bytes per token", input.kv_bytes_per_token.to_string(), &input.kv_bytes_source),
        a("runtime overhead per rank", fmt_gib(input.runtime_overhead), "kit: memory.runtime_overhead (reference-kit.md D: context/NCCL/graphs ~5–7 GiB)"),
        a("OS reserve per node", fmt_gib(input.os_reserve), "kit: memory.os_reserve (reference-kit.md D: processes/OS/desktop ~9 GiB)"),
        a("boot margin", fmt_gib(input.boot_margin), "kit: memory.boot_margin; rule MemAvailable ≥ weights + margin (reference-kit.md A.3 step 9)"),
        a(
            "prefill floor vs prompt",
            format!("{:.2} GiB at 455k, {:.2} GiB at 601k tokens, linear", reference::FLOOR_A.1, reference::FLOOR_B.1),
            "reference-kit.md D: head MemAvailable long-prefill floor, DeepSeek V4.1 Flash TP2 on GB10, 2.5 GiB pool",
        ),
        a(
            "prefill floor vs KV pool",
            format!("−{:.1} GiB of floor per +1 GiB of pool", reference::POOL_SENSITIVITY),
            "reference-kit.md D: +0.5 GiB pool ≈ −1 GiB prefill margin",
        ),
        a(
            "OOM floor",
            format!("{:.2} GiB", reference::death_floor_gib()),
            "derived from reference-kit.md D: a 3 GiB pool died at ~470k of a 600k prompt",
        ),
        a(
            "safety margin above the OOM floor",
            format!("{:.2} GiB", reference::SAFETY_MARGIN_GIB),
            "spark-kit: half the 1 GiB swing of +0.5 GiB pool (run-to-run variance)",
        ),
        a(
            "reference headroom",
            format!("{:.2} GiB", reference::headroom_gib()),
            "reference-kit.md D: 121.7 − 99.5 weights − 2.5 KV − ~6 runtime − ~9 OS; other headroom shifts the floor 1:1",
        ),
    ]
}

/// Ranks on each node: tensor parallel size over the nodes, rounded up.
fn ranks_per_node(input: &PlanInput) -> u32 {
    let node_count = u32::try_from(input.nodes.len()).unwrap_or(u32::MAX).max(1);
    input.tensor_parallel_size.max(1).div_ceil(node_count)
}

/// Build the plan.
#[must_use]
pub fn plan(input: &PlanInput) -> Plan {
    let mut warnings = Vec::new();
    let warn =
        |node: Option<&str>, message: String, fix: String| Warning { node: node.map(str::to_string), message, fix };
    let tp = input.tensor_parallel_size.max(1);
    let node_count = u32::try_from(input.nodes.len()).unwrap_or(u32::MAX).max(1);
    let ranks = ranks_per_node(input);
    if tp % node_count != 0 {
        warnings.push(warn(
            None,
            format!(
                "tensor_parallel_size {tp} is not a multiple of the {node_count} nodes; planned {ranks} ranks per node"
            ),
            "set tensor_parallel_size to a multiple of the number of nodes".into(),
        ));
    }
    let tokens = kv_tokens(input.kv_cache_bytes, input.kv_bytes_per_token, input.block_size);
    match tokens {
        None => warnings.push(warn(
            None,
            "KV bytes per token unknown: cannot size the KV pool in tokens or bound the prompt by it".into(),
            "set engine.kv_bytes_per_token (the KV cache bytes per token of the model at this block size; `spark-kit plan` derives it for the DeepSeek V4.1 Flash kit)".into(),
        )),
        Some(t) if t < input.max_model_len => {
            let per_block = kv_block_bytes(input.kv_bytes_per_token, input.block_size).unwrap_or(0);
            let block = u64::from(input.block_size.max(1));
            let need = input.max_model_len.div_ceil(block).saturating_mul(per_block);
            warnings.push(warn(
                None,
                format!("the KV pool holds {t} tokens, fewer than max_model_len {}", input.max_model_len),
                format!(
                    "raise engine.kv_cache_bytes to at least {need} ({}) or lower engine.max_model_len to {t}",
                    fmt_gib(need)
                ),
            ));
        }
        Some(_) => {}
    }

    let nodes = input
        .nodes
        .iter()
        .map(|n| {
            let r = u64::from(ranks);
            let weights = input.weights_per_rank.saturating_mul(r);
            let kv_pool = input.kv_cache_bytes.saturating_mul(r);
            let runtime_overhead = input.runtime_overhead.saturating_mul(r);
            let committed =
                weights.saturating_add(kv_pool).saturating_add(runtime_overhead).saturating_add(input.os_reserve);
            let headroom = n
                .memory_total
                .map(|t| i64::try_from(t).unwrap_or(i64::MAX) - i64::try_from(committed).unwrap_or(i64::MAX));
            let boot = n.memory_total.map(|total| {
                let required = weights.saturating_add(input.boot_margin);
                let (available, source) = match n.mem_available {
                    Some(a) => (a, "measured: /proc/meminfo MemAvailable".to_string()),
                    None => {
                        (total.saturating_sub(input.os_reserve), "estimated: memory_total − os_reserve".to_string())
                    }
                };
                BootCheck {
                    required_mem_available: required,
                    mem_available: available,
                    mem_available_source: source,
                    ok: available >= required,
                }
            });
            let prefill = headroom.map(|h| prefill_plan(input, h, tokens));
            node_warnings(input, n, weights, headroom, boot.as_ref(), prefill.as_ref(), &mut warnings);
            NodePlan {
                name: n.name.clone(),
                ranks,
                memory_total: n.memory_total,
                memory_source: n.memory_source.clone(),
                weights,
                kv_pool,
                runtime_overhead,
                os_reserve: input.os_reserve,
                committed,
                headroom,
                boot,
                prefill,
            }
        })
        .collect();

    Plan {
        engine: String::new(),
        weights_per_rank: input.weights_per_rank,
        weights_source: input.weights_source.clone(),
        weights_band: input.weights_band,
        tensor_parallel_size: tp,
        kv: KvPlan {
            pool_bytes: input.kv_cache_bytes,
            bytes_per_token: input.kv_bytes_per_token,
            block_size: input.block_size,
            tokens,
        },
        max_model_len: input.max_model_len,
        nodes,
        assumptions: base_assumptions(input),
        warnings,
        dense_at_load: Vec::new(),
        long_context: Vec::new(),
    }
}

fn node_warnings(
    input: &PlanInput,
    n: &NodeInput,
    weights: u64,
    headroom: Option<i64>,
    boot: Option<&BootCheck>,
    prefill: Option<&PrefillPlan>,
    out: &mut Vec<Warning>,
) {
    let node = Some(n.name.clone());
    let Some(headroom) = headroom else {
        out.push(Warning {
            node,
            message: "node memory unknown: no headroom, boot check or prompt limit".into(),
            fix: format!("set memory_total for node `{}` in the kit, or run `spark-kit plan` on that node", n.name),
        });
        return;
    };
    if headroom < 0 {
        out.push(Warning {
            node: node.clone(),
            message: format!("planned use exceeds the node's memory by {}", fmt_gib_i(-headroom)),
            fix: format!(
                "free {}: lower engine.kv_cache_bytes or memory.runtime_overhead, use a smaller quant, or add nodes",
                fmt_gib_i(-headroom)
            ),
        });
    }
    if let Some(b) = boot.filter(|b| !b.ok) {
        out.push(Warning {
            node: node.clone(),
            message: format!(
                "MemAvailable {} < weights {} + boot margin {} = {} ({})",
                fmt_gib(b.mem_available),
                fmt_gib(weights),
                fmt_gib(input.boot_margin),
                fmt_gib(b.required_mem_available),
                b.mem_available_source
            ),
            fix: format!(
                "free {} on the node before boot (stop other containers/processes, drop page cache)",
                fmt_gib(b.required_mem_available - b.mem_available)
            ),
        });
    }
    if let Some(p) = prefill.filter(|p| p.floor_at_max_model_len < p.required_floor) {
        let short = p.required_floor - p.floor_at_max_model_len;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let pool_cut = ((gib_i(short) / reference::POOL_SENSITIVITY) * 1024.0).ceil().max(1.0) as u64 * MIB;
        let why = if p.limited_by == PromptLimit::GuardHardFloor {
            "the memory guard's hard floor"
        } else {
            "the OOM floor + safety margin"
        };
        out.push(Warning {
            node,
            message: format!(
                "a {}-token prefill is predicted to take MemAvailable down to {}{}, below {} ({why}); {}",
                input.max_model_len,
                fmt_gib_i(p.floor_at_max_model_len),
                if input.weights_band > 0 {
                    format!(
                        " (pessimistic end of the weight band; central {})",
                        fmt_gib_i(p.floor_central_at_max_model_len)
                    )
                } else {
                    String::new()
                },
                fmt_gib_i(p.required_floor),
                if p.safe_max_prompt > 0 {
                    format!("prompts are safe up to {} tokens", p.safe_max_prompt)
                } else {
                    "no prompt length is safe with this pool".to_string()
                }
            ),
            fix: {
                let guard = if p.limited_by == PromptLimit::GuardHardFloor {
                    ", or lower memory.guard.hard_floor"
                } else {
                    ""
                };
                let pool = match input.kv_cache_bytes.checked_sub(pool_cut).filter(|b| *b >= MIB) {
                    Some(left) => format!(
                        "shrink engine.kv_cache_bytes by {} (`--set engine.kv_cache_bytes={}MiB`; each 0.5 GiB less raises the floor ~1 GiB)",
                        fmt_gib(pool_cut),
                        left / MIB
                    ),
                    None => "free memory on the node: even a KV pool of 1 MiB leaves the floor too low".to_string(),
                };
                let files = if input.weights_band > 0 && p.floor_central_at_max_model_len >= p.required_floor {
                    "; only the band's pessimistic end is short: once the model files are downloaded, the plan reads the weights from their headers (no band) and decides on their figure"
                } else {
                    ""
                };
                if p.safe_max_prompt > 0 {
                    format!("lower engine.max_model_len to {}, or {pool}{guard}{files}", p.safe_max_prompt)
                } else {
                    format!("{pool}{guard} (no prompt is safe with this pool){files}")
                }
            },
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn meminfo() {
        let text = "MemTotal:       127601076 kB\nMemFree:         1000 kB\nMemAvailable:   4264000 kB\n";
        assert_eq!(parse_meminfo(text), Some((127_601_076 * 1024, 4_264_000 * 1024)));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn kv_tokens_are_whole_blocks() {
        // 3466.3 B/token × 64 = 221,843.2 → 221,844 B/block; 2.5 GiB holds 12,100 blocks.
        assert_eq!(kv_block_bytes(3466.3, 64), Some(221_844));
        assert_eq!(kv_tokens(2_684_354_560, 3466.3, 64), Some(774_400));
        assert_eq!(kv_tokens(10, 0.0, 64), None);
        assert_eq!(kv_tokens(1000, 1.0, 16), Some(992));
    }
}
