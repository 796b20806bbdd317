//! The memory guard on the real host (and NVML parsing).
//! One test binary per area (fewer link steps): each module was a test binary of its own.
#![allow(clippy::expect_used, clippy::print_stderr, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod memguard_cgroup;
mod memguard_host;
mod memguard_nvml;
