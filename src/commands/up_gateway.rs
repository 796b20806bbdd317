//! `up`'s gateway: its settings from the kit, `engine.api_keys` and the memory plan (the same
//! plan `spark-kit plan` prints), checked before anything starts.

use std::path::PathBuf;
use std::sync::Arc;

use super::checkpoint_source::{checkpoint_in, is_dsv41_flash_exl3};
use crate::checkpoint::budget::weight_budget;
use crate::checkpoint::exl3_audit::num_hidden_layers;
use crate::checkpoint::virtual_ckpt::DeepSeekV41Dims;
use crate::checkpoint::Origin;
use crate::engine::endpoint::api_keys;
use crate::engine::{model, overlay};
use crate::error::Failure;
use crate::gateway::count::{Counter, LoadError};
use crate::gateway::GatewayConfig;
use crate::kit::schema::Kit;
use crate::plan::{input_from_kit, kv, plan, Plan};
use crate::settings::Settings;

/// The band of a weight figure from modelled shapes, per mille (as `spark-kit plan`).
const MODELLED_BAND_PER_MILLE: u64 = 5;

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
    // KV bytes per token from the model's shapes where the kit leaves it 0 (as `spark-kit plan`).
    if input.kv_bytes_per_token == 0.0 && is_dsv41_flash_exl3(kit) {
        if let Some(d) = kv::derive(&DeepSeekV41Dims::default().kv_shape(kit.engine.block_size)) {
            input.kv_bytes_per_token = d.bytes_per_token;
        }
    }
    (plan(&input), note)
}

/// The gateway's settings for the kit of `s`, or the one-line reason it cannot run. Also returns
/// a note on limits the plan could not give.
pub(super) fn config(s: &Settings, env: &[(String, String)]) -> Result<(GatewayConfig, Option<String>), Failure> {
    if let Some(head) = s.remote_head() {
        return Err(Failure::usage(format!(
            "nodes: the head node `{head}` is not local: the gateway runs in `up`'s process and reaches the engine on \
             the head's loopback; set the head's transport to local and run `spark-kit up` on the head"
        )));
    }
    let kit = &s.kit;
    let keys = api_keys(kit, env, &s.dirs).map_err(|e| Failure::usage(e.to_string()))?;
    let port = s.ports.internal_tcp().map_err(|e| Failure::usage(e.to_string()))?;
    let (p, note) = plan_of(kit, env);
    let mut cfg = GatewayConfig::from_kit(kit, &p, keys, port).map_err(|e| Failure::usage(e.to_string()))?;
    // The served checkpoint's tokenizer, for counting completion prompts in process; a missing
    // file (a model made on the first start) is tried again once the engine is ready.
    cfg.tokenizer = model_dir(s, env).map(|d| Counter::file_in(&d));
    cfg.counter = cfg.tokenizer.as_deref().map(|t| Counter::load(t).map(Arc::new));
    Ok((cfg, note))
}

/// The checkpoint directory the engine will serve, by the rule `up` prepares it with.
fn model_dir(s: &Settings, env: &[(String, String)]) -> Option<PathBuf> {
    let kit = &s.kit;
    let configured = kit.paths.hf_cache.as_deref().map(|p| s.dirs.expand(p));
    let hf = model::hf_cache(configured.as_deref(), env, &s.dirs.home);
    model::served_dir(kit, &s.dirs.expand(&kit.paths.data_dir), &hf, &overlay::tag())
}

/// How admission counts prompt tokens, for the summary line.
fn counting(cfg: &GatewayConfig) -> String {
    match &cfg.counter {
        Some(Ok(c)) => format!("completion prompts counted in process with {}", c.path().display()),
        Some(Err(LoadError::Missing(t))) => {
            format!("completion prompts counted in process with {} once it exists", t.display())
        }
        Some(Err(e)) => format!("prompts counted by the engine's /tokenize: {e}"),
        None => "prompts counted by the engine's /tokenize (the checkpoint's directory is unknown)".into(),
    }
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
        "==> gateway on {} → engine on {} ({keyed}; {} slots, queue {}; admits {}; {})",
        cfg.bind,
        cfg.upstream,
        cfg.max_in_flight,
        cfg.queue_len,
        parts.join(", "),
        counting(cfg)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::schema::Transport;

    fn kit(name: &str) -> Kit {
        crate::kit::builtin_kit(name)
    }

    fn config(k: &Kit, env: &[(String, String)]) -> Result<(GatewayConfig, Option<String>), Failure> {
        super::config(&Settings::new(k.clone(), None, env), env)
    }

    #[test]
    fn the_reference_kit_gets_the_plans_limits() {
        let d = tempfile::tempdir().unwrap();
        let env = vec![("HOME".to_string(), d.path().display().to_string()), ("VLLM_API_KEY".into(), "k".into())];
        let k = kit("dgx-spark-2x-dsv41-exl3");
        let (cfg, note) = config(&k, &env).unwrap();
        assert_eq!(note, None);
        assert!(cfg.limits.kv_pool_tokens.is_some() && cfg.limits.safe_max_prompt.is_some(), "{:?}", cfg.limits);
        assert_eq!(cfg.upstream, format!("http://127.0.0.1:{}", k.engine.port + 10000));
        assert!(summary(&cfg, None).contains("prefill budget"), "{}", summary(&cfg, None));
    }

    #[test]
    fn tiny_cpu_has_no_prefill_budget_and_says_why() {
        let d = tempfile::tempdir().unwrap();
        let env = vec![("HOME".to_string(), d.path().display().to_string())];
        let (cfg, note) = config(&kit("tiny-cpu"), &env).unwrap();
        assert_eq!(cfg.limits.safe_max_prompt, None);
        assert_eq!(cfg.limits.max_model_len, 512);
        let line = summary(&cfg, note.as_deref());
        assert!(line.contains("no prefill budget (the weights are unknown"), "{line}");
        assert!(line.contains("KV pool 65536 tokens") && line.contains("no API keys"), "{line}");
    }

    #[test]
    fn a_remote_head_and_a_missing_key_file_are_refused_with_the_key() {
        let d = tempfile::tempdir().unwrap();
        let env = vec![("HOME".to_string(), d.path().display().to_string())];
        let mut k = kit("tiny-cpu");
        k.engine.api_keys.file = Some(d.path().join("nope").display().to_string());
        let e = config(&k, &env).unwrap_err();
        assert!(e.to_string().starts_with("engine.api_keys.file "), "{e}");
        k.nodes[0].transport = Transport::Ssh;
        let e = config(&k, &env).unwrap_err();
        assert!(e.to_string().contains("the head node `local` is not local"), "{e}");
    }
}
