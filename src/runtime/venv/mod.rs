//! The venv runtime: the engine venv (built from the kit's requirements, or `engine.venv`), the
//! materialised overlay and the model on this machine; the engine is this binary's hidden
//! `__engine`, which embeds the venv's CPython and runs `vllm serve` on its main thread.

pub mod build;
pub mod prune;
pub mod recipe;

use super::{prepare_files, LaunchEnv, Prepared, Runtime, UpError, UpReporter};
use crate::cancel::Cancel;
use crate::deploy::Deployment;
use crate::engine::argv;
use crate::engine::process::{self, Engine, Launch};
use crate::kit::schema::Kit;

/// `engine.runtime: venv`.
pub struct Venv;

impl Runtime for Venv {
    /// Ensure the venv (or use `engine.venv`), the overlay and the model.
    fn prepare(
        &self,
        kit: &Kit,
        deploy: &Deployment,
        rep: &dyn UpReporter,
        cancel: &Cancel,
    ) -> Result<Prepared, UpError> {
        prepare_files(kit, deploy, rep, true, cancel)
    }

    /// Start node `node`'s engine (this binary's hidden `__engine`), logging to the kit's logs dir.
    fn launch(&self, kit: &Kit, node: usize, prep: &Prepared, env: &LaunchEnv<'_>) -> Result<Engine, UpError> {
        let spec = argv::build(kit, node, &prep.model.to_string_lossy(), &prep.overlay.to_string_lossy());
        let exe = crate::dirs::self_exe().map_err(UpError::SelfExe)?;
        let venv = prep.venv.clone().unwrap_or_default();
        let grace = kit.engine.shutdown_timeout_s + 5;
        let mut args = vec![
            "__engine".to_string(),
            "--venv".into(),
            venv.to_string_lossy().into_owned(),
            "--grace".into(),
            grace.to_string(),
            "--".into(),
        ];
        args.extend(spec.vllm_args);
        let mut child_env = spec.env;
        // The kit's own settings (extra_env, the node's env) win over the defaults for Engram.
        for (k, v) in &prep.engram_env {
            child_env.entry(k.clone()).or_insert_with(|| v.clone());
        }
        child_env.extend(env.extra.iter().cloned());
        let log = process::log_path(&prep.logs, &kit.name, &kit.nodes[node].name);
        let ranks = argv::node_ranks(kit);
        let tag = format!("{}/r{}", kit.nodes[node].name, ranks.get(node).copied().unwrap_or(0));
        let launch = Launch { program: exe, args, env: child_env, log, tag, sink: env.sink.clone() };
        Ok(process::spawn(&launch, env.base)?)
    }
}
