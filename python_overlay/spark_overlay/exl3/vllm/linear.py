"""vLLM linear method for EXL3 checkpoints (column, row, merged, QKV parallel layers and the LM head).

Loading: every EXL3 tensor kind of a linear (trellis, suh, svh, marker, legacy
su/sv) is a placeholder parameter whose `weight_loader` checks the incoming
checkpoint tensor against the layer (dtype, shape from the model config,
marker value; errors name the tensor) and keeps the rank's part
(`shards.rank_part`). vLLM's fused layers receive their sub-linears with a
shard id: "q"/"k"/"v" for QKVParallelLinear, 0/1/... for
MergedColumnParallelLinear (q_proj -> qkv_proj "q", gate_proj -> gate_up_proj 0),
so one fused layer collects several EXL3 linears, each with its own K and
scales, and concatenates them along the output dimension.

After loading, every shard must be complete (a missing suh / svh / trellis
fails naming it). Back ends:

* CPU: each shard is decoded once into the compute dtype and the layer runs
  vLLM's own unquantized GEMM on it (bit-identical to serving the decoded
  weights as a dense model). The LM head (the largest linear) stays packed
  on the CPU too: its shard is decoded per call.
* CUDA: exllamav3's extension (`exllamav3_ext`) must be importable; the layer
  keeps its trellis tiles on the GPU and runs `exl3_gemm`. Without the
  extension the load fails with the install hint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format.errors import Exl3FormatError
from ..format.shards import PART_DTYPES, PART_KINDS, ShardSpec, check_part, rank_bias, rank_part, shard_k
from ..backends import cpu, select
from . import common

QKV_SHARDS = {"q": 0, "k": 1, "v": 2}


@dataclass(frozen=True)
class OutputShard:
    """One checkpoint linear inside a (possibly fused) vLLM layer, for this rank."""

    key: object  # vLLM shard id: None, "q"/"k"/"v", or an int
    spec: ShardSpec
    # Rows of the layer's local weight this shard fills, and any zero rows
    # after it (the LM head pads the vocabulary per rank).
    local_out: int
    pad_rows: int = 0


def _checkpoint_name(prefix: str, key: object, packed_modules_mapping: dict[str, list[str]]) -> str:
    """The checkpoint prefix of shard `key` of the vLLM layer `prefix` (q_proj for qkv_proj "q")."""
    if key is None:
        return prefix
    parent, _, leaf = prefix.rpartition(".")
    index = QKV_SHARDS[key] if isinstance(key, str) else key
    names = packed_modules_mapping.get(leaf)
    if names is None or not isinstance(index, int) or index >= len(names):
        return f"{prefix}[shard {key}]"
    return f"{parent}.{names[index]}" if parent else names[index]


def output_shards(layer: torch.nn.Module, prefix: str, packed: dict[str, list[str]]) -> list[OutputShard]:
    """This rank's shards of a vLLM linear layer, in the order of its output rows."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    kind = type(layer)
    if kind is ParallelLMHead:
        idx = layer.shard_indices
        lo, hi = idx.org_vocab_start_index, idx.org_vocab_end_index
        spec = ShardSpec(prefix, layer.embedding_dim, layer.org_vocab_size, (0, layer.embedding_dim), (lo, hi))
        return [OutputShard(None, spec, hi - lo, layer.num_embeddings_per_partition - (hi - lo))]
    rank, size = layer.tp_rank, layer.tp_size
    full_in = layer.input_size
    if kind is RowParallelLinear:
        per = layer.input_size_per_partition
        spec = ShardSpec(prefix, full_in, layer.output_size, (rank * per, (rank + 1) * per), (0, layer.output_size))
        return [OutputShard(None, spec, layer.output_size)]
    if kind is ReplicatedLinear:
        spec = ShardSpec(prefix, full_in, layer.output_size, (0, full_in), (0, layer.output_size))
        return [OutputShard(None, spec, layer.output_size)]
    if kind is QKVParallelLinear:
        sizes = {
            "q": (layer.total_num_heads * layer.head_size, layer.num_heads * layer.head_size, rank),
            "k": (
                layer.total_num_kv_heads * layer.head_size,
                layer.num_kv_heads * layer.head_size,
                rank // layer.num_kv_head_replicas,
            ),
            "v": (
                layer.total_num_kv_heads * layer.v_head_size,
                layer.num_kv_heads * layer.v_head_size,
                rank // layer.num_kv_head_replicas,
            ),
        }
        out = []
        for key, (full, local, index) in sizes.items():
            name = _checkpoint_name(prefix, key, packed)
            spec = ShardSpec(name, full_in, full, (0, full_in), (index * local, (index + 1) * local))
            out.append(OutputShard(key, spec, local))
        return out
    if kind is MergedColumnParallelLinear:
        out = []
        for key, full in enumerate(layer.output_sizes):
            local = full // size
            name = _checkpoint_name(prefix, key, packed)
            spec = ShardSpec(name, full_in, full, (0, full_in), (rank * local, (rank + 1) * local))
            out.append(OutputShard(key, spec, local))
        return out
    if kind is ColumnParallelLinear:
        local = layer.output_size_per_partition
        spec = ShardSpec(prefix, full_in, layer.output_size, (0, full_in), (rank * local, (rank + 1) * local))
        return [OutputShard(None, spec, local)]
    raise Exl3FormatError(f"{prefix}: layer type {kind.__name__} is not supported by the EXL3 linear method")


def bias_slot(shards: list[OutputShard], key: object, bias: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Where the checked checkpoint bias of shard `key` goes in the layer's local bias, and its part.

    Returns (offset, values): the rows of the layer's output this shard fills
    start at `offset` (shards are laid out in order, each followed by its pad
    rows); `values` is the rank's slice (`shards.rank_bias`).
    """
    offset = 0
    for shard in shards:
        if shard.key == key:
            check_part(shard.spec, "bias", bias)
            return offset, rank_bias(shard.spec, bias)
        offset += shard.local_out + shard.pad_rows
    keys = ", ".join(repr(s.key) for s in shards)
    raise Exl3FormatError(f"bias for shard id {key!r} does not name one of this layer's EXL3 linears ({keys})")


def supported_layer(layer: torch.nn.Module) -> bool:
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    return type(layer) in (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
        ParallelLMHead,
    )


def _linear_method_base():
    from vllm.model_executor.layers.linear import LinearMethodBase

    return LinearMethodBase


class Exl3LinearMethod(_linear_method_base()):
    """EXL3 for one vLLM linear layer (or the LM head); see the module docstring."""

    def __init__(self, config, prefix: str) -> None:
        self.config = config
        self.prefix = prefix
        self._dense = None
        self.backend = None

    # -- loading ---------------------------------------------------------------------------

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        layer.exl3_parts = {}
        layer.exl3_biases = set()
        # vLLM creates the layer's own `bias` parameter after this call, with
        # `self.weight_loader` as its loader: shadow that method so EXL3 biases
        # (fp16, padded to 128) are checked and placed per shard here.
        layer.weight_loader = self._bias_loader(layer, layer.weight_loader)
        layer.exl3_params_dtype = params_dtype
        layer.exl3_output_partition_sizes = list(output_partition_sizes)
        layer.exl3_input_size_per_partition = input_size_per_partition
        for kind in PART_KINDS:
            dtype = PART_DTYPES.get(kind, params_dtype)
            param = torch.nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
            param.weight_loader = self._loader(layer, kind)
            layer.register_parameter(kind, param)

    def _shards(self, layer: torch.nn.Module) -> list[OutputShard]:
        shards = getattr(layer, "exl3_shards", None)
        if shards is None:
            shards = output_shards(layer, self.prefix, self.config.packed_modules_mapping)
            local = sum(s.local_out + s.pad_rows for s in shards)
            if local != sum(layer.exl3_output_partition_sizes):
                raise Exl3FormatError(
                    f"{self.prefix}: EXL3 shards give {local} output rows, vLLM expects "
                    f"{sum(layer.exl3_output_partition_sizes)}"
                )
            layer.exl3_shards = shards
        return shards

    def _bias_loader(self, layer: torch.nn.Module, fallback):
        def load(param: torch.nn.Parameter, loaded: torch.Tensor, *args, **kwargs):
            if param is not layer._parameters.get("bias"):
                return fallback(param, loaded, *args, **kwargs)
            shard_id = args[0] if args else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
            if shard_id is None:
                shard_id = getattr(loaded, "shard_id", None)
            shards = self._shards(layer)
            match = [s for s in shards if s.key == shard_id]
            name = f"{match[0].spec.name}.bias" if len(match) == 1 else f"{self.prefix}.bias"
            try:
                offset, values = bias_slot(shards, shard_id, loaded.detach().to("cpu"))
            except Exl3FormatError as err:
                raise Exl3FormatError(f"{name}: {err}" if not str(err).startswith(name) else str(err)) from None
            if shard_id in layer.exl3_biases:
                raise Exl3FormatError(f"{name}: loaded twice (duplicate tensor in the checkpoint)")
            layer.exl3_biases.add(shard_id)
            param.data[offset : offset + values.shape[0]].copy_(values.to(param.dtype))
            return None

        return load

    def _loader(self, layer: torch.nn.Module, kind: str):
        def load(param: torch.nn.Parameter, loaded: torch.Tensor, shard_id=None, *args, **kwargs) -> None:
            if shard_id is None:
                shard_id = getattr(loaded, "shard_id", None)
            shards = self._shards(layer)
            match = [s for s in shards if s.key == shard_id]
            if len(match) != 1:
                keys = ", ".join(repr(s.key) for s in shards)
                raise Exl3FormatError(
                    f"{self.prefix}.{kind}: shard id {shard_id!r} does not name one of this layer's EXL3 "
                    f"linears ({keys}); EXL3 checkpoints store every linear separately (no fused q/k/v "
                    "or gate/up on disk)"
                )
            shard = match[0]
            check_part(shard.spec, kind, loaded)
            parts = layer.exl3_parts.setdefault(shard.key, {})
            name = f"{shard.spec.name}.{kind}"
            if kind in parts:
                raise Exl3FormatError(f"{name}: loaded twice (duplicate tensor in the checkpoint)")
            parts[kind] = rank_part(shard.spec, kind, loaded.detach().to("cpu")).clone()

        return load

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        shards = self._shards(layer)
        expected = self.config.codebook
        for shard in shards:
            parts = layer.exl3_parts.get(shard.key, {})
            if "trellis" not in parts:
                raise Exl3FormatError(
                    f"{shard.spec.name}.trellis: missing from the checkpoint (no EXL3 tensors for this "
                    "linear; is the model an EXL3 conversion of this architecture?)"
                )
        if getattr(layer, "bias", None) is not None:
            missing = [s.spec.name for s in shards if s.key not in layer.exl3_biases]
            if missing:
                raise Exl3FormatError(
                    f"{missing[0]}.bias: missing from the checkpoint, but the model's layer {self.prefix} has a "
                    "bias (the EXL3 conversion and the model config disagree)"
                )
            offset = 0
            for shard in shards:  # padded vocabulary rows of the LM head get a zero bias
                offset += shard.local_out
                layer.bias.data[offset : offset + shard.pad_rows] = 0
                offset += shard.pad_rows
        for kind in PART_KINDS:
            if hasattr(layer, kind):
                delattr(layer, kind)
        layer.exl3_k = [shard_k(layer.exl3_parts[s.key]) for s in shards]
        if common.backend() == select.CUDA:
            self._process_cuda(layer, shards, expected)
        else:
            self._process_cpu(layer, shards, expected)
        del layer.exl3_parts
        self.config.note_loaded(self.prefix, self.backend, layer.exl3_k)

    def _process_cpu(self, layer: torch.nn.Module, shards: list[OutputShard], expected: str | None) -> None:
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            UnquantizedEmbeddingMethod,
        )

        parts = [(s.spec, layer.exl3_parts[s.key], s.pad_rows) for s in shards]
        weight = cpu.dense_linear(parts, expected, layer.exl3_params_dtype)
        if type(layer) is ParallelLMHead:  # kept packed: what vLLM holds are the EXL3 tensors
            self._check_shape(layer, weight)
            (spec, held, pad), = parts
            for kind, tensor in held.items():
                layer.register_parameter(kind, torch.nn.Parameter(tensor, requires_grad=False))
            layer.exl3_packed = (spec, tuple(held), pad)
            self.backend = select.CPU
            return
        self._check_shape(layer, weight)
        layer.register_parameter("weight", torch.nn.Parameter(weight, requires_grad=False))
        self._dense = UnquantizedEmbeddingMethod() if type(layer) is ParallelLMHead else UnquantizedLinearMethod()
        self._dense.process_weights_after_loading(layer)
        self.backend = select.CPU

    def _check_shape(self, layer: torch.nn.Module, weight: torch.Tensor) -> None:
        want = (sum(layer.exl3_output_partition_sizes), layer.exl3_input_size_per_partition)
        if tuple(weight.shape) != want:
            raise Exl3FormatError(f"{self.prefix}: decoded weight {list(weight.shape)} != vLLM's {list(want)}")

    def _packed_weight(self, layer: torch.nn.Module) -> torch.Tensor:
        """The CPU LM head's weight, decoded from its packed parameters for this call."""
        spec, kinds, pad = layer.exl3_packed
        parts = {kind: getattr(layer, kind) for kind in kinds}
        return cpu.dense_linear([(spec, parts, pad)], self.config.codebook, layer.exl3_params_dtype)

    def _process_cuda(self, layer: torch.nn.Module, shards: list[OutputShard], expected: str | None) -> None:
        from ..backends.cuda_backend import prepare_cuda_layer

        prepare_cuda_layer(layer, shards, expected, select.cuda_extension(), common.engine_sizes()[0])
        self.backend = select.CUDA

    # -- compute -----------------------------------------------------------------------------

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        common.first_use(self.prefix, self.backend or "unprocessed", x)
        if self.backend is not None:
            cpu.check_width(self.prefix, x, layer.exl3_input_size_per_partition)
        if self.backend == select.CPU and self._dense is None:
            return torch.nn.functional.linear(x, self._packed_weight(layer), bias)
        if self.backend == select.CPU:
            return self._dense.apply(layer, x, bias)
        if self.backend == select.CUDA:
            from ..backends.cuda_backend import cuda_linear

            return cuda_linear(layer, x, bias)
        raise Exl3FormatError(f"{self.prefix}: EXL3 layer used before its weights were processed")

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        raise Exl3FormatError(f"{self.prefix}: an EXL3 layer cannot be used as a token embedding")

