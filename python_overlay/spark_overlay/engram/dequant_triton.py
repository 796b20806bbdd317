"""Fused GPU dequant: 264-byte records -> bf16 rows in one pass (Triton).

Same arithmetic as ``dequant.dequant``: the weight byte bit-cast to FP8 E4M3
and widened to float32, times the E8M0 scale as float32 (2^(e-127) built from
its bits; E=0 is the subnormal 2^-127, E=255 NaN), rounded to bf16. Checked
bit for bit against the CPU reference by python_overlay/tests/gpu/engram_dequant.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dequant_kernel(rec_ptr, out_ptr, rows, REC: tl.constexpr, DIM: tl.constexpr, GROUP: tl.constexpr,
                    BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, DIM)
    mask = (r < rows)[:, None]
    base = r.to(tl.int64)[:, None] * REC
    w8 = tl.load(rec_ptr + base + c[None, :], mask=mask, other=0)
    w = w8.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    e = tl.load(rec_ptr + base + DIM + (c // GROUP)[None, :], mask=mask, other=127).to(tl.int32)
    normal = (e << 23).to(tl.float32, bitcast=True)
    scale = tl.where(e == 0, 5.877471754111438e-39, normal)  # 2^-127, a float32 subnormal
    scale = tl.where(e == 255, float("nan"), scale)
    y = (w * scale).to(tl.bfloat16)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * DIM + c[None, :], y, mask=mask)


def dequant_records(records_u8: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """[R,264] uint8 (contiguous, CUDA) -> ``out`` [R,256] bf16."""
    rows = records_u8.shape[0]
    if rows == 0:
        return out
    block = 16
    _dequant_kernel[(triton.cdiv(rows, block),)](records_u8, out, rows, REC=264, DIM=256, GROUP=32, BLOCK_R=block)
    return out
