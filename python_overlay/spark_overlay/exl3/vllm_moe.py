"""vLLM MoE method for EXL3 experts (one EXL3 linear per expert and projection, format doc §1.5).

Checkpoint names `<prefix>.<e>.{gate,up,down}_proj.{trellis,suh,svh,mul1|mcg}` reach the
layer through vLLM's expert mapping as `w13_<kind>` (gate = shard "w1", up =
"w3") and `w2_<kind>` (down), with the global expert id. Tensor parallelism:
gate/up are split on their output (trellis dim 1 with svh), down on its input
(trellis dim 0 with suh) -- `shards.ShardSpec` does both, keeping only whole
tiles when the split is on 128-multiples. Every tensor is checked at load
(dtype, shape from the model config, marker) and the error names it.

CPU back end: after loading, each local expert is decoded once into the
compute dtype as the stacked `w13_weight` [E, 2I, H] / `w2_weight` [E, H, I]
and vLLM's unquantized fused-MoE path runs on them (this class extends
`UnquantizedFusedMoEMethod` for that). CUDA: not implemented here -- the load
fails closed with a message (exllamav3's `exl3_moe` kernel would be the path).
"""

from __future__ import annotations

import logging
import os

import torch

from .errors import Exl3FormatError
from .shards import PART_DTYPES, PART_KINDS, ShardSpec, check_part, decode_shard, rank_part, shard_k

logger = logging.getLogger("vllm.spark_overlay.exl3")

# vLLM shard id -> (checkpoint projection attribute on the layer, parameter group)
SHARDS = {"w1": ("ckpt_gate_proj_name", "w13"), "w3": ("ckpt_up_proj_name", "w13"), "w2": ("ckpt_down_proj_name", "w2")}


def _base():
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    return UnquantizedFusedMoEMethod


class Exl3MoEMethod(_base()):
    """EXL3 routed experts; see the module docstring."""

    def __init__(self, moe, config, prefix: str) -> None:
        super().__init__(moe)
        self.config = config
        self.prefix = prefix
        self.supports_pre_processed_weights = False

    @property
    def supports_eplb(self) -> bool:
        return False

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                       **extra_weight_attrs):
        layer.exl3_moe_parts = {}
        layer.exl3_moe_sizes = (num_experts, hidden_size, intermediate_size_per_partition, params_dtype)
        for group in ("w13", "w2"):
            for kind in PART_KINDS:
                param = torch.nn.Parameter(torch.empty(0, dtype=PART_DTYPES.get(kind, params_dtype)),
                                           requires_grad=False)
                param.weight_loader = self._loader(layer, kind)
                layer.register_parameter(f"{group}_{kind}", param)

    def _spec(self, layer, shard_id: str, expert_id: int) -> ShardSpec:
        attr, _ = SHARDS[shard_id]
        name = f"{self.prefix}.{expert_id}.{getattr(layer, attr)}"
        moe = self.moe
        hidden = moe.hidden_dim_unpadded or moe.hidden_dim
        local = moe.intermediate_size_per_partition_unpadded or layer.exl3_moe_sizes[2]
        rank, size = moe.moe_parallel_config.tp_rank, moe.moe_parallel_config.tp_size
        full = local * size
        lo, hi = rank * local, (rank + 1) * local
        if shard_id == "w2":
            return ShardSpec(name, full, hidden, (lo, hi), (0, hidden))
        return ShardSpec(name, hidden, full, (0, hidden), (lo, hi))

    def _loader(self, layer, kind: str):
        def load(param, loaded_weight, weight_name=None, shard_id=None, expert_id=None, return_success=False,
                 **kwargs):
            if shard_id not in SHARDS or expert_id is None:
                raise Exl3FormatError(f"{self.prefix}: EXL3 expert tensor {weight_name} without a w1/w2/w3 shard "
                                      f"and expert id (got {shard_id!r}, {expert_id!r})")
            local = layer._map_global_expert_id_to_local_expert_id(expert_id)
            if local == -1:
                return False if return_success else None
            spec = self._spec(layer, shard_id, expert_id)
            check_part(spec, kind, loaded_weight)
            parts = layer.exl3_moe_parts.setdefault((local, shard_id), {"spec": spec})
            if kind in parts:
                raise Exl3FormatError(f"{spec.name}.{kind}: loaded twice (duplicate tensor in the checkpoint)")
            parts[kind] = rank_part(spec, kind, loaded_weight.detach().to("cpu")).clone()
            return True if return_success else None

        return load

    def process_weights_after_loading(self, layer) -> None:
        from vllm.platforms import current_platform

        num_experts, hidden, inter, dtype = layer.exl3_moe_sizes
        if current_platform.is_cuda():
            raise Exl3FormatError(
                f"{self.prefix}: EXL3 MoE experts on CUDA are not implemented by spark_overlay yet "
                "(exllamav3's exl3_moe kernel path); serve on the CPU back end"
            )
        for group in ("w13", "w2"):
            for kind in PART_KINDS:
                delattr(layer, f"{group}_{kind}")
        w13 = torch.empty(num_experts, 2 * inter, hidden, dtype=dtype)
        w2 = torch.empty(num_experts, hidden, inter, dtype=dtype)
        ks = []
        for e in range(num_experts):
            decoded = {}
            for shard_id in SHARDS:
                parts = layer.exl3_moe_parts.get((e, shard_id))
                if parts is None or "trellis" not in parts:
                    name = self._spec(layer, shard_id, e).name if parts is None else parts["spec"].name
                    raise Exl3FormatError(f"{name}.trellis: missing from the checkpoint (local expert {e})")
                spec = parts.pop("spec")
                decoded[shard_id] = decode_shard(spec, parts, self.config.codebook)
                ks.append(shard_k(parts))
            w13[e, :inter] = decoded["w1"].to(dtype)
            w13[e, inter:] = decoded["w3"].to(dtype)
            w2[e] = decoded["w2"].to(dtype)
        del layer.exl3_moe_parts
        layer.register_parameter("w13_weight", torch.nn.Parameter(w13, requires_grad=False))
        layer.register_parameter("w2_weight", torch.nn.Parameter(w2, requires_grad=False))
        super().process_weights_after_loading(layer)
        from spark_overlay.plugin import process_role

        logger.info(
            "exl3: %s ready on cpu (%d experts x gate/up/down, K %s), pid=%d (%s)",
            self.prefix, num_experts, "/".join(f"{k:g}" for k in sorted(set(ks))), os.getpid(),
            process_role() or "unknown role",
        )

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        from .vllm_linear import first_moe_use

        first_moe_use(self.prefix, "cpu moe", x)
        return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
