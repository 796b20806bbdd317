//! `spark-kit up`: bring the kit's deployment up in the foreground and stop it cleanly.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{io_failure, load, progress::Lines, Context};
use crate::cli::UpArgs;
use crate::dirs::Dirs;
use crate::error::Failure;
use crate::kit::{Origin, Override};
use crate::supervisor::health::{base_url, probe_host};
use crate::supervisor::local::{self, UpError, UpReporter};

fn up_failure(e: &UpError) -> Failure {
    let f = Failure::runtime(e.to_string());
    match e.hint() {
        Some(h) => f.with_hint(h),
        None => f,
    }
}

pub fn run(args: &UpArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let mut kit_args = args.kit.clone();
    let mut extra = Vec::new();
    if let Some(t) = &args.shutdown_timeout {
        extra.push(Override {
            path: vec!["engine".into(), "shutdown_timeout_s".into()],
            raw: t.clone(),
            origin: Origin::Flag("--shutdown-timeout".into()),
        });
    }
    let mut flags = load::flag_overrides(&kit_args)?;
    // --shutdown-timeout is a common flag: below --set, above the environment.
    flags.splice(0..0, extra);
    kit_args.kit = args.kit.kit.clone();
    let src = crate::kit::source(kit_args.kit.as_deref()).map_err(load::kit_failure)?;
    let resolved = crate::kit::resolve(src, &ctx.env, &flags).map_err(load::kit_failure)?;
    let kit = resolved.kit;
    if kit.nodes.len() > 1 {
        return Err(up_failure(&UpError::MultiNode(kit.nodes.len())));
    }
    let dirs = Dirs::from_env(&ctx.env);
    let rep = Lines::new(false);
    let started = Instant::now();

    local::check_port(&kit.engine.host, kit.engine.port).map_err(|e| up_failure(&e))?;
    let prep = local::prepare(&kit, &dirs, &ctx.env, &rep).map_err(|e| up_failure(&e))?;
    let key = local::api_key(&kit, &ctx.env, &dirs).map_err(Failure::usage)?;
    let extra_env: Vec<(String, String)> = key.iter().map(|k| ("VLLM_API_KEY".to_string(), k.clone())).collect();

    let node = kit.nodes[0].name.clone();
    let sink: Option<crate::engine::process::LineSink> = args.verbose.then(|| {
        let tag = format!("[{node}] ");
        Arc::new(move |line: &str| {
            let _ = writeln!(std::io::stderr(), "{tag}{line}");
        }) as crate::engine::process::LineSink
    });
    rep.phase(
        "engine",
        &format!("starting vLLM (log: {})", crate::engine::process::log_path(&prep.logs, &kit.name, &node).display()),
    );
    let mut engine = local::launch(&kit, 0, &prep, &ctx.env, &extra_env, sink).map_err(|e| up_failure(&e))?;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::runtime(format!("cannot start the async runtime: {e}")))?;
    let drain = Duration::from_secs(u64::from(kit.engine.shutdown_timeout_s) + 5);

    // Signals first, so a Ctrl-C during start-up also stops the group.
    let outcome = rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| Failure::runtime(format!("cannot watch SIGTERM: {e}")))?;
        rep.phase("health", "waiting for /health");
        let ready = tokio::select! {
            r = local::wait_ready(&kit, &mut engine) => Some(r),
            _ = tokio::signal::ctrl_c() => None,
            _ = term.recv() => None,
        };
        let Some(ready) = ready else { return Ok::<_, Failure>(Stop::Signal) };
        let secs = ready.map_err(|e| up_failure(&e))?;
        rep.phase_done("health", secs);
        let base = base_url(probe_host(&kit.engine.host), kit.engine.port);
        let model = &kit.engine.served_model_name;
        let _ = writeln!(
            ctx.out,
            "ready in {:.1} s\nendpoint: {base}/v1\nmodel:    {model}\ntry:      curl {base}/v1/chat/completions -H 'Content-Type: application/json' -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"max_tokens\":32}}'\nlogs:     {}\nCtrl-C stops the deployment.",
            started.elapsed().as_secs_f64(),
            engine.log.display()
        );
        let _ = ctx.out.flush();
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok(Stop::Signal),
                _ = term.recv() => return Ok(Stop::Signal),
                () = tokio::time::sleep(Duration::from_millis(500)) => {
                    if let Some(status) = engine.try_wait() {
                        return Ok(Stop::EngineExited(status.to_string()));
                    }
                }
            }
        }
    });
    let stop = |engine: &mut crate::engine::process::Engine, ctx: &mut Context<'_>| -> Result<(), Failure> {
        let _ = writeln!(
            ctx.err,
            "==> stopping: draining up to {} s, then killing the engine's process group",
            drain.as_secs()
        );
        let report = engine.stop(drain);
        if report.survivors.is_empty() {
            writeln!(
                ctx.err,
                "    stopped in {:.1} s ({})",
                report.seconds,
                if report.graceful { "graceful" } else { "killed" }
            )
            .map_err(|e| io_failure(&e))
        } else {
            Err(Failure::runtime(format!("processes survived the stop: {}", report.survivors.join(", ")))
                .with_hint("kill them by hand (kill -9 PID) and report this"))
        }
    };
    match outcome {
        Ok(Stop::Signal) => stop(&mut engine, ctx),
        Ok(Stop::EngineExited(status)) => {
            let tail = engine.log_tail(20);
            let log = engine.log.clone();
            stop(&mut engine, ctx)?;
            Err(Failure::runtime(format!("vLLM exited ({status}); last log lines:\n{tail}"))
                .with_hint(format!("full engine log: {}", log.display())))
        }
        Err(f) => {
            let _ = stop(&mut engine, ctx);
            Err(f)
        }
    }
}

enum Stop {
    Signal,
    EngineExited(String),
}
