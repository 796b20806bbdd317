"""TP=2 across two processes: the overlay's EXL3 shards, fused MoE and linear, summed by a real all-reduce.

    python python_overlay/tests/gpu/exl3_tp2.py --backend nccl --wheel PATH/exllamav3-1.6.5-py3-none-any.whl --out DIR  # 2 GPUs
    python python_overlay/tests/gpu/exl3_tp2.py --backend gloo --small --out DIR                                        # CPU dry run

Two processes (torch.multiprocessing, one per rank; NVLink multicast left off: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1). Every checkpoint tensor is made from a seed of its
own name (the same bytes on both ranks, as if read from one file) and passed through the overlay's loader path
(`shards.check_part` + `shards.rank_part`): a rank keeps only its tiles (gate/up column halves, down row halves;
a row-parallel `attn.wo_b` split on its input). Each rank runs `Exl3FusedMoE` (exllamav3's kernels on CUDA;
the CPU stand-in kernel of python_overlay/tests/exl3_standin.py with gloo) and `Exl3CudaShards`, all-reduces,
and rank 0 compares the sum with the unsplit float32 reference (tokens routed among 8 experts so it decodes only
those). With NCCL also: the MoE + all-reduce captured in one CUDA graph and replayed with new inputs vs eager,
and times per MoE layer at 1/4/16 tokens with the all-reduce, and of the all-reduce alone.
Prints OK (exit 0) or FAILED; rank 0 writes DIR/results-tp2.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "python_overlay"))
sys.path.insert(0, str(REPO / "python_overlay" / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_overlay import exl3  # noqa: E402
from spark_overlay.exl3.backends.cuda_backend import Exl3CudaMoE, Exl3CudaShards  # noqa: E402
from spark_overlay.exl3.backends.cuda_moe_fused import Exl3FusedMoE  # noqa: E402
from spark_overlay.exl3.format.shards import ShardSpec, check_part, rank_part  # noqa: E402

REAL = {"hidden": 5120, "inter": 2304, "experts": 384, "top_k": 6, "k": 3, "o_in": 8192, "k_attn": 5}
SMALL = {"hidden": 256, "inter": 512, "experts": 8, "top_k": 3, "k": 3, "o_in": 512, "k_attn": 4}
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TOLERANCE = 2e-3


def checkpoint_linear(name, n_in, n_out, k):
    """The tensors of one EXL3 linear `name`, from a seed of its name (identical on every rank)."""
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    trellis = torch.randint(-32768, 32768, (n_in // 16, n_out // 16, int(16 * k)), generator=gen,
                            dtype=torch.int32).to(torch.int16)
    return {"trellis": trellis, "suh": (torch.randn(n_in, generator=gen) * 0.02).to(torch.float16),
            "svh": torch.where(torch.rand(n_out, generator=gen) < 0.5, -1.0, 1.0).to(torch.float16),
            "mul1": torch.tensor(exl3.MARKER_VALUES["mul1"], dtype=torch.int32)}


def load_rank(spec, tensors, device):
    """The overlay's loader path for one tensor set: check each, keep this rank's part, move it."""
    parts = {}
    for kind, t in tensors.items():
        check_part(spec, kind, t)
        parts[kind] = rank_part(spec, kind, t).to(device)
    return parts


def expert_specs(dims, e, rank, tp):
    h, i = dims["hidden"], dims["inter"]
    per = i // tp
    base = f"model.layers.3.mlp.experts.{e}"
    return {"w1": ShardSpec(f"{base}.gate_proj", h, i, (0, h), (rank * per, (rank + 1) * per)),
            "w3": ShardSpec(f"{base}.up_proj", h, i, (0, h), (rank * per, (rank + 1) * per)),
            "w2": ShardSpec(f"{base}.down_proj", i, h, (rank * per, (rank + 1) * per), (0, h))}


def build(dims, rank, tp, ext, device):
    experts = []
    for e in range(dims["experts"]):
        specs = expert_specs(dims, e, rank, tp)
        shards = {}
        for sid, spec in specs.items():
            n_in, n_out = spec.in_features, spec.out_features
            shards[sid] = (spec, load_rank(spec, checkpoint_linear(spec.name, n_in, n_out, dims["k"]), device))
        experts.append(shards)
    loop = Exl3CudaMoE(experts, "mul1", ext, device, add_down_bias=rank == 0)
    if hasattr(ext, "register"):
        ext.register(loop)
    moe = Exl3FusedMoE(loop, ext, device, 64, "model.layers.3.mlp.experts", top_k=dims["top_k"])
    o_in, h = dims["o_in"], dims["hidden"]
    per = o_in // tp
    ospec = ShardSpec("model.layers.3.self_attn.wo_b", o_in, h, (rank * per, (rank + 1) * per), (0, h))
    wo = Exl3CudaShards([ospec], [load_rank(ospec, checkpoint_linear(ospec.name, o_in, h, dims["k_attn"]), device)],
                        "mul1", ext, device)
    return moe, wo, ospec


def inputs(dims, tokens, seed, only=None):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, dims["experts"], generator=gen)
    if only is not None:
        logits[:, only:] = -1e9
    w, ids = torch.topk(torch.softmax(logits, -1), dims["top_k"], -1)
    x = torch.randn(tokens, dims["hidden"], generator=gen).to(torch.float16)
    xo = torch.randn(tokens, dims["o_in"], generator=gen).to(torch.float16)
    return x, w, ids, xo


def reference(dims, x, w, ids, xo):
    """Unsplit float32 CPU reference of the MoE (experts used only) and of wo_b."""
    h, i = dims["hidden"], dims["inter"]
    xf = x.float()
    out = torch.zeros(x.shape[0], h)
    for e in sorted(set(ids.reshape(-1).tolist())):
        base = f"model.layers.3.mlp.experts.{e}"
        wts = {}
        for proj, n_in, n_out in (("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h)):
            t = checkpoint_linear(f"{base}.{proj}", n_in, n_out, dims["k"])
            wts[proj] = exl3.full_weight(t["trellis"], t["suh"], t["svh"], "mul1")
        we = (w * (ids == e)).sum(-1, keepdim=True)
        out += we * ((torch.nn.functional.silu(xf @ wts["gate_proj"]) * (xf @ wts["up_proj"])) @ wts["down_proj"])
    t = checkpoint_linear("model.layers.3.self_attn.wo_b", dims["o_in"], h, dims["k_attn"])
    return out, xo.float() @ exl3.full_weight(t["trellis"], t["suh"], t["svh"], "mul1")


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def worker(rank, args, port):
    os.environ.update(NO_MULTICAST, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dims = SMALL if args.small else REAL
    cuda = args.backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
        from exl3_moe_fused import load_extension

        ext = load_extension(args)
        device = torch.device("cuda", rank)
    else:
        from exl3_standin import StandInExt

        ext, device = StandInExt(), torch.device("cpu")
    dist.init_process_group(args.backend, rank=rank, world_size=2)
    results = {"backend": args.backend, "dims": dims, "world_size": 2}
    moe, wo, ospec = build(dims, rank, 2, ext, device)

    def step(x, w, ids, xo):
        y = moe(x, w, ids).float()
        dist.all_reduce(y)
        o = wo(xo[:, ospec.in_range[0]:ospec.in_range[1]]).float()
        dist.all_reduce(o)
        return y, o

    rows = []
    for tokens in (4, 16):
        x, w, ids, xo = inputs(dims, tokens, 100 + tokens, only=8)
        y, o = step(*(t.to(device) for t in (x, w, ids, xo)))
        if rank == 0:
            ref_y, ref_o = reference(dims, x, w, ids, xo)
            rows.append({"tokens": tokens, "moe_max_rel": rel(y.cpu(), ref_y), "wo_b_max_rel": rel(o.cpu(), ref_o)})
            print(json.dumps(rows[-1]), flush=True)
    results["accuracy"] = rows
    if cuda:
        results.update(graphs_and_timing(dims, moe, step, device))
    dist.barrier()
    if rank == 0:
        ok = all(r["moe_max_rel"] <= TOLERANCE and r["wo_b_max_rel"] <= TOLERANCE for r in rows)
        ok = ok and all(r["max_rel"] <= 1e-4 for r in results.get("graph_replay_vs_eager", []))
        results["ok"] = ok
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results-tp2.json").write_text(json.dumps(results, indent=1))
        print("OK" if ok else "FAILED", flush=True)
    dist.destroy_process_group()


def graphs_and_timing(dims, moe, step, device):
    from exl3_moe_fused import capture, cuda_time

    out = {"graph_replay_vs_eager": [], "timing": []}
    for tokens in (1, 4, 16):
        static = [t.to(device) for t in inputs(dims, tokens, 7 + tokens)]
        graph, got = capture(lambda: step(*static))
        new = [t.to(device) for t in inputs(dims, tokens, 70 + tokens)]
        for s, n in zip(static, new):
            s.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        eager = step(*new)
        out["graph_replay_vs_eager"].append({"tokens": tokens, "max_rel": max(rel(g, e) for g, e in zip(got, eager))})
        x, w, ids, _ = static

        def moe_ar():
            y = moe(x, w, ids).float()
            dist.all_reduce(y)
            return y

        buf = torch.zeros(tokens, dims["hidden"], device=device)
        g_moe, _ = capture(moe_ar)
        g_ar, _ = capture(lambda: dist.all_reduce(buf))
        g_only, _ = capture(lambda: moe(x, w, ids))
        out["timing"].append({"tokens": tokens, "moe_plus_allreduce_graph_us": round(cuda_time(g_moe.replay, 50), 1),
                              "moe_only_graph_us": round(cuda_time(g_only.replay, 50), 1),
                              "allreduce_fp32_graph_us": round(cuda_time(g_ar.replay, 50), 1)})
        print(json.dumps(out["timing"][-1]), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--small", action="store_true", help="small shapes (CPU dry run)")
    parser.add_argument("--wheel", type=Path)
    parser.add_argument("--prebuilt", type=Path)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/exl3-scratch"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()
    os.environ.update(NO_MULTICAST)
    if args.backend == "nccl" and torch.cuda.device_count() < 2:
        print(f"FAILED: --backend nccl needs 2 GPUs, this machine has {torch.cuda.device_count()}", flush=True)
        return 2
    mp.spawn(worker, args=(args, args.port), nprocs=2, join=True)
    res = json.loads((args.out / "results-tp2.json").read_text())
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
