//! `spark-kit bench` against scripted fake servers, and the result schema.
//! One test binary per area (fewer link steps): each module was a test binary of its own.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../fake_sse/mod.rs"]
mod fake_sse;

mod bench_audit;
mod bench_fake;
mod bench_plot;
mod bench_schema;
