#!/usr/bin/env bash
# Agreement: the same load measured by `spark-kit bench` and by vLLM's own `vllm bench serve`
# (from the tiny-cpu engine venv) on the tiny-cpu endpoint. Prints both, and the ratio last.
# Target: per-stream decode within 10 % (exit 1 otherwise).
#
#   bash bench/agreement.sh                                # starts `spark-kit up --kit tiny-cpu` itself
#   URL=http://127.0.0.1:8000 bash bench/agreement.sh      # an endpoint that is already up
#
# Both tools define per-stream decode the same way: spark-kit (completion_tokens − 1) /
# (t_last − t_first); vLLM 1 / TPOT with TPOT = (latency − TTFT) / (output_tokens − 1), both
# token counts from the streamed usage block (vLLM's per request from `--save-detailed`).
#
# MODE=together (default): both tools load the server at the same time, C=2 streams each, so
# both see the same server under the same background load (this host is shared: alternating
# runs a few seconds apart differ by up to 3x). `vllm bench serve` sends VL_PROMPTS=240 requests,
# C at a time; while they run, `spark-kit bench` runs ROUNDS=20 waves of C streams. Only vLLM
# streams that overlap a spark-kit run (CLOCK_MONOTONIC, the clock of vLLM's start_times) count.
# MODE=alternate: ROUNDS alternating runs, one wave of C streams per tool per round.
# Each stream: PROMPT=128 prompt tokens, OUT=256 output tokens (ignore_eos), temperature 0.
# Reported: medians over all streams of each tool.
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-2}
PROMPT=${PROMPT:-128}
OUT=${OUT:-256}
ROUNDS=${ROUNDS:-20}
MODE=${MODE:-together}
VL_PROMPTS=${VL_PROMPTS:-240}

# SK=path/to/spark-kit uses that binary instead of building this checkout.
if [ -z "${SK:-}" ]; then
  cargo build -q --bin spark-kit
  SK=$PWD/target/debug/spark-kit
fi
sk=$SK
venv=$("$sk" setup --kit tiny-cpu --json --quiet | python3 -c 'import json,sys; print(json.load(sys.stdin)["path"])')
py=$venv/bin/python
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

if [ -z "${URL:-}" ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  echo "starting spark-kit up --kit tiny-cpu --port $port" >&2
  "$sk" up --kit tiny-cpu --port "$port" --set "paths.logs=$work/logs" >"$work/up.out" 2>"$work/up.err" &
  up_pid=$!
  serving() { python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/v1/models", timeout=5)' "http://127.0.0.1:$port" 2>/dev/null; }
  for _ in $(seq 600); do
    serving && break
    if ! kill -0 "$up_pid" 2>/dev/null; then
      cat "$work/up.err" >&2
      echo "error: spark-kit up exited before the endpoint served" >&2
      exit 1
    fi
    sleep 1
  done
  serving || { echo "error: the endpoint did not serve within 600 s" >&2; exit 1; }
  URL=http://127.0.0.1:$port
fi

read -r model root < <(python3 - "$URL" <<'EOF'
import json, sys, urllib.request
d = json.load(urllib.request.urlopen(sys.argv[1] + "/v1/models", timeout=30))["data"][0]
print(d["id"], d.get("root") or d["id"])
EOF
)
echo "load ($MODE): $C streams per tool x $OUT tokens, prompt $PROMPT tokens, $ROUNDS spark-kit rounds, model $model at $URL" >&2

vllm_bench() { # $1 = result name, $2 = number of prompts
  "$py" -m vllm.entrypoints.cli.main bench serve --backend openai-chat --base-url "$URL" \
    --endpoint /v1/chat/completions --model "$model" --tokenizer "$root" --dataset-name random \
    --random-input-len "$PROMPT" --random-output-len "$OUT" --random-range-ratio 0 --num-prompts "$2" \
    --max-concurrency "$C" --ignore-eos --temperature 0 --num-warmups 1 --disable-tqdm \
    --save-result --save-detailed --result-dir "$work" --result-filename "$1.json" >"$work/$1.log" 2>&1
}
sk_bench() { # $1 = result name
  "$sk" bench --url "$URL" --model "$model" --concurrency "$C" --decode-tokens "$OUT" \
    --decode-prompt-tokens "$PROMPT" --prefill none --quiet --json "$work/$1.json" >/dev/null
}
running() { # streams the server is decoding now (vLLM /metrics)
  python3 - "$URL" <<'EOF'
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1] + "/metrics", timeout=10).read().decode()
print(int(sum(float(m) for m in re.findall(r'^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$', text, re.M))))
EOF
}

vl_files=()
if [ "$MODE" = together ]; then
  vllm_bench vllm-1 "$VL_PROMPTS" &
  vl_pid=$!
  for _ in $(seq 300); do
    [ "$(running)" -ge "$C" ] && break
    kill -0 "$vl_pid" 2>/dev/null || break
    sleep 0.5
  done
  # CLOCK_MONOTONIC around each spark-kit run (vLLM's start_times are on the same clock), so only
  # vLLM streams that ran alongside spark-kit's are compared.
  mono() { python3 -c 'import time; print(time.clock_gettime(time.CLOCK_MONOTONIC))'; }
  for i in $(seq "$ROUNDS"); do
    t0=$(mono)
    sk_bench "sk-$i"
    echo "$t0 $(mono)" >>"$work/windows"
  done
  if ! kill -0 "$vl_pid" 2>/dev/null; then
    echo "error: vLLM's load ended before spark-kit's $ROUNDS rounds did; raise VL_PROMPTS (now $VL_PROMPTS)" >&2
    exit 1
  fi
  wait "$vl_pid" || { tail -20 "$work/vllm-1.log" >&2; echo "error: vllm bench serve failed" >&2; exit 1; }
  vl_files=(vllm-1)
else
  for i in $(seq "$ROUNDS"); do
    sk_bench "sk-$i"
    vllm_bench "vllm-$i" "$C" || { tail -20 "$work/vllm-$i.log" >&2; echo "error: vllm bench serve failed" >&2; exit 1; }
    vl_files+=("vllm-$i")
  done
fi

python3 - "$work" "$ROUNDS" "$MODE" "${vl_files[@]}" <<'EOF'
import json, statistics, sys
work, rounds, mode, vl_files = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
med = statistics.median


try:
    windows = [tuple(map(float, l.split())) for l in open(f"{work}/windows")]
except FileNotFoundError:
    windows = []


def alongside(a, b):
    return not windows or any(a < hi and b > lo for lo, hi in windows)


def vllm_requests(name):
    """Per request (1 / TPOT, TTFT) and the wave aggregate, from `vllm bench serve --save-detailed`."""
    v = json.load(open(f"{work}/{name}.json"))
    firsts, lasts, tokens, out = [], [], 0, []
    for n, ttft, lat, st in zip(v["output_lens"], v["ttfts"], v["latencies"], v["start_times"]):
        if n > 1 and lat > ttft and alongside(st + ttft, st + lat):
            out.append(((n - 1) / (lat - ttft), ttft))  # TPOT = (latency - TTFT) / (n - 1)
            firsts.append(st + ttft)
            lasts.append(st + lat)
            tokens += n - 1
    return out, tokens / (max(lasts) - min(firsts))


sk_req, sk_agg, vl_req, vl_agg = [], [], [], []
for i in range(1, rounds + 1):
    w = json.load(open(f"{work}/sk-{i}.json"))["decode"][0]
    req = [(q["decode_tok_s"], q["ttft_s"]) for q in w["requests"] if q["decode_tok_s"]]
    sk_req += req
    sk_agg.append(w["aggregate_tok_s"])
    print(f"spark-kit round {i}: {med(x[0] for x in req):7.1f} tok/s/stream, TTFT {med(x[1] for x in req) * 1e3:4.0f} ms")
for name in vl_files:
    req, agg = vllm_requests(name)
    vl_req += req
    vl_agg.append(agg)
    print(f"vllm bench serve {name}: {med(x[0] for x in req):7.1f} tok/s/stream, TTFT {med(x[1] for x in req) * 1e3:4.0f} ms "
          f"({len(req)} requests)")


def line(name, req):
    print(f"{name}: per-stream decode {med(x[0] for x in req):.1f} tok/s (median of {len(req)} streams), "
          f"TTFT {med(x[1] for x in req) * 1e3:.0f} ms")


line("spark-kit bench ", sk_req)
line("vllm bench serve", vl_req)
if mode != "together":
    print(f"aggregate (spark-kit's definition on both): {med(sk_agg):.1f} vs {med(vl_agg):.1f} tok/s, "
          f"ratio {med(sk_agg) / med(vl_agg):.3f}")
print(f"TTFT ratio spark-kit/vllm: {med(x[1] for x in sk_req) / med(x[1] for x in vl_req):.3f}")
ratio = med(x[0] for x in sk_req) / med(x[0] for x in vl_req)
ok = abs(ratio - 1) <= 0.10
print(f"per-stream decode ratio spark-kit/vllm: {ratio:.3f} ({'within' if ok else 'OUTSIDE'} 10 %)")
sys.exit(0 if ok else 1)
EOF
