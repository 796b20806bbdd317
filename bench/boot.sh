#!/usr/bin/env bash
# Time to healthy: `spark-kit up --kit tiny-cpu` against the very same vLLM command started by
# hand from the same venv (same argv, same environment), three runs each, interleaved, in one
# go. Both sides are timed the same way: from launch until GET /health answers 200.
# Prints each run, both medians, and the ratio (spark-kit / by hand) last. Target: <= 1.10.
#   bash bench/boot.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
port=${BOOT_BENCH_PORT:-8391}
cargo build -q
sk="$PWD/target/debug/spark-kit"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

now() { date +%s.%N; }
wait_healthy() { # pid
  until curl -fs -o /dev/null "http://127.0.0.1:$port/health"; do
    kill -0 "$1" 2>/dev/null || { echo "process $1 died before healthy" >&2; return 1; }
    sleep 0.2
  done
}
stop_group() { # pid of a process started with setsid (its own session and group)
  kill -TERM -- "-$1" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 -- "-$1" 2>/dev/null || break; sleep 0.2; done
  kill -KILL -- "-$1" 2>/dev/null || true
  # The next run must not find this one's server still answering.
  for _ in $(seq 1 150); do curl -fs -o /dev/null "http://127.0.0.1:$port/health" || return 0; sleep 0.2; done
  echo "port $port still answers after stopping $1" >&2; exit 1
}
if curl -fs -o /dev/null "http://127.0.0.1:$port/health"; then
  echo "something already answers on port $port; set BOOT_BENCH_PORT" >&2; exit 1
fi

# Warm-up (not measured): builds the venv and the model if needed, and records the engine's
# exact argv and environment for the by-hand runs.
echo "warm-up: spark-kit up --kit tiny-cpu (records the engine command)" >&2
setsid "$sk" up --kit tiny-cpu --port "$port" --set "paths.logs=$logs" >/dev/null 2>"$logs/warmup.err" &
up=$!
wait_healthy "$up"
engine=$(pgrep -f -- "__engine --venv" | while read -r p; do [ "$(ps -o ppid= -p "$(ps -o ppid= -p "$p" | tr -d ' ')" | tr -d ' ')" = "$up" ] && echo "$p"; done | head -n1)
[ -n "$engine" ] || { echo "cannot find the engine process" >&2; exit 1; }
mapfile -d '' argv < "/proc/$engine/cmdline"
mapfile -d '' envv < "/proc/$engine/environ"
stop_group "$up"
venv=""
for i in "${!argv[@]}"; do [ "${argv[$i]}" = "--venv" ] && venv=${argv[$((i+1))]}; done
vllm_args=()
seen=0
for a in "${argv[@]}"; do
  if [ "$seen" = 1 ]; then vllm_args+=("$a"); fi
  [ "$a" = "--" ] && seen=1
done
# spark-kit's vLLM listens on engine.internal_port behind the gateway; by hand it takes the
# public port itself.
for i in "${!vllm_args[@]}"; do [ "${vllm_args[$i]}" = "--port" ] && vllm_args[$((i+1))]=$port; done
echo "by hand: env -i <engine env> $venv/bin/vllm ${vllm_args[*]}" >&2

a=(); b=()
for r in $(seq 1 "$runs"); do
  t0=$(now)
  setsid "$sk" up --kit tiny-cpu --port "$port" --set "paths.logs=$logs" >/dev/null 2>>"$logs/up.err" &
  pid=$!
  wait_healthy "$pid"; t1=$(now)
  stop_group "$pid"
  a+=("$(echo "$t1 - $t0" | bc)")
  t0=$(now)
  env -i "${envv[@]}" setsid "$venv/bin/vllm" "${vllm_args[@]}" >>"$logs/hand.log" 2>&1 &
  pid=$!
  wait_healthy "$pid"; t1=$(now)
  stop_group "$pid"
  b+=("$(echo "$t1 - $t0" | bc)")
  printf 'run %d: spark-kit up %.1f s, by hand %.1f s\n' "$r" "${a[-1]}" "${b[-1]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
ma=$(median "${a[@]}"); mb=$(median "${b[@]}")
printf 'median time to healthy: spark-kit up %.1f s, by hand %.1f s\n' "$ma" "$mb"
printf 'ratio (spark-kit / by hand): %.3f\n' "$(echo "$ma / $mb" | bc -l)"
