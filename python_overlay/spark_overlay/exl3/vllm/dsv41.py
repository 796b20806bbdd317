"""DeepSeek V4.1 in released vLLM: the EXL3 classes vLLM builds without a quantization method.

vLLM's `DeepseekV41ForCausalLM` (0.32.0-0.34.0) builds `lm_head`, the indexer's
`wk` and the compressor's `fused_wkv_wgate` with `quant_config=None`, and its
CUDA o-projection reads `wo_a.weight` directly (bf16 for a bmm, or fp8 with a
scale). The EXL3 checkpoint packs all four (`head` at K=6, `attn.indexer.wk`,
`attn.compressor.wkv/wgate`, `attn.wo_a.slice.0..G-1`). How each is served
(docs/exl3-overlay.md has the cost per rank):

* `head` and `wo_a` stay packed (`dsv41_hooks`: the head gets the EXL3 linear
  method, `wo_a` the grouped one, `grouped.py`). `wrap_load_weights` renames
  `head.<kind>` to the name vLLM maps `head.weight` to, and stacks the `wo_a`
  slices of a layer in group order into `<layer>.attn.wo_a.<kind>` [G, ...].
* `indexer.wk` and the compressor (5 MiB per layer at most, 35 MiB in all)
  are decoded to dense at load: their EXL3 tensors are held back from the
  stream, checked (`format.load_linear`), decoded (`full_weight`, the
  reference decoder) into the model's dtype and handed to vLLM as
  `<prefix>.weight`.
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
DENSE = re.compile(rf"^({_BLOCK}\.attn\.indexer\.wk|{_BLOCK}\.attn\.compressor\.(?:wkv|wgate))$")
WO_A = re.compile(rf"^({_BLOCK}\.attn\.wo_a)\.slice\.(\d+)$")
HEAD = "head"
GROUPED_LAYER = re.compile(r"\.attn\.wo_a$")


def grouped_layer(prefix: str) -> bool:
    """Whether the vLLM layer at `prefix` is `wo_a`, served by the grouped EXL3 method (grouped.py)."""
    return bool(GROUPED_LAYER.search(prefix))


def _shape(config, prefix: str) -> tuple[int, int]:
    """(in, out) of a decoded-at-load checkpoint linear, from the model's text config."""
    c = getattr(config, "text_config", config)
    if prefix.endswith("indexer.wk"):
        return c.head_dim, c.index_head_dim
    if prefix.rsplit(".", 1)[-1] in ("wkv", "wgate"):
        return c.hidden_size, c.head_dim
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
    head_as: str | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint stream as vLLM's layers take it (module docstring).

    Names outside `scope` (a prefix; None = all) pass through untouched.
    `head_as`: the name vLLM maps `head.weight` to; the head's EXL3 tensors
    are renamed to it (`<kind>` for `weight`). The decoded and stacked tensors
    follow the rest of the stream (their parts may arrive in any order). EXL3
    tensors handed on to vLLM are added to `passed` (under their checkpoint names).
    """
    held: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        prefix, _, kind = name.rpartition(".")
        if kind in KINDS and (scope is None or name.startswith(scope)) and (DENSE.match(prefix) or WO_A.match(prefix)):
            held.setdefault(prefix, {})[name] = tensor
            continue
        if kind in KINDS and passed is not None:
            passed.add(name)
        if kind in KINDS and prefix == HEAD and head_as is not None and scope is None:
            name = f"{head_as.rpartition('.')[0]}.{kind}"
        yield name, tensor
    slices: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for prefix, parts in sorted(held.items()):
        wo_a = WO_A.match(prefix)
        if wo_a is None:
            yield f"{prefix}.weight", _sourced(_decode(parts, prefix, _shape(config, prefix), dtype), parts)
            continue
        slices.setdefault(wo_a.group(1), {})[int(wo_a.group(2))] = parts
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
        yield from _stacked(layer, [got[g] for g in range(groups)])


def _stacked(layer: str, groups: list[dict[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """`<layer>.<kind>` = the groups' `<layer>.slice.<g>.<kind>` stacked in group order (same kinds, same K)."""
    kinds = [sorted(n.rpartition(".")[2] for n in parts) for parts in groups]
    for g, have in enumerate(kinds):
        if have != kinds[0]:
            raise Exl3FormatError(f"{layer}.slice.{g}: has tensors {have}, {layer}.slice.0 has {kinds[0]}; every "
                                  "wo_a slice of a layer must be quantized alike (one K, one codebook)")
    for kind in kinds[0]:
        names = [f"{layer}.slice.{g}.{kind}" for g in range(len(groups))]
        tensors = [parts[n] for parts, n in zip(groups, names)]
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) != 1:
            raise Exl3FormatError(f"{names[0]}: the wo_a slices of {layer} differ in shape ({sorted(shapes)}); every "
                                  "slice of a layer must be quantized at the same K")
        yield f"{layer}.{kind}", _sourced(torch.stack(tensors), names)


def _sourced(tensor: torch.Tensor, names) -> torch.Tensor:
    """Record the checkpoint tensors a decoded weight was made from (the contract test counts them consumed)."""
    tensor._spark_sources = tuple(names)
    return tensor


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype dense weights load in: that of the model's LM head (EXL3 or not), else bf16."""
    for name, module in model.named_modules():
        if name.endswith("lm_head"):
            if isinstance(getattr(module, "exl3_params_dtype", None), torch.dtype):
                return module.exl3_params_dtype
            if isinstance(getattr(module, "weight", None), torch.Tensor):
                return module.weight.dtype
    return torch.bfloat16


def wrap_load_weights(cls, scope: str | None) -> None:
    """Patch `cls.load_weights` to reconcile the stream first and name an EXL3 tensor vLLM cannot place."""
    if getattr(cls, "_spark_exl3_reconciled", False):
        return
    original = cls.load_weights

    def load_weights(self, weights):
        passed: set[str] = set()
        mapper = getattr(self, "hf_to_vllm_mapper", None)
        head_as = mapper.map_name("head.weight") if scope is None and mapper is not None else None
        stream = reconcile(weights, self.config, _model_dtype(self), scope, passed, head_as)
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
