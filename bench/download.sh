#!/usr/bin/env bash
# Download speed: `spark-kit download` vs `hf download --max-workers 8` (huggingface_hub CLI from
# the engine venv) against the fake Hub capped at 50 MB/s per connection, in one run.
#   bash bench/download.sh            # 4 files x 512 MiB (needs ~6.5 GiB free in $TMPDIR)
#   FILES=4 SIZE_MIB=512 RATE=50000000 JOBS=16 bash bench/download.sh
# Prints both times to a complete verified cache and, last, the ratio hf / spark-kit.
# spark-kit verifies while downloading (a file enters the cache only after its SHA-256
# matched) and fsyncs every file before it enters the cache; `hf download` neither hashes nor
# fsyncs, so its time-to-verified adds `hf cache verify` and a `sync` (same end state: every
# file verified and on disk). The hf time without the sync is printed too.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-4}
SIZE_MIB=${SIZE_MIB:-512}
RATE=${RATE:-50000000}
JOBS=${JOBS:-16}
PROFILE=${PROFILE:-release}

work=$(mktemp -d "${TMPDIR:-/tmp}/spark-kit-bench-dl.XXXXXX")
hub_pid=""
cleanup() {
  touch "$work/stop" 2>/dev/null || true
  if [ -n "$hub_pid" ]; then wait "$hub_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

need=$(( FILES * SIZE_MIB * 3 + 256 ))
avail=$(( $(df -Pm "$work" | awk 'NR==2 {print $4}') ))
if [ "$avail" -lt "$need" ]; then
  echo "bench: need ${need} MiB free in $work, have ${avail} MiB" >&2; exit 1
fi

flag=""; [ "$PROFILE" = release ] && flag="--release"
echo "bench: building ($PROFILE)" >&2
cargo build -q $flag --bin spark-kit
cargo test -q $flag --no-run --test download_bench_hub 2>/dev/null
bin="${CARGO_TARGET_DIR:-target}/$PROFILE/spark-kit"
venv=$("$bin" setup --kit tiny-cpu --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["path"])')
hf="$venv/bin/hf"

echo "bench: generating $FILES x $SIZE_MIB MiB of random data in $work" >&2
mkdir -p "$work/files"
for i in $(seq 1 "$FILES"); do
  head -c "$((SIZE_MIB << 20))" /dev/urandom > "$work/files/model-$(printf %05d "$i")-of-$(printf %05d "$FILES").safetensors"
done

SPARK_KIT_BENCH_DIR="$work" SPARK_KIT_BENCH_RATE="$RATE" \
  cargo test -q $flag --test download_bench_hub -- --ignored --exact serve >"$work/hub.log" 2>&1 &
hub_pid=$!
for _ in $(seq 1 600); do [ -s "$work/endpoint" ] && break; sleep 0.2; done
[ -s "$work/endpoint" ] || { echo "bench: fake Hub did not start" >&2; cat "$work/hub.log" >&2; exit 1; }
endpoint=$(cat "$work/endpoint")
echo "bench: fake Hub at $endpoint, ${RATE} B/s per connection" >&2

cat > "$work/kit.yaml" <<KIT
name: bench-download
description: download benchmark
model:
  source: hub
  repo: bench-org/model
  revision: main
  expected_shards: $FILES
nodes:
  - name: local
    role: head
    transport: local
tensor_parallel_size: 1
engine:
  requirements: engine-tiny-cpu
  served_model_name: bench
paths:
  hf_cache: $work/sk-cache
  data_dir: $work/sk-data
  engram_dir: $work/sk-engram
KIT

sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
now() { date +%s.%N; }
t0=$(now)
HF_ENDPOINT="$endpoint" "$bin" download --kit "$work/kit.yaml" --jobs "$JOBS" --json --quiet > "$work/sk.json"
t1=$(now)
sk_total=$(python3 -c "print(f'{$t1-$t0:.2f}')")
read -r sk_transfer sk_verified sk_bytes sk_retries < <(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('%.2f %.2f %d %d' % (j['transfer_seconds'], j['seconds'], j['fetched_bytes'], j['retries']))" "$work/sk.json")
HF_ENDPOINT="$endpoint" "$bin" verify --kit "$work/kit.yaml" > /dev/null

t0=$(now)
HF_ENDPOINT="$endpoint" HF_HUB_CACHE="$work/hf-cache" HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
  "$hf" download bench-org/model --max-workers 8 --quiet > /dev/null 2>"$work/hf.log"
t1=$(now)
HF_ENDPOINT="$endpoint" HF_HUB_DISABLE_TELEMETRY=1 "$hf" cache verify bench-org/model --cache-dir "$work/hf-cache" > "$work/hfv.log" 2>&1
t2=$(now)
sync
t3=$(now)
grep -q "All checksums match" "$work/hfv.log" || { echo "bench: hf cache verify failed" >&2; cat "$work/hfv.log" >&2; exit 1; }
hf_dl=$(python3 -c "print(f'{$t1-$t0:.2f}')")
hf_verified_cached=$(python3 -c "print(f'{$t2-$t0:.2f}')")
hf_verified=$(python3 -c "print(f'{$t3-$t0:.2f}')")

mb() { python3 -c "print(f'{$sk_bytes/1e6/$1:.0f}')"; }
echo "files: $FILES x $SIZE_MIB MiB, CDN cap ${RATE} B/s per connection, spark-kit --jobs $JOBS, hf --max-workers 8"
echo "spark-kit: downloaded in ${sk_transfer} s, verified in ${sk_verified} s (process ${sk_total} s, $(mb "$sk_verified") MB/s, ${sk_retries} retries)"
echo "spark-kit: time-to-verified / time-to-downloaded = $(python3 -c "print(f'{$sk_verified/$sk_transfer:.3f}')")"
echo "hf download: downloaded in ${hf_dl} s, + hf cache verify = verified in ${hf_verified_cached} s, + sync = verified on disk in ${hf_verified} s ($(mb "$hf_verified") MB/s)"
echo "load average during the run: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
echo "hf download only / spark-kit verified = $(python3 -c "print(f'{$hf_dl/$sk_total:.2f}')")x; hf verified (page cache) / spark-kit = $(python3 -c "print(f'{$hf_verified_cached/$sk_total:.2f}')")x"
echo "ratio (hf time-to-verified / spark-kit time-to-verified): $(python3 -c "print(f'{$hf_verified/$sk_total:.2f}')")x"
