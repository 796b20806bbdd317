"""CPU back end: every EXL3 shard is decoded once at load into the compute dtype (the reference math).

The layer then runs a dense GEMM on the decoded weight (the vLLM glue hands it
to vLLM's unquantized method), so serving an EXL3 model on the CPU is
bit-identical to serving its decoded weights as a dense model. vLLM-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..format.errors import Exl3FormatError
from ..format.shards import ShardSpec, decode_shard


def check_width(name: str, x: torch.Tensor, in_features: int) -> None:
    """Every EXL3 apply, before any kernel: x must be [..., in_features] (this rank's input slice)."""
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise Exl3FormatError(
            f"{name}: input {list(x.shape)} does not end in this rank's input width {in_features} "
            "(a row-parallel layer takes the rank's slice of the input, not the full width)"
        )


def dense_linear(
    shards: Sequence[tuple[ShardSpec, Mapping[str, torch.Tensor], int]],
    expected_codebook: str | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The rank's nn.Linear weight [out_local, in_local]: each (spec, parts, pad rows) decoded, in order."""
    rows = []
    for spec, parts, pad in shards:
        w = decode_shard(spec, parts, expected_codebook)
        rows.append(w.to(dtype))
        if pad:
            rows.append(torch.zeros(pad, w.shape[1], dtype=dtype))
    return torch.cat(rows, 0) if len(rows) > 1 else rows[0]


def dense_experts(
    experts: Sequence[Mapping[str, tuple[ShardSpec, Mapping[str, torch.Tensor]]]],
    expected_codebook: str | None,
    dtype: torch.dtype,
    hidden: int,
    inter: int,
    with_bias: bool,
    add_down_bias: bool,
) -> dict[str, torch.Tensor]:
    """Stacked local experts for a fused-MoE GEMM: w13 [E, 2I, H], w2 [E, H, I] (+ w13_bias, w2_bias).

    `experts[e]` maps "w1" (gate), "w3" (up), "w2" (down) to (spec, parts).
    The down bias is kept only where `add_down_bias` (rank 0), so the
    tensor-parallel sum adds it once.
    """
    n = len(experts)
    out = {
        "w13_weight": torch.empty(n, 2 * inter, hidden, dtype=dtype),
        "w2_weight": torch.empty(n, hidden, inter, dtype=dtype),
    }
    if with_bias:
        out["w13_bias"] = torch.zeros(n, 2 * inter, dtype=dtype)
        out["w2_bias"] = torch.zeros(n, hidden, dtype=dtype)
    for e, shards in enumerate(experts):
        decoded = {sid: decode_shard(spec, parts, expected_codebook) for sid, (spec, parts) in shards.items()}
        out["w13_weight"][e, :inter] = decoded["w1"].to(dtype)
        out["w13_weight"][e, inter:] = decoded["w3"].to(dtype)
        out["w2_weight"][e] = decoded["w2"].to(dtype)
        if with_bias:
            out["w13_bias"][e, :inter] = shards["w1"][1]["bias"].to(dtype)
            out["w13_bias"][e, inter:] = shards["w3"][1]["bias"].to(dtype)
            if add_down_bias:
                out["w2_bias"][e] = shards["w2"][1]["bias"].to(dtype)
    return out
