//! The versioned JSON result of `spark-kit bench` (documented in docs/bench.md; its JSON Schema is
//! docs/bench-result.schema.json, generated from these types).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::audit::Audit;
use super::metrics::Summary;
use super::spec::SpecCounts;

/// Value of the `format` field.
pub const FORMAT: &str = "spark-kit-bench";
/// Value of the `version` field; bumped on any incompatible change.
pub const VERSION: u32 = 1;

/// One benchmark run: what was measured, how, where and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchResult {
    /// Always `spark-kit-bench`.
    #[schemars(regex(pattern = r"^spark-kit-bench$"))]
    pub format: String,
    /// Format version (this document describes version 1).
    #[schemars(range(min = 1, max = 1))]
    pub version: u32,
    /// Who measured what, where and when.
    pub receipt: Receipt,
    /// The load that was applied.
    pub settings: Settings,
    /// TTFT of tiny prompts, subtracted from prefill TTFTs.
    pub calibration: Calibration,
    /// Decode waves in the order they ran: ascending concurrency, `settings.decode_repeats`
    /// waves per level.
    pub decode: Vec<Wave>,
    /// Prefill ladder, ascending prompt length.
    pub prefill: Vec<PrefillStep>,
    /// Requests that failed, across all phases (empty for a clean run).
    pub failures: Vec<Failure>,
    /// `bench --audit TABLE`: a published table replayed row by row (docs/bench.md); absent
    /// for an ordinary run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<Audit>,
}

/// Provenance, so a third party can compare their numbers with these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// spark-kit version that measured.
    pub spark_kit_version: String,
    /// The kit the endpoint came from (`--kit`), if any.
    pub kit: Option<KitReceipt>,
    /// What the kit's `spark-kit.lock` pins (checkpoint files, engine image), with `--kit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<LockReceipt>,
    /// Base URL measured (without `/v1`).
    pub endpoint: String,
    /// `version` from the server's `GET /version` (vLLM), if it answers.
    pub server_version: Option<String>,
    /// The model measured, as listed by `GET /v1/models`.
    pub model: ModelReceipt,
    /// The machine that ran the benchmark client (not necessarily the server).
    pub host: Host,
    /// UTC start and end, RFC 3339.
    pub started_at: String,
    pub finished_at: String,
    /// Wall time of the whole run in seconds.
    pub duration_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KitReceipt {
    pub name: String,
    /// SHA-256 (hex) of the effective kit (all layers applied) as canonical JSON.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
}

impl KitReceipt {
    /// The receipt of an effective kit: its name and the SHA-256 of its JSON.
    pub fn of(kit: &crate::kit::Kit) -> Result<Self, serde_json::Error> {
        use sha2::{Digest, Sha256};
        let bytes = serde_json::to_vec(kit)?;
        Ok(Self { name: kit.name.clone(), sha256: crate::hex::encode(&Sha256::digest(&bytes)) })
    }
}

/// The kit's `spark-kit.lock` as read at the start of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LockReceipt {
    /// The lock file's path.
    pub path: String,
    /// Why it could not be read (e.g. nothing downloaded yet: a locally made checkpoint); then
    /// `files` and `images` are empty.
    pub error: Option<String>,
    /// The checkpoint's files as `download` verified them.
    pub files: Vec<LockedFile>,
    /// Engine images as first seen on every node (docker kits): `{image, id}` (id = sha256 digest).
    pub images: Vec<LockedImage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LockedFile {
    pub repo: String,
    pub commit: String,
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LockedImage {
    pub image: String,
    pub id: String,
    pub vllm_version: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelReceipt {
    /// Model id used in requests.
    pub id: String,
    /// `root` (what the served name points at), if listed.
    pub root: Option<String>,
    /// `max_model_len`, if listed.
    pub max_model_len: Option<u64>,
}

/// Facts about the client machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub hostname: Option<String>,
    /// `PRETTY_NAME` from /etc/os-release.
    pub os: Option<String>,
    pub kernel: Option<String>,
    pub arch: String,
    /// CPU model name from /proc/cpuinfo.
    pub cpu: Option<String>,
    /// Logical CPUs available to the process.
    pub cpus: Option<u64>,
    /// MemTotal in bytes.
    pub memory_bytes: Option<u64>,
}

/// The applied load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Concurrency levels of the decode waves, ascending.
    pub concurrency: Vec<u32>,
    /// Tokens generated per decode stream (`max_tokens`, and `min_tokens` when accepted).
    pub decode_tokens: u64,
    /// Prompt length of the decode streams, in tokens.
    pub decode_prompt_tokens: u64,
    /// Waves per concurrency level, run back to back (absent = 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    #[schemars(range(min = 1))]
    pub decode_repeats: u32,
    /// Prompt lengths of the prefill ladder, ascending (tokens).
    pub prefill_lengths: Vec<u64>,
    /// Requests per prefill length.
    pub prefill_repeats: u32,
    /// `max_tokens` of prefill and calibration requests.
    pub prefill_max_tokens: u64,
    /// Prompt length of the calibration requests (tokens).
    pub calibration_prompt_tokens: u64,
    pub temperature: f64,
    /// Whether the model was asked to think (`chat_template_kwargs`).
    pub thinking: bool,
    /// Whether the server accepted the vendor parameters (`ignore_eos`, `min_tokens`,
    /// `chat_template_kwargs`); false = they were rejected with HTTP 400 and dropped, so
    /// decode lengths may vary.
    pub vendor_params: bool,
    /// Whether prompt lengths were checked with the server's `/tokenize`.
    pub tokenize: bool,
    /// Timeout of one decode request in seconds (prefill: min(2700, 60 + 0.008 × tokens)).
    pub request_timeout_s: f64,
    /// Whether the server's `/metrics` had vLLM's spec-decode counters: true = the engine
    /// speculates and each wave has `spec_decode`; false = `/metrics` answered without them (no
    /// speculation: one token per step); absent = `/metrics` did not answer (unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_decode_counters: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// The tiny-prompt requests (their TTFTs give the overhead).
    pub requests: Vec<Request>,
    /// Median TTFT of `requests`: the overhead subtracted from prefill TTFTs.
    pub overhead_s: f64,
}

/// One finished request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Seconds from the start of the run to sending, first and last text delta.
    pub sent_s: f64,
    pub first_s: f64,
    pub last_s: f64,
    /// `first_s − sent_s`.
    pub ttft_s: f64,
    /// (completion_tokens − 1) / (last_s − first_s); null with fewer than two tokens.
    pub decode_tok_s: Option<f64>,
    /// From the streamed usage block.
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    /// SSE events that carried text (for reference only; never used as a token count).
    pub text_events: u64,
    pub finish_reason: Option<String>,
}

/// `c` streams started together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Wave {
    #[schemars(range(min = 1))]
    pub concurrency: u32,
    /// Σ (completion_tokens − 1) / (max last − min first) over the wave's streams.
    pub aggregate_tok_s: Option<f64>,
    /// Per-stream decode tok/s.
    pub decode_tok_s: Option<Summary>,
    pub ttft_s: Option<Summary>,
    pub requests: Vec<Request>,
    pub failed: u32,
    /// Change of vLLM's spec-decode counters over the wave (`/metrics`, docs/bench.md); absent
    /// when the engine exposes none (it does not speculate, or `/metrics` did not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_decode: Option<SpecCounts>,
}

/// Requests of one prompt length, run one at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrefillStep {
    /// Requested prompt length in tokens.
    pub target_tokens: u64,
    /// Prefill tok/s of each request: (prompt − cached tokens) / (TTFT − overhead).
    pub prefill_tok_s: Option<Summary>,
    pub ttft_s: Option<Summary>,
    pub requests: Vec<Request>,
    pub failed: u32,
    /// Why the step did not run (e.g. longer than the model's max_model_len), else null.
    pub skipped: Option<String>,
}

/// A request that did not complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    /// `warmup`, `calibration`, `decode c=N` or `prefill N`.
    pub phase: String,
    pub error: String,
}

fn one() -> u32 {
    1
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_one(n: &u32) -> bool {
    *n == 1
}

/// The JSON Schema of [`BenchResult`], pretty-printed (what docs/bench-result.schema.json holds).
#[must_use]
pub fn schema_json() -> String {
    let schema = schemars::schema_for!(BenchResult);
    // A schema built from plain serde types always serializes.
    let mut s = serde_json::to_string_pretty(&schema).unwrap_or_default();
    s.push('\n');
    s
}

/// Why a result file cannot be read (`bench compare`).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse {
        path: std::path::PathBuf,
        #[source]
        source: ResultError,
    },
}

/// Read and parse the result file at `path`.
pub fn read(path: &std::path::Path) -> Result<BenchResult, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io { path: path.into(), source })?;
    parse(&text).map_err(|source| ReadError::Parse { path: path.into(), source })
}

/// Why a file is not a bench result this spark-kit reads.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    #[error("not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("not a spark-kit bench result (its `format` is not `{FORMAT}`)")]
    Format,
    #[error("result format version {0}; this spark-kit reads version {VERSION}")]
    Version(u64),
    #[error("no `version` field")]
    NoVersion,
    #[error("{path}: {source}")]
    Field {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Read a result file's text, checking the format and version first (clear one-line errors).
pub fn parse(text: &str) -> Result<BenchResult, ResultError> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(ResultError::NotJson)?;
    if v.get("format").and_then(serde_json::Value::as_str) != Some(FORMAT) {
        return Err(ResultError::Format);
    }
    match v.get("version").and_then(serde_json::Value::as_u64) {
        Some(n) if n == u64::from(VERSION) => {}
        Some(n) => return Err(ResultError::Version(n)),
        None => return Err(ResultError::NoVersion),
    }
    serde_path_to_error::deserialize(v)
        .map_err(|e| ResultError::Field { path: e.path().to_string(), source: e.into_inner() })
}
