//! Command-line definitions (clap derive). Doc comments here are the `--help` text.

use clap::{Args, Parser, Subcommand};

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
    /// (internal) The engine process: embedded Python running vLLM. Started by `up`.
    #[command(name = "__engine", hide = true)]
    Engine(EngineArgs),
    /// Check a checkpoint; `--structure` audits the EXL3 headers (K, codebook markers, shapes).
    Verify(VerifyArgs),
    /// Per-node memory plan: weights per rank, KV pool in tokens, headroom, boot margin, safe prompt.
    Plan(PlanArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell to generate for.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum KitCommand {
    /// Print a kit's YAML as written (built-in name or file path); redirect it to start your own kit.
    Show {
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
    #[command(flatten)]
    pub kit: KitArgs,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Also show the engine's log lines, tagged with the node name.
    #[arg(long, short)]
    pub verbose: bool,
    /// Seconds in-flight requests get to finish at shutdown (engine.shutdown_timeout_s).
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_timeout: Option<String>,
    #[command(flatten)]
    pub kit: KitArgs,
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
pub struct VerifyArgs {
    /// Header-only EXL3 structural audit: every packed matrix's trellis/suh/svh/marker, K vs the kit's k_map.
    #[arg(long)]
    pub structure: bool,
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
