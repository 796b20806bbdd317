//! Preflight's check of the engine's vLLM on one node (pure): the version the engine venv or
//! the docker image holds is a release the overlay supports (`crate::vllm_support`) and the one
//! the kit pins; a failure names the version found, the supported set and the fix for the kit's
//! runtime (a docker kit's fix is about its image, never `spark-kit setup`).

use super::checks::{NodeSpec, Out};
use super::facts::NodeFacts;

/// Where a node's engine gets its vLLM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VllmSource {
    /// The engine venv (runtime `venv`, or a docker image that mounts the venv).
    #[default]
    Venv,
    /// The docker image itself (`engine.docker_image`).
    Image,
}

/// The `vllm` check of one node.
pub(super) fn versions(o: &mut Out<'_>, spec: &NodeSpec, f: &NodeFacts) {
    let docker = f.docker.as_ref();
    let (found, place) = match spec.vllm_source {
        VllmSource::Venv => (f.vllm_version.as_ref(), "in the engine venv".to_string()),
        VllmSource::Image => (
            docker.and_then(|d| d.vllm_version.as_ref()),
            docker.map_or_else(String::new, |d| {
                let id = super::docker_checks::image_id(d).map(short_id).unwrap_or_default();
                format!("in image {} ({id})", d.image)
            }),
        ),
    };
    let supported = crate::vllm_support::supported_list();
    match (found, spec.vllm_source) {
        (None, VllmSource::Venv) => {
            o.skip("vllm", format!("the engine venv is not set up on this node yet; {}", spec.vllm_fix))
        }
        (None, VllmSource::Image) => o.skip("vllm", "the image is not on this node: its vLLM is read once it is"),
        (Some(Err(e)), _) => {
            o.fail("vllm", format!("cannot read the engine's vLLM version {place}: {e}"), spec.vllm_fix.clone())
        }
        (Some(Ok(v)), _) => {
            let v = v.trim();
            let pin = if spec.vllm_version.is_empty() {
                String::new()
            } else {
                format!("; the kit pins {}", spec.vllm_version)
            };
            if !crate::vllm_support::is_supported(v) {
                o.fail(
                    "vllm",
                    format!("vLLM {v} {place} is not a release the overlay supports ({supported}){pin}"),
                    spec.vllm_fix.clone(),
                );
            } else if !crate::vllm_support::matches_pin(v, &spec.vllm_version) {
                o.fail("vllm", format!("vLLM {v} {place}{pin} (supported: {supported})"), spec.vllm_fix.clone());
            } else {
                o.pass("vllm", format!("vLLM {v} {place} (supported: {supported})"));
            }
        }
    }
}

fn short_id(id: &str) -> &str {
    let id = id.strip_prefix("sha256:").unwrap_or(id);
    &id[..id.len().min(12)]
}
