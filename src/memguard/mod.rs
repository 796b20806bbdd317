//! GB10-aware memory guard (issue 7; gb10-ops.md §1–2). On GB10 the GPU's memory is the host's
//! and the kernel's OOM killer cannot see it, so the guard watches `/proc/meminfo` (MemAvailable
//! and MemFree) at 10 Hz — faster as the floor nears — wakes on a PSI trigger, attributes growth
//! per process over a window, and acts per the kit's `memory.guard` policy with a JSON receipt
//! per action.
//!
//! Parsers ([`meminfo`], [`psi`], [`procs`]) and the verdicts ([`policy`], [`gate`],
//! [`attribution`]) are pure and unit-tested on recorded files; [`guard`] is the loop.
//! The node agent hosts it: `Guard::new(config, engine_pgid, receipts, reporter)`, then
//! `run(&stop)` on a thread.

pub mod attribution;
pub mod gate;
pub mod guard;
pub mod meminfo;
pub mod nvml;
pub mod pagecache;
pub mod policy;
pub mod procs;
pub mod psi;
pub mod receipt;

pub use guard::{EnginePgid, Guard, GuardConfig, GuardError, GuardEvent, GuardReporter, GuardStatus};
