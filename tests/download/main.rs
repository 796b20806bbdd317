//! Downloads against the test Hub (bridge and Xet/CAS), caches, faults, resume, and the weights' sync.
//! One test binary per area (fewer link steps): each module was a test binary of its own.
#![allow(clippy::expect_used, clippy::print_stderr, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../fake_hub/mod.rs"]
mod fake_hub;

mod download_cache;
mod download_errors;
mod download_faults;
mod download_inflight;
mod download_interop;
mod download_resume;
mod download_reuse;
mod download_sizes;
mod download_xet;
mod download_xet_interop;
mod weights_sync;
