"""EXL3 launch serialisation (spark_overlay/exl3/backends/serial.py) on a real CUDA device.

    python python_overlay/tests/gpu/exl3_serial_streams.py --out DIR

A stand-in launch sequence (two fp16 matmuls, as a layer's exl3_gemm calls would be) runs under
`serial.kernels(device)`:

1. streams: called with the default stream and with each of 3 auxiliary streams current (vLLM's DeepSeek
   V4.1 creates three), every sequence runs on the one EXL3 stream of the device, the caller's stream is
   current again afterwards, and the result read on the caller's stream equals the eager reference;
2. threads: 4 host threads, each on its own auxiliary stream, 50 sequences each: every result right;
3. graph: a CUDA graph captured on a side stream around a layer call that goes through the serializer
   (nested once, as the fused MoE's fallback loop would) replays with new inputs equal to the reference.

Writes DIR/results-serial.json; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "python_overlay"))

from spark_overlay.exl3.backends import serial  # noqa: E402


def sequence(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, seen: list | None = None) -> torch.Tensor:
    with serial.kernels(x.device):
        if seen is not None:
            seen.append(torch.cuda.current_stream(x.device).cuda_stream)
        h = torch.relu(x @ w1)
        with serial.kernels(x.device):  # nested: stays on the EXL3 stream
            return h @ w2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev).manual_seed(0)
    w1 = torch.randn(1024, 2048, device=dev, dtype=torch.float16, generator=g) / 32
    w2 = torch.randn(2048, 1024, device=dev, dtype=torch.float16, generator=g) / 45

    def ref(x):
        return torch.relu(x @ w1) @ w2

    results: dict = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__}
    # 1. streams
    aux = [torch.cuda.Stream(dev) for _ in range(3)]
    seen: list[int] = []
    errs = []
    for s in [torch.cuda.current_stream(dev), *aux]:
        with torch.cuda.stream(s):
            x = torch.randn(64, 1024, device=dev, dtype=torch.float16, generator=g)
            y = sequence(x, w1, w2, seen)
            assert torch.cuda.current_stream(dev).cuda_stream == s.cuda_stream
            errs.append(float((y - ref(x)).abs().max()))
    torch.cuda.synchronize(dev)
    own = serial.serializer.stream_of(dev).cuda_stream
    results["streams"] = {"sequences": len(seen), "all_on_exl3_stream": all(s == own for s in seen),
                          "callers": [s.cuda_stream for s in aux], "max_abs_err": max(errs)}
    # 2. threads
    bad = []

    def worker(i):
        s = torch.cuda.Stream(dev)
        with torch.cuda.stream(s):
            for _ in range(50):
                x = torch.randn(32, 1024, device=dev, dtype=torch.float16)
                y = sequence(x, w1, w2)
                want = ref(x)
                s.synchronize()
                if float((y - want).abs().max()) > 1e-2:
                    bad.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results["threads"] = {"threads": 4, "sequences": 200, "wrong": len(bad)}
    # 3. graph capture and replay
    static_x = torch.randn(16, 1024, device=dev, dtype=torch.float16)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            sequence(static_x, w1, w2)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = sequence(static_x, w1, w2)
    replays = []
    for _ in range(5):
        static_x.copy_(torch.randn(16, 1024, device=dev, dtype=torch.float16))
        graph.replay()
        torch.cuda.synchronize(dev)
        replays.append(float((static_y - ref(static_x)).abs().max()))
    results["graph"] = {"replays": len(replays), "max_abs_err": max(replays)}
    ok = (results["streams"]["all_on_exl3_stream"] and results["streams"]["max_abs_err"] < 1e-2
          and not bad and max(replays) < 1e-2)
    results["ok"] = ok
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results-serial.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
