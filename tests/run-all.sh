#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust unit + integration tests, Python overlay tests.
# Fresh-machine safe: installs what it needs (apt packages, the engine venv, cached under
# ~/.cache/spark-kit keyed by a hash of their requirements). Run from anywhere:
#   bash tests/run-all.sh
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "cargo test"
cargo test --all-targets 2>&1 | tee /tmp/spark-kit-cargo-test.log
