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
pub mod pack_jobs;
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

/// The engine environment for a kit with Engram tables: `SPARK_ENGRAM_DIR` (the slim Engram
/// directory, `paths.engram_dir`) and, once `pack-engram` has written shards,
/// `SPARK_ENGRAM_PACKED_DIR` (`Deployment::packed_dir`). Empty for kits without Engram.
#[must_use]
pub fn engine_env(kit: &crate::kit::schema::Kit, d: &crate::deploy::Deployment) -> Vec<(String, String)> {
    if kit.engram.is_none() {
        return Vec::new();
    }
    let mut env = vec![("SPARK_ENGRAM_DIR".to_string(), d.engram_dir.display().to_string())];
    let packed = &d.packed_dir;
    let has_shards =
        std::fs::read_dir(packed).is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".bin")));
    if has_shards {
        env.push(("SPARK_ENGRAM_PACKED_DIR".to_string(), packed.display().to_string()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_get_the_engram_dirs_once_packed() {
        let home = tempfile::tempdir().unwrap();
        let spark = crate::kit::builtin_kit("dgx-spark-2x-dsv41-exl3");
        let d =
            crate::deploy::Deployment::resolve(&spark, &[("HOME".into(), home.path().display().to_string())]).unwrap();
        let env = engine_env(&spark, &d);
        assert_eq!(env.len(), 1, "{env:?}");
        assert_eq!(env[0], ("SPARK_ENGRAM_DIR".into(), d.engram_dir.display().to_string()));
        let packed = d.packed_dir.clone();
        std::fs::create_dir_all(&packed).unwrap();
        std::fs::write(packed.join("engram-l1-r0of2.bin"), b"x").unwrap();
        let env = engine_env(&spark, &d);
        assert_eq!(env[1], ("SPARK_ENGRAM_PACKED_DIR".into(), packed.display().to_string()));
        let tiny = crate::kit::builtin_kit("tiny-cpu");
        assert!(engine_env(&tiny, &d).is_empty());
    }
}
