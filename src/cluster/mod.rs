//! The wire between the head and its nodes: the agent protocol (JSON lines), transports
//! (local, ssh, exec prefix), pushing the binary to nodes, and the head's client of an agent.
//!
//! Imports: the kit and the node facts the protocol carries. Never the supervisor (head side)
//! nor the agent (node side): both import this module, it imports neither.

pub mod client;
pub mod protocol;
pub mod push;
pub mod transport;
