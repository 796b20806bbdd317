//! `up`'s gateway: its settings from the kit, `engine.api_keys` and the memory plan (the same
//! plan `spark-kit plan` prints), checked before anything starts.

use std::sync::Arc;

use super::checkpoint_source::checkpoint_in;
use crate::checkpoint::kit_plan::{kit_plan, plan_without_weights};
use crate::error::Failure;
use crate::gateway::count::{Counter, LoadError};
use crate::gateway::GatewayConfig;
use crate::plan::Plan;
use crate::settings::Settings;

/// The kit's plan as `spark-kit plan` computes it (`checkpoint::kit_plan` over the checkpoint
/// the engine serves). Without a checkpoint to read yet (a model the engine side makes on first
/// start), the weights are unknown: the plan then has no prefill budget and the note says so.
fn plan_of(s: &Settings) -> (Plan, Option<String>) {
    let planned = checkpoint_in(s, None, false, true)
        .and_then(|(c, label)| kit_plan(&s.kit, &c, &label, &[]).map_err(Failure::from));
    match planned {
        Ok(p) => (p, None),
        Err(why) => (
            plan_without_weights(&s.kit),
            Some(format!("no prefill budget (the weights are unknown: {})", why.message)),
        ),
    }
}

/// The gateway's settings for the kit of `s`, or the one-line reason it cannot run. Also returns
/// a note on limits the plan could not give.
pub(super) fn config(s: &Settings) -> Result<(GatewayConfig, Option<String>), Failure> {
    if let Some(head) = s.remote_head() {
        return Err(Failure::usage(format!(
            "nodes: the head node `{head}` is not local: the gateway runs in `up`'s process and reaches the engine on \
             the head's loopback; set the head's transport to local and run `spark-kit up` on the head"
        )));
    }
    let kit = &s.kit;
    let keys = s.deploy.keys.clone()?;
    let port = s.deploy.ports.internal;
    let (p, note) = plan_of(s);
    let mut cfg = GatewayConfig::from_kit(kit, &p, keys, port)?;
    key_policies(s, &mut cfg)?;
    // The served checkpoint's tokenizer, for counting completion prompts in process; a missing
    // file (a model made on the first start) is tried again once the engine is ready.
    cfg.tokenizer =
        crate::engine::model::served_dir(kit, &s.deploy, &crate::engine::overlay::tag()).map(|d| Counter::file_in(&d));
    cfg.counter = cfg.tokenizer.as_deref().map(|t| Counter::load(t).map(Arc::new));
    Ok((cfg, note))
}

/// Each key's limits from its line in `engine.api_keys.file` (`KEY priority=N max_in_flight=N`).
fn key_policies(s: &Settings, cfg: &mut GatewayConfig) -> Result<(), Failure> {
    for (line, key, options) in crate::deploy::keys::key_file_options(&s.kit, &s.deploy.dirs) {
        let policy = crate::gateway::keys::parse_policy(&options).map_err(|why| {
            let file = s.kit.engine.api_keys.file.as_deref().unwrap_or_default();
            Failure::usage(format!(
                "engine.api_keys.file {file} line {line}: {why}: write `KEY priority=N max_in_flight=N` (both optional)"
            ))
        })?;
        if let Some(k) = cfg.keys.iter_mut().find(|k| k.opens(&key)) {
            k.policy = policy;
        }
    }
    Ok(())
}

/// One line (under 160 characters) on what the gateway admits, for `up`'s output. How prompts
/// are counted shows only when the engine counts them (a `/tokenize` round trip per request).
pub(super) fn summary(cfg: &GatewayConfig, note: Option<&str>) -> String {
    let l = &cfg.limits;
    let mut parts = vec![format!("max_model_len {}", l.max_model_len)];
    if let Some(t) = l.kv_pool_tokens {
        parts.push(format!("KV pool {t}"));
    }
    match (l.safe_max_prompt, note) {
        (Some(b), _) => parts.push(format!("prefill budget {b}")),
        (None, Some(_)) => parts.push("no prefill budget yet".into()),
        (None, None) => parts.push("no prefill budget: node memory unknown".into()),
    }
    if !matches!(&cfg.counter, Some(Ok(_) | Err(LoadError::Missing(_)))) {
        parts.push("prompts counted by the engine".into());
    }
    let keyed = if cfg.keys.is_empty() { "no API keys" } else { "keyed" };
    let engine = cfg.upstream.strip_prefix("http://").unwrap_or(&cfg.upstream);
    format!(
        "==> gateway {} → engine {engine} ({keyed}; {} slots, queue {}; {})",
        cfg.bind,
        cfg.max_in_flight,
        cfg.queue_len,
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::schema::{Kit, Transport};

    fn kit(name: &str) -> Kit {
        crate::kit::builtin_kit(name)
    }

    fn config(k: &Kit, env: &[(String, String)]) -> Result<(GatewayConfig, Option<String>), Failure> {
        super::config(&Settings::new(k.clone(), None, env).unwrap())
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
        assert!(line.contains("no prefill budget yet"), "{line}");
        assert!(line.contains("KV pool 65536") && line.contains("no API keys"), "{line}");
        // One line, no cache path: the was 420 characters.
        assert!(line.chars().count() < 160, "{} characters: {line}", line.chars().count());
        assert!(!line.contains(".cache") && !line.contains("tokenizer.json"), "{line}");
    }

    #[test]
    fn key_file_options_become_each_keys_policy_and_a_bad_one_names_the_line() {
        use crate::gateway::keys::KeyPolicy;
        let d = tempfile::tempdir().unwrap();
        let env = vec![("HOME".to_string(), d.path().display().to_string())];
        let file = d.path().join("keys");
        std::fs::write(&file, "sk-a priority=3 max_in_flight=2\nsk-b\n").unwrap();
        let mut k = kit("tiny-cpu");
        k.engine.api_keys.file = Some(file.display().to_string());
        let (cfg, _) = config(&k, &env).unwrap();
        let policies: Vec<KeyPolicy> = cfg.keys.iter().map(|k| k.policy).collect();
        assert_eq!(policies, [KeyPolicy { priority: Some(3), max_in_flight: Some(2) }, KeyPolicy::default()]);
        assert!(cfg.keys[0].opens("sk-a") && cfg.keys[1].opens("sk-b"));
        std::fs::write(&file, "sk-a\nsk-b prio=1\n").unwrap();
        let e = config(&k, &env).unwrap_err().to_string();
        assert!(e.contains("line 2: unknown option \"prio=1\"") && e.contains("KEY priority=N max_in_flight=N"), "{e}");
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
