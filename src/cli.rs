//! Command-line definitions (clap derive). Doc comments here are the `--help` text.

use clap::{Args, Parser, Subcommand};

pub mod values;

/// Serve DeepSeek V4.1 Flash (EXL3) across two DGX Spark nodes with one command.
///
/// Exit codes: 0 success, 1 runtime failure, 2 usage or configuration error.
#[derive(Debug, Parser)]
#[command(name = "spark-kit", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once per process; boxing the larger variants would only add noise.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// List the built-in launch kits.
    Kits {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Work with one launch kit.
    #[command(subcommand)]
    Kit(KitCommand),
    /// Show the effective configuration (all layers applied).
    Config(ConfigArgs),
    /// Create (or find) the kit's engine venv, cached by a hash of its requirements.
    Setup(SetupArgs),
    /// Bring the deployment up in the foreground; Ctrl-C or SIGTERM drains and stops it.
    Up(UpArgs),
    /// Show the running deployment: state, per-node engine, memory, health, tokens/s.
    Status(StatusArgs),
    /// Print (or follow) the engine logs of one or all nodes.
    Logs(LogsArgs),
    /// Stop the running deployment: drain, then kill the engines' process groups on every node.
    Down(ControlArgs),
    /// Validate the kit, then stop the running deployment and bring it up again (detached).
    Restart(UpArgs),
    /// (internal) The node agent: owns this node's engine, speaks JSON lines on stdin/stdout.
    #[command(name = "node", hide = true)]
    Node(NodeArgs),
    /// (internal) The engine process: embedded Python running vLLM. Started by `up`.
    #[command(name = "__engine", hide = true)]
    Engine(EngineArgs),
    /// (internal) Run a copy program (rsync) with the page cache of its files kept under a cap.
    #[command(name = "__cache-capped", hide = true)]
    CacheCapped(CacheCappedArgs),
    /// Download the kit's model and Engram files from the Hub into the HF cache, verified (resumable).
    Download(DownloadArgs),
    /// Check the downloaded files against spark-kit.lock (SHA-256; --fast: sizes); `--structure` audits the EXL3 headers.
    Verify(VerifyArgs),
    /// Pack this rank's Engram rows into local 264-byte-record shards (engram-l{layer}-r{rank}of{tp}.bin).
    #[command(name = "pack-engram")]
    PackEngram(PackEngramArgs),
    /// Per-node memory plan: weights per rank, KV pool in tokens, headroom, boot margin, safe prompt.
    Plan(PlanArgs),
    /// Check every node before `up`: GB10, driver parity, memory, disk, CX7 link/MTU/RoCE v2 GID, ssh, ports, clock.
    Preflight(PreflightArgs),
    /// Run the memory guard standalone next to an engine (the node agent runs it in-process).
    Guard(GuardArgs),
    /// The docker runtime's engine image (`engine.docker_image`) on every node.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Measure an OpenAI-compatible endpoint: TTFT, decode (per stream, aggregate), prefill; JSON, plot, receipt.
    Bench(BenchArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell to generate for.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Copy the head's image to every worker whose image id differs (docker save → resumable rsync → docker load; no registry).
    Sync(ImageSyncArgs),
    /// Make the engine image of a kit with engine.docker_mount_venv here, offline (a small rootfs; the venv is mounted).
    Build(ImageSyncArgs),
}

#[derive(Debug, Args)]
pub struct ImageSyncArgs {
    /// Print what happened per node as JSON ([{node, action, image_id}]).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Subcommand)]
pub enum KitCommand {
    /// Print a kit's YAML as written (built-in name or file path); redirect it to start your own kit.
    Show {
        /// Built-in kit name or path to a kit file (default: the 2x Spark kit).
        kit: Option<String>,
    },
    /// Validate every part of a kit; each problem says which commands need the key (a command
    /// itself checks only the parts it uses: `download` and `verify` need only `model`/`engram`).
    Check {
        /// Built-in kit name or path to a kit file (default: the 2x Spark kit).
        kit: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// List every effective value with its origin (default / kit file:line:col / env var / flag).
    #[arg(long)]
    pub explain: bool,
    /// Print JSON: with --explain an array of {key, value, origin}; else the effective kit.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Print a JSON summary ({requirements, key, python, path, seconds, cached}).
    #[arg(long)]
    pub json: bool,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
    /// Keep older venvs of the same requirement set (default: remove those no process uses).
    #[arg(long)]
    pub keep_old: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Also show the engine's log lines, tagged with the node name (local nodes).
    #[arg(long, short)]
    pub verbose: bool,
    /// Run the supervisor in the background; return once the endpoint is ready.
    #[arg(long, short)]
    pub detach: bool,
    /// Seconds in-flight requests get to finish at shutdown (engine.shutdown_timeout_s).
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_timeout: Option<String>,
    /// Start without the preflight checks on every node (they stop the bring-up on a failure).
    #[arg(long)]
    pub skip_preflight: bool,
    /// First remove what an earlier run of this kit left on the nodes (docker: its containers, found by label).
    #[arg(long)]
    pub replace: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the status snapshot as JSON (schema in docs/operations.md).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Only this node (name from the kit).
    #[arg(long)]
    pub node: Option<String>,
    /// Keep printing new lines.
    #[arg(long, short)]
    pub follow: bool,
    /// Lines of history to print first.
    #[arg(long, short = 'n', default_value_t = 50)]
    pub lines: usize,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// This node's rank (head = 0).
    #[arg(long)]
    pub rank: usize,
}

#[derive(Debug, Args)]
pub struct EngineArgs {
    /// The engine venv.
    #[arg(long)]
    pub venv: std::path::PathBuf,
    /// Seconds between SIGTERM and SIGKILL of the group when the parent dies.
    #[arg(long, default_value_t = 30)]
    pub grace: u64,
    /// Arguments for `vllm` (after `--`).
    #[arg(last = true, required = true)]
    pub vllm: Vec<String>,
}

#[derive(Debug, Args)]
pub struct CacheCappedArgs {
    /// Page cache (bytes) the program's files may keep.
    #[arg(long)]
    pub cap: u64,
    /// The program and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub argv: Vec<String>,
}

/// Which repo `download --only` fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Only {
    /// The model repo (every file at the pinned revision).
    Model,
    /// The Engram files (and the slim embed-only directory).
    Engram,
}

#[derive(Debug, Args)]
pub struct DownloadArgs {
    /// Fetch only the model repo or only the Engram files.
    #[arg(long, value_enum)]
    pub only: Option<Only>,
    /// Concurrent range requests across all files.
    #[arg(long, default_value_t = 16, value_parser = values::download_jobs)]
    pub jobs: usize,
    /// Show what would be fetched (files, sizes, what is cached) without downloading.
    #[arg(long)]
    pub dry_run: bool,
    /// Re-hash the files already in the cache before reusing them; a corrupt one is moved aside
    /// and fetched again (without it, a cached file is reused when its size matches).
    #[arg(long, conflicts_with = "dry_run")]
    pub verify_cached: bool,
    /// Print a JSON summary (files, bytes, seconds, retries, resumed bytes) on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
    /// Seconds without a byte before a range request is abandoned and retried.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = values::idle_timeout)]
    pub idle_timeout: u64,
    /// Attempts per range request (the count restarts whenever bytes arrive).
    #[arg(long, default_value_t = 8, value_parser = values::retries)]
    pub retries: u32,
    /// Bytes per range request.
    #[arg(long, value_name = "BYTES", default_value = "32MiB", hide = true, value_parser = values::range_size)]
    pub range_size: crate::kit::bytes::ByteSize,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Header-only EXL3 structural audit: every packed matrix's trellis/suh/svh/marker, K vs the kit's k_map.
    #[arg(long)]
    pub structure: bool,
    /// The structural audit, then decode a sample of 128x128 blocks of every packed matrix and check the
    /// weights are finite and sanely scaled (catches a broken pack before a long boot).
    #[arg(long, conflicts_with_all = ["fast", "jobs", "virtual"])]
    pub decode: bool,
    /// With --decode: 128x128 blocks (64 tiles each) decoded per matrix.
    #[arg(long, value_name = "N", requires = "decode", default_value_t = 2)]
    pub decode_blocks: usize,
    /// Lock-file check of sizes and presence only (no hashing).
    #[arg(long, conflicts_with = "structure")]
    pub fast: bool,
    /// Fix what fails: move each bad file's blob aside (`<blob>.spark-bad`) and fetch it again at
    /// the commit the lock file recorded, then check it again.
    #[arg(long, conflicts_with_all = ["structure", "decode", "json"])]
    pub repair: bool,
    /// Files hashed in parallel (default: the number of CPUs, at most 8).
    #[arg(long, value_name = "N", conflicts_with = "structure")]
    pub jobs: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Checkpoint directory (or one .safetensors file); default: the kit's model.path.
    #[arg(long, value_name = "DIR")]
    pub model: Option<std::path::PathBuf>,
    /// Audit the modelled DeepSeek V4.1 Flash EXL3 checkpoint (shapes only, no files).
    #[arg(long = "virtual", conflicts_with = "model")]
    pub r#virtual: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct PackEngramArgs {
    /// Pack only this rank (default: every rank of tensor_parallel_size; on two nodes run
    /// `--rank 0` on the head and `--rank 1` on the worker).
    #[arg(long, value_name = "R")]
    pub rank: Option<u32>,
    /// The slim Engram directory (default: the kit's paths.engram_dir).
    #[arg(long, value_name = "DIR")]
    pub src: Option<std::path::PathBuf>,
    /// Where the packed shards go (default: <paths.data_dir>/<kit name>/engram-packed).
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
    /// Print a JSON summary of every shard on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// Checkpoint directory for the weight budget; default: the kit's model.path, else the modelled
    /// DeepSeek V4.1 Flash EXL3 checkpoint for kits that serve it.
    #[arg(long, value_name = "DIR")]
    pub model: Option<std::path::PathBuf>,
    /// Use the modelled DeepSeek V4.1 Flash EXL3 checkpoint (shapes only, no files).
    #[arg(long = "virtual", conflicts_with = "model")]
    pub r#virtual: bool,
    /// Measure this machine's MemTotal/MemAvailable (/proc/meminfo) for the kit's local node.
    #[arg(long)]
    pub measure: bool,
    /// `1`: the single-Spark answer (the head node alone at TP 1: weights as is and with lower K maps, KV at 128k/600k/1M per KV record).
    #[arg(long, value_name = "N")]
    pub nodes: Option<u32>,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub run: BenchRunArgs,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Print two results side by side with B/A ratios.
    Compare {
        /// The baseline result (JSON written by `spark-kit bench --json`).
        a: std::path::PathBuf,
        /// The result compared with it.
        b: std::path::PathBuf,
        /// Print the rows as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A published table `bench --audit` replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuditTable {
    /// The reference kit's decode and prefill tables (docs/bench.md, "Audit").
    Reference,
}

#[derive(Debug, Args)]
pub struct BenchRunArgs {
    /// Server base URL, e.g. http://127.0.0.1:8000 (default: the kit's engine host and port).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Replay a published table row by row (its shapes scaled on small kits) instead of the
    /// default load; --decode-repeats and --prefill-repeats set the samples per row.
    #[arg(long, value_name = "TABLE", value_enum, conflicts_with_all = ["concurrency", "prefill", "decode_tokens", "decode_prompt_tokens"])]
    pub audit: Option<AuditTable>,
    /// Model id to request (default: the kit's served_model_name, else the only model listed).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// Concurrency levels of the decode waves, run in ascending order.
    #[arg(long, value_name = "N,N,...", default_value = "1,2,4")]
    pub concurrency: String,
    /// Prompt lengths of the prefill ladder (k = 1024 tokens), or `none`. Default 1k,4k,16k,64k,
    /// leaving out lengths above the model's max_model_len.
    #[arg(long, value_name = "LEN,LEN,...")]
    pub prefill: Option<String>,
    /// Requests per prefill length.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = values::prefill_repeats)]
    pub prefill_repeats: u32,
    /// Tokens generated per decode stream (default 256, less if max_model_len is smaller).
    #[arg(long, value_name = "N", value_parser = values::decode_tokens)]
    pub decode_tokens: Option<u64>,
    /// Prompt length of decode streams in tokens (default 256, less if max_model_len is smaller).
    #[arg(long, value_name = "N", value_parser = values::decode_prompt_tokens)]
    pub decode_prompt_tokens: Option<u64>,
    /// Waves per concurrency level, run back to back (more samples on a noisy host).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = values::decode_repeats)]
    pub decode_repeats: u32,
    /// Seconds one decode request may take (prefill: min(2700, 60 + 0.008 x tokens)).
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0, value_parser = values::bench_timeout)]
    pub timeout: f64,
    /// Let the model think (sent as chat_template_kwargs); off by default, as in the reference numbers.
    #[arg(long)]
    pub thinking: bool,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.0, value_parser = values::temperature)]
    pub temperature: f64,
    /// Environment variable holding the API key (sent as Authorization: Bearer; never printed).
    #[arg(long, value_name = "NAME", conflicts_with = "api_key_file")]
    pub api_key_env: Option<String>,
    /// File whose first non-empty line is the API key.
    #[arg(long, value_name = "PATH")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Write the versioned JSON result here (`-` = stdout instead of the table).
    #[arg(long, value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,
    /// Draw decode vs concurrency and prefill vs length to this .svg or .png file.
    #[arg(long, value_name = "PATH")]
    pub plot: Option<std::path::PathBuf>,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// Print the report as JSON ({kit, status, checks: [{node, id, verdict, message, fix}]}).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct GuardArgs {
    /// Process group of the engine: stopped (drain, then kill) when it grew or to protect the host.
    #[arg(long, value_name = "PGID", conflicts_with = "container")]
    pub pgid: Option<i32>,
    /// The engine's container (name or id; docker runtime): attributed by its cgroup, stopped with `docker kill --signal`.
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,
    /// Soft floor on MemAvailable, e.g. 4GiB (memory.guard.soft_floor): drop model page cache, warn.
    #[arg(long, value_name = "SIZE", value_parser = values::guard_soft)]
    pub soft: Option<u64>,
    /// Hard floor on MemAvailable, e.g. 2.5GiB (memory.guard.hard_floor): act per the policy.
    #[arg(long, value_name = "SIZE", value_parser = values::guard_hard)]
    pub hard: Option<u64>,
    /// protect-host, kill-offender or off (memory.guard.policy).
    #[arg(long, value_name = "POLICY", value_parser = values::guard_policy)]
    pub policy: Option<crate::kit::schema::GuardPolicy>,
    /// Directory for the JSON receipts (default: the kit's paths.logs/guard).
    #[arg(long, value_name = "DIR")]
    pub receipts: Option<std::path::PathBuf>,
    /// A process name (comm; `prefix*`) that may be killed to save the engine; repeatable (memory.guard.sacrificable).
    #[arg(long = "sacrificable", value_name = "NAME")]
    pub sacrificable: Vec<String>,
    /// Model directory or file whose page cache the soft floor drops; repeatable (default: model.path, else the repo in the HF cache).
    #[arg(long = "model", value_name = "PATH")]
    pub model: Vec<std::path::PathBuf>,
    /// Only descendants of this pid may be killed as offenders (a safety scope on shared hosts).
    #[arg(long, value_name = "PID")]
    pub victims_under: Option<i32>,
    /// Seconds between SIGTERM and SIGKILL of the engine group (default: engine.shutdown_timeout_s, at most 10).
    #[arg(long, value_name = "SECONDS", value_parser = values::drain)]
    pub drain: Option<f64>,
    /// The node's idle MemAvailable for the restart gate (default: measured at start if no engine runs).
    #[arg(long, value_name = "SIZE", value_parser = values::guard_baseline)]
    pub baseline: Option<u64>,
    /// One JSON object per event on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kit: KitArgs,
}

/// Kit selection and overrides, shared by every command that reads a kit.
#[derive(Debug, Args, Default, Clone)]
pub struct KitArgs {
    /// Built-in kit name or path to a kit file.
    #[arg(long, value_name = "KIT")]
    pub kit: Option<String>,
    /// Override any kit key (dotted), e.g. --set engine.port=9000; repeatable, highest precedence.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// API port (engine.port).
    #[arg(long)]
    pub port: Option<String>,
    /// Address the API binds to (engine.host).
    #[arg(long)]
    pub host: Option<String>,
    /// Model name clients use (engine.served_model_name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Longest sequence in tokens (engine.max_model_len).
    #[arg(long)]
    pub max_model_len: Option<String>,
    /// Most sequences in flight (engine.max_num_seqs).
    #[arg(long)]
    pub max_num_seqs: Option<String>,
    /// Token budget of one scheduler step (engine.max_num_batched_tokens).
    #[arg(long)]
    pub max_num_batched_tokens: Option<String>,
    /// KV cache pool per rank, e.g. 2.5GiB (engine.kv_cache_bytes).
    #[arg(long)]
    pub kv_cache_bytes: Option<String>,
    /// Tensor-parallel size (tensor_parallel_size).
    #[arg(long)]
    pub tensor_parallel_size: Option<String>,
}

impl KitArgs {
    /// The common flags as (flag, dotted key, value), in a fixed order.
    #[must_use]
    pub fn common(&self) -> Vec<(&'static str, &'static str, &str)> {
        let pairs: [(&'static str, &'static str, &Option<String>); 8] = [
            ("--port", "engine.port", &self.port),
            ("--host", "engine.host", &self.host),
            ("--served-model-name", "engine.served_model_name", &self.served_model_name),
            ("--max-model-len", "engine.max_model_len", &self.max_model_len),
            ("--max-num-seqs", "engine.max_num_seqs", &self.max_num_seqs),
            ("--max-num-batched-tokens", "engine.max_num_batched_tokens", &self.max_num_batched_tokens),
            ("--kv-cache-bytes", "engine.kv_cache_bytes", &self.kv_cache_bytes),
            ("--tensor-parallel-size", "tensor_parallel_size", &self.tensor_parallel_size),
        ];
        pairs.into_iter().filter_map(|(flag, key, v)| v.as_deref().map(|v| (flag, key, v))).collect()
    }
}
