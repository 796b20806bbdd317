"""DeepSeek V4.1's `wo_a` in EXL3: one EXL3 linear per output group, applied as a grouped projection.

The checkpoint stores `attn.wo_a` as `o_groups` separate EXL3 linears
(`wo_a.slice.{g}`, each [heads·head_dim/G → o_lora_rank] with its own
scales). `dsv41.reconcile` stacks the slices of a layer along a new first
axis (`<layer>.wo_a.<kind>` = [G, ...]); this method's loaders check every
group and keep this rank's groups (vLLM splits `wo_a` by output, i.e. by
group: rank r holds groups r·G/T .. (r+1)·G/T-1). The layer holds the packed
tensors only; `dsv41_hooks` routes vLLM's o-projection here (`grouped`):

* CPU: each group decoded per call by the reference decoder, then one bmm
  (the same product vLLM's bf16 o-projection computes on a dense `wo_a`).
* CUDA: `Exl3CudaShards` once per local group (the linear path: exllamav3's `exl3_gemm`, at decode sizes
  spark-kit's own GEMV; pretuned at the capture sizes: graph-safe).
"""

from __future__ import annotations

import torch

from ..backends import cpu, select
from ..format.errors import Exl3FormatError
from ..format.shards import PART_DTYPES, PART_KINDS, ShardSpec, check_part, decode_shard, shard_k
from . import common
from .linear import _linear_method_base


class Exl3GroupedMethod(_linear_method_base()):
    """EXL3 for vLLM's `wo_a` (a column-parallel layer split by output group); see the module docstring."""

    def __init__(self, config, prefix: str) -> None:
        self.config = config
        self.prefix = prefix
        self.backend = None

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs) -> None:
        layer.exl3_group_parts = {}
        layer.exl3_params_dtype = params_dtype
        layer.exl3_in = input_size
        layer.exl3_out = output_size
        # 0.34's dsv41_o_proj: a wo_a that needs the bf16 input never takes the fused fp8 kernel.
        layer.requires_unquantized_input = True
        for kind in PART_KINDS:
            param = torch.nn.Parameter(torch.empty(0, dtype=PART_DTYPES.get(kind, params_dtype)), requires_grad=False)
            param.weight_loader = self._loader(layer, kind)
            layer.register_parameter(kind, param)

    def _groups(self, layer, total: int) -> tuple[int, int, int]:
        """(first local group, local groups, o_lora_rank) for `total` checkpoint groups."""
        size, rank = getattr(layer, "tp_size", 1), getattr(layer, "tp_rank", 0)
        if total <= 0 or layer.exl3_out % total or total % size:
            raise Exl3FormatError(
                f"{self.prefix}.slice.*: {total} EXL3 slices cannot form vLLM's wo_a of {layer.exl3_out} outputs "
                f"at tensor-parallel size {size} (o_groups must divide both)"
            )
        per = total // size
        return rank * per, per, layer.exl3_out // total

    def _spec(self, layer, group: int, rank_out: int) -> ShardSpec:
        n_in = layer.exl3_in
        return ShardSpec(f"{self.prefix}.slice.{group}", n_in, rank_out, (0, n_in), (0, rank_out))

    def _loader(self, layer, kind: str):
        def load(param, loaded: torch.Tensor, *args, **kwargs) -> None:
            if kind in layer.exl3_group_parts:
                raise Exl3FormatError(f"{self.prefix}.{kind}: loaded twice (duplicate tensor in the checkpoint)")
            if loaded.dim() == 0:
                raise Exl3FormatError(f"{self.prefix}.{kind}: expected the stacked slices [o_groups, ...]")
            first, per, rank_out = self._groups(layer, loaded.shape[0])
            for g in range(loaded.shape[0]):
                check_part(self._spec(layer, g, rank_out), kind, loaded[g])
            layer.exl3_total_groups = loaded.shape[0]
            layer.exl3_group_parts[kind] = loaded[first : first + per].detach().to("cpu").clone()

        return load

    def process_weights_after_loading(self, layer) -> None:
        parts = layer.exl3_group_parts
        if "trellis" not in parts:
            raise Exl3FormatError(f"{self.prefix}.slice.0.trellis: missing from the checkpoint (wo_a has no EXL3 "
                                  "slices; is the model an EXL3 conversion of DeepSeek V4.1?)")
        first, per, rank_out = self._groups(layer, layer.exl3_total_groups)
        layer.exl3_groups = [(self._spec(layer, first + i, rank_out), {k: t[i] for k, t in parts.items()})
                             for i in range(per)]
        layer.exl3_rank_out = rank_out
        layer.exl3_k = [shard_k(p) for _, p in layer.exl3_groups]
        expected = self.config.codebook
        for kind in PART_KINDS:
            delattr(layer, kind)
        if common.backend() == select.CUDA:
            from ..backends.cuda_backend import Exl3CudaShards, wire_own

            device = torch.device("cuda", torch.cuda.current_device())
            ext = select.cuda_extension()
            layer.exl3_cuda_groups = [Exl3CudaShards([s], [p], expected, ext, device) for s, p in layer.exl3_groups]
            for shards in layer.exl3_cuda_groups:
                wire_own(shards)  # the own decode GEMV at decode sizes where the switch asks for it
                shards.pretune(common.engine_sizes()[0], device)
            self.backend = select.CUDA
        else:
            for spec, p in layer.exl3_groups:  # every group decodes (checked once here, decoded per call)
                decode_shard(spec, p, expected)
            for kind, tensor in parts.items():  # what vLLM holds: the packed tensors of the rank's groups
                layer.register_parameter(kind, torch.nn.Parameter(tensor, requires_grad=False))
            layer.exl3_groups = [(s, {k: getattr(layer, k)[i] for k in parts}) for i, (s, _) in
                                 enumerate(layer.exl3_groups)]
            self.backend = select.CPU
        del layer.exl3_group_parts
        self.config.note_loaded(self.prefix, self.backend, layer.exl3_k)

    def grouped(self, layer, x: torch.Tensor) -> torch.Tensor:
        """z [tokens, local groups, o_lora_rank] (bf16) of the inverse-rotated groups x [tokens, groups, in]."""
        common.first_use(self.prefix, self.backend or "unprocessed", x)
        groups = len(layer.exl3_groups)
        if x.dim() != 3 or x.shape[1] != groups:
            raise Exl3FormatError(f"{self.prefix}: grouped input {list(x.shape)} is not [tokens, {groups}, "
                                  f"{layer.exl3_in}] (this rank's wo_a groups)")
        cpu.check_width(self.prefix, x, layer.exl3_in)
        if self.backend == select.CPU:
            w = torch.stack([decode_shard(s, p, self.config.codebook).to(x.dtype) for s, p in layer.exl3_groups])
            z = torch.empty(x.shape[0], groups, layer.exl3_rank_out, dtype=torch.bfloat16, device=x.device)
            torch.bmm(x.transpose(0, 1), w.transpose(1, 2), out=z.transpose(0, 1))
            return z
        if self.backend == select.CUDA:
            from ..backends import serial

            z = torch.empty(x.shape[0], groups, layer.exl3_rank_out, dtype=torch.bfloat16, device=x.device)
            with serial.kernels(x.device):
                for g, shards in enumerate(layer.exl3_cuda_groups):
                    z[:, g].copy_(shards(x[:, g]))
            return z
        raise Exl3FormatError(f"{self.prefix}: EXL3 layer used before its weights were processed")

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise Exl3FormatError(
            f"{self.prefix}: an EXL3 wo_a is a grouped projection served through vLLM's o-projection "
            "(deep_gemm_fp8_o_proj, hooked by spark_overlay.exl3.vllm.dsv41_hooks), not as a plain linear"
        )
