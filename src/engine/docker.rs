//! The `docker run` command of a node's engine for kits with `engine.runtime: docker` (the
//! vendor vLLM image on DGX Spark). Pure construction, unit-tested; flags follow the reference
//! kit (reference-kit.md A.6, gb10-ops.md §3.3): GPUs, host network and IPC, a large /dev/shm,
//! unlimited memlock, the InfiniBand devices for RoCE, `--oom-score-adj 1000` so the kernel picks
//! vLLM over the host's daemons, and read-only mounts of the weights and the overlay.

use super::argv::EngineSpec;
use crate::kit::schema::Kit;

/// Paths on the node that the container needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounts {
    /// Model directory on the host (mounted read-only at `/model`).
    pub model: String,
    /// Slim Engram directory (read-only at `/engram-src`), when the kit has Engram tables.
    pub engram: Option<String>,
    /// This node's packed Engram shards (`pack-engram`; read-only at `/engram-packed`), if packed.
    pub engram_packed: Option<String>,
    /// The materialised overlay (read-only at `/opt/spark-overlay`).
    pub overlay: String,
    /// Per-node compile caches (read-write), e.g. `~/.cache/vllm`.
    pub caches: Vec<(String, String)>,
}

/// `docker run …` for node `node`: the argv (starting with `docker`).
#[must_use]
pub fn run_argv(kit: &Kit, node: usize, spec: &EngineSpec, mounts: &Mounts) -> Vec<String> {
    let image = kit.engine.docker_image.clone().unwrap_or_default();
    let name = format!("spark-kit-{}-{}", kit.name, kit.nodes[node].name);
    let mut a: Vec<String> =
        ["docker", "run", "--rm", "--name", &name, "--init"].iter().map(|s| (*s).to_string()).collect();
    let flags: &[&str] = &[
        "--gpus=all",
        "--network=host",
        "--ipc=host",
        "--shm-size=32g",
        "--ulimit=memlock=-1",
        "--ulimit=stack=67108864",
        "--device=/dev/infiniband",
        "--cap-add=IPC_LOCK",
        "--cap-add=SYS_PTRACE",
        "--oom-score-adj=1000",
    ];
    a.extend(flags.iter().map(|s| (*s).to_string()));
    a.push(format!("--stop-timeout={}", kit.engine.shutdown_timeout_s + 5));
    a.push(format!("--volume={}:/model:ro", mounts.model));
    if let Some(e) = &mounts.engram {
        a.push(format!("--volume={e}:/engram-src:ro"));
        // The overlay's file-backed Engram table reads it there (docs/engram.md).
        a.push("--env=SPARK_ENGRAM_DIR=/engram-src".into());
    }
    if let Some(p) = &mounts.engram_packed {
        a.push(format!("--volume={p}:/engram-packed:ro"));
        a.push("--env=SPARK_ENGRAM_PACKED_DIR=/engram-packed".into());
    }
    a.push(format!("--volume={}:/opt/spark-overlay:ro", mounts.overlay));
    for (host, inside) in &mounts.caches {
        a.push(format!("--volume={host}:{inside}"));
    }
    for (k, v) in &spec.env {
        let v = if k == "PYTHONPATH" { "/opt/spark-overlay".to_string() } else { v.clone() };
        a.push(format!("--env={k}={v}"));
    }
    a.push(image);
    a.push("vllm".into());
    // The model path inside the container.
    let mut args = spec.vllm_args.clone();
    if args.len() > 1 && args[0] == "serve" {
        args[1] = "/model".into();
    }
    a.extend(args);
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::argv;
    use crate::kit;

    #[test]
    fn spark_worker_command() {
        let k = kit::resolve(kit::source(Some("dgx-spark-2x-dsv41-exl3")).unwrap(), &[], &[]).unwrap().kit;
        let spec = argv::build(&k, 1, "/host/model", "/host/overlay");
        let m = Mounts {
            model: "/host/model".into(),
            engram: Some("/host/engram".into()),
            engram_packed: Some("/host/packed".into()),
            overlay: "/host/overlay".into(),
            caches: vec![("/root/.cache/vllm".into(), "/root/.cache/vllm".into())],
        };
        let a = run_argv(&k, 1, &spec, &m);
        for flag in [
            "--gpus=all",
            "--network=host",
            "--ipc=host",
            "--ulimit=memlock=-1",
            "--device=/dev/infiniband",
            "--oom-score-adj=1000",
        ] {
            assert!(a.contains(&flag.to_string()), "{flag} missing: {a:?}");
        }
        assert!(a.contains(&"--volume=/host/model:/model:ro".to_string()));
        assert!(a.contains(&"--volume=/host/engram:/engram-src:ro".to_string()));
        assert!(a.contains(&"--env=SPARK_ENGRAM_DIR=/engram-src".to_string()));
        assert!(a.contains(&"--volume=/host/packed:/engram-packed:ro".to_string()));
        assert!(a.contains(&"--env=SPARK_ENGRAM_PACKED_DIR=/engram-packed".to_string()));
        assert!(a.contains(&"--env=PYTHONPATH=/opt/spark-overlay".to_string()));
        assert!(a.contains(&"--env=NCCL_IB_HCA=rocep1s0f0".to_string()));
        let image = a.iter().position(|x| x == "vllm/vllm-openai:deepseekv41-flash-0909").unwrap();
        assert_eq!(a[image + 1..image + 4], ["vllm", "serve", "/model"]);
        assert!(a.contains(&"--headless".to_string()));
        assert_eq!(a.iter().filter(|x| *x == "--headless").count(), 1);
    }
}
