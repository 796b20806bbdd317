//! What `pack-engram` packs: one job per (Engram layer, rank) from the slim Engram directory,
//! each table checked against the directory's `config.json`; and a packed shard as a line.

use std::path::{Path, PathBuf};

use super::error::EngramError;
use super::layout::GeometryError;
use super::pack::{Outcome, PackJob, Packed};
use super::table::{checkpoint_table, open_source};
use crate::kit::bytes::human_size as size;

/// Why the jobs cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    #[error(transparent)]
    Engram(#[from] EngramError),
    #[error("engram.layers lists layer {layer}, but {}/config.json engram_layer_ids is {ids:?}", src.display())]
    UnknownLayer { layer: u32, src: PathBuf, ids: Vec<u32> },
    #[error("{}: layer {layer}'s table has {rows} rows, config.json engram_num_embeddings says {config}", path.display())]
    Rows { path: PathBuf, layer: u32, rows: u64, config: u64 },
    #[error(transparent)]
    Owned(GeometryError),
}

impl JobsError {
    /// A problem of the kit or the flags (exit 2) rather than of the files.
    #[must_use]
    pub fn is_config(&self) -> bool {
        match self {
            Self::Engram(e) => e.is_config(),
            Self::UnknownLayer { .. } | Self::Owned(_) => true,
            Self::Rows { .. } => false,
        }
    }

    /// The fix, where there is one.
    #[must_use]
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            Self::Engram(e) => e.hint(),
            Self::UnknownLayer { .. } => Some("fix engram.layers in the kit"),
            Self::Rows { .. } => {
                Some("the shards and config.json come from different checkpoints; re-download the Engram files")
            }
            Self::Owned(_) => None,
        }
    }
}

/// The jobs for `layers` × `ranks` of a `tp`-way deployment, from `src` into `out`.
pub fn pack_jobs(src: &Path, layers: &[u32], ranks: &[u32], tp: u32, out: &Path) -> Result<Vec<PackJob>, JobsError> {
    let (geometry, ckpt) = open_source(src)?;
    let mut jobs = Vec::new();
    for &layer in layers {
        let Some(i) = geometry.index_of(layer) else {
            return Err(JobsError::UnknownLayer { layer, src: src.to_path_buf(), ids: geometry.layer_ids.clone() });
        };
        let table = checkpoint_table(&ckpt, src, layer)?;
        if table.rows != geometry.num_embeddings[i] {
            return Err(JobsError::Rows {
                path: table.weight.path.clone(),
                layer,
                rows: table.rows,
                config: geometry.num_embeddings[i],
            });
        }
        for &rank in ranks {
            let owned = geometry.owned(layer, tp, 1, rank).map_err(JobsError::Owned)?;
            jobs.push(PackJob { table: table.clone(), owned, rank, world: tp, out_dir: out.to_path_buf() });
        }
    }
    Ok(jobs)
}

/// A packed shard as `pack-engram` prints it.
#[must_use]
pub fn line(p: &Packed) -> String {
    let what = match p.outcome {
        Outcome::Written => format!("written in {:.1} s", p.seconds),
        Outcome::AlreadyComplete => "already complete".to_string(),
    };
    format!(
        "{}: layer {} rank {}/{} rows [{}, {}), {}, {what}",
        p.path.display(),
        p.layer,
        p.rank,
        p.world,
        p.lo,
        p.hi,
        size(p.bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_line_names_its_rows_and_outcome() {
        let p = Packed {
            path: "/p/s.bin".into(),
            layer: 2,
            rank: 1,
            world: 2,
            lo: 10,
            hi: 20,
            bytes: 2048,
            outcome: Outcome::AlreadyComplete,
            seconds: 0.0,
        };
        assert_eq!(line(&p), "/p/s.bin: layer 2 rank 1/2 rows [10, 20), 2.0 KiB, already complete");
    }

    #[test]
    fn a_missing_source_is_an_engram_error() {
        let d = tempfile::tempdir().unwrap();
        let e = pack_jobs(&d.path().join("none"), &[2], &[0], 1, d.path()).unwrap_err();
        assert!(matches!(e, JobsError::Engram(_)), "{e}");
    }
}
