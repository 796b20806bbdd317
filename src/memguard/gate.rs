//! After an engine kill: restart only when MemAvailable is back near the node's idle baseline
//! (GB10 returns unified memory "60+ seconds" after a kill; an immediate restart OOMs,
//! gb10-ops.md §1.3, §2.3). And the engine group's `oom_score_adj` must be 1000, so the kernel's
//! OOM killer takes vLLM rather than the host's daemons. Both verdicts are pure.

use serde::Serialize;

/// Default distance from the idle baseline at which a restart is allowed (gb10-ops.md §2.3: "within ~2 GiB").
pub const DEFAULT_TOLERANCE: u64 = 2 << 30;

/// The restart gate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum Gate {
    /// MemAvailable is within tolerance of the baseline.
    Open { mem_available: u64, baseline: u64 },
    /// Still waiting for memory to come back.
    Waiting { mem_available: u64, baseline: u64, missing: u64 },
}

/// The gate for a reading against an idle `baseline`.
#[must_use]
pub fn restart_gate(mem_available: u64, baseline: u64, tolerance: u64) -> Gate {
    let need = baseline.saturating_sub(tolerance);
    if mem_available >= need {
        Gate::Open { mem_available, baseline }
    } else {
        Gate::Waiting { mem_available, baseline, missing: need - mem_available }
    }
}

/// What the engine's processes have for `oom_score_adj`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomAdjCheck {
    pub ok: bool,
    /// `(pid, value)` of members whose value is not 1000 (or could not be read: `None`).
    pub wrong: Vec<(i32, Option<i32>)>,
    pub checked: usize,
}

/// The expected `oom_score_adj` of the engine group (set by the engine, `engine::embed`).
pub const ENGINE_OOM_SCORE_ADJ: i32 = 1000;

/// Check each member's `oom_score_adj` text (as read from `/proc/<pid>/oom_score_adj`).
#[must_use]
pub fn check_oom_score_adj(members: &[(i32, Option<&str>)]) -> OomAdjCheck {
    let wrong: Vec<(i32, Option<i32>)> = members
        .iter()
        .filter_map(|(pid, text)| {
            let v = text.and_then(|t| t.trim().parse::<i32>().ok());
            (v != Some(ENGINE_OOM_SCORE_ADJ)).then_some((*pid, v))
        })
        .collect();
    OomAdjCheck { ok: wrong.is_empty() && !members.is_empty(), wrong, checked: members.len() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn gate_opens_near_the_baseline_only() {
        assert_eq!(
            restart_gate(90 * GIB, 118 * GIB, DEFAULT_TOLERANCE),
            Gate::Waiting { mem_available: 90 * GIB, baseline: 118 * GIB, missing: 26 * GIB }
        );
        assert!(matches!(restart_gate(116 * GIB, 118 * GIB, DEFAULT_TOLERANCE), Gate::Open { .. }));
        assert!(matches!(restart_gate(GIB, GIB, 0), Gate::Open { .. }));
    }

    #[test]
    fn oom_score_adj_must_be_1000_on_every_member() {
        assert!(check_oom_score_adj(&[(1, Some("1000\n")), (2, Some("1000"))]).ok);
        let c = check_oom_score_adj(&[(1, Some("1000\n")), (2, Some("0\n")), (3, None)]);
        assert!(!c.ok);
        assert_eq!(c.wrong, vec![(2, Some(0)), (3, None)]);
        assert!(!check_oom_score_adj(&[]).ok);
    }
}
