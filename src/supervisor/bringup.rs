//! Bring-up gates run through the node agents before any engine starts: preflight on every node
//! (facts gathered on the node, verdicts computed here) and weight presence on every node.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::cluster::client::{self, Msg};
use crate::cluster::protocol::{Command, Event};
use crate::cluster::push;
use crate::kit::schema::{Kit, ModelSource, Role, WeightSync};
use crate::node::checks::Verdict;
use crate::node::preflight::{self, Facts, FactsError, PreflightInput, Report};
use crate::weights::listing::{self, WeightTree};
use crate::weights::rsync;

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
    Check { node: String, source: client::WaitError },
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

/// Seconds a node may take to gather its facts (ssh probes time out after 5 s each).
pub const FACTS_TIMEOUT_S: u64 = 120;

/// Ask every agent for its facts at once and collect the answers; `send(i, cmd)` reaches agent
/// `i`. Messages that are not answers are handed back in `held` for the caller to process.
pub fn gather_all(
    kit: &Kit,
    input: &PreflightInput,
    rx: &Receiver<Msg>,
    send: &mut dyn FnMut(usize, &Command) -> bool,
    held: &mut Vec<Msg>,
) -> Vec<Facts> {
    let n = kit.nodes.len();
    let mut got: Vec<Option<Facts>> = (0..n).map(|_| None).collect();
    for (i, node) in kit.nodes.iter().enumerate() {
        let request = preflight::request_for(kit, node, input);
        if !send(i, &Command::Preflight { request }) {
            got[i] = Some(Err(FactsError::NoConnection { node: node.name.clone() }));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(FACTS_TIMEOUT_S);
    while got.iter().any(Option::is_none) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Msg::Event(i, Event::Facts { facts })) if got[i].is_none() => got[i] = Some(Ok(*facts)),
            Ok(Msg::Event(i, Event::Error { message, .. })) if got[i].is_none() => {
                got[i] = Some(Err(FactsError::Agent(message)))
            }
            Ok(Msg::Lost(i)) if got[i].is_none() => {
                got[i] = Some(Err(FactsError::AgentGone { node: kit.nodes[i].name.clone() }));
                held.push(Msg::Lost(i));
            }
            Ok(other) => held.push(other),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    got.into_iter()
        .enumerate()
        .map(|(i, g)| {
            g.unwrap_or_else(|| Err(FactsError::Timeout { node: kit.nodes[i].name.clone(), secs: FACTS_TIMEOUT_S }))
        })
        .collect()
}

/// The report over gathered facts (pure).
#[must_use]
pub fn evaluate(kit: &Kit, input: &PreflightInput, facts: &[Facts]) -> Report {
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

/// What the weights step needs from the supervisor.
pub struct WeightsCtx<'a> {
    pub kit: &'a Kit,
    /// The head's weight trees (empty: every node makes its own model).
    pub roots: Vec<WeightTree>,
    pub home: std::path::PathBuf,
    /// This spark-kit binary (its sha256 names the copy pushed to nodes).
    pub exe: &'a std::path::Path,
    pub sha: &'a str,
}

/// Weights on every node: with `model.sync: rsync` copy the head's tree to each ssh worker, then
/// ask every worker's agent for each file and its size. `Err` stops the bring-up.
pub fn weights(
    w: &WeightsCtx<'_>,
    rx: &Receiver<Msg>,
    send: &mut dyn FnMut(usize, &Command) -> bool,
    held: &mut Vec<Msg>,
    line: &dyn Fn(&str),
) -> Result<(), GateError> {
    let kit = w.kit;
    let workers: Vec<usize> = (0..kit.nodes.len()).filter(|i| kit.nodes[*i].role != Role::Head).collect();
    if workers.is_empty() {
        // One node: the engine's own preparation checks the model where it loads it.
        return Ok(());
    }
    if w.roots.is_empty() {
        line("==> weights: the tiny model is made on every node");
        return Ok(());
    }
    for tree in &w.roots {
        one_tree(w, tree, &workers, rx, send, held, line)?;
    }
    Ok(())
}

/// One tree: rsync when asked, then every worker's copy checked.
fn one_tree(
    w: &WeightsCtx<'_>,
    tree: &WeightTree,
    workers: &[usize],
    rx: &Receiver<Msg>,
    send: &mut dyn FnMut(usize, &Command) -> bool,
    held: &mut Vec<Msg>,
    line: &dyn Fn(&str),
) -> Result<(), GateError> {
    let kit = w.kit;
    let root = &tree.path;
    let fix = match (tree.what, kit.model.source) {
        ("model", ModelSource::Local) => "fix model.path (a directory on the head)",
        _ => "run `spark-kit download` first",
    };
    let files = listing::list(root).map_err(|source| match source {
        listing::ListError::Dangling { .. } => GateError::HeadDangling {
            what: source.to_string(),
            fix: match (tree.what, kit.model.source) {
                ("model", ModelSource::Local) => "point that link at an existing file or remove it (under model.path)",
                _ => "run `spark-kit download` (it fetches that file again in place of the link), then up again",
            },
        },
        source => GateError::HeadUnreadable { root: root.display().to_string(), fix, source },
    })?;
    if files.is_empty() {
        return Err(GateError::NoWeights { root: root.display().to_string(), fix });
    }
    let total: u64 = files.iter().map(|(_, s)| s).sum();
    let node_root = listing::node_path(root, &w.home);
    line(&format!(
        "==> weights ({}): {} file(s), {:.2} GiB under {node_root}",
        tree.what,
        files.len(),
        total as f64 / GIB
    ));
    if kit.model.sync == WeightSync::Rsync {
        for &i in workers {
            let node = &kit.nodes[i];
            let remote_bin = push::ensure(node, w.exe, w.sha)?;
            let argv = rsync::argv(
                node,
                root,
                &node_root,
                &w.exe.to_string_lossy(),
                &remote_bin,
                kit.model.sync_page_cache.bytes(),
            );
            line(&format!(
                "    {}: rsync (only changed files; page cache capped at {})",
                node.name, kit.model.sync_page_cache
            ));
            let t = Instant::now();
            rsync::run(node, &argv, &|l| line(&format!("    {}: {l}", node.name)))?;
            line(&format!("    {}: rsync done in {:.1} s", node.name, t.elapsed().as_secs_f64()));
        }
    }
    let names: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
    for &i in workers {
        let node = &kit.nodes[i];
        if !send(i, &Command::CheckFiles { root: node_root.clone(), files: names.clone() }) {
            return Err(GateError::NoAgent { node: node.name.clone() });
        }
        let (present, missing) = client::wait_for(rx, i, Duration::from_secs(120), held, |ev| match ev {
            Event::Files { present, missing } => Some((present, missing)),
            _ => None,
        })
        .map_err(|source| GateError::Check { node: node.name.clone(), source })?;
        let diffs = listing::differences(&files, &present, &missing);
        if !diffs.is_empty() {
            let fix = match kit.model.sync {
                WeightSync::Shared => "mount the same weights at that path on every node, or set model.sync: rsync",
                WeightSync::Rsync => "run `spark-kit up` again (rsync resumes), and check free space on the node",
            };
            return Err(GateError::Differ {
                node: node.name.clone(),
                root: node_root.clone(),
                summary: listing::summary(&diffs),
                fix,
            });
        }
        line(&format!("    {}: all {} weight file(s) present with the head's sizes", node.name, files.len()));
    }
    Ok(())
}

const GIB: f64 = (1u64 << 30) as f64;

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
    fn a_dangling_link_on_the_head_stops_before_any_copy_naming_it() {
        use crate::kit::schema::{Node, WeightSync};
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("models--o--n");
        std::fs::create_dir_all(root.join("blobs")).unwrap();
        std::fs::write(root.join("blobs/ok"), b"x").unwrap();
        std::os::unix::fs::symlink("../../blobs/ab/gone", root.join("blobs/e1")).unwrap();
        let nodes = vec![Node { name: "a".into(), role: Role::Head, ..Node::default() }, Node::default()];
        let mut kit = Kit { nodes, ..Kit::default() };
        kit.model.sync = WeightSync::Rsync;
        let w = WeightsCtx {
            kit: &kit,
            roots: vec![WeightTree { what: "model", path: root.clone() }],
            home: d.path().to_path_buf(),
            exe: std::path::Path::new("/nonexistent"),
            sha: "",
        };
        let (_tx, rx) = std::sync::mpsc::channel();
        let sent = std::cell::Cell::new(0);
        let lines = std::cell::RefCell::new(Vec::new());
        let e = weights(
            &w,
            &rx,
            &mut |_, _| {
                sent.set(sent.get() + 1);
                true
            },
            &mut Vec::new(),
            &|l| {
                lines.borrow_mut().push(l.to_string());
            },
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the head's weights: {}/blobs/e1 is a symlink to ../../blobs/ab/gone, which does not exist; nothing was copied",
                root.display()
            )
        );
        assert!(e.is_usage(), "{e:?}");
        assert!(e.hint().is_some_and(|h| h.starts_with("run `spark-kit download`")), "{e:?}");
        assert_eq!(sent.get(), 0);
        assert!(lines.borrow().is_empty(), "{:?}", lines.borrow());
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
