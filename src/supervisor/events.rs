//! Agent events as the supervisor sees them: each event updates the status snapshot and may
//! become state-machine inputs (a dead rank, a failed start, a hang, the head ready).

use std::time::Instant;

use super::run::Sup;
use super::snapshot::{last_line, quietest};
use super::state::{Input, State};
use super::watch::{Beat, Limits};
use crate::cluster::client::Msg;
use crate::cluster::protocol::Event;
use crate::kit::schema::Role;

impl Sup<'_> {
    /// Turn an agent message into state-machine inputs.
    pub(super) fn on_msg(&mut self, msg: Msg, state: State) -> Vec<Input> {
        let (i, ev) = match msg {
            Msg::Lost(i) => {
                let name = self.kit.nodes[i].name.clone();
                self.agents.lost(i);
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
                self.watch[i].started_at = Some(Instant::now());
                self.rep.line(&format!("    {name}: engine started (process group {pgid}, log {log})"));
                self.with_node(i, |n| {
                    n.engine_pgid = Some(pgid);
                    n.engine_alive = true;
                    n.engine_log = Some(log);
                    n.container_id = None;
                    n.image_id = None;
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
                self.watch[i].started_at = None;
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
            Event::EngineIds { container_id, image_id } => {
                self.with_node(i, |n| {
                    n.container_id = Some(container_id);
                    n.image_id = Some(image_id);
                });
            }
            Event::Files { .. } | Event::Facts { .. } | Event::Cleaned { .. } => {}
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
                let now = Instant::now();
                let tps = self.watch[i].tokens_per_s(progress, now);
                self.with_node(i, |n| {
                    n.engine_alive = engine_alive;
                    n.quiet_s = quiet_s;
                    n.mem_available = mem_available;
                    n.healthy = healthy;
                    if tps.is_some() {
                        n.tokens_per_s = tps;
                    }
                });
                if !self.engines_started {
                    return Vec::new();
                }
                let nodes = self.h.snapshot.lock().map(|s| s.nodes.clone()).unwrap_or_default();
                let e = &self.kit.engine;
                let limits = Limits { boot_s: e.hang_timeout_s, stall_s: e.effective_stall_timeout_s() };
                let beat = Beat { alive: engine_alive, quietest_s: quietest(&nodes, i, quiet_s), healthy, progress };
                return self.watch[i].judge(&name, state, &beat, limits, now);
            }
        }
        Vec::new()
    }
}
