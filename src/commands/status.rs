//! `spark-kit status [--json]` and `spark-kit down`.

use std::time::Duration;

use super::{io_failure, Context};
use crate::cli::{ControlArgs, StatusArgs};
use crate::error::Failure;
use crate::hints::KitRef;
use crate::live::LocateError;
use crate::node::docker_checks::leftovers_named;
use crate::supervisor::control::request;
use crate::supervisor::status_text::{not_running_json, render, running_json};

/// With no deployment running, what an earlier run left on this node (the kit's runtime says:
/// docker, its containers found by label) is named in the error, with how to remove it: of the
/// kit asked for, or with no `--kit` of every kit (nothing when docker is absent or not answering).
fn with_survivors(f: Failure, args: &crate::cli::KitArgs, env: &[(String, String)]) -> Failure {
    let (left, asked) = match super::target::given_kit(args, env) {
        Ok(Some(kit)) => {
            let left = crate::runtime::of(&kit).leftovers(&kit);
            (
                left.map(|v| v.into_iter().map(|c| (kit.name.clone(), c)).collect()),
                Some(KitRef::new(args.kit.as_deref())),
            )
        }
        Ok(None) => (crate::runtime::leftovers_of_every_kit(), None),
        Err(_) => return f,
    };
    match left.ok().and_then(|left| leftovers_named(&left, asked.as_ref())) {
        Some((tail, fix)) => Failure { message: format!("{}; {tail}", f.message), hint: Some(fix), ..f },
        None => f,
    }
}

pub fn run(args: &StatusArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let snap = match super::target::locate(&args.kit, &ctx.env)? {
        Ok(t) => t.snapshot,
        Err(e) => {
            let f = with_survivors(
                super::target::failure(&e, "status", &KitRef::new(args.kit.kit.as_deref())),
                &args.kit,
                &ctx.env,
            );
            if let (true, LocateError::NotRunning { kit }) = (args.json, &e) {
                // Scripts read a JSON value either way; the exit code is the human form's.
                let text = not_running_json(kit.as_deref(), &f.message, f.hint.as_deref())?;
                writeln!(ctx.out, "{text}").map_err(|e| io_failure(&e))?;
            }
            return Err(f);
        }
    };
    let text = if args.json { running_json(&snap)? } else { render(&snap) };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))
}

pub fn down(args: &ControlArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    // Found (and so checked running) first: nothing is "stopping" when nothing runs.
    let target = super::target::find(&args.kit, &ctx.env, "down")?;
    let (sock, name) = (&target.socket, &target.kit.name);
    let _ = writeln!(ctx.err, "==> stopping {name}: draining, then killing the engines on every node");
    let snap = request(sock, name, "down", None)?;
    // Wait for the supervisor to exit (it removes its socket last).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sock.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let alive: Vec<String> = snap.nodes.iter().filter(|n| n.engine_alive).map(|n| n.name.clone()).collect();
    if !alive.is_empty() {
        return Err(Failure::runtime(format!("engines still alive on: {}", alive.join(", "))).with_hint(format!(
            "check {} and kill the leftover process groups by hand",
            target.kit_ref.quoted("logs", &[])
        )));
    }
    writeln!(ctx.out, "stopped ({:?})", snap.state).map_err(|e| io_failure(&e))
}
