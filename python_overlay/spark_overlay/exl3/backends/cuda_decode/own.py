"""spark-kit's own EXL3 MoE decode kernel (decode_moe.cu) for 1..8 token rows.

Takes the layer's device pointer tables from the fused path (`Exl3FusedMoE.tables`), reads the
caller's dtypes as they are (x f16/bf16, ids int32/int64, weights f32/f16/bf16) and writes the
output in x's dtype: no conversion or zeroing kernels around its five launches. MUL1 codebook,
one K for gate/up/down in 2..6 (`supports`); anything else keeps exllamav3's decode kernel.
"""

from __future__ import annotations

import torch

from ...format.codebook import CODEBOOK_MUL1
from . import loader

ROWS = 8  # rows per call (the kernel's limit; more rows are chunked by the caller)
# Rows the served path gives it: on an H200 it takes 0.84x / 0.89x / 0.83x of the time of exllamav3's decode
# kernel at 1 / 2 / 4 rows, but 1.15x at 8 (python_overlay/tests/gpu/results-h200-decode*.json, docs/performance.md)
SERVE_ROWS = 4
MAX_TOP_K = 8  # picks per row (the output kernel's warps per block)
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
STAGE_PDL = 32  # decode_moe.cu: launch with programmatic dependent launch
STAGE_OCC6 = 64  # decode_moe.cu: the gemv variant built for 6 blocks per SM
STAGE_XS = 128  # decode_moe.cu: the gemv variant that stages its inputs through shared memory


def supports(groups: list[tuple], top_k: int = 1) -> str | None:
    """Why the own kernel cannot take a layer with these (codebook, Kg, Ku, Kd, ...) groups, or None."""
    if top_k > MAX_TOP_K:
        return f"top-{top_k} routing (the own kernel takes up to top-{MAX_TOP_K})"
    if len(groups) != 1:
        return "experts with different bit widths"
    cb, kg, ku, kd = groups[0][:4]
    if cb != CODEBOOK_MUL1:
        return f"codebook {cb} (the own kernel decodes mul1)"
    if not (kg == ku == kd) or kg not in (2, 3, 4, 5, 6):
        return f"K {kg}/{ku}/{kd} (the own kernel takes one integer K in 2..6)"
    return None


class OwnDecodeMoE:
    """One layer's own decode kernel, sharing the fused path's pointer tables."""

    def __init__(self, tables: dict[str, torch.Tensor], k: int, hidden: int, inter: int, num_local: int,
                 top_k: int, device: torch.device) -> None:
        self.device = torch.device(device)
        cap = torch.cuda.get_device_capability(self.device)
        self.lib = loader.load(f"sm_{cap[0]}{cap[1]}")
        order = [f"{sid}_{kind}" for sid in ("w1", "w3", "w2") for kind in ("trellis", "suh", "svh")]
        self.tables = torch.stack([tables[name] for name in order]).contiguous()  # [9, num_local] int64
        self.k, self.hidden, self.inter, self.num_local, self.top_k = int(k), hidden, inter, num_local, top_k
        self.parts_a, self.parts_b = 0, 1  # 0: chosen per call (3 k-parts for gate/up at <= 8 slots, else 2)
        # k-tiles streamed per stage (16: 8 tiles x 4 deep, the fastest at 1, 4 and 8 rows on an H200);
        # launches to run (31: all five)
        self.unroll, self.stages = 16, 31
        self.occ6 = False  # gemv variant with registers capped for 6 blocks per SM (1-2 rows)
        # gemv variant that stages its inputs through shared memory with the weights (1-2 rows): measured
        # 3-7 % slower on an H200 (python_overlay/tests/gpu/results-h200-decode-own.json), so off
        self.xs = False
        # programmatic dependent launch (sm_90+): each launch's weight prefetch overlaps the one before
        self.pdl = cap[0] >= 9
        slots = ROWS * top_k
        f32 = {"dtype": torch.float32, "device": self.device}
        self.xh = torch.empty(slots, 2, hidden, **f32)
        self.gu = torch.empty(4, slots, 2, inter, **f32)
        self.ah = torch.empty(slots, inter, **f32)
        self.dd = torch.empty(4, slots, hidden, **f32)

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        rows, top_k = topk_ids.shape
        if not 0 < rows <= ROWS or top_k > self.top_k:
            raise ValueError(f"own decode kernel: {rows} rows x top-{top_k} (takes 1..{ROWS} x top-{self.top_k})")
        dtype = x.dtype
        x = x.reshape(rows, self.hidden)
        x = x if x.dtype in (torch.float16, torch.bfloat16) else x.to(torch.float16)
        x = x.contiguous()
        ids = topk_ids if topk_ids.dtype in (torch.int32, torch.int64) else topk_ids.long()
        ids = ids.contiguous()
        w = topk_weights if topk_weights.dtype in DTYPES else topk_weights.float()
        w = w.contiguous()
        if out is None:
            out = torch.empty(rows, self.hidden, dtype=dtype if dtype in DTYPES else x.dtype, device=x.device)
        parts_a = self.parts_a or (3 if rows * top_k <= 8 else 2)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        err = self.lib.spark_decode_moe(
            x.data_ptr(), DTYPES[x.dtype], ids.data_ptr(), int(ids.dtype == torch.int64), w.data_ptr(),
            DTYPES[w.dtype], out.data_ptr(), DTYPES[out.dtype], rows, top_k, self.hidden, self.inter,
            self.num_local, self.tables.data_ptr(), self.k, self.xh.data_ptr(), self.gu.data_ptr(),
            self.ah.data_ptr(), self.dd.data_ptr(), parts_a, self.parts_b, self.unroll,
            self.stages | (STAGE_PDL if self.pdl else 0) | (STAGE_OCC6 if self.occ6 else 0) | (STAGE_XS if self.xs else 0),
            stream,
        )
        loader.check(err, "spark_decode_moe")
        return out if out.dtype == dtype else out.to(dtype)
