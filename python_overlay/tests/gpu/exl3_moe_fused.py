"""The overlay's fused EXL3 MoE (exllamav3's exl3_moe, device-side schedule) on a CUDA GPU, at real shapes.

Run on the GPU machine (see README.md beside this file):

    python python_overlay/tests/gpu/exl3_moe_fused.py --wheel PATH/exllamav3-1.6.5-py3-none-any.whl --out DIR

Steps (results to DIR/results-moe.json after each):
1. JIT-builds exllamav3's extension (exl3_ground_truth.build_extension).
2. accuracy: TP=2 ranks of a 384-expert layer (hidden 5120, intermediate 2304 -> 1152 per rank, top-6, MUL1,
   K 3) through `Exl3FusedMoE`, summed, vs the unsplit float32 CPU reference, at 16 and 100 tokens routed among
   8 experts (so the reference decodes only those); graph replay with new inputs vs eager.
3. moe: rank 0 of that shape (all 384 experts, random int16 trellises), at 1/2/4/8/16/64/1536 tokens:
   (a) the fused path replayed from a CUDA graph (and eager), (b) the same kernel driven with exllamav3's
   host-side schedule of its exl3_moe path (counts read on the host, exact num_active per row tier), (c) the
   per-expert exl3_gemm loop. Each timed over 8 different routings in turn (the selected experts' weights
   exceed the 60 MB L2); effective bandwidth = trellis bytes of the selected experts / time vs 4.8 TB/s. The
   fused eager call runs under torch.cuda.set_sync_debug_mode("error") (no host sync).
4. linears: exl3_gemm per-rank shapes at 1 and 16 rows, K 2/3/5/6, beside fp16 torch.matmul, both replayed
   from CUDA graphs over enough weight copies to exceed the L2; the attention / shared-expert linears of one
   layer at batch 1 for the decode estimate; an Exl3CudaShards graph replayed with new inputs vs eager.
5. estimate: whole-model decode ceiling = 1e6 / (42 x (MoE at 1 token + that layer's linears)).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "python_overlay"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_overlay import exl3  # noqa: E402
from spark_overlay.exl3.backends import moe_schedule  # noqa: E402
from spark_overlay.exl3.backends.cuda_backend import Exl3CudaMoE, Exl3CudaShards  # noqa: E402
from spark_overlay.exl3.backends.cuda_decode.coop_rows import CoopRows  # noqa: E402
from spark_overlay.exl3.backends.cuda_moe_fused import Exl3FusedMoE, shared_buffers  # noqa: E402
from spark_overlay.exl3.format.shards import ShardSpec, rank_part  # noqa: E402

HIDDEN, INTER, EXPERTS, TOP_K, K_ROUTED, K_SHARED, K_ATTN = 5120, 2304, 384, 6, 3, 5, 5
HBM = 4.8e12
L2_BYTES = 60e6
ROTATE = 8
TOKENS = (1, 2, 4, 8, 16, 64, 1536)
MAX_ROWS = 1536  # the kit's max_num_batched_tokens
MOE_LAYERS = 42
MUL1 = torch.tensor(exl3.MARKER_VALUES["mul1"], dtype=torch.int32)


def log(*a):
    print(*a, flush=True)


def packed(n_in, n_out, k, gen, device):
    """Random int16 trellis words (any words decode) + scales, on `device`."""
    words = int(16 * k)
    trellis = torch.randint(-32768, 32768, (n_in // 16, n_out // 16, words), generator=gen, device=device,
                            dtype=torch.int32).to(torch.int16)
    suh = (torch.randn(n_in, generator=gen, device=device) * 0.02).to(torch.float16)
    svh = torch.where(torch.rand(n_out, generator=gen, device=device) < 0.5, -1.0, 1.0).to(torch.float16)
    return {"trellis": trellis, "suh": suh, "svh": svh, "mul1": MUL1.to(device)}


def full_experts(n, gen, device):
    return [{"w1": packed(HIDDEN, INTER, K_ROUTED, gen, device), "w3": packed(HIDDEN, INTER, K_ROUTED, gen, device),
             "w2": packed(INTER, HIDDEN, K_ROUTED, gen, device)} for _ in range(n)]


def rank_loop(full, rank, tp, ext):
    per = INTER // tp
    experts = []
    for e, p in enumerate(full):
        shards = {}
        for sid, proj in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            name = f"model.layers.3.mlp.experts.{e}.{proj}"
            if sid == "w2":
                spec = ShardSpec(name, INTER, HIDDEN, (rank * per, (rank + 1) * per), (0, HIDDEN))
            else:
                spec = ShardSpec(name, HIDDEN, INTER, (0, HIDDEN), (rank * per, (rank + 1) * per))
            shards[sid] = (spec, {kind: rank_part(spec, kind, t) for kind, t in p[sid].items()})
        experts.append(shards)
    return Exl3CudaMoE(experts, "mul1", ext, "cuda", add_down_bias=rank == 0)


def routing(tokens, gen, experts=EXPERTS, only=None):
    logits = torch.randn(tokens, experts, generator=gen, device="cuda")
    if only is not None:
        logits[:, only:] = -1e9
    w, ids = torch.topk(torch.softmax(logits, -1), TOP_K, -1)
    x = torch.randn(tokens, HIDDEN, generator=gen, device="cuda").to(torch.float16)
    return x, w, ids


def capture(fn):
    """A CUDA graph of fn() (run once eagerly on the side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=side):
            out = fn()
    torch.cuda.synchronize()
    return graph, out


def replay_vs_eager(fn, shape, dtype=torch.float16):
    """fn captured in a CUDA graph on a static input, replayed with new values, against fn(new) eagerly:
    ({"bitwise_equal", "max_rel"}, the new input)."""
    static = torch.randn(*shape, dtype=dtype, device="cuda")
    graph, out = capture(lambda: fn(static))
    new = torch.randn(*shape, dtype=dtype, device="cuda")
    static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    eager = fn(new)
    return {"bitwise_equal": bool(torch.equal(out, eager)), "max_rel": rel(out, eager)}, new


def cuda_time(fn, iters, warm=2):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3  # microseconds per fn()


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def reference(full, dense: dict, x, w, ids) -> torch.Tensor:
    """The unsplit float32 CPU reference of the layer for these rows (experts decoded once into `dense`)."""
    xf = x.float().cpu()
    ref = torch.zeros(x.shape[0], HIDDEN)
    for e in sorted(set(ids.reshape(-1).tolist())):
        if e not in dense:
            dense[e] = {sid: exl3.full_weight(*(full[e][sid][k].cpu() for k in ("trellis", "suh", "svh")), "mul1")
                        for sid in ("w1", "w3", "w2")}
        d = dense[e]
        we = (w.cpu() * (ids.cpu() == e)).sum(-1, keepdim=True)
        ref += we * ((torch.nn.functional.silu(xf @ d["w1"]) * (xf @ d["w3"])) @ d["w2"])
    return ref


def accuracy(ext, results):
    gen = torch.Generator(device="cuda").manual_seed(5)
    full = full_experts(EXPERTS, gen, "cuda")
    ranks = [Exl3FusedMoE(rank_loop(full, r, 2, ext), ext, "cuda", MAX_ROWS, f"rank{r}", top_k=TOP_K) for r in range(2)]
    dense = {}
    rows = []
    for tokens in (4, 16, 100):
        x, w, ids = routing(tokens, gen, only=8)
        ref = reference(full, dense, x, w, ids)
        y = sum(layer(x, w, ids).float().cpu() for layer in ranks)
        loop = sum(layer.loop(x, w, ids).float().cpu() for layer in ranks)
        rows.append({"tokens": tokens, "experts_used": len(set(ids.reshape(-1).tolist())),
                     "fused_vs_ref_max_rel": rel(y, ref), "loop_vs_ref_max_rel": rel(loop, ref)})
        log(f"accuracy TP2 {tokens} tokens: fused {rows[-1]['fused_vs_ref_max_rel']:.2e}, "
            f"loop {rows[-1]['loop_vs_ref_max_rel']:.2e} (max |dy| / max |y_ref|)")
    # Graph replay with new inputs equals eager (decode kernel at 4 rows, sorted tiers at 16).
    replays = []
    for i, tokens in enumerate((4, 4, 16, 16)):
        x, w, ids = routing(tokens, gen)
        static = [t.clone() for t in (x, w, ids)]
        graph, out = capture(lambda: ranks[0](*static))
        nx, nw, nids = routing(tokens, gen)
        for s, n in zip(static, (nx, nw, nids)):
            s.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        eager = ranks[0](nx, nw, nids)
        replays.append({"tokens": tokens, "max_abs_diff": float((out - eager).abs().max()), "max_rel": rel(out, eager)})
    results["accuracy_tp2"] = {"rows": rows, "graph_replay_vs_eager": replays}
    log(f"graph replay vs eager (new inputs): {replays}")
    del ranks, full
    torch.cuda.empty_cache()


def host_scheduled(layer: Exl3FusedMoE, rows=256):
    """Anchor (b): exl3_moe driven the way exllamav3's module schedules its exl3_moe path (counts on the host)."""
    ext, t = layer.ext, layer.tables
    conc = int(ext.exl3_moe_max_concurrency(0))
    sg, su, ig, iu = shared_buffers(torch.device("cuda"), conc * rows, HIDDEN, layer.inter)
    views = (sg[:conc * rows].view(conc, rows, HIDDEN), su[:conc * rows].view(conc, rows, HIDDEN),
             ig[:conc * rows].view(conc, rows, layer.inter), iu[:conc * rows].view(conc, rows, layer.inter))

    def run(x, w, ids):
        tokens = ids.shape[0]
        flat = ids.reshape(-1)
        order = flat.argsort()
        token_sorted = order // TOP_K
        weight_sorted = w.reshape(-1)[order].half()
        count = torch.bincount(flat, minlength=layer.num_local + 1)
        counts = count.tolist()  # exllamav3 reads the counts back when assignments exceed its fused rows
        out = torch.zeros(tokens, HIDDEN, dtype=torch.float32, device="cuda")
        live = [c for c in counts[:layer.num_local] if 0 < c <= rows]
        for lo, hi, m in ((33, rows, 64), (17, 32, 32), (1, 16, 16)):
            n = sum(1 for c in live if lo <= c <= hi)
            if n:
                ext.exl3_moe(x, out, count, token_sorted, weight_sorted, *views, 0, float(K_ROUTED), float(K_ROUTED),
                             float(K_ROUTED), t["w1_trellis"], t["w1_suh"], t["w1_svh"], t["w3_trellis"], t["w3_suh"],
                             t["w3_svh"], t["w2_trellis"], t["w2_suh"], t["w2_svh"], False, True, False, True, False,
                             True, 0.0, n, None, None, lo, hi, m)
        return out

    return run


def coop_direct(layer: Exl3FusedMoE):
    """Anchor (b) at <= 8 rows: exllamav3's decode kernel called directly, as its module's run_bszN does
    (8-row scratch and output, routing weights converted to fp16, nothing else)."""
    k = float(K_ROUTED)
    rows = CoopRows(layer.ext, layer.tables, (k, k, k), False, True, HIDDEN, layer.inter, layer.top_k, 8,
                    layer.device, layer.prefix)
    out = torch.empty(8, HIDDEN, dtype=torch.float32, device=layer.device)

    def run(x, w, ids):
        rows.launch(x, ids, w.half(), out)
        return out[: x.shape[0]]

    return run


def host_sync(fn, args) -> str:
    """"none" when fn(*args) runs under torch.cuda.set_sync_debug_mode("error"), else the start of the error."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(*args)
        return "none"
    except RuntimeError as err:
        return str(err)[:200]
    finally:
        torch.cuda.set_sync_debug_mode(0)


def moe(ext, results):
    gen = torch.Generator(device="cuda").manual_seed(9)
    full = full_experts(EXPERTS, gen, "cuda")
    loop = rank_loop(full, 0, 2, ext)
    del full
    t = time.time()
    fused = Exl3FusedMoE(loop, ext, "cuda", MAX_ROWS, "model.layers.3.mlp.experts", top_k=TOP_K)
    results["fused_load_s"] = round(time.time() - t, 2)
    results["fused_buffer_MiB"] = round(fused.buffer_bytes / 2**20, 1)
    anchor = host_scheduled(fused)
    direct = coop_direct(fused) if fused.coop is not None else None
    results["decode_kernel"] = "exl3_moe_coop" if direct else "none"
    tbytes = loop.layers[0]["w1"].shards[0]["trellis"].numel() * 2 * 3  # one expert's gate + up + down
    rows = []
    for tokens in TOKENS:
        sets = [routing(tokens, gen) for _ in range(ROTATE)]
        active = sum(len(set(ids.reshape(-1).tolist())) for _, _, ids in sets) / ROTATE
        row = {"tokens": tokens, "active_experts_mean": active, "trellis_bytes_mean": active * tbytes}
        row["fused_host_sync"] = host_sync(fused, sets[0])
        row["a_vs_b_max_rel"] = rel(fused(*sets[0]), anchor(*sets[0]))
        row["a_vs_c_max_rel"] = rel(fused(*sets[0]), loop(*sets[0]))
        it = 20 if tokens < 1536 else 3
        graph, _ = capture(lambda: [fused(*s) for s in sets])
        row["a_graph_us"] = cuda_time(graph.replay, it) / ROTATE
        row["a_eager_us"] = cuda_time(lambda: [fused(*s) for s in sets], it) / ROTATE
        row["b_host_sched_us"] = cuda_time(lambda: [anchor(*s) for s in sets], it) / ROTATE
        row["a_path"] = "exl3_moe_coop" if direct and tokens <= 8 else "exl3_moe tiers"
        if direct and tokens <= 8:
            row["a_vs_b_coop_max_rel"] = rel(fused(*sets[0]), direct(*sets[0]).clone())
            g2, _ = capture(lambda: [direct(*s) for s in sets])
            row["b_coop_direct_graph_us"] = cuda_time(g2.replay, it) / ROTATE
            del g2
        row["c_loop_us"] = cuda_time(lambda: [loop(*s) for s in sets], 3 if tokens < 64 else 1, warm=1) / ROTATE
        for key in ("a_graph", "a_eager", "b_host_sched", "b_coop_direct_graph", "c_loop"):
            if f"{key}_us" not in row:
                continue
            us = row[f"{key}_us"]
            row[f"{key}_pct_hbm"] = round(100 * row["trellis_bytes_mean"] / (us * 1e-6) / HBM, 1)
            row[f"{key}_us"] = round(us, 1)
        anchor_us = row.get("b_coop_direct_graph_us", row["b_host_sched_us"])
        row["a_graph_over_b"] = round(row["a_graph_us"] / anchor_us, 3)
        rows.append(row)
        log(json.dumps(row))
        del graph
    results["moe_rank0"] = rows
    del fused, loop, anchor
    torch.cuda.empty_cache()


def graph_time(fns, iters=20):
    graph, _ = capture(lambda: [f() for f in fns])
    return cuda_time(graph.replay, iters) / len(fns)


def linear_case(ext, n_in, n_out, k, m, gen, with_fp16=True):
    one = n_in * n_out * k / 8
    copies = max(2, int(2 * L2_BYTES / one) + 1)
    mats = [packed(n_in, n_out, k, gen, "cuda") for _ in range(copies)]
    x = torch.randn(m, n_in, dtype=torch.float16, device="cuda")
    y = torch.empty(m, n_out, dtype=torch.float16, device="cuda")
    xh = torch.empty_like(x)
    fns = [lambda p=p: ext.exl3_gemm(x, p["trellis"], y, p["suh"], xh, p["svh"], -1, False, True, 0) for p in mats]
    fns[0]()
    us = graph_time(fns)
    row = {"in": n_in, "out": n_out, "k": k, "rows": m, "weight_copies": copies, "exl3_graph_us": round(us, 2),
           "exl3_GBps": round(one / us / 1e3, 1)}
    if with_fp16:
        fp = max(2, int(2 * L2_BYTES / (n_in * n_out * 2)) + 1)
        ws = [torch.randn(n_in, n_out, dtype=torch.float16, device="cuda") for _ in range(fp)]
        us16 = graph_time([lambda w=w: torch.matmul(x, w) for w in ws])
        row.update({"fp16_copies": fp, "fp16_graph_us": round(us16, 2),
                    "fp16_GBps": round(n_in * n_out * 2 / us16 / 1e3, 1), "exl3_over_fp16": round(us / us16, 2)})
    return row


def linears(ext, results):
    gen = torch.Generator(device="cuda").manual_seed(4)
    rows = []
    for k in (2, 3, 5, 6):
        for n_in, n_out in ((HIDDEN, 1152), (1152, HIDDEN)):
            for m in (1, 16):
                rows.append(linear_case(ext, n_in, n_out, k, m, gen))
                log(json.dumps(rows[-1]))
    results["gemm_graph_rotated"] = rows
    # One decoder layer's attention + shared-expert linears per TP-2 rank at batch 1 (shapes: virtual_ckpt.rs).
    layer = [("wq_a", HIDDEN, 1024, K_ATTN, 1), ("wq_b", 1024, 16384, K_ATTN, 1), ("wkv", HIDDEN, 512, K_ATTN, 1),
             ("wo_a slice", 4096, 1024, K_ATTN, 4), ("wo_b", 4096, HIDDEN, K_ATTN, 1),
             ("indexer.wk", HIDDEN, 128, 8, 1), ("shared w1", HIDDEN, 1152, K_SHARED, 1),
             ("shared w3", HIDDEN, 1152, K_SHARED, 1), ("shared w2", 1152, HIDDEN, K_SHARED, 1)]
    parts, total = [], 0.0
    for name, n_in, n_out, k, count in layer:
        r = linear_case(ext, n_in, n_out, k, 1, gen, with_fp16=False)
        parts.append({"name": name, "count": count, **r})
        total += r["exl3_graph_us"] * count
    results["decode_layer_linears"] = {"parts": parts, "total_us": round(total, 1)}
    log(f"one layer's attention + shared linears at batch 1: {total:.1f} us")
    # Exl3CudaShards (the linear method's CUDA path): pretune, capture, replay with new inputs == eager.
    p = packed(HIDDEN, 1152, 3, gen, "cuda")
    spec = ShardSpec("model.layers.0.mlp.shared_experts.gate_proj", HIDDEN, 1152, (0, HIDDEN), (0, 1152))
    lin = Exl3CudaShards([spec], [p], "mul1", ext, "cuda")
    sizes = [1, 2, 3, 4, 6, 8, 12, 18, 24]
    lin.pretune(sizes, "cuda")
    same = {m: replay_vs_eager(lin, (m, HIDDEN))[0] for m in sizes}
    results["linear_graph_replay_vs_eager"] = same
    log(f"Exl3CudaShards graph replay == eager (bitwise) per capture size: {same}")


def estimate(results):
    lin = results.get("decode_layer_linears", {}).get("total_us")
    one = next((r for r in results.get("moe_rank0", []) if r["tokens"] == 1), None)
    if lin is None or one is None:
        return
    out = {"moe_layers": MOE_LAYERS, "linears_us_per_layer": lin}
    for key in ("a_graph", "b_coop_direct_graph", "b_host_sched", "c_loop"):
        if f"{key}_us" not in one:
            continue
        per_token = MOE_LAYERS * (one[f"{key}_us"] + lin)
        out[f"{key}_tok_s"] = round(1e6 / per_token, 1)
    results["decode_ceiling"] = out
    log(f"decode ceiling (one rank, MoE + EXL3 linears only): {out}")


def load_extension(args):
    """exllamav3's extension: an earlier run's .so (--prebuilt) when it loads, else the JIT build from --wheel."""
    from exl3_ground_truth import build_extension

    if args.prebuilt:
        import importlib.machinery
        import importlib.util

        loader = importlib.machinery.ExtensionFileLoader("exllamav3_ext", str(args.prebuilt))
        spec = importlib.util.spec_from_file_location("exllamav3_ext", str(args.prebuilt), loader=loader)
        try:
            ext = importlib.util.module_from_spec(spec)
            loader.exec_module(ext)
            return ext
        except ImportError as err:
            log(f"prebuilt extension unusable ({err}); building")
    return build_extension(args.wheel, args.scratch)[0]


def arguments() -> argparse.Namespace:
    """The command line of the MoE scripts: --wheel, --out, --scratch, --skip, --prebuilt, --rows."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/exl3-scratch"))
    parser.add_argument("--skip", default="", help="comma list of steps to skip: accuracy,moe,linears")
    parser.add_argument("--prebuilt", type=Path, help="an exllamav3_ext .so built by an earlier run (no JIT build)")
    parser.add_argument("--rows", default="", help="exl3_moe_decode.py: comma list of the row counts to time (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def run_steps(steps, skip: str, results: dict, out: Path, after) -> None:
    """Each (name, fn) not in `skip`, timed, its failure recorded (the others still run); results to `out` after each."""
    skipped = set(filter(None, skip.split(",")))
    for name, fn in steps:
        if name in skipped:
            continue
        t = time.time()
        try:
            fn()
        except Exception as err:  # keep what the other steps measured
            results[f"{name}_error"] = f"{type(err).__name__}: {err}"
            log(f"step {name} failed: {err!r}")
        results[f"{name}_s"] = round(time.time() - t, 1)
        after(results)
        out.write_text(json.dumps(results, indent=1))


def main() -> int:
    args = arguments()
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
               "tiers": [t.__dict__ for t in moe_schedule.tiers(16, MAX_ROWS, True)]}
    t = time.time()
    ext = load_extension(args)
    build_s = time.time() - t
    results["build_s"] = round(build_s, 1)
    log(f"exllamav3_ext ready in {build_s:.0f} s on {results['gpu']}")
    steps = [(name, lambda fn=fn: fn(ext, results)) for name, fn in (("accuracy", accuracy), ("moe", moe),
                                                                     ("linears", linears))]
    run_steps(steps, args.skip, results, args.out / "results-moe.json", estimate)
    acc = results.get("accuracy_tp2", {}).get("rows", [])
    ok = acc and all(r["fused_vs_ref_max_rel"] <= 2e-3 for r in acc) and not any(k.endswith("_error") for k in results)
    log("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
