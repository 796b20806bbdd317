"""EXL3 codebooks: 16-bit trellis state -> fp16 weight value.

Three codebooks exist (format doc §2.4). Each is materialised once as a
65,536-entry fp16 table indexed by the state. Integer arithmetic runs in int64
with an explicit mod-2^32 wrap; the fp16 add / fma of the kernels is computed
exactly (every intermediate fits a float64 and, as checked in the tests, a
float32 without loss) and rounded to fp16 once, round-to-nearest-even.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from .errors import Exl3FormatError

CODEBOOK_3INST = "3inst"
CODEBOOK_MCG = "mcg"
CODEBOOK_MUL1 = "mul1"
CODEBOOKS = (CODEBOOK_3INST, CODEBOOK_MCG, CODEBOOK_MUL1)

# Multipliers, as unsigned 32-bit values. The MCG / MUL1 markers stored in a
# checkpoint carry exactly these values (read as int32: -877912083 and
# -2082680531).
INST3_MULTIPLIER = 89226354
INST3_ADDEND = 64248484
MCG_MULTIPLIER = 0xCBAC1FED
MUL1_MULTIPLIER = 0x83DCD12D

MARKER_VALUES = {
    CODEBOOK_MCG: MCG_MULTIPLIER - (1 << 32),
    CODEBOOK_MUL1: MUL1_MULTIPLIER - (1 << 32),
}

_U32 = 0xFFFFFFFF
_INST_MASK = 0x8FFF8FFF
_INST_XOR = 0x3B603B60
_MUL1_SCALE_BITS = 0x1EEE  # fp16 0.00676727294921875
_MUL1_OFFSET_BITS = 0xC931  # fp16 -10.3828125

NUM_STATES = 1 << 16


def fp16_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """Reinterpret integers in [0, 65536) as fp16 bit patterns."""
    signed = torch.where(bits >= 0x8000, bits - 0x10000, bits)
    return signed.to(torch.int16).view(torch.float16)


def _round_to_fp16(exact: torch.Tensor) -> torch.Tensor:
    """Round float64 values that are exactly representable in float32 to fp16 (RNE).

    torch converts float64 -> fp16 via float32; the values handled here are
    exact in float32, so that path rounds once.
    """
    as_f32 = exact.to(torch.float32)
    if not torch.equal(as_f32.to(torch.float64), exact):
        raise ArithmeticError("codebook intermediate not exact in float32; fp16 rounding would be double")
    return as_f32.to(torch.float16)


def _states() -> torch.Tensor:
    return torch.arange(NUM_STATES, dtype=torch.int64)


def _half_sum_table(multiplier: int, addend: int) -> torch.Tensor:
    x = (_states() * multiplier + addend) & _U32
    x = (x & _INST_MASK) ^ _INST_XOR
    lo = fp16_from_bits(x & 0xFFFF).to(torch.float64)
    hi = fp16_from_bits(x >> 16).to(torch.float64)
    return _round_to_fp16(lo + hi)


def _mul1_table() -> torch.Tensor:
    x = (_states() * MUL1_MULTIPLIER) & _U32
    byte_sum = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + ((x >> 24) & 0xFF)
    scale = fp16_from_bits(torch.tensor(_MUL1_SCALE_BITS)).to(torch.float64)
    offset = fp16_from_bits(torch.tensor(_MUL1_OFFSET_BITS)).to(torch.float64)
    return _round_to_fp16((1024 + byte_sum).to(torch.float64) * scale + offset)


@lru_cache(maxsize=None)
def _table(name: str) -> torch.Tensor:
    if name == CODEBOOK_3INST:
        return _half_sum_table(INST3_MULTIPLIER, INST3_ADDEND)
    if name == CODEBOOK_MCG:
        return _half_sum_table(MCG_MULTIPLIER, 0)
    return _mul1_table()


def codebook_table(name: str) -> torch.Tensor:
    """The fp16 [65536] table of codebook `name` ("3inst", "mcg" or "mul1").

    The table is computed once per process and shared; callers must not modify it.
    """
    if name not in CODEBOOKS:
        raise Exl3FormatError(f"unknown EXL3 codebook {name!r}; expected one of {', '.join(CODEBOOKS)}")
    return _table(name)
