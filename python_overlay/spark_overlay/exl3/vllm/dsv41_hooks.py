"""DeepSeek V4.1 in released vLLM: serve `lm_head` and `wo_a` in EXL3 through two version-checked hooks.

* LM head. `nvidia/model.py` builds `ParallelLMHead(vocab, hidden, prefix=...)`
  without a quant config. The hook rebinds that module's `ParallelLMHead` to a
  factory that passes the current `Exl3Config` (when the model is EXL3), so
  the head gets `Exl3LinearMethod` (packed, vocab-sharded; K=6 in the kit).
  The DSpark draft's own head is left alone: vLLM aliases the target's.
* o-projection. vLLM's CUDA o-projection (`deepseek_v4/nvidia/ops/o_proj.py`
  `deep_gemm_fp8_o_proj`, called by `deepseek_v41/nvidia/ops/o_proj.py` in
  0.32/0.33 and by `DeepseekV4GroupedWoA.grouped_forward` in 0.34) reads
  `wo_a.weight` for an fp8 einsum or a bf16 bmm. The hook wraps it: a `wo_a`
  with `Exl3GroupedMethod` gets vLLM's own inverse RoPE (`quantize=False`)
  and then its EXL3 groups (`grouped.py`); any other `wo_a` runs the original.

Registration checks both against the release's source, the patch (at import,
`after_import`) against the live objects; a difference fails closed naming the
vLLM version. (FlashMLA mega attention, SM100 only, reads `wo_a.weight` at
load and cannot take an EXL3 `wo_a`: it fails there, loudly.)
"""

from __future__ import annotations

import ast
import inspect

from spark_overlay import source
from spark_overlay.after_import import after_import

from ..format.errors import Exl3FormatError

HEAD_MODULE = "vllm.models.deepseek_v41.nvidia.model"
HEAD_CLASS_MODULE = "vllm.model_executor.layers.vocab_parallel_embedding"
# ParallelLMHead.__init__ parameters the factory relies on (a release may add more after them).
HEAD_PARAMS = ("self", "num_embeddings", "embedding_dim", "bias", "params_dtype", "org_num_embeddings",
               "padding_size", "quant_config", "prefix")
O_PROJ_MODULE = "vllm.models.deepseek_v4.nvidia.ops.o_proj"
# Modules that bind deep_gemm_fp8_o_proj by name at import (0.32.0, 0.33.0); 0.34.0 imports it per call.
O_PROJ_CALLERS = ("vllm.models.deepseek_v41.nvidia.ops.o_proj",)
O_PROJ = "deep_gemm_fp8_o_proj"
O_PROJ_PARAMS = ("o", "positions", "cos_sin_cache", "wo_a", "wo_b", "*,n_groups", "*,heads_per_group", "*,nope_dim",
                 "*,rope_dim", "*,o_lora_rank", "*,einsum_recipe", "*,tma_aligned_scales")
INV_ROPE = "fused_inv_rope_fp8_quant"
INV_ROPE_PARAMS = ("o", "positions", "cos_sin_cache", "n_groups", "heads_per_group", "nope_dim", "rope_dim",
                   "quant_group_size", "tma_aligned_scales", "quantize")


def _fail(version: str, what: str) -> Exl3FormatError:
    return Exl3FormatError(
        f"vLLM {version}: {what}; the EXL3 overlay hooks it to serve DeepSeek V4.1's lm_head and wo_a packed, "
        "refusing to load an EXL3 DeepSeek V4.1 with it. Use a vLLM the overlay supports "
        "(spark_overlay.plugin.SUPPORTED_VLLM_VERSIONS)"
    )


def check_head(params, version: str) -> None:
    """`params`: ParallelLMHead.__init__'s parameter names (None: no such class)."""
    if params is None or tuple(params)[: len(HEAD_PARAMS)] != HEAD_PARAMS:
        raise _fail(version, f"{HEAD_CLASS_MODULE}.ParallelLMHead.__init__{list(params or [])} differs from "
                             f"({', '.join(HEAD_PARAMS)}, ...)")


def check_o_proj(params, inv_rope, version: str) -> None:
    """`params` / `inv_rope`: the parameter names of deep_gemm_fp8_o_proj / fused_inv_rope_fp8_quant (None: gone)."""
    if params is None or tuple(params) != O_PROJ_PARAMS:
        raise _fail(version, f"{O_PROJ_MODULE}.{O_PROJ}{list(params or [])} differs from ({', '.join(O_PROJ_PARAMS)})")
    if inv_rope is None or tuple(inv_rope) != INV_ROPE_PARAMS:
        raise _fail(version, f"{O_PROJ_MODULE}.{INV_ROPE}{list(inv_rope or [])} differs from "
                             f"({', '.join(INV_ROPE_PARAMS)})")


def _functions(path: str) -> dict[str, tuple[str, ...]]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return {n.name: tuple(a for a, _ in source.signature(n)) for n in tree.body if isinstance(n, ast.FunctionDef)}


def _imported(path: str, name: str) -> bool:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return any(isinstance(n, ast.ImportFrom) and any(a.name == name and a.asname is None for a in n.names)
               for n in tree.body)


def _live(fn) -> tuple[str, ...]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        prefix = {p.KEYWORD_ONLY: "*,", p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append(prefix + p.name)
    return tuple(out)


def _current_exl3():
    from vllm.config import get_current_vllm_config_or_none

    from .config import Exl3Config

    vc = get_current_vllm_config_or_none()
    qc = getattr(vc, "quant_config", None)
    return qc if isinstance(qc, Exl3Config) else None


def head_factory(original):
    """`original` (vLLM's ParallelLMHead), given the current Exl3Config when none is passed."""

    def ParallelLMHead(*args, **kwargs):  # noqa: N802 - stands in for the class name the model calls
        if len(args) < HEAD_PARAMS.index("quant_config") - 1 and kwargs.get("quant_config") is None:
            qc = _current_exl3()
            if qc is not None:
                kwargs["quant_config"] = qc
        return original(*args, **kwargs)

    ParallelLMHead.__wrapped__ = original
    ParallelLMHead._spark_exl3_head = True
    return ParallelLMHead


def o_proj_wrapper(original, module):
    """`original` deep_gemm_fp8_o_proj, with an EXL3 wo_a served by its groups; `module` holds the inverse RoPE."""
    from .grouped import Exl3GroupedMethod

    def deep_gemm_fp8_o_proj(o, positions, cos_sin_cache, wo_a, wo_b, **kw):
        method = getattr(wo_a, "quant_method", None)
        if not isinstance(method, Exl3GroupedMethod):
            return original(o, positions, cos_sin_cache, wo_a, wo_b, **kw)
        import torch

        if not isinstance(o, torch.Tensor):
            raise Exl3FormatError(f"{method.prefix}: an EXL3 wo_a needs the bf16 attention output; this attention "
                                  f"backend hands the o-projection {type(o).__name__} (an fp8 cast)")
        x, _ = getattr(module, INV_ROPE)(
            o, positions, cos_sin_cache, n_groups=kw["n_groups"], heads_per_group=kw["heads_per_group"],
            nope_dim=kw["nope_dim"], rope_dim=kw["rope_dim"], quant_group_size=kw["einsum_recipe"][2],
            tma_aligned_scales=kw["tma_aligned_scales"], quantize=False)
        z = method.grouped(wo_a, x)
        return wo_b(z.flatten(1))

    deep_gemm_fp8_o_proj.__wrapped__ = original
    deep_gemm_fp8_o_proj._spark_exl3_o_proj = True
    return deep_gemm_fp8_o_proj


def _patch_head(mod, version: str) -> None:
    current = getattr(mod, "ParallelLMHead", None)
    if getattr(current, "_spark_exl3_head", False):
        return
    init = getattr(current, "__init__", None)
    check_head(None if current is None else tuple(p.lstrip("*,") for p in _live(init)), version)
    mod.ParallelLMHead = head_factory(current)


def _patch_o_proj(mod, version: str) -> None:
    current = getattr(mod, O_PROJ, None)
    if getattr(current, "_spark_exl3_o_proj", False):
        return
    rope = getattr(mod, INV_ROPE, None)
    check_o_proj(None if current is None else _live(current), None if rope is None else _live(rope), version)
    setattr(mod, O_PROJ, o_proj_wrapper(current, mod))


def _patch_caller(mod, version: str) -> None:
    """A module that bound deep_gemm_fp8_o_proj at import: it must hold the (wrapped) original."""
    import importlib

    defining = importlib.import_module(O_PROJ_MODULE)  # imported (and so patched) by the caller's own import
    _patch_o_proj(defining, version)
    bound, wrapper = getattr(mod, O_PROJ, None), getattr(defining, O_PROJ)
    if bound is wrapper:
        return
    if bound is not wrapper.__wrapped__:
        raise _fail(version, f"{mod.__name__}.{O_PROJ} is not {O_PROJ_MODULE}'s")
    setattr(mod, O_PROJ, wrapper)


def register(version: str) -> list[str]:
    """Check the release's source now; patch when vLLM imports the modules. Returns the modules hooked."""
    model = source.module_file(HEAD_MODULE)
    if model is None:
        return []  # a vLLM without DeepSeek V4.1
    head_cls = source.module_file(HEAD_CLASS_MODULE)
    init = None if head_cls is None else (source.class_methods(head_cls, "ParallelLMHead") or {}).get("__init__")
    check_head(None if init is None else tuple(a.lstrip("*,") for a, _ in init), version)
    if not _imported(model, "ParallelLMHead"):
        raise _fail(version, f"{HEAD_MODULE} no longer imports ParallelLMHead by name")
    o_proj = source.module_file(O_PROJ_MODULE)
    functions = {} if o_proj is None else _functions(o_proj)
    inv_rope_file = source.module_file("vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant")
    inv_rope = None if inv_rope_file is None else _functions(inv_rope_file).get(INV_ROPE)
    check_o_proj(functions.get(O_PROJ), inv_rope, version)
    after_import(HEAD_MODULE, lambda mod: _patch_head(mod, version))
    after_import(O_PROJ_MODULE, lambda mod: _patch_o_proj(mod, version))
    hooked = [HEAD_MODULE, O_PROJ_MODULE]
    for caller in O_PROJ_CALLERS:
        path = source.module_file(caller)
        if path is not None and _imported(path, O_PROJ):
            after_import(caller, lambda mod: _patch_caller(mod, version))
            hooked.append(caller)
    return hooked
