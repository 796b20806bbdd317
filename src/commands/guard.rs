//! `spark-kit guard`: run the memory guard standalone, next to an engine started elsewhere (the
//! node agent runs the same library in-process). Events go to stdout, one line each (JSON with
//! `--json`); receipts to `--receipts`. SIGTERM or Ctrl-C stops it.

use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use super::{io_failure, load, Context};
use crate::cli::GuardArgs;
use crate::engine::dockerctl;
use crate::error::Failure;
use crate::kit::bytes::ByteSize;
use crate::kit::schema::{GuardPolicy, Transport};
use crate::memguard::{
    ContainerId, EngineRef, EngineSource, FixedContainer, Guard, GuardConfig, GuardError, GuardEvent, GuardReporter,
};
use crate::signals;

struct Channel(Mutex<mpsc::Sender<GuardEvent>>);

impl GuardReporter for Channel {
    fn event(&self, event: &GuardEvent) {
        if let Ok(tx) = self.0.lock() {
            let _ = tx.send(event.clone());
        }
    }
}

fn size(flag: &str, v: &str) -> Result<u64, Failure> {
    v.parse::<ByteSize>().map(|b| b.bytes()).map_err(|e| {
        Failure::usage(format!("{flag}: {e}"))
            .with_hint(format!("e.g. {flag} 2.5GiB (units: B, KiB, MiB, GiB, kB, MB, GB)"))
    })
}

/// Parse `--policy`.
pub fn parse_policy(v: &str) -> Result<GuardPolicy, Failure> {
    match v {
        "protect-host" => Ok(GuardPolicy::ProtectHost),
        "kill-offender" => Ok(GuardPolicy::KillOffender),
        "off" => Ok(GuardPolicy::Off),
        _ => Err(Failure::usage(format!("--policy: `{v}` is not a guard policy"))
            .with_hint("use protect-host (default), kill-offender or off")),
    }
}

/// The guard configuration from the kit and the flags (flags win).
pub fn config(args: &GuardArgs, ctx: &Context<'_>) -> Result<(GuardConfig, PathBuf), Failure> {
    let settings = load::settings(&args.kit, &ctx.env)?;
    let kit = &settings.kit;
    let node = kit.nodes.iter().find(|n| n.transport == Transport::Local).map_or("local", |n| n.name.as_str());
    let mut cfg = GuardConfig::from_kit(kit, node);
    if let Some(v) = &args.soft {
        cfg.soft_floor = size("--soft", v)?;
    }
    if let Some(v) = &args.hard {
        cfg.hard_floor = size("--hard", v)?;
    }
    if let Some(v) = &args.policy {
        cfg.policy = parse_policy(v)?;
    }
    if !args.sacrificable.is_empty() {
        cfg.sacrificable.clone_from(&args.sacrificable);
    }
    if args.model.is_empty() {
        // The kit's checkpoint (locally made tiny models have no shards worth dropping).
        if kit.model.path.is_some() || !kit.model.repo.is_empty() {
            cfg.model_paths = vec![super::preflight_input::model_dir(kit, &ctx.env)];
        }
    } else {
        cfg.model_paths.clone_from(&args.model);
    }
    if let Some(v) = &args.baseline {
        cfg.idle_baseline = Some(size("--baseline", v)?);
    }
    if let Some(d) = args.drain {
        // 0 to 600 (its value parser).
        cfg.drain = Duration::from_secs_f64(d);
    }
    cfg.victims_under = args.victims_under;
    if cfg.soft_floor < cfg.hard_floor {
        return Err(Failure::usage(format!(
            "--soft {} is below --hard {}: the soft floor must be at or above the hard floor",
            cfg.soft_floor, cfg.hard_floor
        ))
        .with_hint("raise --soft or lower --hard (memory.guard.soft_floor / hard_floor in the kit)"));
    }
    if let Some(p) = args.pgid {
        if p <= 1 || crate::engine::pgroup::members(p).is_empty() {
            return Err(Failure::usage(format!("--pgid {p}: no live process in that process group"))
                .with_hint("pass the engine's process group id (`ps -o pgid= -p <engine pid>`)"));
        }
    }
    if let Some(p) = args.victims_under {
        if !std::path::Path::new(&format!("/proc/{p}")).exists() {
            return Err(Failure::usage(format!("--victims-under {p}: no such process"))
                .with_hint("pass a live pid whose descendants may be killed"));
        }
    }
    let receipts = args.receipts.clone().unwrap_or_else(|| settings.logs.join("guard"));
    Ok((cfg, receipts))
}

/// `--container NAME`: the running container's id and main pid.
fn container(name: &str) -> Result<EngineRef, Failure> {
    let not_running = || {
        Failure::usage(format!("--container {name}: no running container of that name or id"))
            .with_hint("pass a running container (`docker ps --format '{{.Names}}'`)")
    };
    match dockerctl::inspect(name) {
        Ok(Some((id, pid, true))) if pid > 0 => {
            let id = ContainerId::parse(&id).ok_or_else(not_running)?;
            Ok(EngineRef::Container { id, pid })
        }
        Ok(_) => Err(not_running()),
        Err(e) => Err(Failure::runtime(format!("--container {name}: {e}")).with_hint(e.fix())),
    }
}

pub fn run(args: &GuardArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let (cfg, receipts) = config(args, ctx)?;
    let (tx, rx) = mpsc::channel();
    let reporter: Arc<dyn GuardReporter> = Arc::new(Channel(Mutex::new(tx)));
    let pgid = args.pgid;
    let policy = cfg.policy;
    let engine: Box<dyn EngineSource> = match &args.container {
        Some(name) => Box::new(FixedContainer(container(name)?)),
        None => Box::new(move || pgid),
    };
    let mut guard = Guard::new(cfg, engine, &receipts, reporter).map_err(|e| {
        let hint = match &e {
            GuardError::Receipts { .. } => "pass --receipts DIR with a directory you can write",
            GuardError::Floors { .. } => "raise --soft or lower --hard",
            GuardError::Open { .. } | GuardError::Meminfo { .. } => {
                "the guard needs Linux /proc (meminfo and per-process stat)"
            }
        };
        Failure::runtime(e.to_string()).with_hint(hint)
    })?;
    signals::install(signals::Syscalls::Interrupt).map_err(|e| Failure::runtime_error(&e))?;
    if policy == GuardPolicy::Off {
        let _ = writeln!(ctx.err, "warning: guard policy `off`: the guard reports but never acts");
    }
    let worker = std::thread::Builder::new()
        .name("memguard".into())
        .spawn(move || {
            guard.run(&signals::STOP);
        })
        .map_err(|e| Failure::runtime(format!("cannot start the guard thread: {e}")))?;
    for event in rx {
        let line = if args.json { serde_json::to_string(&event).unwrap_or_default() } else { human(&event) };
        writeln!(ctx.out, "{line}").map_err(|e| io_failure(&e))?;
        ctx.out.flush().map_err(|e| io_failure(&e))?;
    }
    worker.join().map_err(|_| Failure::runtime("the guard thread panicked"))?;
    Ok(())
}

#[allow(clippy::cast_precision_loss)]
fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn human(e: &GuardEvent) -> String {
    match e {
        GuardEvent::Started { node, policy, soft_floor, hard_floor, mem_available, psi, memory_locked, receipts, .. } => {
            format!(
                "guard on {node}: policy {policy}, soft {} / hard {}, MemAvailable {}; PSI trigger: {psi}; memory locked: {memory_locked}; receipts in {}",
                gib(*soft_floor),
                gib(*hard_floor),
                gib(*mem_available),
                receipts.display()
            )
        }
        GuardEvent::Note { message } => format!("note: {message}"),
        GuardEvent::OomScoreAdj { pgid, check } if check.ok => {
            format!("engine group {pgid}: oom_score_adj 1000 on all {} process(es)", check.checked)
        }
        GuardEvent::OomScoreAdj { pgid, check } => format!(
            "warning: engine group {pgid}: oom_score_adj is not 1000 on {:?}; the kernel may kill host daemons first",
            check.wrong
        ),
        GuardEvent::SoftFloor { mem_available, growers, cache_dropped, .. } => format!(
            "warning: MemAvailable {} under the soft floor; dropped the page cache of {cache_dropped} model file(s); top growers: {}",
            gib(*mem_available),
            growers.iter().map(|g| format!("{} ({}) +{}", g.comm.as_str(), g.pid, gib(g.grown))).collect::<Vec<_>>().join(", ")
        ),
        GuardEvent::Acting { decision, reason, signal, reaction_ms, .. } => {
            format!("ACTION {decision}: {signal} sent {reaction_ms:.1} ms after the crossing — {reason}")
        }
        GuardEvent::Acted { decision, gone, ms, receipt, error } => format!(
            "{decision}: {} after {ms:.0} ms; receipt {}{}",
            if *gone { "victim gone" } else { "victim STILL ALIVE" },
            receipt.as_ref().map_or_else(|| "not written".to_string(), |p| p.display().to_string()),
            error.as_ref().map_or_else(String::new, |e| format!(" ({e})"))
        ),
        GuardEvent::NoAction { decision, mem_available, .. } => {
            format!("warning: MemAvailable {} under the hard floor: {decision}", gib(*mem_available))
        }
        GuardEvent::RestartGate { gate } => format!("restart gate: {}", serde_json::to_string(gate).unwrap_or_default()),
        GuardEvent::Stopped => "guard stopped".to_string(),
    }
}
