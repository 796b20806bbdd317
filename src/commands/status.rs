//! `spark-kit status [--json]` and `spark-kit down`.

use std::time::Duration;

use super::{io_failure, Context};
use crate::cli::{ControlArgs, StatusArgs};
use crate::error::Failure;
use crate::supervisor::control::request;
use crate::supervisor::Snapshot;

fn gib(b: Option<u64>) -> String {
    #[allow(clippy::cast_precision_loss)] // display only
    b.map_or_else(|| "-".into(), |b| format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)))
}

/// Human table of a snapshot.
#[must_use]
pub fn render(s: &Snapshot) -> String {
    let mut out = format!(
        "kit {}  state {:?}  restarts {}  up {:.0} s  supervisor pid {}\nendpoint {}  model {}\n",
        s.kit, s.state, s.restarts, s.uptime_s, s.supervisor_pid, s.endpoint, s.model
    );
    if let Some(r) = &s.reason {
        out.push_str(&format!("last event: {r}\n"));
    }
    if let Some(g) = &s.gateway {
        out.push_str(&format!("gateway {}  {}  in flight {}  queued {}\n", g.listen, g.state, g.in_flight, g.queued));
    }
    out.push_str("NODE        RANK  AGENT   ENGINE PGID  ALIVE  HEALTH  MEMAVAILABLE  TOK/S   UPTIME  NOTE\n");
    for n in &s.nodes {
        out.push_str(&format!(
            "{:<11} {:>4}  {:<7} {:>11}  {:<5}  {:<6}  {:>12}  {:>6}  {:>6}  {}\n",
            n.name,
            n.rank,
            if n.agent_connected { "ok" } else { "lost" },
            n.engine_pgid.map_or_else(|| "-".into(), |p| p.to_string()),
            if n.engine_alive { "yes" } else { "no" },
            n.healthy.map_or("-", |h| if h { "ok" } else { "fail" }),
            gib(n.mem_available),
            n.tokens_per_s.map_or_else(|| "-".into(), |t| format!("{t:.1}")),
            n.uptime_s.map_or_else(|| "-".into(), |u| format!("{u:.0}s")),
            n.last_error.as_deref().or(n.phase.as_deref()).unwrap_or(""),
        ));
    }
    out
}

/// With no deployment running, a docker kit's containers left on this node by an earlier run
/// (found by label) are named in the error, with how to remove them.
fn with_survivors(f: Failure, args: &crate::cli::KitArgs, env: &[(String, String)]) -> Failure {
    let Ok(Some(kit)) = super::target::given_kit(args, env) else { return f };
    if kit.engine.runtime != crate::kit::schema::Runtime::Docker {
        return f;
    }
    let Ok(left) = crate::engine::dockerctl::containers_labelled(crate::engine::dockerctl::LABEL_KIT, &kit.name) else {
        return f;
    };
    if left.is_empty() {
        return f;
    }
    let named: Vec<String> =
        left.iter().map(|c| format!("{} ({}, {})", c.name, &c.id[..c.id.len().min(12)], c.state)).collect();
    let names: Vec<&str> = left.iter().map(|c| c.name.as_str()).collect();
    Failure {
        message: format!("{}; containers of it from an earlier run on this node: {}", f.message, named.join(", ")),
        hint: Some(format!(
            "remove them (`docker rm -f {}`), or start over them with {}",
            names.join(" "),
            crate::hints::KitRef::new(args.kit.as_deref()).quoted("up", &["--replace"])
        )),
        ..f
    }
}

pub fn run(args: &StatusArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let snap = super::target::find(&args.kit, &ctx.env, "status")
        .map_err(|f| with_survivors(f, &args.kit, &ctx.env))?
        .snapshot;
    let text = if args.json {
        serde_json::to_string_pretty(&snap).map_err(|e| Failure::runtime(e.to_string()))?
    } else {
        render(&snap)
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))
}

pub fn down(args: &ControlArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    // Found (and so checked running) first: nothing is "stopping" when nothing runs.
    let target = super::target::find(&args.kit, &ctx.env, "down")?;
    let (sock, name) = (&target.socket, &target.kit.name);
    let _ = writeln!(ctx.err, "==> stopping {name}: draining, then killing the engines on every node");
    let snap = request(sock, name, "down", None).map_err(|e| Failure::runtime(e.to_string()))?;
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
