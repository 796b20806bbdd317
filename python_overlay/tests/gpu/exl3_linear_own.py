"""The own decode GEMV for dense EXL3 linears (issue 30 item 5) against exl3_gemm and fp16 matmul.

Run on the GPU machine (README.md beside this file):

    python python_overlay/tests/gpu/exl3_linear_own.py --wheel PATH/exllamav3-1.6.5-py3-none-any.whl --out DIR \
        [--prebuilt SO] [--skip accuracy,served,sweep,timing,layer]

Random MUL1 trellis words (any words decode), suh ~ N(0, 0.02), svh = +-1. Steps (results to
DIR/results-linear-own.json after each):
1. accuracy: `OwnDecodeLinear` vs the float32 CPU reference (`exl3.full_weight`, x @ W + bias) and vs
   exl3_gemm, K 2/3/5/6 at 5120->1152 and 1152->5120 and the per-rank linears of one decoder layer
   (exl3_moe_fused.linears), 1/2/4/8/16 rows, fp16 and bf16 x, with and without bias (pass: <= 2e-3 of
   max|y| for fp16 x); graph replay with new inputs == eager (bitwise); an eager call under
   torch.cuda.set_sync_debug_mode("error") (no host sync).
2. served: `Exl3CudaShards` through `prepare_cuda_layer` (the linear method's CUDA path) with
   SPARK_EXL3_MOE_COOP unset: whether it took the own GEMV and its load-time check, replayed from a
   graph with new inputs == eager, vs exl3_gemm.
3. sweep: the GEMV's options (two launches with the output step fused or three, block shape kw2, working
   blocks aimed at, PDL, 6 blocks per SM) at a few shapes.
4. timing: own (fused; and in three launches) vs exl3_gemm vs fp16 matmul, each replayed from a CUDA graph
   over enough weight copies to exceed the L2 (as exl3_moe_fused.linear_case), every shape at 1..64 rows.
5. layer: one layer's attention + shared-expert linears at batch 1 (own where it takes the layer, else
   exl3_gemm) vs exl3_gemm alone, and the decode ceiling (exl3_moe_decode.estimate's formula; the MoE
   at 1 token from results-h200-decode-default.json).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import exl3_moe_fused as base  # noqa: E402
from exl3_moe_decode import layer_counts  # noqa: E402
from spark_overlay import exl3  # noqa: E402
from spark_overlay.exl3.backends import select  # noqa: E402
from spark_overlay.exl3.backends.cuda_backend import prepare_cuda_layer  # noqa: E402
from spark_overlay.exl3.backends.cuda_decode import loader, own_linear  # noqa: E402
from spark_overlay.exl3.format.shards import ShardSpec  # noqa: E402

H = base.HIDDEN
KS = (2, 3, 5, 6)
SHAPES = ((H, 1152), (1152, H))
# One decoder layer's attention + shared-expert linears per TP-2 rank (exl3_moe_fused.linears)
LAYER = (("wq_a", H, 1024, base.K_ATTN, 1), ("wq_b", 1024, 16384, base.K_ATTN, 1), ("wkv", H, 512, base.K_ATTN, 1),
         ("wo_a slice", 4096, 1024, base.K_ATTN, 4), ("wo_b", 4096, H, base.K_ATTN, 1),
         ("indexer.wk", H, 128, 8, 1), ("shared w1", H, 1152, base.K_SHARED, 1),
         ("shared w3", H, 1152, base.K_SHARED, 1), ("shared w2", 1152, H, base.K_SHARED, 1))
ROWS = (1, 2, 4, 8, 12, 16)
TIME_ROWS = (1, 2, 4, 8, 16, 32, 64)
TOL = 2e-3
log = base.log
rel = base.rel


def shard(p: dict, k: int) -> dict:
    """An Exl3CudaShards shard entry for packed tensors p (one shard, no padding)."""
    return {"trellis": p["trellis"], "suh": p["suh"], "svh": p["svh"], "k": k, "codebook": "mul1",
            "out": p["svh"].shape[0], "pad_rows": 0, "mcg": False, "mul1": True}


def gemm(ext, p, x):
    y = torch.empty(x.shape[0], p["svh"].shape[0], dtype=torch.float16, device="cuda")
    xh = torch.empty_like(x)
    ext.exl3_gemm(x, p["trellis"], y, p["suh"], xh, p["svh"], -1, False, True, 0)
    return y


def accuracy_case(ext, n_in, n_out, k, gen, name=None) -> list[dict]:
    p = base.packed(n_in, n_out, k, gen, "cuda")
    w = exl3.full_weight(p["trellis"].cpu(), p["suh"].cpu(), p["svh"].cpu(), "mul1")
    own = own_linear.OwnDecodeLinear([shard(p, k)], n_in, "cuda")
    three = own_linear.OwnDecodeLinear([shard(p, k)], n_in, "cuda")
    three.fused = False
    bias = torch.randn(n_out, generator=gen, device="cuda") * 0.5
    rows = []
    for m in ROWS:
        x32 = torch.randn(m, n_in, generator=gen, device="cuda")
        for dt in (torch.float16, torch.bfloat16):
            x = x32.to(dt)
            ex = gemm(ext, p, x.to(torch.float16)).float()
            for b in (None, bias.to(dt)):
                ref = x.float().cpu() @ w + (0 if b is None else b.float().cpu())
                got = own(x, b)
                row = {"name": name, "in": n_in, "out": n_out, "k": k, "rows": m, "dtype": str(dt)[6:],
                       "bias": b is not None, "out_dtype_ok": got.dtype == dt,
                       "own_vs_ref": rel(got.cpu(), ref), "own_nonfinite": int((~torch.isfinite(got)).sum()),
                       "own_3launch_vs_ref": rel(three(x, b).cpu(), ref)}
                if b is None:
                    row["exl3_vs_ref"] = rel(ex.cpu(), ref)
                    row["own_vs_exl3"] = rel(got, ex)
                rows.append(row)
    return rows


def graph_checks(gen, results) -> None:
    p = base.packed(H, 1152, 3, gen, "cuda")
    own = own_linear.OwnDecodeLinear([shard(p, 3)], H, "cuda")
    same = {m: base.replay_vs_eager(own, (m, H))[0] for m in (1, 4, 16, 64)}
    results["own_graph_replay_vs_eager"] = same
    three = own_linear.OwnDecodeLinear([shard(p, 3)], H, "cuda")
    three.fused = False
    x = torch.randn(16, H, dtype=torch.float16, device="cuda")
    results["own_fused_vs_3launch"] = {m: rel(own(x[:m]), three(x[:m])) for m in (1, 9, 16)}
    three.run16_from = 9
    results["own_vs_run16_3launch"] = {m: rel(own(x[:m]), three(x[:m])) for m in (9, 16)}
    x = torch.randn(4, H, dtype=torch.bfloat16, device="cuda")
    own(x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        own(x)
        results["own_host_sync"] = "none"
    except RuntimeError as err:
        results["own_host_sync"] = str(err)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    log(f"own graph replay == eager: {same}; host sync: {results['own_host_sync']}")


def accuracy(ext, results) -> None:
    gen = torch.Generator(device="cuda").manual_seed(5)
    rows = []
    for k in KS:
        for n_in, n_out in SHAPES:
            rows += accuracy_case(ext, n_in, n_out, k, gen)
            log(json.dumps(rows[-4]))
    for name, n_in, n_out, k, _ in LAYER:
        if k in KS and (n_in, n_out) not in SHAPES:
            rows += accuracy_case(ext, n_in, n_out, k, gen, name)
            log(json.dumps(rows[-4]))
    fp16 = [max(r["own_vs_ref"], r["own_3launch_vs_ref"]) for r in rows if r["dtype"] == "float16"]
    results["accuracy"] = {"rows": rows, "own_vs_ref_max_fp16": max(fp16),
                           "own_vs_ref_max_bf16": max(r["own_vs_ref"] for r in rows if r["dtype"] == "bfloat16"),
                           "exl3_vs_ref_max": max(r["exl3_vs_ref"] for r in rows if "exl3_vs_ref" in r),
                           "own_vs_exl3_max": max(r["own_vs_exl3"] for r in rows if "own_vs_exl3" in r),
                           "nonfinite": sum(r["own_nonfinite"] for r in rows),
                           "ok": max(fp16) <= TOL and all(r["out_dtype_ok"] for r in rows)}
    log(f"accuracy: { {k: v for k, v in results['accuracy'].items() if k != 'rows'} }")
    graph_checks(gen, results)


def served(ext, results) -> None:
    """prepare_cuda_layer with the switch unset: the own GEMV taken, graph replay == eager, vs exl3_gemm."""
    gen = torch.Generator(device="cuda").manual_seed(6)
    os.environ.pop(select.MOE_COOP_ENV, None)
    p = base.packed(H, 1152, 3, gen, "cuda")
    spec = ShardSpec("model.layers.0.mlp.shared_experts.gate_proj", H, 1152, (0, H), (0, 1152))
    layer = torch.nn.Module()
    layer.exl3_parts = {"w": p}
    sizes = [1, 2, 4, 8, 16, 24, 32]
    t = time.time()
    prepare_cuda_layer(layer, [SimpleNamespace(spec=spec, key="w", pad_rows=0)], "mul1", ext, sizes)
    lin = layer.exl3_cuda
    out = {"switch": os.environ.get(select.MOE_COOP_ENV), "linear_decode": select.linear_decode(),
           "uses_own": lin.own is not None, "serve_rows": lin.own.serve_rows if lin.own else 0,
           "prepare_s": round(time.time() - t, 2), "sizes": {}}
    for m in sizes:
        same, new = base.replay_vs_eager(lin, (m, H), torch.bfloat16)
        out["sizes"][m] = {**same, "vs_exl3": rel(lin(new), lin.gemm(new)),
                           "path": "own" if lin.own and m <= lin.own.serve_rows else "exl3_gemm"}
    results["served"] = out
    log(f"served path (switch unset): {out}")


class Rotation:
    """Weight copies of one shape beyond the L2, their own GEMVs, and fp16 matrices."""

    def __init__(self, n_in, n_out, k, gen):
        one = n_in * n_out * k / 8
        self.copies = max(2, int(2 * base.L2_BYTES / one) + 1)
        self.mats = [base.packed(n_in, n_out, k, gen, "cuda") for _ in range(self.copies)]
        self.owns = ([own_linear.OwnDecodeLinear([shard(p, k)], n_in, "cuda") for p in self.mats]
                     if k in KS or k == 4 else [])
        self.n_in, self.n_out, self.k, self.one = n_in, n_out, k, one
        self.fp = None

    def configure(self, **opts) -> None:
        for o in self.owns:
            for key, v in opts.items():
                setattr(o, key, v)
            o.reserve()

    def own_us(self, m) -> float:
        x = torch.randn(m, self.n_in, dtype=torch.float16, device="cuda")
        return base.graph_time([lambda o=o: o(x) for o in self.owns])

    def exl3_us(self, ext, m) -> float:
        x = torch.randn(m, self.n_in, dtype=torch.float16, device="cuda")
        y = torch.empty(m, self.n_out, dtype=torch.float16, device="cuda")
        xh = torch.empty_like(x)
        fns = [lambda p=p: ext.exl3_gemm(x, p["trellis"], y, p["suh"], xh, p["svh"], -1, False, True, 0)
               for p in self.mats]
        fns[0]()
        return base.graph_time(fns)

    def fp16_us(self, m) -> float:
        if self.fp is None:
            n = max(2, int(2 * base.L2_BYTES / (self.n_in * self.n_out * 2)) + 1)
            self.fp = [torch.randn(self.n_in, self.n_out, dtype=torch.float16, device="cuda") for _ in range(n)]
        x = torch.randn(m, self.n_in, dtype=torch.float16, device="cuda")
        return base.graph_time([lambda w=w: torch.matmul(x, w) for w in self.fp])


DEFAULTS = {"kw2": None, "blocks": 4, "target": None, "pdl": True, "fused": True, "run16_from": 0}  # OwnDecodeLinear's


def sweep(ext, results) -> None:
    gen = torch.Generator(device="cuda").manual_seed(7)
    configs = [{**DEFAULTS, "kw2": kw2, "target": t, "fused": f, "run16_from": r}
               for f in (True, False) for kw2 in (True, False) for t in (132, 264, 528) for r in (9, 0)]
    configs += [{**DEFAULTS, "pdl": False}, {**DEFAULTS, "blocks": 6, "fused": False}]
    rows = []
    for n_in, n_out, k in ((H, 1152, 3), (1152, H, 3), (4096, H, 5), (1024, 16384, 5)):
        rot = Rotation(n_in, n_out, k, gen)
        for m in (1, 4, 16):
            for c in configs:
                if m < 9 and c["run16_from"] == 9:  # runs of 16 only matter above 8 rows
                    continue
                rot.configure(**c)
                rows.append({"in": n_in, "out": n_out, "k": k, "rows": m, **c,
                             "parts": rot.owns[0].parts(m, n_out), "own_us": round(rot.own_us(m), 2)})
            here = [r for r in rows if (r["in"], r["out"], r["rows"]) == (n_in, n_out, m)]
            best = min(here, key=lambda r: r["own_us"])
            log(f"sweep {n_in}->{n_out} K{k} {m} rows: best {best}")
        rot.configure(**DEFAULTS)
    results["sweep"] = rows


def timing(ext, results) -> None:
    gen = torch.Generator(device="cuda").manual_seed(8)
    shapes = [(n_in, n_out, k) for k in KS for n_in, n_out in SHAPES]
    shapes += [(n_in, n_out, k) for _, n_in, n_out, k, _ in LAYER if k in KS and (n_in, n_out, k) not in shapes]
    rows = []
    for n_in, n_out, k in shapes:
        rot = Rotation(n_in, n_out, k, gen)
        for m in TIME_ROWS:
            rot.configure(fused=False)
            own3 = rot.own_us(m)
            rot.configure(fused=True)
            own, ex, fp = rot.own_us(m), rot.exl3_us(ext, m), rot.fp16_us(m)
            rows.append({"in": n_in, "out": n_out, "k": k, "rows": m, "weight_copies": rot.copies,
                         "own_us": round(own, 2), "own_3launch_us": round(own3, 2), "exl3_us": round(ex, 2),
                         "fp16_us": round(fp, 2),
                         "own_over_exl3": round(own / ex, 3), "own_over_fp16": round(own / fp, 3),
                         "exl3_over_fp16": round(ex / fp, 3), "own_GBps": round(rot.one / own / 1e3, 1)})
            log(json.dumps(rows[-1]))
        del rot
        torch.cuda.empty_cache()
    results["timing"] = rows


def layer(ext, results) -> None:
    gen = torch.Generator(device="cuda").manual_seed(9)
    parts, own_total, exl3_total = [], 0.0, 0.0
    for name, n_in, n_out, k, count in LAYER:
        rot = Rotation(n_in, n_out, k, gen)
        ex = rot.exl3_us(ext, 1)
        own = rot.own_us(1) if rot.owns else ex
        parts.append({"name": name, "in": n_in, "out": n_out, "k": k, "count": count, "exl3_us": round(ex, 2),
                      "own_us": round(own, 2), "path": "own" if rot.owns else "exl3_gemm"})
        own_total += own * count
        exl3_total += ex * count
        del rot
        torch.cuda.empty_cache()
    results["decode_layer_linears"] = {"parts": parts, "own_total_us": round(own_total, 1),
                                       "exl3_total_us": round(exl3_total, 1),
                                       "own_over_exl3": round(own_total / exl3_total, 3)}
    log(f"one layer's linears at batch 1: own {own_total:.1f} us, exl3_gemm {exl3_total:.1f} us")
    moe = json.loads((HERE / "results-h200-decode-default.json").read_text())
    one = next(r for r in moe["moe_rank0"] if r["tokens"] == 1)
    counts = layer_counts()
    out = {**counts, "moe_us": one["default_us"], "moe_source": "results-h200-decode-default.json default_us"}
    for key, lin in (("own", own_total), ("exl3", exl3_total)):
        out[f"linears_{key}_us"] = round(lin, 1)
        for label, n in (("decode", counts["decoder_layers"]),
                         ("with_mtp", counts["decoder_layers"] + counts["mtp_stages"])):
            out[f"{key}_{label}_tok_s"] = round(1e6 / (n * (one["default_us"] + lin)), 1)
    results["decode_ceiling"] = out
    log(f"decode ceiling (one rank, MoE + EXL3 linears only): {out}")


def main() -> int:
    args = base.arguments()
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    t = time.time()
    cap = torch.cuda.get_device_capability()
    loader.load(f"sm_{cap[0]}{cap[1]}")
    results["own_build_s"] = round(time.time() - t, 1)
    t = time.time()
    ext = base.load_extension(args)
    results["build_s"] = round(time.time() - t, 1)
    log(f"own kernels {results['own_build_s']} s, exllamav3_ext {results['build_s']} s on {results['gpu']}")
    steps = [(name, lambda fn=fn: fn(ext, results)) for name, fn in (
        ("accuracy", accuracy), ("served", served), ("layer", layer), ("sweep", sweep), ("timing", timing))]
    base.run_steps(steps, args.skip, results, args.out / "results-linear-own.json", lambda r: None)
    ok = results.get("accuracy", {}).get("ok", False) and not any(k.endswith("_error") for k in results)
    ok = ok and all(v["bitwise_equal"] for v in results.get("own_graph_replay_vs_eager", {}).values())
    log("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
