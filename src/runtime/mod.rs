//! How a node runs its engine, in its own room: a [`Runtime`] prepares what the engine needs on
//! this node and starts it as one process group the agent can watch and stop, and answers for
//! what a run of it leaves behind ([`Runtime::leftovers`], [`Runtime::remove_leftovers`]);
//! [`of`] is the one place that picks the runtime from `engine.runtime`. The venv runtime
//! is [`venv`], the docker runtime [`docker`]; a new runtime is a new file here and one arm in
//! [`of`]. Used by the node agent (`agent/`) and by `status` (leftovers); `engine/` keeps
//! the vLLM process, its argv and its log.

pub mod docker;
pub mod venv;

use std::net::TcpListener;
use std::path::PathBuf;

use std::time::Instant;

use crate::cancel::Cancel;
use crate::deploy::Deployment;
use crate::engine::process::{self, Engine, LineSink};
use crate::engine::{model, overlay};
use crate::kit::schema::{Kit, ModelSource, Runtime as RuntimeKind};
use crate::memguard::EngineRef;
use docker::{dockerctl, image_build};
use venv::build as setup;
use venv::recipe::{Recipe, RecipeError};

/// Progress of a bring-up on one node; the agent turns it into `Phase` events.
pub trait UpReporter: setup::SetupReporter {
    /// A phase (`setup`, `model`, `engine`, `health`) starts.
    fn phase(&self, name: &str, detail: &str);
    /// It finished after `secs`.
    fn phase_done(&self, name: &str, secs: f64);
}

/// What the engine needs on disk, made ready by [`Runtime::prepare`].
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The engine venv (venv runtime; docker runtime with `engine.docker_mount_venv` or a tiny
    /// model to make).
    pub venv: Option<PathBuf>,
    pub overlay: PathBuf,
    pub model: PathBuf,
    pub logs: PathBuf,
    /// Engram tables' environment for the engines (kits with `engram`).
    pub engram_env: Vec<(String, String)>,
}

/// What starting one node's engine needs besides the kit and the prepared files.
pub struct LaunchEnv<'a> {
    /// The agent's own environment (only a few names are passed on to the engine).
    pub base: &'a [(String, String)],
    /// This node's HOME (the engine's compile caches live under it).
    pub home: &'a std::path::Path,
    /// Added to the engine's environment last (e.g. `VLLM_API_KEY`).
    pub extra: &'a [(String, String)],
    /// Receives every engine output line (the hang detector).
    pub sink: Option<LineSink>,
}

/// A way of running the engine on a node.
pub trait Runtime {
    /// Ensure everything the engine needs (environment, overlay, model); may take minutes.
    /// Runs off the agent's command loop; `cancel` (a stop) kills what it runs and ends it with
    /// nothing half-made left in place.
    fn prepare(
        &self,
        kit: &Kit,
        deploy: &Deployment,
        rep: &dyn UpReporter,
        cancel: &Cancel,
    ) -> Result<Prepared, UpError>;

    /// Start node `node`'s engine in its own process group, logging to the kit's logs dir.
    fn launch(&self, kit: &Kit, node: usize, prep: &Prepared, env: &LaunchEnv<'_>) -> Result<Engine, UpError>;

    /// What the memory guard follows while `engine` runs: its process group (the default), or
    /// what the runtime runs it in. None while that is not known yet (asked again later).
    fn guard_target(&self, _kit: &Kit, _node: usize, engine: &Engine) -> Option<EngineRef> {
        Some(EngineRef::Group(engine.pgid))
    }

    /// Called whenever the agent stops or loses node `node`'s engine (stop, restart, `down`,
    /// the supervisor gone, the engine exited): release what outlives the engine process. The
    /// venv runtime has nothing (its process group is the engine); docker removes the container.
    fn stop(&self, _kit: &Kit, _node: usize) -> Result<(), UpError> {
        Ok(())
    }

    /// What the running engine runs in, for `status`: (container id, image id). None for a
    /// plain process (the venv runtime), or while not known yet (asked again later).
    fn engine_ids(&self, _kit: &Kit, _node: usize) -> Option<(String, String)> {
        None
    }

    /// Remove what an earlier run of `kit` left on this node (`up --replace`); their names.
    /// The venv runtime leaves nothing (an agent's engine group dies with it).
    fn remove_leftovers(&self, _kit: &Kit) -> Result<Vec<String>, UpError> {
        Ok(Vec::new())
    }

    /// The image the engine runs in (`engine.docker_image`, docker), None for a plain process
    /// (the venv runtime): what `image build` / `image sync` work on, what the lock records.
    fn image<'k>(&self, _kit: &'k Kit) -> Option<&'k str> {
        None
    }

    /// Whether spark-kit makes that image itself (`spark-kit image build`, offline, from the
    /// engine venv): docker with `engine.docker_mount_venv`. Otherwise it is pulled.
    fn builds_image(&self, _kit: &Kit) -> bool {
        false
    }

    /// Whether the engine's vLLM (and its torch) is the engine venv's on the node, rather than
    /// an image's own: then preflight reads vLLM's version with the venv's python, `setup` fixes
    /// it, and the all-reduce runs with that python. The venv runtime: always.
    fn vllm_in_venv(&self, _kit: &Kit) -> bool {
        true
    }

    /// The runtime's part of a node's preflight request (`node::facts::FactRequest::docker`):
    /// docker, the image and the kit's containers to look at. `version_cache`: the directory
    /// caching the vLLM version of each image id. The venv runtime asks nothing more.
    fn preflight_request(&self, _kit: &Kit, _version_cache: Option<&str>) -> Option<docker::DockerRequest> {
        None
    }

    /// What an earlier run of `kit` left on this node, without removing it (`status` names
    /// them when no deployment runs). The venv runtime leaves nothing.
    fn leftovers(&self, _kit: &Kit) -> Result<Vec<Leftover>, UpError> {
        Ok(Vec::new())
    }
}

/// What earlier runs of any kit left on this node (`status` with no `--kit`), each with its kit's
/// name: the docker runtime's containers (the venv runtime leaves nothing). Docker missing or
/// not answering within its listing limit is an error.
pub fn leftovers_of_every_kit() -> Result<Vec<(String, Leftover)>, UpError> {
    docker::leftovers_of_every_kit()
}

/// One thing a run left behind ([`Runtime::leftovers`]): docker, a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    pub name: String,
    pub id: String,
    pub state: String,
}

/// The engine venv of `kit`: `engine.venv`, or the cache entry its requirements build.
pub fn engine_venv(kit: &Kit, deploy: &Deployment, rep: &dyn UpReporter, cancel: &Cancel) -> Result<PathBuf, UpError> {
    Ok(match &deploy.venv {
        Some(p) => p.clone(),
        None => setup::ensure(deploy.cache(), &Recipe::load(&kit.engine.requirements)?, rep, cancel)?.path,
    })
}

/// The engine's files, for every runtime: the venv (when given), the materialised overlay, the
/// model (made with the venv's python when the kit's model is a tiny one) and the Engram
/// tables' environment. Reports the `setup` and `model` phases; `cancel` ends it between and
/// within them.
pub fn prepare_files(
    kit: &Kit,
    deploy: &Deployment,
    rep: &dyn UpReporter,
    want_venv: bool,
    cancel: &Cancel,
) -> Result<Prepared, UpError> {
    let logs = deploy.logs.clone();
    let t = Instant::now();
    let what = if want_venv { format!("engine venv ({})", kit.engine.requirements) } else { "overlay".into() };
    rep.phase("setup", &what);
    let venv = if want_venv { Some(engine_venv(kit, deploy, rep, cancel)?) } else { None };
    let overlay = overlay::materialise(deploy.cache())?;
    if cancel.is_cancelled() {
        return Err(UpError::Cancelled);
    }
    rep.phase_done("setup", t.elapsed().as_secs_f64());

    let t = Instant::now();
    let source = format!("{:?}", kit.model.source).to_lowercase();
    rep.phase("model", &source);
    // Only the tiny makers run python; they are only asked for with a venv (`makes_model`).
    let python = venv.as_ref().map(|v| v.join("bin/python")).unwrap_or_default();
    let maker_log = logs.join(format!("{}-model-maker.log", kit.name));
    let still = |secs: f64| rep.phase("model", &format!("{source}: still being made, {secs:.0} s"));
    let model = model::ensure(kit, deploy, &python, &overlay, &maker_log, &still, cancel)?;
    rep.phase_done("model", t.elapsed().as_secs_f64());
    let engram_env = crate::engram::engine_env(kit, deploy);
    Ok(Prepared { venv, overlay, model, logs, engram_env })
}

/// Whether the kit's model is made on the node (with the engine venv's python).
#[must_use]
pub fn makes_model(kit: &Kit) -> bool {
    matches!(kit.model.source, ModelSource::TinyExl3 | ModelSource::TinyDense)
}

/// The runtime `kit.engine.runtime` names: the one place outside the kit's own checks that
/// decides by it. Everything else asks the runtime ([`Runtime::image`],
/// [`Runtime::vllm_in_venv`], [`Runtime::preflight_request`], the leftovers).
#[must_use]
pub fn of(kit: &Kit) -> Box<dyn Runtime> {
    match kit.engine.runtime {
        RuntimeKind::Venv => Box::new(venv::Venv),
        RuntimeKind::Docker => Box::new(docker::Docker),
    }
}

/// Why bring-up failed. All are runtime failures (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("{what}: {source}")]
    Docker { what: String, source: dockerctl::DockerError },
    #[error(transparent)]
    Image(#[from] image_build::ImageError),
    #[error("{0}")]
    Setup(#[from] setup::SetupError),
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    #[error(transparent)]
    Overlay(#[from] overlay::OverlayError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error("port {port} on {host} is already in use")]
    PortInUse { host: String, port: u16 },
    #[error("cannot check port {port} on {host}: {why}")]
    Port { host: String, port: u16, why: String },
    #[error(transparent)]
    Spawn(#[from] process::SpawnError),
    #[error("cannot create the engine's cache directory {}: {source}", path.display())]
    CacheDir { path: std::path::PathBuf, source: std::io::Error },
    #[error("cannot find the spark-kit executable to start the engine: {0}")]
    SelfExe(std::io::Error),
    /// A stop came while preparing ([`Runtime::prepare`]'s `cancel`).
    #[error("the engine's preparation was cancelled")]
    Cancelled,
}

impl UpError {
    /// A one-line fix.
    #[must_use]
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::PortInUse { .. } => Some("stop what listens there or pick another port with --port".into()),
            Self::Setup(e) => e.log().map(|l| format!("full install log: {}", l.display())),
            Self::Model(model::ModelError::NotDownloaded { .. }) => Some("run `spark-kit download` first".into()),
            Self::Docker { source, .. } => Some(source.fix()),
            Self::CacheDir { path, .. } => Some(format!(
                "make {} writable by this user (or free space on its disk)",
                path.parent().unwrap_or(path).display()
            )),
            _ => None,
        }
    }
}

/// Fail early when the API port is taken (vLLM would fail only after loading the model).
pub fn check_port(host: &str, port: u16) -> Result<(), UpError> {
    match TcpListener::bind((host, port)) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(UpError::PortInUse { host: host.into(), port }),
        Err(e) => Err(UpError::Port { host: host.into(), port, why: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_named_with_a_fix() {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let e = check_port("127.0.0.1", port).unwrap_err();
        assert!(matches!(e, UpError::PortInUse { .. }), "{e}");
        assert!(e.hint().unwrap().contains("--port"));
        drop(l);
        assert!(check_port("127.0.0.1", port).is_ok());
    }

    #[test]
    fn each_runtime_answers_for_its_kit() {
        let venv = crate::kit::builtin_kit("tiny-cpu");
        let rt = of(&venv);
        assert_eq!(rt.image(&venv), None);
        assert!(!rt.builds_image(&venv));
        assert!(rt.vllm_in_venv(&venv));
        assert_eq!(rt.preflight_request(&venv, Some("/c")), None);

        let mut kit = crate::kit::builtin_kit("tiny-cpu-docker");
        let image = kit.engine.docker_image.clone();
        assert!(image.as_deref().is_some_and(|i| !i.is_empty()));
        for mount in [false, true] {
            kit.engine.docker_mount_venv = mount;
            let rt = of(&kit);
            assert_eq!(rt.image(&kit), image.as_deref());
            assert_eq!(rt.vllm_in_venv(&kit), mount, "the image's own vLLM unless it mounts the venv");
            assert_eq!(rt.builds_image(&kit), mount, "spark-kit builds only an image the venv is mounted into");
            let req = rt.preflight_request(&kit, Some("/c")).unwrap();
            assert_eq!(
                req,
                docker::DockerRequest {
                    image: image.clone().unwrap(),
                    kit: kit.name.clone(),
                    read_vllm: !mount,
                    version_cache: Some("/c".into()),
                }
            );
        }
    }
}
