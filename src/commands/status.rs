//! `spark-kit status [--json]` and `spark-kit down`.

use std::time::Duration;

use super::{io_failure, Context};
use crate::cli::{ControlArgs, StatusArgs};
use crate::error::Failure;
use crate::hints::KitRef;
use crate::live::LocateError;
use crate::node::docker_checks::survivors_fix;
use crate::runtime::Leftover;
use crate::supervisor::control::request;
use crate::supervisor::status_text::{not_running_json, render, running_json};

/// With no deployment running, what an earlier run left on this node (the kit's runtime says:
/// docker, its containers found by label) is named in the error, with how to remove it. With no
/// `--kit`, the containers of every kit are named (none when docker is absent or not answering).
fn with_survivors(f: Failure, args: &crate::cli::KitArgs, env: &[(String, String)]) -> Failure {
    let kit = match super::target::given_kit(args, env) {
        Ok(Some(kit)) => kit,
        Ok(None) => return with_survivors_of_every_kit(f),
        Err(_) => return f,
    };
    let Ok(left) = crate::runtime::of(&kit).leftovers(&kit) else { return f };
    if left.is_empty() {
        return f;
    }
    let named: Vec<String> = left.iter().map(|c| format!("{} ({}, {})", c.name, short_id(&c.id), c.state)).collect();
    let names: Vec<&str> = left.iter().map(|c| c.name.as_str()).collect();
    Failure {
        message: format!("{}; containers of it from an earlier run on this node: {}", f.message, named.join(", ")),
        hint: Some(survivors_fix(
            "this node",
            &names,
            Some(&KitRef::new(args.kit.as_deref()).command("up", &["--replace"])),
        )),
        ..f
    }
}

/// [`with_survivors`] with no `--kit`: every kit's containers, each named with its kit. The
/// restart over them is named when they are all of one built-in kit (a kit file's path is not
/// on the container); removing them by hand always is.
fn with_survivors_of_every_kit(f: Failure) -> Failure {
    match crate::runtime::leftovers_of_every_kit() {
        Ok(left) => name_every_kit(f, left),
        Err(_) => f,
    }
}

fn name_every_kit(f: Failure, mut left: Vec<(String, Leftover)>) -> Failure {
    if left.is_empty() {
        return f;
    }
    left.sort_by(|a, b| (&a.0, &a.1.name).cmp(&(&b.0, &b.1.name)));
    let named: Vec<String> =
        left.iter().map(|(kit, c)| format!("{} (kit {kit}, {}, {})", c.name, short_id(&c.id), c.state)).collect();
    let names: Vec<&str> = left.iter().map(|(_, c)| c.name.as_str()).collect();
    let kit = &left[0].0;
    let one_builtin = left.iter().all(|(k, _)| k == kit) && crate::kit::builtin::find(kit).is_some();
    let replace = one_builtin.then(|| KitRef::new(Some(kit)).command("up", &["--replace"]));
    Failure {
        message: format!("{}; containers from an earlier run on this node: {}", f.message, named.join(", ")),
        hint: Some(survivors_fix("this node", &names, replace.as_deref())),
        ..f
    }
}

fn short_id(id: &str) -> &str {
    &id[..id.len().min(12)]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn left(kit: &str, name: &str) -> (String, Leftover) {
        (kit.into(), Leftover { name: name.into(), id: format!("{name:0<64}"), state: "running".into() })
    }

    #[test]
    fn every_kits_survivors_are_named_and_one_builtin_kit_gets_its_restart() {
        let f = || Failure::runtime("no spark-kit deployment is running here").with_hint("start it");
        assert_eq!(name_every_kit(f(), vec![]).hint.as_deref(), Some("start it"));
        let one = name_every_kit(f(), vec![left("tiny-cpu-docker", "b"), left("tiny-cpu-docker", "a")]);
        assert_eq!(
            one.message,
            "no spark-kit deployment is running here; containers from an earlier run on this node: \
             a (kit tiny-cpu-docker, a00000000000, running), b (kit tiny-cpu-docker, b00000000000, running)"
        );
        assert_eq!(
            one.hint.as_deref(),
            Some(
                "start over them with `spark-kit up --kit tiny-cpu-docker --replace` (it removes them first), \
                 or only remove them: `docker rm -f a b` on this node"
            )
        );
        // Two kits, or a kit file's: only the removal by hand.
        let two = name_every_kit(f(), vec![left("tiny-cpu-docker", "a"), left("mine", "c")]);
        assert_eq!(two.hint.as_deref(), Some("remove them: `docker rm -f c a` on this node"));
        let file = name_every_kit(f(), vec![left("mine", "c")]);
        assert_eq!(file.hint.as_deref(), Some("remove them: `docker rm -f c` on this node"));
    }
}
