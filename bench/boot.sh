#!/usr/bin/env bash
# Time to healthy: `spark-kit up --kit KIT` against the very same engine command started by hand
# (same argv, same environment), RUNS runs each, interleaved, in one go. Both sides are timed the
# same way: from launch until GET /health answers 200.
#   KIT tiny-cpu (default): by hand = the `vllm serve …` of the venv.
#   KIT tiny-cpu-docker: by hand = the same `docker run … vllm serve …` (engine.runtime: docker;
#     the daemon is DOCKER_HOST's or the default one; the image is made first, offline, with
#     `spark-kit image build --kit tiny-cpu-docker` — `present` when it is there).
# Prints each run, both medians, and the ratio (spark-kit / by hand) last. Target: <= 1.10.
#   bash bench/boot.sh [RUNS] [KIT]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
kit=${2:-tiny-cpu}
case "$kit" in
  tiny-cpu | tiny-cpu-docker) ;;
  *) echo "bench/boot.sh: unknown kit \`$kit\`; use tiny-cpu or tiny-cpu-docker" >&2; exit 2 ;;
esac
port=${BOOT_BENCH_PORT:-8391}
cargo build -q
sk="${CARGO_TARGET_DIR:-$PWD/target}/debug/spark-kit"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

now() { date +%s.%N; }
wait_healthy() { # pid
  until curl -fs -o /dev/null "http://127.0.0.1:$port/health"; do
    kill -0 "$1" 2>/dev/null || { echo "process $1 died before healthy" >&2; return 1; }
    sleep 0.2
  done
}
containers() { [ "$kit" = tiny-cpu-docker ] && docker ps -aq --filter "label=spark-kit.kit=$kit" || true; }
stop_group() { # pid of a process started with setsid (its own session and group)
  kill -TERM -- "-$1" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 -- "-$1" 2>/dev/null || break; sleep 0.2; done
  kill -KILL -- "-$1" 2>/dev/null || true
  # The next run must not find this one's server still answering, nor its container (same name).
  for _ in $(seq 1 150); do
    curl -fs -o /dev/null "http://127.0.0.1:$port/health" || [ -n "$(containers)" ] || return 0
    sleep 0.2
  done
  echo "port $port still answers (or a container is left) after stopping $1" >&2; exit 1
}
if curl -fs -o /dev/null "http://127.0.0.1:$port/health"; then
  echo "something already answers on port $port; set BOOT_BENCH_PORT" >&2; exit 1
fi
if [ "$kit" = tiny-cpu-docker ]; then
  command -v docker >/dev/null || { echo "no docker client; fix: apt-get install docker.io" >&2; exit 1; }
  docker info >/dev/null 2>&1 || { echo "no Docker daemon answers (DOCKER_HOST=${DOCKER_HOST:-default}); fix: start dockerd or set DOCKER_HOST" >&2; exit 1; }
  [ -z "$(containers)" ] || { echo "containers of $kit are running; fix: spark-kit down --kit $kit" >&2; exit 1; }
  "$sk" image build --kit "$kit" >&2
fi

# Warm-up (not measured): builds the venv and the model if needed, and records the engine's
# exact argv and environment for the by-hand runs.
echo "warm-up: spark-kit up --kit $kit (records the engine command)" >&2
setsid "$sk" up --kit "$kit" --port "$port" --set "paths.logs=$logs" >/dev/null 2>"$logs/warmup.err" &
up=$!
wait_healthy "$up"
engine=""
if [ "$kit" = tiny-cpu-docker ]; then
  # The engine process is the `docker run` client of the kit's container (agent → client).
  engine=$(pgrep -f -- "--label=spark-kit.kit=$kit" | while read -r p; do
    [ "$(tr '\0' ' ' < "/proc/$p/cmdline" | cut -d' ' -f2)" = run ] && echo "$p"; done | head -n1)
else
  engine=$(pgrep -f -- "__engine --venv" | while read -r p; do [ "$(ps -o ppid= -p "$(ps -o ppid= -p "$p" | tr -d ' ')" | tr -d ' ')" = "$up" ] && echo "$p"; done | head -n1)
fi
[ -n "$engine" ] || { echo "cannot find the engine process" >&2; exit 1; }
mapfile -d '' argv < "/proc/$engine/cmdline"
mapfile -d '' envv < "/proc/$engine/environ"
stop_group "$up"
if [ "$kit" = tiny-cpu-docker ]; then
  cmd=("$(command -v docker)" "${argv[@]:1}")
else
  venv=""
  for i in "${!argv[@]}"; do [ "${argv[$i]}" = "--venv" ] && venv=${argv[$((i+1))]}; done
  cmd=("$venv/bin/vllm")
  seen=0
  for a in "${argv[@]}"; do
    if [ "$seen" = 1 ]; then cmd+=("$a"); fi
    [ "$a" = "--" ] && seen=1
  done
fi
# spark-kit's vLLM listens on engine.internal_port behind the gateway; by hand it takes the
# public port itself.
for i in "${!cmd[@]}"; do [ "${cmd[$i]}" = "--port" ] && cmd[$((i+1))]=$port; done
echo "by hand: env -i <engine env> ${cmd[*]}" >&2

a=(); b=()
for r in $(seq 1 "$runs"); do
  t0=$(now)
  setsid "$sk" up --kit "$kit" --port "$port" --set "paths.logs=$logs" >/dev/null 2>>"$logs/up.err" &
  pid=$!
  wait_healthy "$pid"; t1=$(now)
  stop_group "$pid"
  a+=("$(echo "$t1 - $t0" | bc)")
  t0=$(now)
  env -i "${envv[@]}" setsid "${cmd[@]}" >>"$logs/hand.log" 2>&1 &
  pid=$!
  wait_healthy "$pid"; t1=$(now)
  stop_group "$pid"
  b+=("$(echo "$t1 - $t0" | bc)")
  printf 'run %d: spark-kit up %.1f s, by hand %.1f s\n' "$r" "${a[-1]}" "${b[-1]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
ma=$(median "${a[@]}"); mb=$(median "${b[@]}")
printf '%s: median time to healthy: spark-kit up %.1f s, by hand %.1f s\n' "$kit" "$ma" "$mb"
printf 'ratio (spark-kit / by hand): %.3f\n' "$(echo "$ma / $mb" | bc -l)"
