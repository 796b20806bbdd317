#!/usr/bin/env bash
# Download speed, three pairs on the same files in one run, each pair's ratio last, then a
# summary whose last lines are the ratios:
#  1. `spark-kit download` vs `hf download --max-workers 8` (huggingface_hub CLI from the engine
#     venv) against the test Hub (examples/test_hub --no-xet), RATE bytes/s per connection;
#  2. the Xet path: spark-kit (model.transport: xet) vs `hf download` with hf_xet
#     (tests/xet-venv.sh) against the test Hub's CAS (xet-core's local CAS server), no cap;
#  3. the bridge path against nginx with `limit_rate NGINX_RATE` per connection: both clients,
#     plus spark-kit's fraction of the link rate (JOBS x NGINX_RATE) and verified/downloaded.
#     Skipped with the install command when nginx is absent (apt-get install -y nginx).
#   bash bench/download.sh            # 4 files x 512 MiB (needs ~9 GiB free in $TMPDIR)
#   FILES=4 SIZE_MIB=512 RATE=50000000 NGINX_RATE=6250000 JOBS=16 bash bench/download.sh
# Prints both times to a complete verified cache and the ratio hf / spark-kit.
# spark-kit verifies while downloading (a file enters the cache only after its SHA-256
# matched) and fsyncs every file before it enters the cache; `hf download` neither hashes nor
# fsyncs, so its time-to-verified adds `hf cache verify` and a `sync` (same end state: every
# file verified and on disk). The hf time without the sync is printed too.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-4}
SIZE_MIB=${SIZE_MIB:-512}
RATE=${RATE:-50000000}
NGINX_RATE=${NGINX_RATE:-6250000}
JOBS=${JOBS:-16}
PROFILE=${PROFILE:-release}

work=$(mktemp -d "${TMPDIR:-/tmp}/spark-kit-bench-dl.XXXXXX")
xhub_pid=""
nginx_pid=""
cleanup() {
  if [ -n "$xhub_pid" ]; then kill "$xhub_pid" 2>/dev/null || true; wait "$xhub_pid" 2>/dev/null || true; fi
  if [ -n "$nginx_pid" ]; then kill "$nginx_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The files, the CAS's copy, and at most two caches at a time (each pair's are removed after it).
need=$(( FILES * SIZE_MIB * 4 + 512 ))
avail=$(( $(df -Pm "$work" | awk 'NR==2 {print $4}') ))
if [ "$avail" -lt "$need" ]; then
  echo "bench: need ${need} MiB free in $work, have ${avail} MiB" >&2; exit 1
fi

flag=""; [ "$PROFILE" = release ] && flag="--release"
echo "bench: building ($PROFILE)" >&2
cargo build -q $flag --bin spark-kit --example test_hub
bin="${CARGO_TARGET_DIR:-target}/$PROFILE/spark-kit"
test_hub="${CARGO_TARGET_DIR:-target}/$PROFILE/examples/test_hub"
venv=$("$bin" setup --kit tiny-cpu --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["path"])')
hf="$venv/bin/hf"

echo "bench: generating $FILES x $SIZE_MIB MiB of random data in $work" >&2
mkdir -p "$work/files"
for i in $(seq 1 "$FILES"); do
  head -c "$((SIZE_MIB << 20))" /dev/urandom > "$work/files/model-$(printf %05d "$i")-of-$(printf %05d "$FILES").safetensors"
done

secs() { python3 -c "print(f'{$2-$1:.2f}')"; }
# wait_endpoint NAME: the test Hub's endpoint once $work/NAME-endpoint exists.
wait_endpoint() {
  for _ in $(seq 1 3000); do [ -s "$work/$1-endpoint" ] && break; sleep 0.2; done
  [ -s "$work/$1-endpoint" ] || { echo "bench: test Hub did not start" >&2; cat "$work/$1-hub.log" >&2; exit 1; }
  cat "$work/$1-endpoint"
}
# stop_hub: stop the test Hub started last.
stop_hub() { kill "$xhub_pid" 2>/dev/null || true; wait "$xhub_pid" 2>/dev/null || true; xhub_pid=""; }

"$test_hub" "$work/files" --repo bench-org/model --no-xet --rate "$RATE" --endpoint-file "$work/cdn-endpoint" \
  > "$work/cdn-hub.log" 2>&1 &
xhub_pid=$!
endpoint=$(wait_endpoint cdn)
echo "bench: test Hub at $endpoint, ${RATE} B/s per connection" >&2

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
cdn_ratio=$(python3 -c "print(f'{$hf_verified/$sk_total:.2f}')")
echo "ratio (hf time-to-verified / spark-kit time-to-verified): ${cdn_ratio}x"
stop_hub
rm -rf "$work/sk-cache" "$work/hf-cache"

# ---- The Xet path: both clients against the test Hub's CAS (xet-core's local CAS server, the
# files put in by hf-xet's upload path), no rate cap: the clients' own throughput.
# sk_download ENDPOINT KIT TAG: spark-kit download from a cold page cache; prints
# "transfer_seconds seconds xet_files fetched_bytes process_seconds".
sk_download() {
  sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
  local t0 t1
  t0=$(now)
  HF_ENDPOINT="$1" "$bin" download --kit "$2" --jobs "$JOBS" --json --quiet > "$work/$3.json"
  t1=$(now)
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('%.2f %.2f %d %d %.2f' % (j['transfer_seconds'], j['seconds'], j['xet_files'], j['fetched_bytes'], $t1-$t0))" "$work/$3.json"
}
xpy=$(bash tests/xet-venv.sh)
xhf="$(dirname "$xpy")/hf"
echo "bench: test Hub with the CAS (uploading the files through hf-xet)" >&2
"$test_hub" "$work/files" --repo bench-org/model --endpoint-file "$work/xet-endpoint" > "$work/xet-hub.log" 2>&1 &
xhub_pid=$!
xendpoint=$(wait_endpoint xet)
sed -e "s#  revision: main#  revision: main\n  transport: xet#" -e "s#$work/sk-#$work/skx-#g" "$work/kit.yaml" > "$work/kit-xet.yaml"
read -r skx_transfer skx_verified skx_xet skx_bytes skx_total < <(sk_download "$xendpoint" "$work/kit-xet.yaml" skx)
rm -rf "$work/skx-cache"
t0=$(now)
HF_ENDPOINT="$xendpoint" HF_HOME="$work/hfx-home" HF_HUB_CACHE="$work/hfx-cache" HF_HUB_DISABLE_TELEMETRY=1 \
  HF_HUB_DISABLE_PROGRESS_BARS=1 "$xhf" download bench-org/model --max-workers 8 --quiet > /dev/null 2>"$work/hfx.log"
t1=$(now)
( cd "$work/hfx-cache/models--bench-org--model/snapshots/"*/ && sha256sum -- * ) > "$work/hfx.sums"
sync
t2=$(now)
( cd "$work/files" && sha256sum -- * ) | diff -q - "$work/hfx.sums" > /dev/null || { echo "bench: hf (Xet) bytes differ" >&2; exit 1; }
hfx_dl=$(secs "$t0" "$t1")
hfx_verified=$(secs "$t0" "$t2")
total_mb=$(python3 -c "print($FILES*$SIZE_MIB*1048576/1e6)")
echo "xet: $FILES x $SIZE_MIB MiB from the local CAS, spark-kit --jobs $JOBS (model.transport: xet, $skx_xet Xet files), hf download --max-workers 8 with hf_xet"
echo "xet spark-kit: downloaded in ${skx_transfer} s, verified in ${skx_verified} s (process ${skx_total} s, $(python3 -c "print(f'{$total_mb/$skx_total:.0f}')") MB/s); verified/downloaded: $(python3 -c "print(f'{$skx_verified/$skx_transfer:.3f}')"); ${skx_bytes} bytes written"
echo "xet hf download: downloaded in ${hfx_dl} s, + sha256sum + sync = verified on disk in ${hfx_verified} s ($(python3 -c "print(f'{$total_mb/$hfx_verified:.0f}')") MB/s)"
xet_ratio=$(python3 -c "print(f'{$hfx_verified/$skx_total:.2f}')")
echo "xet ratio (hf time-to-verified / spark-kit time-to-verified): ${xet_ratio}x"
stop_hub
rm -rf "$work/hfx-cache" "$work/hfx-home"

# ---- The bridge path against a real HTTP server: nginx serving the files by sha256 with
# `limit_rate` per connection; the test Hub's `resolve` redirects there.
if ! command -v nginx > /dev/null; then
  echo "nginx: not installed, so the bridge-vs-nginx pair is skipped; install it and re-run:"
  echo "  sudo apt-get install -y nginx && bash bench/download.sh"
  echo "ratio (hf / spark-kit, time-to-verified): test Hub ${cdn_ratio}x; Xet ${xet_ratio}x; nginx skipped"
  exit 0
fi
mkdir -p "$work/bridge" "$work/nginx"
chmod a+rx "$work" "$work/files" "$work/bridge" # nginx's workers run as another user
for f in "$work/files"/*; do ln -s "$f" "$work/bridge/$(sha256sum "$f" | cut -d' ' -f1)"; done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/nginx/nginx.conf" <<NGINX
worker_processes 2;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 256; }
http {
  access_log off;
  sendfile on;
  client_body_temp_path $work/nginx; proxy_temp_path $work/nginx; fastcgi_temp_path $work/nginx;
  uwsgi_temp_path $work/nginx; scgi_temp_path $work/nginx;
  server {
    listen 127.0.0.1:$port;
    location /xet-bridge/ { alias $work/bridge/; limit_rate $NGINX_RATE; }
  }
}
NGINX
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" &
nginx_pid=$!
"$test_hub" "$work/files" --repo bench-org/model --no-xet --bridge "http://127.0.0.1:$port" \
  --endpoint-file "$work/ngx-endpoint" > "$work/ngx-hub.log" 2>&1 &
xhub_pid=$!
nendpoint=$(wait_endpoint ngx)
sed -e "s#$work/sk-#$work/skn-#g" "$work/kit.yaml" > "$work/kit-ngx.yaml"
read -r skn_transfer skn_verified _ skn_bytes skn_total < <(sk_download "$nendpoint" "$work/kit-ngx.yaml" skn)
rm -rf "$work/skn-cache"
t0=$(now)
HF_ENDPOINT="$nendpoint" HF_HUB_CACHE="$work/hfn-cache" HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
  HF_HUB_DISABLE_XET=1 "$hf" download bench-org/model --max-workers 8 --quiet > /dev/null 2>"$work/hfn.log"
t1=$(now)
HF_ENDPOINT="$nendpoint" HF_HUB_DISABLE_TELEMETRY=1 "$hf" cache verify bench-org/model --cache-dir "$work/hfn-cache" > "$work/hfnv.log" 2>&1
sync
t2=$(now)
grep -q "All checksums match" "$work/hfnv.log" || { echo "bench: hf cache verify (nginx) failed" >&2; cat "$work/hfnv.log" >&2; exit 1; }
hfn_dl=$(secs "$t0" "$t1")
hfn_verified=$(secs "$t0" "$t2")
link=$(python3 -c "print($JOBS*$NGINX_RATE)")
fraction=$(python3 -c "print(f'{$skn_bytes/$skn_transfer/$link:.2f}')")
vd=$(python3 -c "print(f'{$skn_verified/$skn_transfer:.3f}')")
echo "nginx: limit_rate $NGINX_RATE B/s per connection; spark-kit --jobs $JOBS (link rate $JOBS x limit = $(python3 -c "print(f'{$link/1e6:.0f}')") MB/s), hf --max-workers 8"
echo "nginx spark-kit: downloaded in ${skn_transfer} s, verified in ${skn_verified} s (process ${skn_total} s); fraction of the link rate: ${fraction}; verified/downloaded: ${vd}"
echo "nginx hf download: downloaded in ${hfn_dl} s, + hf cache verify + sync = verified on disk in ${hfn_verified} s"
ngx_ratio=$(python3 -c "print(f'{$hfn_verified/$skn_total:.2f}')")
echo "nginx ratio (hf time-to-verified / spark-kit time-to-verified): ${ngx_ratio}x"
echo
echo "summary ($FILES x $SIZE_MIB MiB, load average now $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs):"
echo "  nginx bridge path: fraction of the link rate ${fraction} (goal >= 0.9), verified/downloaded ${vd} (goal <= 1.05)"
echo "ratio (hf / spark-kit, time-to-verified): test Hub ${cdn_ratio}x; Xet ${xet_ratio}x; nginx ${ngx_ratio}x"
