//! JSON receipts: one file per guard action (time, readings, growers, decision, signals,
//! result), written after the action so the hot path never waits on the disk.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::attribution::{GroupGrowth, Grower};
use super::meminfo::Meminfo;
use super::psi::Pressure;
use crate::clock::rfc3339;

/// A signal the guard sent.
#[derive(Debug, Clone, Serialize)]
pub struct SignalSent {
    pub signal: &'static str,
    /// `pid`, `pgid` (a whole process group), `container` (`docker kill --signal`) or
    /// `container-pids` (the container's cgroup members killed by pid from the host).
    pub target: &'static str,
    /// The pid, the pgid, or the container's main pid.
    pub id: i32,
    /// The container, for target `container`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<super::engine::ContainerId>,
    /// Milliseconds after the guard first saw MemAvailable at or under the floor.
    pub after_crossing_ms: f64,
    pub error: Option<String>,
}

/// How the action ended.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The victim (process or every member of the group) is gone.
    pub gone: bool,
    /// Milliseconds from the first signal until it was gone (or the guard gave up).
    pub ms: f64,
    /// Pids still alive at the end.
    pub survivors: Vec<i32>,
    /// MemAvailable when the action ended.
    pub mem_available_after: u64,
}

/// One receipt.
#[derive(Debug, Clone, Serialize)]
pub struct Receipt {
    /// UTC, RFC 3339.
    pub time: String,
    pub unix_ms: u128,
    pub node: String,
    pub decision: &'static str,
    /// Why, in words.
    pub reason: String,
    pub policy: &'static str,
    pub soft_floor: u64,
    pub hard_floor: u64,
    /// The reading that crossed the floor, and the one the decision was taken on.
    pub at_crossing: Meminfo,
    pub at_decision: Meminfo,
    pub pressure: Option<Pressure>,
    /// MemAvailable fall over the attribution window, and the part no process's memory explains.
    pub window_s: f64,
    pub window_drop: u64,
    pub unattributed: u64,
    pub gpu_memory_source: &'static str,
    pub engine: Option<GroupGrowth>,
    pub growers: Vec<Grower>,
    pub victim: Option<Grower>,
    pub signals: Vec<SignalSent>,
    /// Milliseconds from the first reading at or under the floor to the first signal.
    pub reaction_ms: Option<f64>,
    pub outcome: Option<Outcome>,
    /// Soft-floor action: the model files whose page cache was dropped.
    pub cache_dropped: Vec<String>,
}

/// Milliseconds since the Unix epoch and the RFC 3339 UTC time.
#[must_use]
pub fn now() -> (u128, String) {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_millis(), rfc3339(d.as_secs(), d.subsec_millis()))
}

/// Write `r` as `<dir>/guard-<unix_ms>-<decision>.json` (pretty JSON, written then renamed).
pub fn write(dir: &Path, r: &Receipt) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("guard-{}-{}.json", r.unix_ms, r.decision));
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(r).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text + "\n")?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}
