//! The guard's decision as a pure function of one reading and the window's attribution
//! (gb10-ops.md §2.3; issue 7): soft floor → drop model page cache and warn; hard floor → the
//! engine grew: drain and kill its group; another process grew and the policy is
//! `kill-offender` (or it is sacrificable): kill it; otherwise stop the engine.

use serde::Serialize;

use super::attribution::{Attribution, Grower};
use crate::kit::schema::GuardPolicy;

/// Thresholds and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floors {
    pub soft: u64,
    pub hard: u64,
    pub policy: GuardPolicy,
    /// Growth (bytes over the window) below which a process is not "the one that grew".
    pub min_blame: u64,
    /// Whether a fall of MemAvailable that no process's memory explains is the engine's: true for
    /// a GPU engine on GB10 without NVML (driver memory is in no process's RSS there), false when
    /// NVML measures GPU memory per process or the engine runs on the CPU (its RSS is complete).
    pub unattributed_is_engine: bool,
}

/// Why the engine is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineReason {
    /// The engine group grew the most.
    EngineGrew,
    /// Someone else grew, but the policy protects the host rather than killing them.
    ProtectHost,
    /// No process clearly grew (e.g. driver memory without NVML): stop the engine to protect the host.
    Unattributed,
}

/// What the guard does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Above the soft floor.
    Idle,
    /// Below the soft floor: drop the page cache of the model shards and warn.
    Soft,
    /// Below the hard floor: drain, then kill the engine's process group.
    StopEngine { pgid: i32, reason: EngineReason },
    /// Below the hard floor: kill this process.
    KillProcess { grower: Grower, sacrificable: bool },
    /// Below the hard floor, but policy `off`.
    Off,
    /// Below the hard floor with nothing to act on (no engine, no eligible grower).
    NoVictim,
}

impl Decision {
    /// Short name for receipts and events.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Decision::Idle => "idle",
            Decision::Soft => "drop-cache-and-warn",
            Decision::StopEngine { reason: EngineReason::EngineGrew, .. } => "kill-engine-group",
            Decision::StopEngine { .. } => "stop-engine",
            Decision::KillProcess { .. } => "kill-offender",
            Decision::Off => "policy-off-no-action",
            Decision::NoVictim => "no-victim",
        }
    }
}

/// Whether `comm` matches one of the kit's sacrificable names: exact, or a prefix when the
/// pattern ends with `*`. Names are compared as the kernel keeps them (15 bytes at most).
#[must_use]
pub fn is_sacrificable(comm: &[u8], names: &[String]) -> bool {
    names.iter().any(|n| {
        let n = n.as_bytes();
        match n.strip_suffix(b"*") {
            Some(prefix) => comm.starts_with(prefix),
            None => comm == &n[..n.len().min(15)],
        }
    })
}

/// Decide. `mem_available` is the current reading, `window_drop` how far MemAvailable fell over
/// the attribution window, `sacrificable` the kit's list.
#[must_use]
pub fn decide(
    floors: &Floors,
    mem_available: u64,
    window_drop: u64,
    a: &Attribution,
    sacrificable: &[String],
) -> Decision {
    if mem_available > floors.soft && mem_available > floors.hard {
        return Decision::Idle;
    }
    if mem_available > floors.hard {
        return Decision::Soft;
    }
    if floors.policy == GuardPolicy::Off {
        return Decision::Off;
    }
    let unattributed = window_drop.saturating_sub(a.attributed_bytes);
    let engine_grown = a.engine.map_or(0, |e| e.grown_bytes)
        + if floors.unattributed_is_engine && a.engine.is_some() { unattributed } else { 0 };
    let top = a.growers().first().copied().filter(|g| g.grown >= floors.min_blame && g.grown > engine_grown);
    if let Some(g) = top {
        let sac = is_sacrificable(g.comm.as_bytes(), sacrificable);
        if floors.policy == GuardPolicy::KillOffender || sac {
            return Decision::KillProcess { grower: g, sacrificable: sac };
        }
    }
    match a.engine {
        Some(e) => {
            let reason = if top.is_some() {
                EngineReason::ProtectHost
            } else if engine_grown >= floors.min_blame {
                EngineReason::EngineGrew
            } else {
                EngineReason::Unattributed
            };
            Decision::StopEngine { pgid: e.pgid, reason }
        }
        None => Decision::NoVictim,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memguard::attribution::{GroupGrowth, TOP};
    use crate::memguard::procs::Comm;

    const GIB: u64 = 1 << 30;

    fn floors(policy: GuardPolicy) -> Floors {
        Floors { soft: 4 * GIB, hard: 2 * GIB, policy, min_blame: GIB / 4, unattributed_is_engine: true }
    }

    fn attribution(engine_grown: u64, other: Option<(&str, u64)>) -> Attribution {
        let mut a = Attribution {
            engine: Some(GroupGrowth {
                pgid: 100,
                processes: 3,
                resident_bytes: 90 * GIB,
                grown_bytes: engine_grown,
                container: None,
            }),
            top: [Grower::default(); TOP],
            count: 0,
            attributed_bytes: engine_grown,
            overflow: 0,
        };
        if let Some((comm, grown)) = other {
            a.top[0] = Grower { pid: 300, pgrp: 300, comm: Comm::new(comm.as_bytes()), resident: grown, grown };
            a.count = 1;
            a.attributed_bytes += grown;
        }
        a
    }

    #[test]
    fn above_floors_nothing_between_them_soft() {
        let a = attribution(0, None);
        assert_eq!(decide(&floors(GuardPolicy::ProtectHost), 5 * GIB, 0, &a, &[]), Decision::Idle);
        assert_eq!(decide(&floors(GuardPolicy::ProtectHost), 3 * GIB, 0, &a, &[]), Decision::Soft);
        assert_eq!(decide(&floors(GuardPolicy::Off), 3 * GIB, 0, &a, &[]), Decision::Soft);
        assert_eq!(decide(&floors(GuardPolicy::Off), GIB, 0, &a, &[]), Decision::Off);
    }

    #[test]
    fn engine_grew_kills_its_group_under_every_acting_policy() {
        let a = attribution(6 * GIB, Some(("hf-upload", GIB)));
        for p in [GuardPolicy::ProtectHost, GuardPolicy::KillOffender] {
            let d = decide(&floors(p), GIB, 7 * GIB, &a, &[]);
            assert_eq!(d, Decision::StopEngine { pgid: 100, reason: EngineReason::EngineGrew });
            assert_eq!(d.name(), "kill-engine-group");
        }
    }

    #[test]
    fn offender_is_killed_with_kill_offender_or_when_sacrificable() {
        let a = attribution(0, Some(("hf-upload", 7 * GIB)));
        let d = decide(&floors(GuardPolicy::KillOffender), GIB, 7 * GIB, &a, &[]);
        assert!(matches!(d, Decision::KillProcess { grower, sacrificable: false } if grower.pid == 300));
        // protect-host: the engine is stopped, and the receipt says someone else grew.
        let d = decide(&floors(GuardPolicy::ProtectHost), GIB, 7 * GIB, &a, &[]);
        assert_eq!(d, Decision::StopEngine { pgid: 100, reason: EngineReason::ProtectHost });
        // … unless the grower is sacrificable.
        let d = decide(&floors(GuardPolicy::ProtectHost), GIB, 7 * GIB, &a, &["hf-*".into()]);
        assert!(matches!(d, Decision::KillProcess { sacrificable: true, .. }));
    }

    #[test]
    fn a_fall_no_rss_explains_is_the_gpu_engines_without_nvml_but_not_with_it_or_on_cpu() {
        // GB10: the engine's CUDA memory is not in its RSS; a 1 GiB hog grew, MemAvailable fell 9 GiB.
        let a = attribution(0, Some(("hog", GIB)));
        let d = decide(&floors(GuardPolicy::KillOffender), GIB, 9 * GIB, &a, &[]);
        assert_eq!(d, Decision::StopEngine { pgid: 100, reason: EngineReason::EngineGrew });
        let with_nvml = Floors { unattributed_is_engine: false, ..floors(GuardPolicy::KillOffender) };
        assert!(matches!(decide(&with_nvml, GIB, 9 * GIB, &a, &[]), Decision::KillProcess { .. }));
        // Nobody grew at all: stop the engine, saying so.
        let quiet = attribution(0, None);
        let d = decide(&with_nvml, GIB, 0, &quiet, &[]);
        assert_eq!(d, Decision::StopEngine { pgid: 100, reason: EngineReason::Unattributed });
    }

    #[test]
    fn small_growth_is_no_blame_and_no_engine_means_no_victim() {
        let a = attribution(0, Some(("cron", GIB / 8)));
        let d = decide(&floors(GuardPolicy::KillOffender), GIB, GIB / 8, &a, &[]);
        assert_eq!(d, Decision::StopEngine { pgid: 100, reason: EngineReason::Unattributed });
        let mut none = attribution(0, Some(("cron", GIB / 8)));
        none.engine = None;
        assert_eq!(decide(&floors(GuardPolicy::KillOffender), GIB, 0, &none, &[]), Decision::NoVictim);
    }

    #[test]
    fn sacrificable_names() {
        assert!(is_sacrificable(b"hf-upload", &["hf-upload".into()]));
        assert!(is_sacrificable(b"rsync", &["rs*".into()]));
        assert!(!is_sacrificable(b"rsync", &["rsyncd".into()]));
        assert!(is_sacrificable(b"a_very_long_nam", &["a_very_long_name_indeed".into()]));
    }
}
