"""`Exl3Config`: the "exl3" quantization method for vLLM (plugged in by spark_overlay.plugin).

Selected by a checkpoint whose config.json carries
`quantization_config: {"quant_method": "exl3", ...}` (exllamav3's converter
writes it; `override_quantization_method` claims it) or by
`--quantization exl3` (then config.json or quantization_config.json must
describe an EXL3 model). The config is informational except for `codebook`:
when present, every linear's marker must agree with it (format doc §1.2).

Layers: every supported linear and the LM head get `Exl3LinearMethod`;
token embeddings, norms, attention and MoE routers (`*.gate`) stay
unquantized, as exllamav3 leaves them. DeepSeek V4.1's `wo_a` is served dense
(decoded at load, `dsv41.py`); any other linear type raises naming the layer.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import torch

from ..format.codebook import CODEBOOKS
from ..format.errors import Exl3FormatError

logger = logging.getLogger("vllm.spark_overlay.exl3")

QUANT_METHOD = "exl3"
# Leaf names of linears exllamav3 leaves unquantized (MoE routers).
UNQUANTIZED_LEAVES = ("gate",)

# EXL3 layers made ready in this process (the config object is pickled to
# workers, so the counter lives at module level).
_count_lock = threading.Lock()
_loaded_layers = 0


def _quantization_config_base():
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    return QuantizationConfig


class Exl3Config(_quantization_config_base()):
    """vLLM quantization config for EXL3 checkpoints."""

    def __init__(
        self,
        codebook: str | None = None,
        bits: float | None = None,
        head_bits: float | None = None,
        version: str | None = None,
    ) -> None:
        super().__init__()
        if codebook is not None and codebook not in CODEBOOKS:
            raise Exl3FormatError(
                f"quantization_config.codebook {codebook!r} is not one of {', '.join(CODEBOOKS)}"
            )
        self.codebook = codebook
        self.bits = bits
        self.head_bits = head_bits
        self.version = version

    def __repr__(self) -> str:
        return (
            f"Exl3Config(codebook={self.codebook!r}, bits={self.bits}, head_bits={self.head_bits}, "
            f"version={self.version!r})"
        )

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["quantization_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Exl3Config:
        method = config.get("quant_method", QUANT_METHOD)
        if method != QUANT_METHOD:
            raise Exl3FormatError(
                f"quantization_config.quant_method is {method!r}, not {QUANT_METHOD!r}; "
                "this is not an EXL3 checkpoint"
            )
        codebook = config.get("codebook")
        return cls(
            codebook=None if codebook is None else str(codebook).lower(),
            bits=config.get("bits"),
            head_bits=config.get("head_bits"),
            version=config.get("version"),
        )

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None) -> str | None:
        if isinstance(hf_quant_cfg, dict) and hf_quant_cfg.get("quant_method") == QUANT_METHOD:
            if user_quant in (None, QUANT_METHOD):
                return QUANT_METHOD
        return None

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        from vllm.model_executor.layers.fused_moe import RoutedExperts
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

        from .dsv41 import grouped_layer
        from .linear import Exl3LinearMethod, supported_layer

        if isinstance(layer, RoutedExperts):
            from .moe import Exl3MoEMethod

            return Exl3MoEMethod(layer.moe_config, self, prefix)
        if isinstance(layer, LinearBase) and prefix.rsplit(".", 1)[-1] in UNQUANTIZED_LEAVES:
            return UnquantizedLinearMethod()
        if isinstance(layer, LinearBase) and grouped_layer(prefix):
            from .grouped import Exl3GroupedMethod

            return Exl3GroupedMethod(self, prefix)  # DeepSeek V4.1's wo_a: one EXL3 linear per group
        if supported_layer(layer):
            return Exl3LinearMethod(self, prefix)
        if isinstance(layer, LinearBase):
            raise Exl3FormatError(
                f"{prefix}: vLLM layer type {type(layer).__name__} has no EXL3 method "
                "(supported: column, row, merged, QKV parallel and replicated linears, the LM head, MoE experts)"
            )
        return None

    def note_loaded(self, prefix: str, backend: str | None, ks: list[float]) -> None:
        """Log one line per EXL3 layer made ready in this process."""
        from spark_overlay.plugin import process_role

        global _loaded_layers
        with _count_lock:
            _loaded_layers += 1
            count = _loaded_layers
        logger.info(
            "exl3: %s ready on %s (%d packed linear%s, K %s), layer %d in pid=%d (%s)",
            prefix,
            backend,
            len(ks),
            "" if len(ks) == 1 else "s",
            "/".join(f"{k:g}" for k in ks),
            count,
            os.getpid(),
            process_role() or "unknown role",
        )


def register() -> None:
    """spark_overlay provider: register "exl3" with vLLM's quantization registry (idempotent)."""
    from vllm.model_executor.layers.quantization import (
        QUANTIZATION_METHODS,
        get_quantization_config,
        register_quantization_config,
    )

    from spark_overlay.plugin import installed_vllm_version

    from . import dsv41, dsv41_hooks

    dsv41.register(installed_vllm_version())
    dsv41_hooks.register(installed_vllm_version())
    if QUANT_METHOD in QUANTIZATION_METHODS and get_quantization_config(QUANT_METHOD) is Exl3Config:
        return
    register_quantization_config(QUANT_METHOD)(Exl3Config)
