//! Why an Engram operation failed: every variant names the file (and offset or id) involved.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngramError {
    #[error("{path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot read {len} bytes at offset {offset}: {source}", path = path.display())]
    Read {
        path: PathBuf,
        offset: u64,
        len: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: short read at offset {offset}: got {got} of {len} bytes (file truncated?)", path = path.display())]
    ShortRead { path: PathBuf, offset: u64, len: u64, got: u64 },
    #[error("{path}: row id {id} is outside the {rows}-row table of layer {layer} (it would be read at offset {offset})", path = path.display())]
    OutOfRange { path: PathBuf, layer: u32, id: i64, rows: u64, offset: i128 },
    #[error("{path}: {why}", path = path.display())]
    Table { path: PathBuf, why: String },
    #[error("{path}: packed Engram shard: {why}", path = path.display())]
    Packed { path: PathBuf, why: String },
    #[error("{path}: packed Engram shard: {source}", path = path.display())]
    Header {
        path: PathBuf,
        #[source]
        source: super::header::HeaderError,
    },
    #[error("{path}: {source}", path = path.display())]
    Geometry {
        path: PathBuf,
        #[source]
        source: super::layout::GeometryError,
    },
    #[error(transparent)]
    Cache(#[from] super::cache::CacheError),
    #[error("{0}")]
    Config(String),
    #[error("{path}: {needed} bytes needed, {free} free on the filesystem of {at}", path = path.display(), at = at.display())]
    NoSpace { path: PathBuf, needed: u64, free: u64, at: PathBuf },
}

impl EngramError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }

    /// Configuration problems (wrong kit, bad flag, missing geometry) as opposed to I/O.
    #[must_use]
    pub const fn is_config(&self) -> bool {
        matches!(self, Self::Config(_) | Self::Cache(_))
    }

    /// What to do about it, where there is a general answer.
    #[must_use]
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            Self::Packed { .. } | Self::Header { .. } => {
                Some("delete the named file and rerun `spark-kit pack-engram` for this rank")
            }
            Self::ShortRead { .. } | Self::Table { .. } | Self::Geometry { .. } => {
                Some("re-download the Engram shards (`spark-kit download --only engram`), then `spark-kit verify`")
            }
            Self::NoSpace { .. } => Some("free space there, or pass --out DIR on a larger filesystem"),
            _ => None,
        }
    }
}
