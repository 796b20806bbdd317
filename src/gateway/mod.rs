//! The front door: an OpenAI-compatible reverse proxy in front of the engine (vLLM on a
//! loopback port). It checks API keys, refuses requests the memory plan cannot hold, queues
//! beyond `max_num_seqs`, answers 503 while the engine is unavailable, passes SSE streams through
//! event by event, ends cut streams with an error event, drains on stop and exports metrics.
//! See docs/gateway.md.

pub mod admission;
pub mod body;
pub mod config;
pub mod count;
pub mod framing;
mod front;
pub mod keys;
pub mod metrics;
pub mod priority;
mod proxy;
pub mod restart;
mod serve;
mod state;
mod stream;
pub mod upstream;

pub use config::{ConfigError, GatewayConfig};
pub use front::{Front, FrontError, ServeError};
pub use serve::{router, serve};
pub use state::{DrainOutcome, EngineState, Gateway};
