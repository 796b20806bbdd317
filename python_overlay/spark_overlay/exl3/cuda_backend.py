"""CUDA back end of the EXL3 linear method: exllamav3's `exl3_gemm` on the rank's trellis tiles.

The kernel computes y = had(x ⊙ suh) @ W_hat, had(·) ⊙ svh in fp16 without
materialising W (format doc §2.1). It needs whole 128-blocks on both sides,
so every shard of the layer must be a whole-tile slice (`ShardSpec.whole_tiles`);
anything else fails closed. `Exl3CudaShards` is vLLM-free so the GPU parity
check (tests/gpu/) runs it directly against the CPU reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .codebook import CODEBOOK_MCG, CODEBOOK_MUL1
from .errors import Exl3FormatError
from .linear import unpack_signs
from .shards import ShardSpec, shard_codebook, shard_k
from .trellis import HALF_K


class Exl3CudaShards:
    """The packed shards of one layer on the GPU, concatenated along the output at run time."""

    def __init__(
        self,
        specs: Sequence[ShardSpec],
        parts: Sequence[Mapping[str, torch.Tensor]],
        expected_codebook: str | None,
        ext,
        device: torch.device | str,
        pad_rows: Sequence[int] = (),
    ) -> None:
        self.ext = ext
        self.shards = []
        pads = list(pad_rows) or [0] * len(specs)
        in_lens = set()
        for spec, p, pad in zip(specs, parts, pads):
            if not spec.whole_tiles:
                raise Exl3FormatError(
                    f"{spec.name}: this rank's slice (in {spec.in_range}, out {spec.out_range}) is not made of "
                    "whole 128-blocks, which the exl3 CUDA kernel needs; use a tensor-parallel size that "
                    "splits this layer on 128-multiples"
                )
            codebook = shard_codebook(spec, p, expected_codebook)
            k = shard_k(p)
            if k in HALF_K and codebook != CODEBOOK_MUL1:
                raise Exl3FormatError(f"{spec.name}.trellis: half-integer K={k} requires a {spec.name}.mul1 marker")
            suh = p["suh"] if "suh" in p else unpack_signs(p["su"], f"{spec.name}.su")
            svh = p["svh"] if "svh" in p else unpack_signs(p["sv"], f"{spec.name}.sv")
            i0, i1 = spec.in_range
            o0, o1 = spec.out_range
            in_lens.add((i1 - i0, suh.shape[0]))
            self.shards.append(
                {
                    "trellis": p["trellis"].to(device),
                    "suh": suh.to(device=device, dtype=torch.float16),
                    "svh": svh.to(device=device, dtype=torch.float16),
                    "mcg": codebook == CODEBOOK_MCG,
                    "mul1": codebook == CODEBOOK_MUL1,
                    "out": o1 - o0,
                    "pad_rows": pad,
                }
            )
        if len(in_lens) != 1:
            raise Exl3FormatError(f"{specs[0].name}: shards of one layer disagree on the input slice {in_lens}")
        (self.in_features, self.padded_in), = in_lens

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        xf = x.reshape(-1, x.shape[-1]).to(torch.float16)
        if self.padded_in != self.in_features:
            xf = torch.nn.functional.pad(xf, (0, self.padded_in - self.in_features))
        xf = xf.contiguous()
        outs = []
        for s in self.shards:
            y = torch.empty(xf.shape[0], s["svh"].shape[0], dtype=torch.float16, device=xf.device)
            xh = torch.empty_like(xf)
            self.ext.exl3_gemm(xf, s["trellis"], y, s["suh"], xh, s["svh"], -1, s["mcg"], s["mul1"], 0)
            outs.append(y[:, : s["out"]])
            if s["pad_rows"]:
                outs.append(torch.zeros(xf.shape[0], s["pad_rows"], dtype=torch.float16, device=xf.device))
        y = torch.cat(outs, -1) if len(outs) > 1 else outs[0]
        y = y.to(x.dtype)
        if bias is not None:
            y = y + bias
        return y.reshape(*lead, y.shape[-1])


def prepare_cuda_layer(layer: torch.nn.Module, shards, expected_codebook: str | None, ext) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    layer.exl3_cuda = Exl3CudaShards(
        [s.spec for s in shards],
        [layer.exl3_parts[s.key] for s in shards],
        expected_codebook,
        ext,
        device,
        [s.pad_rows for s in shards],
    )


def cuda_linear(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return layer.exl3_cuda(x, bias)
