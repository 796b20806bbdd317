"""MoE decode at 1..64 rows (issue 30): exllamav3's decode kernel in row chunks, spark-kit's own
decode kernel, exllamav3's own best path and the cold-read floor, side by side in one run.

Run on the GPU machine (README.md beside this file):

    python python_overlay/tests/gpu/exl3_moe_decode.py --wheel PATH/exllamav3-1.6.5-py3-none-any.whl --out DIR \
        [--prebuilt SO] [--rows 1,2,4]

Shape: TP rank 0 of 2 of one MoE layer of the reference model (384 experts, hidden 5120,
intermediate 2304 -> 1152 per rank, top-6, MUL1, K 3, random trellis words). Steps (results to
DIR/results-decode.json after each):
1. accuracy: both TP-2 ranks summed vs the unsplit float32 CPU reference (8 experts routed) at
   1..64 rows for the served path (`Exl3FusedMoE`, decode kernel up to 64 rows), the same layer
   under SPARK_EXL3_MOE_COOP=own (own kernel at 1..64 rows, after its load-time self-check), =0
   (sorted tiers) and unset (the default; whether it took the own kernel is recorded), and 8-row
   chunks; the own kernel's output poisoned with NaN first; graph replay with new inputs vs eager.
2. moe: every size in ROWS (or --rows), each timed over 8 routings in turn (weights beyond the L2):
   exllamav3's best path (<= 8 rows its decode kernel as its module calls it; above, exl3_moe with
   its host-side schedule), the served path, the layer with the switch unset (`default_us`), the
   own kernel, the sorted tiers, the decode kernel in chunks of 8/16/32/42 rows, and the floor: a
   cold read (rotating buffers, graph) of exactly the bytes that size reads (the routed experts'
   trellises and scales, x and y). Each as a multiple of the floor and as % of 4.8 TB/s; glue =
   served path - its launches alone with the inputs already converted.
3. linears: exl3_gemm vs fp16 matmul at decode sizes (from exl3_moe_fused.py).
4. estimate: decode ceiling with the checkpoint's layer count read from src/checkpoint/dsv41.rs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "python_overlay"))
sys.path.insert(0, str(HERE))

import exl3_moe_fused as base  # noqa: E402
from spark_overlay.exl3.backends.cuda_decode import loader  # noqa: E402
from spark_overlay.exl3.backends import select  # noqa: E402
from spark_overlay.exl3.backends.cuda_decode.coop_rows import CoopRows  # noqa: E402
from spark_overlay.exl3.backends.cuda_decode.own import OwnDecodeMoE  # noqa: E402
from spark_overlay.exl3.backends.cuda_moe_fused import Exl3FusedMoE  # noqa: E402

HIDDEN, INTER, EXPERTS, TOP_K, K = base.HIDDEN, base.INTER, base.EXPERTS, base.TOP_K, base.K_ROUTED
ROWS = (1, 2, 4, 8, 16, 32, 64)
CHUNKS = (8, 16, 32, 42)
HBM = 4.8e12
ROTATE = 8
TOL = 2e-3


def log(*a):
    print(*a, flush=True)


def layer_counts() -> dict:
    """Decoder layers and DSpark (MTP) stages of the checkpoint, read from src/checkpoint/dsv41.rs."""
    text = (REPO / "src" / "checkpoint" / "dsv41.rs").read_text()
    layers = int(re.search(r"^\s*layers: (\d+),", text, re.M).group(1))
    mtp = int(re.search(r"^\s*mtp_layers: (\d+),", text, re.M).group(1))
    return {"decoder_layers": layers, "mtp_stages": mtp}


def expert_bytes(loop) -> int:
    """Bytes one expert's gate/up/down trellises and suh/svh occupy on this rank."""
    total = 0
    for sid in ("w1", "w3", "w2"):
        shard = loop.layers[0][sid].shards[0]
        total += sum(shard[k].numel() * shard[k].element_size() for k in ("trellis", "suh", "svh"))
    return total


class Floor:
    """Cold reads of n bytes: a graph reading ROTATE consecutive slices of a pool beyond the L2."""

    def __init__(self, lib, max_bytes: int):
        self.lib = lib
        self.slice = (max_bytes + 4095) // 4096 * 4096
        self.pool = torch.empty(self.slice * ROTATE // 4 + 1024, dtype=torch.int32, device="cuda").random_()
        self.sink = torch.zeros(1, dtype=torch.int32, device="cuda")

    def read(self, offset: int, nbytes: int) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        blocks = max(1, min(sms * 4, (nbytes // 16 + 511) // 512))
        err = self.lib.spark_floor_read(self.pool.data_ptr() + offset, nbytes // 16, self.sink.data_ptr(), blocks,
                                        stream)
        loader.check(err, "spark_floor_read")

    def time_us(self, nbytes: int) -> float:
        fns = [lambda i=i: self.read(i * self.slice, nbytes) for i in range(ROTATE)]
        return base.graph_time(fns, iters=20)


def own_call(own: OwnDecodeMoE, x, w, ids):
    """The own kernel over any row count (chunks of its row limit), output pre-filled with NaN."""
    out = torch.full((ids.shape[0], HIDDEN), float("nan"), dtype=x.dtype, device="cuda")
    chunk = own.max_rows
    for s in range(0, ids.shape[0], chunk):
        own(x[s:s + chunk], w[s:s + chunk], ids[s:s + chunk], out[s:s + chunk])
    return out


def layer_with(mode: str | None, loop, ext, prefix):
    """An Exl3FusedMoE built under SPARK_EXL3_MOE_COOP=mode, or with it unset (None: the default; read at load)."""
    old = os.environ.get(select.MOE_COOP_ENV)
    if mode is None:
        os.environ.pop(select.MOE_COOP_ENV, None)
    else:
        os.environ[select.MOE_COOP_ENV] = mode
    try:
        return Exl3FusedMoE(loop, ext, "cuda", base.MAX_ROWS, prefix, top_k=TOP_K)
    finally:
        if old is None:
            os.environ.pop(select.MOE_COOP_ENV, None)
        else:
            os.environ[select.MOE_COOP_ENV] = old


def own_layer(loop, ext, prefix, results):
    """The layer under SPARK_EXL3_MOE_COOP=own, or None (the failure recorded) when its load fails closed."""
    try:
        return layer_with("own", loop, ext, prefix)
    except Exception as err:  # Exl3FormatError from the self-check, a failed build
        results["own_load_error"] = f"{type(err).__name__}: {err}"
        log(f"own kernel layer failed to load: {err!r}")
        return None


def accuracy(ext, lib, results):
    gen = torch.Generator(device="cuda").manual_seed(5)
    full = base.full_experts(EXPERTS, gen, "cuda")
    loops = [base.rank_loop(full, r, 2, ext) for r in range(2)]
    paths = {"fused": [layer_with("1", lp, ext, f"rank{r}") for r, lp in enumerate(loops)],
             "tiers": [layer_with("0", lp, ext, f"rank{r}") for r, lp in enumerate(loops)]}
    paths["default"] = [layer_with(None, lp, ext, f"rank{r}") for r, lp in enumerate(loops)]
    results["default_uses_own"] = all(layer.own is not None for layer in paths["default"])
    log(f"switch unset (default): own kernel {'used' if results['default_uses_own'] else 'NOT used'} on both ranks")
    owns = [own_layer(lp, ext, f"rank{r}", results) for r, lp in enumerate(loops)]
    results["own_wired"] = all(layer is not None and layer.own is not None for layer in owns)
    if results["own_wired"]:
        paths["fused_own"] = owns
    chunk8 = [coop_for(layer, 8) for layer in paths["fused"]]
    dense, rows = {}, []
    for tokens in (1, 4, 8, 16, 40, 64):
        x, w, ids = base.routing(tokens, gen, only=8)
        ref = base.reference(full, dense, x, w, ids)
        row = {"tokens": tokens}
        for name, layers in paths.items():
            row[f"{name}_vs_ref"] = base.rel(sum(layer(x, w, ids).float().cpu() for layer in layers), ref)
        row["coop_chunk8_vs_ref"] = base.rel(sum(c(x, w, ids).float().cpu() for c in chunk8), ref)
        if results["own_wired"]:
            y = sum(own_call(layer.own, x, w, ids).float().cpu() for layer in owns)
            row["own_vs_ref"] = base.rel(torch.nan_to_num(y, nan=1e9), ref)
            row["own_nonfinite"] = int((~torch.isfinite(y)).sum())
        rows.append(row)
        log(json.dumps(row))
    replays = []
    for tokens, name in ((16, "fused"), (64, "fused"), (4, "fused_own"), (1, "fused_own"), (16, "fused_own"),
                         (64, "fused_own"), (1, "default"), (4, "default"), (16, "default"), (64, "default")):
        if name not in paths:
            continue
        layer = paths[name][0]
        x, w, ids = base.routing(tokens, gen)
        static = [t.clone() for t in (x, w, ids)]
        graph, out = base.capture(lambda: layer(*static))
        nx, nw, nids = base.routing(tokens, gen)
        for s, n in zip(static, (nx, nw, nids)):
            s.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        eager = layer(nx, nw, nids)
        replays.append({"path": name, "tokens": tokens, "max_rel": base.rel(out, eager)})
    results["accuracy"] = {"rows": rows, "graph_replay_vs_eager": replays}
    log(json.dumps(replays))
    del paths, owns, chunk8, loops, full
    torch.cuda.empty_cache()


def coop_for(layer: Exl3FusedMoE, chunk: int) -> CoopRows:
    k = float(K)
    return CoopRows(layer.ext, layer.tables, (k, k, k), False, True, HIDDEN, layer.inter, TOP_K, chunk,
                    torch.device("cuda"), layer.prefix)


def moe(ext, lib, results, rows=ROWS):
    gen = torch.Generator(device="cuda").manual_seed(9)
    full = base.full_experts(EXPERTS, gen, "cuda")
    loop = base.rank_loop(full, 0, 2, ext)
    del full
    prefix = "model.layers.3.mlp.experts"
    fused = layer_with("1", loop, ext, prefix)
    fused_own = own_layer(loop, ext, prefix, results)
    tiers = layer_with("0", loop, ext, prefix)
    default = layer_with(None, loop, ext, prefix)
    host = base.host_scheduled(fused)
    direct = base.coop_direct(fused)
    coops = {c: coop_for(fused, c) for c in CHUNKS}
    per_expert = expert_bytes(loop)
    results["expert_bytes"] = per_expert
    floor = Floor(lib, int(per_expert * EXPERTS + 2 * 64 * HIDDEN * 4))
    table = []
    for tokens in rows:
        sets = [base.routing(tokens, gen) for _ in range(ROTATE)]
        active = sum(len(set(ids.reshape(-1).tolist())) for _, _, ids in sets) / ROTATE
        nbytes = int(active * per_expert + tokens * HIDDEN * 2 * 2)
        row = {"tokens": tokens, "active_experts_mean": active, "bytes_read": nbytes}
        row["floor_us"] = floor.time_us(nbytes // 16 * 16)
        it = 20

        def g(fn):
            graph, _ = base.capture(lambda: [fn(*s) for s in sets])
            us = base.cuda_time(graph.replay, it) / ROTATE
            del graph
            return us

        def g_sets(fn, these):
            graph, _ = base.capture(lambda: [fn(*s) for s in these])
            us = base.cuda_time(graph.replay, it) / ROTATE
            del graph
            return us

        if tokens <= 8:
            row["exl3_best_path"] = "exl3_moe_coop (its decode kernel, graph)"
            row["exl3_best_us"] = g(direct)
        else:
            row["exl3_best_path"] = "exl3_moe, host-scheduled (eager)"
            row["exl3_best_us"] = base.cuda_time(lambda: [host(*s) for s in sets], it) / ROTATE
        row["fused_host_sync"] = base.host_sync(fused, sets[0])
        row["fused_us"] = g(fused)
        row["fused_tiers_us"] = g(tiers)
        ref = tiers(*sets[0]).float()
        row["fused_vs_tiers"] = base.rel(fused(*sets[0]), ref)
        row["default_us"] = g(default)
        row["default_vs_tiers"] = base.rel(default(*sets[0]), ref)
        if fused_own is not None and fused_own.own is not None:
            row["fused_own_us"] = g(fused_own)
            row["fused_own_vs_tiers"] = base.rel(fused_own(*sets[0]), ref)
            if tokens <= fused_own.own.max_rows:
                row["own_us"] = g(fused_own.own)
        for c in CHUNKS:
            if c >= tokens and c != 8 and c != CHUNKS[-1]:
                continue
            row[f"coop_chunk{c}_us"] = g(coops[c])
        # Glue: the served path's launches alone (chunks of 42), inputs converted beforehand, fixed output
        conv = [(x.half().contiguous(), ids.long().contiguous(), w.half().contiguous()) for x, w, ids in sets]
        chunk = fused.coop.chunk
        outbuf = torch.empty(tokens + chunk, HIDDEN, dtype=torch.float32, device="cuda")

        def bare(x16, ids64, w16, cp=fused.coop):
            for s in range(0, tokens, chunk):
                cp.launch(x16[s:s + chunk], ids64[s:s + chunk], w16[s:s + chunk], outbuf[s:s + chunk])

        graph, _ = base.capture(lambda: [bare(*c) for c in conv])
        row["fused_bare_us"] = base.cuda_time(graph.replay, it) / ROTATE
        del graph
        row["glue_us"] = round(row["fused_us"] - row["fused_bare_us"], 2)
        # The served model's dtypes: bf16 activations, int32 ids, float32 routing weights, bf16 output
        sets_bf = [(x.bfloat16(), w, ids.int()) for x, w, ids in sets]
        row["fused_bf16_us"] = g_sets(fused, sets_bf)
        row["glue_bf16_us"] = round(row["fused_bf16_us"] - row["fused_bare_us"], 2)
        for key in [k for k in row if k.endswith("_us") and not k.startswith("glue")]:
            us = row[key]
            row[key] = round(us, 2)
            if key != "floor_us":
                row[key.replace("_us", "_x_floor")] = round(us / row["floor_us"], 2)
            row[key.replace("_us", "_pct_hbm")] = round(100 * nbytes / (us * 1e-6) / HBM, 1)
        row["fused_over_exl3_best"] = round(row["fused_us"] / row["exl3_best_us"], 3)
        for key in ("fused_own", "own", "default"):
            if f"{key}_us" in row:
                row[f"{key}_over_exl3_best"] = round(row[f"{key}_us"] / row["exl3_best_us"], 3)
        table.append(row)
        log(json.dumps(row))
    results["moe_rank0"] = table
    del fused, fused_own, tiers, default, loop, coops
    torch.cuda.empty_cache()


def estimate(results):
    lin = results.get("decode_layer_linears", {}).get("total_us")
    one = next((r for r in results.get("moe_rank0", []) if r["tokens"] == 1), None)
    if lin is None or one is None:
        return
    counts = layer_counts()
    out = {**counts, "linears_us_per_layer": lin}
    for key in ("exl3_best", "fused", "fused_own", "default", "floor"):
        if f"{key}_us" in one:
            for name, n in (("decode", counts["decoder_layers"]),
                            ("with_mtp", counts["decoder_layers"] + counts["mtp_stages"])):
                out[f"{key}_{name}_tok_s"] = round(1e6 / (n * (one[f"{key}_us"] + lin)), 1)
    results["decode_ceiling"] = out
    log(f"decode ceiling (one rank, MoE + EXL3 linears only): {out}")


def main() -> int:
    args = base.arguments()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
               "layer_counts": layer_counts()}
    t = time.time()
    cap = torch.cuda.get_device_capability()
    lib = loader.load(f"sm_{cap[0]}{cap[1]}")
    results["own_build_s"] = round(time.time() - t, 1)
    t = time.time()
    ext = base.load_extension(args)
    results["build_s"] = round(time.time() - t, 1)
    log(f"own kernels {results['own_build_s']} s, exllamav3_ext {results['build_s']} s on {results['gpu']}")
    rows = tuple(int(v) for v in args.rows.split(",")) if args.rows else ROWS
    steps = (("accuracy", lambda: accuracy(ext, lib, results)), ("moe", lambda: moe(ext, lib, results, rows)),
             ("linears", lambda: base.linears(ext, results)))
    base.run_steps(steps, args.skip, results, args.out / "results-decode.json", estimate)
    ok = not any(k.endswith("_error") for k in results)
    # each timed path's output against exllamav3's row tiers, at every size timed
    agree = [v for r in results.get("moe_rank0", []) for k, v in r.items() if k.endswith("_vs_tiers")]
    if agree:
        log(f"timed paths vs exllamav3's row tiers: worst {max(agree):.2e} (tolerance {TOL})")
        ok = ok and max(agree) <= TOL
    if "accuracy" in args.skip.split(","):
        log("accuracy not checked (--skip accuracy): the verdict covers the steps that ran")
    else:
        acc = results.get("accuracy", {}).get("rows", [])
        ok = ok and bool(acc) and all(r["fused_vs_ref"] <= TOL and r["coop_chunk8_vs_ref"] <= TOL for r in acc)
        own_ok = bool(acc) and results.get("own_wired") and all(
            r.get("fused_own_vs_ref", 1.0) <= TOL and r.get("own_vs_ref", 1.0) <= TOL and r.get("own_nonfinite", 0) == 0
            for r in acc)
        log(f"own kernel accuracy {'OK' if own_ok else 'FAILED'}")
        default_ok = bool(acc) and all(r["default_vs_ref"] <= TOL for r in acc)
        default_ok = default_ok and (results.get("default_uses_own") or select.MOE_COOP_DEFAULT != "own")
        log(f"default (switch unset, {select.MOE_COOP_DEFAULT!r}) accuracy {'OK' if default_ok else 'FAILED'}")
        ok = ok and default_ok
    log("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
