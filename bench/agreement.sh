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
# Identical requests: C streams per tool, PROMPT prompt tokens as the server counts them (chat
# template included; vLLM's random prompts are shortened by the template's tokens), OUT output
# tokens with ignore_eos, temperature 0.
#
# MODE=together (default): both tools load the server at the same time, so every measured stream
# shares the server's batch and the host's background load with the other tool's streams.
# `vllm bench serve` keeps C streams in flight (VL_PROMPTS requests); once its main run is going,
# ONE `spark-kit bench` process runs ROUNDS back-to-back waves of C streams
# (`--decode-repeats`). Counted: the streams of either tool whose decode (first to last token)
# lies inside the span where both loads ran — so neither tool's set-up (spark-kit's warm-up,
# calibration and /tokenize calls; vLLM's test and warm-up requests) nor anything this script
# does falls inside a counted stream of the other. Clock: CLOCK_MONOTONIC (vLLM's start_times
# are time.perf_counter(), which is CLOCK_MONOTONIC on Linux; spark-kit's times are offsets from
# its start, anchored by reading CLOCK_MONOTONIC just before launching it).
# MODE=alternate: ROUNDS alternating runs, one wave of C streams per tool per round (exposed to
# whatever else the host does at each moment: much noisier).
# MODE=counters: each tool alone (spark-kit ROUNDS waves, then vLLM C x ROUNDS requests without
# warm-up), each read against the server's own counters (vllm:inter_token_latency_seconds
# count / sum over the run): does each client see the rate the server produced?
# Reported: medians over the counted streams of each tool.
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-2}
PROMPT=${PROMPT:-128}
OUT=${OUT:-256}
ROUNDS=${ROUNDS:-30}
MODE=${MODE:-together}
# vLLM completes about C requests per spark-kit wave (same batch); 1.5x that, plus its head start.
VL_PROMPTS=${VL_PROMPTS:-$((C * (ROUNDS * 3 / 2 + 8)))}
case "$MODE" in together | alternate | counters) ;; *)
  echo "error: MODE=$MODE: use MODE=together, MODE=alternate or MODE=counters" >&2
  exit 2
  ;;
esac

# SK=path/to/spark-kit uses that binary instead of building this checkout.
if [ -z "${SK:-}" ]; then
  cargo build -q --bin spark-kit
  SK=${CARGO_TARGET_DIR:-$PWD/target}/debug/spark-kit
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

# Model, tokenizer root, and the chat template's tokens (chat prompt of a text − the text alone).
read -r model root template < <(python3 - "$URL" <<'EOF'
import json, sys, urllib.request
url = sys.argv[1]
d = json.load(urllib.request.urlopen(url + "/v1/models", timeout=30))["data"][0]
def count(body):
    req = urllib.request.Request(url + "/tokenize", json.dumps({"model": d["id"], **body}).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=30))["count"]
text = "hello world, how are you"
t = count({"messages": [{"role": "user", "content": text}], "add_generation_prompt": True}) \
    - count({"prompt": text, "add_special_tokens": False})
print(d["id"], d.get("root") or d["id"], t)
EOF
)
vl_input=$((PROMPT - template))
if [ "$vl_input" -lt 1 ]; then
  echo "error: PROMPT=$PROMPT is not longer than the chat template ($template tokens); raise PROMPT" >&2
  exit 2
fi
echo "load ($MODE): $C streams per tool x $OUT tokens, prompt $PROMPT tokens (vLLM random text $vl_input + template $template)," \
  "$ROUNDS spark-kit waves, model $model at $URL" >&2

vllm_bench() { # $1 = result name, $2 = number of prompts, $3 = warm-up requests (default 1)
  "$py" -m vllm.entrypoints.cli.main bench serve --backend openai-chat --base-url "$URL" \
    --endpoint /v1/chat/completions --model "$model" --tokenizer "$root" --dataset-name random \
    --random-input-len "$vl_input" --random-output-len "$OUT" --random-range-ratio 0 --num-prompts "$2" \
    --max-concurrency "$C" --ignore-eos --temperature 0 --num-warmups "${3:-1}" --disable-tqdm \
    --save-result --save-detailed --result-dir "$work" --result-filename "$1.json" >"$work/$1.log" 2>&1
}
sk_bench() { # $1 = result name, $2 = waves
  "$sk" bench --url "$URL" --model "$model" --concurrency "$C" --decode-repeats "$2" --decode-tokens "$OUT" \
    --decode-prompt-tokens "$PROMPT" --prefill none --quiet --json "$work/$1.json" >/dev/null
}

counters() { # $1 = file: the server's inter-token latency count and sum so far
  "$py" - "$URL" >"$1" <<'EOF'
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1] + "/metrics", timeout=10).read().decode()
get = lambda n: sum(float(m) for m in re.findall(r"^vllm:%s\{[^}]*\} ([0-9.e+-]+)$" % n, text, re.M))
print(get("inter_token_latency_seconds_count"), get("inter_token_latency_seconds_sum"))
EOF
}

sk_files=()
vl_files=()
if [ "$MODE" = counters ]; then
  counters "$work/counters-0"
  sk_bench sk "$ROUNDS"
  counters "$work/counters-1"
  vllm_bench vllm $((C * ROUNDS)) 0 || { tail -20 "$work/vllm.log" >&2; echo "error: vllm bench serve failed" >&2; exit 1; }
  counters "$work/counters-2"
  sk_files=(sk)
  vl_files=(vllm)
elif [ "$MODE" = together ]; then
  vllm_bench vllm "$VL_PROMPTS" &
  vl_pid=$!
  # Wait (one process, polling /metrics) until vLLM's main run has C streams in flight.
  "$py" - "$URL" "$C" "$vl_pid" <<'EOF'
import os, re, sys, time, urllib.request
url, c, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(1200):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    running = sum(float(m) for m in re.findall(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", text, re.M))
    if running >= c:
        sys.exit(0)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(0)  # vLLM ended already: reported below
    time.sleep(0.25)
sys.exit("error: vLLM's load did not reach the concurrency within 300 s")
EOF
  "$py" -c 'import time; print(time.clock_gettime(time.CLOCK_MONOTONIC))' >"$work/sk.t0"
  sk_bench sk "$ROUNDS"
  sk_files=(sk)
  kill -0 "$vl_pid" 2>/dev/null || echo "note: vLLM's load ended before spark-kit's waves did; only the overlap counts" >&2
  wait "$vl_pid" || { tail -20 "$work/vllm.log" >&2; echo "error: vllm bench serve failed" >&2; exit 1; }
  vl_files=(vllm)
else
  for i in $(seq "$ROUNDS"); do
    sk_bench "sk-$i" 1
    sk_files+=("sk-$i")
    vllm_bench "vllm-$i" "$C" || { tail -20 "$work/vllm-$i.log" >&2; echo "error: vllm bench serve failed" >&2; exit 1; }
    vl_files+=("vllm-$i")
  done
fi

python3 - "$work" "$MODE" "${#sk_files[@]}" "${sk_files[@]}" "${vl_files[@]}" <<'EOF'
import json, statistics, sys
work, mode, n_sk = sys.argv[1], sys.argv[2], int(sys.argv[3])
sk_files, vl_files = sys.argv[4:4 + n_sk], sys.argv[4 + n_sk:]
med = statistics.median


def spark_kit(name):
    """Per stream (first, last, decode tok/s, TTFT, prompt tokens, completion tokens); wave aggregates."""
    d = json.load(open(f"{work}/{name}.json"))
    try:
        t0 = float(open(f"{work}/{name}.t0").read())  # CLOCK_MONOTONIC at launch
    except FileNotFoundError:
        t0 = 0.0
    streams = [(t0 + q["first_s"], t0 + q["last_s"], q["decode_tok_s"], q["ttft_s"], q["prompt_tokens"],
                q["completion_tokens"]) for w in d["decode"] for q in w["requests"] if q["decode_tok_s"]]
    return streams, [w["aggregate_tok_s"] for w in d["decode"] if w["aggregate_tok_s"]]


def vllm(name):
    """The same from `vllm bench serve --save-detailed` (main run only; warm-ups are not saved)."""
    v = json.load(open(f"{work}/{name}.json"))
    streams, firsts, lasts, tokens = [], [], [], 0
    for n, ttft, lat, st, p in zip(v["output_lens"], v["ttfts"], v["latencies"], v["start_times"], v["input_lens"]):
        if n > 1 and lat > ttft:
            streams.append((st + ttft, st + lat, (n - 1) / (lat - ttft), ttft, p, n))  # 1 / TPOT
            firsts.append(st + ttft)
            lasts.append(st + lat)
            tokens += n - 1
    return streams, [tokens / (max(lasts) - min(firsts))] if streams else []


sk, sk_agg, vl, vl_agg = [], [], [], []
for f in sk_files:
    s, a = spark_kit(f)
    sk += s
    sk_agg += a
for f in vl_files:
    s, a = vllm(f)
    vl += s
    vl_agg += a
if not sk or not vl:
    sys.exit(f"error: no finished streams (spark-kit {len(sk)}, vLLM {len(vl)})")

if mode == "together":
    lo = max(min(x[0] for x in sk), min(x[0] for x in vl))
    hi = min(max(x[1] for x in sk), max(x[1] for x in vl))
    inside = lambda xs: [x for x in xs if x[0] >= lo and x[1] <= hi]
    all_sk, all_vl = len(sk), len(vl)
    sk, vl = inside(sk), inside(vl)
    print(f"both loads ran for {max(hi - lo, 0):.1f} s: counted {len(sk)} of {all_sk} spark-kit streams, "
          f"{len(vl)} of {all_vl} vLLM streams (decode entirely inside that span)")
    if len(sk) < 10 or len(vl) < 10:
        sys.exit("error: fewer than 10 streams of a tool inside the common span; raise ROUNDS or VL_PROMPTS")
    mid = (lo + hi) / 2
    for half, a, b in (("first half ", lo, mid), ("second half", mid, hi)):
        s = [x[2] for x in sk if a <= x[0] < b]
        v = [x[2] for x in vl if a <= x[0] < b]
        if s and v:
            print(f"  {half}: spark-kit {med(s):7.1f} ({len(s)} streams)  vllm {med(v):7.1f} ({len(v)} streams)  "
                  f"ratio {med(s) / med(v):.3f}")
elif mode == "counters":
    c = [tuple(map(float, open(f"{work}/counters-{i}").read().split())) for i in range(3)]
    for name, xs, a, b in (("spark-kit", sk, c[0], c[1]), ("vllm     ", vl, c[1], c[2])):
        client = sum(x[5] - 1 for x in xs) / sum(x[1] - x[0] for x in xs)
        server = (b[0] - a[0]) / (b[1] - a[1])
        print(f"{name} alone: client {client:.1f} tok/s (Σ(tokens − 1) / Σ(t_last − t_first) over {len(xs)} streams), "
              f"server {server:.1f} tok/s ({b[0] - a[0]:.0f} inter-token intervals), client/server {client / server:.3f}")
else:
    print(f"aggregate (spark-kit's definition on both): {med(sk_agg):.1f} vs {med(vl_agg):.1f} tok/s, "
          f"ratio {med(sk_agg) / med(vl_agg):.3f}")


def line(name, xs):
    print(f"{name}: per-stream decode {med(x[2] for x in xs):.1f} tok/s (median of {len(xs)} streams, "
          f"{min(x[2] for x in xs):.0f}-{max(x[2] for x in xs):.0f}), TTFT {med(x[3] for x in xs) * 1e3:.0f} ms, "
          f"prompt {med(x[4] for x in xs):.0f} tokens")


line("spark-kit bench ", sk)
line("vllm bench serve", vl)
print(f"TTFT ratio spark-kit/vllm: {med(x[3] for x in sk) / med(x[3] for x in vl):.3f}")
ratio = med(x[2] for x in sk) / med(x[2] for x in vl)
ok = abs(ratio - 1) <= 0.10
print(f"per-stream decode ratio spark-kit/vllm: {ratio:.3f} ({'within' if ok else 'OUTSIDE'} 10 %)")
sys.exit(0 if ok else 1)
EOF
