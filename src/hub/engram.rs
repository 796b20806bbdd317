//! The slim "embed-only" Engram directory: hardlinks to the Engram shards, `config.json`, and an
//! index listing only the `*.engram.embed.weight` / `*.engram.embed.scale` tensors.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::cache::RepoCache;
use super::error::HubError;
use super::plan::PlannedFile;

/// The index every sharded safetensors checkpoint has.
pub const INDEX: &str = "model.safetensors.index.json";

/// Why the embed-only index cannot be made from the Engram repo's index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlimError {
    #[error("{INDEX} has no `*.engram.embed.weight` / `*.engram.embed.scale` tensors")]
    NoEmbedTensors,
    #[error(
        "tensor `{tensor}` lives in `{file}`, which is not among the fetched shards ({shards}); add it to engram.files"
    )]
    OutsideShards { tensor: String, file: String, shards: String },
    #[error("engram.layers lists layer {layer}, but {INDEX} has no Engram embed tensor for it")]
    LayerMissing { layer: u32 },
}

/// What was built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlimReport {
    pub dir: PathBuf,
    pub shards: Vec<String>,
    pub tensors: usize,
    /// Shards copied because hardlinking was impossible (another filesystem).
    pub copied: Vec<String>,
}

fn is_embed(key: &str) -> bool {
    key.ends_with(".engram.embed.weight") || key.ends_with(".engram.embed.scale")
}

/// The embed-only weight map: every Engram embed tensor must live in one of `shards`, and every
/// layer in `layers` must have one. Pure.
///
/// # Errors
/// [`SlimError`] naming the tensor, shard or layer.
pub fn slim_weight_map(
    weight_map: &BTreeMap<String, String>,
    shards: &BTreeSet<&str>,
    layers: &[u32],
) -> Result<BTreeMap<String, String>, SlimError> {
    let slim: BTreeMap<String, String> =
        weight_map.iter().filter(|(k, _)| is_embed(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    if slim.is_empty() {
        return Err(SlimError::NoEmbedTensors);
    }
    if let Some((k, v)) = slim.iter().find(|(_, v)| !shards.contains(v.as_str())) {
        return Err(SlimError::OutsideShards {
            tensor: k.clone(),
            file: v.clone(),
            shards: shards.iter().copied().collect::<Vec<_>>().join(", "),
        });
    }
    for &layer in layers {
        let tag = format!("layers.{layer}.");
        if !slim.keys().any(|k| k.starts_with(&tag) || k.contains(&format!(".{tag}"))) {
            return Err(SlimError::LayerMissing { layer });
        }
    }
    Ok(slim)
}

/// Build `out` from the cached snapshot at `commit` (replacing it atomically if present).
pub fn build_slim(
    cache: &RepoCache,
    commit: &str,
    files: &[PlannedFile],
    layers: &[u32],
    out: &Path,
) -> Result<SlimReport, HubError> {
    let find = |p: &str| files.iter().find(|f| f.path == p);
    let (Some(index), Some(config)) = (find(INDEX), find("config.json")) else {
        return Err(HubError::Engram(format!("engram.files must include {INDEX} and config.json")));
    };
    let shard_files: Vec<&PlannedFile> = files.iter().filter(|f| f.path.ends_with(".safetensors")).collect();
    let shards: BTreeSet<&str> = shard_files.iter().map(|f| f.path.as_str()).collect();
    let index_path = cache.blob(&index.blob);
    let text = fs::read(&index_path).map_err(|e| HubError::io(&index_path, e))?;
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let idx: Index = serde_json::from_slice(&text)
        .map_err(|source| HubError::Json { what: format!("{}: {INDEX}", cache.repo), source })?;
    let slim = slim_weight_map(&idx.weight_map, &shards, layers)
        .map_err(|source| HubError::Slim { repo: cache.repo.clone(), source })?;

    let parent = out.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| HubError::io(parent, e))?;
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "engram".into());
    let tmp = parent.join(format!(".{name}.spark-tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let mut copied = Vec::new();
    for f in &shard_files {
        let dest = tmp.join(&f.path);
        if let Some(p) = dest.parent() {
            fs::create_dir_all(p).map_err(|e| HubError::io(p, e))?;
        }
        let src = cache.blob(&f.blob);
        if fs::hard_link(&src, &dest).is_err() {
            fs::copy(&src, &dest).map_err(|e| HubError::io(&dest, e))?;
            copied.push(f.path.clone());
        }
    }
    fs::create_dir_all(&tmp).map_err(|e| HubError::io(&tmp, e))?;
    let cfg = cache.blob(&config.blob);
    fs::copy(&cfg, tmp.join("config.json")).map_err(|e| HubError::io(&cfg, e))?;
    let total: u64 = shard_files.iter().map(|f| f.size).sum();
    let index_json = serde_json::json!({
        "metadata": { "total_size": total, "source_repo": cache.repo, "source_commit": commit, "made_by": "spark-kit download (embed-only)" },
        "weight_map": slim,
    });
    let bytes = serde_json::to_vec_pretty(&index_json)
        .map_err(|source| HubError::Json { what: format!("{}: the slim {INDEX}", cache.repo), source })?;
    fs::write(tmp.join(INDEX), bytes).map_err(|e| HubError::io(tmp.join(INDEX), e))?;
    let old = parent.join(format!(".{name}.spark-old-{}", std::process::id()));
    if out.exists() {
        fs::rename(out, &old).map_err(|e| HubError::io(out, e))?;
    }
    fs::rename(&tmp, out).map_err(|e| HubError::io(out, e))?;
    let _ = fs::remove_dir_all(&old);
    Ok(SlimReport {
        dir: out.to_path_buf(),
        shards: shard_files.iter().map(|f| f.path.clone()).collect(),
        tensors: slim.len(),
        copied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_and_fail_closed() {
        let wm: BTreeMap<String, String> = [
            ("model.layers.1.engram.embed.weight", "s47"),
            ("model.layers.1.engram.embed.scale", "s47"),
            ("model.layers.14.engram.embed.weight", "s48"),
            ("model.layers.14.engram.wkv.weight", "s48"),
            ("model.layers.2.mlp.weight", "s01"),
        ]
        .iter()
        .map(|(a, b)| ((*a).to_string(), (*b).to_string()))
        .collect();
        let shards: BTreeSet<&str> = ["s47", "s48"].into_iter().collect();
        let slim = slim_weight_map(&wm, &shards, &[1, 14]).unwrap();
        assert_eq!(slim.len(), 3);
        assert_eq!(slim_weight_map(&wm, &shards, &[1, 2]).unwrap_err(), SlimError::LayerMissing { layer: 2 });
        let one: BTreeSet<&str> = ["s47"].into_iter().collect();
        let e = slim_weight_map(&wm, &one, &[1]).unwrap_err();
        assert!(matches!(&e, SlimError::OutsideShards { file, .. } if file == "s48"), "{e}");
        assert!(e.to_string().contains("`s48`"));
    }
}
