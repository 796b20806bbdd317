//! `spark-kit preflight [--kit K] [--json]`: every check on every node the kit names. Nodes on
//! this machine (transport `local`) are probed here; remote nodes are "not checked" until the
//! node agent probes them — never a pass.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::verify::checkpoint_for;
use super::{io_failure, load, Context};
use crate::checkpoint::budget::weight_budget;
use crate::checkpoint::exl3_audit::num_hidden_layers;
use crate::cli::PreflightArgs;
use crate::dirs::Dirs;
use crate::engine::{model, recipe::Recipe, venv};
use crate::error::Failure;
use crate::kit::schema::{Kit, Node, Runtime, Transport};
use crate::node::checks::Verdict;
use crate::node::preflight::{self, PreflightInput, Report};
use crate::node::probe::{LocalProbe, ProbeSource};

/// Weights per rank and on disk, when the kit's checkpoint can be measured (a local
/// `model.path`, or the modelled DeepSeek V4.1 Flash for the kit that serves it).
fn weights(kit: &Kit) -> (Option<u64>, Option<u64>) {
    let Ok((ckpt, _)) = checkpoint_for(kit, None, false, true) else { return (None, None) };
    match weight_budget(&ckpt, kit.tensor_parallel_size, num_hidden_layers(&kit.model.k_map)) {
        Ok(b) => (Some(b.per_rank_bytes), Some(b.total_bytes + b.excluded_bytes)),
        Err(_) => (None, None),
    }
}

/// Where the kit's weights live on this machine: `model.path`, else the model repo's directory in
/// the Hugging Face cache (or the cache itself for locally made models).
#[must_use]
pub fn model_dir(kit: &Kit, env: &[(String, String)]) -> PathBuf {
    let dirs = Dirs::from_env(env);
    match &kit.model.path {
        Some(p) => dirs.expand(p),
        None => {
            let hf = model::hf_cache(kit.paths.hf_cache.as_deref().map(|p| dirs.expand(p)).as_deref(), env, &dirs.home);
            if kit.model.repo.is_empty() {
                hf
            } else {
                model::repo_dir(&hf, &kit.model.repo)
            }
        }
    }
}

/// The input preflight needs besides the kit, from this machine.
#[must_use]
pub fn input(kit: &Kit, env: &[(String, String)]) -> PreflightInput {
    let dirs = Dirs::from_env(env);
    let (weights_per_rank, weights_on_disk) = weights(kit);
    let disk_path = model_dir(kit, env);

    let vllm_python = (kit.engine.runtime == Runtime::Venv)
        .then(|| Recipe::load(&kit.engine.requirements).ok())
        .flatten()
        .and_then(|r| venv::find(&dirs.cache, &r))
        .map(|v| v.path.join("bin/python").display().to_string());
    PreflightInput { weights_per_rank, weights_on_disk, disk_path: disk_path.display().to_string(), vllm_python }
}

pub fn run(args: &PreflightArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let resolved = load::resolve(&args.kit, &ctx.env)?;
    let kit = &resolved.kit;
    let input = input(kit, &ctx.env);
    let _ = writeln!(ctx.err, "preflight: {} node(s) of kit {}", kit.nodes.len(), kit.name);
    let local = |n: &Node| -> Option<Box<dyn ProbeSource>> {
        (n.transport == Transport::Local).then(|| Box::new(LocalProbe { timeout_s: 10 }) as Box<dyn ProbeSource>)
    };
    let report = preflight::run(kit, &input, &local);
    let text = if args.json {
        serde_json::to_string_pretty(&report).map_err(|e| Failure::runtime(e.to_string()))?
    } else {
        human(&report)
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))?;
    let (_, warn, fail, unchecked) = report.counts();
    match report.status {
        Verdict::Fail => Err(Failure::runtime(format!("preflight failed: {fail} check(s) failed, {warn} warning(s)"))
            .with_hint("each FAIL line above says what to fix")),
        Verdict::NotChecked => {
            Err(Failure::runtime(format!("preflight incomplete: {unchecked} check(s) could not run from this machine"))
                .with_hint(
                    "remote nodes are checked through the node agent; run `spark-kit preflight` on them meanwhile",
                ))
        }
        _ => Ok(()),
    }
}

fn human(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:<12} {:<16} {:<12} MESSAGE", "NODE", "CHECK", "VERDICT");
    for c in &r.checks {
        let _ = writeln!(s, "{:<12} {:<16} {:<12} {}", c.node, c.id, c.verdict.label(), c.message);
        if let Some(fix) = &c.fix {
            if matches!(c.verdict, Verdict::Warn | Verdict::Fail | Verdict::NotChecked) {
                let _ = writeln!(s, "{:<42} fix: {fix}", "");
            }
        }
    }
    let (pass, warn, fail, unchecked) = r.counts();
    let _ = writeln!(s, "\n{pass} pass, {warn} warn, {fail} fail, {unchecked} not checked");
    s
}
