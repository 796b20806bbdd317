//! `spark-kit __engine` (hidden): the engine process. Started by `up` as the leader of its own
//! process group; embeds Python from the venv and runs vLLM on the main thread.

use std::time::Duration;

use super::Context;
use crate::cli::EngineArgs;
use crate::engine::embed;
use crate::error::Failure;

pub fn run(args: &EngineArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    if let Err(e) = embed::set_oom_score_adj(1000) {
        let _ = writeln!(ctx.err, "spark-kit engine: cannot set oom_score_adj 1000: {e}");
    }
    embed::watch_parent(Duration::from_secs(args.grace));
    // Each child's exit (EngineCore's crash, a signal) goes to the engine log, for the agent to
    // say what died: vLLM itself then exits 0.
    crate::engine::child_exit::watch(|c| crate::reporter::line(&c.line()));
    let code = embed::run_vllm(&args.venv, &args.vllm)?;
    if code == 0 {
        Ok(())
    } else {
        Err(Failure::runtime(format!("vLLM exited with status {code}")))
    }
}
