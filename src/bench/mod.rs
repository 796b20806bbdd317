//! `spark-kit bench`: measure any OpenAI-compatible endpoint the way the reference numbers were
//! measured (TTFT, per-stream and aggregate decode, prefill), and leave a receipt others can
//! compare. Definitions: [`metrics`]; result format: [`result`] and docs/bench.md.

pub mod audit;
pub mod client;
pub mod compare;
pub mod host;
pub mod key;
pub mod levels;
pub mod lines;
pub mod metrics;
pub mod noise;
pub mod options;
pub mod plausible;
pub mod plot;
pub mod prompt;
pub mod provenance;
pub mod result;
pub mod run;
pub mod runner;
pub mod sizes;
pub mod spec;
pub mod table;
