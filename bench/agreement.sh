#!/usr/bin/env bash
# Agreement: the same load measured by `spark-kit bench` and by vLLM's own `vllm bench serve`
# (from the tiny-cpu engine venv) on the tiny-cpu endpoint. Prints both, and the ratio last.
# Target: per-stream decode within 10 % (exit 1 otherwise).
#
#   bash bench/agreement.sh                                # starts `spark-kit up --kit tiny-cpu` itself
#   URL=http://127.0.0.1:8000 bash bench/agreement.sh      # an endpoint that is already up
#
# Load (environment overrides): one wave of C=4 streams started together, PROMPT=128 prompt tokens,
# OUT=256 output tokens with ignore_eos, temperature 0; ROUNDS=6 alternating rounds per tool.
# Reported: medians over all streams of all rounds (robust to a round where a starved server
# delivered a whole stream in one burst). Both tools define per-stream decode the same way:
# spark-kit (completion_tokens − 1) / (t_last − t_first); vLLM 1 / TPOT with
# TPOT = (latency − TTFT) / (output_tokens − 1), output_tokens from the streamed usage block
# (computed here per request from `--save-detailed`). The aggregate applies spark-kit's
# definition, sum (tokens − 1) / (max t_last − min t_first), to both tools' per-request times.
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-4}
PROMPT=${PROMPT:-128}
OUT=${OUT:-256}
ROUNDS=${ROUNDS:-6}

cargo build -q --bin spark-kit
sk=$PWD/target/debug/spark-kit
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
  for _ in $(seq 600); do
    grep -q '^Ctrl-C' "$work/up.out" 2>/dev/null && break
    if ! kill -0 "$up_pid" 2>/dev/null; then
      cat "$work/up.err" >&2
      echo "error: spark-kit up exited before the endpoint was ready" >&2
      exit 1
    fi
    sleep 1
  done
  grep -q '^Ctrl-C' "$work/up.out" || { echo "error: endpoint not ready in 600 s" >&2; exit 1; }
  URL=http://127.0.0.1:$port
fi

read -r model root < <(python3 - "$URL" <<'EOF'
import json, sys, urllib.request
d = json.load(urllib.request.urlopen(sys.argv[1] + "/v1/models", timeout=30))["data"][0]
print(d["id"], d.get("root") or d["id"])
EOF
)
echo "load: $C streams x $OUT tokens, prompt $PROMPT tokens, $ROUNDS rounds per tool, model $model at $URL" >&2

for i in $(seq "$ROUNDS"); do
  "$sk" bench --url "$URL" --model "$model" --concurrency "$C" --decode-tokens "$OUT" \
    --decode-prompt-tokens "$PROMPT" --prefill none --quiet --json "$work/sk-$i.json" >/dev/null
  "$py" -m vllm.entrypoints.cli.main bench serve --backend openai-chat --base-url "$URL" \
    --endpoint /v1/chat/completions --model "$model" --tokenizer "$root" --dataset-name random \
    --random-input-len "$PROMPT" --random-output-len "$OUT" --random-range-ratio 0 --num-prompts "$C" \
    --max-concurrency "$C" --ignore-eos --temperature 0 --num-warmups 1 --disable-tqdm \
    --save-result --save-detailed --result-dir "$work" --result-filename "vllm-$i.json" >"$work/vllm-$i.log" 2>&1 \
    || { tail -20 "$work/vllm-$i.log" >&2; echo "error: vllm bench serve failed" >&2; exit 1; }
done

python3 - "$work" "$ROUNDS" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
med = statistics.median
# Per request: (decode tok/s of the stream, TTFT s); per wave: aggregate decode tok/s.
sk_req, vl_req, sk_agg, vl_agg = [], [], [], []
for i in range(1, rounds + 1):
    w = json.load(open(f"{work}/sk-{i}.json"))["decode"][0]
    sk = [(q["decode_tok_s"], q["ttft_s"]) for q in w["requests"] if q["decode_tok_s"]]
    sk_agg.append(w["aggregate_tok_s"])
    v = json.load(open(f"{work}/vllm-{i}.json"))
    firsts, lasts, tokens, vl = [], [], 0, []
    for n, ttft, lat, st in zip(v["output_lens"], v["ttfts"], v["latencies"], v["start_times"]):
        if n > 1 and lat > ttft:
            vl.append(((n - 1) / (lat - ttft), ttft))  # 1 / TPOT, TPOT = (latency - TTFT) / (n - 1)
            firsts.append(st + ttft)
            lasts.append(st + lat)
            tokens += n - 1
    vl_agg.append(tokens / (max(lasts) - min(firsts)))
    sk_req += sk
    vl_req += vl
    print(f"round {i}: spark-kit bench {med(x[0] for x in sk):8.1f} tok/s/stream, TTFT {med(x[1] for x in sk) * 1e3:5.0f} ms, "
          f"aggregate {sk_agg[-1]:7.1f} | vllm bench serve {med(x[0] for x in vl):8.1f} tok/s/stream, "
          f"TTFT {med(x[1] for x in vl) * 1e3:5.0f} ms, aggregate {vl_agg[-1]:7.1f}")


def line(name, req, agg):
    print(f"{name}: per-stream decode {med(x[0] for x in req):.1f} tok/s (median of {len(req)} streams), "
          f"TTFT {med(x[1] for x in req) * 1e3:.0f} ms, aggregate {med(agg):.1f} tok/s (median of {len(agg)} waves)")


line("spark-kit bench ", sk_req, sk_agg)
line("vllm bench serve", vl_req, vl_agg)
print(f"TTFT ratio spark-kit/vllm: {med(x[1] for x in sk_req) / med(x[1] for x in vl_req):.3f}")
print(f"aggregate ratio spark-kit/vllm: {med(sk_agg) / med(vl_agg):.3f}")
ratio = med(x[0] for x in sk_req) / med(x[0] for x in vl_req)
ok = abs(ratio - 1) <= 0.10
print(f"per-stream decode ratio spark-kit/vllm: {ratio:.3f} ({'within' if ok else 'OUTSIDE'} 10 %)")
sys.exit(0 if ok else 1)
EOF
