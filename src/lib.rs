//! spark-kit: typed, fail-closed launcher for serving EXL3 DeepSeek V4.1 Flash on DGX Spark nodes.
//!
//! The library never prints: commands return data, and long work reports through traits
//! (see `reporter`). `main.rs` owns the terminal.

pub mod cli;
pub mod commands;
pub mod error;
pub mod kit;
