//! Source rules: import layering, file sizes, registered environment variables.
//! One test binary per area (fewer link steps): each module was a test binary of its own.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../source_scan/mod.rs"]
mod source_scan;

mod envvars;
mod import_rules;
mod source_rules;
