//! Semantic checks of an effective kit. Pure: returns (key, what is wrong, fix) triples, each
//! tagged with the part of the kit it is about; the loader attaches the origin of each key. A
//! command validates only the parts it uses ([`Part::commands`] says which command needs what).

use std::collections::BTreeSet;

use super::bytes::MIB;
use super::schema::{Kit, ModelSource, Role, Runtime, SpecMethod, Transport, WeightSync};

/// A part of the kit, validated by the commands that use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `model`, `engram`: what to download and check.
    Model,
    /// `nodes`, `tensor_parallel_size`: where it runs.
    Nodes,
    /// `engine`: the vLLM engine and its venv or image.
    Engine,
    /// `memory`: the memory guard.
    Memory,
}

impl Part {
    pub const ALL: [Part; 4] = [Part::Model, Part::Nodes, Part::Engine, Part::Memory];

    /// The commands that need this part valid.
    #[must_use]
    pub const fn commands(self) -> &'static str {
        match self {
            Part::Model => "download, verify, plan, preflight, up, restart",
            Part::Nodes => "plan, preflight, up, restart, pack-engram",
            Part::Engine => "setup, plan, preflight, up, restart",
            Part::Memory => "guard, plan, preflight, up, restart",
        }
    }
}

/// What `download` and `verify` use.
pub const MODEL_ONLY: &[Part] = &[Part::Model];

/// One semantic problem before its origin is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub key: String,
    pub message: String,
    pub fix: String,
    pub part: Part,
}

fn finding(key: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Finding {
    // The part is set by `validate_parts` for the whole section.
    Finding { key: key.into(), message: message.into(), fix: fix.into(), part: Part::Model }
}

fn range(out: &mut Vec<Finding>, key: &str, v: u64, lo: u64, hi: u64) {
    if v < lo || v > hi {
        out.push(finding(
            key,
            format!("{v} is out of range {lo}..={hi}"),
            format!("use a value between {lo} and {hi}"),
        ));
    }
}

/// Every problem of the kit, in schema order.
#[must_use]
pub fn validate(kit: &Kit) -> Vec<Finding> {
    validate_parts(kit, &Part::ALL)
}

/// The checks of one part of the kit.
type Section = fn(&Kit, &mut Vec<Finding>);

/// The problems of the given parts of the kit, in schema order.
#[must_use]
pub fn validate_parts(kit: &Kit, parts: &[Part]) -> Vec<Finding> {
    let sections: [(Part, Section); 4] =
        [(Part::Model, model), (Part::Nodes, nodes), (Part::Engine, engine), (Part::Memory, memory)];
    let mut out = Vec::new();
    for (part, check) in sections {
        if !parts.contains(&part) {
            continue;
        }
        let mut found = Vec::new();
        check(kit, &mut found);
        out.extend(found.into_iter().map(|f| Finding { part, ..f }));
    }
    out
}

fn model(kit: &Kit, out: &mut Vec<Finding>) {
    let m = &kit.model;
    match m.source {
        ModelSource::Hub => {
            if !is_repo_id(&m.repo) {
                out.push(finding("model.repo", format!("`{}` is not a Hub repo id", m.repo), "write owner/name"));
            }
            if m.revision.is_empty() {
                out.push(finding("model.revision", "no revision", "pin a 40-hex commit (or at least a branch)"));
            }
        }
        ModelSource::Local => {
            if m.path.as_deref().unwrap_or_default().is_empty() {
                out.push(finding("model.path", "source is `local` but no path is given", "set model.path"));
            }
        }
        ModelSource::TinyDense | ModelSource::TinyExl3 => {}
    }
    for (i, f) in m.files.iter().enumerate() {
        if let Some(h) = &f.sha256 {
            if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                out.push(finding(
                    format!("model.files.{i}.sha256"),
                    "not 64 lower-case hex digits",
                    "copy the LFS sha256",
                ));
            }
        }
    }
    if let Some(e) = &kit.engram {
        if !is_repo_id(&e.repo) {
            out.push(finding("engram.repo", format!("`{}` is not a Hub repo id", e.repo), "write owner/name"));
        }
        if e.revision.is_empty() {
            out.push(finding("engram.revision", "no revision", "pin a 40-hex commit (or at least a branch)"));
        }
    }
}

fn is_repo_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

fn nodes(kit: &Kit, out: &mut Vec<Finding>) {
    if kit.nodes.is_empty() {
        out.push(finding("nodes", "no nodes", "list at least one node with role: head"));
        return;
    }
    let mut names = BTreeSet::new();
    let heads: Vec<usize> =
        kit.nodes.iter().enumerate().filter(|(_, n)| n.role == Role::Head).map(|(i, _)| i).collect();
    for (i, n) in kit.nodes.iter().enumerate() {
        let key = format!("nodes.{i}");
        if n.name.is_empty() {
            out.push(finding(format!("{key}.name"), "node has no name", "give every node a unique name"));
        } else if !names.insert(n.name.as_str()) {
            out.push(finding(
                format!("{key}.name"),
                format!("duplicate node name `{}`", n.name),
                "give every node a unique name",
            ));
        }
        match n.transport {
            Transport::Ssh if n.ssh_host.as_deref().unwrap_or_default().is_empty() => {
                out.push(finding(format!("{key}.ssh_host"), "transport is ssh but no ssh_host", "set ssh_host"));
            }
            Transport::Exec if n.exec_prefix.is_empty() => {
                out.push(finding(
                    format!("{key}.exec_prefix"),
                    "transport is exec but no exec_prefix",
                    "set exec_prefix, e.g. [ip, netns, exec, spark2]",
                ));
            }
            _ => {}
        }
        if kit.model.sync == WeightSync::Rsync && n.role != Role::Head && n.transport != Transport::Ssh {
            out.push(finding(
                format!("{key}.transport"),
                "model.sync is rsync, which copies over ssh, but this node is not reached over ssh",
                "use transport: ssh for this node, or model.sync: shared with the weights mounted on every node",
            ));
        }
        if let Some(ip) = &n.fabric.ipv4 {
            if ip.parse::<std::net::Ipv4Addr>().is_err() {
                out.push(finding(
                    format!("{key}.fabric.ipv4"),
                    format!("`{ip}` is not an IPv4 address"),
                    "write a dotted quad such as 10.0.0.1",
                ));
            }
        }
    }
    match heads.len() {
        0 => out.push(finding("nodes", "no node has role head", "set role: head on exactly one node")),
        1 => {}
        _ => {
            let names: Vec<String> = heads.iter().map(|i| format!("nodes.{i}")).collect();
            out.push(finding(
                format!("nodes.{}.role", heads[1]),
                format!("two heads ({})", names.join(", ")),
                "set role: head on exactly one node and role: worker on the others",
            ));
        }
    }
    let n = u32::try_from(kit.nodes.len()).unwrap_or(u32::MAX);
    let tp = kit.tensor_parallel_size;
    if tp == 0 || tp % n != 0 {
        out.push(finding(
            "tensor_parallel_size",
            format!("{tp} is not a positive multiple of the {n} node(s)"),
            format!("use {n} or another multiple of {n}"),
        ));
    }
    if n > 1 {
        for (i, node) in kit.nodes.iter().enumerate() {
            if node.fabric.ipv4.is_none() {
                out.push(finding(
                    format!("nodes.{i}.fabric.ipv4"),
                    "multi-node needs every node's fabric address",
                    "set fabric.ipv4 to the node's address on the inter-node link",
                ));
            }
        }
    }
}

/// Why an image reference names no fixed release (`None`: it names one): no tag (`latest`
/// implied), or a `latest…` / `nightly…` tag.
fn floating_tag(image: &str) -> Option<&'static str> {
    let name = image.split('@').next().unwrap_or_default();
    if image.contains('@') {
        return None;
    }
    let last = name.rsplit('/').next().unwrap_or_default();
    match last.split_once(':') {
        None => Some("has no tag (docker takes `latest`)"),
        Some((_, tag)) if tag.starts_with("latest") || tag.starts_with("nightly") => Some("has a floating tag"),
        Some(_) => None,
    }
}

fn engine(kit: &Kit, out: &mut Vec<Finding>) {
    let e = &kit.engine;
    if e.port == e.master_port {
        out.push(finding("engine.master_port", "same as engine.port", "use a different port for the rendezvous"));
    }
    let internal = e.effective_internal_port();
    for (other, name) in [(e.port, "engine.port"), (e.master_port, "engine.master_port")] {
        if internal == other {
            out.push(finding(
                "engine.internal_port",
                format!("{internal} is the same as {name} (the engine behind the gateway needs its own port)"),
                "set engine.internal_port to a free port different from engine.port and engine.master_port",
            ));
        }
    }
    range(out, "engine.drain_timeout_s", u64::from(e.drain_timeout_s), 0, 3600);
    range(out, "engine.header_timeout_s", u64::from(e.header_timeout_s), 1, 3600);
    range(out, "engine.queue_wait_s", u64::from(e.queue_wait_s), 1, 3600);
    if e.served_model_name.is_empty() {
        out.push(finding("engine.served_model_name", "empty", "name the model clients will ask for"));
    }
    if e.host.parse::<std::net::IpAddr>().is_err() {
        out.push(finding(
            "engine.host",
            format!("`{}` is not an IP address", e.host),
            "use 127.0.0.1 (local only) or 0.0.0.0 (all interfaces)",
        ));
    }
    if e.runtime == Runtime::Docker && e.docker_image.as_deref().unwrap_or_default().is_empty() {
        out.push(finding("engine.docker_image", "runtime is docker but no image", "set engine.docker_image"));
    }
    if let Some(image) = e.docker_image.as_deref().filter(|i| !i.is_empty() && e.runtime == Runtime::Docker) {
        if let Some(why) = floating_tag(image) {
            out.push(finding(
                "engine.docker_image",
                format!("`{image}` {why}: the image would change under the kit"),
                "name a release tag, e.g. vllm/vllm-openai:v0.34.0-aarch64 (spark-kit.lock then records its digest)",
            ));
        }
    }
    if !e.vllm_version.is_empty() && !crate::vllm_support::is_supported(&e.vllm_version) {
        out.push(finding(
            "engine.vllm_version",
            format!(
                "{} is not a vLLM release the overlay supports ({})",
                e.vllm_version,
                crate::vllm_support::supported_list()
            ),
            "pin one of those releases (and an engine that runs it), or leave engine.vllm_version empty",
        ));
    }
    if e.docker_mount_venv && e.runtime != Runtime::Docker {
        out.push(finding(
            "engine.docker_mount_venv",
            "set, but engine.runtime is not docker",
            "set engine.runtime=docker, or remove engine.docker_mount_venv",
        ));
    }
    if e.docker_mount_venv && e.requirements.is_empty() && e.venv.is_none() {
        out.push(finding(
            "engine.docker_mount_venv",
            "no venv to mount (no engine.requirements and no engine.venv)",
            "name a requirements set or an existing venv",
        ));
    }
    if e.runtime == Runtime::Venv && e.requirements.is_empty() && e.venv.is_none() {
        out.push(finding(
            "engine.requirements",
            "no requirements set and no venv path",
            "name a requirements set or an existing venv",
        ));
    }
    range(out, "engine.max_model_len", e.max_model_len, 1, 1_048_576);
    range(out, "engine.max_num_seqs", u64::from(e.max_num_seqs), 1, 4096);
    range(out, "engine.max_num_batched_tokens", u64::from(e.max_num_batched_tokens), 1, 8_388_608);
    if !e.block_size.is_power_of_two() || e.block_size > 256 {
        out.push(finding(
            "engine.block_size",
            format!("{} is not a power of two up to 256", e.block_size),
            "use 16, 32, 64 or 128",
        ));
    }
    if e.kv_cache_bytes.bytes() < MIB {
        out.push(finding(
            "engine.kv_cache_bytes",
            format!("{} is below 1MiB", e.kv_cache_bytes),
            "give the KV pool at least 1MiB, e.g. 64MiB",
        ));
    }
    let spec = match e.speculative.method {
        SpecMethod::None => 0,
        _ => e.speculative.tokens,
    };
    if e.speculative.method != SpecMethod::None && spec == 0 {
        out.push(finding(
            "engine.speculative.tokens",
            "speculation on with 0 tokens",
            "set tokens ≥ 1 or method: none",
        ));
    }
    let need = u64::from(e.max_num_seqs) * (u64::from(spec) + 1);
    if u64::from(e.max_num_batched_tokens) < need {
        out.push(finding(
            "engine.max_num_batched_tokens",
            format!("{} < max_num_seqs × (speculative tokens + 1) = {need}", e.max_num_batched_tokens),
            format!("raise it to at least {need}"),
        ));
    }
    if e.long_prefill_token_threshold > 0 && e.long_prefill_token_threshold + 256 > e.max_num_batched_tokens {
        out.push(finding(
            "engine.long_prefill_token_threshold",
            format!(
                "{} leaves less than 256 tokens of the {}-token step for decodes",
                e.long_prefill_token_threshold, e.max_num_batched_tokens
            ),
            format!("use at most {}", e.max_num_batched_tokens.saturating_sub(256)),
        ));
    }
    if e.cudagraph_capture_sizes.windows(2).any(|w| w[0] >= w[1]) || e.cudagraph_capture_sizes.contains(&0) {
        out.push(finding(
            "engine.cudagraph_capture_sizes",
            "sizes must be positive and strictly ascending",
            "sort them, e.g. [1, 2, 4, 8]",
        ));
    }
    if e.shutdown_timeout_s > 3600 {
        range(out, "engine.shutdown_timeout_s", u64::from(e.shutdown_timeout_s), 0, 3600);
    }
    if e.ready_timeout_s == 0 {
        out.push(finding("engine.ready_timeout_s", "0 seconds", "allow the engine time to start, e.g. 600"));
    }
    if e.hang_timeout_s < 30 {
        out.push(finding(
            "engine.hang_timeout_s",
            format!("{} s would flag normal pauses as hangs", e.hang_timeout_s),
            "use at least 30",
        ));
    }
    if e.stall_timeout_s != 0 && e.stall_timeout_s < 10 {
        out.push(finding(
            "engine.stall_timeout_s",
            format!("{} s is shorter than a few health probes", e.stall_timeout_s),
            "use at least 10 (or 0 for engine.hang_timeout_s)",
        ));
    }
}

fn memory(kit: &Kit, out: &mut Vec<Finding>) {
    let g = &kit.memory.guard;
    if g.hard_floor >= g.soft_floor {
        out.push(finding(
            "memory.guard.hard_floor",
            format!("{} is not below the soft floor {}", g.hard_floor, g.soft_floor),
            "set hard_floor below soft_floor",
        ));
    }
}
