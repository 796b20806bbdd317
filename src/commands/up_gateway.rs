//! `up`'s gateway: its settings from the kit, `engine.api_keys` and the memory plan (the same
//! plan `spark-kit plan` prints), checked before anything starts.

use super::plan::{derive_kv, MODELLED_BAND_PER_MILLE};
use super::verify::checkpoint_in;
use crate::checkpoint::budget::weight_budget;
use crate::checkpoint::exl3_audit::num_hidden_layers;
use crate::checkpoint::Origin;
use crate::dirs::Dirs;
use crate::engine::endpoint::{api_keys, internal_port};
use crate::error::Failure;
use crate::gateway::GatewayConfig;
use crate::kit::schema::{Kit, Role, Transport};
use crate::plan::{input_from_kit, plan, Plan};

/// The kit's plan as `spark-kit plan` computes it (kit memory, the checkpoint's weight budget).
/// Without a checkpoint to read yet (a model the engine side makes on first start), the weights
/// are unknown: the plan then has no prefill budget and the returned note says so.
fn plan_of(kit: &Kit, env: &[(String, String)]) -> (Plan, Option<String>) {
    let budget = checkpoint_in(kit, env, None, false, true).map_err(|f| f.to_string()).and_then(|(c, label)| {
        let b = weight_budget(&c, kit.tensor_parallel_size, num_hidden_layers(&kit.model.k_map))
            .map_err(|e| e.to_string())?;
        Ok((b.per_rank_bytes, label, matches!(c.origin, Origin::Virtual { .. })))
    });
    let (mut input, note) = match budget {
        Ok((per_rank, label, modelled)) => {
            let source = format!("weight budget at TP {} over {label}", kit.tensor_parallel_size);
            let mut input = input_from_kit(kit, per_rank, source, &[]);
            if modelled {
                input.weights_band = per_rank / 1000 * MODELLED_BAND_PER_MILLE;
            }
            (input, None)
        }
        Err(why) => {
            let mut input = input_from_kit(kit, 0, "unknown", &[]);
            // No weights, no headroom: no prefill budget rather than a made-up one.
            input.nodes.iter_mut().for_each(|n| n.memory_total = None);
            (input, Some(format!("no prefill budget (the weights are unknown: {why})")))
        }
    };
    let _ = derive_kv(kit, &mut input);
    (plan(&input), note)
}

/// The gateway's settings for `kit`, or the one-line reason it cannot run. Also returns a note
/// on limits the plan could not give.
pub(super) fn config(
    kit: &Kit,
    env: &[(String, String)],
    dirs: &Dirs,
) -> Result<(GatewayConfig, Option<String>), Failure> {
    if let Some(head) = kit.nodes.iter().find(|n| n.role == Role::Head && n.transport != Transport::Local) {
        return Err(Failure::usage(format!(
            "nodes: the head node `{}` is not local: the gateway runs in `up`'s process and reaches the engine on \
             the head's loopback; set the head's transport to local and run `spark-kit up` on the head",
            head.name
        )));
    }
    let keys = api_keys(kit, env, dirs).map_err(Failure::usage)?;
    let port = internal_port(kit);
    let port = u16::try_from(port).map_err(|_| {
        Failure::usage(format!("engine.internal_port {port} is not a TCP port: set engine.internal_port to 1-65535"))
    })?;
    let (p, note) = plan_of(kit, env);
    let cfg = GatewayConfig::from_kit(kit, &p, keys, port).map_err(|e| Failure::usage(e.to_string()))?;
    Ok((cfg, note))
}

/// One line on what the gateway admits, for `up`'s output.
pub(super) fn summary(cfg: &GatewayConfig, note: Option<&str>) -> String {
    let l = &cfg.limits;
    let mut parts = vec![format!("max_model_len {}", l.max_model_len)];
    if let Some(t) = l.kv_pool_tokens {
        parts.push(format!("KV pool {t} tokens"));
    }
    match (l.safe_max_prompt, note) {
        (Some(b), _) => parts.push(format!("prefill budget {b} tokens")),
        (None, Some(n)) => parts.push(n.to_string()),
        (None, None) => parts.push("no prefill budget (node memory unknown)".into()),
    }
    let keyed = if cfg.keys.is_empty() { "no API keys" } else { "API keys required" };
    format!(
        "==> gateway on {} → engine on {} ({keyed}; {} slots, queue {}; admits {})",
        cfg.bind,
        cfg.upstream,
        cfg.max_in_flight,
        cfg.queue_len,
        parts.join(", ")
    )
}
