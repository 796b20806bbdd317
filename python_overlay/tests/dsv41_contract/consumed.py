"""Which checkpoint tensors a vLLM model's loaders consumed, and which of its parameters got none.

`Tracker(model)` wraps every parameter's weight loader (vLLM's default loader for the ones without
one) to record the storage of each tensor it is handed; `watch(stream)` records the storage of each
checkpoint tensor by name. A tensor the overlay decoded at load carries the names it was made from
(`_spark_sources`, set by spark_overlay.exl3.vllm.dsv41.reconcile), so its parts count as consumed.
"""

from __future__ import annotations

import torch

# Parameter leaves an EXL3 layer registers for every tensor kind the format allows; a checkpoint
# carries only some (mul1 here, no legacy su/sv, no mcg, no dense weight, no bias).
EXL3_PLACEHOLDERS = ("mcg", "mul1", "su", "sv", "suh", "svh", "trellis", "weight", "bias")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Tracker:
    def __init__(self, model: torch.nn.Module) -> None:
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        self.by_storage: dict[int, str] = {}
        self.seen: set[int] = set()
        self.sources: set[str] = set()
        self.loaded_params: set[str] = set()
        self.model = model
        for name, param in model.named_parameters():
            inner = getattr(param, "weight_loader", default_weight_loader)
            param.weight_loader = self._wrap(name, inner)

    def _wrap(self, name: str, inner):
        def loader(param, loaded, *args, **kwargs):
            self.seen.add(_storage(loaded))
            self.sources.update(getattr(loaded, "_spark_sources", ()))
            self.loaded_params.add(name)
            return inner(param, loaded, *args, **kwargs)

        return loader

    def _copied_directly(self, names: set[str], path, param_name) -> set[str]:
        """Names vLLM copies into a parameter without a loader (`attn_sink`: nvidia/model.py ~L1340, the
        rank's heads into a padded parameter): consumed when the parameter starts with a slice of it."""
        from safetensors import safe_open
        from vllm.distributed import get_tensor_model_parallel_world_size

        tp = get_tensor_model_parallel_world_size()
        params = dict(self.model.named_parameters())
        found = set()
        with safe_open(str(path), "pt") as f:
            for name in names:
                param = params.get(param_name(name))
                if param is None or param.is_meta or not name.endswith("attn_sink"):
                    continue
                full = f.get_tensor(name).to(param.dtype)
                n = full.shape[0] // tp  # this rank's heads; the parameter is padded past them (-inf)
                if any(torch.equal(param.data[:n], full[s : s + n]) for s in range(0, full.shape[0], n)):
                    found.add(name)
                    self.loaded_params.add(param_name(name))
        return found

    def watch(self, stream):
        for name, tensor in stream:
            self.by_storage[_storage(tensor)] = name
            yield name, tensor

    def report(self, names: list[str], path, param_name=lambda n: f"language_model.model.{n}",
               aliased: tuple[str, ...] = ()) -> dict:
        """`param_name` maps a checkpoint name to vLLM's parameter (for the copied-directly check);
        `aliased` parameters are shared with another model (the draft's embedding and head)."""
        consumed = {n for ptr, n in self.by_storage.items() if ptr in self.seen} | self.sources
        consumed |= self._copied_directly(set(names) - consumed, path, param_name)
        exl3_layers = {
            n for n, m in self.model.named_modules()
            if type(getattr(m, "quant_method", None)).__name__.startswith("Exl3")
        }
        never = []
        for name, param in self.model.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if name in self.loaded_params or param.is_meta or name in aliased:
                continue
            if owner in exl3_layers and (leaf in EXL3_PLACEHOLDERS or leaf.split("_", 1)[-1] in EXL3_PLACEHOLDERS):
                continue  # a tensor kind this checkpoint does not use (process_weights_after_loading drops it)
            if owner.endswith("engram.embed_tokens"):
                continue  # the file-backed Engram table's 0-row dummies: rows stay on disk
            never.append(name)
        return {
            "names": len(names),
            "not_consumed": sorted(set(names) - consumed),
            "never_loaded": sorted(never),
        }
