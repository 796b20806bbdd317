//! The `docker run` command of a node's engine for kits with `engine.runtime: docker` (the
//! vendor vLLM image on DGX Spark). Pure construction, unit-tested; flags follow the reference
//! kit (reference-kit.md A.6, gb10-ops.md §3.3): GPUs (GPU kits only), host network and IPC (the host's /dev/shm),
//! unlimited memlock, the InfiniBand devices for RoCE, `--oom-score-adj 1000` so the kernel picks
//! vLLM over the host's daemons, and read-only mounts of the weights and the overlay.

use super::dockerctl::{LABEL_KIT, LABEL_NODE, LABEL_RANK};
use crate::engine::argv::{node_ranks, EngineSpec};
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
    /// The engine venv, mounted read-only at its own path (`engine.docker_mount_venv`): the
    /// container runs its `bin/vllm` instead of the image's `vllm`.
    pub venv: Option<String>,
    /// Host directories mounted read-only at their own paths (the venv, its base Python's
    /// standard library).
    pub same_path: Vec<String>,
    /// Variables passed from the `docker run` client's environment by name (`--env NAME`),
    /// so their values (the API key) never appear on a command line.
    pub pass_env: Vec<String>,
}

/// The engine's compile and JIT caches, kept on the node across containers so that a restart
/// (or the next `up`) does not compile again: vLLM's (torch.compile artefacts), Triton's and
/// TileLang's kernels — the reference kit's per-node caches — relative to the home directory,
/// mounted read-write at the same place under the container's `/root` (its images run as root).
pub const CACHES: [&str; 3] = [".cache/vllm", ".triton/cache", ".tilelang/cache"];

/// `(host, container)` paths of [`CACHES`] for a node whose home directory is `home`.
#[must_use]
pub fn cache_mounts(home: &std::path::Path) -> Vec<(String, String)> {
    CACHES.iter().map(|c| (home.join(c).display().to_string(), format!("/root/{c}"))).collect()
}

/// The engine's open-files limit (GPU kits): above the 65535 vLLM asks for, well under the
/// kernel's default `fs.nr_open` (1048576).
pub const NOFILE: &str = "--ulimit=nofile=65536:65536";

/// The container name of node `node`'s engine: `spark-kit-<kit>-<node>-r<rank>`.
#[must_use]
pub fn container_name(kit: &Kit, node: usize) -> String {
    let rank = node_ranks(kit).get(node).copied().unwrap_or(0);
    format!("spark-kit-{}-{}-r{rank}", kit.name, kit.nodes[node].name)
}

/// `docker run …` for node `node`: the argv (starting with `docker`). The container is named by
/// [`container_name`] and labelled with the deployment (kit), node and rank, so survivors of an
/// earlier run are found with `docker ps --filter label=spark-kit.kit=<kit>` (preflight).
#[must_use]
pub fn run_argv(kit: &Kit, node: usize, spec: &EngineSpec, mounts: &Mounts) -> Vec<String> {
    let image = kit.engine.docker_image.clone().unwrap_or_default();
    let name = container_name(kit, node);
    let rank = node_ranks(kit).get(node).copied().unwrap_or(0);
    let mut a: Vec<String> =
        ["docker", "run", "--rm", "--name", &name, "--init"].iter().map(|s| (*s).to_string()).collect();
    a.push(format!("--label={LABEL_KIT}={}", kit.name));
    a.push(format!("--label={LABEL_NODE}={}", kit.nodes[node].name));
    a.push(format!("--label={LABEL_RANK}={rank}"));
    let host: &[&str] = &["--network=host", "--ipc=host", "--ulimit=stack=67108864", "--oom-score-adj=1000"];
    a.extend(host.iter().map(|s| (*s).to_string()));
    if kit.needs_gpu() {
        // GPUs and RoCE (NCCL's verbs need unlimited memlock): a CPU kit's host has neither, docker
        // refuses --gpus without the NVIDIA runtime, and an unlimited memlock fails where the
        // daemon's own hard limit is lower (seen on the test VM: "error setting rlimit type 8").
        // Open files: vLLM raises its soft limit to 65535 itself and warns when the hard limit
        // is lower (a daemon started with 20000 gives its containers 20000:20000); the same
        // "above the daemon's hard limit" failure keeps it off CPU kits (rlimit type 7 here).
        let gpu: &[&str] = &[
            "--gpus=all",
            "--device=/dev/infiniband",
            "--ulimit=memlock=-1",
            NOFILE,
            "--cap-add=IPC_LOCK",
            "--cap-add=SYS_PTRACE",
        ];
        a.extend(gpu.iter().map(|s| (*s).to_string()));
    }
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
    for p in &mounts.same_path {
        a.push(format!("--volume={p}:{p}:ro"));
    }
    for (k, v) in &spec.env {
        let v = if k == "PYTHONPATH" { "/opt/spark-overlay".to_string() } else { v.clone() };
        a.push(format!("--env={k}={v}"));
    }
    for k in &mounts.pass_env {
        a.push(format!("--env={k}"));
    }
    a.push(image);
    a.push(mounts.venv.as_ref().map_or_else(|| "vllm".to_string(), |v| format!("{v}/bin/vllm")));
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
        let k = kit::builtin_kit("dgx-spark-2x-dsv41-exl3-docker");
        let spec = argv::build(&k, 1, "/host/model", "/host/overlay");
        let m = Mounts {
            model: "/host/model".into(),
            engram: Some("/host/engram".into()),
            engram_packed: Some("/host/packed".into()),
            overlay: "/host/overlay".into(),
            caches: vec![("/root/.cache/vllm".into(), "/root/.cache/vllm".into())],
            venv: None,
            same_path: Vec::new(),
            pass_env: vec!["VLLM_API_KEY".into()],
        };
        let a = run_argv(&k, 1, &spec, &m);
        let caches = cache_mounts(std::path::Path::new("/home/me"));
        assert_eq!(caches[1], ("/home/me/.triton/cache".to_string(), "/root/.triton/cache".to_string()));
        for flag in [
            "--gpus=all",
            "--network=host",
            "--ipc=host",
            "--ulimit=memlock=-1",
            NOFILE,
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
        assert!(a.contains(&"--env=VLLM_API_KEY".to_string()), "the key passes by name only");
        let image = a.iter().position(|x| x == "vllm/vllm-openai:v0.34.0-aarch64").unwrap();
        assert_eq!(a[image + 1..image + 4], ["vllm", "serve", "/model"]);
        assert!(a.contains(&"--headless".to_string()));
        let name = a.iter().position(|x| x == "--name").unwrap();
        assert_eq!(a[name + 1], format!("spark-kit-{}-{}-r1", k.name, k.nodes[1].name));
        assert!(a.contains(&format!("--label=spark-kit.kit={}", k.name)));
        assert!(a.contains(&format!("--label=spark-kit.node={}", k.nodes[1].name)));
        assert!(a.contains(&"--label=spark-kit.rank=1".to_string()));
        assert_eq!(a.iter().filter(|x| *x == "--headless").count(), 1);
    }

    /// A CPU kit's mounts: the venv at `/v`, `same_path` mounted at their own paths.
    fn cpu_mounts(same_path: &[&str]) -> Mounts {
        Mounts {
            model: "/m".into(),
            engram: None,
            engram_packed: None,
            overlay: "/o".into(),
            caches: vec![],
            venv: Some("/v".into()),
            same_path: same_path.iter().map(|p| (*p).into()).collect(),
            pass_env: vec![],
        }
    }

    #[test]
    fn a_cpu_kit_asks_for_no_gpu_or_infiniband() {
        let k = kit::builtin_kit("tiny-cpu-docker");
        let spec = argv::build(&k, 0, "/host/model", "/host/overlay");
        let m = cpu_mounts(&["/v", "/usr/lib/python3.11"]);
        let a = run_argv(&k, 0, &spec, &m);
        assert!(!a.iter().any(|x| x.starts_with("--gpus") || x.starts_with("--device")), "{a:?}");
        assert!(!a.iter().any(|x| x.starts_with("--ulimit=nofile") || x.starts_with("--ulimit=memlock")), "{a:?}");
        assert!(a.contains(&"--network=host".to_string()) && a.contains(&"--oom-score-adj=1000".to_string()));
        assert!(a.contains(&"--volume=/v:/v:ro".to_string()), "{a:?}");
        assert!(a.contains(&"--volume=/usr/lib/python3.11:/usr/lib/python3.11:ro".to_string()), "{a:?}");
        let image = a.iter().position(|x| x == "spark-kit/tiny-cpu-engine:local").unwrap();
        assert_eq!(a[image + 1..image + 4], ["/v/bin/vllm", "serve", "/model"]);
    }

    #[test]
    fn a_two_node_cpu_worker_runs_headless_on_its_fabric() {
        let k = kit::builtin_kit("tiny-cpu-docker-2node");
        let spec = argv::build(&k, 1, "/host/model", "/host/overlay");
        let m = cpu_mounts(&["/v"]);
        let a = run_argv(&k, 1, &spec, &m);
        let after = |flag: &str| a.iter().position(|x| x == flag).map(|i| a[i + 1].as_str());
        assert_eq!(after("--name"), Some("spark-kit-tiny-cpu-docker-2node-node-b-r1"));
        assert_eq!(after("--node-rank"), Some("1"));
        assert_eq!(after("--master-addr"), Some("10.77.0.1"));
        assert!(a.contains(&"--headless".to_string()) && a.contains(&"--network=host".to_string()), "{a:?}");
        for env in ["VLLM_HOST_IP=10.77.0.2", "GLOO_SOCKET_IFNAME=veth-spark2", "VLLM_CPU_OMP_THREADS_BIND=1"] {
            assert!(a.contains(&format!("--env={env}")), "{env}: {a:?}");
        }
        assert!(!a.iter().any(|x| x.starts_with("--gpus")), "{a:?}");
    }
}
