//! The `vllm serve` argument vector and the environment of one node's engine, from the kit.
//! Pure: the same kit and node always give the same command.

use std::collections::BTreeMap;

use crate::kit::schema::{Kit, KvCacheDtype, Role, SchedulingPolicy, SpecMethod};

/// Everything the engine process of one node is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSpec {
    /// Arguments after `vllm` (starting with `serve`).
    pub vllm_args: Vec<String>,
    /// The engine's complete environment additions (the spawner starts from a minimal base).
    pub env: BTreeMap<String, String>,
    /// This node's rank among the nodes (head = 0).
    pub node_rank: usize,
}

/// Node rank of each node: the head is 0, workers follow in kit order.
#[must_use]
pub fn node_ranks(kit: &Kit) -> Vec<usize> {
    let mut next = 1;
    kit.nodes
        .iter()
        .map(|n| {
            if n.role == Role::Head {
                0
            } else {
                next += 1;
                next - 1
            }
        })
        .collect()
}

/// Build the engine command of node `node` (index into `kit.nodes`).
#[must_use]
pub fn build(kit: &Kit, node: usize, model_dir: &str, overlay_dir: &str) -> EngineSpec {
    let e = &kit.engine;
    let n = &kit.nodes[node];
    let rank = node_ranks(kit)[node];
    let nnodes = kit.nodes.len();
    let mut a: Vec<String> = vec!["serve".into(), model_dir.into()];
    let mut push = |k: &str, v: String| {
        a.push(k.into());
        a.push(v);
    };
    push("--served-model-name", e.served_model_name.clone());
    // Behind the gateway: clients reach `engine.host:engine.port` (the gateway in the
    // supervisor), vLLM listens on loopback only.
    let (host, port) = crate::deploy::ports::Ports::of(kit).internal_addr();
    push("--host", host.to_string());
    push("--port", port.to_string());
    // vLLM's own key guards `/v1` only; this guards every route but `/health` (a loopback port
    // every local user can reach: python_overlay/spark_overlay/engine_key.py).
    push("--middleware", "spark_overlay.engine_key.KeyOnEveryRoute".into());
    push("--max-model-len", e.max_model_len.to_string());
    push("--max-num-seqs", e.max_num_seqs.to_string());
    push("--max-num-batched-tokens", e.max_num_batched_tokens.to_string());
    if e.scheduling_policy == SchedulingPolicy::Priority {
        push("--scheduling-policy", "priority".into());
    }
    // Always explicit: without it vLLM sizes the pool from free memory (a lottery on GB10).
    push("--kv-cache-memory-bytes", e.kv_cache_bytes.bytes().to_string());
    push("--block-size", e.block_size.to_string());
    if e.kv_cache_dtype != KvCacheDtype::Auto {
        push("--kv-cache-dtype", e.kv_cache_dtype.name().to_string());
    }
    push("--dtype", e.dtype.clone());
    push("--tensor-parallel-size", kit.tensor_parallel_size.to_string());
    if e.long_prefill_token_threshold > 0 {
        push("--long-prefill-token-threshold", e.long_prefill_token_threshold.to_string());
    }
    if !e.quantization.is_empty() {
        push("--quantization", e.quantization.clone());
    }
    if e.speculative.method != SpecMethod::None {
        let method = match e.speculative.method {
            SpecMethod::Dspark => "dspark",
            SpecMethod::Mtp => "mtp",
            SpecMethod::Ngram => "ngram",
            SpecMethod::None => "none",
        };
        push(
            "--speculative-config",
            format!(r#"{{"method":"{method}","num_speculative_tokens":{}}}"#, e.speculative.tokens),
        );
    }
    if e.shutdown_timeout_s > 0 {
        push("--shutdown-timeout", e.shutdown_timeout_s.to_string());
    }
    if nnodes > 1 {
        let head = kit.nodes.iter().find(|n| n.role == Role::Head);
        let master = head.and_then(|h| h.fabric.ipv4.clone()).unwrap_or_else(|| "127.0.0.1".into());
        push("--distributed-executor-backend", "mp".into());
        push("--nnodes", nnodes.to_string());
        push("--node-rank", rank.to_string());
        push("--master-addr", master);
        push("--master-port", e.master_port.to_string());
        if rank > 0 {
            a.push("--headless".into());
        }
    }
    // The agents probe /health and /metrics every second; their access-log lines would bury
    // the engine's own log (vLLM logs requests itself).
    a.push("--disable-uvicorn-access-log".into());
    if e.enforce_eager {
        a.push("--enforce-eager".into());
    } else if !e.cudagraph_capture_sizes.is_empty() {
        a.push("--cudagraph-capture-sizes".into());
        a.extend(e.cudagraph_capture_sizes.iter().map(ToString::to_string));
    }
    a.extend(e.extra_args.iter().cloned());

    let mut env = BTreeMap::new();
    for (k, v) in [
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("VLLM_NO_USAGE_STATS", "1"),
        ("DO_NOT_TRACK", "1"),
        ("PYTHONUNBUFFERED", "1"),
    ] {
        env.insert(k.to_string(), v.to_string());
    }
    env.insert("PYTHONPATH".into(), overlay_dir.into());
    env.insert("VLLM_HOST_IP".into(), n.fabric.ipv4.clone().unwrap_or_else(|| "127.0.0.1".into()));
    if let Some(iface) = &n.fabric.interface {
        env.insert("NCCL_SOCKET_IFNAME".into(), iface.clone());
        env.insert("GLOO_SOCKET_IFNAME".into(), iface.clone());
    }
    if let Some(hca) = &n.fabric.hca {
        env.insert("NCCL_IB_HCA".into(), hca.clone());
    }
    env.extend(e.extra_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(n.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    EngineSpec { vllm_args: a, env, node_rank: rank }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kit::builtin_kit as load;

    fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        args.iter().position(|a| a == flag).map(|i| args[i + 1].as_str())
    }

    #[test]
    fn tiny_cpu_single_node() {
        let s = build(&load("tiny-cpu"), 0, "/m", "/o");
        assert_eq!(&s.vllm_args[..2], ["serve", "/m"]);
        assert_eq!(value(&s.vllm_args, "--kv-cache-memory-bytes"), Some("67108864"));
        assert_eq!(value(&s.vllm_args, "--served-model-name"), Some("tiny-llama"));
        assert!(s.vllm_args.contains(&"--enforce-eager".to_string()));
        assert!(!s.vllm_args.contains(&"--nnodes".to_string()));
        // `auto` is vLLM's own choice: not passed.
        assert_eq!(value(&s.vllm_args, "--kv-cache-dtype"), None);
        assert_eq!(s.env["PYTHONPATH"], "/o");
        assert_eq!(s.env["VLLM_NO_USAGE_STATS"], "1");
        assert_eq!(s.env["HF_HUB_OFFLINE"], "1");
        // vLLM behind the gateway: loopback, the internal port.
        assert_eq!(value(&s.vllm_args, "--host"), Some("127.0.0.1"));
        assert_eq!(value(&s.vllm_args, "--middleware"), Some("spark_overlay.engine_key.KeyOnEveryRoute"));
        assert_eq!(value(&s.vllm_args, "--port"), Some("18000"));
        assert_eq!(value(&s.vllm_args, "--scheduling-policy"), None);
        let mut k = load("tiny-cpu");
        k.engine.scheduling_policy = SchedulingPolicy::Priority;
        assert_eq!(value(&build(&k, 0, "/m", "/o").vllm_args, "--scheduling-policy"), Some("priority"));
    }

    #[test]
    fn spark_two_nodes_per_rank() {
        let k = load("dgx-spark-2x-dsv41-exl3");
        let head = build(&k, 0, "/m", "/o");
        let worker = build(&k, 1, "/m", "/o");
        assert_eq!(value(&head.vllm_args, "--node-rank"), Some("0"));
        assert_eq!(value(&worker.vllm_args, "--node-rank"), Some("1"));
        assert!(!head.vllm_args.contains(&"--headless".to_string()));
        assert!(worker.vllm_args.contains(&"--headless".to_string()));
        assert_eq!(value(&worker.vllm_args, "--master-addr"), Some("192.168.100.10"));
        assert_eq!(value(&head.vllm_args, "--master-port"), Some("29521"));
        assert_eq!(value(&head.vllm_args, "--kv-cache-dtype"), Some("fp8_ds_mla"));
        assert_eq!(
            value(&head.vllm_args, "--speculative-config"),
            Some(r#"{"method":"dspark","num_speculative_tokens":3}"#)
        );
        assert_eq!(head.env["NCCL_SOCKET_IFNAME"], "enp1s0f1np1");
        assert_eq!(worker.env["NCCL_IB_HCA"], "rocep1s0f0");
        assert_eq!(worker.env["VLLM_HOST_IP"], "192.168.100.11");
        assert_eq!(head.env["NCCL_PROTO"], "^LL128");
        let caps = head.vllm_args.iter().position(|a| a == "--cudagraph-capture-sizes").unwrap();
        assert_eq!(head.vllm_args[caps + 1..caps + 10], ["1", "2", "3", "4", "6", "8", "12", "18", "24"]);
    }
}
