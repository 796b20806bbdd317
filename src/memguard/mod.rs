//! GB10-aware memory guard (issue 7; gb10-ops.md §1–2). On GB10 the GPU's memory is the host's
//! and the kernel's OOM killer cannot see it, so the guard watches `/proc/meminfo` (MemAvailable
//! and MemFree) at 10 Hz — faster as the floor nears — wakes on a PSI trigger, attributes growth
//! per process over a window, and acts per the kit's `memory.guard` policy with a JSON receipt
//! per action. A containerised engine (docker runtime) is attributed by its cgroup and stopped
//! with `docker kill --signal`.
//!
//! Parsers ([`meminfo`], [`psi`], [`procs`], [`cgroup`]) and the verdicts ([`policy`], [`gate`],
//! [`attribution`]) are pure and unit-tested on recorded files; [`guard`] is the loop over
//! [`sampler`] (what it reads) and [`responder`] (how it acts).
//! The node agent hosts it: `Guard::new(config, engine, receipts, reporter)`, then
//! `run(&stop)` on a thread.

pub mod attribution;
pub mod cgroup;
pub mod config;
pub mod engine;
pub mod events;
pub mod gate;
pub mod guard;
pub mod meminfo;
pub mod nvml;
pub mod pagecache;
pub mod policy;
pub mod procs;
pub mod psi;
pub mod receipt;
pub mod responder;
pub mod sampler;
pub mod text;

pub use config::{GuardConfig, Overrides};
pub use engine::{ContainerId, EngineRef, EngineSource, FixedContainer};
pub use events::{Channel, GuardError, GuardEvent, GuardReporter, GuardStatus};
pub use sampler::Guard;
