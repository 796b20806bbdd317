//! The guard's events as human lines (`spark-kit guard` prints one per event).

use super::GuardEvent;

#[allow(clippy::cast_precision_loss)]
fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// One event as a line for a terminal or a log (`spark-kit guard` without `--json`).
#[must_use]
pub fn line(e: &GuardEvent) -> String {
    match e {
        GuardEvent::Started { node, policy, soft_floor, hard_floor, mem_available, psi, memory_locked, receipts, .. } => {
            format!(
                "guard on {node}: policy {policy}, soft {} / hard {}, MemAvailable {}; PSI trigger: {psi}; memory locked: {memory_locked}; receipts in {}",
                gib(*soft_floor),
                gib(*hard_floor),
                gib(*mem_available),
                receipts.display()
            )
        }
        GuardEvent::Note { message } => format!("note: {message}"),
        GuardEvent::OomScoreAdj { pgid, check } if check.ok => {
            format!("engine group {pgid}: oom_score_adj 1000 on all {} process(es)", check.checked)
        }
        GuardEvent::OomScoreAdj { pgid, check } => format!(
            "warning: engine group {pgid}: oom_score_adj is not 1000 on {:?}; the kernel may kill host daemons first",
            check.wrong
        ),
        GuardEvent::SoftFloor { mem_available, growers, cache_dropped, .. } => format!(
            "warning: MemAvailable {} under the soft floor; dropped the page cache of {cache_dropped} model file(s); top growers: {}",
            gib(*mem_available),
            growers.iter().map(|g| format!("{} ({}) +{}", g.comm.as_str(), g.pid, gib(g.grown))).collect::<Vec<_>>().join(", ")
        ),
        GuardEvent::Acting { decision, reason, signal, reaction_ms, .. } => {
            format!("ACTION {decision}: {signal} sent {reaction_ms:.1} ms after the crossing — {reason}")
        }
        GuardEvent::Acted { decision, gone, ms, receipt, error } => format!(
            "{decision}: {} after {ms:.0} ms; receipt {}{}",
            if *gone { "victim gone" } else { "victim STILL ALIVE" },
            receipt.as_ref().map_or_else(|| "not written".to_string(), |p| p.display().to_string()),
            error.as_ref().map_or_else(String::new, |e| format!(" ({e})"))
        ),
        GuardEvent::NoAction { decision, mem_available, .. } => {
            format!("warning: MemAvailable {} under the hard floor: {decision}", gib(*mem_available))
        }
        GuardEvent::RestartGate { gate } => format!("restart gate: {}", serde_json::to_string(gate).unwrap_or_default()),
        GuardEvent::Stopped => "guard stopped".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_as_one_line_each() {
        assert_eq!(line(&GuardEvent::Stopped), "guard stopped");
        assert_eq!(line(&GuardEvent::Note { message: "x".into() }), "note: x");
        assert_eq!(gib(3 << 29), "1.50 GiB");
    }
}
