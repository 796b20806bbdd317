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
from spark_overlay.exl3.backends.cuda_decode.own import OwnDecodeMoE, gate_up_layout  # noqa: E402

HIDDEN, INTER, EXPERTS, TOP_K, K = 5120, 1152, 384, 6, 3
ROTATE = 8


def log(*a):
    print(*a, flush=True)


FIELDS = ("pdl", "unroll", "parts_a", "parts_b", "occ6", "xs", "mma", "run16_from", "blocks", "nobias", "kw2_a", "kw2_b",
          "fuse_in", "fuse_mid", "fuse_out")
BOOLS = {"pdl", "occ6", "xs", "mma", "nobias", "kw2_a", "kw2_b", "fuse_in", "fuse_mid", "fuse_out"}


def config_of(own) -> tuple:
    return tuple(getattr(own, f) for f in FIELDS)


def set_config(own, cfg) -> None:
    for f, v in zip(FIELDS, cfg):
        setattr(own, f, v if v is None else bool(v) if f in BOOLS else int(v))


def key_of(cfg) -> str:
    pdl, unroll, pa, pb, occ, xs, mma, r16, blocks, nb, ka, kb, fi, fm, fo = cfg
    return (f"pdl{int(pdl)}_u{unroll}_a{pa}_b{pb}_o{int(occ)}_x{int(xs)}_m{int(mma)}_r{int(r16)}_k{blocks}_n{int(nb)}"
            f"_wa{'a' if ka is None else int(ka)}_wb{int(kb)}_fi{'a' if fi is None else int(fi)}"
            f"_fm{'a' if fm is None else int(fm)}_fo{int(fo)}")


def configs(tokens: int) -> list[tuple]:
    """The tensor-core kernel with the previous defaults (five launches) and the fusions of the small launches
    into the GEMVs (input Hadamard, activation, output); at 1-2 rows also the gate/up block layouts with the
    input Hadamard fused in (4 x 2 blocks: one wave at 1 row)."""
    pa, ka = gate_up_layout(tokens)
    fusions = [(0, 0, 0), (0, 1, 0), (0, 0, 1)]
    out = [(True, 16, pa, 1, False, False, True, 0, 4, True, ka, True, *f) for f in fusions]
    if tokens <= 2:
        for pa2, ka2, f in ((2, True, (1, 1, 0)), (2, False, (1, 1, 0)), (2, True, (1, 0, 0)), (4, True, (1, 1, 0))):
            out.append((True, 16, pa2, 1, False, False, True, 0, 4, True, ka2, True, *f))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", type=int, default=0,
                        help="only call the kernel eagerly 3 times at this many rows (for ncu) and exit")
    parser.add_argument("--config", default="", help=",".join(FIELDS) + " for --profile")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64", help="row counts to time")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(3)
    experts = [{"w1": packed(HIDDEN, INTER, K, gen, "cuda"), "w3": packed(HIDDEN, INTER, K, gen, "cuda"),
                "w2": packed(INTER, HIDDEN, K, gen, "cuda")} for _ in range(EXPERTS)]
    tables = {f"{sid}_{kind}": torch.tensor([e[sid][kind].data_ptr() for e in experts], dtype=torch.int64).cuda()
              for sid in ("w1", "w3", "w2") for kind in ("trellis", "suh", "svh")}
    own = OwnDecodeMoE(tables, K, HIDDEN, INTER, EXPERTS, TOP_K, torch.device("cuda"))
    defaults = config_of(own)  # what the served path runs
    occ6_from = own.occ6_from
    per_expert = sum(t.numel() * t.element_size() for e in experts[:1] for p in e.values()
                     for k, t in p.items() if k != "mul1")
    if args.profile:
        if args.config:
            set_config(own, [int(v) for v in args.config.split(",")])
        x, w, ids = routing(args.profile, gen, experts=EXPERTS)
        for _ in range(3):
            own(x, w, ids)
        torch.cuda.synchronize()
        return 0
    cap = torch.cuda.get_device_capability()
    floor = Floor(loader.load(f"sm_{cap[0]}{cap[1]}"), per_expert * EXPERTS)
    results = {"gpu": torch.cuda.get_device_name(), "expert_bytes": per_expert, "defaults": key_of(defaults),
               "accuracy": [], "timing": []}
    dense = {}
    # 8 experts routed: at 16 and 64 rows each expert takes several runs of 8 rows. Cases: (rows, fuse_in,
    # fuse_mid, fuse_out, picks outside this rank: "tp" = row 0's all, every odd pick of the others)
    acc_cases = [(t, 0, 0, 0, False) for t in (1, 4, 64)] + [(t, 1, 1, 1, False) for t in (1, 2)]
    acc_cases += [(t, 0, 1, 1, False) for t in (1, 2, 4, 8, 16, 64)] + [(1, 1, 0, 0, False), (2, 1, 0, 0, False)]
    acc_cases += [(4, 0, 1, 0, False), (4, 0, 0, 1, False), (2, 1, 1, 1, True), (4, 0, 1, 1, True), (16, 0, 1, 1, True)]
    for tokens, fi, fm, fo, tp in acc_cases:
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
            set_config(own, defaults)
            own.fuse_in, own.fuse_mid, own.fuse_out = bool(fi), bool(fm), bool(fo)
            out = torch.full((tokens, HIDDEN), float("nan"), dtype=dtype, device="cuda")
            y = own(xd, w, ids.to(torch.int32), out).float().cpu()
            row = {"tokens": tokens, "dtype": str(dtype), "fuse": f"{fi}{fm}{fo}", "tp": tp,
                   "vs_ref": rel(torch.nan_to_num(y, nan=1e9), ref), "nonfinite": int((~torch.isfinite(y)).sum())}
            if tp:
                row["row0_max_abs"] = float(y[0].abs().max())
            results["accuracy"].append(row)
            log(json.dumps(row))
    set_config(own, defaults)
    # graph replay with new inputs vs eager; no host sync
    replays = []
    for tokens, fi, fm, fo in ((1, 0, 0, 0), (1, 1, 1, 1), (2, 1, 1, 1), (4, 0, 1, 1), (16, 0, 1, 1), (64, 0, 1, 1),
                               (4, 0, 1, 0), (1, 1, 0, 0)):
        set_config(own, defaults)
        own.fuse_in, own.fuse_mid, own.fuse_out = bool(fi), bool(fm), bool(fo)
        x, w, ids = routing(tokens, gen, experts=EXPERTS)
        static = [t.clone() for t in (x, w, ids)]
        graph, out = capture(lambda: own(*static))
        new = routing(tokens, gen, experts=EXPERTS)
        for s_, n_ in zip(static, new):
            s_.copy_(n_)
        graph.replay()
        torch.cuda.synchronize()
        eager = own(*new)
        replays.append({"tokens": tokens, "fuse": f"{fi}{fm}{fo}", "max_rel": rel(out, eager)})
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
            for cfg in configs(tokens):
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
