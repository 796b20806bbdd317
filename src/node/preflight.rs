//! The preflight runner: for each node of the kit, gather facts on that node (here, or through
//! its node agent) and run the checks; then compare nodes. A node that cannot be reached gets a
//! "not checked" verdict, never a pass.

use std::net::Ipv4Addr;

use serde::Serialize;

use super::checks::{node_checks, Check, NodeSpec, Verdict, VllmSource};
use super::docker_checks;
use super::facts::{FactRequest, NodeFacts};
use super::parity::cross_checks;
use crate::kit::schema::{Kit, ModelSource, Node, Role, Transport};

/// What preflight knows besides the kit.
#[derive(Debug, Clone, Default)]
pub struct PreflightInput {
    /// Weights per rank (weight budget), when known.
    pub weights_per_rank: Option<u64>,
    /// Checkpoint bytes on disk, when known.
    pub weights_on_disk: Option<u64>,
    /// Where the weights live on every node.
    pub disk_path: String,
    /// The engine venv's python (venv runtime), to read vLLM's version.
    pub vllm_python: Option<String>,
    /// The command that makes the kit's image here, as the user can run it (`spark-kit image
    /// build --kit K`), for kits with `engine.docker_mount_venv`: a missing image's fix.
    pub image_build: Option<String>,
    /// The command that copies the head's image to the workers, as the user can run it
    /// (`spark-kit image sync --kit K`), for docker kits: a worker's missing or differing image.
    pub image_sync: Option<String>,
    /// The command that starts the deployment over what an earlier run left (`spark-kit up --kit K
    /// --replace`, it removes them on every node first), as the user can run it: a survivor's fix.
    pub replace: Option<String>,
    /// `up`'s gateway already listens on `engine.port` (the API port is then not checked free).
    pub gateway_holds_api_port: bool,
    /// The command that builds the engine venv, as the user can run it (`spark-kit setup --kit
    /// K`): a venv's wrong or missing vLLM's fix.
    pub setup: Option<String>,
    /// Directory caching the vLLM version of each image id (docker kits that run the image's vLLM).
    pub image_vllm_cache: Option<String>,
    /// The image id `spark-kit.lock` recorded for `engine.docker_image`, and the lock's path.
    pub recorded_image: Option<(String, String)>,
    /// The kit's own deployment runs (what its supervisor answered, e.g. `kit tiny-cpu is running
    /// here (supervisor pid 42, ready)`): its ports, engine processes and loaded weights are its
    /// own, so they are reported as such rather than checked free.
    pub running: Option<String>,
    /// Run the cross-node all-reduce (src/fabric): `spark-kit preflight` only, not `up`'s gate.
    pub all_reduce: bool,
}

/// The preflight report (`spark-kit preflight --json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kit: String,
    /// `pass` (warnings allowed), `fail`, or `not-checked` when a node could not be checked.
    pub status: Verdict,
    pub checks: Vec<Check>,
}

impl Report {
    /// The human table: one line per check, the fix under each warning, failure or unchecked
    /// one, then the counts.
    #[must_use]
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let r = self;
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

    /// Counts of (pass, warn, fail, not checked).
    #[must_use]
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let n = |v: Verdict| self.checks.iter().filter(|c| c.verdict == v).count();
        (n(Verdict::Pass), n(Verdict::Warn), n(Verdict::Fail), n(Verdict::NotChecked))
    }
}

fn env_of<'a>(kit: &'a Kit, node: &'a Node, key: &str) -> Option<&'a String> {
    node.env.get(key).or_else(|| kit.engine.extra_env.get(key))
}

/// The expectations of one node.
#[must_use]
pub fn spec_for(kit: &Kit, node: &Node, input: &PreflightInput) -> NodeSpec {
    let nodes = u32::try_from(kit.nodes.len().max(1)).unwrap_or(1);
    NodeSpec {
        name: node.name.clone(),
        head: node.role == Role::Head,
        gpu: kit.needs_gpu(),
        ranks: (kit.tensor_parallel_size / nodes).max(1),
        weights_per_rank: input.weights_per_rank,
        weights_on_disk: input.weights_on_disk,
        boot_margin: kit.memory.boot_margin.bytes(),
        ipv4: node.fabric.ipv4.as_deref().and_then(|s| s.parse::<Ipv4Addr>().ok()),
        nccl_gid_index: env_of(kit, node, "NCCL_IB_GID_INDEX").cloned(),
        vllm_version: kit.engine.vllm_version.clone(),
        vllm_source: vllm_source(kit),
        vllm_fix: vllm_fix(kit, input),
        running: input.running.clone(),
        made_locally: matches!(kit.model.source, ModelSource::TinyDense | ModelSource::TinyExl3),
        single_node: kit.nodes.len() == 1,
    }
}

/// Where the kit's engine gets its vLLM, as its runtime says: the engine venv, or the image itself.
fn vllm_source(kit: &Kit) -> VllmSource {
    if crate::runtime::of(kit).vllm_in_venv(kit) {
        VllmSource::Venv
    } else {
        VllmSource::Image
    }
}

/// The fix for a wrong or missing vLLM, in the terms of the kit's runtime.
fn vllm_fix(kit: &Kit, input: &PreflightInput) -> String {
    let newest = crate::vllm_support::supported().last().copied().unwrap_or_default();
    let want = if kit.engine.vllm_version.is_empty() { newest } else { kit.engine.vllm_version.as_str() };
    match vllm_source(kit) {
        VllmSource::Image => format!(
            "set engine.docker_image to an image of vLLM {want} (the official one: vllm/vllm-openai:v{}-aarch64) \
             and `docker pull` it on every node",
            crate::vllm_support::release_of(want)
        ),
        VllmSource::Venv => format!(
            "run `{}` on this node: it builds the venv of engine.requirements ({}) with its locked vLLM",
            input.setup.as_deref().unwrap_or("spark-kit setup"),
            kit.engine.requirements
        ),
    }
}

/// What to gather on `node`.
#[must_use]
pub fn request_for(kit: &Kit, node: &Node, input: &PreflightInput) -> FactRequest {
    let mut ports = Vec::new();
    // A running deployment holds its own ports: nothing to check free.
    if node.role == Role::Head && input.running.is_none() {
        // The public engine.port is the gateway's (bound by `up` before preflight runs); the
        // engine's own API listens on loopback behind it.
        if !input.gateway_holds_api_port {
            ports.push((kit.engine.host.clone(), kit.engine.port, "API".into()));
        }
        let (host, port) = crate::deploy::ports::Ports::of(kit).internal_addr();
        ports.push((host.to_string(), port, "engine API (internal)".into()));
        if kit.nodes.len() > 1 {
            let host = node.fabric.ipv4.clone().unwrap_or_else(|| "0.0.0.0".into());
            ports.push((host, kit.engine.master_port, "master (torch.distributed)".into()));
        }
    }
    // ssh both ways: the head reaches every ssh worker, and every ssh worker reaches the head
    // (each node's `ssh_*` fields say how to reach *that* node).
    let ssh = if node.role == Role::Head {
        kit.nodes.iter().filter(|n| n.transport == Transport::Ssh).map(ssh_probe).collect()
    } else if node.transport == Transport::Ssh {
        kit.nodes.iter().filter(|n| n.role == Role::Head).map(ssh_probe).collect()
    } else {
        Vec::new()
    };
    FactRequest {
        interface: node.fabric.interface.clone(),
        hca: node.fabric.hca.clone(),
        vllm_python: input.vllm_python.clone(),
        disk_path: input.disk_path.clone(),
        ports,
        ssh,
        all_reduce: all_reduce_for(kit, node, input),
        docker: crate::runtime::of(kit).preflight_request(kit, input.image_vllm_cache.as_deref()),
    }
}

/// This node's all-reduce rank, when preflight runs one (not while the kit's deployment runs).
fn all_reduce_for(kit: &Kit, node: &Node, input: &PreflightInput) -> Option<Box<crate::fabric::AllReduceRequest>> {
    if !input.all_reduce || input.running.is_some() {
        return None;
    }
    let index = kit.nodes.iter().position(|n| n.name == node.name)?;
    let env = crate::engine::argv::build(kit, index, "", "").env;
    let rank = crate::engine::argv::node_ranks(kit)[index];
    crate::fabric::request_for(kit, index, rank, input.vllm_python.as_deref(), &env).map(Box::new)
}

/// The all-reduce line of a node: its rank's verdict, or why it did not run.
fn all_reduce_check(kit: &Kit, node: &Node, input: &PreflightInput, f: &NodeFacts) -> Option<Check> {
    use crate::fabric::verdict::{judge, parse, Level, Link};
    if !input.all_reduce {
        return None;
    }
    let check = |verdict, message: String, fix: Option<String>| Check {
        node: node.name.clone(),
        id: "all-reduce",
        verdict,
        message,
        fix,
    };
    if let Some(why) = crate::fabric::skip_reason(kit, input.vllm_python.as_deref()) {
        return (kit.nodes.len() > 1).then(|| check(Verdict::Skip, format!("fabric all-reduce: not run: {why}"), None));
    }
    let Some(out) = &f.fabric.all_reduce else {
        let why = input.running.as_deref().unwrap_or("not requested");
        return Some(check(Verdict::Skip, format!("fabric all-reduce: not run: {why}"), None));
    };
    let link = Link {
        interface: node.fabric.interface.clone(),
        mtu: f.fabric.mtu.as_ref().and_then(|m| m.as_ref().ok()).and_then(|m| m.trim().parse().ok()),
        hca: env_of(kit, node, "NCCL_IB_HCA").cloned().or_else(|| node.fabric.hca.clone()),
    };
    let j = match out.as_ref().map_err(ToString::to_string).and_then(|o| parse(o)) {
        Ok(r) => judge(&r, &link),
        Err(e) => judge(
            &crate::fabric::verdict::RankResult {
                rank: 0,
                world: kit.nodes.len(),
                backend: if kit.needs_gpu() { "nccl" } else { "gloo" }.into(),
                torch: None,
                latency_us: std::collections::BTreeMap::new(),
                busbw_gbps: None,
                correct: None,
                error: Some(e),
            },
            &link,
        ),
    };
    let verdict = match j.level {
        Level::Pass => Verdict::Pass,
        Level::Warn => Verdict::Warn,
        Level::Fail => Verdict::Fail,
    };
    Some(check(verdict, j.message, j.fix))
}

/// `(node name, argv of a batch-mode ssh call into `n` that runs `true`)`. A node without
/// `ssh_host` is reached at its fabric address, else by its name.
fn ssh_probe(n: &Node) -> (String, Vec<String>) {
    let host = n.ssh_host.clone().or_else(|| n.fabric.ipv4.clone()).unwrap_or_else(|| n.name.clone());
    let target = n.ssh_user.as_ref().map_or(host.clone(), |u| format!("{u}@{host}"));
    let mut argv: Vec<String> =
        ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-p"].map(String::from).to_vec();
    argv.push(n.ssh_port.to_string());
    argv.extend(n.ssh_options.iter().cloned());
    argv.push(target);
    argv.push("true".into());
    (n.name.clone(), argv)
}

/// Why a node's facts are missing: the node's `not checked:` reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FactsError {
    #[error("{node} has no agent connection")]
    NoConnection { node: String },
    #[error("the agent of {node} went away")]
    AgentGone { node: String },
    #[error("{node} did not report its facts within {secs} s")]
    Timeout { node: String, secs: u64 },
    #[error("{node} is not in the kit")]
    NotInKit { node: String },
    #[error("{node}: not asked yet")]
    NotAsked { node: String },
    /// The node's agent said why (its `Error` event).
    #[error("{0}")]
    Agent(String),
    /// The node's agent could not be started, reached or heard from.
    #[error("{node}'s node agent: {why}")]
    Unreachable { node: String, why: String },
}

/// A node's facts, or why they are missing.
pub type Facts = Result<NodeFacts, FactsError>;

/// Run preflight. `facts` gathers a node's facts for a request (here, or on the node through its
/// agent), or says why it could not.
pub fn run(kit: &Kit, input: &PreflightInput, facts_of: &dyn Fn(&Node, &FactRequest) -> Facts) -> Report {
    let mut checks = Vec::new();
    let mut facts: Vec<(String, NodeFacts)> = Vec::new();
    let mut unreachable = false;
    for node in &kit.nodes {
        match facts_of(node, &request_for(kit, node, input)) {
            Ok(f) => {
                checks.extend(node_checks(&spec_for(kit, node, input), &f));
                checks.extend(all_reduce_check(kit, node, input, &f));
                if let Some(d) = &f.docker {
                    // Images are made on the head; a worker gets the head's (`image sync`).
                    let fix = if node.role == Role::Head {
                        input.image_build.as_deref().map(docker_checks::ImageFix::Build)
                    } else {
                        input.image_sync.as_deref().map(docker_checks::ImageFix::Sync)
                    };
                    let recorded = input
                        .recorded_image
                        .as_ref()
                        .map(|(id, lock)| docker_checks::Recorded { id: id.as_str(), lock: lock.as_str() });
                    checks.extend(docker_checks::node_checks(&node.name, d, fix, recorded, input.replace.as_deref()));
                }
                facts.push((node.name.clone(), f));
            }
            Err(why) => {
                unreachable = true;
                checks.push(Check {
                    node: node.name.clone(),
                    id: "node",
                    verdict: Verdict::NotChecked,
                    message: format!("not checked: {why}"),
                    fix: Some(format!(
                        "make {} reachable over {} (see `spark-kit logs --node {}`), then run preflight again",
                        node.name,
                        transport_name(node.transport),
                        node.name
                    )),
                });
            }
        }
    }
    if facts.len() == kit.nodes.len() {
        let refs: Vec<(&str, &NodeFacts)> = facts.iter().map(|(n, f)| (n.as_str(), f)).collect();
        checks.extend(cross_checks(&refs));
        let docker: Vec<(&str, &_)> =
            facts.iter().filter_map(|(n, f)| f.docker.as_ref().map(|d| (n.as_str(), d))).collect();
        checks.extend(docker_checks::cross_checks(&docker, input.image_sync.as_deref()));
    } else if kit.nodes.len() > 1 {
        checks.push(Check {
            node: "all".into(),
            id: "parity",
            verdict: Verdict::NotChecked,
            message: "driver/kernel/spark-kit/vLLM parity and MTU on both ends: not checked, not every node answered"
                .into(),
            fix: Some("every node must answer; see the not-checked lines above".into()),
        });
    }
    let status = if checks.iter().any(|c| c.verdict == Verdict::Fail) {
        Verdict::Fail
    } else if unreachable || checks.iter().any(|c| c.verdict == Verdict::NotChecked) {
        Verdict::NotChecked
    } else {
        Verdict::Pass
    };
    Report { kit: kit.name.clone(), status, checks }
}

const fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Local => "local",
        Transport::Ssh => "ssh",
        Transport::Exec => "an exec prefix",
    }
}

#[cfg(test)]
mod text_tests {
    use super::*;

    #[test]
    fn the_table_shows_fixes_of_failures_only_then_counts() {
        let check = |id, verdict, fix: &str| Check {
            node: "a".into(),
            id,
            verdict,
            message: "m".into(),
            fix: Some(fix.into()),
        };
        let r = Report {
            kit: "k".into(),
            status: Verdict::Fail,
            checks: vec![check("one", Verdict::Pass, "never shown"), check("two", Verdict::Fail, "do this")],
        };
        let t = r.text();
        assert!(t.starts_with("NODE         CHECK            VERDICT      MESSAGE\n"), "{t}");
        assert!(t.contains("fix: do this") && !t.contains("never shown"), "{t}");
        assert!(t.ends_with("\n1 pass, 0 warn, 1 fail, 0 not checked\n"), "{t}");
    }
}
