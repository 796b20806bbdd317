#!/usr/bin/env bash
# The same hog against spark-kit's memory guard and against earlyoom, at the same floor, side
# by side in one run (issue 7). Per round: an "engine stand-in" (own process group,
# oom_score_adj 1000 like the real engine, one child) idles; a hog grows at RATE_MIB/s until
# 256 MiB past the floor (at most GROW_MIB).
# The floor is set relative to the current MemAvailable (hard = MemAvailable − FLOOR_BELOW_MIB).
# Reaction time = first moment MemAvailable ≤ floor (seen by the stand-in and the hog, which
# poll /proc/meminfo every ≤ 1 ms) → the moment the victim's SIGTERM handler runs (CLOCK_MONOTONIC
# in both). Who each tool killed is printed per round; the reaction-time ratio is printed last.
#   bash bench/guard.sh            (ROUNDS=5 GROW_MIB=1536 RATE_MIB=1536 FLOOR_BELOW_MIB=600)
# Target: spark-kit ≤ 0.5× earlyoom's reaction time, and the right victim (the hog).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
GROW_MIB=${GROW_MIB:-1536}
RATE_MIB=${RATE_MIB:-1536}
FLOOR_BELOW_MIB=${FLOOR_BELOW_MIB:-600}
MIB=$((1024 * 1024))

for tool in python3 earlyoom; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (earlyoom: apt-get install earlyoom)" >&2; exit 2; }
done
bin=${SPARK_KIT_BIN:-target/debug/spark-kit}
[ -x "$bin" ] || cargo build -q --bin spark-kit
avail_now() { echo $(( $(awk '/^MemAvailable:/{print $2}' /proc/meminfo) * 1024 )); }
if [ "$(avail_now)" -lt $(( (GROW_MIB + 3072) * MIB )) ]; then
  echo "error: MemAvailable $(( $(avail_now) / MIB )) MiB is too low for a ${GROW_MIB} MiB hog with a safety margin" >&2
  exit 1
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

cat >"$work/hog.py" <<'EOF'
# Grows up to `total` bytes (and at most HOG_AFTER_CROSSING past the floor) at `rate` bytes/s in
# 1 MiB chunks (0 = idle), polling MemAvailable after
# each chunk (idle: every 0.5 ms); writes <out>.crossed at the first reading ≤ floor and <out>
# from its SIGTERM handler. Env: HOG_OOM_ADJ, HOG_CHILD (one `sleep` child), HOG_DELAY.
import ctypes, json, os, signal, subprocess, sys, time
out, floor, total, rate, comm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
ctypes.CDLL(None).prctl(15, comm.encode()[:15], 0, 0, 0)
if os.environ.get("HOG_OOM_ADJ"):
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(os.environ["HOG_OOM_ADJ"])
child = subprocess.Popen(["sleep", "600"]) if os.environ.get("HOG_CHILD") else None
crossed, grown, grown_at_cross = None, 0, 0
def check():
    global crossed, grown_at_cross
    if crossed is not None:
        return
    with open("/proc/meminfo", "rb") as f:
        for l in f:
            if l.startswith(b"MemAvailable:"):
                if int(l.split()[1]) * 1024 <= floor:
                    crossed, grown_at_cross = time.monotonic(), grown
                    with open(out + ".crossed.tmp", "w") as c:
                        c.write(repr(crossed))
                    os.rename(out + ".crossed.tmp", out + ".crossed")
                return
def on_term(sig, frm):
    t = time.monotonic()
    with open(out + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "comm": comm, "t_signal": t, "t_crossed": crossed, "grown": grown}, f)
    os.rename(out + ".tmp", out)
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(float(os.environ.get("HOG_DELAY", "0")))
chunks, CH, t0 = [], 1 << 20, time.monotonic()
extra = int(os.environ.get("HOG_AFTER_CROSSING", str(total)))
while grown < total:
    if crossed is not None and grown >= grown_at_cross + extra:
        break
    chunks.append(b"\x01" * CH)
    grown += CH
    check()
    ahead = grown / rate - (time.monotonic() - t0)
    if ahead > 0:
        time.sleep(ahead)
while True:
    check()
    time.sleep(0.0005)
EOF

# start_proc NAME FLOOR TOTAL ENV... : start a hog/stand-in as a child of this shell (so the
# guard's --victims-under $$ scope covers it), wait for "ready"; its pid is in $LAST_PID.
start_proc() {
  local name=$1 floor=$2 total=$3; shift 3
  local fifo="$work/$name.ready"
  mkfifo "$fifo"
  env "$@" setsid python3 "$work/hog.py" "$work/$name.json" "$floor" "$total" $((RATE_MIB * MIB)) "${name%%-r*}" >"$fifo" &
  LAST_PID=$!
  pids+=("$LAST_PID")
  read -r _ <"$fifo"
}

# round TOOL N → one result line "tool victim reaction_ms"
round() {
  local tool=$1 n=$2 tag="$1-r$2"
  local standin hog tpid avail hard soft
  avail=$(avail_now)
  hard=$((avail - FLOOR_BELOW_MIB * MIB))
  soft=$((hard + 300 * MIB))
  start_proc "sk-standin-r$n-$tool" "$hard" 0 HOG_OOM_ADJ=1000 HOG_CHILD=1 HOG_DELAY=0
  standin=$LAST_PID
  if [ "$tool" = spark-kit ]; then
    "$bin" guard --kit tiny-cpu --pgid "$standin" --soft "$soft" --hard "$hard" --policy kill-offender \
      --receipts "$work/receipts-$n" --victims-under $$ --json >"$work/$tag.log" 2>&1 &
    tpid=$!
    until grep -q '"event":"started"' "$work/$tag.log" 2>/dev/null; do sleep 0.05; done
  else
    # Same floor: -M in KiB (SIGTERM at the floor, SIGKILL at half, like the guard); -s 100: ignore
    # swap; -p: nice -20 like the guard; --prefer: only our stand-in/hog get a bonus, so a shared
    # host's other processes are not picked.
    earlyoom -M $((hard / 1024)) -s 100 -p -r 0 --prefer '^sk-' >"$work/$tag.log" 2>&1 &
    tpid=$!
    until grep -q 'sending SIGTERM' "$work/$tag.log" 2>/dev/null; do sleep 0.05; done
  fi
  pids+=("$tpid")
  start_proc "sk-hog-r$n-$tool" "$hard" $((GROW_MIB * MIB)) HOG_DELAY=0.3 HOG_AFTER_CROSSING=$((256 * MIB))
  hog=$LAST_PID
  local until=$((SECONDS + 20))
  while [ ! -e "$work/sk-hog-r$n-$tool.json" ] && [ ! -e "$work/sk-standin-r$n-$tool.json" ] && [ $SECONDS -lt $until ]; do
    sleep 0.05
  done
  sleep 0.3
  kill "$tpid" 2>/dev/null || true
  wait "$tpid" 2>/dev/null || true
  kill -9 -- "-$standin" "-$hog" 2>/dev/null || true
  wait "$standin" "$hog" 2>/dev/null || true
  python3 - "$work" "$n" "$tool" <<'EOF'
import glob, json, os, sys
work, n, tool = sys.argv[1], sys.argv[2], sys.argv[3]
cross = [float(open(p).read()) for p in glob.glob(f"{work}/sk-*-r{n}-{tool}.json.crossed")]
victims = []
for who in ("hog", "standin"):
    p = f"{work}/sk-{who}-r{n}-{tool}.json"
    if os.path.exists(p):
        victims.append((json.load(open(p))["t_signal"], "hog" if who == "hog" else "engine-stand-in"))
victims.sort()
if not cross:
    print(f"{tool} no-crossing -")
elif not victims:
    print(f"{tool} none -")
else:
    # The first victim is the tool's choice; a second one means the first kill freed too little.
    killed = ">".join(v[1] for v in victims)
    print(f"{tool} {killed} {(victims[0][0] - min(cross)) * 1000:.1f}")
EOF
}

printf '%-6s %-10s %-16s %s\n' round tool killed reaction_ms
results=()
for n in $(seq 1 "$ROUNDS"); do
  for tool in spark-kit earlyoom; do
    for attempt in 1 2 3; do
      round "$tool" "$n" >"$work/result"
      line=$(cat "$work/result")
      # Other processes on a shared host can free memory while the hog grows: then the floor is
      # never crossed and the round says nothing about the tools. Run it again.
      [[ "$line" == *no-crossing* ]] || break
      rm -f "$work"/sk-*-r"$n"-"$tool".*
      echo "(round $n $tool: the floor was not crossed, other processes freed memory; again)" >&2
    done
    results+=("$line")
    read -r t victim ms <<<"$line"
    printf '%-6s %-10s %-16s %s\n' "$n" "$t" "$victim" "$ms"
    sleep 1
  done
done

printf '%s\n' "${results[@]}" | python3 -c '
import statistics, sys
rows = [l.split() for l in sys.stdin if l.strip()]
def summary(tool):
    rs = [r for r in rows if r[0] == tool]
    ms = [float(r[2]) for r in rs if r[2] not in ("-", "nan")]
    first = [r[1].split(">")[0] for r in rs]
    counts = {v: first.count(v) for v in sorted(set(first))}
    said = comma.join(f"{v} in {c}/{len(rs)} rounds" for v, c in counts.items())
    return (statistics.median(ms) if ms else float("nan")), sorted(counts), said
comma = chr(44) + " "
g, gv, gs = summary("spark-kit")
e, ev, es = summary("earlyoom")
print(f"spark-kit guard: first victim {gs}; median reaction {g:.1f} ms")
print(f"earlyoom:        first victim {es}; median reaction {e:.1f} ms")
verdict = "yes" if gv == ["hog"] else "NO"
print(f"right victim (the hog) for spark-kit: {verdict}")
print(f"reaction ratio spark-kit/earlyoom = {g / e:.2f} (target <= 0.5)")
'
