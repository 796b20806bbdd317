#!/usr/bin/env bash
# Engram row lookups: spark-kit's row store (Rust, O_DIRECT, cache off) and the overlay's
# pure-Python preadv store against `fio` random 4 KiB O_DIRECT reads of the same file, same
# queue depth, in one run:
#   batch 1          vs fio psync, 1 job (QD 1)
#   batch 64, 1024   vs fio psync, THREADS jobs (QD THREADS = the store's reader threads)
# A 264-byte record is one 4 KiB read (two when it straddles a page: 6.4 % of records), so
# rows/s is compared with fio's IOPS. Also measured: each store's CPU ceiling (batch 1024,
# buffered reads of a 64 MiB file held in the page cache), which says how fast a disk each can
# keep up with. Prints every number, and the ratio last.
#   bash bench/engram.sh                       # 2 GiB file under $CARGO_TARGET_DIR/engram-bench
#   SIZE_MIB=4096 THREADS=16 SECONDS_EACH=10 BENCH_DIR=/var/tmp/eb bash bench/engram.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB=${SIZE_MIB:-2048}
THREADS=${THREADS:-16}
SECONDS_EACH=${SECONDS_EACH:-10}
PROFILE=${PROFILE:-release}
target=${CARGO_TARGET_DIR:-target}
dir=${BENCH_DIR:-$target/engram-bench}
command -v fio >/dev/null || { echo "bench: fio is not installed (apt-get install fio)" >&2; exit 1; }
mkdir -p "$dir"
fstype=$(stat -f -c %T "$dir")
if [ "$fstype" = tmpfs ] || [ "$fstype" = ramfs ]; then
  echo "bench: $dir is on $fstype (no O_DIRECT); set BENCH_DIR to a directory on a real disk" >&2; exit 1
fi
file="$dir/engram-l14-r0of1.bin"
rows=$(( SIZE_MIB * 1024 * 1024 / 264 ))
want=$(( 4096 + rows * 264 ))
if [ ! -f "$file" ] || [ "$(stat -c %s "$file")" != "$want" ]; then
  echo "bench: writing $file ($rows random records, $SIZE_MIB MiB)" >&2
  python3 - "$file.partial" "$rows" <<'PY'
import struct, sys
path, rows = sys.argv[1], int(sys.argv[2])
with open(path, "wb") as f:
    f.write(struct.pack("<6Q", 0x31344E4531565344, 14, 0, rows, rows, 264).ljust(4096, b"\0"))
PY
  head -c $(( rows * 264 )) /dev/urandom >> "$file.partial"
  sync "$file.partial"
  mv "$file.partial" "$file"
fi

small="$dir/engram-l1-r0of1.bin"
srows=$(( 64 * 1024 * 1024 / 264 ))
if [ ! -f "$small" ] || [ "$(stat -c %s "$small")" != "$(( 4096 + srows * 264 ))" ]; then
  python3 - "$small" "$srows" <<'PY'
import os, struct, sys
path, rows = sys.argv[1], int(sys.argv[2])
with open(path + ".partial", "wb") as f:
    f.write(struct.pack("<6Q", 0x31344E4531565344, 1, 0, rows, rows, 264).ljust(4096, b"\0"))
    f.write(os.urandom(rows * 264))
os.replace(path + ".partial", path)
PY
fi

flag=""; [ "$PROFILE" = release ] && flag="--release"
echo "bench: building ($PROFILE)" >&2
cargo build -q $flag --bin spark-kit
cargo test -q $flag --no-run --test checkpoint engram_bench:: 2>/dev/null
bin="$target/$PROFILE/spark-kit"
venv=$("$bin" setup --kit tiny-cpu --json --quiet | python3 -c 'import json,sys; print(json.load(sys.stdin)["path"])')

fio_iops() { # jobs -> IOPS
  fio --name=engram --filename="$file" --readonly --direct=1 --rw=randread --bs=4k --ioengine=psync \
      --offset=4096 --size=$(( rows * 264 / 4096 * 4096 )) --numjobs="$1" --thread --group_reporting \
      --runtime="$SECONDS_EACH" --time_based --norandommap --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["iops"])'
}
rust() { # batches [file direct] -> JSON lines
  SPARK_KIT_ENGRAM_BENCH_FILE="${2:-$file}" SPARK_KIT_ENGRAM_BENCH_DIRECT="${3:-1}" SPARK_KIT_ENGRAM_BENCH_THREADS="$THREADS" \
  SPARK_KIT_ENGRAM_BENCH_SECONDS="$SECONDS_EACH" SPARK_KIT_ENGRAM_BENCH_BATCHES="$1" \
    cargo test -q $flag --test checkpoint engram_bench:: -- --ignored --exact lookup --nocapture 2>/dev/null | grep '^{'
}
py() { PYTHONPATH=python_overlay "$venv/bin/python" bench/engram_rows.py "${2:-$file}" "$THREADS" "$SECONDS_EACH" "$1" "${3:-direct}"; }
rate() { python3 -c 'import json,sys; [print(round(json.loads(l)["rows_per_s"])) for l in sys.stdin if l.strip()]'; }

echo "bench: $file, $rows records, $THREADS reader threads, ${SECONDS_EACH} s per measurement" >&2
fio1=$(fio_iops 1)
r1=$(rust 1 | rate)
p1=$(py 1 | rate)
fioT=$(fio_iops "$THREADS")
read -r r64 r1024 < <(rust 64,1024 | rate | paste -sd' ')
read -r p64 p1024 < <(py 64,1024 | rate | paste -sd' ')
cat "$small" > /dev/null
rc=$(rust 1024 "$small" 0 | rate)
pc=$(py 1024 "$small" buffered | rate)
python3 -c "import os; fd = os.open('$small', os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)"
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
gbs() { python3 -c "print(f'{$1 * 264 / 1e9:.3f}')"; }
printf '%-28s %12s %10s %10s\n' "lookup" "rows/s" "GB/s" "vs fio"
printf '%-28s %12.0f %10s %10s\n' "fio 4k randread QD1" "$fio1" "$(python3 -c "print(f'{$fio1 * 4096 / 1e9:.3f}')")" "-"
printf '%-28s %12.0f %10s %10s\n' "fio 4k randread QD$THREADS" "$fioT" "$(python3 -c "print(f'{$fioT * 4096 / 1e9:.3f}')")" "-"
printf '%-28s %12s %10s %10s\n' "spark-kit batch 1" "$r1" "$(gbs "$r1")" "$(ratio "$r1" "$fio1")"
printf '%-28s %12s %10s %10s\n' "spark-kit batch 64" "$r64" "$(gbs "$r64")" "$(ratio "$r64" "$fioT")"
printf '%-28s %12s %10s %10s\n' "spark-kit batch 1024" "$r1024" "$(gbs "$r1024")" "$(ratio "$r1024" "$fioT")"
printf '%-28s %12s %10s %10s\n' "python preadv batch 1" "$p1" "$(gbs "$p1")" "$(ratio "$p1" "$fio1")"
printf '%-28s %12s %10s %10s\n' "python preadv batch 64" "$p64" "$(gbs "$p64")" "$(ratio "$p64" "$fioT")"
printf '%-28s %12s %10s %10s\n' "python preadv batch 1024" "$p1024" "$(gbs "$p1024")" "$(ratio "$p1024" "$fioT")"
printf '%-28s %12s %10s %10s\n' "spark-kit CPU ceiling" "$rc" "$(gbs "$rc")" "-"
printf '%-28s %12s %10s %10s\n' "python CPU ceiling" "$pc" "$(gbs "$pc")" "-"
echo "(GB/s of rows = rows/s x 264 B; fio GB/s = IOPS x 4096 B; CPU ceiling = batch 1024, page-cache reads)"
echo "ratio spark-kit batch 1024 / fio QD$THREADS (target >= 0.7): $(ratio "$r1024" "$fioT")"
