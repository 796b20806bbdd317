//! Checkpoints: EXL3 audit and claims, decode against the fixtures, Engram rows, `verify`.
//! One test binary per area (fewer link steps): each module was a test binary of its own.
#![allow(clippy::expect_used, clippy::print_stdout, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../common_ckpt/mod.rs"]
mod common_ckpt;
#[path = "../engram_fixture/mod.rs"]
mod engram_fixture;

mod checkpoint_audit;
mod checkpoint_claims;
mod checkpoint_timing;
mod engram_bench;
mod engram_rows;
mod exl3_decode;
mod verify_decode_cli;
mod verify_plan_cli;
