//! What preflight needs to know from this machine besides the kit (the weights' size, where they
//! live, the venv's python, whether the kit's deployment runs). Shared by `preflight`, `up` (its preflight gate) and `guard`.

use std::path::PathBuf;
use std::time::Duration;

use super::checkpoint_source::checkpoint_in;
use crate::checkpoint::budget::weight_budget;
use crate::checkpoint::exl3_audit::num_hidden_layers;
use crate::deploy::Deployment;
use crate::kit::schema::Kit;
use crate::node::preflight::PreflightInput;
use crate::runtime::venv::{build as venv, recipe::Recipe};
use crate::settings::Settings;
use crate::supervisor::control::request;

/// Weights per rank and on disk, when the kit's checkpoint can be measured (the directory the
/// engine serves on this machine, or the modelled DeepSeek V4.1 Flash for the kit that serves it).
fn weights(s: &Settings) -> (Option<u64>, Option<u64>) {
    let kit = &s.kit;
    let Ok((ckpt, _)) = checkpoint_in(s, None, false, true) else { return (None, None) };
    let layers = num_hidden_layers(&kit.model.k_map);
    // What the engine holds per rank: the EXL3 budget plus the classes served dense at load.
    let dense = crate::checkpoint::reconcile::dense_at_load(&ckpt, kit.tensor_parallel_size, layers);
    match weight_budget(&ckpt, kit.tensor_parallel_size, layers) {
        Ok(b) => (Some(b.per_rank_bytes + dense.extra_per_rank), Some(b.total_bytes + b.excluded_bytes)),
        Err(_) => (None, None),
    }
}

/// Where the kit's weights live on this machine: `model.path`, else the model repo's directory in
/// the Hugging Face cache (or the cache itself for locally made models).
#[must_use]
pub fn model_dir(kit: &Kit, d: &Deployment) -> PathBuf {
    match &d.model_path {
        Some(p) => p.clone(),
        None if kit.model.repo.is_empty() => d.hf_cache.clone(),
        None => d.repo_dir(&kit.model.repo),
    }
}

/// The input preflight needs besides the kit, from this machine.
#[must_use]
pub fn input(s: &Settings) -> PreflightInput {
    let (kit, d) = (&s.kit, &s.deploy);
    let (weights_per_rank, weights_on_disk) = weights(s);
    let runtime = crate::runtime::of(kit);
    let vllm_python = runtime
        .vllm_in_venv(kit)
        .then(|| Recipe::load(&kit.engine.requirements).ok())
        .flatten()
        .and_then(|r| venv::find(d.cache(), &r))
        .map(|v| v.path.join("bin/python").display().to_string());
    let image_build = runtime.builds_image(kit).then(|| s.kit_ref.command("image build", &[]));
    let image_sync = runtime.image(kit).map(|_| s.kit_ref.command("image sync", &[]));
    PreflightInput {
        weights_per_rank,
        weights_on_disk,
        disk_path: model_dir(kit, d).display().to_string(),
        vllm_python,
        image_build,
        image_sync,
        replace: Some(s.kit_ref.command("up", &["--replace"])),
        gateway_holds_api_port: false,
        setup: Some(s.kit_ref.command("setup", &[])),
        image_vllm_cache: Some(d.cache().join("image-vllm").display().to_string()),
        recorded_image: super::image_lock::recorded(s),
        running: None,
        all_reduce: false,
    }
}

/// The kit's own deployment, when its supervisor answers on the control socket: what
/// `PreflightInput::running` says about it.
#[must_use]
pub fn running(s: &Settings) -> Option<String> {
    let snap = request(&s.socket, &s.kit.name, "status", Some(Duration::from_secs(5))).ok()?;
    Some(format!(
        "kit {} is running here (supervisor pid {}, {})",
        snap.kit,
        snap.supervisor_pid,
        format!("{:?}", snap.state).to_lowercase()
    ))
}
