//! `spark-kit preflight` on the head: every node's facts — nodes on this machine probed here,
//! the others through a node agent started on them for the purpose, by the supervisor's one
//! spawn path ([`Agents`]) and heard through its one receiver. A node that cannot be reached
//! is "not checked" ([`FactsError::Unreachable`]).

use std::path::Path;
use std::time::{Duration, Instant};

use super::agents::{Agents, Note};
use super::bringup::FACTS_TIMEOUT_S;
use crate::cluster::client::Msg;
use crate::cluster::protocol::{Command, Event};
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

/// The facts of the nodes not on this machine, through node agents: every agent is asked as
/// soon as it has said hello, all of them at once. Local nodes are left [`FactsError::NotAsked`].
fn remote_facts(kit: &Kit, input: &PreflightInput, logs: &Path) -> Vec<Facts> {
    let mut facts: Vec<Option<Facts>> = kit
        .nodes
        .iter()
        .map(|n| (n.transport == Transport::Local).then(|| Err(FactsError::NotAsked { node: n.name.clone() })))
        .collect();
    let remote: Vec<usize> = (0..kit.nodes.len()).filter(|i| facts[*i].is_none()).collect();
    if remote.is_empty() {
        return facts.into_iter().flatten().collect();
    }
    let unreachable =
        |i: usize, why: String| Some(Err(FactsError::Unreachable { node: kit.nodes[i].name.clone(), why }));
    let mut agents = match crate::dirs::self_exe()
        .map_err(|e| e.to_string())
        .and_then(|exe| Agents::new(kit, &exe, logs).map_err(|e| e.to_string()))
    {
        Ok(a) => a,
        Err(why) => {
            for &i in &remote {
                facts[i] = unreachable(i, why.clone());
            }
            return facts.into_iter().flatten().collect();
        }
    };
    for &i in &remote {
        if let Err(e) = agents.spawn(kit, i) {
            facts[i] = unreachable(i, e.to_string());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60 + FACTS_TIMEOUT_S);
    while facts.iter().any(Option::is_none) && Instant::now() < deadline {
        let Some(Note::Agent(msg)) = agents.hear(Duration::from_millis(200)) else { continue };
        match msg {
            Msg::Event(i, Event::Hello { .. }) if facts[i].is_none() => {
                let request = request_for(kit, &kit.nodes[i], input);
                if !agents.send(i, &Command::Preflight { request }) {
                    facts[i] = unreachable(i, "the agent's stdin closed".into());
                }
            }
            Msg::Event(i, Event::Facts { facts: f }) if facts[i].is_none() => facts[i] = Some(Ok(*f)),
            Msg::Event(i, Event::Error { message, .. }) if facts[i].is_none() => facts[i] = unreachable(i, message),
            Msg::Lost(i) if facts[i].is_none() => facts[i] = unreachable(i, "the agent's connection closed".into()),
            _ => {}
        }
    }
    agents.close(Duration::from_secs(15));
    let secs = 60 + FACTS_TIMEOUT_S;
    facts
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            f.unwrap_or_else(|| {
                Err(FactsError::Unreachable {
                    node: kit.nodes[i].name.clone(),
                    why: format!("no answer within {secs} s"),
                })
            })
        })
        .collect()
}
