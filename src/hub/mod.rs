//! Hugging Face Hub downloads into the standard HF cache, and their verification.
//!
//! `api` speaks the Hub's protocol (revision → commit, paged tree, one `resolve` per file),
//! `plan` checks the listing against the kit, `fetch` owns the data path (parallel ranges to
//! the signed CDN URLs, resume journal, SHA-256 while downloading), `cache` writes the layout
//! offline readers expect, `engram` builds the slim Engram directory, `lockfile` and `verify`
//! record and re-check what was fetched. Progress goes through [`report::Reporter`]; nothing
//! here prints. See docs/download.md and docs/decisions.md.

pub mod api;
pub mod auth;
pub mod cache;
pub mod disk;
pub mod engram;
pub mod error;
pub mod fetch;
pub mod hashing;
pub mod headers;
pub mod journal;
pub mod kit_files;
pub mod lockfile;
pub mod paths;
pub mod plan;
pub mod repair;
pub mod report;
pub mod retry;
pub mod reuse;
pub mod run;
pub mod text;
pub mod verify;
pub mod xet;

pub use error::HubError;

/// The Hub when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// `HF_ENDPOINT` (trailing `/` removed) or the public Hub.
#[must_use]
pub fn endpoint(env: &[(String, String)]) -> String {
    env.iter()
        .rev()
        .find(|(k, _)| k == "HF_ENDPOINT")
        .map(|(_, v)| v.trim().trim_end_matches('/').to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
}
