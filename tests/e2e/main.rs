//! End-to-end tests: real engines, real nodes (network namespaces, sshd, dockerd). Each module is one
//! lane entry in tests/lanes.txt; tests/run-all.sh runs them as `cargo test --test e2e -- <module>::`.
//! One test binary per area (fewer link steps): each module was a test binary of its own.
#![allow(clippy::cast_possible_wrap, clippy::expect_used, clippy::print_stderr, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod e2e_bench_tiny_cpu;
mod e2e_docker;
mod e2e_docker_two_node;
mod e2e_exl3;
mod e2e_fabric;
mod e2e_gateway;
mod e2e_hints;
mod e2e_tiny_cpu;
mod e2e_two_node;
