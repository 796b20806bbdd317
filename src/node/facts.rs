//! The raw facts of one node, gathered through a [`ProbeSource`]. Gathering does I/O; every
//! verdict over the facts ([`super::checks`]) is pure.

use serde::{Deserialize, Serialize};

use super::probe::{ProbeError, ProbeSource};
use crate::runtime::docker::DockerRequest;

/// Outcome of one probe: its text, or why there is none.
pub type Probed = Result<String, ProbeError>;

/// One GID table entry from `/sys/class/infiniband/<hca>/ports/<port>/gids/<index>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidEntry {
    pub port: u32,
    pub index: u32,
    pub gid: String,
    /// `gid_attrs/types/<index>`: `RoCE v2`, `IB/RoCE v1`.
    pub kind: String,
    /// `gid_attrs/ndevs/<index>`: the net device the GID belongs to.
    pub ndev: Option<String>,
}

/// The link facts of the node's fabric interface and HCA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FabricFacts {
    pub interface: Option<String>,
    pub hca: Option<String>,
    /// `/sys/class/net/<if>/operstate`, `speed` (Mb/s), `mtu`.
    pub operstate: Option<Probed>,
    pub speed: Option<Probed>,
    pub mtu: Option<Probed>,
    /// `ip -4 -o addr show <if>`.
    pub ip_addr: Option<Probed>,
    /// The GID table of every port of the HCA (empty when none could be read).
    pub gids: Vec<GidEntry>,
    /// Why the GID table could not be read.
    pub gid_error: Option<String>,
    /// `ports/<n>/state` of each port, e.g. `4: ACTIVE`.
    pub port_states: Vec<(u32, String)>,
    /// The cross-node all-reduce's output on this node (src/fabric), when preflight ran it.
    #[serde(default)]
    pub all_reduce: Option<Probed>,
}

/// Everything preflight looks at on one node (sent by a node agent as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFacts {
    pub uname_m: Probed,
    pub uname_r: Probed,
    pub dgx_release: Probed,
    /// `nvidia-smi --query-gpu=name,compute_cap,pci.bus_id,driver_version --format=csv,noheader`.
    pub gpu: Probed,
    /// `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader`.
    pub gpu_apps: Probed,
    pub meminfo: Probed,
    pub pressure: Probed,
    /// `(pid, comm)` of every process.
    pub processes: Vec<(i32, String)>,
    pub spark_kit_version: Probed,
    /// The engine's vLLM version (`importlib.metadata` in the engine venv).
    pub vllm_version: Option<Probed>,
    /// Free bytes where the weights go, and that path.
    pub disk_free: Result<u64, ProbeError>,
    pub disk_path: String,
    /// Whether the weights are already on disk there.
    pub weights_present: bool,
    pub fabric: FabricFacts,
    /// `(port, what, free?)` for the ports this node must bind.
    pub ports: Vec<(u16, String, Result<bool, ProbeError>)>,
    /// `(target node, ssh result)` for each node this node must reach over ssh.
    pub ssh: Vec<(String, Probed)>,
    /// `timedatectl show -p NTPSynchronized --value`.
    pub ntp: Probed,
    pub ufw: Probed,
    pub nft: Probed,
    /// Docker runtime kits: the daemon, the image and leftover containers.
    #[serde(default)]
    pub docker: Option<DockerFacts>,
}

/// Docker facts of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerFacts {
    /// `docker info --format {{.ServerVersion}}`.
    pub info: Probed,
    /// `docker image inspect --format {{.Id}} <image>`.
    pub image_id: Probed,
    pub image: String,
    /// `docker ps -a --no-trunc --filter label=spark-kit.kit=<kit>` (id, name, state per line).
    pub containers: Probed,
    /// The vLLM version inside the image (`importlib.metadata`, through [`PYTHON_IN_IMAGE`]),
    /// when asked and the image is here.
    #[serde(default)]
    pub vllm_version: Option<Probed>,
}

/// How the vLLM version inside an image is read: the image's own `python3` (then the image id,
/// `-c`, [`VLLM_VERSION_CODE`]), no network, the container removed after.
pub const PYTHON_IN_IMAGE: [&str; 6] = ["docker", "run", "--rm", "--network=none", "--entrypoint", "python3"];

/// Seconds the image's `python3` may take to print its vLLM version: starting the first container of
/// a large image (a storage driver that copies layers, a cold page cache) takes far longer than
/// the 10 s a node's other probes get; the answer is cached per image id after. Within the head's
/// wait for a node's facts (`supervisor::verdicts::FACTS_TIMEOUT_S`, checked there).
pub const IMAGE_VLLM_TIMEOUT_S: u64 = 90;

/// The Python that prints the installed vLLM's version (venv and image alike).
pub const VLLM_VERSION_CODE: &str = "import importlib.metadata as m; print(m.version('vllm'))";

/// What to gather on a node beyond the fixed set (sent to a node agent as JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FactRequest {
    pub interface: Option<String>,
    pub hca: Option<String>,
    /// The engine venv's python, to read the installed vLLM version.
    pub vllm_python: Option<String>,
    /// Where the weights live (or will).
    pub disk_path: String,
    pub ports: Vec<(String, u16, String)>,
    /// ssh targets: `(node name, argv of an ssh call that runs `true`)`.
    pub ssh: Vec<(String, Vec<String>)>,
    /// The runtime's part ([`crate::runtime::Runtime::preflight_request`]): docker kits.
    #[serde(default)]
    pub docker: Option<DockerRequest>,
    /// This node's rank of the cross-node all-reduce (`spark-kit preflight` on multi-node kits).
    #[serde(default)]
    pub all_reduce: Option<Box<crate::fabric::AllReduceRequest>>,
}

/// Gather a node's facts.
pub fn gather(p: &dyn ProbeSource, req: &FactRequest) -> NodeFacts {
    let smi = |name: &str, query: &str| p.run(name, &["nvidia-smi", query, "--format=csv,noheader"]);
    let processes = p
        .list("/proc")
        .unwrap_or_default()
        .into_iter()
        .filter_map(|d| {
            let pid: i32 = d.parse().ok()?;
            let comm = p.read(&format!("/proc/{pid}/comm")).ok()?;
            Some((pid, comm.trim().to_string()))
        })
        .collect();
    let weights_present = p.list(&req.disk_path).is_ok_and(|v| !v.is_empty());
    NodeFacts {
        uname_m: p.run("uname-m", &["uname", "-m"]),
        uname_r: p.run("uname-r", &["uname", "-r"]),
        dgx_release: p.read("/etc/dgx-release"),
        gpu: smi("nvidia-smi-gpu", "--query-gpu=name,compute_cap,pci.bus_id,driver_version"),
        gpu_apps: smi("nvidia-smi-apps", "--query-compute-apps=pid,process_name,used_memory"),
        meminfo: p.read("/proc/meminfo"),
        pressure: p.read("/proc/pressure/memory"),
        processes,
        spark_kit_version: p.spark_kit_version(),
        vllm_version: req.vllm_python.as_ref().map(|py| p.run("vllm-version", &[py, "-c", VLLM_VERSION_CODE])),
        disk_free: p.free_bytes(&req.disk_path),
        disk_path: req.disk_path.clone(),
        weights_present,
        fabric: {
            let mut f = fabric(p, req);
            f.all_reduce = req.all_reduce.as_ref().map(|r| {
                let argv = r.argv();
                let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                p.run_long("all-reduce", &argv, r.timeout_s)
            });
            f
        },
        ports: req.ports.iter().map(|(host, port, what)| (*port, what.clone(), p.port_free(host, *port))).collect(),
        ssh: req
            .ssh
            .iter()
            .map(|(node, argv)| {
                let args: Vec<&str> = argv.iter().map(String::as_str).collect();
                (node.clone(), p.run(&format!("ssh-{node}"), &args))
            })
            .collect(),
        ntp: p.run("timedatectl", &["timedatectl", "show", "-p", "NTPSynchronized", "--value"]),
        ufw: p.run("ufw", &["ufw", "status"]),
        nft: p.run("nft", &["nft", "list", "ruleset"]),
        docker: req.docker.as_ref().map(|d| docker(p, d)),
    }
}

fn docker(p: &dyn ProbeSource, req: &DockerRequest) -> DockerFacts {
    let filter = format!("label={}={}", crate::runtime::docker::dockerctl::LABEL_KIT, req.kit);
    let image_id = p.run("docker-image", &["docker", "image", "inspect", "--format", "{{.Id}}", &req.image]);
    let id = image_id.as_ref().ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    DockerFacts {
        info: p.run("docker-info", &["docker", "info", "--format", "{{.ServerVersion}}"]),
        vllm_version: id.filter(|_| req.read_vllm).map(|id| image_vllm(p, req, &id)),
        image_id,
        image: req.image.clone(),
        containers: p.run(
            "docker-ps",
            &["docker", "ps", "-a", "--no-trunc", "--filter", &filter, "--format", "{{.ID}}\t{{.Names}}\t{{.State}}"],
        ),
    }
}

/// The vLLM version inside image `id`: from the node's cache of it when there, else read by
/// running the image's own `python3` once and cached (an image id names fixed content).
fn image_vllm(p: &dyn ProbeSource, req: &DockerRequest, id: &str) -> Probed {
    let cached = req.version_cache.as_ref().map(|d| format!("{d}/{}", id.trim_start_matches("sha256:")));
    if let Some(v) = cached.as_deref().and_then(|c| p.read(c).ok()).filter(|v| !v.trim().is_empty()) {
        return Ok(v);
    }
    let mut argv: Vec<&str> = PYTHON_IN_IMAGE.to_vec();
    argv.extend([id, "-c", VLLM_VERSION_CODE]);
    let v = p.run_long("docker-vllm", &argv, IMAGE_VLLM_TIMEOUT_S)?;
    if let Some(c) = &cached {
        p.remember(c, v.trim());
    }
    Ok(v)
}

fn fabric(p: &dyn ProbeSource, req: &FactRequest) -> FabricFacts {
    let mut f = FabricFacts { interface: req.interface.clone(), hca: req.hca.clone(), ..FabricFacts::default() };
    if let Some(i) = &req.interface {
        let net = format!("/sys/class/net/{i}");
        f.operstate = Some(p.read(&format!("{net}/operstate")));
        f.speed = Some(p.read(&format!("{net}/speed")));
        f.mtu = Some(p.read(&format!("{net}/mtu")));
        f.ip_addr = Some(p.run("ip-addr", &["ip", "-4", "-o", "addr", "show", "dev", i]));
    }
    if let Some(h) = &req.hca {
        let base = format!("/sys/class/infiniband/{h}/ports");
        match p.list(&base) {
            Err(e) => f.gid_error = Some(e.to_string()),
            Ok(ports) => {
                for port in ports.iter().filter_map(|s| s.parse::<u32>().ok()) {
                    if let Ok(s) = p.read(&format!("{base}/{port}/state")) {
                        f.port_states.push((port, s.trim().to_string()));
                    }
                    let idx = p.list(&format!("{base}/{port}/gids")).unwrap_or_default();
                    let mut idx: Vec<u32> = idx.iter().filter_map(|s| s.parse().ok()).collect();
                    idx.sort_unstable();
                    for i in idx {
                        // Unused entries fail to read (EINVAL) on real sysfs; they are skipped.
                        let Ok(gid) = p.read(&format!("{base}/{port}/gids/{i}")) else { continue };
                        let kind = p.read(&format!("{base}/{port}/gid_attrs/types/{i}")).unwrap_or_default();
                        let ndev = p.read(&format!("{base}/{port}/gid_attrs/ndevs/{i}")).ok();
                        f.gids.push(GidEntry {
                            port,
                            index: i,
                            gid: gid.trim().to_string(),
                            kind: kind.trim().to_string(),
                            ndev: ndev.map(|n| n.trim().to_string()),
                        });
                    }
                }
            }
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A node where every command answers `0.34.0` and each call's limit is kept.
    #[derive(Default)]
    struct Limits(RefCell<Vec<(String, Option<u64>)>>);

    impl ProbeSource for Limits {
        fn read(&self, path: &str) -> Result<String, ProbeError> {
            Err(ProbeError::NotFound(path.into()))
        }
        fn list(&self, path: &str) -> Result<Vec<String>, ProbeError> {
            Err(ProbeError::NotFound(path.into()))
        }
        fn run(&self, name: &str, _argv: &[&str]) -> Result<String, ProbeError> {
            self.0.borrow_mut().push((name.into(), None));
            Ok("0.34.0\n".into())
        }
        fn run_long(&self, name: &str, _argv: &[&str], timeout_s: u64) -> Result<String, ProbeError> {
            self.0.borrow_mut().push((name.into(), Some(timeout_s)));
            Ok("0.34.0\n".into())
        }
        fn free_bytes(&self, _path: &str) -> Result<u64, ProbeError> {
            Ok(0)
        }
        fn port_free(&self, _host: &str, _port: u16) -> Result<bool, ProbeError> {
            Ok(true)
        }
        fn spark_kit_version(&self) -> Result<String, ProbeError> {
            Ok("0".into())
        }
    }

    #[test]
    fn the_image_vllm_probe_gets_the_long_limit_and_the_daemon_queries_the_short_one() {
        let p = Limits::default();
        let req = DockerRequest { image: "img".into(), kit: "k".into(), read_vllm: true, version_cache: None };
        let facts = docker(&p, &req);
        assert_eq!(facts.vllm_version, Some(Ok("0.34.0\n".into())));
        let calls = p.0.borrow();
        assert!(calls.contains(&("docker-vllm".into(), Some(IMAGE_VLLM_TIMEOUT_S))), "{calls:?}");
        for (name, limit) in calls.iter().filter(|(n, _)| n != "docker-vllm") {
            assert_eq!(*limit, None, "{name}: the daemon's own queries keep the node's short limit");
        }
    }
}
