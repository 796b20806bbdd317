//! Replays the reference kit's measured runs ([`MEASURED_ROWS`]) through the planner: what the
//! plan predicts for each, and whether it would have approved it. `tests/cli/plan_table.rs` fails if
//! a run the reference saw die is approved; docs/plan.md shows the table this renders.

use std::fmt::Write as _;

use serde::Serialize;

use super::reference::{gib, MeasuredRow, Outcome, MEASURED_ROWS};
use super::{plan, PlanInput};
use crate::kit::bytes::GIB;

/// The plan's verdict on one measured run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replayed {
    pub row: MeasuredRow,
    /// Predicted MemAvailable floor at the run's prompt length, GiB: pessimistic end (verdict).
    pub floor_gib: f64,
    /// The same from the central weight estimate.
    pub floor_central_gib: f64,
    /// The floor the prefill must stay above, GiB.
    pub required_gib: f64,
    /// Largest prompt the plan calls safe with this pool (prefill floor only).
    pub safe_prompt: u64,
    /// The plan would let this run happen: `safe_prompt >= row.tokens`.
    pub approved: bool,
}

#[allow(clippy::cast_precision_loss)]
fn gib_i(b: i64) -> f64 {
    b as f64 / GIB as f64
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn pool_bytes(pool_gib: f64) -> u64 {
    (pool_gib * GIB as f64).round() as u64
}

/// One run through the planner, on `base` (weights, nodes, overheads) with the run's pool. The
/// first node's verdict is reported (the head: the floor is measured there).
#[must_use]
pub fn replay_row(base: &PlanInput, row: &MeasuredRow) -> Option<Replayed> {
    let mut at_row = base.clone();
    at_row.kv_cache_bytes = pool_bytes(row.pool_gib);
    at_row.max_model_len = row.tokens;
    // The KV pool's own token limit is not what the rows measure.
    at_row.kv_bytes_per_token = 0.0;
    let p = plan(&at_row);
    let pre = p.nodes.first()?.prefill.clone()?;
    let mut open = at_row.clone();
    open.max_model_len = u64::from(u32::MAX);
    let safe = plan(&open).nodes.first()?.prefill.as_ref()?.safe_max_prompt;
    Some(Replayed {
        row: *row,
        floor_gib: gib_i(pre.floor_at_max_model_len),
        floor_central_gib: gib_i(pre.floor_central_at_max_model_len),
        required_gib: gib_i(pre.required_floor),
        safe_prompt: safe,
        approved: safe >= row.tokens,
    })
}

/// Every measured run through the planner.
#[must_use]
pub fn replay(base: &PlanInput) -> Vec<Replayed> {
    MEASURED_ROWS.iter().filter_map(|r| replay_row(base, r)).collect()
}

/// The Markdown table of `replays` under `title` (inputs described by `inputs`).
#[must_use]
pub fn markdown(title: &str, base: &PlanInput, replays: &[Replayed]) -> String {
    let mut s = String::new();
    let band = if base.weights_band > 0 { format!(" ± {:.2}", gib(base.weights_band)) } else { String::new() };
    let _ = writeln!(
        s,
        "{title}: weights {:.2}{band} GiB/rank, node memory {:.2} GiB, runtime {:.2} + OS {:.2} GiB.\n",
        gib(base.weights_per_rank),
        base.nodes.first().and_then(|n| n.memory_total).map_or(0.0, gib),
        gib(base.runtime_overhead),
        gib(base.os_reserve)
    );
    let _ =
        writeln!(s, "| pool | prompt | reference saw | predicted floor (central) | must stay ≥ | safe prompt | plan |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for r in replays {
        let saw = match (r.row.outcome, r.row.floor_gib) {
            (Outcome::Alive, Some(f)) => format!("alive, floor {f:.2} GiB"),
            (Outcome::Alive, None) => "alive".into(),
            (Outcome::Died, _) => "died".into(),
            (Outcome::Unmeasured, _) => "not run".into(),
        };
        let _ = writeln!(
            s,
            "| {:.1} GiB | {}k | {saw} | {:.2} GiB ({:.2}) | {:.2} GiB | {} | {} |",
            r.row.pool_gib,
            r.row.tokens / 1000,
            r.floor_gib,
            r.floor_central_gib,
            r.required_gib,
            r.safe_prompt,
            if r.approved { "approves" } else { "refuses" }
        );
    }
    s
}

/// A two-node plan input with the reference's memory, pool and overheads (tests).
#[cfg(test)]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(crate) fn test_input(weights_gib: f64, band_gib: f64) -> super::PlanInput {
    let b = |g: f64| (g * GIB as f64) as u64;
    PlanInput {
        weights_per_rank: b(weights_gib),
        weights_source: "test".into(),
        weights_band: b(band_gib),
        tensor_parallel_size: 2,
        nodes: ["a", "b"]
            .iter()
            .map(|n| super::NodeInput {
                name: (*n).into(),
                memory_total: Some(b(121.7)),
                memory_source: "test".into(),
                mem_available: None,
            })
            .collect(),
        kv_cache_bytes: b(2.5),
        kv_bytes_per_token: 0.0,
        kv_bytes_source: "test".into(),
        block_size: 64,
        max_model_len: 600_000,
        runtime_overhead: b(6.0),
        os_reserve: b(9.0),
        boot_margin: b(12.0),
        guard_hard_floor: None,
    }
}

#[cfg(test)]
mod tests {
    use super::test_input as input;
    use super::*;

    #[test]
    fn the_old_underestimate_approved_the_dead_run_and_the_band_refuses_it() {
        // 97.81 GiB/rank (the one-block model, no band): every row approved, the dead one too.
        let old = replay(&input(97.81, 0.0));
        assert!(old.iter().all(|r| r.approved), "{old:#?}");
        // The measured 99.5: only the live rows.
        let m = replay(&input(99.5, 0.0));
        assert_eq!(m.iter().map(|r| r.approved).collect::<Vec<_>>(), [true, true, false, false]);
        // A band moves the verdict to the pessimistic end; the central floor is unchanged.
        let banded = replay(&input(99.5, 0.5));
        assert!((banded[1].floor_central_gib - m[1].floor_gib).abs() < 1e-6);
        assert!((m[1].floor_gib - banded[1].floor_gib - 0.5).abs() < 1e-6);
        assert!(!banded[1].approved);
        let md = markdown("t", &input(99.5, 0.5), &banded);
        assert!(md.contains("| 3.0 GiB | 470k | died |") && md.contains("refuses"), "{md}");
    }
}
