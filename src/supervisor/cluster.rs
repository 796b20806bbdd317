//! The supervisor of a deployment: one node agent per node (local, ssh or exec), bring-up in
//! order (workers first, then the head), health, dead ranks, hangs, restarts through the pure
//! state machine, and a status snapshot for `status` / `down` over the control socket.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::health::{base_url, probe_host};
use super::state::{Action, Input, Machine, Policy, State};
use super::{bringup, hang};
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

/// One node in the status snapshot (`status --json`, schema in docs/operations.md).
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default)]
pub struct NodeStatus {
    pub name: String,
    pub rank: usize,
    pub role: String,
    pub agent_pid: Option<u32>,
    pub agent_connected: bool,
    pub engine_pgid: Option<i32>,
    pub engine_alive: bool,
    pub engine_log: Option<String>,
    pub uptime_s: Option<f64>,
    pub mem_available: Option<u64>,
    pub quiet_s: f64,
    pub healthy: Option<bool>,
    pub tokens_per_s: Option<f64>,
    /// While booting: the engine's phase, from its log (`loading weights: shard 3/39`).
    #[serde(default)]
    pub phase: Option<String>,
    pub last_error: Option<String>,
}

/// The whole deployment as `status` shows it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub schema: u32,
    pub kit: String,
    pub state: State,
    pub reason: Option<String>,
    pub supervisor_pid: u32,
    pub uptime_s: f64,
    pub restarts: usize,
    pub endpoint: String,
    pub model: String,
    pub nodes: Vec<NodeStatus>,
}

/// Why the supervisor could not run.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot find the spark-kit executable: {0}")]
    SelfExe(std::io::Error),
    #[error(transparent)]
    Agent(#[from] client::AgentError),
    #[error("{0}")]
    Preflight(String),
    #[error("{0}")]
    Weights(String),
    #[error("node {node}'s agent did not answer within {secs} s (see {log})")]
    NoHello { node: String, secs: u64, log: String },
}

/// Shared handles: the snapshot others read, and the stop flag others set.
#[derive(Clone)]
pub struct Handles {
    pub snapshot: Arc<Mutex<Snapshot>>,
    pub stop: Arc<AtomicBool>,
}

struct Sup<'a> {
    kit: &'a Kit,
    exe: PathBuf,
    sha: String,
    logs: PathBuf,
    rep: &'a dyn ClusterReporter,
    agents: Vec<Option<AgentProc>>,
    tx: Sender<Msg>,
    h: Handles,
    clock: Instant,
    /// Per node: consecutive heartbeats with the engine gone.
    dead_checks: Vec<u32>,
    started_at: Vec<Option<Instant>>,
    baseline: Vec<Option<u64>>,
    /// Per node: when progress was last seen (health ok and tokens moving, or idle).
    stalled_since: Vec<Option<Instant>>,
    last_tokens: Vec<Option<(Instant, f64)>>,
    stopping: BTreeMap<usize, bool>,
    engines_started: bool,
}

/// What runs through the agents before any engine starts.
pub struct Gates {
    /// Preflight on every node (`None`: skipped with `--skip-preflight`).
    pub preflight: Option<PreflightInput>,
    /// The head's weight trees, which every node must hold (empty: each node makes its own model).
    pub weight_trees: Vec<WeightTree>,
    /// The head's home directory (paths under it are sent home-relative).
    pub home: PathBuf,
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
        dead_checks: vec![0; n],
        started_at: vec![None; n],
        baseline: vec![None; n],
        stalled_since: vec![None; n],
        last_tokens: vec![None; n],
        stopping: BTreeMap::new(),
        engines_started: false,
    };
    let mut machine = Machine::new(policy);
    for i in 0..n {
        sup.spawn_agent(i)?;
    }
    sup.wait_hello(&rx)?;
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
        if sup.h.stop.load(Ordering::SeqCst)
            && !matches!(machine.state, State::Stopping | State::Stopped | State::Failed)
        {
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
            self.dead_checks[i] = 0;
            self.stalled_since[i] = None;
            self.last_tokens[i] = None;
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
        let snap = self.h.snapshot.lock().map(|s| s.nodes.clone()).unwrap_or_default();
        snap.iter().enumerate().all(|(i, n)| match (self.baseline.get(i).copied().flatten(), n.mem_available) {
            (Some(base), Some(now)) => now + (base / 10).max(2 << 30) >= base,
            _ => true,
        })
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

    fn with_node(&self, i: usize, f: impl FnOnce(&mut NodeStatus)) {
        if let Ok(mut s) = self.h.snapshot.lock() {
            if let Some(n) = s.nodes.get_mut(i) {
                f(n);
            }
        }
    }

    fn publish(&self, m: &Machine) {
        if let Ok(mut s) = self.h.snapshot.lock() {
            s.state = m.state;
            s.reason.clone_from(&m.reason);
            s.restarts = m.restarts.len();
            s.uptime_s = self.clock.elapsed().as_secs_f64();
            for (i, n) in s.nodes.iter_mut().enumerate() {
                n.uptime_s = self.started_at[i].map(|t| t.elapsed().as_secs_f64());
            }
        }
    }

    /// Turn an agent message into state-machine inputs.
    fn on_msg(&mut self, msg: Msg, state: State) -> Vec<Input> {
        let (i, ev) = match msg {
            Msg::Lost(i) => {
                let name = self.kit.nodes[i].name.clone();
                if let Some(mut a) = self.agents[i].take() {
                    let _ = a.child.try_wait();
                }
                self.with_node(i, |n| {
                    n.agent_connected = false;
                    n.engine_alive = false;
                    n.last_error = Some("agent connection lost".into());
                });
                if let Some(done) = self.stopping.get_mut(&i) {
                    *done = true;
                    return Vec::new();
                }
                return vec![Input::RankDead { node: name, why: "agent connection lost".into() }];
            }
            Msg::Event(i, ev) => (i, ev),
        };
        let name = self.kit.nodes[i].name.clone();
        let head = self.kit.nodes[i].role == Role::Head;
        match ev {
            Event::Hello { pid, .. } => self.with_node(i, |n| {
                n.agent_pid = Some(pid);
                n.agent_connected = true;
            }),
            Event::Phase { name: p, detail } => self.rep.line(&format!("    {name}: {p}: {detail}")),
            Event::Started { pgid, log } => {
                self.started_at[i] = Some(Instant::now());
                self.rep.line(&format!("    {name}: engine started (process group {pgid}, log {log})"));
                self.with_node(i, |n| {
                    n.engine_pgid = Some(pgid);
                    n.engine_alive = true;
                    n.engine_log = Some(log);
                    n.last_error = None;
                    n.phase = None;
                });
            }
            Event::Ready { seconds } => {
                self.rep.line(&format!("    {name}: /health answered 200 after {seconds:.1} s"));
                if let Ok(mut s) = self.h.snapshot.lock() {
                    s.nodes.iter_mut().for_each(|n| n.phase = None);
                }
                return vec![Input::HeadReady];
            }
            Event::Exited { status, log_tail } => {
                self.rep.line(&format!("    {name}: engine exited ({status})"));
                self.with_node(i, |n| {
                    n.last_error = Some(format!("engine exited ({status}): {}", last_line(&log_tail)))
                });
                if head && self.engines_started {
                    let why = if matches!(state, State::Starting) {
                        format!("vLLM exited during start ({status})")
                    } else {
                        format!("engine exited ({status})")
                    };
                    return vec![Input::RankDead { node: name, why }];
                }
            }
            Event::Stopped { survivors, .. } => {
                if !survivors.is_empty() {
                    self.rep.line(&format!("error: on {name}, processes survived the stop: {}", survivors.join(", ")));
                }
                self.with_node(i, |n| {
                    n.engine_alive = false;
                    n.engine_pgid = None;
                });
                self.started_at[i] = None;
                if let Some(done) = self.stopping.get_mut(&i) {
                    *done = true;
                }
            }
            Event::Error { message, .. } => {
                self.rep.line(&format!("error: {name}: {message}"));
                self.with_node(i, |n| n.last_error = Some(message.clone()));
                if self.engines_started && matches!(state, State::Starting) {
                    return vec![Input::StartFailed { node: name, why: message }];
                }
            }
            Event::Boot { phase } => {
                if !self.h.snapshot.lock().is_ok_and(|s| matches!(s.state, State::Ready | State::Degraded)) {
                    self.with_node(i, |n| n.phase = Some(phase));
                }
            }
            Event::Files { .. } | Event::Facts { .. } => {}
            Event::Guard { event } => {
                let kind = event.get("event").and_then(serde_json::Value::as_str).unwrap_or_default();
                // Actions and floor crossings matter to the operator; samples and notes go to the log.
                if matches!(kind, "soft-floor" | "acting" | "acted" | "no-action" | "restart-gate") {
                    self.rep.line(&format!("    {name}: memory guard: {event}"));
                }
            }
            Event::Heartbeat { engine_alive, quiet_s, mem_available, healthy, progress } => {
                if self.baseline[i].is_none() && !self.engines_started {
                    self.baseline[i] = mem_available;
                }
                let tps = self.tokens_per_s(i, progress);
                self.with_node(i, |n| {
                    n.engine_alive = engine_alive;
                    n.quiet_s = quiet_s;
                    n.mem_available = mem_available;
                    n.healthy = healthy;
                    if tps.is_some() {
                        n.tokens_per_s = tps;
                    }
                });
                return self.judge(i, &name, state, engine_alive, quiet_s, healthy, progress);
            }
        }
        Vec::new()
    }

    fn tokens_per_s(&mut self, i: usize, progress: Option<(f64, f64)>) -> Option<f64> {
        let (_, tokens) = progress?;
        let now = Instant::now();
        let prev = self.last_tokens[i].replace((now, tokens));
        let (t0, k0) = prev?;
        let dt = now.duration_since(t0).as_secs_f64();
        (dt > 0.0).then(|| ((tokens - k0) / dt).max(0.0))
    }

    #[allow(clippy::too_many_arguments)]
    fn judge(
        &mut self,
        i: usize,
        name: &str,
        state: State,
        alive: bool,
        quiet_s: f64,
        healthy: Option<bool>,
        progress: Option<(f64, f64)>,
    ) -> Vec<Input> {
        if !self.engines_started || self.started_at[i].is_none() {
            return Vec::new();
        }
        let limit = self.kit.engine.hang_timeout_s;
        let mut out = Vec::new();
        // Dead rank: gone for three consecutive checks.
        if alive {
            self.dead_checks[i] = 0;
        } else {
            self.dead_checks[i] += 1;
            if self.dead_checks[i] == 3 {
                out.push(Input::RankDead {
                    node: name.into(),
                    why: "engine not running for 3 consecutive checks".into(),
                });
            }
            return out;
        }
        match state {
            // While booting, progress is log output from any rank: a headless worker legitimately
            // waits in silence while the head loads (the reference kit watched the head's log).
            State::Starting => {
                let quietest = self.job_quiet_s(i, quiet_s);
                if hang::is_hung(quietest, limit) {
                    out.push(Input::Hung { node: "every rank".into(), quiet_s: quietest });
                }
            }
            State::Ready | State::Degraded => {
                if let Some(h) = healthy {
                    out.push(Input::Health(h));
                }
                // Serving: a failing probe, or requests in flight with no new tokens, is a stall.
                let stalled = healthy == Some(false)
                    || progress.is_some_and(|(running, _)| running > 0.0) && self.tokens_frozen(i);
                if stalled {
                    let since = *self.stalled_since[i].get_or_insert_with(Instant::now);
                    let secs = since.elapsed().as_secs_f64();
                    if hang::is_hung(secs, limit) {
                        out.push(Input::Hung { node: name.into(), quiet_s: secs });
                    }
                } else if healthy.is_some() {
                    self.stalled_since[i] = None;
                }
            }
            _ => {}
        }
        out
    }

    /// Seconds since the last log line of any rank, `quiet_s` being node `i`'s fresh reading.
    fn job_quiet_s(&self, i: usize, quiet_s: f64) -> f64 {
        let others = self.h.snapshot.lock().map(|s| {
            s.nodes
                .iter()
                .enumerate()
                .filter(|(j, n)| *j != i && n.engine_alive)
                .map(|(_, n)| n.quiet_s)
                .collect::<Vec<_>>()
        });
        others.unwrap_or_default().into_iter().fold(quiet_s, f64::min)
    }

    fn tokens_frozen(&self, i: usize) -> bool {
        self.h.snapshot.lock().ok().and_then(|s| s.nodes.get(i).and_then(|n| n.tokens_per_s)).is_some_and(|t| t == 0.0)
    }
}

fn last_line(text: &str) -> String {
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().to_string()
}

fn unix_time() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A fresh snapshot for `kit` before anything runs.
#[must_use]
pub fn initial_snapshot(kit: &Kit) -> Snapshot {
    let ranks = node_ranks(kit);
    Snapshot {
        schema: 1,
        kit: kit.name.clone(),
        state: State::Starting,
        reason: None,
        supervisor_pid: std::process::id(),
        uptime_s: 0.0,
        restarts: 0,
        endpoint: format!("{}/v1", base_url(probe_host(&kit.engine.host), kit.engine.port)),
        model: kit.engine.served_model_name.clone(),
        nodes: kit
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeStatus {
                name: n.name.clone(),
                rank: ranks[i],
                role: if n.role == Role::Head { "head".into() } else { "worker".into() },
                ..NodeStatus::default()
            })
            .collect(),
    }
}
