//! What the bring-up gates conclude (pure): why a gate stopped the bring-up ([`GateError`]),
//! how long each waits ([`GateLimits`]), and the preflight report's lines and verdict.

use std::time::Duration;

use crate::cluster::client::WaitError;
use crate::cluster::push;
use crate::node::checks::Verdict;
use crate::node::preflight::{self, Facts, FactsError, PreflightInput, Report};
use crate::weights::{listing, rsync};

/// Why a bring-up gate stopped the bring-up.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("preflight failed ({count} problem(s)): {problems}")]
    Preflight { count: usize, problems: String },
    #[error("the head's weights at {root} cannot be read")]
    HeadUnreadable { root: String, fix: &'static str, source: listing::ListError },
    #[error("the head's weights: {what}; nothing was copied")]
    HeadDangling { what: String, fix: &'static str },
    #[error("no weight files under {root} on the head")]
    NoWeights { root: String, fix: &'static str },
    #[error(transparent)]
    Push(#[from] push::PushError),
    #[error(transparent)]
    Rsync(#[from] rsync::SyncError),
    #[error("{node} has no agent connection")]
    NoAgent { node: String },
    #[error("{node}: weights check")]
    Check { node: String, source: WaitError },
    #[error("{node}: the weights under {root} differ from the head's: {summary}")]
    Differ { node: String, root: String, summary: String, fix: &'static str },
}

impl GateError {
    /// Bad input on the head (exit 2) rather than a failure on the way (exit 1).
    #[must_use]
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::HeadDangling { .. })
    }

    /// A one-line fix, where there is one.
    #[must_use]
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Preflight { .. } => Some("run `spark-kit preflight` for every check and its fix".into()),
            Self::HeadUnreadable { fix, .. }
            | Self::HeadDangling { fix, .. }
            | Self::NoWeights { fix, .. }
            | Self::Differ { fix, .. } => Some((*fix).to_string()),
            Self::Check { .. } | Self::NoAgent { .. } | Self::Push(_) | Self::Rsync(_) => None,
        }
    }
}

/// How long each gate waits for the agents' answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateLimits {
    /// Every agent's hello.
    pub hello: Duration,
    /// `--replace`: every agent's cleanup.
    pub clean: Duration,
    /// Every node's preflight facts (ssh probes time out after 5 s each).
    pub facts: Duration,
    /// Every worker's answer to the weights check.
    pub files: Duration,
}

impl Default for GateLimits {
    fn default() -> Self {
        Self {
            hello: Duration::from_secs(60),
            clean: Duration::from_secs(120),
            facts: Duration::from_secs(FACTS_TIMEOUT_S),
            files: Duration::from_secs(120),
        }
    }
}

/// Seconds a node may take to gather its facts.
pub const FACTS_TIMEOUT_S: u64 = 120;

// The image's vLLM version, the slowest probe, leaves the node's other probes 30 s of that wait.
const _: () = assert!(crate::node::facts::IMAGE_VLLM_TIMEOUT_S + 30 <= FACTS_TIMEOUT_S);

/// The report over gathered facts (pure).
#[must_use]
pub fn evaluate(kit: &crate::kit::schema::Kit, input: &PreflightInput, facts: &[Facts]) -> Report {
    preflight::run(kit, input, &|node, _| {
        let i = kit.nodes.iter().position(|n| n.name == node.name).unwrap_or(usize::MAX);
        facts.get(i).cloned().unwrap_or_else(|| Err(FactsError::NotInKit { node: node.name.clone() }))
    })
}

/// Lines for the operator: every check that is not a plain pass, then a summary.
#[must_use]
pub fn report_lines(r: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    for c in &r.checks {
        if matches!(c.verdict, Verdict::Warn | Verdict::Fail | Verdict::NotChecked) {
            let fix = c.fix.as_deref().map(|f| format!("; fix: {f}")).unwrap_or_default();
            lines.push(format!("    {}: preflight {}: {}: {}{fix}", c.node, c.id, c.verdict.label(), c.message));
        }
    }
    let (pass, warn, fail, unchecked) = r.counts();
    lines.push(format!("    preflight: {pass} pass, {warn} warn, {fail} fail, {unchecked} not checked"));
    lines
}

/// `Err` when the report must stop the bring-up (a failure, or a node not checked).
pub fn gate(r: &Report) -> Result<(), GateError> {
    if r.status == Verdict::Pass {
        return Ok(());
    }
    let bad: Vec<String> = r
        .checks
        .iter()
        .filter(|c| matches!(c.verdict, Verdict::Fail | Verdict::NotChecked))
        .map(|c| format!("{} {}: {}", c.node, c.id, c.message))
        .collect();
    Err(GateError::Preflight { count: bad.len(), problems: bad.join("; ") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::checks::Check;

    fn report(verdicts: &[Verdict]) -> Report {
        let checks = verdicts
            .iter()
            .enumerate()
            .map(|(i, v)| Check {
                node: format!("n{i}"),
                id: "memory",
                verdict: *v,
                message: format!("m{i}"),
                fix: Some("f".into()),
            })
            .collect();
        let status = if verdicts.contains(&Verdict::Fail) {
            Verdict::Fail
        } else if verdicts.contains(&Verdict::NotChecked) {
            Verdict::NotChecked
        } else {
            Verdict::Pass
        };
        Report { kit: "k".into(), status, checks }
    }

    #[test]
    fn gate_passes_warnings_and_stops_failures() {
        assert!(gate(&report(&[Verdict::Pass, Verdict::Warn])).is_ok());
        let e = gate(&report(&[Verdict::Pass, Verdict::Fail, Verdict::NotChecked])).unwrap_err().to_string();
        assert!(e.starts_with("preflight failed (2 problem(s)): n1 memory: m1; n2 memory: m2"), "{e}");
        let lines = report_lines(&report(&[Verdict::Pass, Verdict::Warn]));
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("n1: preflight memory: warn: m1; fix: f"), "{lines:?}");
        assert!(lines[1].ends_with("1 pass, 1 warn, 0 fail, 0 not checked"), "{lines:?}");
    }
}
