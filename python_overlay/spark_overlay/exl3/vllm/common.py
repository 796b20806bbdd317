"""What the EXL3 linear and MoE methods share: the platform's back end, vLLM's sizes, first-use logs."""

from __future__ import annotations

import logging
import os
import threading

import torch

from ..backends import select

logger = logging.getLogger("vllm.spark_overlay.exl3")


def backend() -> str:
    """This process's EXL3 back end ("cpu" / "cuda"), from the platform vLLM runs on."""
    from vllm.platforms import current_platform

    return select.backend(current_platform.is_cuda())


def engine_sizes() -> tuple[list[int], int]:
    """(the CUDA-graph capture sizes, [] when eager; the largest batch in tokens) from vLLM's config.

    The EXL3 CUDA paths pretune at the capture sizes and size the fused MoE's
    temp buffers for the largest batch (scheduler_config.max_num_batched_tokens).
    """
    from vllm.config import get_current_vllm_config

    cfg = get_current_vllm_config()
    sizes: list[int] = []
    if not getattr(cfg.model_config, "enforce_eager", False):
        sizes = [int(s) for s in (getattr(cfg.compilation_config, "cudagraph_capture_sizes", None) or [])]
    max_tokens = int(getattr(cfg.scheduler_config, "max_num_batched_tokens", 0) or 0)
    return sizes, max(max_tokens, max(sizes, default=0), 1)


class FirstUse:
    """Logs one line per process the first time any EXL3 layer (of one kind) computes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pids: set[int] = set()

    def __call__(self, prefix: str, backend: str, x: torch.Tensor) -> None:
        pid = os.getpid()
        if pid in self._pids:
            return
        with self._lock:
            if pid in self._pids:
                return
            self._pids.add(pid)
        from spark_overlay.plugin import process_role

        logger.info(
            "exl3: first %s forward through %s (x %s %s) in pid=%d (%s)",
            backend,
            prefix,
            list(x.shape),
            str(x.dtype).removeprefix("torch."),
            pid,
            process_role() or "unknown role",
        )


first_use = FirstUse()
first_moe_use = FirstUse()
