//! `spark-kit guard`: run the memory guard standalone, next to an engine started elsewhere (the
//! node agent runs the same library in-process). Events go to stdout, one line each (JSON with
//! `--json`); receipts to `--receipts`. SIGTERM or Ctrl-C stops it.

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use super::{io_failure, load, Context};
use crate::cli::GuardArgs;
use crate::error::Failure;
use crate::kit::schema::{GuardPolicy, Transport};
use crate::memguard::{
    Channel, ContainerId, EngineRef, EngineSource, FixedContainer, Guard, GuardConfig, GuardReporter, Overrides,
};
use crate::runtime::docker::dockerctl;
use crate::signals;

/// The guard configuration from the kit and the flags (flags win; sizes and the policy are
/// checked by their value parsers, src/cli/values.rs).
pub fn config(args: &GuardArgs, ctx: &Context<'_>) -> Result<(GuardConfig, PathBuf), Failure> {
    let settings = load::settings(&args.kit, &ctx.env)?;
    let kit = &settings.kit;
    let node = kit.nodes.iter().find(|n| n.transport == Transport::Local).map_or("local", |n| n.name.as_str());
    // The kit's checkpoint by default (locally made tiny models have no shards worth dropping).
    let kit_model = kit.model.path.is_some() || !kit.model.repo.is_empty();
    let model_paths = match (args.model.is_empty(), kit_model) {
        (true, true) => vec![super::preflight_input::model_dir(kit, &settings.deploy)],
        _ => args.model.clone(),
    };
    let cfg = GuardConfig::from_kit(kit, node).with(Overrides {
        soft_floor: args.soft,
        hard_floor: args.hard,
        policy: args.policy,
        sacrificable: args.sacrificable.clone(),
        model_paths,
        idle_baseline: args.baseline,
        // 0 to 600 (its value parser).
        drain: args.drain.map(Duration::from_secs_f64),
        victims_under: args.victims_under,
    });
    if cfg.soft_floor < cfg.hard_floor {
        return Err(Failure::usage(format!(
            "--soft {} is below --hard {}: the soft floor must be at or above the hard floor",
            cfg.soft_floor, cfg.hard_floor
        ))
        .with_hint("raise --soft or lower --hard (memory.guard.soft_floor / hard_floor in the kit)"));
    }
    if let Some(p) = args.pgid.filter(|&p| p <= 1 || crate::engine::pgroup::members(p).is_empty()) {
        return Err(Failure::usage(format!("--pgid {p}: no live process in that process group"))
            .with_hint("pass the engine's process group id (`ps -o pgid= -p <engine pid>`)"));
    }
    if let Some(p) = args.victims_under.filter(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
        return Err(Failure::usage(format!("--victims-under {p}: no such process"))
            .with_hint("pass a live pid whose descendants may be killed"));
    }
    Ok((cfg, args.receipts.clone().unwrap_or_else(|| settings.deploy.logs.join("guard"))))
}

/// `--container NAME`: the running container's id and main pid.
fn container(name: &str) -> Result<EngineRef, Failure> {
    let not_running = || {
        Failure::usage(format!("--container {name}: no running container of that name or id"))
            .with_hint("pass a running container (`docker ps --format '{{.Names}}'`)")
    };
    match dockerctl::inspect(name) {
        Ok(Some((id, pid, true))) if pid > 0 => {
            Ok(EngineRef::Container { id: ContainerId::parse(&id).ok_or_else(not_running)?, pid })
        }
        Ok(_) => Err(not_running()),
        Err(e) => Err(Failure::runtime(format!("--container {name}: {e}")).caused_by_chain_of(&e).with_hint(e.fix())),
    }
}

pub fn run(args: &GuardArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let (cfg, receipts) = config(args, ctx)?;
    let (tx, rx) = mpsc::channel();
    let reporter: Arc<dyn GuardReporter> = Arc::new(Channel::new(tx));
    let (pgid, policy) = (args.pgid, cfg.policy);
    let engine: Box<dyn EngineSource> = match &args.container {
        Some(name) => Box::new(FixedContainer(container(name)?)),
        None => Box::new(move || pgid),
    };
    let mut guard = Guard::new(cfg, engine, &receipts, reporter)?;
    signals::install(signals::Syscalls::Interrupt).map_err(|e| Failure::runtime_error(&e))?;
    if policy == GuardPolicy::Off {
        let _ = writeln!(ctx.err, "warning: guard policy `off`: the guard reports but never acts");
    }
    let worker = std::thread::Builder::new()
        .name("memguard".into())
        .spawn(move || guard.run(&signals::STOP))
        .map_err(|e| Failure::runtime(format!("cannot start the guard thread: {e}")).caused_by_chain_of(&e))?;
    for event in rx {
        let line = if args.json {
            serde_json::to_string(&event).unwrap_or_default()
        } else {
            crate::memguard::text::line(&event)
        };
        writeln!(ctx.out, "{line}").map_err(|e| io_failure(&e))?;
        ctx.out.flush().map_err(|e| io_failure(&e))?;
    }
    worker.join().map_err(|_| Failure::runtime("the guard thread panicked"))?;
    Ok(())
}
