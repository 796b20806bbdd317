//! The bring-up gates as the supervisor loop runs them: each gate ([`Gate`], a state of the
//! machine in `state.rs`) is begun by [`Sup::begin_gate`], fed every message the loop hears by
//! [`Sup::gate_hears`] and its deadline checked by [`Sup::gate_tick`]; none of them receives on
//! its own, so a stop request is seen at every gate. The weights' rsync runs on a thread beside
//! the loop and reports on the same channel; a stop kills its process group.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use super::verdicts::{evaluate, gate, report_lines, GateError, GateLimits, FACTS_TIMEOUT_S};

use super::agents::Note;
use super::run::{ClusterError, Sup};
use super::state::{Gate, Input};
use crate::cluster::client::{Msg, WaitError};
use crate::cluster::protocol::{Command, Event};
use crate::cluster::push;
use crate::kit::schema::{ModelSource, Role, WeightSync};
use crate::node::preflight::{self, Facts, FactsError};
use crate::weights::listing;
use crate::weights::rsync;

/// The gate in progress and what it waits for.
#[derive(Default)]
pub(super) enum Work {
    #[default]
    Idle,
    Hello {
        pending: BTreeSet<usize>,
        deadline: Instant,
    },
    Clean {
        pending: BTreeSet<usize>,
        deadline: Instant,
        failed: Option<String>,
    },
    Facts {
        got: Vec<Option<Facts>>,
        deadline: Instant,
    },
    /// Tree `tree` of the weights: the rsync to each worker in turn, then every worker's check.
    Weights {
        tree: usize,
        files: Vec<(String, u64)>,
        node_root: String,
        step: WeightsStep,
    },
    /// The engines: `order[next..]` still to start; the one before waits for `Started` until `deadline`.
    Engines {
        order: Vec<usize>,
        next: usize,
        waiting: Option<(usize, Instant)>,
    },
}

pub(super) enum WeightsStep {
    /// rsync to `queue[0]` running (the rest after it).
    Sync {
        queue: Vec<usize>,
    },
    Check {
        pending: BTreeSet<usize>,
        deadline: Instant,
    },
}

/// The weights' rsync running on its thread: its process group, to stop it.
pub(super) struct SyncJob {
    group: Arc<AtomicI32>,
    thread: JoinHandle<()>,
}

impl SyncJob {
    /// Stop the copy (SIGTERM to its group: rsync keeps the partial file aside; SIGKILL after
    /// 1 s) and wait for its thread.
    pub(super) fn cancel(self) {
        use nix::sys::signal::{killpg, Signal};
        use nix::unistd::Pid;
        let group = || self.group.load(Ordering::SeqCst);
        if group() > 0 {
            let _ = killpg(Pid::from_raw(group()), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(1);
            while group() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if group() > 0 {
                let _ = killpg(Pid::from_raw(group()), Signal::SIGKILL);
            }
        }
        let _ = self.thread.join();
    }
}

impl Sup<'_> {
    fn workers(&self) -> Vec<usize> {
        (0..self.kit.nodes.len()).filter(|i| self.kit.nodes[*i].role != Role::Head).collect()
    }

    fn name(&self, i: usize) -> String {
        self.kit.nodes[i].name.clone()
    }

    /// Begin `gate`; inputs when it passes or fails at once.
    pub(super) fn begin_gate(&mut self, gate: Gate) -> Vec<Input> {
        let n = self.kit.nodes.len();
        let now = Instant::now();
        self.work = match gate {
            Gate::Agents => {
                for i in 0..n {
                    if let Err(e) = self.agents.spawn(self.kit, i) {
                        return self.fail(gate, ClusterError::Spawn(e));
                    }
                }
                Work::Hello { pending: (0..n).collect(), deadline: now + self.gates.limits.hello }
            }
            Gate::Replace => {
                self.rep.line("==> --replace: removing what an earlier run left on every node");
                let kit = Box::new(self.kit.clone());
                let pending = (0..n).filter(|i| self.agents.send(*i, &Command::Clean { kit: kit.clone() })).collect();
                Work::Clean { pending, deadline: now + self.gates.limits.clean, failed: None }
            }
            Gate::Preflight => {
                let Some(input) = self.gates.preflight.as_ref() else { return vec![Input::GatePassed(gate)] };
                self.rep.line("==> preflight on every node");
                let mut got: Vec<Option<Facts>> = (0..n).map(|_| None).collect();
                for (i, node) in self.kit.nodes.iter().enumerate() {
                    let request = preflight::request_for(self.kit, node, input);
                    if !self.agents.send(i, &Command::Preflight { request }) {
                        got[i] = Some(Err(FactsError::NoConnection { node: node.name.clone() }));
                    }
                }
                Work::Facts { got, deadline: now + self.gates.limits.facts }
            }
            Gate::Weights => return self.begin_tree(0),
            Gate::Engines => {
                let mut order: Vec<usize> = self.workers();
                order.extend((0..n).filter(|i| self.kit.nodes[*i].role == Role::Head));
                self.engines_started = true;
                self.engines_ran = true;
                Work::Engines { order, next: 0, waiting: None }
            }
        };
        self.gate_tick()
    }

    /// The gate fails with `e` (kept for `run`'s result).
    fn fail(&mut self, gate: Gate, e: ClusterError) -> Vec<Input> {
        self.work = Work::Idle;
        let why = e.to_string();
        self.failure = Some(e);
        vec![Input::GateFailed { gate, why }]
    }

    /// Tree `tree` of the weights (past the last: the gate passes).
    fn begin_tree(&mut self, tree: usize) -> Vec<Input> {
        let workers = self.workers();
        let Some(t) = self.gates.weight_trees.get(tree).filter(|_| !workers.is_empty()) else {
            self.work = Work::Idle;
            return vec![Input::GatePassed(Gate::Weights)];
        };
        let root = t.path.clone();
        let fix = match (t.what, self.kit.model.source) {
            ("model", ModelSource::Local) => "fix model.path (a directory on the head)",
            _ => "run `spark-kit download` first",
        };
        let files = match listing::list(&root) {
            Ok(f) if f.is_empty() => {
                let e = GateError::NoWeights { root: root.display().to_string(), fix };
                return self.fail(Gate::Weights, ClusterError::Weights(e));
            }
            Ok(f) => f,
            Err(source @ listing::ListError::Dangling { .. }) => {
                let fix = match (t.what, self.kit.model.source) {
                    ("model", ModelSource::Local) => {
                        "point that link at an existing file or remove it (under model.path)"
                    }
                    _ => "run `spark-kit download` (it fetches that file again in place of the link), then up again",
                };
                let e = GateError::HeadDangling { what: source.to_string(), fix };
                return self.fail(Gate::Weights, ClusterError::Weights(e));
            }
            Err(source) => {
                let e = GateError::HeadUnreadable { root: root.display().to_string(), fix, source };
                return self.fail(Gate::Weights, ClusterError::Weights(e));
            }
        };
        let total: u64 = files.iter().map(|(_, s)| s).sum();
        let node_root = listing::node_path(&root, &self.gates.home);
        self.rep.line(&format!(
            "==> weights ({}): {} file(s), {:.2} GiB under {node_root}",
            t.what,
            files.len(),
            total as f64 / GIB
        ));
        let step = if self.kit.model.sync == WeightSync::Rsync {
            WeightsStep::Sync { queue: workers }
        } else {
            WeightsStep::Check { pending: BTreeSet::new(), deadline: Instant::now() }
        };
        self.work = Work::Weights { tree, files, node_root, step };
        match &self.work {
            Work::Weights { step: WeightsStep::Sync { .. }, .. } => self.next_sync(),
            _ => self.check_files(),
        }
    }

    /// Start the rsync to the first worker in the queue (none left: the weights check).
    fn next_sync(&mut self) -> Vec<Input> {
        let Work::Weights { tree, node_root, step: WeightsStep::Sync { queue }, .. } = &self.work else {
            return Vec::new();
        };
        let Some(&i) = queue.first() else { return self.check_files() };
        let node = self.kit.nodes[i].clone();
        let src = self.gates.weight_trees[*tree].path.clone();
        let (dst, cap) = (node_root.clone(), self.kit.model.sync_page_cache);
        let (exe, sha) = (self.agents.exe().0.to_path_buf(), self.agents.exe().1.to_string());
        self.rep.line(&format!("    {}: rsync (only changed files; page cache capped at {cap})", node.name));
        let tx = self.agents.sender();
        let group = Arc::new(AtomicI32::new(0));
        let g = Arc::clone(&group);
        let thread = std::thread::spawn(move || {
            let t = Instant::now();
            let result = push::ensure(&node, &exe, &sha).map_err(GateErrorSend::Push).and_then(|remote| {
                let argv = rsync::argv(&node, &src, &dst, &exe.to_string_lossy(), &remote, cap.bytes());
                let line = |l: &str| {
                    let _ = tx.send(Note::SyncLine(i, l.to_string()));
                };
                rsync::run_in_group(&node, &argv, &line, &g).map_err(GateErrorSend::Sync)
            });
            let result = match result {
                Ok(()) => {
                    let _ = tx.send(Note::SyncLine(i, format!("rsync done in {:.1} s", t.elapsed().as_secs_f64())));
                    Ok(())
                }
                Err(GateErrorSend::Sync(e)) => Err(e),
                Err(GateErrorSend::Push(e)) => Err(rsync::SyncError::Failed {
                    node: node.name.clone(),
                    status: "binary push".into(),
                    last: e.to_string(),
                }),
            };
            let _ = tx.send(Note::Synced(i, result));
        });
        self.sync = Some(SyncJob { group, thread });
        Vec::new()
    }

    /// Ask every worker for the tree's files.
    fn check_files(&mut self) -> Vec<Input> {
        let Work::Weights { files, node_root, .. } = &self.work else { return Vec::new() };
        let names: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
        let root = node_root.clone();
        let mut pending = BTreeSet::new();
        for i in self.workers() {
            if !self.agents.send(i, &Command::CheckFiles { root: root.clone(), files: names.clone() }) {
                let e = GateError::NoAgent { node: self.name(i) };
                return self.fail(Gate::Weights, ClusterError::Weights(e));
            }
            pending.insert(i);
        }
        if let Work::Weights { step, .. } = &mut self.work {
            *step = WeightsStep::Check { pending, deadline: Instant::now() + self.gates.limits.files };
        }
        Vec::new()
    }

    /// Stop what the gate runs beside the loop (the rsync).
    pub(super) fn cancel_gate(&mut self) {
        if let Some(job) = self.sync.take() {
            job.cancel();
        }
        self.work = Work::Idle;
    }

    /// The gate's deadline: inputs when it has passed (or the gate has nothing left to wait for).
    pub(super) fn gate_tick(&mut self) -> Vec<Input> {
        let now = Instant::now();
        match &mut self.work {
            Work::Idle => Vec::new(),
            Work::Hello { pending, deadline } => {
                if pending.is_empty() {
                    self.work = Work::Idle;
                    return vec![Input::GatePassed(Gate::Agents)];
                }
                if now < *deadline {
                    return Vec::new();
                }
                let i = pending.first().copied().unwrap_or(0);
                let secs = self.gates.limits.hello.as_secs();
                let e = self.no_hello(i, secs);
                self.fail(Gate::Agents, e)
            }
            Work::Clean { pending, deadline, failed } => {
                if !pending.is_empty() && now < *deadline {
                    return Vec::new();
                }
                let secs = self.gates.limits.clean.as_secs();
                let late = pending
                    .first()
                    .map(|i| format!("--replace: {} did not answer within {secs} s", self.kit.nodes[*i].name));
                match failed.take().or(late) {
                    Some(why) => self.fail(Gate::Replace, ClusterError::Replace(why)),
                    None => {
                        self.work = Work::Idle;
                        vec![Input::GatePassed(Gate::Replace)]
                    }
                }
            }
            Work::Facts { got, deadline } => {
                if got.iter().any(Option::is_none) && now < *deadline {
                    return Vec::new();
                }
                let secs = self.gates.limits.facts.as_secs();
                let facts: Vec<Facts> = std::mem::take(got)
                    .into_iter()
                    .enumerate()
                    .map(|(i, g)| g.unwrap_or_else(|| Err(FactsError::Timeout { node: self.name(i), secs })))
                    .collect();
                self.work = Work::Idle;
                let Some(input) = self.gates.preflight.as_ref() else { return Vec::new() };
                let report = evaluate(self.kit, input, &facts);
                for line in report_lines(&report) {
                    self.rep.line(&line);
                }
                match gate(&report) {
                    Ok(()) => vec![Input::GatePassed(Gate::Preflight)],
                    Err(e) => self.fail(Gate::Preflight, ClusterError::Preflight(e)),
                }
            }
            Work::Weights { tree, step: WeightsStep::Check { pending, deadline }, .. } => {
                if pending.is_empty() {
                    let next = *tree + 1;
                    return self.begin_tree(next);
                }
                if now < *deadline {
                    return Vec::new();
                }
                let i = pending.first().copied().unwrap_or(0);
                let secs = self.gates.limits.files.as_secs();
                let e = GateError::Check { node: self.name(i), source: WaitError::Timeout(secs) };
                self.fail(Gate::Weights, ClusterError::Weights(e))
            }
            Work::Weights { .. } => Vec::new(),
            Work::Engines { order, next, waiting } => {
                if let Some((i, until)) = *waiting {
                    if now < until {
                        return Vec::new();
                    }
                    *waiting = None;
                    let secs = self.kit.engine.ready_timeout_s;
                    self.work = Work::Idle;
                    let why = format!("no engine start reported within {secs} s");
                    return vec![Input::StartFailed { node: self.name(i), why }];
                }
                let Some(&i) = order.get(*next) else {
                    self.work = Work::Idle;
                    return vec![Input::GatePassed(Gate::Engines)];
                };
                *next += 1;
                let last = *next == order.len();
                self.watch[i].restart();
                self.rep.line(&format!("==> node {}: starting its engine", self.kit.nodes[i].name));
                let cmd = Command::Start { kit: Box::new(self.kit.clone()), node: i };
                if !self.agents.send(i, &cmd) {
                    self.rep.line(&format!("error: node {} has no agent connection", self.kit.nodes[i].name));
                } else if !last {
                    // The next node starts once this one reports its engine started.
                    let secs = u64::from(self.kit.engine.ready_timeout_s);
                    if let Work::Engines { waiting, .. } = &mut self.work {
                        *waiting = Some((i, now + Duration::from_secs(secs)));
                    }
                    return Vec::new();
                }
                self.gate_tick()
            }
        }
    }

    /// Give a message to the gate in progress: the message back when the gate does not take it
    /// (the loop then hands it to `on_msg`), and inputs when the gate is done.
    pub(super) fn gate_hears(&mut self, note: Note) -> (Option<Msg>, Vec<Input>) {
        let msg = match note {
            Note::Agent(m) => m,
            Note::SyncLine(i, l) => {
                self.rep.line(&format!("    {}: {l}", self.kit.nodes[i].name));
                return (None, Vec::new());
            }
            Note::Synced(i, result) => return (None, self.synced(i, result)),
        };
        if let Msg::Lost(i) = msg {
            if let Some(inputs) = self.lost_at_gate(i) {
                return (None, inputs);
            }
        }
        let taken = match (&mut self.work, &msg) {
            (Work::Hello { pending, .. }, Msg::Event(i, Event::Hello { pid, .. })) => {
                pending.remove(i);
                let (i, pid) = (*i, *pid);
                self.with_node(i, |n| {
                    n.agent_pid = Some(pid);
                    n.agent_connected = true;
                });
                true
            }
            (Work::Clean { pending, .. }, Msg::Event(i, Event::Cleaned { removed })) if pending.contains(i) => {
                pending.remove(i);
                let what = if removed.is_empty() { "nothing".to_string() } else { removed.join(", ") };
                self.rep.line(&format!("    {}: removed {what}", self.kit.nodes[*i].name));
                true
            }
            (Work::Clean { pending, failed, .. }, Msg::Event(i, Event::Error { message, .. }))
                if pending.contains(i) =>
            {
                pending.remove(i);
                *failed = Some(format!("--replace on {}: {message}", self.kit.nodes[*i].name));
                true
            }
            (Work::Facts { got, .. }, Msg::Event(i, Event::Facts { facts })) if got[*i].is_none() => {
                got[*i] = Some(Ok((**facts).clone()));
                true
            }
            (Work::Facts { got, .. }, Msg::Event(i, Event::Error { message, .. })) if got[*i].is_none() => {
                got[*i] = Some(Err(FactsError::Agent(message.clone())));
                true
            }
            (Work::Weights { step: WeightsStep::Check { pending, .. }, files, node_root, .. }, Msg::Event(i, ev))
                if pending.contains(i) =>
            {
                let i = *i;
                let outcome = match ev {
                    Event::Files { present, missing } => {
                        let diffs = listing::differences(files, present, missing);
                        Some(diffs.is_empty().then_some(files.len()).ok_or_else(|| GateError::Differ {
                            node: self.kit.nodes[i].name.clone(),
                            root: node_root.clone(),
                            summary: listing::summary(&diffs),
                            fix: match self.kit.model.sync {
                                WeightSync::Shared => {
                                    "mount the same weights at that path on every node, or set model.sync: rsync"
                                }
                                WeightSync::Rsync => {
                                    "run `spark-kit up` again (rsync resumes), and check free space on the node"
                                }
                            },
                        }))
                    }
                    Event::Error { message, .. } => Some(Err(GateError::Check {
                        node: self.kit.nodes[i].name.clone(),
                        source: WaitError::Agent(message.clone()),
                    })),
                    _ => None,
                };
                match outcome {
                    None => false,
                    Some(Ok(count)) => {
                        pending.remove(&i);
                        let line = format!(
                            "    {}: all {count} weight file(s) present with the head's sizes",
                            self.kit.nodes[i].name
                        );
                        self.rep.line(&line);
                        true
                    }
                    Some(Err(e)) => return (None, self.fail(Gate::Weights, ClusterError::Weights(e))),
                }
            }
            (Work::Engines { waiting, .. }, Msg::Event(i, Event::Started { .. } | Event::Error { .. }))
                if waiting.is_some_and(|(w, _)| w == *i) =>
            {
                *waiting = None;
                false
            }
            _ => false,
        };
        let inputs = self.gate_tick();
        ((!taken).then_some(msg), inputs)
    }

    /// Node `i`'s agent is gone while a gate before the engines runs: the gate fails (preflight:
    /// the node is not checked). `None` when no such gate runs (the loop's `on_msg` judges it).
    fn lost_at_gate(&mut self, i: usize) -> Option<Vec<Input>> {
        let node = self.name(i);
        let gate = match &mut self.work {
            Work::Idle | Work::Engines { .. } => return None,
            Work::Facts { got, .. } => {
                got[i].get_or_insert(Err(FactsError::AgentGone { node }));
                None
            }
            Work::Hello { .. } => Some(Gate::Agents),
            Work::Clean { .. } => Some(Gate::Replace),
            Work::Weights { .. } => Some(Gate::Weights),
        };
        self.agents.lost(i);
        self.with_node(i, |n| {
            n.agent_connected = false;
            n.last_error = Some("agent connection lost".into());
        });
        Some(match gate {
            None => self.gate_tick(),
            Some(Gate::Agents) => {
                let e = self.no_hello(i, 0);
                self.fail(Gate::Agents, e)
            }
            Some(Gate::Replace) => {
                let why = format!("--replace on {}: the agent's connection closed", self.name(i));
                self.fail(Gate::Replace, ClusterError::Replace(why))
            }
            Some(g) => {
                let e = GateError::Check { node: self.name(i), source: WaitError::Closed };
                self.fail(g, ClusterError::Weights(e))
            }
        })
    }

    /// The rsync to node `i` ended: the next worker's, or the weights check.
    fn synced(&mut self, i: usize, result: Result<(), rsync::SyncError>) -> Vec<Input> {
        if let Some(job) = self.sync.take() {
            let _ = job.thread.join();
        }
        if let Err(e) = result {
            return self.fail(Gate::Weights, ClusterError::Weights(GateError::Rsync(e)));
        }
        if let Work::Weights { step: WeightsStep::Sync { queue }, .. } = &mut self.work {
            queue.retain(|q| *q != i);
        }
        self.next_sync()
    }
}

/// What the rsync thread can fail with before it is a `SyncError`.
enum GateErrorSend {
    Push(push::PushError),
    Sync(rsync::SyncError),
}

const GIB: f64 = (1u64 << 30) as f64;
