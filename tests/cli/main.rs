//! The command line: flags, hints, snapshots, kits, `plan` and `preflight`.
//! One test binary per area (fewer link steps): each module was a test binary of its own.
#![allow(clippy::expect_used, clippy::print_stdout, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../fake_hub/mod.rs"]
mod fake_hub;

mod cli_flags;
mod cli_hints;
mod cli_snapshots;
mod kit_builtin;
mod kit_cli;
mod kit_reference;
mod kit_validation;
mod plan;
mod plan_single;
mod plan_table;
mod preflight_cli;
mod preflight_fixtures;
mod readme_path;
