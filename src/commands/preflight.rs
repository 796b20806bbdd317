//! `spark-kit preflight [--kit K] [--json]`: every check on every node the kit names. Nodes on
//! this machine (transport `local`) are probed here; the others through a node agent started on
//! them for the purpose. A node that cannot be reached is "not checked" — never a pass.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::preflight_input::input;
use super::{io_failure, load, Context};
use crate::cli::PreflightArgs;
use crate::cluster::client::{self, AgentProc};
use crate::cluster::protocol::{Command, Event};
use crate::cluster::push;
use crate::engine::argv::node_ranks;
use crate::error::Failure;
use crate::kit::schema::{Kit, Transport};
use crate::node::checks::Verdict;
use crate::node::facts::gather;
use crate::node::preflight::{request_for, Facts, FactsError, PreflightInput, Report};
use crate::node::probe::LocalProbe;
use crate::supervisor::bringup::{evaluate, FACTS_TIMEOUT_S};

pub fn run(args: &PreflightArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let settings = load::settings(&args.kit, &ctx.env)?;
    let kit = &settings.kit;
    let input = input(kit, &ctx.env, args.kit.kit.as_deref());
    let _ = writeln!(ctx.err, "preflight: {} node(s) of kit {}", kit.nodes.len(), kit.name);
    let facts = through_agents(kit, &input, &settings.logs);
    let report = evaluate(kit, &input, &facts);
    let text = if args.json {
        serde_json::to_string_pretty(&report).map_err(|e| Failure::runtime(e.to_string()))?
    } else {
        human(&report)
    };
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
        .with_hint(format!("see the node agents' logs in {}", settings.logs.display()))),
        _ => Ok(()),
    }
}

/// Gather every node's facts: nodes on this machine directly, the others through a node agent
/// started for the purpose (over the node's transport, the binary pushed when it differs).
fn through_agents(kit: &Kit, input: &PreflightInput, logs: &Path) -> Vec<Facts> {
    let local = |i: usize| kit.nodes[i].transport == Transport::Local;
    let mut facts: Vec<Facts> = (0..kit.nodes.len())
        .map(|i| {
            if local(i) {
                Ok(gather(&LocalProbe { timeout_s: 10 }, &request_for(kit, &kit.nodes[i], input)))
            } else {
                Err(FactsError::NotAsked { node: kit.nodes[i].name.clone() })
            }
        })
        .collect();
    if kit.nodes.iter().all(|n| n.transport == Transport::Local) {
        return facts;
    }
    let exe_sha = crate::dirs::self_exe()
        .map_err(|e| e.to_string())
        .and_then(|exe| push::sha256_file(&exe).map(|sha| (exe, sha)).map_err(|e| e.to_string()));
    let (tx, rx) = mpsc::channel();
    let ranks = node_ranks(kit);
    let mut agents: Vec<Option<AgentProc>> = (0..kit.nodes.len()).map(|_| None).collect();
    for i in (0..kit.nodes.len()).filter(|i| !local(*i)) {
        let node = &kit.nodes[i];
        let log = logs.join(format!("{}-{}-agent.log", kit.name, node.name));
        let started = exe_sha.clone().and_then(|(exe, sha)| {
            client::spawn(node, i, ranks[i], &exe, &sha, &log, tx.clone()).map_err(|e| e.to_string())
        });
        let mut held = Vec::new();
        let hello = started.and_then(|mut agent| {
            let said = client::wait_for(&rx, i, Duration::from_secs(60), &mut held, |ev| {
                matches!(ev, Event::Hello { .. }).then_some(())
            })
            .map_err(|e| e.to_string());
            let request = request_for(kit, node, input);
            let asked = said.and_then(|()| {
                if agent.send(&Command::Preflight { request }) {
                    Ok(())
                } else {
                    Err("the agent's stdin closed".to_string())
                }
            });
            agents[i] = Some(agent);
            asked
        });
        facts[i] = hello
            .and_then(|()| {
                client::wait_for(&rx, i, Duration::from_secs(FACTS_TIMEOUT_S), &mut held, |ev| match ev {
                    Event::Facts { facts } => Some(*facts),
                    _ => None,
                })
                .map_err(|e| e.to_string())
            })
            .map_err(|why| FactsError::Unreachable { node: node.name.clone(), why });
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    for a in agents.iter_mut().flatten() {
        a.hang_up();
    }
    for a in agents.iter_mut().flatten() {
        a.reap(deadline);
    }
    facts
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
