//! spark-kit: typed, fail-closed launcher for serving EXL3 DeepSeek V4.1 Flash on DGX Spark nodes.
//!
//! The library never prints: commands write to the writer they are given, and long work
//! reports through traits. `main.rs` owns the terminal and the exit code.

pub mod agent;
pub mod bench;
pub mod bounded;
pub mod cancel;
pub mod checkpoint;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod commands;
pub mod deploy;
pub mod dirs;
pub mod engine;
pub mod engram;
pub mod envvars;
pub mod error;
pub mod fabric;
pub mod gateway;
pub mod hex;
pub mod hints;
pub mod hub;
pub mod image_sync;
pub mod kit;
pub mod live;
pub mod memguard;
pub mod node;
pub mod plan;
pub mod reporter;
pub mod runtime;
pub mod settings;
pub mod signals;
pub mod sse;
pub mod supervisor;
pub mod vllm_support;
pub mod weights;
