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
use std::process::Stdio;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use super::bringup;
use super::snapshot::{memory_recovered, Handles, NodeStatus};
use super::state::{Action, Input, Machine, Policy, State};
use super::watch::Watch;
use crate::cluster::client::{self, AgentProc, Msg};
use crate::cluster::protocol::{Command, Event};
use crate::cluster::{push, transport};
use crate::engine::argv::node_ranks;
use crate::kit::schema::{Kit, Role};
use crate::node::preflight::PreflightInput;
use crate::weights::listing::WeightTree;

/// Human progress of the supervisor (the front end prints it).
pub trait ClusterReporter: Send + Sync {
    fn line(&self, text: &str);
}

/// Why the supervisor could not run.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot find the spark-kit executable")]
    SelfExe(#[source] std::io::Error),
    #[error(transparent)]
    Agent(#[from] client::AgentError),
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
            Self::SelfExe(_) | Self::Agent(_) | Self::NoHello { .. } => None,
            Self::Replace(_) => {
                Some("remove them by hand (`docker rm -f <name>` on that node), then run up again".into())
            }
        }
    }
}

pub(super) struct Sup<'a> {
    pub(super) kit: &'a Kit,
    exe: PathBuf,
    sha: String,
    logs: PathBuf,
    pub(super) rep: &'a dyn ClusterReporter,
    pub(super) agents: Vec<Option<AgentProc>>,
    tx: Sender<Msg>,
    pub(super) h: Handles,
    clock: Instant,
    /// Per node: what its heartbeats showed so far.
    pub(super) watch: Vec<Watch>,
    /// Per node: available memory when idle (a restart waits for it to come back).
    pub(super) baseline: Vec<Option<u64>>,
    /// Nodes told to stop, and whether they reported stopped.
    pub(super) stopping: BTreeMap<usize, bool>,
    pub(super) engines_started: bool,
}

/// What runs through the agents before any engine starts.
pub struct Gates {
    /// Preflight on every node (`None`: skipped with `--skip-preflight`).
    pub preflight: Option<PreflightInput>,
    /// The head's weight trees, which every node must hold (empty: each node makes its own model).
    pub weight_trees: Vec<WeightTree>,
    /// The head's home directory (paths under it are sent home-relative).
    pub home: PathBuf,
    /// `up --replace`: every agent first removes what an earlier run of the kit left.
    pub replace: bool,
}

/// Run the deployment until stopped; returns the exit code.
pub fn run(
    kit: &Kit,
    logs: &Path,
    policy: Policy,
    rep: &dyn ClusterReporter,
    h: Handles,
    gates: &Gates,
) -> Result<i32, ClusterError> {
    let exe = crate::dirs::self_exe().map_err(ClusterError::SelfExe)?;
    let sha = push::sha256_file(&exe).map_err(ClusterError::SelfExe)?;
    let (tx, rx) = mpsc::channel();
    let n = kit.nodes.len();
    let mut sup = Sup {
        kit,
        exe,
        sha,
        logs: logs.to_path_buf(),
        rep,
        agents: (0..n).map(|_| None).collect(),
        tx,
        h,
        clock: Instant::now(),
        watch: vec![Watch::default(); n],
        baseline: vec![None; n],
        stopping: BTreeMap::new(),
        engines_started: false,
    };
    let mut machine = Machine::new(policy);
    for i in 0..n {
        sup.spawn_agent(i)?;
    }
    sup.wait_hello(&rx)?;
    if gates.replace {
        sup.replace(&rx)?;
    }
    match &gates.preflight {
        Some(input) => sup.preflight(&rx, input)?,
        None => rep.line("==> preflight skipped (--skip-preflight)"),
    }
    sup.weights(&rx, gates)?;
    sup.start_all(&rx);
    let mut restart_at: Option<(Instant, Instant)> = None;
    loop {
        let mut inputs = Vec::new();
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(msg) => inputs.extend(sup.on_msg(msg, machine.state)),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        // With a gateway, the stop waits for its drain (503 to new requests, in-flight finish).
        if sup.h.stop_due() && !matches!(machine.state, State::Stopping | State::Stopped | State::Failed) {
            inputs.push(Input::StopRequested);
        }
        if let Some((due, mem_deadline)) = restart_at {
            let now = Instant::now();
            if now >= due && (sup.memory_recovered() || now >= mem_deadline) {
                if now >= mem_deadline && !sup.memory_recovered() {
                    rep.line("warning: memory did not return to the idle baseline within 300 s; restarting anyway");
                }
                restart_at = None;
                inputs.push(Input::RestartDue);
            }
        }
        for input in inputs {
            let now = sup.clock.elapsed().as_secs_f64();
            let actions = machine.step(input, now);
            sup.publish(&machine);
            for action in actions {
                match action {
                    Action::StartAll => {
                        sup.rep.line("==> starting the engines again");
                        for i in 0..n {
                            if sup.agents[i].is_none() {
                                if let Err(e) = sup.spawn_agent(i) {
                                    sup.rep.line(&format!("error: {e}"));
                                }
                            }
                        }
                        sup.start_all(&rx);
                    }
                    Action::StopAll { reason } => {
                        sup.rep.line(&format!("==> stopping every engine: {reason}"));
                        sup.stop_all();
                        if sup.stopping.is_empty() {
                            let more = machine.step(Input::AllStopped, sup.clock.elapsed().as_secs_f64());
                            sup.publish(&machine);
                            if let Some(code) = sup.follow(&more, &mut restart_at) {
                                return Ok(code);
                            }
                        }
                    }
                    Action::DumpStacks => sup.dump_stacks(),
                    other => {
                        if let Some(code) = sup.follow(&[other], &mut restart_at) {
                            return Ok(code);
                        }
                    }
                }
            }
        }
        if sup.stopping.values().all(|done| *done) && !sup.stopping.is_empty() {
            sup.stopping.clear();
            let now = sup.clock.elapsed().as_secs_f64();
            let actions = machine.step(Input::AllStopped, now);
            sup.publish(&machine);
            if let Some(code) = sup.follow(&actions, &mut restart_at) {
                return Ok(code);
            }
        }
        sup.publish(&machine);
    }
}

impl Sup<'_> {
    fn follow(&mut self, actions: &[Action], restart_at: &mut Option<(Instant, Instant)>) -> Option<i32> {
        for a in actions {
            match a {
                Action::ScheduleRestart { delay_s } => {
                    self.rep.line(&format!(
                        "==> restarting in {delay_s:.0} s (once memory is back near the idle baseline)"
                    ));
                    let now = Instant::now();
                    *restart_at = Some((now + Duration::from_secs_f64(*delay_s), now + Duration::from_secs(300)));
                }
                Action::Exit(code) => {
                    self.close_agents();
                    return Some(*code);
                }
                Action::ServingAgain => {
                    let endpoint = crate::deploy::ports::Ports::of(&self.kit).endpoint();
                    self.rep.line(&format!("==> serving again after the restart: {endpoint}"));
                }
                _ => {}
            }
        }
        None
    }

    fn agent_log(&self, i: usize) -> PathBuf {
        self.logs.join(format!("{}-{}-agent.log", self.kit.name, self.kit.nodes[i].name))
    }

    fn spawn_agent(&mut self, i: usize) -> Result<(), ClusterError> {
        let node = &self.kit.nodes[i];
        let rank = node_ranks(self.kit)[i];
        let agent = client::spawn(node, i, rank, &self.exe, &self.sha, &self.agent_log(i), self.tx.clone())?;
        self.agents[i] = Some(agent);
        Ok(())
    }

    fn send(&mut self, i: usize, cmd: &Command) -> bool {
        self.agents[i].as_mut().is_some_and(|a| a.send(cmd))
    }

    fn wait_hello(&mut self, rx: &Receiver<Msg>) -> Result<(), ClusterError> {
        let mut seen = vec![false; self.kit.nodes.len()];
        let deadline = Instant::now() + Duration::from_secs(60);
        while !seen.iter().all(|s| *s) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Msg::Event(i, Event::Hello { pid, .. })) => {
                    seen[i] = true;
                    self.with_node(i, |n| {
                        n.agent_pid = Some(pid);
                        n.agent_connected = true;
                    });
                }
                Ok(Msg::Event(i, Event::Heartbeat { mem_available, .. })) => {
                    if self.baseline[i].is_none() {
                        self.baseline[i] = mem_available;
                    }
                }
                Ok(Msg::Event(..)) => {}
                Ok(Msg::Lost(i)) => return Err(self.no_hello(i, 0)),
                Err(RecvTimeoutError::Disconnected) => return Err(self.no_hello(0, 0)),
                Err(RecvTimeoutError::Timeout) => {
                    let i = seen.iter().position(|s| !s).unwrap_or(0);
                    return Err(self.no_hello(i, 60));
                }
            }
        }
        Ok(())
    }

    /// `--replace`: every agent removes what an earlier run of the kit left on its node.
    fn replace(&mut self, rx: &Receiver<Msg>) -> Result<(), ClusterError> {
        self.rep.line("==> --replace: removing what an earlier run left on every node");
        let mut pending: BTreeMap<usize, ()> = BTreeMap::new();
        for i in 0..self.kit.nodes.len() {
            if self.send(i, &Command::Clean { kit: Box::new(self.kit.clone()) }) {
                pending.insert(i, ());
            }
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut held = Vec::new();
        let mut failed = None;
        while !pending.is_empty() && Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(Msg::Event(i, Event::Cleaned { removed })) if pending.remove(&i).is_some() => {
                    let what = if removed.is_empty() { "nothing".to_string() } else { removed.join(", ") };
                    self.rep.line(&format!("    {}: removed {what}", self.kit.nodes[i].name));
                }
                Ok(Msg::Event(i, Event::Error { message, .. })) if pending.remove(&i).is_some() => {
                    failed = Some(format!("--replace on {}: {message}", self.kit.nodes[i].name));
                }
                Ok(m) => held.push(m),
                Err(_) => {}
            }
        }
        for m in held {
            let _ = self.tx.send(m);
        }
        if let Some(i) = pending.keys().next() {
            failed.get_or_insert(format!("--replace: {} did not answer within 120 s", self.kit.nodes[*i].name));
        }
        match failed {
            Some(why) => {
                self.close_agents();
                Err(ClusterError::Replace(why))
            }
            None => Ok(()),
        }
    }

    /// Preflight on every node through its agent; a failure stops the bring-up.
    fn preflight(&mut self, rx: &Receiver<Msg>, input: &PreflightInput) -> Result<(), ClusterError> {
        self.rep.line("==> preflight on every node");
        let mut held = Vec::new();
        let agents = &mut self.agents;
        let facts = bringup::gather_all(
            self.kit,
            input,
            rx,
            &mut |i, cmd| agents[i].as_mut().is_some_and(|a| a.send(cmd)),
            &mut held,
        );
        for m in held {
            let _ = self.tx.send(m);
        }
        let report = bringup::evaluate(self.kit, input, &facts);
        for line in bringup::report_lines(&report) {
            self.rep.line(&line);
        }
        bringup::gate(&report).map_err(|e| {
            self.close_agents();
            ClusterError::Preflight(e)
        })
    }

    /// Weights on every node (rsync first when the kit says so); a difference stops the bring-up.
    fn weights(&mut self, rx: &Receiver<Msg>, gates: &Gates) -> Result<(), ClusterError> {
        let w = bringup::WeightsCtx {
            kit: self.kit,
            roots: gates.weight_trees.clone(),
            home: gates.home.clone(),
            exe: &self.exe,
            sha: &self.sha,
        };
        let mut held = Vec::new();
        let agents = &mut self.agents;
        let rep = self.rep;
        let result =
            bringup::weights(&w, rx, &mut |i, cmd| agents[i].as_mut().is_some_and(|a| a.send(cmd)), &mut held, &|l| {
                rep.line(l)
            });
        for m in held {
            let _ = self.tx.send(m);
        }
        result.map_err(|e| {
            self.close_agents();
            ClusterError::Weights(e)
        })
    }

    fn no_hello(&mut self, i: usize, secs: u64) -> ClusterError {
        let log = self.agent_log(i);
        let tail = crate::engine::venv::tail(&log, 3).replace('\n', " | ");
        self.close_agents();
        ClusterError::NoHello {
            node: format!("{} ({tail})", self.kit.nodes[i].name),
            secs,
            log: log.display().to_string(),
        }
    }

    /// Workers first (each must report Started), then the head.
    fn start_all(&mut self, rx: &Receiver<Msg>) {
        let mut order: Vec<usize> =
            (0..self.kit.nodes.len()).filter(|i| self.kit.nodes[*i].role != Role::Head).collect();
        order.extend((0..self.kit.nodes.len()).filter(|i| self.kit.nodes[*i].role == Role::Head));
        for (k, i) in order.iter().copied().enumerate() {
            self.watch[i].restart();
            self.rep.line(&format!("==> node {}: starting its engine", self.kit.nodes[i].name));
            let cmd = Command::Start { kit: Box::new(self.kit.clone()), node: i };
            if !self.send(i, &cmd) {
                self.rep.line(&format!("error: node {} has no agent connection", self.kit.nodes[i].name));
                continue;
            }
            // Wait for this node to report its engine started before starting the next one,
            // processing (and re-queueing) other messages meanwhile.
            if k + 1 < order.len() {
                let deadline = Instant::now() + Duration::from_secs(u64::from(self.kit.engine.ready_timeout_s));
                let mut held = Vec::new();
                while Instant::now() < deadline {
                    match rx.recv_timeout(Duration::from_millis(500)) {
                        Ok(Msg::Event(j, ev))
                            if j == i && matches!(ev, Event::Started { .. } | Event::Error { .. }) =>
                        {
                            held.push(Msg::Event(j, ev));
                            break;
                        }
                        Ok(Msg::Event(j, Event::Phase { name, detail })) => {
                            self.rep.line(&format!("    {}: {name}: {detail}", self.kit.nodes[j].name));
                        }
                        Ok(m) => held.push(m),
                        Err(_) => {}
                    }
                }
                for m in held {
                    let _ = self.tx.send(m);
                }
            }
        }
        self.engines_started = true;
    }

    fn stop_all(&mut self) {
        let drain = u64::from(self.kit.engine.shutdown_timeout_s) + 5;
        self.stopping.clear();
        for i in 0..self.kit.nodes.len() {
            if self.send(i, &Command::Stop { drain_s: drain }) {
                self.stopping.insert(i, false);
            }
        }
        self.engines_started = false;
    }

    fn close_agents(&mut self) {
        for a in self.agents.iter_mut().flatten() {
            a.hang_up();
        }
        let deadline = Instant::now() + Duration::from_secs(u64::from(self.kit.engine.shutdown_timeout_s) + 20);
        for a in self.agents.iter_mut().flatten() {
            a.reap(deadline);
        }
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
            let out = transport::shell(node, &script).stdin(Stdio::null()).output();
            let path = self.logs.join(format!("hang-{}-{}-{}.txt", self.kit.name, node.name, unix_time()));
            let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_else(|e| e.to_string());
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
