"""vLLM MoE method for EXL3 experts (one EXL3 linear per expert and projection, format doc §1.5).

Checkpoint names `<prefix>.<e>.{gate,up,down}_proj.{trellis,suh,svh,mul1|mcg}` reach the
layer through vLLM's expert mapping as `w13_<kind>` (gate = shard "w1", up =
"w3") and `w2_<kind>` (down), with the global expert id. Tensor parallelism:
gate/up are split on their output (trellis dim 1 with svh), down on its input
(trellis dim 0 with suh) -- `shards.ShardSpec` does both, keeping only whole
tiles when the split is on 128-multiples. Every tensor is checked at load
(dtype, shape from the model config, marker) and the error names it.

Biases (`.bias`, fp16 padded to 128, exllamav3 writes one where the source
expert has one): gate/up keep the rank's slice, down the whole vector on rank
0 only (zero elsewhere), so the tensor-parallel sum adds it once.

CPU back end: after loading, each local expert is decoded once into the
compute dtype as the stacked `w13_weight` [E, 2I, H] / `w2_weight` [E, H, I]
(and `w13_bias` / `w2_bias`) and vLLM's unquantized fused-MoE path runs on them
(this class extends `UnquantizedFusedMoEMethod` for that). CUDA back end:
`cuda_moe_fused.Exl3FusedMoE`, exllamav3's fused `exl3_moe` kernel scheduled on
the device (graph-safe), over the per-expert `exl3_gemm` loop
(`cuda_backend.Exl3CudaMoE`) that stays as the fallback for layers the kernel
cannot take (SiLU-and-mul only); no extension -> the load fails with the
install hint.
"""

from __future__ import annotations

import logging
import os

import torch

from ..format.errors import Exl3FormatError
from ..format.shards import PART_DTYPES, PART_KINDS, ShardSpec, check_part, rank_part, shard_k
from ..backends import cpu, select
from . import common

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
        self.backend = None

    @property
    def supports_eplb(self) -> bool:
        return False

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                       **extra_weight_attrs):
        layer.exl3_moe_parts = {}
        layer.exl3_moe_sizes = (num_experts, hidden_size, intermediate_size_per_partition, params_dtype)
        for group in ("w13", "w2"):
            for kind in (*PART_KINDS, "bias"):
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

    def _local_experts(self, layer) -> list[dict]:
        """Per local expert: shard id -> (spec, parts), every shard checked present."""
        num_experts = layer.exl3_moe_sizes[0]
        experts = []
        for e in range(num_experts):
            shards = {}
            for shard_id in SHARDS:
                parts = layer.exl3_moe_parts.get((e, shard_id))
                if parts is None or "trellis" not in parts:
                    name = self._spec(layer, shard_id, e).name if parts is None else parts["spec"].name
                    raise Exl3FormatError(f"{name}.trellis: missing from the checkpoint (local expert {e})")
                parts = dict(parts)
                shards[shard_id] = (parts.pop("spec"), parts)
            experts.append(shards)
        return experts

    def _check_biases(self, experts: list[dict]) -> bool:
        """True when the experts carry biases; all or none must, and vLLM's layer must take them."""
        with_bias = [shards[sid][0].name for shards in experts for sid in SHARDS if "bias" in shards[sid][1]]
        if not with_bias:
            if self.moe.has_bias and experts:
                raise Exl3FormatError(
                    f"{experts[0]['w1'][0].name}.bias: missing from the checkpoint, but vLLM's MoE layer "
                    f"{self.prefix} takes expert biases (the model config and the EXL3 conversion disagree)"
                )
            return False
        without = [shards[sid][0].name for shards in experts for sid in SHARDS if "bias" not in shards[sid][1]]
        if without:
            raise Exl3FormatError(
                f"{without[0]}.bias: missing from the checkpoint while {with_bias[0]}.bias exists "
                "(every expert projection must have a bias or none)"
            )
        if not self.moe.has_bias:
            raise Exl3FormatError(
                f"{with_bias[0]}.bias: the checkpoint has expert biases but vLLM's MoE layer {self.prefix} "
                "takes none (the model config and the EXL3 conversion disagree)"
            )
        return True

    def process_weights_after_loading(self, layer) -> None:
        num_experts, hidden, inter, dtype = layer.exl3_moe_sizes
        for group in ("w13", "w2"):
            for kind in (*PART_KINDS, "bias"):
                delattr(layer, f"{group}_{kind}")
        experts = self._local_experts(layer)
        has_bias = self._check_biases(experts)
        tp_rank = self.moe.moe_parallel_config.tp_rank
        ks = [shard_k(shards[sid][1]) for shards in experts for sid in SHARDS]
        if common.backend() == select.CUDA:
            self._process_cuda(layer, experts, tp_rank, ks)
            return
        dense = cpu.dense_experts(experts, self.config.codebook, dtype, hidden, inter, has_bias, tp_rank == 0)
        del layer.exl3_moe_parts
        for name, tensor in dense.items():
            layer.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=False))
        super().process_weights_after_loading(layer)
        self.backend = select.CPU
        self._log_ready(num_experts, ks)

    def _process_cuda(self, layer, experts: list[dict], tp_rank: int, ks: list[float]) -> None:
        from ..backends.cuda_backend import prepare_cuda_moe

        activation = str(getattr(getattr(layer, "activation", None), "value", getattr(layer, "activation", "silu")))
        if activation != "silu":
            raise Exl3FormatError(
                f"{self.prefix}: EXL3 experts on CUDA support the SiLU-and-mul activation only, not {activation!r}"
            )
        max_rows = common.engine_sizes()[1]
        layer.exl3_cuda_moe = prepare_cuda_moe(
            experts, self.config.codebook, select.cuda_extension(), tp_rank == 0, self.prefix, max_rows,
            int(getattr(self.moe, "experts_per_token", 0) or getattr(layer, "top_k", 8)),
        )
        del layer.exl3_moe_parts
        fused = layer.exl3_cuda_moe
        self.backend = "cuda per-expert loop" if fused.fallback else "cuda fused exl3_moe"
        self._log_ready(len(experts), ks)
        if not fused.fallback:
            logger.info("exl3: %s fused MoE: %d kernel launch set(s), rows up to %d, temp buffers %.1f MiB (shared)",
                        self.prefix, len(fused.groups), fused.max_rows, fused.buffer_bytes / 2**20)

    def _log_ready(self, num_experts: int, ks: list[float]) -> None:
        from spark_overlay.plugin import process_role

        logger.info(
            "exl3: %s ready on %s (%d experts x gate/up/down, K %s), pid=%d (%s)",
            self.prefix, self.backend, num_experts, "/".join(f"{k:g}" for k in sorted(set(ks))), os.getpid(),
            process_role() or "unknown role",
        )

    @property
    def is_monolithic(self) -> bool:
        """Never: vLLM's runner then calls `apply` (routing done by vLLM), which is what this method implements.

        vLLM's base class derives it from the backend its oracle picked
        (`fused_moe_method_base.py` ~L137); a monolithic backend would call
        `apply_monolithic`, which EXL3 experts do not have.
        """
        return False

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        common.first_moe_use(self.prefix, f"{self.backend} moe", x)
        if self.backend is not None:
            cpu.check_width(self.prefix, x, layer.exl3_moe_sizes[1])
        if (self.backend or "").startswith("cuda"):
            from ..backends.cuda_backend import cuda_moe

            if shared_experts is not None:
                from vllm.model_executor.layers.fused_moe.runner.shared_experts import SharedExpertsOrder

                shared_experts(shared_experts_input, SharedExpertsOrder.MK_INTERNAL_OVERLAPPED)
            return cuda_moe(
                layer, x, topk_weights, topk_ids, getattr(layer, "expert_map", None),
                bool(getattr(layer, "apply_router_weight_on_input", False)),
            )
        return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
