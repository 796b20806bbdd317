#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust unit + integration tests, the Python overlay's
# tests and the end-to-end tests. Fresh-machine safe: it installs what it needs (the engine venv
# via `spark-kit setup`, cached under ~/.cache/spark-kit keyed by a hash of its requirements).
#   bash tests/run-all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

step() { printf '\n== %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }

step "system packages (tests/apt-packages.txt)"
mapfile -t pkgs < <(grep -vE '^\s*(#|$)' tests/apt-packages.txt)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "missing packages (need root to install): ${missing[*]}; tests that need them will say so and skip" >&2
  fi
fi

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "build"
cargo build --all-targets

step "engine venv: cargo run -- setup --kit tiny-cpu"
# Through `cargo run`, as the README runs the main job (cargo passes build-script variables to
# the program: none may look like a kit setting).
cargo run -q -- setup --kit tiny-cpu
venv=$("${CARGO_TARGET_DIR:-target}/debug/spark-kit" setup --kit tiny-cpu --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["path"])')

step "python overlay tests (pytest in the engine venv)"
SPARK_KIT_TEST_FIXTURES="${SPARK_KIT_TEST_FIXTURES:-$PWD/../shared/fixtures}" \
  PYTHONPATH=python_overlay "$venv/bin/python" -m pytest python_overlay/tests -q -p no:cacheprovider

step "cargo test (unit, integration, end to end)"
SPARK_KIT_TEST_E2E=1 cargo test --all-targets --no-fail-fast
