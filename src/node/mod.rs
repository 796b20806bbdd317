//! Node probes and preflight checks (issue 7; gb10-ops.md §4, reference-kit.md A.3).
//!
//! [`probe`]: where raw facts come from (this machine, a recording, or — plugged in by the node
//! agent — a remote node). [`facts`]: gathering. [`parse`], [`gid`], [`checks`], [`parity`]:
//! pure verdicts over recorded command output and sysfs trees. [`preflight`]: the runner.

pub mod checks;
pub mod docker_checks;
pub mod facts;
pub mod gid;
pub mod parity;
pub mod parse;
pub mod preflight;
pub mod probe;
pub mod vllm_check;

pub use checks::{Check, Verdict};
pub use preflight::{run, PreflightInput, Report};
pub use probe::{LocalProbe, ProbeError, ProbeSource, RecordedProbe};
