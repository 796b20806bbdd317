//! The launch-kit schema: one YAML document describes a whole deployment.
//!
//! Every struct rejects unknown keys. The doc comment of each field is its documentation:
//! `docs/configuration.md` is generated from this schema and a test keeps the two equal.
//! `Default` impls are the "built-in defaults" layer of the precedence chain.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bytes::ByteSize;

/// A whole deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Kit {
    /// Kit name, shown by `spark-kit kits` and in receipts.
    pub name: String,
    /// One line saying what this kit deploys.
    pub description: String,
    /// The model checkpoint to serve.
    pub model: Model,
    /// The Engram tables (DeepSeek V4.1 shards 47–48); absent for models without Engram.
    pub engram: Option<Engram>,
    /// The machines of the deployment; exactly one has role `head`.
    pub nodes: Vec<Node>,
    /// Tensor-parallel size across all nodes; a multiple of the number of nodes.
    pub tensor_parallel_size: u32,
    /// The inference engine (vLLM) and its serving settings.
    pub engine: Engine,
    /// Memory policy: boot margin and the memory guard.
    pub memory: Memory,
    /// Where things live on every node.
    pub paths: Paths,
}

impl Default for Kit {
    fn default() -> Self {
        Self {
            name: String::new(),
            description: String::new(),
            model: Model::default(),
            engram: None,
            nodes: Vec::new(),
            tensor_parallel_size: 1,
            engine: Engine::default(),
            memory: Memory::default(),
            paths: Paths::default(),
        }
    }
}

/// Where the model comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ModelSource {
    /// A Hugging Face Hub repository at a pinned revision.
    #[default]
    Hub,
    /// A directory that already exists on every node (`model.path`).
    Local,
    /// The tiny dense Llama made locally by `python_overlay/tools/make_tiny_model.py`.
    TinyDense,
    /// The tiny EXL3 Llama made locally by the same maker.
    TinyExl3,
}

/// The model checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Model {
    /// Where the weights come from.
    pub source: ModelSource,
    /// Hub repository id (`owner/name`) when `source` is `hub`.
    pub repo: String,
    /// Pinned revision: a 40-hex commit, or a branch/tag that is resolved to a commit once.
    pub revision: String,
    /// Directory of the checkpoint when `source` is `local` (ignored otherwise).
    pub path: Option<String>,
    /// Number of `*.safetensors` shards the checkpoint must have (0 = no check).
    pub expected_shards: u32,
    /// Files that must be present, optionally with size and SHA-256.
    pub files: Vec<ExpectedFile>,
    /// Expected bits per weight (K) by matrix class, reported against the trellis by `verify --structure`.
    pub k_map: BTreeMap<String, f64>,
    /// How the weights reach the other nodes before `up` starts an engine (`hub` and `local` models).
    pub sync: WeightSync,
    /// `rsync` only: page cache the copy may leave behind on each end (flushed and dropped as it goes).
    pub sync_page_cache: ByteSize,
    /// How `download` fetches Xet-backed files (`hub` models and Engram files).
    pub transport: DownloadTransport,
}

impl Default for Model {
    fn default() -> Self {
        Self {
            source: ModelSource::default(),
            repo: String::new(),
            revision: String::new(),
            path: None,
            expected_shards: 0,
            files: Vec::new(),
            k_map: BTreeMap::new(),
            sync: WeightSync::default(),
            sync_page_cache: ByteSize::gib(1),
            transport: DownloadTransport::default(),
        }
    }
}

/// How `download` fetches a file the Hub stores in Xet (its `resolve` carries `X-Xet-Hash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DownloadTransport {
    /// Byte ranges through the Hub's bridge; the native Xet protocol for a file the bridge
    /// refuses (a 4xx, as it answers for very large files).
    #[default]
    Auto,
    /// Byte ranges through the bridge only (a refusal fails the download).
    Bridge,
    /// The native Xet protocol (CAS reconstruction + xorb ranges) for every Xet-backed file.
    Xet,
}

/// How the weights get onto every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "kebab-case")]
pub enum WeightSync {
    /// Every node already sees the same files at the same path (a shared mount, or copied by
    /// hand): each node's agent checks every file and its size; a difference stops `up`.
    #[default]
    Shared,
    /// The head copies its tree to each ssh node with rsync (resumable, only changed files,
    /// page cache capped), then checks as `shared` does.
    Rsync,
}

/// A file the kit expects in a repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ExpectedFile {
    /// Path inside the repository.
    pub path: String,
    /// Size in bytes, when known in advance.
    pub size: Option<u64>,
    /// Lower-case hex SHA-256, when known in advance.
    pub sha256: Option<String>,
}

/// The Engram tables: only a few shards of the original FP8 checkpoint are needed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Engram {
    /// Hub repository id of the original checkpoint.
    pub repo: String,
    /// Pinned revision of that repository.
    pub revision: String,
    /// Files to fetch from it (the Engram shards, the index, config.json).
    pub files: Vec<ExpectedFile>,
    /// Layers that carry Engram tables.
    pub layers: Vec<u32>,
}

/// A node's role in the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Runs rank 0 and the API server.
    Head,
    /// Runs a headless rank.
    #[default]
    Worker,
}

/// How the supervisor reaches a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// The node is this machine.
    #[default]
    Local,
    /// OpenSSH client in batch mode.
    Ssh,
    /// A command prefix, e.g. `ip netns exec spark2`.
    Exec,
}

/// One machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Node {
    /// Unique node name.
    pub name: String,
    /// `head` or `worker`.
    pub role: Role,
    /// How to reach the node.
    pub transport: Transport,
    /// SSH host name or address (transport `ssh`).
    pub ssh_host: Option<String>,
    /// SSH user (transport `ssh`; default: the current user).
    pub ssh_user: Option<String>,
    /// SSH port (transport `ssh`).
    #[serde(deserialize_with = "super::port::port")]
    pub ssh_port: u16,
    /// Extra `ssh` options (transport `ssh`), e.g. `[-i, ~/.ssh/spark, -o, UserKnownHostsFile=/x]`.
    pub ssh_options: Vec<String>,
    /// Command prefix (transport `exec`), e.g. `[ip, netns, exec, spark2]`.
    pub exec_prefix: Vec<String>,
    /// The node's fabric (the link between nodes).
    pub fabric: Fabric,
    /// Total memory of the node, for `plan` when not measured on the node.
    pub memory_total: Option<ByteSize>,
    /// Extra environment for this node's engine only.
    pub env: BTreeMap<String, String>,
}

impl Default for Node {
    fn default() -> Self {
        Self {
            name: String::new(),
            role: Role::default(),
            transport: Transport::Local,
            ssh_host: None,
            ssh_user: None,
            ssh_port: 22,
            ssh_options: Vec::new(),
            exec_prefix: Vec::new(),
            fabric: Fabric::default(),
            memory_total: None,
            env: BTreeMap::new(),
        }
    }
}

/// The node's side of the inter-node link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Fabric {
    /// Network interface (sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME).
    pub interface: Option<String>,
    /// RDMA device(s) for NCCL_IB_HCA, e.g. `rocep1s0f1`.
    pub hca: Option<String>,
    /// The node's IPv4 address on that interface (sets VLLM_HOST_IP; the head's is the master address).
    pub ipv4: Option<String>,
}

/// How the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    /// A Python virtual environment made by `spark-kit setup`.
    #[default]
    Venv,
    /// A container image run with docker.
    Docker,
}

/// How vLLM orders waiting requests (`--scheduling-policy`; docs/gateway.md, "Priority").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum SchedulingPolicy {
    /// First come, first served (vLLM's default; a request's `priority` other than 0 is refused).
    #[default]
    Fcfs,
    /// Lower `priority` values first (`--scheduling-policy priority`); the gateway passes each
    /// request's `priority`, raised to its key's `priority=N`.
    Priority,
}

/// The KV cache record vLLM stores (`--kv-cache-dtype`; docs/plan.md, "KV cache dtype").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheDtype {
    /// Not passed: vLLM picks (DeepSeek V4.1 resolves it to `fp8_ds_mla`).
    #[default]
    Auto,
    /// DeepSeek's packed FP8 record (448 FP8 NoPE + 64 BF16 RoPE + scales: 584 B per entry on GB10).
    Fp8DsMla,
    /// The compressed cache as NVFP4 (288 B per entry); FlashMLA decodes it only on SM100.
    Nvfp4DsMla,
}

impl KvCacheDtype {
    /// The value vLLM's `--kv-cache-dtype` takes.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Fp8DsMla => "fp8_ds_mla",
            KvCacheDtype::Nvfp4DsMla => "nvfp4_ds_mla",
        }
    }
}

/// Speculative decoding method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SpecMethod {
    /// No speculative decoding.
    #[default]
    None,
    /// DeepSeek V4.1's DSpark speculator.
    Dspark,
    /// Multi-token prediction heads.
    Mtp,
    /// Prompt lookup (n-gram matches in the context; no draft model): runs on any model, the
    /// CPU build included, so tiny-cpu exercises speculation (docs/bench.md).
    Ngram,
}

/// Speculative decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Speculative {
    /// Method; `none` turns speculation off.
    pub method: SpecMethod,
    /// Speculative tokens per step (`num_speculative_tokens`).
    pub tokens: u32,
}

/// API keys accepted by the endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ApiKeys {
    /// Name of an environment variable holding the key(s), comma-separated.
    pub env: Option<String>,
    /// File holding one key per line, optionally followed by `priority=N max_in_flight=N` (docs/gateway.md).
    pub file: Option<String>,
}

/// The inference engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Engine {
    /// `venv` or `docker`.
    pub runtime: Runtime,
    /// Engine venv directory; empty = the cache entry keyed by the requirements' hash.
    pub venv: Option<String>,
    /// Requirements set of the venv (a file under `python_overlay/requirements/`).
    pub requirements: String,
    /// Container image (runtime `docker`).
    pub docker_image: Option<String>,
    /// Runtime `docker`: bind-mount the engine venv (`engine.venv`, or the one `engine.requirements` builds) and its base Python's standard library read-only at their own paths and run the venv's `vllm`; the image then only needs the shared libraries they load (`spark-kit image build` makes one).
    pub docker_mount_venv: bool,
    /// vLLM version the overlay is checked against (empty = any supported).
    pub vllm_version: String,
    /// Model name clients use.
    pub served_model_name: String,
    /// Address the API binds to.
    pub host: String,
    /// API port: where clients connect (the gateway listens here).
    #[serde(deserialize_with = "super::port::port")]
    pub port: u16,
    /// Loopback port of vLLM's own API behind the gateway (0 = `engine.port` + 10000, or − 10000
    /// above 55535).
    #[serde(deserialize_with = "super::port::port_or_auto")]
    pub internal_port: u16,
    /// torch.distributed rendezvous port on the head (multi-node).
    #[serde(deserialize_with = "super::port::port")]
    pub master_port: u16,
    /// Where the API keys come from (none = no auth).
    pub api_keys: ApiKeys,
    /// Longest sequence (prompt + output) in tokens.
    pub max_model_len: u64,
    /// Most sequences in flight.
    pub max_num_seqs: u32,
    /// Token budget of one scheduler step.
    pub max_num_batched_tokens: u32,
    /// How vLLM orders waiting requests: `fcfs` or `priority` (`--scheduling-policy`).
    pub scheduling_policy: SchedulingPolicy,
    /// Prompts longer than this are prefilled in chunks alongside decodes (0 = vLLM default).
    pub long_prefill_token_threshold: u32,
    /// KV cache pool per rank, always passed explicitly (`--kv-cache-memory-bytes`).
    pub kv_cache_bytes: ByteSize,
    /// KV cache bytes per token, for planning (may be fractional; the pool is sized in whole
    /// blocks of `block_size` tokens; 0 = `plan` derives it from the model's shapes where it knows
    /// them, the DeepSeek V4.1 Flash kit, else unknown).
    pub kv_bytes_per_token: f64,
    /// KV cache record (`--kv-cache-dtype`, not passed when `auto`): `fp8_ds_mla` or
    /// `nvfp4_ds_mla` for DeepSeek V4.1; `plan` sizes the pool in tokens for it.
    pub kv_cache_dtype: KvCacheDtype,
    /// KV cache block size in tokens.
    pub block_size: u32,
    /// Model dtype (`auto`, `bfloat16`, `float16`, `float32`).
    pub dtype: String,
    /// Quantization method passed to vLLM (empty = from the checkpoint's config).
    pub quantization: String,
    /// Speculative decoding.
    pub speculative: Speculative,
    /// CUDA graph capture batch sizes (empty = vLLM default).
    pub cudagraph_capture_sizes: Vec<u32>,
    /// Run without graph capture / compilation.
    pub enforce_eager: bool,
    /// Seconds `down` lets in-flight requests finish before killing (`--shutdown-timeout`).
    pub shutdown_timeout_s: u32,
    /// Seconds `down` / SIGTERM let the gateway's in-flight requests finish before the engine
    /// is stopped (new requests get 503 meanwhile).
    pub drain_timeout_s: u32,
    /// Seconds the gateway gives a connection to send a request's head (start line and headers),
    /// counted from the accept or the end of the previous response: also the idle keep-alive limit.
    pub header_timeout_s: u32,
    /// Seconds a request may wait in the gateway's queue for a slot before 503 + Retry-After.
    pub queue_wait_s: u32,
    /// Seconds to wait for `/health` after start.
    pub ready_timeout_s: u32,
    /// Seconds without a new engine log line while booting before the job is declared hung.
    pub hang_timeout_s: u32,
    /// Seconds a serving engine may fail its `/health` probe (or hold running requests with no
    /// new token) before it is declared stalled (0 = `engine.hang_timeout_s`).
    pub stall_timeout_s: u32,
    /// Extra arguments appended to `vllm serve`.
    pub extra_args: Vec<String>,
    /// Extra environment for every rank.
    pub extra_env: BTreeMap<String, String>,
}

impl Default for Engine {
    fn default() -> Self {
        Self {
            runtime: Runtime::Venv,
            venv: None,
            requirements: String::new(),
            docker_image: None,
            docker_mount_venv: false,
            vllm_version: String::new(),
            served_model_name: String::new(),
            host: "127.0.0.1".into(),
            port: 8000,
            internal_port: 0,
            master_port: 29501,
            api_keys: ApiKeys::default(),
            max_model_len: 4096,
            max_num_seqs: 16,
            max_num_batched_tokens: 2048,
            scheduling_policy: SchedulingPolicy::Fcfs,
            long_prefill_token_threshold: 0,
            kv_cache_bytes: ByteSize::gib(1),
            kv_bytes_per_token: 0.0,
            kv_cache_dtype: KvCacheDtype::Auto,
            block_size: 16,
            dtype: "auto".into(),
            quantization: String::new(),
            speculative: Speculative::default(),
            cudagraph_capture_sizes: Vec::new(),
            enforce_eager: false,
            shutdown_timeout_s: 30,
            drain_timeout_s: 30,
            header_timeout_s: 15,
            queue_wait_s: 30,
            ready_timeout_s: 1500,
            hang_timeout_s: 420,
            stall_timeout_s: 0,
            extra_args: Vec::new(),
            extra_env: BTreeMap::new(),
        }
    }
}

impl Engine {
    /// `internal_port`, or when 0, `port + 10000` (`port − 10000` above 55535).
    #[must_use]
    pub fn effective_internal_port(&self) -> u16 {
        match self.internal_port {
            0 if self.port > 55535 => self.port - 10000,
            0 => self.port + 10000,
            p => p,
        }
    }

    /// `stall_timeout_s`, or when 0, `hang_timeout_s`.
    #[must_use]
    pub fn effective_stall_timeout_s(&self) -> u32 {
        if self.stall_timeout_s == 0 {
            self.hang_timeout_s
        } else {
            self.stall_timeout_s
        }
    }
}

/// What the memory guard does at the hard floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "kebab-case")]
pub enum GuardPolicy {
    /// Stop the engine to protect the host unless another process is clearly to blame and sacrificable.
    #[default]
    ProtectHost,
    /// Kill the process that grew, engine or not.
    KillOffender,
    /// No action (not recommended on GB10).
    Off,
}

/// The memory guard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Guard {
    /// Action policy at the hard floor.
    pub policy: GuardPolicy,
    /// Below this MemAvailable: drop model page cache and warn.
    pub soft_floor: ByteSize,
    /// Below this MemAvailable: act per the policy.
    pub hard_floor: ByteSize,
    /// Process names that may be killed to save the engine.
    pub sacrificable: Vec<String>,
}

impl Default for Guard {
    fn default() -> Self {
        Self {
            policy: GuardPolicy::ProtectHost,
            soft_floor: ByteSize::gib(4),
            hard_floor: ByteSize::mib(2560),
            sacrificable: Vec::new(),
        }
    }
}

/// Memory policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Memory {
    /// MemAvailable required at boot on top of the rank's weights.
    pub boot_margin: ByteSize,
    /// Reserve for the OS, desktop and other processes, for `plan`.
    pub os_reserve: ByteSize,
    /// CUDA context, NCCL buffers and graphs per rank, for `plan`.
    pub runtime_overhead: ByteSize,
    /// The memory guard.
    pub guard: Guard,
}

impl Default for Memory {
    fn default() -> Self {
        Self {
            boot_margin: ByteSize::gib(2),
            os_reserve: ByteSize::gib(2),
            runtime_overhead: ByteSize::gib(1),
            guard: Guard::default(),
        }
    }
}

/// Paths on every node. `~` expands to the user's home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Paths {
    /// Hugging Face hub cache (default: `$HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`).
    pub hf_cache: Option<String>,
    /// Slim embed-only Engram directory.
    pub engram_dir: String,
    /// Generated models (tiny kits) and other spark-kit data.
    pub data_dir: String,
    /// Engine logs, receipts and the control socket.
    pub logs: String,
}

impl Default for Paths {
    fn default() -> Self {
        Self {
            hf_cache: None,
            engram_dir: "~/.cache/spark-kit/engram".into(),
            data_dir: "~/.cache/spark-kit/data".into(),
            logs: "~/.cache/spark-kit/logs".into(),
        }
    }
}
