//! Several nodes as one deployment: the node agent and its protocol, transports (local, ssh,
//! exec), pushing the binary to nodes.

pub mod agent;
pub mod client;
pub mod protocol;
pub mod push;
pub mod transport;
