//! One node's engine on this machine (the node agent calls these): prepare (venv, overlay,
//! model), check the port, start the engine process.

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Instant;

use crate::dirs::Dirs;
use crate::engine::process::{self, Engine, Launch, LineSink};
use crate::engine::{argv, model, overlay, recipe::Recipe, venv};
use crate::kit::schema::{Kit, Runtime};

/// Progress of a bring-up; implemented by the terminal front end.
pub trait UpReporter: venv::SetupReporter {
    /// A phase (`setup`, `model`, `engine`, `health`) starts.
    fn phase(&self, name: &str, detail: &str);
    /// It finished after `secs`.
    fn phase_done(&self, name: &str, secs: f64);
}

/// What the engine needs on disk.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub venv: PathBuf,
    pub overlay: PathBuf,
    pub model: PathBuf,
    pub logs: PathBuf,
    /// Engram tables' environment for the engines (kits with `engram`).
    pub engram_env: Vec<(String, String)>,
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

/// Paths of the kit resolved against this machine.
#[must_use]
pub fn logs_dir(kit: &Kit, dirs: &Dirs) -> PathBuf {
    dirs.expand(&kit.paths.logs)
}

/// Ensure the venv (or use `engine.venv`), the overlay and the model.
pub fn prepare(kit: &Kit, dirs: &Dirs, env: &[(String, String)], rep: &dyn UpReporter) -> Result<Prepared, UpError> {
    if kit.engine.runtime == Runtime::Docker {
        return Err(UpError::Docker);
    }
    let logs = logs_dir(kit, dirs);
    let t = Instant::now();
    rep.phase("setup", &format!("engine venv ({})", kit.engine.requirements));
    let venv = match &kit.engine.venv {
        Some(p) => dirs.expand(p),
        None => venv::ensure(&dirs.cache, &Recipe::load(&kit.engine.requirements)?, rep)?.path,
    };
    let overlay = overlay::materialise(&dirs.cache)?;
    rep.phase_done("setup", t.elapsed().as_secs_f64());

    let t = Instant::now();
    rep.phase("model", &format!("{:?}", kit.model.source).to_lowercase());
    let hf = model::hf_cache(kit.paths.hf_cache.as_deref().map(|p| dirs.expand(p)).as_deref(), env, &dirs.home);
    let model = model::ensure(
        kit,
        &dirs.expand(&kit.paths.data_dir),
        &hf,
        &venv.join("bin/python"),
        &overlay,
        &logs.join(format!("{}-model-maker.log", kit.name)),
    )?;
    rep.phase_done("model", t.elapsed().as_secs_f64());
    let engram_env = crate::engram::engine_env(kit, dirs);
    Ok(Prepared { venv, overlay, model, logs, engram_env })
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

/// Start node `node`'s engine (this binary's hidden `__engine`), logging to the kit's logs dir.
pub fn launch(
    kit: &Kit,
    node: usize,
    prep: &Prepared,
    base_env: &[(String, String)],
    extra_env: &[(String, String)],
    sink: Option<LineSink>,
) -> Result<Engine, UpError> {
    let spec = argv::build(kit, node, &prep.model.to_string_lossy(), &prep.overlay.to_string_lossy());
    let exe = crate::dirs::self_exe().map_err(UpError::SelfExe)?;
    let grace = kit.engine.shutdown_timeout_s + 5;
    let mut args = vec![
        "__engine".to_string(),
        "--venv".into(),
        prep.venv.to_string_lossy().into_owned(),
        "--grace".into(),
        grace.to_string(),
        "--".into(),
    ];
    args.extend(spec.vllm_args);
    let mut env = spec.env;
    // The kit's own settings (extra_env, the node's env) win over the defaults for Engram.
    for (k, v) in &prep.engram_env {
        env.entry(k.clone()).or_insert_with(|| v.clone());
    }
    env.extend(extra_env.iter().cloned());
    let log = process::log_path(&prep.logs, &kit.name, &kit.nodes[node].name);
    let ranks = crate::engine::argv::node_ranks(kit);
    let tag = format!("{}/r{}", kit.nodes[node].name, ranks.get(node).copied().unwrap_or(0));
    let launch = Launch { program: exe, args, env, log, tag, sink };
    Ok(process::spawn(&launch, base_env)?)
}

/// The API key for the endpoint from `engine.api_keys` (env var name or file), if any.
pub fn api_key(kit: &Kit, env: &[(String, String)], dirs: &Dirs) -> Result<Option<String>, String> {
    if let Some(name) = &kit.engine.api_keys.env {
        if let Some((_, v)) = env.iter().rev().find(|(k, _)| k == name) {
            if !v.is_empty() {
                return Ok(Some(v.clone()));
            }
        }
    }
    if let Some(f) = &kit.engine.api_keys.file {
        let path = dirs.expand(f);
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("engine.api_keys.file {}: {e}", path.display()))?;
        return Ok(text.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string));
    }
    Ok(None)
}
