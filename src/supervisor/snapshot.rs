//! What `status` shows: the deployment snapshot the supervisor publishes (schema in
//! docs/operations.md), the handles others share with the supervisor, and the pure readings
//! taken from a snapshot (memory back near the baseline, the quietest rank).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::state::State;
use crate::deploy::ports::{base_url, probe_host};
use crate::engine::argv::node_ranks;
use crate::gateway::{DrainOutcome, EngineState, Front, ServeError};
use crate::kit::schema::{Kit, Role};

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
    /// Docker runtime: the engine's container id and its image id (absent for a venv engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
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
    /// The gateway in front of the engine (absent when none runs in the supervisor).
    #[serde(default)]
    pub gateway: Option<GatewayStatus>,
}

/// The gateway as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct GatewayStatus {
    /// Where clients connect.
    pub listen: String,
    /// `ready`, `unavailable` (503 while the engine starts or restarts) or `draining`.
    pub state: String,
    /// Requests holding an engine slot.
    pub in_flight: usize,
    /// Requests waiting for a slot.
    pub queued: usize,
}

/// The gateway's state for the deployment's: serving while ready (degraded included: the
/// engine's own `/health` tells), 503 otherwise.
#[must_use]
pub fn gateway_state(s: State) -> EngineState {
    match s {
        State::Ready | State::Degraded => EngineState::Ready,
        State::Starting | State::Restarting | State::Stopping | State::Stopped | State::Failed => {
            EngineState::Unavailable
        }
    }
}

fn state_name(s: EngineState) -> &'static str {
    match s {
        EngineState::Ready => "ready",
        EngineState::Unavailable => "unavailable",
        EngineState::Draining => "draining",
    }
}

/// Shared handles: the snapshot others read, the stop flag others set, and the gateway in
/// front of the engine when one runs in this process.
#[derive(Clone)]
pub struct Handles {
    pub snapshot: Arc<Mutex<Snapshot>>,
    pub stop: Arc<AtomicBool>,
    pub front: Option<Arc<Front>>,
}

impl Handles {
    /// Fresh handles for `kit` before anything runs.
    #[must_use]
    pub fn new(kit: &Kit) -> Self {
        Self {
            snapshot: Arc::new(Mutex::new(initial_snapshot(kit))),
            stop: Arc::new(AtomicBool::new(false)),
            front: None,
        }
    }

    /// The same handles with `front` as the deployment's gateway.
    #[must_use]
    pub fn with_front(mut self, front: Arc<Front>) -> Self {
        self.front = Some(front);
        self
    }

    /// Has a stop been asked for and may the engines be stopped now? With a gateway, the first
    /// call after the stop starts its drain (503 for new requests) and this stays false until
    /// the in-flight requests have finished or the drain timeout has passed.
    #[must_use]
    pub fn stop_due(&self) -> bool {
        if !self.stop.load(Ordering::SeqCst) {
            return false;
        }
        match &self.front {
            None => true,
            Some(f) => {
                f.begin_drain();
                f.finished().is_some()
            }
        }
    }

    /// How the gateway's drain ended, once it has.
    #[must_use]
    pub fn drained(&self) -> Option<Result<DrainOutcome, ServeError>> {
        self.front.as_ref().and_then(|f| f.finished())
    }

    /// Tell the gateway (if any) the deployment's state.
    pub fn tell_gateway(&self, s: State) {
        if let Some(f) = &self.front {
            f.gateway().set_engine_state(gateway_state(s));
        }
    }

    /// The snapshot with the gateway's live counts.
    #[must_use]
    pub fn current(&self) -> Option<Snapshot> {
        let mut s = self.snapshot.lock().ok()?.clone();
        s.gateway = self.front.as_ref().map(|f| {
            let g = f.gateway();
            GatewayStatus {
                listen: g.config().bind.to_string(),
                state: state_name(g.engine_state()).into(),
                in_flight: g.in_flight(),
                queued: g.queued(),
            }
        });
        Some(s)
    }
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
        gateway: None,
    }
}

/// Is every node's available memory back within 10 % (at least 2 GiB) of its idle baseline?
/// Nodes without both readings do not hold a restart back.
#[must_use]
pub fn memory_recovered(baseline: &[Option<u64>], nodes: &[NodeStatus]) -> bool {
    nodes.iter().enumerate().all(|(i, n)| match (baseline.get(i).copied().flatten(), n.mem_available) {
        (Some(base), Some(now)) => now + (base / 10).max(2 << 30) >= base,
        _ => true,
    })
}

/// Seconds since the last log line of any live rank: node `i`'s fresh reading `quiet_s`
/// against the other live nodes' last readings.
#[must_use]
pub fn quietest(nodes: &[NodeStatus], i: usize, quiet_s: f64) -> f64 {
    nodes.iter().enumerate().filter(|(j, n)| *j != i && n.engine_alive).map(|(_, n)| n.quiet_s).fold(quiet_s, f64::min)
}

/// The last non-blank line of a log tail.
#[must_use]
pub fn last_line(text: &str) -> String {
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(mem: Option<u64>, alive: bool, quiet_s: f64) -> NodeStatus {
        NodeStatus { mem_available: mem, engine_alive: alive, quiet_s, ..NodeStatus::default() }
    }

    #[test]
    fn memory_is_back_within_a_tenth_or_two_gib() {
        let gib = 1u64 << 30;
        let base = [Some(100 * gib), Some(10 * gib)];
        assert!(memory_recovered(&base, &[node(Some(91 * gib), true, 0.0), node(Some(8 * gib), true, 0.0)]));
        assert!(!memory_recovered(&base, &[node(Some(89 * gib), true, 0.0), node(Some(8 * gib), true, 0.0)]));
        // 2 GiB is the least slack, whatever the baseline.
        assert!(!memory_recovered(&base, &[node(Some(100 * gib), true, 0.0), node(Some(7 * gib), true, 0.0)]));
        // A node without a reading does not hold the restart back.
        assert!(memory_recovered(&[None, Some(gib)], &[node(Some(0), true, 0.0), node(None, true, 0.0)]));
    }

    #[test]
    fn the_quietest_rank_is_the_least_quiet_live_one() {
        let nodes = [node(None, true, 50.0), node(None, true, 5.0), node(None, false, 1.0)];
        // Node 0's fresh reading against node 1 (live); node 2 is dead and does not count.
        assert!((quietest(&nodes, 0, 30.0) - 5.0).abs() < 1e-9);
        assert!((quietest(&nodes, 1, 2.0) - 2.0).abs() < 1e-9);
        assert!((quietest(&nodes[..1], 0, 7.0) - 7.0).abs() < 1e-9);
    }

    #[test]
    fn last_line_skips_blank_lines() {
        assert_eq!(last_line("a\nb\n\n  \n"), "b");
        assert_eq!(last_line(""), "");
    }

    #[test]
    fn initial_snapshot_names_every_node_and_the_endpoint() {
        let kit = crate::kit::builtin_kit("tiny-cpu-2node");
        let s = initial_snapshot(&kit);
        assert_eq!(s.state, State::Starting);
        assert_eq!(s.nodes.len(), kit.nodes.len());
        assert_eq!(s.nodes.iter().filter(|n| n.role == "head").count(), 1);
        assert!(s.endpoint.starts_with("http://") && s.endpoint.ends_with(&format!(":{}/v1", kit.engine.port)));
        assert_eq!(s.model, kit.engine.served_model_name);
        assert_eq!(s.gateway, None);
    }

    #[test]
    fn a_stop_waits_for_the_gateways_drain() {
        let kit = crate::kit::builtin_kit("tiny-cpu");
        let bare = Handles::new(&kit);
        assert!(!bare.stop_due());
        bare.stop.store(true, Ordering::SeqCst);
        assert!(bare.stop_due(), "without a gateway the stop is due at once");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let limits =
            crate::gateway::admission::Limits { max_model_len: 8, kv_pool_tokens: None, safe_max_prompt: None };
        let cfg = crate::gateway::GatewayConfig::new(
            std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            "http://127.0.0.1:9".into(),
            vec![],
            1,
            limits,
        );
        let h = Handles::new(&kit).with_front(Front::start(cfg).unwrap());
        h.tell_gateway(State::Ready);
        assert_eq!(h.current().unwrap().gateway.unwrap().state, "ready");
        assert!(!h.stop_due());
        h.stop.store(true, Ordering::SeqCst);
        let t = std::time::Instant::now();
        while !h.stop_due() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "the idle drain never finished");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let g = h.current().unwrap().gateway.unwrap();
        assert_eq!((g.state.as_str(), g.in_flight, g.queued), ("draining", 0, 0));
        assert_eq!(h.drained(), Some(Ok(DrainOutcome::Idle)));
        // Draining stays: a later state change does not reopen the gateway.
        h.tell_gateway(State::Ready);
        assert_eq!(h.current().unwrap().gateway.unwrap().state, "draining");
    }

    #[test]
    fn the_gateway_serves_only_while_ready_or_degraded() {
        assert_eq!(gateway_state(State::Ready), EngineState::Ready);
        assert_eq!(gateway_state(State::Degraded), EngineState::Ready);
        for s in [State::Starting, State::Restarting, State::Stopping, State::Stopped, State::Failed] {
            assert_eq!(gateway_state(s), EngineState::Unavailable, "{s:?}");
        }
    }
}
