//! The docker runtime: the same overlay, model and Engram files as the venv runtime
//! ([`prepare_files`]), the engine run as a container of `engine.docker_image`
//! ([`run::run_argv`]) whose `docker run` client is the engine process
//! ([`container::launch`]: own process group, tagged log, hang sink), the node's compile caches
//! mounted read-write ([`run::CACHES`]). The memory guard follows
//! the container's cgroup, and stopping or losing the engine ends in `docker stop -t
//! <shutdown_timeout_s>` then `docker rm -f` ([`container::stop`]).

pub mod container;
pub mod dockerctl;
pub mod heartbeat;
pub mod image_build;
pub mod run;

use serde::{Deserialize, Serialize};

use super::{makes_model, prepare_files, LaunchEnv, Leftover, Prepared, Runtime, UpError, UpReporter};
use crate::cancel::Cancel;
use crate::deploy::Deployment;
use crate::engine::argv;
use crate::engine::process::{self, Engine};
use crate::kit::schema::Kit;
use crate::memguard::EngineRef;
use run::{cache_mounts, container_name, run_argv, Mounts};

/// `engine.runtime: docker`.
pub struct Docker;

/// The containers earlier runs of any kit left on this node, each with the name of the kit it was
/// started for ([`super::leftovers_of_every_kit`]).
pub fn leftovers_of_every_kit() -> Result<Vec<(String, Leftover)>, UpError> {
    let listed = dockerctl::containers_of_every_kit()
        .map_err(docker_error("listing the containers of every kit".to_string()))?;
    Ok(listed.into_iter().map(|(kit, c)| (kit, Leftover { name: c.name, id: c.id, state: c.state })).collect())
}

/// What preflight asks about Docker on a node ([`Runtime::preflight_request`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerRequest {
    /// `engine.docker_image`.
    pub image: String,
    /// The kit's name: containers labelled `spark-kit.kit=<kit>` are this deployment's.
    pub kit: String,
    /// Read the vLLM version inside the image (the image runs its own vLLM).
    #[serde(default)]
    pub read_vllm: bool,
    /// Directory on the node caching that version per image id (one file per id).
    #[serde(default)]
    pub version_cache: Option<String>,
}

fn docker_error(what: String) -> impl FnOnce(dockerctl::DockerError) -> UpError {
    move |source| UpError::Docker { what, source }
}

impl Runtime for Docker {
    /// The overlay and the model; the venv only when the container mounts it
    /// (`engine.docker_mount_venv`) or a tiny model is made with its python.
    fn prepare(
        &self,
        kit: &Kit,
        deploy: &Deployment,
        rep: &dyn UpReporter,
        cancel: &Cancel,
    ) -> Result<Prepared, UpError> {
        prepare_files(kit, deploy, rep, kit.engine.docker_mount_venv || makes_model(kit), cancel)
    }

    /// Remove a leftover container of the same name (a restart can race the daemon's own
    /// removal of the last one), then `docker run` in the foreground.
    fn launch(&self, kit: &Kit, node: usize, prep: &Prepared, env: &LaunchEnv<'_>) -> Result<Engine, UpError> {
        let name = container_name(kit, node);
        container::stop(&name, 0).map_err(docker_error(format!("removing the leftover container {name}")))?;
        let mut spec = argv::build(kit, node, "/model", "/opt/spark-overlay");
        // The kit's own settings (extra_env, the node's env) win over the defaults for Engram;
        // the Engram directories themselves are mounts (run_argv sets their variables).
        for (k, v) in &prep.engram_env {
            if !matches!(k.as_str(), "SPARK_ENGRAM_DIR" | "SPARK_ENGRAM_PACKED_DIR") {
                spec.env.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let engram = |key: &str| prep.engram_env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let (venv, same_path) = match (&prep.venv, kit.engine.docker_mount_venv) {
            (Some(v), true) => (Some(v.display().to_string()), image_build::venv_mounts(v)?),
            _ => (None, Vec::new()),
        };
        // The compile caches live on the node; made here (as the agent's user) so that docker
        // does not make them as root.
        let caches = cache_mounts(env.home);
        for (host, _) in &caches {
            std::fs::create_dir_all(host).map_err(|source| UpError::CacheDir { path: host.into(), source })?;
        }
        let mounts = Mounts {
            model: prep.model.display().to_string(),
            engram: engram("SPARK_ENGRAM_DIR"),
            engram_packed: engram("SPARK_ENGRAM_PACKED_DIR"),
            overlay: prep.overlay.display().to_string(),
            caches,
            venv,
            same_path,
            // Secrets (the API key) travel in the client's environment, not on its command line.
            pass_env: env.extra.iter().map(|(k, _)| k.clone()).collect(),
        };
        let run = run_argv(kit, node, &spec, &mounts);
        let log = process::log_path(&prep.logs, &kit.name, &kit.nodes[node].name);
        let ranks = argv::node_ranks(kit);
        let tag = format!("{}/r{}", kit.nodes[node].name, ranks.get(node).copied().unwrap_or(0));
        Ok(container::launch_with(&run, env.base, env.extra, log, tag, env.sink.clone())?)
    }

    /// The running container (its cgroup), once the daemon reports it running.
    fn guard_target(&self, kit: &Kit, node: usize, _engine: &Engine) -> Option<EngineRef> {
        container::engine_ref(&container_name(kit, node)).ok().flatten()
    }

    /// The running container's id and its image's id.
    fn engine_ids(&self, kit: &Kit, node: usize) -> Option<(String, String)> {
        let name = container_name(kit, node);
        let text = dockerctl::query(
            &["container", "inspect", "--format", "{{.Id}} {{.Image}} {{.State.Running}}", &name],
            None,
        )
        .ok()?;
        let mut p = text.split_whitespace();
        let (id, image) = (p.next()?.to_string(), p.next()?.to_string());
        (p.next()? == "true").then_some((id, image))
    }

    /// Every container labelled as this kit's (`docker rm -f`).
    fn remove_leftovers(&self, kit: &Kit) -> Result<Vec<String>, UpError> {
        container::remove_deployment(&kit.name)
            .map_err(docker_error(format!("removing the containers of kit {}", kit.name)))
    }

    /// The kit's containers on this node (by label), running or not.
    fn leftovers(&self, kit: &Kit) -> Result<Vec<Leftover>, UpError> {
        let listed = dockerctl::containers_labelled(dockerctl::LABEL_KIT, &kit.name)
            .map_err(docker_error(format!("listing the containers of kit {}", kit.name)))?;
        Ok(listed.into_iter().map(|c| Leftover { name: c.name, id: c.id, state: c.state }).collect())
    }

    /// `engine.docker_image`.
    fn image<'k>(&self, kit: &'k Kit) -> Option<&'k str> {
        Some(kit.engine.docker_image.as_deref().unwrap_or_default())
    }

    /// A small rootfs the engine venv is mounted into (`engine.docker_mount_venv`).
    fn builds_image(&self, kit: &Kit) -> bool {
        kit.engine.docker_mount_venv
    }

    /// The image's own vLLM, unless the container mounts the engine venv
    /// (`engine.docker_mount_venv`).
    fn vllm_in_venv(&self, kit: &Kit) -> bool {
        kit.engine.docker_mount_venv
    }

    /// The image (its id, its vLLM when the image runs its own) and the kit's containers.
    fn preflight_request(&self, kit: &Kit, version_cache: Option<&str>) -> Option<DockerRequest> {
        Some(DockerRequest {
            image: self.image(kit).unwrap_or_default().to_string(),
            kit: kit.name.clone(),
            read_vllm: !self.vllm_in_venv(kit),
            version_cache: version_cache.map(str::to_string),
        })
    }

    /// `docker stop -t <shutdown_timeout_s>`, then `docker rm -f` if it is still listed.
    fn stop(&self, kit: &Kit, node: usize) -> Result<(), UpError> {
        let name = container_name(kit, node);
        container::stop(&name, kit.engine.shutdown_timeout_s).map_err(docker_error(format!("stopping {name}")))
    }
}
