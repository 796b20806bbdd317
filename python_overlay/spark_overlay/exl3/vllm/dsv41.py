"""DeepSeek V4.1 in released vLLM: the EXL3 classes vLLM builds without a quantization method.

vLLM's `DeepseekV41ForCausalLM` (0.32.0-0.34.0) builds `lm_head`, the indexer's
`wk` and the compressor's `fused_wkv_wgate` with `quant_config=None`, and its
CUDA o-projection reads `wo_a.weight` directly (bf16 for a bmm, or fp8 with a
scale). The EXL3 checkpoint packs all four (`head` at K=6, `attn.indexer.wk`,
`attn.compressor.wkv/wgate`, `attn.wo_a.slice.0..G-1`). The overlay decodes
them to dense weights at load (docs/exl3-overlay.md has the cost per rank):

* `wrap_load_weights` wraps the model's `load_weights`: the EXL3 tensors of
  those classes are held back from the stream, checked (`format.load_linear`),
  decoded (`full_weight`, the reference decoder) into the model's dtype and
  handed to vLLM as `<prefix>.weight`; the `wo_a` slices of a layer are
  stacked in group order into one `<layer>.attn.wo_a.weight`
  [G·R, heads·head_dim/G]. vLLM's own loaders then place them (vocab /
  group sharding) as for a dense checkpoint.
* `dense_layer(prefix)`: `Exl3Config` gives `wo_a` vLLM's unquantized method,
  so its dense weight is what the o-projection reads.
* Every other EXL3 tensor passes through; one that reaches a layer without an
  EXL3 method fails the load naming vLLM's parameter (never a silent dense
  fallback).

The classes are patched when vLLM imports their modules (`after_import`);
registration checks the release's source first and fails closed, naming the
vLLM version, when a class or its `load_weights(self, weights)` differs.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Iterator

import torch

from spark_overlay import source
from spark_overlay.after_import import after_import

from ..format.errors import Exl3FormatError
from ..format.linear import full_weight, load_linear

# (module, class, the checkpoint names it loads: None = all, else this prefix)
TARGETS = (
    ("vllm.models.deepseek_v41.nvidia.vl_model", "DeepseekV41ForCausalLM", None),
    ("vllm.models.deepseek_v41.nvidia.dspark", "DSparkDeepseekV4ForCausalLM", "mtp."),
)
LOAD_WEIGHTS = (("self", source.MISSING), ("weights", source.MISSING))
# EXL3 tensor kinds (format doc §1.4) of a decoded-at-load linear.
KINDS = ("trellis", "suh", "svh", "su", "sv", "mcg", "mul1")
_BLOCK = r"(?:layers|mtp)\.\d+"
DENSE = re.compile(rf"^(head|{_BLOCK}\.attn\.indexer\.wk|{_BLOCK}\.attn\.compressor\.(?:wkv|wgate))$")
WO_A = re.compile(rf"^({_BLOCK}\.attn\.wo_a)\.slice\.(\d+)$")
DENSE_LAYER = re.compile(r"\.attn\.wo_a$")


def dense_layer(prefix: str) -> bool:
    """Whether the vLLM layer at `prefix` is served dense (its EXL3 tensors are decoded at load)."""
    return bool(DENSE_LAYER.search(prefix))


def _shape(config, prefix: str) -> tuple[int, int]:
    """(in, out) of a decoded-at-load checkpoint linear, from the model's text config."""
    c = getattr(config, "text_config", config)
    leaf = prefix.rsplit(".", 1)[-1]
    if prefix == "head":
        return c.hidden_size, c.vocab_size
    if prefix.endswith("indexer.wk"):
        return c.head_dim, c.index_head_dim
    if leaf in ("wkv", "wgate"):
        return c.hidden_size, c.head_dim
    if leaf == "wo_a":
        return c.num_attention_heads * c.head_dim // c.o_groups, c.o_lora_rank
    raise Exl3FormatError(f"{prefix}: not a class the overlay decodes at load")


def _decode(parts: dict[str, torch.Tensor], prefix: str, shape: tuple[int, int], dtype) -> torch.Tensor:
    """The nn.Linear weight [out, in] of one EXL3 linear, checked against the model's shape."""
    lin = load_linear(parts, prefix)
    n_in, n_out = shape
    if not (0 < n_in <= lin.padded_in < n_in + 128 and 0 < n_out <= lin.padded_out < n_out + 128):
        raise Exl3FormatError(
            f"{prefix}.trellis: a {lin.padded_in}x{lin.padded_out} matrix, the model config asks for "
            f"{n_in}x{n_out} (padded to 128)"
        )
    w = full_weight(lin.trellis, lin.suh, lin.svh, lin.codebook, prefix)[:n_in, :n_out]
    return w.t().contiguous().to(dtype)


def reconcile(
    weights: Iterable[tuple[str, torch.Tensor]],
    config,
    dtype: torch.dtype,
    scope: str | None = None,
    passed: set[str] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint stream with the decoded-at-load classes replaced by dense `<prefix>.weight` tensors.

    Names outside `scope` (a prefix; None = all) pass through untouched. The
    dense tensors follow the rest of the stream (their parts may arrive in
    any order). EXL3 tensors handed on to vLLM are added to `passed`.
    """
    held: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        prefix, _, kind = name.rpartition(".")
        if kind in KINDS and (scope is None or name.startswith(scope)) and (DENSE.match(prefix) or WO_A.match(prefix)):
            held.setdefault(prefix, {})[name] = tensor
            continue
        if kind in KINDS and passed is not None:
            passed.add(name)
        yield name, tensor
    slices: dict[str, dict[int, torch.Tensor]] = {}
    sources: dict[str, list[str]] = {}
    for prefix, parts in sorted(held.items()):
        wo_a = WO_A.match(prefix)
        if wo_a is None:
            yield f"{prefix}.weight", _sourced(_decode(parts, prefix, _shape(config, prefix), dtype), parts)
            continue
        layer, group = wo_a.group(1), int(wo_a.group(2))
        slices.setdefault(layer, {})[group] = _decode(parts, prefix, _shape(config, layer), dtype)
        sources.setdefault(layer, []).extend(parts)
    groups = getattr(getattr(config, "text_config", config), "o_groups", 0)
    for layer, got in sorted(slices.items()):
        missing = [g for g in range(groups) if g not in got]
        extra = [g for g in got if not 0 <= g < groups]
        if missing or extra:
            bad = missing[0] if missing else extra[0]
            raise Exl3FormatError(
                f"{layer}.slice.{bad}.trellis: {'missing' if missing else 'not a group'}; the checkpoint stores "
                f"wo_a as o_groups={groups} slices {layer}.slice.0..{groups - 1}"
            )
        yield f"{layer}.weight", _sourced(torch.cat([got[g] for g in range(groups)], 0), sources[layer])


def _sourced(tensor: torch.Tensor, names) -> torch.Tensor:
    """Record the checkpoint tensors a decoded weight was made from (the contract test counts them consumed)."""
    tensor._spark_sources = tuple(names)
    return tensor


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype dense weights load in: that of the model's (unquantized) LM head, else bf16."""
    for name, module in model.named_modules():
        if name.endswith("lm_head") and isinstance(getattr(module, "weight", None), torch.Tensor):
            return module.weight.dtype
    return torch.bfloat16


def wrap_load_weights(cls, scope: str | None) -> None:
    """Patch `cls.load_weights` to reconcile the stream first and name an EXL3 tensor vLLM cannot place."""
    if getattr(cls, "_spark_exl3_reconciled", False):
        return
    original = cls.load_weights

    def load_weights(self, weights):
        passed: set[str] = set()
        stream = reconcile(weights, self.config, _model_dtype(self), scope, passed)
        try:
            return original(self, stream)
        except (KeyError, ValueError) as err:
            culprit = _culprit(str(err), passed)
            if culprit is None:
                raise
            raise Exl3FormatError(
                f"{culprit}: an EXL3 tensor reached a vLLM layer with no EXL3 method ({type(err).__name__}: "
                f"{err}); vLLM {_version()}'s {cls.__name__} builds that layer without a quantization method "
                "and the overlay does not decode its class at load (docs/exl3-overlay.md lists the classes it does)"
            ) from err

    load_weights.__wrapped__ = original
    cls.load_weights = load_weights
    cls._spark_exl3_reconciled = True


def _culprit(message: str, passed: set[str]) -> str | None:
    """The EXL3 tensor a vLLM load error is about: named in it, or whose layer it names."""
    for name in sorted(passed):
        if name in message:
            return name
    for name in sorted(passed):
        prefix = name.rpartition(".")[0]
        if f"'{prefix}'" in message or f"'{prefix.rsplit('.', 1)[-1]}'" in message:
            return name
    return next((w.strip("'\"") for w in message.split() if w.strip("'\"").endswith(tuple(f".{k}" for k in KINDS))),
                None)


def _version() -> str:
    from spark_overlay.plugin import installed_vllm_version

    return installed_vllm_version()


def _check(found, module: str, cls: str, version: str) -> None:
    if found is None:
        raise Exl3FormatError(
            f"vLLM {version}: {module} has no {cls}.load_weights, which the EXL3 overlay wraps to decode "
            "the classes vLLM builds without a quantization method; refusing to load an EXL3 DeepSeek V4.1 "
            "with it. Use a vLLM the overlay supports (spark_overlay.plugin.SUPPORTED_VLLM_VERSIONS)"
        )
    if tuple(found) != LOAD_WEIGHTS:
        raise Exl3FormatError(
            f"vLLM {version}: {module}.{cls}.load_weights{[n for n, _ in found]} differs from "
            "load_weights(self, weights), which the EXL3 overlay wraps; use a vLLM the overlay supports"
        )


def register(version: str) -> list[str]:
    """Check every target's source now; patch each class when vLLM imports it. Returns the modules found."""
    found = []
    for module, cls, scope in TARGETS:
        path = source.module_file(module)
        if path is None:
            continue  # a vLLM without DeepSeek V4.1 (or without its draft model)
        methods = source.class_methods(path, cls)
        _check(None if methods is None else methods.get("load_weights"), module, cls, version)
        found.append(module)

        def patch(mod, cls=cls, scope=scope, module=module):
            target = getattr(mod, cls, None)
            fn = getattr(target, "load_weights", None)
            if getattr(target, "_spark_exl3_reconciled", False):
                return
            params = None if fn is None else inspect.signature(fn).parameters.values()
            _check(None if params is None else tuple((p.name, source.MISSING) for p in params), module, cls, version)
            wrap_load_weights(target, scope)

        after_import(module, patch)
    return found
