#!/usr/bin/env bash
# Agreement: the same load measured by `spark-kit bench` and by vLLM's own `vllm bench serve`
# (from the tiny-cpu engine venv) on the tiny-cpu endpoint. Prints both, and the ratio last.
# Target: per-stream decode within 10 % (exit 1 otherwise).
#
#   bash bench/agreement.sh                                # starts `spark-kit up --kit tiny-cpu` itself
#   URL=http://127.0.0.1:8000 bash bench/agreement.sh      # an endpoint that is already up
#
# Load (environment overrides): one wave of C=4 streams started together, PROMPT=128 prompt tokens,
# OUT=64 output tokens with ignore_eos, temperature 0; ROUNDS=3 alternating rounds per tool, the
# median of the rounds is reported. Both tools define per-stream decode the same way:
# spark-kit (completion_tokens − 1) / (t_last − t_first); vLLM 1 / TPOT with
# TPOT = (latency − TTFT) / (output_tokens − 1), output_tokens from the streamed usage block.
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-4}
PROMPT=${PROMPT:-128}
OUT=${OUT:-64}
ROUNDS=${ROUNDS:-3}

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
    --save-result --result-dir "$work" --result-filename "vllm-$i.json" >"$work/vllm-$i.log" 2>&1 \
    || { tail -20 "$work/vllm-$i.log" >&2; echo "error: vllm bench serve failed" >&2; exit 1; }
done

python3 - "$work" "$ROUNDS" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
sk, vl = [], []
for i in range(1, rounds + 1):
    s = json.load(open(f"{work}/sk-{i}.json"))["decode"][0]
    v = json.load(open(f"{work}/vllm-{i}.json"))
    sk.append((s["decode_tok_s"]["median"], s["ttft_s"]["median"] * 1e3, s["aggregate_tok_s"]))
    vl.append((1e3 / v["median_tpot_ms"], v["median_ttft_ms"], v["output_throughput"]))
    print(f"round {i}: spark-kit bench {sk[-1][0]:6.1f} tok/s/stream, TTFT {sk[-1][1]:6.0f} ms | "
          f"vllm bench serve {vl[-1][0]:6.1f} tok/s/stream, TTFT {vl[-1][1]:6.0f} ms")
med = lambda xs, k: statistics.median(x[k] for x in xs)
print(f"spark-kit bench : per-stream decode {med(sk, 0):.2f} tok/s, TTFT {med(sk, 1):.0f} ms, aggregate {med(sk, 2):.1f} tok/s (first to last token)")
print(f"vllm bench serve: per-stream decode {med(vl, 0):.2f} tok/s (1000 / median TPOT), TTFT {med(vl, 1):.0f} ms, output throughput {med(vl, 2):.1f} tok/s (incl. prefill)")
print(f"TTFT ratio spark-kit/vllm: {med(sk, 1) / med(vl, 1):.3f}")
ratio = med(sk, 0) / med(vl, 0)
ok = abs(ratio - 1) <= 0.10
print(f"per-stream decode ratio spark-kit/vllm: {ratio:.3f} ({'within' if ok else 'OUTSIDE'} 10 %)")
sys.exit(0 if ok else 1)
EOF
