"""Engram row dequantization: ``bf16(fp8_e4m3(w) * 2^(e8m0 - 127))`` per 32-value group.

The weight bytes are always *viewed* as ``torch.float8_e4m3fn``. Reading them
as uint8 numbers (the reference kit's landmine) gives values that are fluent
garbage; ``test_engram_dequant.py`` shows the difference.

The scale factor comes from a 256-entry table equal to torch's own
``float8_e8m0fnu`` conversion (E=0 is 2^-127, a float32 subnormal; E=255 is
NaN), so every path here is bit-exact with the reference.
"""

from __future__ import annotations

import torch

WEIGHT_BYTES = 256
SCALE_BYTES = 8
GROUP = 32
ROW_BYTES = WEIGHT_BYTES + SCALE_BYTES

_tables: dict[torch.device, torch.Tensor] = {}


def e8m0_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 value of every E8M0 byte: 2^(e-127), NaN for 255."""
    device = torch.device(device)
    t = _tables.get(device)
    if t is None:
        codes = torch.arange(256, dtype=torch.int32)
        t = torch.ldexp(torch.ones(256, dtype=torch.float64), (codes - 127).to(torch.float64)).to(torch.float32)
        t[255] = float("nan")
        t = t.to(device)
        _tables[device] = t
    return t


def reference(weight_u8: torch.Tensor, scale_u8: torch.Tensor) -> torch.Tensor:
    """The definition, through torch's own float8 dtypes: [R,256] u8, [R,8] u8 -> [R,256] bf16."""
    r = weight_u8.shape[0]
    w = weight_u8.contiguous().view(torch.float8_e4m3fn).to(torch.float32).view(r, SCALE_BYTES, GROUP)
    s = scale_u8.contiguous().view(torch.float8_e8m0fnu).to(torch.float32).view(r, SCALE_BYTES, 1)
    return (w * s).view(r, WEIGHT_BYTES).to(torch.bfloat16)


def dequant(weight_u8: torch.Tensor, scale_u8: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Production path (CPU or GPU, graph-capturable: no host syncs, no allocation of
    data-dependent size): [R,256] u8 + [R,8] u8 -> [R,256] bf16 (into ``out`` if given)."""
    r = weight_u8.shape[0]
    w = weight_u8.view(torch.float8_e4m3fn).to(torch.float32).view(r, SCALE_BYTES, GROUP)
    s = e8m0_table(weight_u8.device)[scale_u8.to(torch.int64)].view(r, SCALE_BYTES, 1)
    y = (w * s).view(r, WEIGHT_BYTES)
    if out is None:
        return y.to(torch.bfloat16)
    out.copy_(y)
    return out


def dequant_records(records_u8: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[R,264] weight||scale records -> [R,256] bf16."""
    return dequant(records_u8[:, :WEIGHT_BYTES], records_u8[:, WEIGHT_BYTES:], out)


def dequant_uint8_landmine(weight_u8: torch.Tensor, scale_u8: torch.Tensor) -> torch.Tensor:
    """What reading the weight bytes as uint8 numbers computes (wrong; for the test only)."""
    r = weight_u8.shape[0]
    w = weight_u8.to(torch.float32).view(r, SCALE_BYTES, GROUP)
    s = e8m0_table(weight_u8.device)[scale_u8.to(torch.int64)].view(r, SCALE_BYTES, 1)
    return (w * s).view(r, WEIGHT_BYTES).to(torch.bfloat16)
