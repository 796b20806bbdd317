//! How a node runs its engine. A [`Runtime`] prepares what the engine needs on this node and
//! starts it as one process group the agent can watch and stop; [`for_kit`] is the one place
//! that picks the runtime from `engine.runtime`. Nothing else in the agent or the supervisor
//! branches on the runtime: a new one (docker) is a new file beside `venv.rs` and one arm here.

use std::net::TcpListener;
use std::path::PathBuf;

use crate::dirs::Dirs;
use crate::engine::process::{self, Engine, LineSink};
use crate::engine::{model, overlay, venv};
use crate::kit::schema::{Kit, Runtime as RuntimeKind};

/// Progress of a bring-up on one node; the agent turns it into `Phase` events.
pub trait UpReporter: venv::SetupReporter {
    /// A phase (`setup`, `model`, `engine`, `health`) starts.
    fn phase(&self, name: &str, detail: &str);
    /// It finished after `secs`.
    fn phase_done(&self, name: &str, secs: f64);
}

/// What the engine needs on disk, made ready by [`Runtime::prepare`].
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The engine venv (venv runtime).
    pub venv: PathBuf,
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
    /// Added to the engine's environment last (e.g. `VLLM_API_KEY`).
    pub extra: &'a [(String, String)],
    /// Receives every engine output line (the hang detector).
    pub sink: Option<LineSink>,
}

/// A way of running the engine on a node.
pub trait Runtime {
    /// Ensure everything the engine needs (environment, overlay, model); may take minutes.
    fn prepare(
        &self,
        kit: &Kit,
        dirs: &Dirs,
        env: &[(String, String)],
        rep: &dyn UpReporter,
    ) -> Result<Prepared, UpError>;

    /// Start node `node`'s engine in its own process group, logging to the kit's logs dir.
    fn launch(&self, kit: &Kit, node: usize, prep: &Prepared, env: &LaunchEnv<'_>) -> Result<Engine, UpError>;
}

/// The runtime `kit.engine.runtime` names.
pub fn for_kit(kit: &Kit) -> Result<Box<dyn Runtime>, UpError> {
    match kit.engine.runtime {
        RuntimeKind::Venv => Ok(Box::new(super::venv::Venv)),
        RuntimeKind::Docker => Err(UpError::Docker),
    }
}

/// Why bring-up failed. All are runtime failures (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("engine.runtime `docker` is not started by `up` yet (its docker run command is built and unit-tested; running it is open work); set engine.runtime=venv with a venv that has vLLM, or use --kit tiny-cpu")]
    Docker,
    #[error("{0}")]
    Setup(#[from] venv::SetupError),
    #[error(transparent)]
    Recipe(#[from] crate::engine::recipe::RecipeError),
    #[error(transparent)]
    Overlay(#[from] overlay::OverlayError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error("port {port} on {host} is already in use")]
    PortInUse { host: String, port: u32 },
    #[error("cannot check port {port} on {host}: {why}")]
    Port { host: String, port: u32, why: String },
    #[error(transparent)]
    Spawn(#[from] process::SpawnError),
    #[error("cannot find the spark-kit executable to start the engine: {0}")]
    SelfExe(std::io::Error),
}

impl UpError {
    /// A one-line fix.
    #[must_use]
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::PortInUse { .. } => Some("stop what listens there or pick another port with --port".into()),
            Self::Setup(e) => e.log().map(|l| format!("full install log: {}", l.display())),
            Self::Model(model::ModelError::NotDownloaded { .. }) => Some("run `spark-kit download` first".into()),
            _ => None,
        }
    }
}

/// Fail early when the API port is taken (vLLM would fail only after loading the model).
pub fn check_port(host: &str, port: u32) -> Result<(), UpError> {
    let p = u16::try_from(port).map_err(|_| UpError::Port { host: host.into(), port, why: "out of range".into() })?;
    match TcpListener::bind((host, p)) {
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
        let port = u32::from(l.local_addr().unwrap().port());
        let e = check_port("127.0.0.1", port).unwrap_err();
        assert!(matches!(e, UpError::PortInUse { .. }), "{e}");
        assert!(e.hint().unwrap().contains("--port"));
        drop(l);
        assert!(check_port("127.0.0.1", port).is_ok());
        assert!(matches!(check_port("127.0.0.1", 70_000), Err(UpError::Port { .. })));
    }

    #[test]
    fn the_runtime_comes_from_the_kit() {
        let mut kit = crate::kit::resolve(crate::kit::source(Some("tiny-cpu")).unwrap(), &[], &[]).unwrap().kit;
        assert!(for_kit(&kit).is_ok());
        kit.engine.runtime = RuntimeKind::Docker;
        assert!(matches!(for_kit(&kit), Err(UpError::Docker)));
    }
}
