//! The engine image's id in the kit's `spark-kit.lock` (docker kits that run the image's own
//! vLLM): recorded the first time preflight sees the same image on every node, and from then on
//! every node's image must have that id (`node::docker_checks`).

use crate::hub::lockfile::{ImageEntry, LockFile};
use crate::kit::schema::Kit;
use crate::node::docker_checks::common_image_id;
use crate::node::preflight::Facts;
use crate::settings::Settings;

/// The kit's image, when its runtime runs the engine in one.
fn image_of(kit: &Kit) -> Option<&str> {
    crate::runtime::of(kit).image(kit)
}

/// `(recorded image id, lock path)` for the kit's image, when the lock has one.
#[must_use]
pub fn recorded(s: &Settings) -> Option<(String, String)> {
    let image = image_of(&s.kit)?;
    let path = &s.deploy.lock_file;
    let lock = LockFile::load(path).ok()?;
    lock.image(image).map(|e| (e.id.clone(), path.display().to_string()))
}

/// Record the kit's image in its lock when every node answered with the same image id and the
/// lock has none yet. `Ok(Some(line))` says what was recorded.
pub fn record_first_seen(s: &Settings, facts: &[Facts]) -> Result<Option<String>, String> {
    let Some(image) = image_of(&s.kit) else { return Ok(None) };
    let docker: Option<Vec<_>> = facts.iter().map(|f| f.as_ref().ok().and_then(|f| f.docker.as_ref())).collect();
    let Some(docker) = docker else { return Ok(None) };
    let Some(id) = common_image_id(&docker) else { return Ok(None) };
    let path = &s.deploy.lock_file;
    let mut lock = LockFile::load_or_new(path, &s.kit.name).map_err(|e| e.to_string())?;
    if lock.image(image).is_some() {
        return Ok(None);
    }
    let vllm = docker
        .iter()
        .find_map(|d| d.vllm_version.as_ref().and_then(|v| v.as_ref().ok()))
        .map(|v| v.trim().to_string())
        .unwrap_or_default();
    lock.images.push(ImageEntry { image: image.to_string(), id: id.to_string(), vllm_version: vllm });
    lock.save(path).map_err(|e| e.to_string())?;
    Ok(Some(format!("recorded image {image} = {id} in {} (checked on every node from now on)", path.display())))
}
