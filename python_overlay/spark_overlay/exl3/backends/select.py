"""The one place that chooses an EXL3 back end and reads the EXL3 switches.

Back ends: "cpu" (decode once at load, dense GEMM: `backends.cpu`) and "cuda"
(exllamav3's kernels: `backends.cuda_backend`, `backends.cuda_moe_fused`).
The vLLM glue asks `backend(on_cuda)` with the platform vLLM reports and
`cuda_extension()` for the compiled kernels; nothing else under `exl3/`
reads the environment.

Switches (registered in src/envvars.rs):

    SPARK_EXL3_MOE_COOP   which kernels take decode-sized calls: "own" (default)
                          spark-kit's own decode kernels (backends/cuda_decode,
                          MUL1, K 2..6): MoE calls of 1..64 rows on sm_80+
                          (tensor-core GEMVs; 1..4 rows below sm_80) and dense
                          linear calls of up to 32 rows on sm_80+ (8 where the
                          output is wider than the input; larger calls keep
                          exl3_gemm: cuda_decode/own_linear.py); other layers, and
                          any where it cannot be built, keep exllamav3's with a
                          warning; where a layer's load-time check disagrees the
                          load fails when "own" was set, and that layer falls back
                          to exllamav3's with a warning when "own" is only the
                          default; "1": exllamav3's kernels (MoE: its decode kernel
                          exl3_moe_coop in chunks of up to 42 rows; linears:
                          exl3_gemm); "0": the sorted exl3_moe kernels at every
                          size, exl3_gemm for linears
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..format.errors import Exl3FormatError

CPU, CUDA = "cpu", "cuda"
MOE_COOP_ENV, MOE_COOP_DEFAULT = "SPARK_EXL3_MOE_COOP", "own"
SWITCHES = (MOE_COOP_ENV,)
DECODE_OFF, DECODE_EXLLAMAV3, DECODE_OWN = "off", "exllamav3", "own"
_DECODE_VALUES = {"0": DECODE_OFF, "1": DECODE_EXLLAMAV3, "own": DECODE_OWN}


def backend(on_cuda: bool) -> str:
    """The back end of every EXL3 layer of this process: "cuda" on a CUDA platform, else "cpu"."""
    return CUDA if on_cuda else CPU


def moe_decode(env: Mapping[str, str] = os.environ) -> str:
    """The decode kernel of MoE calls up to 64 rows: "own" (default), "exllamav3" or "off" (sorted tiers)."""
    raw = env.get(MOE_COOP_ENV, MOE_COOP_DEFAULT)
    if raw not in _DECODE_VALUES:
        raise Exl3FormatError(f"{MOE_COOP_ENV}={raw!r} is not 0, 1 or own")
    return _DECODE_VALUES[raw]


def linear_decode(env: Mapping[str, str] = os.environ) -> str:
    """The kernel of dense EXL3 linear calls at decode sizes: "own" (the switch's default) or "exllamav3"
    (exl3_gemm; the switch at 1 or 0)."""
    return DECODE_OWN if moe_decode(env) == DECODE_OWN else DECODE_EXLLAMAV3


def moe_decode_explicit(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the user set the switch (then a failed own-kernel check, MoE or linear, fails the load instead of
    falling back)."""
    return MOE_COOP_ENV in env


def moe_coop(env: Mapping[str, str] = os.environ) -> bool:
    """Whether MoE calls up to 64 rows may use a decode kernel (exllamav3's, or the own one with it as fallback)."""
    return moe_decode(env) != DECODE_OFF


def cuda_extension():
    """exllamav3's compiled extension, or an Exl3FormatError saying how to get it."""
    try:
        from exllamav3.ext import exllamav3_ext
    except Exception as err:  # ImportError, or a failed JIT build
        raise Exl3FormatError(
            "EXL3 on CUDA needs exllamav3's extension (exllamav3_ext) and it could not be imported "
            f"({type(err).__name__}: {err}); install exllamav3 1.6.5 with a CUDA toolchain matching torch "
            "into the engine venv (python_overlay/tests/gpu/README.md shows the build), or serve on the "
            "CPU back end"
        ) from err
    return exllamav3_ext
