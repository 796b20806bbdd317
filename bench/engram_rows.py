"""Python side of bench/engram.sh: random-row lookups through spark_overlay.engram.row_store
(pure Python, os.preadv, O_DIRECT) on a packed shard. One JSON line per batch size.

    python bench/engram_rows.py FILE THREADS SECONDS BATCH[,BATCH...] [direct|buffered]

"buffered" reads a cached file through the page cache: the store's own CPU cost per row.
"""

import json
import sys
import time

import numpy as np

from spark_overlay.engram.packed import read_header
from spark_overlay.engram.row_store import RowStore

path, threads, seconds, batches = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
direct = (sys.argv[5] if len(sys.argv) > 5 else "direct") == "direct"
h = read_header(path)
store = RowStore(layer=h.layer, rows=h.rows, lo=h.lo, hi=h.hi, packed=path, threads=threads, direct=direct)
if direct and not store.direct:
    sys.exit(f"{path}: O_DIRECT refused; put the benchmark file on a real disk")
rng = np.random.default_rng(1)
for batch in (int(b) for b in batches.split(",")):
    out = np.empty((batch, 264), dtype=np.uint8)
    rows, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        store.lookup_into(rng.integers(h.lo, h.hi, batch), out)
        rows += batch
    secs = time.perf_counter() - start
    rate = rows / secs
    print(json.dumps({"side": "python", "direct": direct, "batch": batch, "threads": threads, "rows": rows, "seconds": secs,
                      "rows_per_s": rate, "gb_per_s": rate * 264 / 1e9}), flush=True)
store.close()
