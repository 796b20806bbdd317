//! The node side: what runs on every node of a deployment. `spark-kit node --rank N` is the
//! agent ([`run`]): it reads [`crate::cluster::protocol::Command`]s on stdin, starts and stops
//! this node's engine through a [`crate::runtime::Runtime`], hosts the memory guard, probes the engine
//! (health, metrics, readiness), tracks log progress for hang detection, and reports
//! [`crate::cluster::protocol::Event`]s on stdout.
//!
//! Imports: the wire (`cluster::protocol`), the engine, the node probes, memguard. Never the
//! supervisor (the head side): the two meet only on the wire.

pub mod guard;
pub mod hang;
pub mod probe;
pub mod prober;
pub mod run;
pub mod start;

pub use run::{run, Emit, JsonLines};

#[cfg(test)]
mod tests;
