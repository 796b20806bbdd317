//! What preflight needs to know from this machine besides the kit (the weights' size, where they
//! live, the venv's python). Shared by `preflight`, `up` (its preflight gate) and `guard`.

use std::path::PathBuf;

use super::checkpoint_source::checkpoint_for;
use crate::checkpoint::budget::weight_budget;
use crate::checkpoint::exl3_audit::num_hidden_layers;
use crate::dirs::Dirs;
use crate::engine::{model, recipe::Recipe, venv};
use crate::kit::schema::{Kit, Runtime};
use crate::node::preflight::PreflightInput;

/// Weights per rank and on disk, when the kit's checkpoint can be measured (a local
/// `model.path`, or the modelled DeepSeek V4.1 Flash for the kit that serves it).
fn weights(kit: &Kit) -> (Option<u64>, Option<u64>) {
    let Ok((ckpt, _)) = checkpoint_for(kit, None, false, true) else { return (None, None) };
    match weight_budget(&ckpt, kit.tensor_parallel_size, num_hidden_layers(&kit.model.k_map)) {
        Ok(b) => (Some(b.per_rank_bytes), Some(b.total_bytes + b.excluded_bytes)),
        Err(_) => (None, None),
    }
}

/// Where the kit's weights live on this machine: `model.path`, else the model repo's directory in
/// the Hugging Face cache (or the cache itself for locally made models).
#[must_use]
pub fn model_dir(kit: &Kit, env: &[(String, String)]) -> PathBuf {
    let dirs = Dirs::from_env(env);
    match &kit.model.path {
        Some(p) => dirs.expand(p),
        None => {
            let hf = model::hf_cache(kit.paths.hf_cache.as_deref().map(|p| dirs.expand(p)).as_deref(), env, &dirs.home);
            if kit.model.repo.is_empty() {
                hf
            } else {
                model::repo_dir(&hf, &kit.model.repo)
            }
        }
    }
}

/// The input preflight needs besides the kit, from this machine.
#[must_use]
/// `kit_arg` is what `--kit` said (None: the default kit), for commands printed as fixes.
pub fn input(kit: &Kit, env: &[(String, String)], kit_arg: Option<&str>) -> PreflightInput {
    let dirs = Dirs::from_env(env);
    let (weights_per_rank, weights_on_disk) = weights(kit);
    let disk_path = model_dir(kit, env);

    let vllm_python = (kit.engine.runtime == Runtime::Venv || kit.engine.docker_mount_venv)
        .then(|| Recipe::load(&kit.engine.requirements).ok())
        .flatten()
        .and_then(|r| venv::find(&dirs.cache, &r))
        .map(|v| v.path.join("bin/python").display().to_string());
    let image_build =
        kit.engine.docker_mount_venv.then(|| crate::hints::KitRef::new(kit_arg).command("image build", &[]));
    let image_sync =
        (kit.engine.runtime == Runtime::Docker).then(|| crate::hints::KitRef::new(kit_arg).command("image sync", &[]));
    PreflightInput {
        weights_per_rank,
        weights_on_disk,
        disk_path: disk_path.display().to_string(),
        vllm_python,
        image_build,
        image_sync,
        gateway_holds_api_port: false,
        setup: Some(crate::hints::KitRef::new(kit_arg).command("setup", &[])),
        image_vllm_cache: Some(dirs.cache.join("image-vllm").display().to_string()),
        recorded_image: super::image_lock::recorded(kit, env),
    }
}
