//! Every environment variable spark-kit reads, passes on or sets, in one table: the name, who
//! uses it, what it means and its default. `docs/configuration.md` ("Environment variables") is
//! generated from [`VARS`] by [`markdown`]; `tests/rules/envvars.rs` fails when the docs differ or when
//! `src/` or the Python overlay (`python_overlay/spark_overlay`, `python_overlay/tools`) names a
//! variable this table does not list.
//!
//! The process environment is read once, in `main`, and handed to commands as pairs; the modules
//! named below look variables up in those pairs. A name ending in `*` is a family (a prefix).

/// How spark-kit uses a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// spark-kit reads it from its own environment.
    Read,
    /// Passed on from spark-kit's environment to a child (the engine, the docker client).
    Passed,
    /// spark-kit sets it in the engine's environment (the engine or the overlay reads it).
    Set,
    /// Read when spark-kit is compiled.
    Build,
    /// The Python overlay reads it inside the engine (from what spark-kit sets or passes, or the user's shell).
    Overlay,
    /// An overlay tool (`python_overlay/tools/`) sets it for its own process.
    Tool,
}

impl Use {
    /// The word in the docs table.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Passed => "passed to the engine",
            Self::Set => "set for the engine",
            Self::Build => "build time",
            Self::Overlay => "read by the overlay",
            Self::Tool => "set by an overlay tool",
        }
    }
}

/// One variable (or family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvVar {
    pub name: &'static str,
    pub uses: &'static [Use],
    /// The modules that look it up or set it.
    pub by: &'static str,
    pub meaning: &'static str,
    /// Empty: no default (unset means "not given").
    pub default: &'static str,
}

const fn var(
    name: &'static str,
    uses: &'static [Use],
    by: &'static str,
    meaning: &'static str,
    default: &'static str,
) -> EnvVar {
    EnvVar { name, uses, by, meaning, default }
}

use Use::{Build, Overlay, Passed, Read, Set, Tool};

/// The registry, grouped: spark-kit's own, Hugging Face, docker, the engine's, build time.
pub const VARS: &[EnvVar] = &[
    var(
        "SPARK_KIT_*",
        &[Read],
        "kit::layers",
        "a kit key, `__` between levels (`SPARK_KIT_ENGINE__PORT=9999`, `SPARK_KIT_NODES__1__SSH_HOST=b`); any other `SPARK_KIT_*` name is an error",
        "the kit file's value",
    ),
    var(
        "SPARK_KIT_CACHE",
        &[Read],
        "dirs",
        "cache root (venvs, overlay, logs by default)",
        "`$XDG_CACHE_HOME/spark-kit`, else `~/.cache/spark-kit`",
    ),
    var("SPARK_KIT_LOG", &[Read], "kit::layers", "reserved for log verbosity (not a kit key)", ""),
    var("SPARK_KIT_TEST_*", &[Read], "kit::layers", "used by the test suite only (not a kit key)", ""),
    var(
        "HOME",
        &[Read, Passed],
        "dirs, hub::auth, engine::process",
        "home directory: `~` in kit paths, default caches",
        "none: unset is an error (exit 2) naming the fix",
    ),
    var(
        "XDG_CACHE_HOME",
        &[Read],
        "dirs, deploy::hf",
        "base of the spark-kit and Hugging Face caches",
        "`~/.cache`",
    ),
    var(
        "HF_HOME",
        &[Read],
        "deploy::hf, hub::auth",
        "Hugging Face home (hub cache under `hub/`, token file)",
        "`$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`",
    ),
    var(
        "HF_HUB_CACHE",
        &[Read],
        "deploy::hf",
        "Hugging Face hub cache, unless the kit sets `paths.hf_cache`",
        "`$HF_HOME/hub`",
    ),
    var("HF_ENDPOINT", &[Read], "hub", "Hub base URL (trailing `/` removed)", "`https://huggingface.co`"),
    var("HF_TOKEN", &[Read], "hub::auth, hub::api", "Hub access token", "the token file"),
    var("HF_TOKEN_PATH", &[Read], "hub::auth", "the token file", "`$HF_HOME/token`"),
    var(
        "HF_HUB_DISABLE_IMPLICIT_TOKEN",
        &[Read],
        "hub::auth",
        "`1`/`true`/`yes`/`on`: send no token at all",
        "unset (a token is sent when found)",
    ),
    var(
        "DOCKER_HOST",
        &[Passed],
        "runtime::docker::container",
        "which daemon the docker client talks to (runtime `docker`)",
        "docker's default",
    ),
    var("DOCKER_CONTEXT", &[Passed], "runtime::docker::container", "docker client context", "docker's default"),
    var("DOCKER_CONFIG", &[Passed], "runtime::docker::container", "docker client config directory", "`~/.docker`"),
    var("DOCKER_CERT_PATH", &[Passed], "runtime::docker::container", "docker client TLS certificates", ""),
    var("DOCKER_TLS_VERIFY", &[Passed], "runtime::docker::container", "docker client TLS verification", ""),
    var("PATH", &[Passed], "engine::process", "passed to a venv engine (with the rest of this group, nothing else is)", ""),
    var("LANG", &[Passed], "engine::process", "passed to a venv engine", ""),
    var("LC_ALL", &[Passed], "engine::process, node::probe", "passed to a venv engine; `C` for node probes", ""),
    var("TERM", &[Passed], "engine::process", "passed to a venv engine", ""),
    var("USER", &[Passed], "engine::process", "passed to a venv engine", ""),
    var("LOGNAME", &[Passed], "engine::process", "passed to a venv engine", ""),
    var("TMPDIR", &[Passed], "engine::process", "passed to a venv engine", ""),
    var("HF_HUB_OFFLINE", &[Set], "engine::argv", "the engine never reaches the Hub (weights are local)", "`1`"),
    var("TRANSFORMERS_OFFLINE", &[Set], "engine::argv", "as `HF_HUB_OFFLINE`, for transformers", "`1`"),
    var("VLLM_NO_USAGE_STATS", &[Set], "engine::argv", "no usage reporting", "`1`"),
    var("DO_NOT_TRACK", &[Set], "engine::argv", "no telemetry", "`1`"),
    var("PYTHONUNBUFFERED", &[Set], "engine::argv", "engine logs arrive line by line", "`1`"),
    var(
        "PYTHONPATH",
        &[Set],
        "engine::argv, runtime::docker::run",
        "the spark-kit overlay (the vLLM plugin)",
        "the overlay directory",
    ),
    var(
        "VLLM_HOST_IP",
        &[Set],
        "engine::argv",
        "the node's address for vLLM's distributed setup",
        "`nodes[].fabric.ipv4`, else `127.0.0.1`",
    ),
    var("NCCL_SOCKET_IFNAME", &[Set], "engine::argv", "NCCL's network interface", "`nodes[].fabric.interface`"),
    var("GLOO_SOCKET_IFNAME", &[Set], "engine::argv", "Gloo's network interface", "`nodes[].fabric.interface`"),
    var("NCCL_IB_HCA", &[Set], "engine::argv", "NCCL's RDMA device(s)", "`nodes[].fabric.hca`"),
    var(
        "NCCL_BUFFSIZE",
        &[Set],
        "plan::nccl",
        "NCCL pinned-buffer knob the Spark kits set in `engine.extra_env`; `plan` counts NCCL's pinned memory from it",
        "`1048576` (reference-kit.md A.2)",
    ),
    var(
        "NCCL_LL128_BUFFSIZE",
        &[Set],
        "plan::nccl",
        "NCCL pinned-buffer knob the Spark kits set in `engine.extra_env`; `plan` counts NCCL's pinned memory from it",
        "`262144` (reference-kit.md A.2)",
    ),
    var(
        "NCCL_PROTO",
        &[Set],
        "plan::nccl",
        "NCCL pinned-buffer knob the Spark kits set in `engine.extra_env`; `plan` counts NCCL's pinned memory from it",
        "`^LL128` (reference-kit.md A.2)",
    ),
    var(
        "NCCL_MAX_NCHANNELS",
        &[Set],
        "plan::nccl",
        "NCCL pinned-buffer knob the Spark kits set in `engine.extra_env`; `plan` counts NCCL's pinned memory from it",
        "`8` (reference-kit.md A.2)",
    ),
    var(
        "NCCL_IB_GID_INDEX",
        &[Set],
        "node::preflight",
        "RoCE GID index; preflight checks the value the kit sets (`engine.extra_env` / `nodes[].env`)",
        "NCCL's choice",
    ),
    var(
        "VLLM_API_KEY",
        &[Set],
        "agent::run",
        "the key vLLM requires, from `engine.api_keys` (the variable `engine.api_keys.env` names is read)",
        "unset (no key)",
    ),
    var(
        "SPARK_ENGRAM_DIR",
        &[Set, Overlay],
        "engram; overlay engram.hook",
        "the slim Engram directory the overlay reads",
        "`paths.engram_dir`",
    ),
    var(
        "SPARK_ENGRAM_PACKED_DIR",
        &[Set, Overlay],
        "engram; overlay engram.hook",
        "packed per-rank Engram shards (only when some exist)",
        "unset",
    ),
    var(
        "SPARK_ENGRAM",
        &[Overlay],
        "overlay engram.hook",
        "`0`/`off`/`false`: vLLM's stock Engram table instead of file-backed rows",
        "file-backed rows",
    ),
    var("SPARK_ENGRAM_IO_THREADS", &[Overlay], "overlay engram.hook", "threads reading Engram rows (1..256)", "`16`"),
    var("SPARK_ENGRAM_DIRECT", &[Overlay], "overlay engram.hook", "`1`: Engram rows read with O_DIRECT; `0`: buffered", "`1`"),
    var(
        "SPARK_ENGRAM_RESIDENT_SCALES",
        &[Overlay],
        "overlay engram.hook",
        "`1`: packed Engram scales kept in memory",
        "`0`",
    ),
    var(
        "SPARK_EXL3_MOE_COOP",
        &[Overlay],
        "overlay exl3.backends.select",
        "EXL3 decode-sized calls: `own` spark-kit's own decode kernels, MoE calls of 1-64 rows on sm_80+ (tensor-core GEMVs; 1-4 rows below) and dense linear calls of up to 32 rows on sm_80+ (8 where the output is wider than the input; MUL1, K 2-6); exllamav3's, with a warning, where they cannot run or a layer's load-time check disagrees (set explicitly, a disagreement fails the load); `1` exllamav3's kernels (MoE: its decode kernel in launches of up to 42 rows; linears: `exl3_gemm`); `0` the sorted `exl3_moe` kernels and `exl3_gemm`",
        "`own`",
    ),
    var(
        "VLLM_PROCESS_NAME_PREFIX",
        &[Overlay],
        "overlay plugin",
        "vLLM's process-title prefix; the overlay's logs name the process role from it",
        "`VLLM`",
    ),
    var("TOKENIZERS_PARALLELISM", &[Tool], "tools/make_tiny_model.py", "tokenizer training single-threaded", "`false`"),
    var("RAYON_NUM_THREADS", &[Tool], "tools/make_tiny_model.py", "as `TOKENIZERS_PARALLELISM`", "`1`"),
    var("OMP_NUM_THREADS", &[Tool], "tools/make_tiny_model.py", "torch threads while making the tiny model", "`1`"),
    var(
        "SPARKKIT_BUILD_PYTHON",
        &[Build],
        "runtime::venv::build (set by build.rs)",
        "the Python the embedded interpreter was built against",
        "",
    ),
    var("SPARKKIT_BUILD_PYTHON_VERSION", &[Build], "runtime::venv::build (set by build.rs)", "its version", ""),
    var("PYO3_PYTHON", &[Build], "build.rs", "the Python to build against", "`python3`"),
];

/// The registry entry for `name` (exact, or the longest family a `*` entry names).
#[must_use]
pub fn find(name: &str) -> Option<&'static EnvVar> {
    VARS.iter().find(|v| v.name == name).or_else(|| {
        VARS.iter()
            .filter_map(|v| Some((v, v.name.strip_suffix('*')?)))
            .filter(|(_, p)| name.starts_with(p))
            .max_by_key(|(_, p)| p.len())
            .map(|(v, _)| v)
    })
}

/// Begin and end markers of the generated section in docs/configuration.md.
pub const DOC_BEGIN: &str = "<!-- envvars: generated from src/envvars.rs; do not edit by hand -->";
pub const DOC_END: &str = "<!-- envvars: end -->";

/// The "Environment variables" section of docs/configuration.md, markers included.
#[must_use]
pub fn markdown() -> String {
    let mut s = format!("{DOC_BEGIN}\n## Environment variables\n\n");
    s.push_str(
        "Every variable spark-kit reads, passes on to the engine or sets for it (`src/envvars.rs`; \
         regenerate this section with `SPARK_KIT_TEST_BLESS=1 cargo test --test rules envvars::`). \
         Besides these, the variable that `engine.api_keys.env` names is read for the API key(s).\n\n",
    );
    s.push_str("| variable | use | who | meaning | default |\n|---|---|---|---|---|\n");
    for v in VARS {
        let uses: Vec<&str> = v.uses.iter().map(|u| u.label()).collect();
        let name = v.name.strip_suffix('*').map_or_else(|| format!("`{}`", v.name), |p| format!("`{p}*`"));
        let default = if v.default.is_empty() { "—" } else { v.default };
        s.push_str(&format!("| {name} | {} | {} | {} | {default} |\n", uses.join(", "), v.by, v.meaning));
    }
    s.push_str(DOC_END);
    s.push('\n');
    s
}

/// `doc` with its generated section replaced by `section` (appended when the markers are missing).
#[must_use]
pub fn splice(doc: &str, section: &str) -> String {
    match (doc.find(DOC_BEGIN), doc.find(DOC_END)) {
        (Some(b), Some(e)) if e > b => {
            let after = &doc[e + DOC_END.len()..];
            format!("{}{section}{}", &doc[..b], after.strip_prefix('\n').unwrap_or(after))
        }
        _ => format!("{}\n\n{section}", doc.trim_end()),
    }
}

/// The part of `doc` outside the generated section (the kit reference, generated elsewhere).
#[must_use]
pub fn without_section(doc: &str) -> String {
    match (doc.find(DOC_BEGIN), doc.find(DOC_END)) {
        (Some(b), Some(e)) if e > b => {
            let after = &doc[e + DOC_END.len()..];
            format!("{}{}", doc[..b].trim_end_matches('\n'), after.strip_prefix('\n').unwrap_or(after))
        }
        _ => doc.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_families_match_by_prefix() {
        let mut names: Vec<&str> = VARS.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARS.len());
        assert_eq!(find("SPARK_KIT_ENGINE__PORT").map(|v| v.name), Some("SPARK_KIT_*"));
        assert_eq!(find("SPARK_KIT_TEST_BLESS").map(|v| v.name), Some("SPARK_KIT_TEST_*"));
        assert_eq!(find("HF_HOME").map(|v| v.name), Some("HF_HOME"));
        assert!(find("NOT_A_VAR").is_none());
    }

    #[test]
    fn the_section_is_spliced_between_markers() {
        let doc = "# Kit\n\ntable\n";
        let once = splice(doc, &markdown());
        assert!(once.starts_with("# Kit\n\ntable\n\n<!-- envvars"), "{once}");
        assert_eq!(splice(&once, &markdown()), once);
        assert_eq!(without_section(&once), "# Kit\n\ntable");
        assert!(markdown().contains("| `HF_TOKEN` | read | hub::auth, hub::api | Hub access token | the token file |"));
    }
}
