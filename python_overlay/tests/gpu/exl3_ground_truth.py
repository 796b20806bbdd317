"""EXL3 ground truth on a CUDA GPU: exllamav3 1.6.5's kernels vs spark_overlay's decoder.

Run on a machine with nvcc + torch + a GPU (see README.md beside this file):

    python python_overlay/tests/gpu/exl3_ground_truth.py --wheel PATH/exllamav3-1.6.5-py3-none-any.whl --out DIR

1. Unpacks the wheel into a scratch dir with empty package __init__ files
   (format doc §4.1) and JIT-builds `exllamav3_ext` (TORCH_CUDA_ARCH_LIST from
   the GPU, MAX_JOBS = cores).
2. W_hat parity: for every codebook x K (1..8; 1.5/2.5/3.5 with mul1) decodes
   random trellises -- valid tail-biting packs from our packer and raw random
   words -- with `ext.reconstruct` and with `spark_overlay.exl3.weight_hat`;
   counts fp16 mismatches (expected 0).
3. Writes small fixtures (128x128 cases: trellis, suh, svh, kernel W_hat, and
   the kernel's fused full W for some) to DIR/exl3_kernel_cases.safetensors.
4. Layer level: the overlay's CUDA back end (`Exl3CudaShards`, exl3_gemm) vs
   the CPU reference `forward` for hidden 5120 / expert intermediate 2304 split
   for TP 2 (gate/up column halves, down row halves), K 2/3/5/6.
5. MoE: the overlay's CUDA MoE back end (`Exl3CudaMoE`, a per-expert
   exl3_gemm loop with SiLU-and-mul, biases on every projection) vs the CPU
   reference at hidden 5120 / expert intermediate 2304, TP=2 rank outputs
   summed (down bias on rank 0 only) vs the unsplit float32 reference; plus
   its time per call at 1 / 16 / 64 tokens.
6. exl3_gemm time per call and effective bandwidth (trellis bytes / time) for
   those shapes at 1 and 16 rows, beside an fp16 torch.matmul on the same shape;
   once as back-to-back launches from Python and once as 100 calls replayed
   from a CUDA graph (no launch overhead).

Everything measured goes to DIR/results.json; progress to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "python_overlay"))

from spark_overlay import exl3  # noqa: E402
from spark_overlay.exl3.backends.cuda_backend import Exl3CudaMoE, Exl3CudaShards  # noqa: E402
from spark_overlay.exl3.format.shards import ShardSpec, rank_part  # noqa: E402

CASES_FOR_FIXTURE = [("3inst", 1), ("3inst", 4), ("mcg", 2), ("mcg", 8), ("mul1", 3), ("mul1", 6), ("mul1", 1.5),
                     ("mul1", 3.5)]
FULL_W_FOR = {("mul1", 3), ("mcg", 2), ("3inst", 4)}


def log(*a):
    print(*a, flush=True)


def build_extension(wheel: Path, scratch: Path):
    with zipfile.ZipFile(wheel) as z:
        z.extractall(scratch)
    for pkg in ("exllamav3", "exllamav3/util"):
        (scratch / pkg / "__init__.py").write_text("")
    sys.path.insert(0, str(scratch))
    major, minor = torch.cuda.get_device_capability()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 8))
    t = time.time()
    from exllamav3.ext import exllamav3_ext as ext

    return ext, time.time() - t


def flags(codebook):
    return codebook == "mcg", codebook == "mul1"


def kernel_w_hat(ext, trellis, k, codebook):
    t0, t1, _ = trellis.shape
    out = torch.empty(16 * t0, 16 * t1, dtype=torch.float16, device="cuda")
    ext.reconstruct(out, trellis.cuda(), k, *flags(codebook))
    torch.cuda.synchronize()
    return out.cpu()


def parity(ext, results):
    gen = torch.Generator().manual_seed(1234)
    rows = []
    for codebook in exl3.CODEBOOKS:
        ks = list(range(1, 9)) + ([1.5, 2.5, 3.5] if codebook == "mul1" else [])
        for k in ks:
            valid, _ = exl3.random_trellis(16, 24, k, gen)
            words = int(16 * k)
            raw = torch.randint(-32768, 32768, (8, 16, words), generator=gen, dtype=torch.int32).to(torch.int16)
            mism = 0
            total = 0
            for trellis in (valid, raw):
                ours = exl3.weight_hat(trellis, codebook)
                theirs = kernel_w_hat(ext, trellis, k, codebook)
                mism += int((ours.view(torch.int16) != theirs.view(torch.int16)).sum())
                total += ours.numel()
            rows.append({"codebook": codebook, "k": k, "elements": total, "mismatches": mism})
            log(f"W_hat {codebook:5s} K={k:<4g} {total:7d} elements, {mism} mismatches")
    results["w_hat_parity"] = rows
    results["w_hat_mismatches_total"] = sum(r["mismatches"] for r in rows)


def fixtures(ext, out_dir: Path, results):
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(99)
    tensors = {}
    for codebook, k in CASES_FOR_FIXTURE:
        key = f"{codebook}_k{str(k).replace('.', 'p')}"
        trellis, _ = exl3.random_trellis(8, 8, k, gen)
        suh = (torch.randn(128, generator=gen) * 0.01).to(torch.float16)
        svh = torch.where(torch.rand(128, generator=gen) < 0.5, -1.0, 1.0).to(torch.float16)
        tensors[f"{key}.trellis"] = trellis
        tensors[f"{key}.suh"] = suh
        tensors[f"{key}.svh"] = svh
        tensors[f"{key}.w_hat"] = kernel_w_hat(ext, trellis, k, codebook)
        if (codebook, k) in FULL_W_FOR:
            w = torch.empty(128, 128, dtype=torch.float16, device="cuda")
            ext.reconstruct_had_slice(w, trellis.cuda(), suh.cuda(), svh.cuda(), k, *flags(codebook), 0)
            torch.cuda.synchronize()
            tensors[f"{key}.w_full_fused"] = w.cpu()
    path = out_dir / "exl3_kernel_cases.safetensors"
    save_file(tensors, str(path), metadata={"source": "exllamav3 1.6.5 ext.reconstruct / reconstruct_had_slice",
                                            "gpu": torch.cuda.get_device_name()})
    results["fixture_bytes"] = path.stat().st_size
    log(f"fixtures: {len(tensors)} tensors, {path.stat().st_size} bytes")


def layer_check(ext, results):
    """Overlay CUDA back end vs CPU reference at layer level; TP=2 halves combined vs unsplit."""
    gen = torch.Generator().manual_seed(7)
    hidden, inter = 5120, 2304
    rows = []
    for k in (2, 3, 5, 6):
        for name, (n_in, n_out), axis in (("gate_up", (hidden, inter), "out"), ("down", (inter, hidden), "in")):
            trellis, _ = exl3.random_trellis(n_in // 16, n_out // 16, k, gen)
            suh = (torch.randn(n_in, generator=gen) * 0.02).to(torch.float16)
            svh = torch.where(torch.rand(n_out, generator=gen) < 0.5, -1.0, 1.0).to(torch.float16)
            marker = torch.tensor(exl3.MARKER_VALUES["mul1"], dtype=torch.int32)
            x = torch.randn(16, n_in, generator=gen).to(torch.float16)
            ref = exl3.forward(x.float(), trellis, suh, svh, "mul1")  # float32 CPU reference, unsplit
            halves = []
            for rank in range(2):
                if axis == "out":
                    per = n_out // 2
                    spec = ShardSpec(name, n_in, n_out, (0, n_in), (rank * per, (rank + 1) * per))
                else:
                    per = n_in // 2
                    spec = ShardSpec(name, n_in, n_out, (rank * per, (rank + 1) * per), (0, n_out))
                parts = {kind: rank_part(spec, kind, t) for kind, t in
                         (("trellis", trellis), ("suh", suh), ("svh", svh), ("mul1", marker))}
                layer = Exl3CudaShards([spec], [parts], "mul1", ext, "cuda")
                xs = x if axis == "out" else x[:, spec.in_range[0]:spec.in_range[1]]
                halves.append(layer(xs.cuda()).float().cpu())
                torch.cuda.synchronize()
            y = torch.cat(halves, -1) if axis == "out" else halves[0] + halves[1]
            rel = float((y - ref).abs().max() / ref.abs().max())
            rows.append({"layer": name, "k": k, "in": n_in, "out": n_out, "split": axis, "max_rel_err": rel})
            log(f"layer {name:7s} K={k} TP2 split {axis}: max |y_cuda - y_ref| / max|y_ref| = {rel:.2e}")
    results["layer_tp2"] = rows


def moe_check(ext, results):
    """Overlay CUDA MoE (per-expert exl3_gemm loop) vs the float32 CPU reference, TP=2, real shapes, with biases."""
    gen = torch.Generator().manual_seed(11)
    hidden, inter, experts, top_k, tokens = 5120, 2304, 8, 4, 64
    ks = (2, 3, 5, 6)
    marker = torch.tensor(exl3.MARKER_VALUES["mul1"], dtype=torch.int32)
    packs, dense = [], []
    for e in range(experts):
        pe, de = {}, {}
        for j, (sid, n_in, n_out) in enumerate((("w1", hidden, inter), ("w3", hidden, inter), ("w2", inter, hidden))):
            k = ks[(e + j) % len(ks)]
            trellis, _ = exl3.random_trellis(n_in // 16, n_out // 16, k, gen)
            suh = (torch.randn(n_in, generator=gen) * 0.02).to(torch.float16)
            svh = torch.where(torch.rand(n_out, generator=gen) < 0.5, -1.0, 1.0).to(torch.float16)
            bias = (torch.randn(n_out, generator=gen) * 0.05).to(torch.float16)
            pe[sid] = {"trellis": trellis, "suh": suh, "svh": svh, "mul1": marker, "bias": bias}
            de[sid] = (exl3.full_weight(trellis, suh, svh, "mul1"), bias.float())
        packs.append(pe)
        dense.append(de)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.float16)
    logits = torch.randn(tokens, experts, generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, -1), top_k, -1)
    xf = x.float()
    ref = torch.zeros(tokens, hidden)
    for e in range(experts):
        w = (weights * (ids == e)).sum(-1, keepdim=True)
        (g, bg), (u, bu), (d, bd) = dense[e]["w1"], dense[e]["w3"], dense[e]["w2"]
        h = torch.nn.functional.silu(xf @ g + bg) * (xf @ u + bu)
        ref += w * (h @ d + bd)
    layers = []
    for rank in range(2):
        per = inter // 2
        rank_experts = []
        for e in range(experts):
            shards = {}
            for sid in ("w1", "w3", "w2"):
                if sid == "w2":
                    spec = ShardSpec(f"experts.{e}.down_proj", inter, hidden, (rank * per, (rank + 1) * per), (0, hidden))
                else:
                    name = "gate_proj" if sid == "w1" else "up_proj"
                    spec = ShardSpec(f"experts.{e}.{name}", hidden, inter, (0, hidden), (rank * per, (rank + 1) * per))
                shards[sid] = (spec, {kind: rank_part(spec, kind, t) for kind, t in packs[e][sid].items()})
            rank_experts.append(shards)
        layers.append(Exl3CudaMoE(rank_experts, "mul1", ext, "cuda", add_down_bias=rank == 0))
    xc, wc, ic = x.cuda(), weights.cuda(), ids.cuda()
    y = sum(layer(xc, wc, ic).float().cpu() for layer in layers)
    torch.cuda.synchronize()
    rel = float((y - ref).abs().max() / ref.abs().max())
    # Without the rank-0-only rule the down bias would count twice: show the check can fail.
    twice = float((y + sum(dense[e]["w2"][1] * (weights * (ids == e)).sum(-1, keepdim=True) for e in range(experts))
                   - ref).abs().max() / ref.abs().max())
    row = {"experts": experts, "top_k": top_k, "tokens": tokens, "hidden": hidden, "intermediate": inter,
           "split": "TP2 (gate/up column, down row)", "k_cycle": list(ks), "max_rel_err": rel,
           "max_rel_err_if_down_bias_twice": twice}
    log(f"moe TP2 cuda loop vs cpu reference: max rel err {rel:.2e} (down bias twice would give {twice:.2e})")
    timing_rows = []
    for t in (1, 16, 64):
        xt, wt, it = xc[:t].contiguous(), wc[:t].contiguous(), ic[:t].contiguous()
        for _ in range(5):
            layers[0](xt, wt, it)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        iters = 50
        start.record()
        for _ in range(iters):
            layers[0](xt, wt, it)
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) / iters * 1e3
        active = int(torch.unique(it).numel())
        timing_rows.append({"tokens": t, "active_experts": active, "rank0_us": round(us, 1)})
        log(f"moe rank-0 loop: {t} tokens, {active} active experts: {us:.1f} us per call")
    row["timing"] = timing_rows
    results["moe_tp2"] = row
    if rel > 1e-2:
        raise AssertionError(f"CUDA MoE differs from the reference: {rel}")


def timing(ext, results):
    gen = torch.Generator().manual_seed(3)
    hidden, local = 5120, 1152
    rows = []
    for k in (2, 3, 5, 6):
        for name, (n_in, n_out) in (("gate|up per rank", (hidden, local)), ("down per rank", (local, hidden))):
            trellis, _ = exl3.random_trellis(n_in // 16, n_out // 16, k, gen)
            tr = trellis.cuda()
            suh = torch.ones(n_in, dtype=torch.float16, device="cuda")
            svh = torch.ones(n_out, dtype=torch.float16, device="cuda")
            w16 = torch.randn(n_in, n_out, dtype=torch.float16, device="cuda")
            for m in (1, 16):
                x = torch.randn(m, n_in, dtype=torch.float16, device="cuda")
                y = torch.empty(m, n_out, dtype=torch.float16, device="cuda")
                xh = torch.empty_like(x)

                def run():
                    ext.exl3_gemm(x, tr, y, suh, xh, svh, -1, False, True, 0)

                def dense():
                    torch.matmul(x, w16)

                res = {}
                for label, fn in (("exl3", run), ("fp16", dense)):
                    for _ in range(20):
                        fn()
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    iters = 500
                    start.record()
                    for _ in range(iters):
                        fn()
                    end.record()
                    torch.cuda.synchronize()
                    res[label] = start.elapsed_time(end) / iters * 1e3  # microseconds
                # Launch overhead removed: 100 calls captured in one CUDA graph, replayed.
                try:
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.stream(side):
                        run()
                        torch.cuda.synchronize()
                        with torch.cuda.graph(graph, stream=side):
                            for _ in range(100):
                                run()
                    torch.cuda.synchronize()
                    graph.replay()
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(10):
                        graph.replay()
                    end.record()
                    torch.cuda.synchronize()
                    res["exl3_graph"] = start.elapsed_time(end) / 1000 * 1e3
                except Exception as err:  # capture can fail where the kernel syncs (autotune)
                    res["exl3_graph_error"] = f"{type(err).__name__}: {err}"
                tbytes = tr.numel() * 2
                row = {"shape": name, "in": n_in, "out": n_out, "k": k, "rows": m, "exl3_us": round(res["exl3"], 2),
                       "fp16_matmul_us": round(res["fp16"], 2), "trellis_bytes": tbytes,
                       "exl3_GBps": round(tbytes / res["exl3"] / 1e3, 1),
                       "fp16_GBps": round(n_in * n_out * 2 / res["fp16"] / 1e3, 1)}
                if "exl3_graph" in res:
                    row["exl3_graph_us"] = round(res["exl3_graph"], 2)
                    row["exl3_graph_GBps"] = round(tbytes / res["exl3_graph"] / 1e3, 1)
                else:
                    row["exl3_graph_error"] = res["exl3_graph_error"]
                rows.append(row)
                log(json.dumps(row))
    results["gemm_timing"] = rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/exl3-scratch"))
    parser.add_argument("--skip", default="", help="comma list of steps to skip: parity,fixtures,layer,moe,timing")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    ext, build_s = build_extension(args.wheel, args.scratch)
    results["build_s"] = round(build_s, 1)
    log(f"exllamav3_ext ready in {build_s:.0f} s on {results['gpu']}")
    steps = (("parity", parity, ()), ("fixtures", fixtures, (args.out,)), ("layer", layer_check, ()),
             ("moe", moe_check, ()), ("timing", timing, ()))
    for name, fn, extra in steps:
        if name in skip:
            continue
        t = time.time()
        try:
            fn(ext, *extra, results)
        except Exception as err:  # keep what the other steps measured
            results[f"{name}_error"] = f"{type(err).__name__}: {err}"
            log(f"step {name} failed: {err!r}")
        results[f"{name}_s"] = round(time.time() - t, 1)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    failed = results.get("w_hat_mismatches_total", 0) != 0 or "moe_error" in results
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
