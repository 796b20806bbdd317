//! Where a kit's downloads live: its HF cache and its `spark-kit.lock`.

use std::path::PathBuf;

use crate::dirs::Dirs;
use crate::engine::model::hf_cache;
use crate::kit::schema::Kit;

/// The HF cache of a kit: `paths.hf_cache`, `HF_HUB_CACHE`, `HF_HOME/hub`, `~/.cache/huggingface/hub`.
#[must_use]
pub fn kit_hf_cache(kit: &Kit, env: &[(String, String)], dirs: &Dirs) -> PathBuf {
    let configured = kit.paths.hf_cache.as_deref().map(|p| dirs.expand(p));
    hf_cache(configured.as_deref(), env, &dirs.home)
}

/// Where `download` records what it fetched: `<paths.data_dir>/<kit name>/spark-kit.lock`.
#[must_use]
pub fn lock_path(kit: &Kit, dirs: &Dirs) -> PathBuf {
    dirs.expand(&kit.paths.data_dir).join(&kit.name).join("spark-kit.lock")
}
