//! `spark-kit plan [--kit K] [--json]`: the per-node memory plan.

use super::checkpoint_source::checkpoint_in;
use super::{io_failure, load, Context};
use crate::checkpoint::kit_plan::{kit_plan, unfit};
use crate::checkpoint::single_node::single_node;
use crate::checkpoint::single_node_text;
use crate::cli::PlanArgs;
use crate::error::Failure;
use crate::kit::schema::Transport;
use crate::plan::parse_meminfo;

pub fn run(args: &PlanArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let s = load::settings(&args.kit, &ctx.env)?;
    let kit = &s.kit;
    let (ckpt, label) = checkpoint_in(&s, args.model.as_ref(), args.r#virtual, true)?;
    if let Some(n) = args.nodes {
        if n != 1 {
            return Err(Failure::usage(format!(
                "--nodes {n}: only `--nodes 1` (the single-Spark answer) is planned apart from the kit's own nodes"
            ))
            .with_hint(format!("drop --nodes for the kit's {} node(s), or pass --nodes 1", kit.nodes.len())));
        }
        let p = single_node(kit, &ckpt, &label)?;
        let text = if args.json { serde_json::to_string_pretty(&p)? } else { single_node_text::render(&p) };
        return writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e));
    }
    let mut measured = Vec::new();
    if args.measure {
        let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| {
            Failure::runtime(format!("--measure: cannot read /proc/meminfo: {e}")).caused_by_chain_of(&e)
        })?;
        let (total, available) = parse_meminfo(&text)
            .ok_or_else(|| Failure::runtime("--measure: /proc/meminfo has no MemTotal/MemAvailable"))?;
        let local = kit.nodes.iter().find(|n| n.transport == Transport::Local).map_or("local", |n| n.name.as_str());
        measured.push((local.to_string(), total, available));
    }
    let p = kit_plan(kit, &ckpt, &label, &measured)?;
    let text = if args.json { serde_json::to_string_pretty(&p)? } else { crate::plan::text::render(&p) };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))?;
    let unfit = unfit(&p);
    if unfit.is_empty() {
        Ok(())
    } else {
        Err(Failure::runtime(format!("the plan does not fit on: {}", unfit.join(", ")))
            .with_hint("see the warnings above for what to change"))
    }
}
