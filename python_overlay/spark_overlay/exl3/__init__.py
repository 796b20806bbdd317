"""EXL3 in three tiers (docs/exl3-overlay.md, "Layout").

    format/    the reference math and the file format: codebooks, trellis decode/pack,
               tensor-parallel shards, validation, errors. torch on CPU only; no vLLM.
    backends/  how a layer computes: the CPU reference apply (decode once, dense GEMM),
               exllamav3's CUDA kernels, the fused-MoE schedule, and `backends.select`,
               the one place that chooses a back end and reads every EXL3 switch. No vLLM.
    vllm/      vLLM glue: the "exl3" quantization config, the linear and MoE methods
               (`vllm.common` holds what they share).

This package re-exports the format tier, so `from spark_overlay import exl3;
exl3.full_weight(...)` is the reference decoder.
"""

from .format import *  # noqa: F401,F403
from .format import __all__  # noqa: F401
