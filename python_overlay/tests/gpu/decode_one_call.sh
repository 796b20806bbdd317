#!/bin/bash
# Issue 30's measurements in one device call of at most ~9 minutes: the own kernel's sweep (accuracy, graph replay,
# the served defaults and the layouts beside them) runs while exllamav3's extension builds on the other cores, then
# the side by side with exllamav3 at the same rows takes that build (--prebuilt), all on one card. Results go to
# $OUT/results.tgz (one file: a device call brings back at most 8). ncu profiles of the served call at NCU_ROWS
# (default 1,4; empty: none) fill the time the build still needs after the sweep, and the time left at the end.
#
#   bash python_overlay/tests/gpu/decode_one_call.sh WHEEL [ROWS] [DEADLINE_S]
#
# WHEEL: exllamav3-1.6.5-py3-none-any.whl; ROWS: row counts for both (default 1,2,4); DEADLINE_S: seconds after which
# the side by side is stopped so the results still come back (default 540).
set -u
W=${1:?usage: decode_one_call.sh WHEEL [ROWS] [DEADLINE_S]}
ROWS=${2:-1,2,4}
DEADLINE=${3:-540}
: "${OUT:?OUT: the folder whose files come back}"
R=$OUT/r
mkdir -p "$R"
rm -f /tmp/exl3-so.txt
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
export PYTHONPATH=python_overlay:python_overlay/tests/gpu
nice -n 10 python3 -c "import sys; from pathlib import Path; from exl3_ground_truth import build_extension; \
e, t = build_extension(Path(sys.argv[1]), Path('/tmp/exl3-scratch')); print(f'{t:.0f} s'); open('/tmp/exl3-so.txt', 'w').write(e.__file__)" \
  "$W" > "$R/build-exl3.log" 2>&1 &
builder=$!
NCU_LEFT=$(echo "${NCU_ROWS-1,4}" | tr ',' ' ')
# ncu_one: the next row count's profile, if ncu exists and the deadline leaves it 100 s
ncu_one() {
  local r=${NCU_LEFT%% *}
  [ -n "$r" ] && command -v ncu > /dev/null && [ "$(el)" -lt $(( DEADLINE - 100 )) ] || return 1
  NCU_LEFT=$(echo "$NCU_LEFT" | cut -s -d' ' -f2-)
  timeout 100 ncu --clock-control none -k regex:gemv --launch-skip 2 --launch-count 2 \
    --metrics smsp__inst_executed.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy \
    --section InstructionStats --section SchedulerStats --section LaunchStats \
    python3 python_overlay/tests/gpu/exl3_decode_own.py --out /tmp/ncu-p --profile "$r" > "$R/ncu-rows$r.txt" 2>&1
  echo "ncu at $r rows rc=$? at $(el) s"
}
timeout $(( DEADLINE / 2 )) python3 python_overlay/tests/gpu/exl3_decode_own.py --rows "$ROWS" --out "$R/own" > "$R/own.log" 2>&1
echo "own sweep rc=$? at $(el) s: $(tail -1 "$R/own.log")"
grep -h served_defaults "$R/own.log" | cut -c1-220
while kill -0 $builder 2> /dev/null && ncu_one; do :; done
wait $builder
echo "exllamav3 built at $(el) s ($(tail -1 "$R/build-exl3.log"))"
if [ -s /tmp/exl3-so.txt ] && [ "$(el)" -lt $(( DEADLINE - 60 )) ]; then
  timeout $(( DEADLINE - $(el) )) python3 python_overlay/tests/gpu/exl3_moe_decode.py --wheel "$W" --prebuilt "$(cat /tmp/exl3-so.txt)" \
    --rows "$ROWS" --skip linears,accuracy --out "$R" > "$R/decode.log" 2>&1
  echo "side by side rc=$? at $(el) s"
  grep -h '"exl3_best_us"' "$R/decode.log" | python3 -c "
import sys, json
for line in sys.stdin:
    d = json.loads(line)
    print(d['tokens'], 'rows: floor', d['floor_us'], 'exllamav3', d['exl3_best_us'], 'default', d['default_us'],
          'speed-up', round(d['exl3_best_us'] / d['default_us'], 3))"
else
  echo "side by side skipped: no exllamav3 build, or past the deadline"
fi
while ncu_one; do :; done
nvidia-smi --query-gpu=name --format=csv,noheader
cd "$OUT" && tar czf results.tgz r && rm -rf r
