"""CUDA back end of the EXL3 linear method: exllamav3's `exl3_gemm` on the rank's trellis tiles.

The kernel computes y = had(x ⊙ suh) @ W_hat, had(·) ⊙ svh in fp16 without
materialising W (format doc §2.1). It needs whole 128-blocks on both sides,
so every shard of the layer must be a whole-tile slice (`ShardSpec.whole_tiles`);
anything else fails closed. `Exl3CudaShards` is vLLM-free so the GPU parity
check (python_overlay/tests/gpu/) runs it directly against the CPU reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..format.codebook import CODEBOOK_MCG, CODEBOOK_MUL1
from ..format.errors import Exl3FormatError
from ..format.linear import unpack_signs
from ..format.shards import ShardSpec, shard_codebook, shard_k
from ..format.trellis import HALF_K
from . import select, serial
from .cpu import check_width
from .cuda_decode import own_linear


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
        self.name = specs[0].name if specs else "exl3 linear"
        self.shards = []
        self.tuned: set[int] = set()  # row counts run eagerly (exl3_gemm autotuned for them)
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
                    "codebook": codebook,
                    "k": k,
                    "out": o1 - o0,
                    "pad_rows": pad,
                }
            )
        if len(in_lens) != 1:
            raise Exl3FormatError(f"{specs[0].name}: shards of one layer disagree on the input slice {in_lens}")
        (self.in_features, self.padded_in), = in_lens
        self.own: own_linear.OwnDecodeLinear | None = None  # spark-kit's decode GEMV (`use_own`)

    def use_own(self, explicit: bool) -> None:
        """Calls of up to its serve rows through spark-kit's own decode GEMV where it takes the layer and
        agrees with exl3_gemm at load (`own_linear.attach`); explicit: the switch was set to own."""
        self.own = own_linear.attach(self, explicit)

    def pretune(self, sizes: Sequence[int], device) -> None:
        """Run once eagerly at each row count: exl3_gemm autotunes (and synchronises) on a shape's first call."""
        for m in sorted(set(int(s) for s in sizes if int(s) > 0)):
            self(torch.zeros(m, self.in_features, dtype=torch.float16, device=device))

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        check_width(self.name, x, self.in_features)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if self.own is not None and x2.shape[0] <= self.own.serve_rows:
            y = self.own(x2, bias)  # reads and writes x's dtype, bias included
        else:
            y = self.gemm(x2).to(x.dtype)
            if bias is not None:
                y = y + bias
        return y.reshape(*lead, y.shape[-1])

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        """exl3_gemm over the shards: y [rows, out] fp16 for x [rows, in]."""
        xf = x.to(torch.float16)
        rows = xf.shape[0]
        if capturing():
            if rows not in self.tuned:
                raise Exl3FormatError(
                    f"{self.name}: a CUDA graph captures exl3_gemm at {rows} rows, which never ran before the capture "
                    "(its autotune synchronises); add the size to engine.cudagraph_capture_sizes so the load pretunes "
                    "it, or serve with engine.enforce_eager: true"
                )
        else:
            self.tuned.add(rows)
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
        return torch.cat(outs, -1) if len(outs) > 1 else outs[0]


def capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def prepare_cuda_layer(
    layer: torch.nn.Module, shards, expected_codebook: str | None, ext, pretune_sizes: Sequence[int] = ()
) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    layer.exl3_cuda = Exl3CudaShards(
        [s.spec for s in shards],
        [layer.exl3_parts[s.key] for s in shards],
        expected_codebook,
        ext,
        device,
        [s.pad_rows for s in shards],
    )
    wire_own(layer.exl3_cuda)
    layer.exl3_cuda.pretune(pretune_sizes, device)


def wire_own(lin: Exl3CudaShards) -> None:
    """The own decode GEMV for a linear layer where SPARK_EXL3_MOE_COOP asks for it (`select.linear_decode`)."""
    if select.linear_decode() == select.DECODE_OWN:
        lin.use_own(select.moe_decode_explicit())


def cuda_linear(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A layer's EXL3 GEMMs, on the device's EXL3 stream (`serial`)."""
    with serial.kernels(x.device):
        return layer.exl3_cuda(x, bias)


def cuda_moe(layer: torch.nn.Module, x: torch.Tensor, topk_weights, topk_ids, expert_map, weight_on_input: bool):
    """A layer's routed EXL3 experts (fused kernel or loop), on the device's EXL3 stream (`serial`)."""
    with serial.kernels(x.device):
        return layer.exl3_cuda_moe(x, topk_weights, topk_ids, expert_map, weight_on_input)


# vLLM shard ids of one expert: gate (w1), up (w3), down (w2).
MOE_SHARDS = ("w1", "w3", "w2")


class Exl3CudaMoE:
    """Routed EXL3 experts on CUDA: a per-expert loop of `exl3_gemm` (gate, up, SiLU-and-mul, down).

    `experts[e]` maps "w1"/"w3"/"w2" to (ShardSpec, parts) of local expert e:
    gate/up are column slices, down a row slice of this rank (whole 128-blocks
    required, as for linears). Biases (`parts["bias"]`, the rank's slice) are
    added after each projection; the down bias only where `add_down_bias` (rank
    0), so it is counted once after the tensor-parallel sum. The output is this
    rank's partial sum in x's dtype, accumulated in float32.

    This loop reads the expert counts on the host, so it cannot run inside a
    CUDA graph; it is the fallback of `cuda_moe_fused.Exl3FusedMoE` (exllamav3's
    fused kernel) for layers that kernel cannot take.
    """

    def __init__(
        self,
        experts: Sequence[Mapping[str, tuple[ShardSpec, Mapping[str, torch.Tensor]]]],
        expected_codebook: str | None,
        ext,
        device: torch.device | str,
        add_down_bias: bool = True,
    ) -> None:
        self.layers = []
        self.biases = []
        self.label = "EXL3 MoE layer"
        for e, shards in enumerate(experts):
            missing = [sid for sid in MOE_SHARDS if sid not in shards]
            if missing:
                raise Exl3FormatError(f"local expert {e}: no EXL3 tensors for shard(s) {', '.join(missing)}")
            layers, biases = {}, {}
            for sid in MOE_SHARDS:
                spec, parts = shards[sid]
                layers[sid] = Exl3CudaShards([spec], [parts], expected_codebook, ext, device)
                bias = parts.get("bias")
                if sid == "w2" and not add_down_bias:
                    bias = None
                biases[sid] = None if bias is None else bias.to(device=device, dtype=torch.float32)
            hidden_in = layers["w1"].in_features
            if layers["w3"].in_features != hidden_in or layers["w2"].in_features != layers["w1"].shards[0]["out"]:
                raise Exl3FormatError(
                    f"{shards['w2'][0].name}: gate/up/down shapes of local expert {e} do not chain "
                    "(hidden -> intermediate -> hidden)"
                )
            self.layers.append(layers)
            self.biases.append(biases)
        self.hidden = self.layers[0]["w2"].shards[0]["out"] if self.layers else 0

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """One expert's output for rows `x` (fp16 in, float32 out, biases included)."""
        layers, biases = self.layers[e], self.biases[e]

        def project(sid, inp):
            y = layers[sid](inp).float()
            return y if biases[sid] is None else y + biases[sid]

        h = torch.nn.functional.silu(project("w1", x)) * project("w3", x)
        return project("w2", h.to(torch.float16))

    def __call__(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        expert_map: torch.Tensor | None = None,
        weight_on_input: bool = False,
    ) -> torch.Tensor:
        if capturing():
            raise Exl3FormatError(
                f"{self.label}: the per-expert EXL3 MoE loop reads expert counts on the host and cannot run inside "
                "a CUDA graph; serve with engine.enforce_eager: true"
            )
        tokens, top_k = topk_ids.shape
        ids = topk_ids.reshape(-1).long()
        if expert_map is not None:
            ids = expert_map[ids].long()  # global -> local, -1 = another rank's expert
        weights = topk_weights.reshape(-1).float()
        rows = torch.arange(tokens, device=x.device).repeat_interleave(top_k)
        local = ids >= 0
        ids, weights, rows = ids[local], weights[local], rows[local]
        order = torch.argsort(ids, stable=True)
        ids, weights, rows = ids[order], weights[order], rows[order]
        counts = torch.bincount(ids, minlength=len(self.layers)).tolist()
        out = torch.zeros(tokens, self.hidden, dtype=torch.float32, device=x.device)
        x16 = x.to(torch.float16)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            sel, w = rows[start : start + n], weights[start : start + n, None]
            start += n
            xe = x16[sel]
            if weight_on_input:
                y = self.expert(e, (xe.float() * w).to(torch.float16))
            else:
                y = self.expert(e, xe) * w
            out.index_add_(0, sel, y)
        return out.to(x.dtype)


def prepare_cuda_moe(
    experts, expected_codebook: str | None, ext, add_down_bias: bool, prefix: str, max_rows: int, top_k: int = 8
):
    """The layer's CUDA MoE: exllamav3's fused kernel (`Exl3FusedMoE`) over the loop's device tensors."""
    from .cuda_moe_fused import Exl3FusedMoE

    device = torch.device("cuda", torch.cuda.current_device())
    loop = Exl3CudaMoE(experts, expected_codebook, ext, device, add_down_bias)
    return Exl3FusedMoE(loop, ext, device, max_rows, prefix, top_k=top_k)
