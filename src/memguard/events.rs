//! What the guard tells its host: events (through [`GuardReporter`]), live numbers
//! ([`GuardStatus`]) and why it cannot start ([`GuardError`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Mutex};

use serde::Serialize;

use super::attribution::{GroupGrowth, Grower};
use super::gate::{Gate, OomAdjCheck};

/// Receives the guard's events (the node agent forwards them; the `guard` command prints them).
pub trait GuardReporter: Send + Sync {
    fn event(&self, event: &GuardEvent);
}

/// A reporter that sends each event down a channel (to the thread that prints them).
pub struct Channel(Mutex<mpsc::Sender<GuardEvent>>);

impl Channel {
    #[must_use]
    pub fn new(tx: mpsc::Sender<GuardEvent>) -> Self {
        Self(Mutex::new(tx))
    }
}

impl GuardReporter for Channel {
    fn event(&self, event: &GuardEvent) {
        if let Ok(tx) = self.0.lock() {
            let _ = tx.send(event.clone());
        }
    }
}

/// What the guard reports.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum GuardEvent {
    Started {
        node: String,
        policy: &'static str,
        soft_floor: u64,
        hard_floor: u64,
        mem_available: u64,
        mem_free: u64,
        /// The PSI trigger registered, or why there is none.
        psi: String,
        memory_locked: bool,
        gpu_memory_source: &'static str,
        baseline: Option<u64>,
        max_interval_ms: u64,
        receipts: PathBuf,
    },
    /// A one-time note (PSI absent, mlockall refused, …).
    Note {
        message: String,
    },
    /// The engine group's `oom_score_adj` was checked (on every new engine group).
    OomScoreAdj {
        pgid: i32,
        check: OomAdjCheck,
    },
    /// Below the soft floor: cache dropped, top growers named.
    SoftFloor {
        mem_available: u64,
        growers: Vec<Grower>,
        cache_dropped: usize,
        receipt: Option<PathBuf>,
    },
    /// A signal went out (right after it was sent).
    Acting {
        decision: &'static str,
        reason: String,
        victim: Option<Grower>,
        engine: Option<GroupGrowth>,
        signal: &'static str,
        reaction_ms: f64,
    },
    /// The action ended; its receipt.
    Acted {
        decision: &'static str,
        gone: bool,
        ms: f64,
        receipt: Option<PathBuf>,
        error: Option<String>,
    },
    /// Below the hard floor with policy `off` or nothing to act on (once per crossing).
    NoAction {
        decision: &'static str,
        mem_available: u64,
        receipt: Option<PathBuf>,
    },
    /// After an engine kill: the restart gate.
    RestartGate {
        gate: Gate,
    },
    Stopped,
}

/// Live numbers the host (node agent) can read at any time.
#[derive(Debug, Default)]
pub struct GuardStatus {
    pub mem_available: AtomicU64,
    pub mem_free: AtomicU64,
    pub actions: AtomicU64,
    /// False from an engine kill until MemAvailable is back near the idle baseline.
    pub restart_allowed: AtomicBool,
}

/// Why the guard cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("memory guard: soft floor {soft} B is below the hard floor {hard} B")]
    Floors { soft: u64, hard: u64 },
    #[error("memory guard: cannot open {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("memory guard: {path} has no MemTotal/MemFree/MemAvailable")]
    Meminfo { path: PathBuf },
    #[error("memory guard: cannot create the receipt directory {path}: {source}")]
    Receipts { path: PathBuf, source: std::io::Error },
}
