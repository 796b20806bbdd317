//! The docker runtime against a real dockerd: images, run argv, the image's vLLM, the memory guard in a container.
//! One test binary per area (fewer link steps): each module was a test binary of its own.
#![allow(clippy::expect_used, clippy::print_stderr, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod docker_image;
mod docker_run_argv;
mod docker_vllm;
mod memguard_container;
