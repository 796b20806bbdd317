//! `spark-kit up [--detach]` and `spark-kit restart`: bring the deployment up through one node
//! agent per node and supervise it; Ctrl-C / SIGTERM / `down` drain and stop everything.
//! The settings come from `up_prepare.rs`, the texts from `up_text.rs`, the terminal from
//! `reporter.rs`, the background run from `up_detach.rs`, the signals from `crate::signals`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::up_prepare::{check_free, gates, is_running, settings, Registration};
use super::up_text::{banner, cluster_hint, failure_from};
use super::{io_failure, up_detach, up_gateway, Context};
use crate::cli::UpArgs;
use crate::error::Failure;
use crate::gateway::{DrainOutcome, Front};
use crate::reporter::{watch_ready, UpLines};
use crate::signals;
use crate::supervisor::control::{request, serve, wait_answered};
use crate::supervisor::state::Policy;
use crate::supervisor::{self, ClusterReporter as _, Handles};

pub fn run(args: &UpArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let s = settings(args, &ctx.env)?;
    check_free(&s)?;
    // The gateway's settings are checked before anything starts (detached or not).
    let (gw_cfg, gw_note) = up_gateway::config(&s)?;
    if args.detach {
        return up_detach::detach(&s, ctx);
    }
    let gw_line = up_gateway::summary(&gw_cfg, gw_note.as_deref());
    let front = Front::start(gw_cfg)?;
    UpLines.line(&gw_line);
    UpLines.line(&format!("==> engine: {}", s.kit.engine_line()));
    let handles = Handles::new(&s.kit).with_front(front);
    signals::forward_to(Arc::clone(&handles.stop)).map_err(|e| Failure::runtime_error(&e))?;
    serve(&s.socket, handles.clone()).map_err(|e| {
        Failure::runtime(format!("cannot open the control socket {}: {e}", s.socket.display())).caused_by_chain_of(&e)
    })?;
    let registration = Registration::new(&s, args, &mut *ctx.err);
    let (key, kit_ref) = (s.key.clone(), s.kit_ref.clone());
    let text =
        move |snap: &_, secs| format!("{}\nCtrl-C stops the deployment.", banner(snap, secs, key.as_ref(), &kit_ref));
    let watcher = watch_ready(Arc::clone(&handles.snapshot), args.verbose, Box::new(text));
    let gates = gates(&s, args)?;
    let result = supervisor::run(&s.kit, &s.deploy.logs, Policy::default(), &UpLines, handles.clone(), &gates);
    // `down` is answered with the final snapshot before the process (and its socket) goes.
    wait_answered(Duration::from_secs(5));
    registration.release();
    drop(watcher);
    match handles.drained() {
        Some(Ok(DrainOutcome::Idle)) => UpLines.line("==> gateway drained: every in-flight request finished"),
        Some(Ok(DrainOutcome::TimedOut(n))) => UpLines.line(&format!(
            "==> gateway: {n} requests were still in flight after engine.drain_timeout_s {} s; their streams were ended with an error event",
            s.kit.engine.drain_timeout_s
        )),
        Some(Err(e)) => UpLines.line(&format!("warning: the gateway stopped serving: {e}")),
        None => {}
    }
    let snap = handles.snapshot.lock().map(|s| s.clone()).map_err(|_| Failure::runtime("supervisor state poisoned"))?;
    match result {
        // Stopped by Ctrl-C / SIGTERM: exit 128 + the signal, as shells expect (130, 143).
        Ok(0) => match signals::received() {
            None => writeln!(ctx.err, "==> stopped").map_err(|e| io_failure(&e)),
            Some(sig) => {
                writeln!(ctx.err, "==> stopped ({})", signals::name(sig)).map_err(|e| io_failure(&e))?;
                Err(Failure::signalled(sig))
            }
        },
        Ok(_) => Err(failure_from(&snap, &s.kit_ref)),
        Err(e) if e.is_usage() => Err(Failure::usage_error(&e).with_hint_opt(cluster_hint(&e, &s.kit_ref))),
        Err(e) => Err(Failure::runtime_error(&e).with_hint_opt(cluster_hint(&e, &s.kit_ref))),
    }
}

/// `restart`: validate the kit first (a bad kit stops nothing), then `down` and `up --detach`.
pub fn restart(args: &UpArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let s = settings(args, &ctx.env)?;
    if is_running(&s) {
        writeln!(ctx.err, "==> stopping the running deployment").map_err(|e| io_failure(&e))?;
        request(&s.socket, &s.kit.name, "down", None)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while s.socket.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let detached = UpArgs {
        verbose: false,
        detach: true,
        shutdown_timeout: args.shutdown_timeout.clone(),
        skip_preflight: args.skip_preflight,
        replace: args.replace,
        kit: args.kit.clone(),
    };
    run(&detached, ctx)
}
