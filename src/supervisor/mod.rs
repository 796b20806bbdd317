//! The head side: bringing a deployment up and keeping it alive. Bring-up gates (preflight and
//! weights on every node), the supervisor loop, the pure restart/health state machine, the
//! status snapshot and the control socket `status` / `down` talk to.
//!
//! Imports: the wire (`cluster`) to talk to node agents, the kit, node checks, weights, engine
//! argv helpers. Never the agent (node side): the two meet only on the wire.

pub mod agents;
pub mod bringup;
pub mod control;
mod events;
pub mod health;
pub mod preflight;
pub mod run;
pub mod snapshot;
pub mod state;
pub mod status_text;
pub mod verdicts;
pub mod watch;

#[cfg(test)]
mod tests;

pub use bringup::GateLimits;
pub use run::{run, ClusterError, ClusterReporter, Gates};
pub use snapshot::{Handles, Snapshot};
