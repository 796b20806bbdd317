//! `spark-kit preflight` on the head: every node's facts — nodes on this machine probed here,
//! the others through a node agent started on them for the purpose (the binary pushed when it
//! differs). A node that cannot be reached is "not checked" ([`FactsError::Unreachable`]).

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::bringup::FACTS_TIMEOUT_S;
use crate::cluster::client::{self, AgentProc};
use crate::cluster::protocol::{Command, Event};
use crate::cluster::push;
use crate::engine::argv::node_ranks;
use crate::kit::schema::{Kit, Transport};
use crate::node::facts::gather;
use crate::node::preflight::{request_for, Facts, FactsError, PreflightInput};
use crate::node::probe::LocalProbe;

/// Gather every node's facts: nodes on this machine directly, the others through a node agent
/// started for the purpose (over the node's transport, the binary pushed when it differs).
pub fn gather_facts(kit: &Kit, input: &PreflightInput, logs: &Path) -> Vec<Facts> {
    let local = |i: usize| kit.nodes[i].transport == Transport::Local;
    // Local nodes are probed on a thread of their own while the agents answer: the fabric
    // all-reduce needs every node's rank running at once.
    std::thread::scope(|scope| {
        let here = scope.spawn(|| {
            (0..kit.nodes.len())
                .filter(|i| local(*i))
                .map(|i| (i, gather(&LocalProbe { timeout_s: 10 }, &request_for(kit, &kit.nodes[i], input))))
                .collect::<Vec<_>>()
        });
        let mut facts = remote_facts(kit, input, logs);
        match here.join() {
            Ok(done) => {
                for (i, f) in done {
                    facts[i] = Ok(f);
                }
            }
            Err(_) => {
                for i in (0..kit.nodes.len()).filter(|i| local(*i)) {
                    facts[i] = Err(FactsError::Unreachable {
                        node: kit.nodes[i].name.clone(),
                        why: "probing this machine panicked".into(),
                    });
                }
            }
        }
        facts
    })
}

/// The facts of the nodes not on this machine, through node agents: every agent is asked before
/// any answer is awaited. Local nodes are left [`FactsError::NotAsked`].
fn remote_facts(kit: &Kit, input: &PreflightInput, logs: &Path) -> Vec<Facts> {
    let local = |i: usize| kit.nodes[i].transport == Transport::Local;
    let mut facts: Vec<Facts> = kit.nodes.iter().map(|n| Err(FactsError::NotAsked { node: n.name.clone() })).collect();
    if kit.nodes.iter().all(|n| n.transport == Transport::Local) {
        return facts;
    }
    let exe_sha = crate::dirs::self_exe()
        .map_err(|e| e.to_string())
        .and_then(|exe| push::sha256_file(&exe).map(|sha| (exe, sha)).map_err(|e| e.to_string()));
    let (tx, rx) = mpsc::channel();
    let ranks = node_ranks(kit);
    let mut agents: Vec<Option<AgentProc>> = (0..kit.nodes.len()).map(|_| None).collect();
    let mut asked: Vec<(usize, Result<(), String>)> = Vec::new();
    let mut held = Vec::new();
    for i in (0..kit.nodes.len()).filter(|i| !local(*i)) {
        let node = &kit.nodes[i];
        let log = logs.join(format!("{}-{}-agent.log", kit.name, node.name));
        let started = exe_sha.clone().and_then(|(exe, sha)| {
            client::spawn(node, i, ranks[i], &exe, &sha, &log, tx.clone()).map_err(|e| e.to_string())
        });
        let sent = started.and_then(|mut agent| {
            let said = client::wait_for(&rx, i, Duration::from_secs(60), &mut held, |ev| {
                matches!(ev, Event::Hello { .. }).then_some(())
            })
            .map_err(|e| e.to_string());
            let request = request_for(kit, node, input);
            let sent = said.and_then(|()| {
                if agent.send(&Command::Preflight { request }) {
                    Ok(())
                } else {
                    Err("the agent's stdin closed".to_string())
                }
            });
            agents[i] = Some(agent);
            sent
        });
        asked.push((i, sent));
    }
    for (i, sent) in asked {
        // Answers that came while another agent was awaited wait in `held`.
        let early = held.iter().position(|m| matches!(m, client::Msg::Event(j, Event::Facts { .. }) if *j == i));
        let node = &kit.nodes[i];
        facts[i] = sent
            .and_then(|()| match early.map(|k| held.remove(k)) {
                Some(client::Msg::Event(_, Event::Facts { facts })) => Ok(*facts),
                _ => client::wait_for(&rx, i, Duration::from_secs(FACTS_TIMEOUT_S), &mut held, |ev| match ev {
                    Event::Facts { facts } => Some(*facts),
                    _ => None,
                })
                .map_err(|e| e.to_string()),
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
