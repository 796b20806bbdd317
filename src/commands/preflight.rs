//! `spark-kit preflight [--kit K] [--json]`: every check on every node the kit names. Nodes on
//! this machine (transport `local`) are probed here; the others through a node agent started on
//! them for the purpose. A node that cannot be reached is "not checked" — never a pass.

use super::preflight_input::{input, running};
use super::{io_failure, load, Context};
use crate::cli::PreflightArgs;
use crate::error::Failure;
use crate::node::checks::Verdict;
use crate::node::preflight::PreflightInput;
use crate::supervisor::bringup::evaluate;
use crate::supervisor::preflight::gather_facts;

pub fn run(args: &PreflightArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let settings = load::settings(&args.kit, &ctx.env)?;
    let kit = &settings.kit;
    let input = PreflightInput { running: running(&settings), all_reduce: true, ..input(&settings) };
    let _ =
        writeln!(ctx.err, "preflight: {} node(s) of kit {}; engine: {}", kit.nodes.len(), kit.name, kit.engine_line());
    if let Some(r) = &input.running {
        let _ = writeln!(
            ctx.err,
            "preflight: {r}: its ports, engine processes and loaded weights are its own (see {})",
            settings.kit_ref.quoted("status", &[])
        );
    }
    let facts = gather_facts(kit, &input, &settings.deploy.logs);
    let report = evaluate(kit, &input, &facts);
    if report.status == Verdict::Pass {
        match super::image_lock::record_first_seen(&settings, &facts) {
            Ok(Some(line)) => {
                let _ = writeln!(ctx.err, "{line}");
            }
            Ok(None) => {}
            Err(e) => return Err(Failure::runtime(format!("cannot record the engine image in spark-kit.lock: {e}"))),
        }
    }
    let text = if args.json { serde_json::to_string_pretty(&report)? } else { report.text() };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))?;
    let (_, warn, fail, unchecked) = report.counts();
    match report.status {
        Verdict::Fail => {
            let e = Failure::runtime(format!("preflight failed: {fail} check(s) failed, {warn} warning(s)"));
            // The hint points at the human table; JSON has no FAIL lines (each check carries its `fix`).
            Err(if args.json { e } else { e.with_hint("each FAIL line above says what to fix") })
        }
        Verdict::NotChecked => Err(Failure::runtime(format!(
            "preflight incomplete: {unchecked} check(s) could not run (a node did not answer)"
        ))
        .with_hint(format!("see the node agents' logs in {}", settings.deploy.logs.display()))),
        _ => Ok(()),
    }
}
