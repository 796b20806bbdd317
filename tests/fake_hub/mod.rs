//! A fake Hugging Face Hub on loopback for the download tests: two listeners — the Hub (API,
//! `resolve`) and a separate "CDN" origin with signed, expiring URLs — speaking the real
//! protocol (docs: ../shared/docs/hf-hub-protocol.md §1, §5). Content is generated (seeded) or
//! read from files. Scripted faults and per-range counters let tests prove client behaviour.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cas;
mod cdn;
pub mod harness;
mod model;
pub mod python;
mod serve;
mod xet;

pub use harness::Setup;
pub use model::seeded_bytes;
pub use model::{Content, Dialect, FakeFile, Fault, FaultKind, Route};
pub use serve::{FakeHub, Served};
