"""One rank of preflight's cross-node all-reduce (`spark-kit preflight`, docs/preflight.md).

Run by the node agent (or preflight itself on the head) with the engine's own Python and torch,
one process per node: NCCL on GPU kits, gloo on the CPU kits. It times all-reduces of small
messages (latency: the median of single, synchronised calls) and of one large one (bus bandwidth,
nccl-tests' formula algbw x 2(n-1)/n), checks every result is the sum of the ranks' values, and
prints ONE JSON line on stdout. A failure is a JSON line with "error" (exit 0), so the caller
always has something to judge; only a bad argument exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from datetime import timedelta


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    p.add_argument("--sizes", default="8192,32768,65536", help="latency message sizes, bytes")
    p.add_argument("--bw-bytes", type=int, default=64 << 20)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--bw-iters", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=60.0)
    return p.parse_args(argv)


def run(a: argparse.Namespace) -> dict:
    import torch
    import torch.distributed as dist

    out: dict = {"rank": a.rank, "world": a.world, "backend": a.backend, "torch": torch.__version__}
    device = "cpu"
    if a.backend == "nccl":
        torch.cuda.set_device(0)
        device = "cuda"

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    started = time.perf_counter()
    dist.init_process_group(
        a.backend,
        init_method=f"tcp://{a.master_addr}:{a.master_port}",
        rank=a.rank,
        world_size=a.world,
        timeout=timedelta(seconds=a.timeout_s),
    )
    try:
        out["init_s"] = round(time.perf_counter() - started, 3)
        want = a.world * (a.world + 1) / 2  # every rank contributes rank + 1
        correct = True
        latency = {}
        for size in [int(s) for s in a.sizes.split(",") if s]:
            t = torch.empty(size // 4, dtype=torch.float32, device=device)
            times = []
            for i in range(a.iters + 3):
                t.fill_(a.rank + 1)
                sync()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                sync()
                if i >= 3:  # warm-up
                    times.append(time.perf_counter() - t0)
            correct = correct and bool(torch.all(t == want))
            latency[str(size)] = round(statistics.median(times) * 1e6, 1)
        out["latency_us"] = latency
        t = torch.full((a.bw_bytes // 4,), float(a.rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(t)  # warm-up
        sync()
        t0 = time.perf_counter()
        for _ in range(a.bw_iters):
            dist.all_reduce(t)
        sync()
        per_op = (time.perf_counter() - t0) / a.bw_iters
        # After 1 + bw_iters sums of `want`-scaled values the tensor holds rank-independent data;
        # check the first reduction instead on a fresh tensor.
        check = torch.full((1024,), float(a.rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(check)
        correct = correct and bool(torch.all(check == want))
        algbw = a.bw_bytes / per_op / 1e9
        out["bw_bytes"] = a.bw_bytes
        out["busbw_gbps"] = round(algbw * 2 * (a.world - 1) / a.world, 3)
        out["correct"] = correct
    finally:
        dist.destroy_process_group()
    return out


def main(argv: list[str]) -> int:
    a = parse(argv)
    try:
        result = run(a)
    except Exception as e:  # reported as data: the caller judges and names the cause
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        result = {"rank": a.rank, "world": a.world, "backend": a.backend, "error": last[:500]}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
