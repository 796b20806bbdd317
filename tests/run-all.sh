#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust unit + integration tests, the Python overlay's
# tests and the end-to-end tests. Fresh-machine safe: it installs what it needs (the engine venv
# via `spark-kit setup`, cached under ~/.cache/spark-kit keyed by a hash of their requirements).
#   bash tests/run-all.sh
#
# After the build and the fast Rust tests, three lanes run side by side: the Python overlay's
# tests followed by the vLLM version matrix (tests/vllm-matrix.sh, its venvs built in the
# background from the start), and two lanes of end-to-end binaries (tests/lanes.txt); then the binaries that must run
# alone. The end-to-end tests spend much of their time waiting on engines (boots, restarts,
# stall and drain thresholds), so this cuts the wall time without dropping a test. Each job's output goes to its own log, printed
# whole when it ends; a table of seconds closes the run.
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

# The version matrix's vLLM venvs (tests/vllm-matrix.sh: two sdist builds, ~2.5 min each cold,
# cached under ~/.cache/spark-kit/matrix) build in the background from here, beside the Rust
# build; the matrix itself runs later beside the Python overlay's tests.
matrix_build_log=$(mktemp "${TMPDIR:-/tmp}/spark-kit-matrix-build.XXXXXX")
bash tests/vllm-matrix.sh --build-only > "$matrix_build_log" 2>&1 &
matrix_build=$!

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

step "Python Xet client venv (huggingface_hub + hf_xet, hash-pinned): tests/xet-venv.sh"
# For tests/download/download_xet_interop.rs (the test Hub's CAS judged by the real client) and
# tests/download/weights_sync.rs (a cache written by `hf download` synced to a node); cached
# under ~/.cache/spark-kit keyed by tests/xet-requirements.txt's hash.
bash tests/xet-venv.sh

# Every test target but `e2e` is a fast test (one binary per area: tests/<area>/main.rs). The
# end-to-end tests are the modules of the `e2e` binary, each run in its lane (tests/lanes.txt)
# as `cargo test --test e2e -- <module>::`.
mapfile -t targets < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"]:
            print(t["name"])')
mapfile -t e2e_mods < <(sed -n 's/^mod \(e2e_[a-z0-9_]*\);$/\1/p' tests/e2e/main.rs)
declare -A lane_of=()
ordered=()
while read -r lane name; do
  [[ -z "$lane" || "$lane" == \#* ]] && continue
  lane_of[$name]=$lane
  ordered+=("$name")
done < tests/lanes.txt
fast=()
for t in "${targets[@]}"; do
  [[ "$t" == e2e ]] || fast+=("--test" "$t")
done
for m in "${e2e_mods[@]}"; do
  [[ -n "${lane_of[$m]:-}" ]] || { echo "tests/lanes.txt: end-to-end module $m (tests/e2e/main.rs) is in no lane; add a line \"<lane> $m\" (lane a, b or alone)" >&2; exit 1; }
done
for t in "${ordered[@]}"; do
  for m in "${e2e_mods[@]}"; do
    [[ "$m" != "$t" && "$m" == *"$t" ]] && { echo "tests/e2e/main.rs: module $m ends with $t, so the filter \"$t::\" would also run $m; rename one" >&2; exit 1; }
  done
  printf '%s\n' "${e2e_mods[@]}" | grep -qx "$t" || { echo "tests/lanes.txt: $t is not a module of tests/e2e/main.rs" >&2; exit 1; }
done

logs=$(mktemp -d "${TMPDIR:-/tmp}/spark-kit-tests.XXXXXX")
results="$logs/results"
: > "$results"

# run NAME CMD...: one job, its output to $logs/NAME.log, printed whole when it ends.
run() {
  local name=$1; shift
  local t0=$SECONDS rc=0
  printf '[%s] %s started\n' "$(date +%H:%M:%S)" "$name"
  "$@" > "$logs/$name.log" 2>&1 || rc=$?
  local secs=$((SECONDS - t0))
  {
    printf '\n== %s: %s in %d s (%s)\n' "$name" "$([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")" "$secs" "$(date +%H:%M:%S)"
    cat "$logs/$name.log"
  } | flock "$logs/print.lock" cat
  printf '%s %d %d\n' "$name" "$rc" "$secs" | flock "$logs/results.lock" tee -a "$results" > /dev/null
  return 0
}

# A lane: its end-to-end binaries one after another (a hung binary is stopped after 25 minutes).
lane() {
  local l=$1 t
  for t in "${ordered[@]}"; do
    [[ "${lane_of[$t]}" == "$l" ]] || continue
    run "$t" e2e_module "$t"
  done
}

# e2e_module NAME: the tests of one module of the e2e binary (a hung one is stopped after 25
# minutes); a filter that matched no test fails, so a renamed module cannot pass by running nothing.
e2e_module() {
  local out rc=0
  out=$(mktemp "${TMPDIR:-/tmp}/spark-kit-e2e.XXXXXX")
  SPARK_KIT_TEST_E2E=1 timeout -k 30 1500 cargo test --no-fail-fast --test e2e -- "$1::" 2>&1 | tee "$out" || rc=$?
  grep -qE '^running [1-9]' "$out" || { echo "tests/lanes.txt: no test of the e2e binary matched \"$1::\"" >&2; rc=1; }
  rm -f "$out"
  return "$rc"
}

# The fast tests first and alone: some of them time a scripted fake server against its script
# and must not share the cores with booting engines.
step "cargo test: unit and integration (logs in $logs)"
run cargo-fast env SPARK_KIT_TEST_E2E=1 cargo test --no-fail-fast --lib --bins "${fast[@]}"

step "python overlay tests, the vLLM version matrix and the end-to-end lanes, side by side"
matrix_rc=0
wait "$matrix_build" || matrix_rc=$?
printf '\n== vllm-matrix venvs (background build): exit %d\n' "$matrix_rc"; cat "$matrix_build_log"
{
  run pytest env SPARK_KIT_TEST_FIXTURES="${SPARK_KIT_TEST_FIXTURES:-$PWD/../shared/fixtures}" \
    PYTHONPATH=python_overlay "$venv/bin/python" -m pytest python_overlay/tests -q -p no:cacheprovider
  run vllm-matrix bash tests/vllm-matrix.sh --tiny-cpu-venv "$venv"
} &
lane a &
lane b &
wait

# Tests that judge the host's MemAvailable (a memory guard's floors) run with nothing beside them.
step "end-to-end binaries that run alone"
lane alone

step "summary (seconds per job)"
sort -k3,3nr "$results" | awk '{ printf "%-22s %6d s  %s\n", $1, $3, ($2 == 0 ? "passed" : "FAILED (exit " $2 ")") }'
if awk '$2 != 0 { bad = 1 } END { exit !bad }' "$results"; then
  echo "FAILED: $(awk '$2 != 0 { printf "%s ", $1 }' "$results")" >&2
  exit 1
fi
echo "all passed"
