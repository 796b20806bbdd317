//! Which checkpoint a command reads: `--model`, else the directory the engine serves
//! (`engine::model::served_dir`: `model.path`, the Hub snapshot by the one rule of
//! `deploy::hf::snapshot`, or the tiny model `up` makes), else the modelled DeepSeek V4.1 Flash.
//! Shared by `verify`, `plan`, `preflight` and `up`'s gateway.

use std::path::PathBuf;

use crate::checkpoint::virtual_ckpt::{deepseek_v41_flash_exl3, DeepSeekV41Dims};
use crate::checkpoint::Checkpoint;
use crate::deploy::Deployment;
use crate::engine::{model, overlay};
use crate::error::Failure;
use crate::kit::schema::{Kit, ModelSource};
use crate::settings::Settings;

pub(super) use crate::checkpoint::kit_plan::is_dsv41_flash_exl3;

/// The checkpoint directory the engine serves on this machine, when it exists.
#[must_use]
pub fn served(kit: &Kit, d: &Deployment) -> Option<PathBuf> {
    model::served_dir(kit, d, &overlay::tag()).filter(|p| p.is_dir())
}

/// Why there is no checkpoint to read, with the fix.
fn missing(s: &Settings) -> Failure {
    let (kit, d) = (&s.kit, &s.deploy);
    let (what, fix) = match kit.model.source {
        ModelSource::Hub => (
            format!(
                "{}@{} is not in the Hugging Face cache {}",
                kit.model.repo,
                kit.model.revision,
                d.hf_cache.display()
            ),
            format!("run `{}`", s.kit_ref.command("download", &[])),
        ),
        ModelSource::Local => {
            ("model.path names no directory".to_string(), "set model.path to the checkpoint's directory".to_string())
        }
        ModelSource::TinyExl3 | ModelSource::TinyDense => (
            "its model is made by `spark-kit up` on the first start and is not made yet".to_string(),
            format!("run `{}` once (it makes the model)", s.kit_ref.command("up", &[])),
        ),
    };
    Failure::usage(format!("kit `{}` has no local checkpoint: {what}", kit.name)).with_hint(format!(
        "{fix}, or pass --model DIR (a directory of *.safetensors shards), or --virtual for the modelled DeepSeek V4.1 Flash"
    ))
}

/// The checkpoint a command works on (the kit and its deployment in `s`): `--model`, else the
/// served directory ([`served`]), else (when `allow_virtual`) the modelled DeepSeek V4.1 Flash
/// for kits that serve it. Returns it with a label saying where it came from.
pub(super) fn checkpoint_in(
    s: &Settings,
    model: Option<&PathBuf>,
    use_virtual: bool,
    allow_virtual: bool,
) -> Result<(Checkpoint, String), Failure> {
    let modelled = || {
        deepseek_v41_flash_exl3(&DeepSeekV41Dims::default())
            .map(|c| (c, "virtual DeepSeek V4.1 Flash EXL3 (modelled shapes, no files)".to_string()))
            .map_err(Failure::from)
    };
    if use_virtual {
        return modelled();
    }
    let kit = &s.kit;
    match model.cloned().or_else(|| served(kit, &s.deploy)) {
        Some(p) => {
            let ckpt = Checkpoint::open(&p)?;
            Ok((ckpt, format!("checkpoint headers in {}", p.display())))
        }
        None if allow_virtual && is_dsv41_flash_exl3(kit) => modelled(),
        None => Err(missing(s)),
    }
}
