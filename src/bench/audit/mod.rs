//! `spark-kit bench --audit reference`: the reference kit's published table
//! (../shared/docs/reference-kit.md §D) replayed row by row with the same shapes, scaled on small
//! kits ([`published::scale_for`]), our figure beside the published one. A row that cannot run
//! on the kit in use says why and stays empty.
//!
//! [`published`]: the rows and the scale (pure); [`run`]: running them; [`text`]: the table;
//! [`plot`]: the ladder and the decode rows.

pub mod plot;
pub mod published;
pub mod run;
pub mod text;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::result::{Request, Wave};
use super::spec::SpecCounts;

/// The replayed table, in the result file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Audit {
    /// Which table (`reference`).
    pub table: String,
    /// Where its numbers were published.
    pub source: String,
    /// Factor applied to every token count of the published shapes (1 = the shapes as published).
    pub scale: f64,
    /// Why this factor (the rule of docs/bench.md, with the model's max_model_len).
    pub scale_why: String,
    /// Whether the engine speculated (vLLM's spec-decode counters; else the kit), null = unknown.
    pub speculation: Option<bool>,
    pub rows: Vec<Row>,
}

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `concurrency` streams started together (median per stream, or the wave's aggregate).
    Decode,
    /// One long prompt at a time (prefill tok/s).
    Prefill,
    /// A short chat sent while a long prompt is being prefilled (its TTFT, seconds).
    ChatDuringPrefill,
}

/// Which figure of a decode row the publication quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Median tok/s of one stream.
    PerStream,
    /// Σ tokens / wave span.
    Aggregate,
    /// Prefill tok/s: (prompt − cached) / (TTFT − overhead).
    Prefill,
    /// TTFT of the short chat, seconds.
    TtftS,
}

impl Metric {
    #[must_use]
    pub fn unit(self) -> &'static str {
        match self {
            Self::PerStream => "tok/s/stream",
            Self::Aggregate => "tok/s aggregate",
            Self::Prefill => "prefill tok/s",
            Self::TtftS => "s TTFT",
        }
    }
}

/// A request shape in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    /// Streams started together (decode), 1 otherwise.
    pub concurrency: u32,
    /// Prompt tokens (of each stream; the long prompt for a chat during prefill).
    pub prompt_tokens: u64,
    /// Output tokens (`max_tokens`).
    pub output_tokens: u64,
}

/// One row: the published figure and ours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// Stable id (`decode-x2-spec-on`, `prefill-455k`, …): what `bench compare` matches.
    pub id: String,
    pub label: String,
    pub kind: Kind,
    pub metric: Metric,
    /// The speculation the published row ran with (null = the publication's default).
    pub speculation: Option<bool>,
    /// The shape as published.
    pub published_shape: Shape,
    /// The shape run here (published × the audit's scale).
    pub shape: Shape,
    /// The published figure in `metric`'s unit (null = the row is not published).
    pub published: Option<f64>,
    /// The publication's own words for it.
    pub published_text: String,
    /// Our figure in `metric`'s unit (median over the samples); null when the row did not run.
    pub ours: Option<f64>,
    /// Samples behind `ours` (plausible streams, rated prefills, chats).
    pub n: u64,
    /// Smallest and largest sample.
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Milliseconds per engine step of the median stream (decode rows).
    pub ms_per_step: Option<f64>,
    /// vLLM's spec-decode counters over the row's waves (decode rows, when the engine speculates).
    pub spec_decode: Option<SpecCounts>,
    /// Why the row has no figure: it could not run on the kit in use, or what it measured cannot
    /// be divided (then every figure is null).
    pub skipped: Option<String>,
    /// How far the figure can be trusted, when that needs saying (a prefill within noise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Every raw sample: the decode waves.
    pub waves: Vec<Wave>,
    /// Every raw sample: prefill requests; for a chat during prefill, the long request then the chat.
    pub requests: Vec<Request>,
}
