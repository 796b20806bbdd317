#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust unit + integration tests, the Python overlay's
# tests and the end-to-end tests. Fresh-machine safe: it installs what it needs (the engine venv
# via `spark-kit setup`, cached under ~/.cache/spark-kit keyed by a hash of its requirements).
#   bash tests/run-all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

step() { printf '\n== %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "build"
cargo build --all-targets

step "engine venv: spark-kit setup --kit tiny-cpu"
target/debug/spark-kit setup --kit tiny-cpu
venv=$(target/debug/spark-kit setup --kit tiny-cpu --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["path"])')

step "python overlay tests (pytest in the engine venv)"
SPARK_KIT_TEST_FIXTURES="${SPARK_KIT_TEST_FIXTURES:-$PWD/../shared/fixtures}" \
  PYTHONPATH=python_overlay "$venv/bin/python" -m pytest python_overlay/tests -q -p no:cacheprovider

step "cargo test (unit, integration, end to end)"
SPARK_KIT_TEST_E2E=1 cargo test --all-targets
