//! The guard's settings: the kit's `memory.guard` plus the loop's timing defaults.

use std::path::PathBuf;
use std::time::Duration;

use super::gate::DEFAULT_TOLERANCE;
use crate::kit::schema::{GuardPolicy, Kit};

pub(super) const MIB: u64 = 1 << 20;

/// Everything the guard needs to know.
#[derive(Debug, Clone)]
pub struct GuardConfig {
    /// Node name, for receipts.
    pub node: String,
    pub soft_floor: u64,
    pub hard_floor: u64,
    pub policy: GuardPolicy,
    /// Process names (`comm`; `prefix*`) that may be killed to save the engine.
    pub sacrificable: Vec<String>,
    /// Model directories or files whose page cache the soft floor drops.
    pub model_paths: Vec<PathBuf>,
    /// Growth below this over the window does not make a process "the one that grew".
    pub min_blame: u64,
    /// Attribution window.
    pub window: Duration,
    /// Longest time between two samples (100 ms = 10 Hz).
    pub interval: Duration,
    /// Shortest time between two samples, used when the projected time to the floor is short.
    pub min_interval: Duration,
    /// Time between `/proc` scans while far from the floors.
    pub scan_interval: Duration,
    /// SIGTERM → SIGKILL for the engine group.
    pub drain: Duration,
    /// SIGTERM → SIGKILL for another process.
    pub kill_grace: Duration,
    /// MemAvailable of the idle node; default: measured at start when no engine runs.
    pub idle_baseline: Option<u64>,
    /// A restart is allowed within this distance of the baseline.
    pub baseline_tolerance: u64,
    /// Only processes descending from this pid may be killed as offenders (a safety scope
    /// for shared hosts and tests); the engine group is always eligible.
    pub victims_under: Option<i32>,
    /// `mlockall`, `oom_score_adj -1000` and nice −20 for this process, where permitted.
    pub harden: bool,
    /// The engine uses a GB10 GPU (unified memory): a fall no process's RSS explains is counted as
    /// the engine's. False for CPU kits, whose engine memory is all in RSS.
    pub engine_on_gpu: bool,
    /// `/proc` (tests point it elsewhere only for the parsers; the loop needs the real one).
    pub proc_root: PathBuf,
    /// Where the cgroup hierarchies are mounted (a container engine's memory is read there).
    pub cgroup_root: PathBuf,
}

impl GuardConfig {
    /// The kit's `memory.guard` for node `node`, with the defaults for the rest.
    #[must_use]
    pub fn from_kit(kit: &Kit, node: &str) -> Self {
        let g = &kit.memory.guard;
        Self {
            node: node.to_string(),
            soft_floor: g.soft_floor.bytes(),
            hard_floor: g.hard_floor.bytes(),
            policy: g.policy,
            sacrificable: g.sacrificable.clone(),
            model_paths: kit.model.path.iter().map(PathBuf::from).collect(),
            drain: Duration::from_secs(u64::from(kit.engine.shutdown_timeout_s.clamp(1, 10))),
            engine_on_gpu: kit.needs_gpu(),
            ..Self::default()
        }
    }
}

/// Values that replace the kit's (the `guard` command's flags): `None` or empty keeps the kit's.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub soft_floor: Option<u64>,
    pub hard_floor: Option<u64>,
    pub policy: Option<GuardPolicy>,
    pub sacrificable: Vec<String>,
    pub model_paths: Vec<PathBuf>,
    pub idle_baseline: Option<u64>,
    pub drain: Option<Duration>,
    /// Replaces the kit's scope even when `None` (the kit has none).
    pub victims_under: Option<i32>,
}

impl GuardConfig {
    /// This configuration with `o` applied over it.
    #[must_use]
    pub fn with(mut self, o: Overrides) -> Self {
        self.soft_floor = o.soft_floor.unwrap_or(self.soft_floor);
        self.hard_floor = o.hard_floor.unwrap_or(self.hard_floor);
        self.policy = o.policy.unwrap_or(self.policy);
        if !o.sacrificable.is_empty() {
            self.sacrificable = o.sacrificable;
        }
        if !o.model_paths.is_empty() {
            self.model_paths = o.model_paths;
        }
        self.idle_baseline = o.idle_baseline.or(self.idle_baseline);
        self.drain = o.drain.unwrap_or(self.drain);
        self.victims_under = o.victims_under;
        self
    }
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            node: "local".into(),
            soft_floor: 4 << 30,
            hard_floor: 2560 * MIB,
            policy: GuardPolicy::ProtectHost,
            sacrificable: Vec::new(),
            model_paths: Vec::new(),
            min_blame: 256 * MIB,
            window: Duration::from_secs(5),
            interval: Duration::from_millis(100),
            min_interval: Duration::from_millis(5),
            scan_interval: Duration::from_millis(500),
            drain: Duration::from_secs(5),
            kill_grace: Duration::from_secs(2),
            idle_baseline: None,
            baseline_tolerance: DEFAULT_TOLERANCE,
            victims_under: None,
            harden: true,
            engine_on_gpu: true,
            proc_root: PathBuf::from("/proc"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        }
    }
}

#[cfg(test)]
mod overrides_tests {
    use super::*;

    #[test]
    fn flags_win_and_empty_ones_keep_the_kits() {
        let base = GuardConfig { sacrificable: vec!["a".into()], idle_baseline: Some(7), ..GuardConfig::default() };
        let c = base.clone().with(Overrides {
            hard_floor: Some(1),
            policy: Some(GuardPolicy::Off),
            ..Overrides::default()
        });
        assert_eq!((c.soft_floor, c.hard_floor, c.policy), (base.soft_floor, 1, GuardPolicy::Off));
        assert_eq!((c.sacrificable, c.idle_baseline, c.drain), (base.sacrificable, Some(7), base.drain));
    }
}
