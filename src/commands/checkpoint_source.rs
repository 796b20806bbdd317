//! Which checkpoint a command reads: `--model`, the kit's `model.path`, the snapshot `download`
//! recorded, or the modelled DeepSeek V4.1 Flash. Shared by `verify`, `plan` and `preflight`.

use std::path::PathBuf;

use crate::checkpoint::virtual_ckpt::{deepseek_v41_flash_exl3, DeepSeekV41Dims};
use crate::checkpoint::Checkpoint;
use crate::error::Failure;
use crate::kit::schema::Kit;

pub(super) use crate::checkpoint::kit_plan::is_dsv41_flash_exl3;

/// The snapshot directory `download` put the kit's model in, from `spark-kit.lock`.
fn downloaded_model(kit: &Kit, env: &[(String, String)]) -> Option<PathBuf> {
    let dirs = crate::dirs::Dirs::from_env(env);
    let lock = crate::hub::lockfile::LockFile::load(&crate::hub::kit_files::lock_path(kit, &dirs)).ok()?;
    let entry = lock.files.iter().find(|e| e.repo == kit.model.repo)?;
    let cache = crate::hub::kit_files::kit_hf_cache(kit, env, &dirs);
    let dir = crate::hub::cache::RepoCache::new(&cache, &kit.model.repo).snapshot(&entry.commit, "");
    dir.is_dir().then_some(dir)
}

/// The checkpoint a command works on: `--model`, else the kit's `model.path`, else the snapshot
/// `spark-kit download` recorded in `spark-kit.lock`, else (when `allow_virtual`) the modelled
/// DeepSeek V4.1 Flash for kits that serve it. Returns it with a label saying where it came from.
pub(super) fn checkpoint_for(
    kit: &Kit,
    model: Option<&PathBuf>,
    use_virtual: bool,
    allow_virtual: bool,
) -> Result<(Checkpoint, String), Failure> {
    checkpoint_in(kit, &[], model, use_virtual, allow_virtual)
}

/// [`checkpoint_for`] with the process environment, which locates the HF cache and data dir of a
/// downloaded model.
pub(super) fn checkpoint_in(
    kit: &Kit,
    env: &[(String, String)],
    model: Option<&PathBuf>,
    use_virtual: bool,
    allow_virtual: bool,
) -> Result<(Checkpoint, String), Failure> {
    let modelled = || {
        deepseek_v41_flash_exl3(&DeepSeekV41Dims::default())
            .map(|c| (c, "virtual DeepSeek V4.1 Flash EXL3 (modelled shapes, no files)".to_string()))
            .map_err(|e| Failure::runtime(e.to_string()))
    };
    if use_virtual {
        return modelled();
    }
    let path =
        model.cloned().or_else(|| kit.model.path.as_ref().map(PathBuf::from)).or_else(|| downloaded_model(kit, env));
    match path {
        Some(p) => {
            let ckpt = Checkpoint::open(&p).map_err(|e| Failure::runtime(e.to_string()))?;
            Ok((ckpt, format!("checkpoint headers in {}", p.display())))
        }
        None if allow_virtual && is_dsv41_flash_exl3(kit) => modelled(),
        None => Err(Failure::usage(format!("kit `{}` names no local checkpoint directory", kit.name)).with_hint(
            "run `spark-kit download`, or pass --model DIR (a directory of *.safetensors shards), or --virtual for the modelled DeepSeek V4.1 Flash",
        )),
    }
}
