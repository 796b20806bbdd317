//! Engram file-backed rows: the DeepSeek V4.1 n-gram tables (layers 1 and 14) served from the
//! original FP8 checkpoint shards or from per-rank packed shards, never pinned in memory.
//!
//! One module per concern:
//! - [`layout`]: hash-head ownership exactly as the runtime computes it (pure).
//! - [`header`]: the 4 KiB packed-shard header, magic `DSV41EN1` (pure parse / serialize).
//! - [`table`]: where a layer's weight and scale tensors are, from the safetensors headers.
//! - [`direct`]: aligned `O_DIRECT` reads with a buffered fallback.
//! - [`cache`]: the optional set-associative row cache with a byte budget.
//! - [`store`]: `lookup(ids) -> rows` for a rank's owned range (thread pool, zero-fill).
//! - [`pack`]: the per-rank packer behind `spark-kit pack-engram`.
//!
//! Library code never prints: a buffered fallback and packing progress are reported through
//! [`store::IoReporter`] and [`pack::PackReporter`].

pub mod cache;
pub mod direct;
pub mod error;
pub mod header;
pub mod layout;
pub mod pack;
pub mod store;
pub mod table;

pub use error::EngramError;

/// Bytes of one row's FP8 E4M3 weights.
pub const WEIGHT_BYTES: usize = 256;
/// Bytes of one row's E8M0 scales (one per 32 values).
pub const SCALE_BYTES: usize = 8;
/// Bytes of one packed record: weight ‖ scale.
pub const ROW_BYTES: usize = WEIGHT_BYTES + SCALE_BYTES;
/// Values that share one E8M0 scale.
pub const SCALE_GROUP: usize = 32;
