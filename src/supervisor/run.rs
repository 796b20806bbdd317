//! The supervisor of a deployment: one node agent per node (local, ssh or exec), bring-up in
//! order (workers first, then the head), restarts through the pure state machine, and the
//! status snapshot `status` / `down` read over the control socket.
//!
//! The trace of `up`: `commands/up.rs` calls [`run`]; [`run`] starts one agent per node
//! (`cluster::client::spawn`) and sends each `Command::Start`, which `agent::run` answers by
//! starting the engine through its runtime. Agent events become state-machine inputs in
//! `events.rs`; heartbeats are judged in `watch.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::agents::{Agents, SpawnError};
use super::bringup::{self, GateLimits, SyncJob, Work};
use super::snapshot::{memory_recovered, Handles, NodeStatus};
use super::state::{Action, Gate, Input, Machine, Policy, State};
use super::watch::Watch;
use crate::bounded::{self, Ended};
use crate::cluster::protocol::Command;
use crate::cluster::transport;
use crate::kit::schema::Kit;
use crate::node::preflight::PreflightInput;
use crate::weights::listing::WeightTree;

/// Human progress of the supervisor (the front end prints it).
pub trait ClusterReporter: Send + Sync {
    fn line(&self, text: &str);
}

/// Why the supervisor could not run.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Preflight(bringup::GateError),
    #[error(transparent)]
    Weights(bringup::GateError),
    #[error("node {node}'s agent did not answer within {secs} s (see {log})")]
    NoHello { node: String, secs: u64, log: String },
    /// `up --replace` could not remove what an earlier run left.
    #[error("{0}")]
    Replace(String),
}

impl ClusterError {
    /// Bad input (exit 2) rather than a runtime failure (exit 1).
    #[must_use]
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Preflight(e) | Self::Weights(e) if e.is_usage())
    }

    /// A one-line fix, where there is one.
    #[must_use]
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Preflight(e) | Self::Weights(e) => e.hint(),
            // Replace: `up` names `spark-kit up --kit K --replace` with the kit as given (commands/up_text.rs).
            Self::Spawn(_) | Self::NoHello { .. } | Self::Replace(_) => None,
        }
    }
}

pub(super) struct Sup<'a> {
    pub(super) kit: &'a Kit,
    logs: PathBuf,
    pub(super) rep: &'a dyn ClusterReporter,
    pub(super) agents: Agents,
    pub(super) h: Handles,
    clock: Instant,
    /// Per node: what its heartbeats showed so far.
    pub(super) watch: Vec<Watch>,
    /// Per node: available memory when idle (a restart waits for it to come back).
    pub(super) baseline: Vec<Option<u64>>,
    /// Nodes told to stop, and whether they reported stopped.
    pub(super) stopping: BTreeMap<usize, bool>,
    /// When nodes told to stop that have not answered are given up on.
    stop_deadline: Option<Instant>,
    pub(super) engines_started: bool,
    /// Engines were started in this run and every agent answers (closing the agents then
    /// waits for their stop).
    pub(super) engines_ran: bool,
    /// The bring-up gates' inputs.
    pub(super) gates: &'a Gates,
    /// The gate in progress and what it waits for (`bringup.rs`).
    pub(super) work: Work,
    /// The weights' rsync running beside the loop.
    pub(super) sync: Option<SyncJob>,
    /// Why a gate failed (`run`'s error).
    pub(super) failure: Option<ClusterError>,
}

/// What runs through the agents before any engine starts.
pub struct Gates {
    /// The spark-kit binary every node runs (pushed to nodes whose copy differs).
    pub exe: PathBuf,
    /// Preflight on every node (`None`: skipped with `--skip-preflight`).
    pub preflight: Option<PreflightInput>,
    /// The head's weight trees, which every node must hold (empty: each node makes its own model).
    pub weight_trees: Vec<WeightTree>,
    /// The head's home directory (paths under it are sent home-relative).
    pub home: PathBuf,
    /// `up --replace`: every agent first removes what an earlier run of the kit left.
    pub replace: bool,
    /// How long each gate waits for the agents.
    pub limits: GateLimits,
    /// Start the engines after the gates (`false`: the run ends, exit 0, once they pass).
    pub engines: bool,
}

impl Gates {
    /// The gates of this run, in order.
    #[must_use]
    pub fn order(&self) -> Vec<Gate> {
        let mut g = vec![Gate::Agents];
        if self.replace {
            g.push(Gate::Replace);
        }
        g.extend([Gate::Preflight, Gate::Weights]);
        if self.engines {
            g.push(Gate::Engines);
        }
        g
    }
}

/// How often the loop looks at the stop request, the timers and the gates' deadlines.
const TICK: Duration = Duration::from_millis(100);

/// How long an agent whose engine never reported started has to answer a stop before it is
/// killed (the agent answers within 0.8 s, cancelling a preparation): a stop at the engines
/// gate ends within 2 s.
const STOP_ANSWER: Duration = Duration::from_millis(1200);
/// How long one node's stack dump (on a hang, before the restart) may take.
const STACK_DUMP_LIMIT: Duration = Duration::from_secs(60);

/// Run the deployment until stopped; returns the exit code. Everything the agents (and the
/// weights' rsync) say arrives on one channel and is received here only, between looks at the
/// stop request: a stop is seen at every gate and state.
pub fn run(
    kit: &Kit,
    logs: &Path,
    policy: Policy,
    rep: &dyn ClusterReporter,
    h: Handles,
    gates: &Gates,
) -> Result<i32, ClusterError> {
    let n = kit.nodes.len();
    let mut sup = Sup {
        kit,
        logs: logs.to_path_buf(),
        rep,
        agents: Agents::new(kit, &gates.exe, logs)?,
        h,
        clock: Instant::now(),
        watch: vec![Watch::default(); n],
        baseline: vec![None; n],
        stopping: BTreeMap::new(),
        stop_deadline: None,
        engines_started: false,
        engines_ran: false,
        gates,
        work: Work::Idle,
        sync: None,
        failure: None,
    };
    let mut machine = Machine::new(policy);
    if gates.preflight.is_none() {
        rep.line("==> preflight skipped (--skip-preflight)");
    }
    let mut actions = machine.begin(&gates.order());
    let mut restart_at: Option<(Instant, Instant)> = None;
    loop {
        let mut inputs = Vec::new();
        for action in std::mem::take(&mut actions) {
            match sup.perform(action, &mut restart_at) {
                Ok(more) => inputs.extend(more),
                Err(code) => return sup.finish(code),
            }
        }
        if inputs.is_empty() {
            inputs = sup.listen(&machine, &mut restart_at);
        }
        for input in inputs {
            let now = sup.clock.elapsed().as_secs_f64();
            let passed = matches!(input, Input::GatePassed(_));
            actions.extend(machine.step(input, now));
            sup.publish(&machine);
            if passed && !gates.engines && machine.gate.is_none() && machine.state == State::Starting {
                return sup.finish(0);
            }
        }
        sup.publish(&machine);
    }
}

impl Sup<'_> {
    /// One turn of listening: the stop request, one message (or a quiet tick), the timers.
    fn listen(&mut self, machine: &Machine, restart_at: &mut Option<(Instant, Instant)>) -> Vec<Input> {
        let mut inputs = Vec::new();
        // With a gateway, the stop waits for its drain (503 to new requests, in-flight finish).
        if self.h.stop_due() && !matches!(machine.state, State::Stopping | State::Stopped | State::Failed) {
            return vec![Input::StopRequested];
        }
        if let Some(note) = self.agents.hear(TICK) {
            let (msg, more) = self.gate_hears(note);
            inputs.extend(more);
            if let Some(msg) = msg {
                inputs.extend(self.on_msg(msg, machine.state));
            }
        } else {
            inputs.extend(self.gate_tick());
        }
        if let Some((due, mem_deadline)) = *restart_at {
            let now = Instant::now();
            if now >= due && (self.memory_recovered() || now >= mem_deadline) {
                if now >= mem_deadline && !self.memory_recovered() {
                    self.rep
                        .line("warning: memory did not return to the idle baseline within 300 s; restarting anyway");
                }
                *restart_at = None;
                inputs.push(Input::RestartDue);
            }
        }
        if self.stop_deadline.is_some_and(|d| Instant::now() >= d) {
            self.stop_deadline = None;
            // Only agents whose engine never reported started are given up on (an agent stuck
            // before its engine ran) and killed; one with an engine is waited for, as it drains
            // and kills it.
            let mut given_up = Vec::new();
            for (i, done) in &mut self.stopping {
                if !*done && self.watch[*i].started_at.is_none() {
                    self.rep.line(&format!(
                        "error: node {} did not answer the stop (its engine never reported started); closing its agent",
                        self.kit.nodes[*i].name
                    ));
                    *done = true;
                    given_up.push(*i);
                }
            }
            for i in given_up {
                self.agents.kill(i);
            }
            if self.watch.iter().all(|w| w.started_at.is_none()) {
                // No engine runs: closing the agents need not wait for a drain.
                self.engines_ran = false;
            }
        }
        if !self.stopping.is_empty() && self.stopping.values().all(|done| *done) {
            self.stopping.clear();
            self.stop_deadline = None;
            inputs.push(Input::AllStopped);
        }
        inputs
    }

    /// Perform one action of the machine: more inputs, or `Err(code)` to end the run.
    fn perform(&mut self, action: Action, restart_at: &mut Option<(Instant, Instant)>) -> Result<Vec<Input>, i32> {
        match action {
            Action::RunGate(gate) => return Ok(self.begin_gate(gate)),
            Action::StartAll => {
                self.rep.line("==> starting the engines again");
                for i in 0..self.kit.nodes.len() {
                    if !self.agents.connected(i) {
                        if let Err(e) = self.agents.spawn(self.kit, i) {
                            self.rep.line(&format!("error: {e}"));
                        }
                    }
                }
                return Ok(self.begin_gate(Gate::Engines));
            }
            Action::StopAll { reason } => {
                self.rep.line(&format!("==> stopping every engine: {reason}"));
                self.cancel_gate();
                self.stop_all();
                if self.stopping.is_empty() {
                    return Ok(vec![Input::AllStopped]);
                }
            }
            Action::DumpStacks => self.dump_stacks(),
            Action::ScheduleRestart { delay_s } => {
                self.rep
                    .line(&format!("==> restarting in {delay_s:.0} s (once memory is back near the idle baseline)"));
                let now = Instant::now();
                *restart_at = Some((now + Duration::from_secs_f64(delay_s), now + Duration::from_secs(300)));
            }
            Action::Exit(code) => return Err(code),
            Action::ServingAgain => {
                let endpoint = crate::deploy::ports::Ports::of(self.kit).endpoint();
                self.rep.line(&format!("==> serving again after the restart: {endpoint}"));
            }
        }
        Ok(Vec::new())
    }

    /// The run ends: what runs beside the loop stops, the agents are closed; a gate's failure
    /// is the result.
    fn finish(&mut self, code: i32) -> Result<i32, ClusterError> {
        self.cancel_gate();
        // Before any engine ran the agents have nothing to stop: they exit on hang-up at once
        // (one that does not is killed after a second).
        let grace = if self.engines_ran {
            Duration::from_secs(u64::from(self.kit.engine.shutdown_timeout_s) + 20)
        } else {
            Duration::from_secs(1)
        };
        self.agents.close(grace);
        match self.failure.take() {
            Some(e) => Err(e),
            None => Ok(code),
        }
    }

    pub(super) fn no_hello(&mut self, i: usize, secs: u64) -> ClusterError {
        let log = self.agents.log(self.kit, i);
        let tail = crate::engine::process::tail(&log, 3).replace('\n', " | ");
        ClusterError::NoHello {
            node: format!("{} ({tail})", self.kit.nodes[i].name),
            secs,
            log: log.display().to_string(),
        }
    }

    fn stop_all(&mut self) {
        let drain = u64::from(self.kit.engine.shutdown_timeout_s) + 5;
        self.stopping.clear();
        for i in 0..self.kit.nodes.len() {
            if self.agents.send(i, &Command::Stop { drain_s: drain }) {
                self.stopping.insert(i, false);
            }
        }
        // An agent answers a stop at once when its engine has not started (a preparation under
        // way is cancelled: within 0.8 s); it reports its engine stopped after at most its drain.
        self.stop_deadline = Some(Instant::now() + STOP_ANSWER);
        self.engines_started = false;
    }

    fn memory_recovered(&self) -> bool {
        let nodes = self.h.snapshot.lock().map(|s| s.nodes.clone()).unwrap_or_default();
        memory_recovered(&self.baseline, &nodes)
    }

    fn dump_stacks(&mut self) {
        for i in 0..self.kit.nodes.len() {
            let pgid = self.h.snapshot.lock().ok().and_then(|s| s.nodes.get(i).and_then(|n| n.engine_pgid));
            let Some(pgid) = pgid else { continue };
            let node = &self.kit.nodes[i];
            let script = format!(
                "command -v py-spy >/dev/null 2>&1 || {{ echo 'py-spy not installed on this node: no stack dump'; exit 0; }}; \
                 for p in $(ps -o pid= -g {pgid}); do echo \"== pid $p\"; py-spy dump --pid \"$p\" 2>&1; done"
            );
            // Bounded: a dump that itself hangs (a node that stops answering, a process py-spy
            // cannot read) must not hold the restart back; what it wrote by then is kept.
            let out = bounded::run(&mut transport::shell(node, &script), STACK_DUMP_LIMIT);
            let path = self.logs.join(format!("hang-{}-{}-{}.txt", self.kit.name, node.name, unix_time()));
            let text = match out {
                Ok(Ended::Exited { stdout, .. }) => String::from_utf8_lossy(&stdout).into_owned(),
                Ok(Ended::Late { stdout, .. }) => format!(
                    "{}\n[spark-kit: the stack dump was cut off after {} s]\n",
                    String::from_utf8_lossy(&stdout),
                    STACK_DUMP_LIMIT.as_secs()
                ),
                Ok(Ended::HeldOpen) => "[spark-kit: the stack dump's output stayed open past its limit]\n".into(),
                Err(e) => e.to_string(),
            };
            let _ = std::fs::write(&path, text);
            self.rep.line(&format!("    stack dump of {} → {}", node.name, path.display()));
        }
    }

    pub(super) fn with_node(&self, i: usize, f: impl FnOnce(&mut NodeStatus)) {
        if let Ok(mut s) = self.h.snapshot.lock() {
            if let Some(n) = s.nodes.get_mut(i) {
                f(n);
            }
        }
    }

    fn publish(&self, m: &Machine) {
        self.h.tell_gateway(m.state);
        if let Ok(mut s) = self.h.snapshot.lock() {
            s.state = m.state;
            s.reason.clone_from(&m.reason);
            s.restarts = m.restarts.len();
            s.uptime_s = self.clock.elapsed().as_secs_f64();
            for (i, n) in s.nodes.iter_mut().enumerate() {
                n.uptime_s = self.watch[i].started_at.map(|t| t.elapsed().as_secs_f64());
            }
        }
    }
}

fn unix_time() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
