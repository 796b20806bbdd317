"""spark-kit's own EXL3 MoE decode kernel alone (no exllamav3 build, ~20-60 s on an H200).

    python tests/gpu/exl3_decode_own.py --out DIR

Rank 0 of the reference layer (384 experts, 5120 / 1152, top-6, MUL1, K 3, random trellis
words) built straight from tensors: accuracy against the float32 CPU reference (8 experts routed, so
at 16 and 64 rows each expert takes several runs of rows; fp16 within 2e-3, bf16 output adds one bf16
rounding) of the tensor-core GEMVs at 1-64 rows with the small launches separate and with each fusion of
them into the GEMVs (input Hadamard into gate/up at 1-2 rows, activation and output as last-block
epilogues), also with picks outside this rank's experts (a row with none must come out zero); graph replay
with new inputs vs eager; no host sync; the fusions' counters left zeroed; then at 1..64 rows, each over
8 routings in turn beside the cold-read floor of the same bytes: the previous defaults (five launches),
each fusion, at 1-2 rows the gate/up block layouts with the input Hadamard fused in, and the served defaults.
`--profile ROWS` only calls the kernel 3 times (for ncu).
Writes DIR/results-decode-own.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from exl3_moe_decode import Floor  # noqa: E402
from exl3_moe_fused import capture, cuda_time, packed, rel, routing  # noqa: E402
from spark_overlay import exl3  # noqa: E402
from spark_overlay.exl3.backends.cuda_decode import loader  # noqa: E402
from spark_overlay.exl3.backends.cuda_decode.own import FUSE_IN_AUTO_ROWS, OwnDecodeMoE, gate_up_layout  # noqa: E402

HIDDEN, INTER, EXPERTS, TOP_K, K = 5120, 1152, 384, 6, 3
ROTATE = 8


def log(*a):
    print(*a, flush=True)


FIELDS = ("pdl", "unroll", "parts_a", "parts_b", "occ6", "xs", "mma", "run16_from", "blocks", "nobias", "kw2_a", "kw2_b",
          "fuse_in", "fuse_mid", "fuse_out", "warps_a", "warps_b", "cap_a", "cap_b", "npw_a", "npw_b")
BOOLS = {"pdl", "occ6", "xs", "mma", "nobias", "kw2_a", "kw2_b", "fuse_in", "fuse_mid", "fuse_out"}


def parse_config(text: str) -> list:
    """--config: the FIELDS in order, integers or "none" (chosen by rows)."""
    return [None if v == "none" else int(v) for v in text.split(",")]


def config_of(own) -> tuple:
    return tuple(getattr(own, f) for f in FIELDS)


def set_config(own, cfg) -> None:
    for f, v in zip(FIELDS, cfg):
        setattr(own, f, v if v is None else bool(v) if f in BOOLS else int(v))


def set_case(own, defaults, fi, fm, fo, layout=None, extra=None) -> None:
    """The served defaults with these fusions (input Hadamard, activation, output), a block layout (a BLOCK_LAYOUTS /
    CAPPED_LAYOUTS tuple) and any other fields (`extra`: name -> value) set."""
    set_config(own, defaults)
    own.fuse_in, own.fuse_mid, own.fuse_out = bool(fi), bool(fm), bool(fo)
    if layout:
        pa, ka, own.warps_a, own.parts_b, own.kw2_b, own.warps_b, *caps = layout
        own.parts_a, own.kw2_a = pa or 0, ka
        own.cap_a, own.cap_b = caps or (0, 0)
    for name, value in (extra or {}).items():
        setattr(own, name, value)


def key_of(cfg) -> str:
    pdl, unroll, pa, pb, occ, xs, mma, r16, blocks, nb, ka, kb, fi, fm, fo, na, nbw, ca, cb, pwa, pwb = cfg
    return (f"pdl{int(pdl)}_u{unroll}_a{pa}_b{pb}_o{int(occ)}_x{int(xs)}_m{int(mma)}_r{int(r16)}_k{blocks}_n{int(nb)}"
            f"_wa{'a' if ka is None else int(ka)}_wb{int(kb)}_fi{'a' if fi is None else int(fi)}"
            f"_fm{'a' if fm is None else int(fm)}_fo{int(fo)}_ga{na}_gb{nbw}_c{ca}.{cb}_p{pwa}.{pwb}")


# Block sizes swept at 1-8 rows (with the served fusions): (gate/up k-parts, kw2_a, warps_a, down k-parts, kw2_b,
# warps_b); 8 warps = the previous layouts, 4 / 2 warps the same warps per SM in finer blocks
BLOCK_LAYOUTS = [(2, True, 8, 1, True, 8), (None, None, 8, 2, True, 8),
                 (4, False, 4, 1, True, 8), (2, True, 4, 1, True, 8), (4, False, 2, 1, True, 8),
                 (None, None, 8, 1, True, 4), (None, None, 8, 1, True, 2), (None, None, 8, 2, False, 4),
                 (4, False, 4, 1, True, 4), (4, False, 4, 1, True, 2), (2, True, 4, 1, True, 2)]
# at 1 row, the finer blocks with at most the balanced count per SM (caps: gate/up, down blocks per SM)
CAPPED_LAYOUTS = [(4, False, 4, 1, True, 8, 7, 0), (4, False, 4, 1, True, 4, 7, 8), (4, False, 4, 1, True, 2, 7, 15),
                  (2, True, 4, 1, True, 8, 7, 0), (None, None, 8, 1, True, 2, 0, 15), (4, False, 4, 2, False, 4, 7, 8)]
BLOCK_LAYOUTS_NO_FI = [(None, None, 8, 1, True, 8), (1, True, 4, 1, True, 8), (1, False, 4, 1, True, 8),
                       (None, None, 8, 1, True, 4), (None, None, 8, 1, True, 2), (1, True, 4, 1, True, 2)]


# At 1-8 rows, the served defaults with two n-tiles per warp in gate/up, down or both (npw_a, npw_b, warps_b: the
# down blocks of 2 n-tiles are 8-warp blocks), and with the output step fused in
NPW_VARIANTS = [(2, 1, None), (1, 2, 8), (2, 2, 8)]


def npw_fields(tokens: int, npw_a: int, npw_b: int, warps_b: int | None) -> dict:
    """An NPW_VARIANTS entry's fields at `tokens` rows: gate/up's 2 n-tiles run in its served 4-warp blocks with the
    input Hadamard fused in (1-2 rows), else in 8-warp blocks of 2 k-warps (decode_mma.cuh builds no other)."""
    fields = {"npw_a": npw_a, "npw_b": npw_b, "warps_b": warps_b}
    if npw_a == 2 and tokens > FUSE_IN_AUTO_ROWS:
        fields["warps_a"] = 8
    return fields


def configs(tokens: int, defaults: tuple) -> list[tuple]:
    """The tensor-core kernel with the previous defaults (five launches) and the fusions of the small launches
    into the GEMVs (input Hadamard, activation, output); at 1-8 rows also the block layouts (k-parts, k-warps,
    warps per block) with the served fusions, and the served defaults with two n-tiles per warp (NPW_VARIANTS)."""
    pa, ka = gate_up_layout(tokens)
    fusions = [(0, 0, 0), (0, 1, 0), (0, 0, 1)]
    out = [(True, 16, pa, 1, False, False, True, 0, 4, True, ka, True, *f, 8, 8, 0, 0, 1, 1) for f in fusions]
    if tokens <= 8:
        index = {f: i for i, f in enumerate(FIELDS)}
        for variant in NPW_VARIANTS:
            cfg = list(defaults)
            for name, value in npw_fields(tokens, *variant).items():
                cfg[index[name]] = value
            out.append(tuple(cfg))
        cfg = list(defaults)
        cfg[index["fuse_out"]], cfg[index["warps_b"]] = 1, 8
        out.append(tuple(cfg))
    if tokens <= 8:
        fi = 1 if tokens <= 2 else 0
        pa_fi, ka_fi = gate_up_layout(tokens, bool(fi))
        layouts = (BLOCK_LAYOUTS + (CAPPED_LAYOUTS if tokens == 1 else [])) if fi else BLOCK_LAYOUTS_NO_FI
        for pa2, ka2, wa, pb, kb, wb, *caps in layouts:
            ca, cb = caps or (0, 0)
            out.append((True, 16, pa2 or pa_fi, pb, False, False, True, 0, 4, True, ka_fi if ka2 is None else ka2,
                        kb, fi, 1, 0, wa, wb, ca, cb, 1, 1))
    return out


# Launch subsets of the served defaults (spark_decode_moe's stage bits: 1 input Hadamard, 2 gate/up GEMV, 4
# activation, 8 down GEMV, 16 output; a fused step runs inside its GEMV whatever its bit)
BREAKDOWN = {"gate_up": 2, "down": 8, "output": 16, "gate_up+down": 10, "down+output": 24, "all": 31}


def breakdown(own, args, gen, results) -> int:
    """Each subset of the served defaults' launches timed alone (graph, 8 routings in turn, the faster of 3)."""
    for tokens in (int(v) for v in args.rows.split(",")):
        sets = [routing(tokens, gen, experts=EXPERTS) for _ in range(ROTATE)]
        row = {"tokens": tokens}
        for name, stages in BREAKDOWN.items():
            own.stages = stages
            best = None
            for _ in range(3):
                graph, _ = capture(lambda: [own(*s) for s in sets])
                us = cuda_time(graph.replay, 20) / ROTATE
                del graph
                best = us if best is None else min(best, us)
            row[name] = round(best, 2)
        own.stages = 31
        results["breakdown"] = results.get("breakdown", []) + [row]
        log(json.dumps(row))
    (args.out / "results-decode-own-breakdown.json").write_text(json.dumps(results, indent=1))
    return 0


TL_BLOCKS, TL_FIELDS = 4096, 7  # decode_timeline.cuh


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def timeline_summary(raw: torch.Tensor) -> dict:
    """Per GEMV: when its blocks started and ended (global timer, µs from the gate/up's first block) and how each
    block's time splits into prologue / weight loop / epilogue (its SM's cycles, in µs at the measured clock)."""
    t0 = int(raw[0, :, 1][raw[0, :, 1] > 0].min())
    out = {}
    for gi, name in enumerate(("gate_up", "down")):
        b = raw[gi][(raw[gi, :, 1] > 0) & (raw[gi, :, 3] > 0) & (raw[gi, :, 4] > 0)]  # blocks that ran their loop
        if not len(b):
            continue
        sm, gt_in, c_in, c_loop, c_end, c_out, gt_out = (b[:, f].tolist() for f in range(TL_FIELDS))
        ghz = sum(c_out) - sum(c_in)
        ghz = ghz / max(1, sum(gt_out) - sum(gt_in))
        us = lambda c: c / ghz / 1000  # noqa: E731
        per_sm = {}
        for i, s_ in enumerate(sm):
            per_sm.setdefault(s_, []).append(i)
        counts = [len(v) for v in per_sm.values()]
        sm_busy = [(max(gt_out[i] for i in v) - min(gt_in[i] for i in v)) / 1000 for v in per_sm.values()]
        row = {"blocks": len(b), "sms": len(per_sm), "blocks_per_sm": {str(c): counts.count(c) for c in sorted(set(counts))},
               "clock_ghz": round(ghz, 3), "first_entry_us": round((min(gt_in) - t0) / 1000, 2),
               "last_entry_us": round((max(gt_in) - t0) / 1000, 2), "first_exit_us": round((min(gt_out) - t0) / 1000, 2),
               "last_exit_us": round((max(gt_out) - t0) / 1000, 2),
               "entry_us_p10_p50_p90": [round((pct(gt_in, q) - t0) / 1000, 2) for q in (0.1, 0.5, 0.9)],
               "exit_us_p10_p50_p90": [round((pct(gt_out, q) - t0) / 1000, 2) for q in (0.1, 0.5, 0.9)],
               "sm_busy_us_min_p50_max": [round(min(sm_busy), 2), round(pct(sm_busy, 0.5), 2), round(max(sm_busy), 2)]}
        for part, (lo, hi) in {"prologue": (c_in, c_loop), "loop": (c_loop, c_end), "epilogue": (c_end, c_out),
                               "block": (c_in, c_out)}.items():
            d = [us(h - l) for l, h in zip(lo, hi)]
            row[f"{part}_us_min_p50_max"] = [round(min(d), 2), round(pct(d, 0.5), 2), round(max(d), 2)]
        out[name] = row
    return out


def timeline(own, args, gen, results) -> int:
    """The served defaults at --timeline rows, each GEMV block's marks (decode_timeline.cuh), 3 routings."""
    cap = torch.cuda.get_device_capability()
    own.lib = loader.load(f"sm_{cap[0]}{cap[1]}", ("SPARK_TIMELINE", *args.defines))
    if args.config:
        set_config(own, parse_config(args.config))
    raw = torch.zeros(2, TL_BLOCKS, TL_FIELDS, dtype=torch.int64)
    runs = []
    for _ in range(3):
        x, w, ids = routing(args.timeline, gen, experts=EXPERTS)
        for _ in range(3):
            own(x, w, ids)
        torch.cuda.synchronize()
        loader.check(own.lib.spark_timeline_read(raw.data_ptr()), "spark_timeline_read")
        own(x, w, ids)
        torch.cuda.synchronize()
        loader.check(own.lib.spark_timeline_read(raw.data_ptr()), "spark_timeline_read")
        summary = timeline_summary(raw)
        runs.append(summary)
        log(json.dumps(summary))
    written = [[g, i, *raw[g, i].tolist()] for g in range(2) for i in range(TL_BLOCKS) if raw[g, i, 1] > 0]
    results["timeline"] = {"rows": args.timeline, "config": key_of(config_of(own)), "runs": runs,
                           "last_blocks": written}  # [GEMV (0 gate/up, 1 down), block, *decode_timeline.cuh's fields]
    name = f"rows{args.timeline}" + (f"-{args.config.replace(',', '_')}" if args.config else "")
    (args.out / f"results-decode-own-timeline-{name}.json").write_text(json.dumps(results))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", type=int, default=0,
                        help="only call the kernel eagerly 3 times at this many rows (for ncu) and exit")
    parser.add_argument("--config", default="", help=",".join(FIELDS) + " for --profile / --timeline (none: chosen by rows)")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64", help="row counts to time")
    parser.add_argument("--timeline", type=int, default=0,
                        help="only record the served defaults' per-block GEMV timeline at this many rows (a SPARK_TIMELINE build)")
    parser.add_argument("--defines", type=lambda s: tuple(d for d in s.split(",") if d), default=(),
                        help="macros for the own library, comma-separated (e.g. SPARK_FI_U=8,SPARK_FI_D=4 or "
                             "SPARK_DN_GLOBAL: bench builds of decode_moe.cu); every step of the run uses that build")
    parser.add_argument("--breakdown", action="store_true",
                        help="only time the served defaults' launches alone and in pairs at --rows (no accuracy, no sweep)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(3)
    experts = [{"w1": packed(HIDDEN, INTER, K, gen, "cuda"), "w3": packed(HIDDEN, INTER, K, gen, "cuda"),
                "w2": packed(INTER, HIDDEN, K, gen, "cuda")} for _ in range(EXPERTS)]
    tables = {f"{sid}_{kind}": torch.tensor([e[sid][kind].data_ptr() for e in experts], dtype=torch.int64).cuda()
              for sid in ("w1", "w3", "w2") for kind in ("trellis", "suh", "svh")}
    own = OwnDecodeMoE(tables, K, HIDDEN, INTER, EXPERTS, TOP_K, torch.device("cuda"))
    if args.defines:
        cap = torch.cuda.get_device_capability()
        own.lib = loader.load(f"sm_{cap[0]}{cap[1]}", args.defines)
    defaults = config_of(own)  # what the served path runs
    occ6_from = own.occ6_from
    per_expert = sum(t.numel() * t.element_size() for e in experts[:1] for p in e.values()
                     for k, t in p.items() if k != "mul1")
    if args.profile:
        if args.config:
            set_config(own, parse_config(args.config))
        x, w, ids = routing(args.profile, gen, experts=EXPERTS)
        for _ in range(3):
            own(x, w, ids)
        torch.cuda.synchronize()
        return 0
    cap = torch.cuda.get_device_capability()
    floor = Floor(loader.load(f"sm_{cap[0]}{cap[1]}"), per_expert * EXPERTS)
    results = {"gpu": torch.cuda.get_device_name(), "expert_bytes": per_expert, "defaults": key_of(defaults),
               "defines": list(args.defines),
               "accuracy": [], "timing": []}
    if args.breakdown:
        return breakdown(own, args, gen, results)
    if args.timeline:
        return timeline(own, args, gen, results)
    dense = {}
    # 8 experts routed: at 16 and 64 rows each expert takes several runs of 8 rows. Cases: (rows, fuse_in,
    # fuse_mid, fuse_out, picks outside this rank: "tp" = row 0's all, every odd pick of the others)
    acc_cases = [(t, 0, 0, 0, False) for t in (1, 4, 64)] + [(t, 1, 1, 1, False) for t in (1, 2)]
    acc_cases += [(t, 0, 1, 1, False) for t in (1, 2, 4, 8, 16, 64)] + [(1, 1, 0, 0, False), (2, 1, 0, 0, False)]
    acc_cases += [(4, 0, 1, 0, False), (4, 0, 0, 1, False), (2, 1, 1, 1, True), (4, 0, 1, 1, True), (16, 0, 1, 1, True)]
    # the smaller blocks (gate/up k-parts, kw2_a, warps_a, down k-parts, kw2_b, warps_b), also at 16 and 64 rows
    acc_cases = [(*c, None, None) for c in acc_cases]
    for layout in BLOCK_LAYOUTS[1:]:
        acc_cases += [(1, 1, 1, 0, False, layout, None), (2, 1, 1, 0, True, layout, None)]
    for layout in BLOCK_LAYOUTS_NO_FI[1:]:
        acc_cases += [(t, 0, 1, 0, t == 16, layout, None) for t in (4, 8, 16, 64)]
    acc_cases += [(1, 1, 1, 0, False, layout, None) for layout in CAPPED_LAYOUTS[:3]]
    # two n-tiles per warp (npw_a, npw_b, warps_b) with the served layouts, also with picks outside this rank
    for variant in NPW_VARIANTS:
        acc_cases += [(t, int(t <= FUSE_IN_AUTO_ROWS), 1, 0, t == 2, None, npw_fields(t, *variant)) for t in (1, 2, 4, 8)]
    acc_cases += [(2, 1, 1, 1, True, None, npw_fields(2, 2, 2, 8))]
    for tokens, fi, fm, fo, tp, layout, extra in acc_cases:
        x, w, ids = routing(tokens, gen, experts=EXPERTS, only=8)
        if tp:
            ids = ids.clone()
            ids[:, 1::2] = -1
            ids[0, :] = EXPERTS + 3
        for dtype in (torch.float16, torch.bfloat16):
            xd = x.to(dtype)
            ref = torch.zeros(tokens, HIDDEN)
            xf = xd.float().cpu()
            for e in sorted(e for e in set(ids.reshape(-1).tolist()) if 0 <= e < EXPERTS):
                if e not in dense:
                    dense[e] = {sid: exl3.full_weight(*(experts[e][sid][k].cpu() for k in ("trellis", "suh", "svh")),
                                                      "mul1") for sid in ("w1", "w3", "w2")}
                d = dense[e]
                we = (w.cpu() * (ids.cpu() == e)).sum(-1, keepdim=True)
                ref += we * ((torch.nn.functional.silu(xf @ d["w1"]) * (xf @ d["w3"])) @ d["w2"])
            set_case(own, defaults, fi, fm, fo, layout, extra)
            out = torch.full((tokens, HIDDEN), float("nan"), dtype=dtype, device="cuda")
            y = own(xd, w, ids.to(torch.int32), out).float().cpu()
            row = {"tokens": tokens, "dtype": str(dtype), "fuse": f"{fi}{fm}{fo}", "tp": tp, "layout": layout,
                   "extra": extra,
                   "vs_ref": rel(torch.nan_to_num(y, nan=1e9), ref), "nonfinite": int((~torch.isfinite(y)).sum())}
            if tp:
                row["row0_max_abs"] = float(y[0].abs().max())
            results["accuracy"].append(row)
            log(json.dumps(row))
    set_config(own, defaults)
    # graph replay with new inputs vs eager; no host sync
    replays = []
    npw2, npw2_4 = npw_fields(1, 2, 2, 8), npw_fields(4, 2, 2, 8)
    for tokens, fi, fm, fo, layout, extra in (
            (1, 0, 0, 0, None, None), (1, 1, 1, 1, None, None), (2, 1, 1, 1, None, None), (4, 0, 1, 1, None, None),
            (16, 0, 1, 1, None, None), (64, 0, 1, 1, None, None), (4, 0, 1, 0, None, None), (1, 1, 0, 0, None, None),
            (1, 1, 1, 0, BLOCK_LAYOUTS[-2], None), (4, 0, 1, 0, BLOCK_LAYOUTS_NO_FI[-1], None),
            (1, 1, 1, 0, CAPPED_LAYOUTS[2], None), (1, 1, 1, 0, None, npw2), (4, 0, 1, 0, None, npw2_4)):
        set_case(own, defaults, fi, fm, fo, layout, extra)
        x, w, ids = routing(tokens, gen, experts=EXPERTS)
        static = [t.clone() for t in (x, w, ids)]
        graph, out = capture(lambda: own(*static))
        new = routing(tokens, gen, experts=EXPERTS)
        for s_, n_ in zip(static, new):
            s_.copy_(n_)
        graph.replay()
        torch.cuda.synchronize()
        eager = own(*new)
        replays.append({"tokens": tokens, "fuse": f"{fi}{fm}{fo}", "layout": layout, "extra": extra,
                        "max_rel": rel(out, eager)})
        del graph
    set_config(own, defaults)
    results["graph_replay_vs_eager"] = replays
    log(json.dumps(replays))
    torch.cuda.set_sync_debug_mode("error")
    try:
        own.fuse_mid = own.fuse_out = True
        own(*routing(4, gen, experts=EXPERTS))
        results["host_sync"] = False
    except RuntimeError as err:
        results["host_sync"] = str(err)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    set_config(own, defaults)
    for tokens in (int(v) for v in args.rows.split(",")):
        sets = [routing(tokens, gen, experts=EXPERTS) for _ in range(ROTATE)]
        active = sum(len(set(i.reshape(-1).tolist())) for _, _, i in sets) / ROTATE
        nbytes = int(active * per_expert + tokens * HIDDEN * 2 * 2)
        row = {"tokens": tokens, "active": active, "bytes": nbytes, "floor_us": round(floor.time_us(nbytes // 16 * 16), 2)}

        def g():
            graph, _ = capture(lambda: [own(*s) for s in sets])
            us = cuda_time(graph.replay, 20) / ROTATE
            del graph
            return round(us, 2)

        sweep = {}
        own.occ6_from = 0  # the sweep sets occ6 itself
        for _ in range(2):  # two passes, the faster of each
            for cfg in configs(tokens, defaults):
                set_config(own, cfg)
                t = g()
                sweep[key_of(cfg)] = min(t, sweep.get(key_of(cfg), t))
        set_config(own, defaults)
        own.occ6_from = occ6_from
        row["served_defaults_us"] = g()
        row["sweep_us"] = sweep
        best_key = min(sweep, key=sweep.get)
        row["best_config"] = best_key
        best = sweep[best_key]
        row["best_us"], row["best_x_floor"] = best, round(best / row["floor_us"], 2)
        row["best_pct_hbm"] = round(100 * nbytes / (best * 1e-6) / 4.8e12, 1)
        results["timing"].append(row)
        log(json.dumps({k: v for k, v in row.items() if k != "sweep_us"}))
        (args.out / "results-decode-own.json").write_text(json.dumps(results, indent=1))
    (args.out / "results-decode-own.json").write_text(json.dumps(results, indent=1))
    # bf16 output: one rounding of each output element (2^-9 relative) on top of the fp16 budget
    tol = {str(torch.float16): 2e-3, str(torch.bfloat16): 2e-3 + 2 ** -8}
    ok = all(r["vs_ref"] <= tol[r["dtype"]] and r["nonfinite"] == 0 for r in results["accuracy"])
    ok = ok and all(r["max_rel"] == 0.0 for r in replays) and results["host_sync"] is False
    results["counters_left"] = int(own.cnt.abs().sum())  # the fused launches leave their counters zeroed
    ok = ok and results["counters_left"] == 0 and all(r.get("row0_max_abs", 0.0) == 0.0 for r in results["accuracy"])
    (args.out / "results-decode-own.json").write_text(json.dumps(results, indent=1))
    log("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
