#!/usr/bin/env bash
# Gateway overhead: per-stream decode and TTFT through the gateway (engine.port) against the same
# vLLM straight on its internal loopback port (engine.internal_port), one deployment, same run,
# interleaved. `spark-kit up --kit tiny-cpu` is started here; each round runs one
# `spark-kit bench` against each side (order alternating per round), C streams x WAVES waves of
# OUT tokens (ignore_eos, temperature 0) on PROMPT-token prompts.
# Prints each round, the medians over all streams of each side, and the ratios last.
# Targets (issue 16): decode through the gateway >= 0.98 x direct, TTFT p50 <= direct + 5 ms
# (exit 1 otherwise).
#
#   bash bench/gateway.sh                 # C=1 PROMPT=64 OUT=128 WAVES=3 ROUNDS=6
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-1}
PROMPT=${PROMPT:-64}
OUT=${OUT:-128}
WAVES=${WAVES:-3}
ROUNDS=${ROUNDS:-6}

# SK=path/to/spark-kit uses that binary instead of building this checkout.
if [ -z "${SK:-}" ]; then
  cargo build -q --bin spark-kit
  SK=${CARGO_TARGET_DIR:-$PWD/target}/debug/spark-kit
fi
work=$(mktemp -d)
up_pid=
cleanup() {
  if [ -n "$up_pid" ]; then
    kill -INT "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
internal=$(free_port)
echo "starting spark-kit up --kit tiny-cpu --port $port (vLLM on 127.0.0.1:$internal)" >&2
"$SK" up --kit tiny-cpu --port "$port" --set "paths.logs=$work/logs" --set "engine.internal_port=$internal" \
  >"$work/up.out" 2>"$work/up.err" &
up_pid=$!
ready() { grep -q '^Ctrl-C stops' "$work/up.out" 2>/dev/null; }
for _ in $(seq 900); do
  ready && break
  if ! kill -0 "$up_pid" 2>/dev/null; then
    tail -20 "$work/up.err" >&2
    echo "error: spark-kit up exited before it was ready" >&2
    exit 1
  fi
  sleep 1
done
ready || { echo "error: not ready within 900 s" >&2; exit 1; }

gateway=http://127.0.0.1:$port
direct=http://127.0.0.1:$internal
run() { # $1 = side name, $2 = url, $3 = round
  "$SK" bench --url "$2" --model tiny-llama --concurrency "$C" --decode-repeats "$WAVES" --decode-tokens "$OUT" \
    --decode-prompt-tokens "$PROMPT" --prefill none --quiet --json "$work/$1-$3.json" >/dev/null
}
echo "load: $C streams x $WAVES waves x $OUT tokens, prompt $PROMPT tokens, $ROUNDS rounds, gateway $gateway vs direct $direct" >&2
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then
    run gateway "$gateway" "$r"
    run direct "$direct" "$r"
  else
    run direct "$direct" "$r"
    run gateway "$gateway" "$r"
  fi
done

python3 - "$work" "$ROUNDS" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])

def streams(name):
    d = json.load(open(f"{work}/{name}.json"))
    return [(q["decode_tok_s"], q["ttft_s"]) for w in d["decode"] for q in w["requests"] if q["decode_tok_s"]]

sides = {"gateway": [], "direct": []}
for r in range(1, rounds + 1):
    line = [f"round {r}:"]
    for side in sides:
        s = streams(f"{side}-{r}")
        sides[side].extend(s)
        line.append(f"{side} decode {statistics.median(x for x, _ in s):.1f} tok/s, TTFT {statistics.median(t for _, t in s) * 1000:.1f} ms;")
    print(" ".join(line))
med = {k: (statistics.median(x for x, _ in v), statistics.median(t for _, t in v)) for k, v in sides.items()}
for k, (d, t) in med.items():
    print(f"{k}: {len(sides[k])} streams, per-stream decode median {d:.2f} tok/s, TTFT p50 {t * 1000:.2f} ms")
ratio = med["gateway"][0] / med["direct"][0]
dttft = (med["gateway"][1] - med["direct"][1]) * 1000
ok = ratio >= 0.98 and dttft <= 5.0
print(f"TTFT p50 through the gateway − direct: {dttft:+.2f} ms (target <= 5 ms)")
print(f"decode ratio (gateway / direct): {ratio:.4f} (target >= 0.98){'' if ok else '  MISSED'}")
sys.exit(0 if ok else 1)
EOF
