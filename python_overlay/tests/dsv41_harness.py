"""Build vLLM's own DeepseekV41ForCausalLM on the CPU, load a checkpoint, run its layers (contract test worker).

    python dsv41_harness.py --ckpt DIR --tp N --rank R --init file://PATH --out OUT.pt [--twin]

One process per tensor-parallel rank (gloo; the parent sets VLLM_DIST_IDENT the same for all ranks and
OMP_NUM_THREADS=1). The model is built directly, not through `vllm.LLM`: DeepSeek V4.1's attention is
FlashMLA/FlashInfer CUDA code, and vLLM's CPU platform forces a KV block size that backend rejects, so
the engine path cannot run on a CPU (../shared/docs/dsv41-on-cpu.md). What runs here: construction with
the checkpoint's quantization config, `load_weights`, `process_weights_after_loading`, and the forward of
single layers (linears, the MoE block, Engram's WKV, the Engram table lookup). What does not: the attention
kernels (sparse MLA, the compressor and indexer kernels, the o-projection's bmm), hashing (Triton without
a CPU backend) and so a whole-model forward.

The CPU-only patches are in `cpu_patches` and nowhere else; each names the vLLM file:line it works
around and checks that the name it patches exists, so a vLLM bump that moves one fails here, loudly. One
is conditional: the MoE routing runs vLLM's own kernel where the CPU library vLLM loaded has it (AVX512-BF16
CPUs) and `sqrtsoftplus_topk`, a torch stand-in tested equal to that kernel, where it does not (AVX2 CPUs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv41_contract import classes, consumed  # noqa: E402


class PatchMissing(RuntimeError):
    """A name a CPU patch replaces is gone: the vLLM this runs against differs from the one it was written for."""


# (module, attribute, replacement, the vLLM line it works around)
CPU_PATCHES = (
    ("vllm.models.deepseek_v41.nvidia.flashmla", "compute_fp8_einsum_recipe", lambda *a, **k: ((1, 128, 128), False),
     "vllm/models/deepseek_v4/nvidia/ops/o_proj.py compute_fp8_einsum_recipe asserts a CUDA device "
     "(called at nvidia/flashmla.py:58 in 0.32.0; bound there by name at import)"),
    ("torch.accelerator", "current_device_index", lambda: 0,
     "vllm/models/deepseek_v41/common/engram.py:1002 (ParallelEngramEmbedding.__init__ asks the device index)"),
    ("torch.cuda", "get_device_properties", lambda *a, **k: SimpleNamespace(multi_processor_count=2),
     "vllm/models/deepseek_v41/common/engram.py:1002 (stores multi_processor_count as _num_sms)"),
    ("vllm.models.deepseek_v4.nvidia.ops.o_proj", "fused_inv_rope_fp8_quant", lambda o, positions, cos_sin_cache,
     *, n_groups, heads_per_group, nope_dim, rope_dim, quantize, **k: (o.reshape(o.shape[0], n_groups, -1), None),
     "vllm/models/deepseek_v4/nvidia/ops/o_proj.py:66 (0.32.0): the o-projection's inverse RoPE is a Triton kernel; "
     "the stand-in hands the heads on unrotated, grouped (EXL3 model and dense twin alike: the check is of wo_a/wo_b)"),
)
# Not patches, but what construction needs on a CPU, with the line each answers:
# * vllm.v1.worker.cpu_model_runner._torch_cuda_wrapper() around construction: nvidia/model.py:694
#   creates torch.cuda.Stream()s (the CPU model runner wraps construction the same way);
# * EngineArgs(engram_config={"cpu_offload": False}): vllm/config/engram.py:37 defaults it to True and
#   common/engram.py:1066 then pins host memory;
# * VLLM_DIST_IDENT shared by the ranks: distributed/device_communicators/cpu_communicator.py:238.


def cpu_patches() -> list[str]:
    """Apply every CPU patch (the only place they live); returns what each works around."""
    import importlib

    applied = []
    for module_name, attr, replacement, where in CPU_PATCHES:
        module = importlib.import_module(module_name)
        if not hasattr(module, attr):
            raise PatchMissing(f"{module_name}.{attr} is gone; the CPU patch for {where} needs re-checking")
        setattr(module, attr, replacement)
        applied.append(f"{module_name}.{attr}: {where}")
    applied.extend(routing_patch())
    from vllm.v1.worker import cpu_model_runner

    if not hasattr(cpu_model_runner, "_torch_cuda_wrapper"):
        raise PatchMissing("vllm.v1.worker.cpu_model_runner._torch_cuda_wrapper is gone (nvidia/model.py:694 streams)")
    return applied


# DeepSeek V4's MoE routing on vLLM's CPU platform, and the ops it needs from the CPU kernel library.
ROUTER_MODULE, ROUTER_ATTR = "vllm.model_executor.layers.fused_moe.router.cpu_router", "_sqrtsoftplus_bias_topk"
ROUTING_OPS = ("biased_topk_cpu", "hash_topk_cpu")
ROUTING_WHERE = (
    "vllm/model_executor/layers/fused_moe/router/cpu_router.py:81 (0.32.0) routes DeepSeek V4 through "
    "torch.ops._C.biased_topk_cpu / hash_topk_cpu (vllm/_custom_ops.py:4354 / :4396), which only vllm/_C.abi3.so "
    "holds, and vllm/platforms/cpu.py:631 import_kernels loads that library only on an AVX512-BF16 CPU "
    "(_C_AVX512 / _C_AVX2 otherwise): the stand-in is dsv41_harness.sqrtsoftplus_topk"
)


def routing_ops_missing() -> list[str]:
    """The routing ops absent from the CPU kernel library vLLM really loaded in this process."""
    import vllm._custom_ops  # noqa: F401 - its import runs current_platform.import_kernels(), which loads the library

    return [op for op in ROUTING_OPS if not hasattr(torch.ops._C, op)]


def kernel_libraries() -> list[str]:
    """vLLM's kernel libraries mapped into this process. Not sys.modules: importing `vllm._C_AVX2` / `_C_AVX512`
    loads the library but raises (it has no module init of that name; platforms/cpu.py:633-638 ignores that)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({Path(line.split()[-1]).name for line in maps.splitlines()
                   if "/vllm/_C" in line and line.endswith(".so")})


def cpu_flags() -> str:
    """The CPU features vLLM's import_kernels picks its library by (platforms/cpu.py:639-640)."""
    avx512 = getattr(torch.cpu, "_is_avx512_supported", lambda: None)()
    bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: None)()
    return f"avx512={avx512}, avx512_bf16={bf16}"


def routing_patch() -> list[str]:
    """Route with `sqrtsoftplus_topk` where the loaded library lacks vLLM's routing ops; nothing where it has them."""
    import importlib

    if not routing_ops_missing():
        return []
    router = importlib.import_module(ROUTER_MODULE)
    if not hasattr(router, ROUTER_ATTR):
        raise PatchMissing(f"{ROUTER_MODULE}.{ROUTER_ATTR} is gone; the CPU patch for {ROUTING_WHERE} "
                           "needs re-checking")
    setattr(router, ROUTER_ATTR, sqrtsoftplus_topk)
    return [f"{ROUTER_MODULE}.{ROUTER_ATTR}: {ROUTING_WHERE}"]


def routing_in_use() -> str:
    """Which routing the MoE blocks of this process run, read from the router module itself."""
    import importlib

    router = importlib.import_module(ROUTER_MODULE)
    libraries = ", ".join(kernel_libraries()) or "no vllm/_C* library found in /proc/self/maps"
    if getattr(router, ROUTER_ATTR, None) is sqrtsoftplus_topk:
        missing = ", ".join(routing_ops_missing())
        return (f"torch stand-in dsv41_harness.sqrtsoftplus_topk (torch.ops._C lacks {missing}: vLLM loaded "
                f"{libraries}; CPU {cpu_flags()})")
    return f"vllm kernel torch.ops._C.biased_topk_cpu ({libraries}; CPU {cpu_flags()})"


def sqrtsoftplus_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                      e_score_correction_bias: torch.Tensor | None, routed_scaling_factor: float,
                      input_ids: torch.Tensor | None, hash_indices_table: torch.Tensor | None,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek V4's routing in torch, for CPUs whose vLLM kernel library lacks it; the keywords of
    cpu_router._sqrtsoftplus_bias_topk, which cpu_router.py:229 calls by keyword.

    weight = sqrt(softplus(logit)) in fp32. The experts: `hash_indices_table[input_ids]` on a hash-routed layer,
    else the top_k of weight + e_score_correction_bias (the bias steers the choice only). Returned: the chosen
    experts' unbiased weights scaled to sum to routed_scaling_factor (fp32), and their ids (int32). The order is
    the kernel's (highest biased score first; the table's order on a hash layer); where two biased scores tie at
    the top-k boundary either may be chosen, as the kernel's std::partial_sort is not stable either. The MoE
    output is a sum over the chosen experts, so the order does not change it.
    """
    if not renormalize:
        raise ValueError("DeepSeek V4 routing always renormalizes (cpu_router.py:107)")
    weights = _sqrt_softplus(router_logits)
    ids = _routed_experts(weights, top_k, e_score_correction_bias, input_ids, hash_indices_table)
    chosen = weights.gather(1, ids)
    total = chosen.sum(-1, keepdim=True)
    # An all-zero row (logits below about -200) keeps its zeros instead of turning into NaN, as the kernels'
    # hash path and vLLM's CUDA routing (router/dsv4_topk.py) do.
    scale = torch.where(total > 0, routed_scaling_factor / total, torch.ones_like(total))
    return (chosen * scale).contiguous(), ids.to(torch.int32).contiguous()


def _sqrt_softplus(router_logits: torch.Tensor) -> torch.Tensor:
    # softplus's default threshold (x > 20: x) is the kernel's; below that torch's log1p is the more exact.
    return torch.nn.functional.softplus(router_logits.float()).sqrt()


def _routed_experts(weights: torch.Tensor, top_k: int, bias: torch.Tensor | None, input_ids: torch.Tensor | None,
                    table: torch.Tensor | None) -> torch.Tensor:
    """The chosen experts' ids (int64, for gather): from the hash table, else the top_k of the biased weights."""
    if table is not None:
        if input_ids is None:
            raise ValueError("a hash-routed layer needs the token ids")
        ids = table[input_ids].long()
        if ids.shape != (weights.shape[0], top_k):
            raise ValueError(f"hash table rows {tuple(ids.shape)} are not (tokens, top_k={top_k})")
        return ids
    if bias is None:
        raise ValueError("a layer without a hash table needs e_score_correction_bias")
    return torch.topk(weights + bias.float(), top_k, dim=-1).indices


def draft_config(vc):
    """The target's VllmConfig with a `dspark` speculative config, for building the DSpark draft model.

    The CPU cannot validate one: vllm/config/vllm.py:3202 refuses dspark on Model Runner V1 and
    vllm/config/vllm.py:725 leaves V2 (it needs Triton) for V1 on a CPU. The draft reuses the target's
    config and quantization (config/speculative.py ~L1164 / ~L1440), so the stand-in holds exactly that.
    """
    import copy

    from vllm.config import VllmConfig

    if "speculative_config" not in VllmConfig.__dataclass_fields__:
        raise PatchMissing("VllmConfig.speculative_config is gone (the DSpark draft's config stand-in)")
    draft = copy.copy(vc)
    object.__setattr__(draft, "speculative_config", SimpleNamespace(
        draft_model_config=vc.model_config, method="dspark", num_speculative_tokens=2))
    return draft


def engine_config(model_dir: Path, tp: int):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(model_dir), enforce_eager=True, max_model_len=256, dtype="bfloat16",
        limit_mm_per_prompt={"image": 0}, max_num_seqs=4, max_num_batched_tokens=256,
        tensor_parallel_size=tp, engram_config={"cpu_offload": False},
    ).create_engine_config()


def build(vc):
    from vllm.config import set_current_vllm_config
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.worker.cpu_model_runner import _torch_cuda_wrapper

    with set_current_vllm_config(vc):
        from vllm.models.deepseek_v41 import DeepseekV41ForCausalLM

        with _torch_cuda_wrapper(), set_default_torch_dtype(vc.model_config.dtype), torch.device("cpu"):
            return DeepseekV41ForCausalLM(vllm_config=vc, prefix="")


def checkpoint(ckpt: Path, names: list[str]):
    """The checkpoint's tensors in file order, each name appended to `names` as it is read."""
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        for name in f.keys():
            names.append(name)
            yield name, f.get_tensor(name)


def build_draft(vc):
    from vllm.config import set_current_vllm_config
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.worker.cpu_model_runner import _torch_cuda_wrapper

    dvc = draft_config(vc)
    with set_current_vllm_config(dvc):
        from vllm.models.deepseek_v41 import DSparkDeepseekV4ForCausalLM

        with _torch_cuda_wrapper(), set_default_torch_dtype(vc.model_config.dtype), torch.device("cpu"):
            return DSparkDeepseekV4ForCausalLM(vllm_config=dvc, prefix=""), dvc


DRAFT_ALIASED = ("lm_head.weight", "model.embed_tokens.weight")  # shared with the target (nvidia/dspark.py ~L95)


def _draft_param(name: str) -> str:
    import re

    return re.sub(r"^mtp\.(\d+)\.", r"model.layers.\1.", name)


def draft_result(ckpt: Path, vc, linears: list[str] | None = None) -> dict:
    """The DSpark draft model: built with the target's (exl3) config, `mtp.*` loaded, PWAL, its EXL3 layers run."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    draft, dvc = build_draft(vc)
    names: list[str] = []

    out = {}
    with set_current_vllm_config(dvc):
        tracker = consumed.Tracker(draft)
        draft.load_weights(tracker.watch(checkpoint(ckpt, names)))
        report = tracker.report(names, ckpt / "model.safetensors", _draft_param, DRAFT_ALIASED)
        report["not_consumed"] = [n for n in report["not_consumed"] if classes.DRAFT.match(n)]
        report["methods"] = classes.method_map(draft)
        modules = dict(draft.named_modules())
        with dense_wo_a_kept(draft):
            process_weights_after_loading(draft, dvc.model_config, torch.device("cpu"))
        report["packed"] = packed_params(draft)
        g = torch.Generator().manual_seed(2)
        if linears is None:
            linears = [n for n, m in sorted(modules.items())
                       if type(getattr(m, "quant_method", None)).__name__ == "Exl3LinearMethod"]
        report["linears"] = linears
        with set_forward_context(None, dvc), torch.no_grad():
            for name in linears:
                module = modules[name]
                y = module(torch.randn(5, module.input_size, generator=g).to(torch.bfloat16))
                out[f"linear:{name}"] = (y[0] if isinstance(y, tuple) else y).float()
            for i, layer in enumerate(draft.model.layers):
                x = (torch.randn(7, layer.ffn_norm.weight.shape[0], generator=g) * 0.5).to(torch.bfloat16)
                out[f"moe:{i}"] = layer.ffn(x, torch.randint(0, 2048, (7,), generator=g)).float()
            out.update(o_proj_outputs(draft.model.layers, 1, 0, g))
    report["outputs"] = out
    return report


def load(model, vc, ckpt: Path) -> dict:
    """load_weights + process_weights_after_loading: what was consumed, what is missing, the quant map and the
    dense-served weights (taken before PWAL, which packs CPU linear weights away)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    names: list[str] = []

    with set_current_vllm_config(vc):
        tracker = consumed.Tracker(model)
        model.load_weights(tracker.watch(checkpoint(ckpt, names)))
        report = tracker.report(names, ckpt / "model.safetensors")
        report["methods"] = classes.method_map(model)
        report["dense"] = dense_weights(model)
        with dense_wo_a_kept(model):
            process_weights_after_loading(model, vc.model_config, torch.device("cpu"))
        report["packed"] = packed_params(model)
    return report


def layer_outputs(model, vc, tp: int, rank: int, names: list[str]) -> dict[str, torch.Tensor]:
    """Forward of the EXL3 layers (and the Engram lookup) on fixed inputs; column-parallel outputs are this rank's."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    lm = model.language_model.model
    g = torch.Generator().manual_seed(1)
    out = {}
    modules = dict(model.named_modules())
    with set_current_vllm_config(vc), set_forward_context(None, vc), torch.no_grad():
        for name in names:
            module = modules[name]
            full = module.input_size
            x = torch.randn(5, full, generator=g).to(torch.bfloat16)
            per = getattr(module, "input_size_per_partition", full)
            if per != full:  # row-parallel: this rank's slice of the full input
                x = x[:, rank * per : (rank + 1) * per]
            y = module(x)
            out[f"linear:{name}"] = (y[0] if isinstance(y, tuple) else y).float()
        tc = getattr(model.config, "text_config", model.config)
        hidden = lm.layers[0].ffn_norm.weight.shape[0]
        logits = model.compute_logits(torch.randn(5, hidden, generator=g).to(torch.bfloat16))
        if logits is not None:  # TP>1: gathered on rank 0
            out["logits"] = logits.float()
        out.update(o_proj_outputs(lm.layers, tp, rank, g))
        ids = torch.randint(0, tc.vocab_size, (7,), generator=g)
        for i, layer in enumerate(lm.layers):
            x = (torch.randn(7, hidden, generator=g) * 0.5).to(torch.bfloat16)
            out[f"moe:{i}"] = layer.ffn(x, ids).float()
        for i, layer in enumerate(lm.layers):
            engram = getattr(layer, "engram", None)
            if engram is None:
                continue
            table = engram.embed_tokens
            rows = torch.stack([torch.randint(lo, lo + n, (6,), generator=g)
                                for lo, n in classes.head_ranges(tc, i)], 1)
            got = torch.empty(6, table.part_n_hash_cols, table.dim, dtype=torch.bfloat16)
            table.lookup(rows, got)
            out[f"engram_rows:{i}"] = got.float()
            out[f"engram_ids:{i}"] = rows
    return out


def o_proj_outputs(layers, tp: int, rank: int, g: torch.Generator, tokens: int = 6) -> dict[str, torch.Tensor]:
    """vLLM's own o-projection (`_o_proj`: wo_a through the overlay's hook, then wo_b) of each attention layer
    on fixed attention outputs; at TP>1 each rank takes its heads of the full input (wo_b all-reduces)."""
    out = {}
    for i, layer in enumerate(layers):
        attn = layer.attn
        full = torch.randn(tokens, attn.n_heads, attn.head_dim, generator=g).to(torch.bfloat16)
        n = attn.n_local_heads
        y = attn._o_proj(full[:, rank * n : (rank + 1) * n].contiguous(), torch.arange(tokens))
        out[f"o_proj:{i}"] = y.float()
    return out


@contextlib.contextmanager
def dense_wo_a_kept(model):
    """A dense wo_a (the twin's) keeps its bf16 weight through PWAL: vLLM's CPU unquantized method packs it
    away for its own GEMM (model_executor/layers/utils.py dispatch_cpu_unquantized_gemm, remove_weight), but
    the o-projection's bmm (deepseek_v4/nvidia/ops/o_proj.py:97 in 0.32.0) reads wo_a.weight directly."""
    kept = {n: m.weight.data for n, m in model.named_modules()
            if n.endswith(".attn.wo_a") and type(m.quant_method).__name__ == "UnquantizedLinearMethod"}
    yield
    modules = dict(model.named_modules())
    for name, weight in kept.items():
        modules[name].weight.data = weight


def packed_params(model) -> dict[str, dict[str, tuple[str, list[int], int]]]:
    """lm_head and every wo_a: each parameter vLLM holds for it (dtype, shape, bytes)."""
    return {n: {p: (str(t.dtype), list(t.shape), t.numel() * t.element_size()) for p, t in m.named_parameters()}
            for n, m in model.named_modules() if n.endswith(("lm_head", ".attn.wo_a"))}


def dense_weights(model) -> dict[str, torch.Tensor]:
    """The weights of the layers served dense (decoded at load), as vLLM holds them on this rank."""
    return {f"dense:{n}": m.weight.detach().float().clone() for n, m in classes.dense_layers(model)}


def _load_error(ckpt: Path, tp: int) -> str | None:
    vc = engine_config(ckpt, tp)
    model = build(vc)
    try:
        load(model, vc, ckpt)
    except Exception as err:  # noqa: BLE001 - the message is the result
        return f"{type(err).__name__}: {err}"
    return None


def negatives(ckpt: Path, tp: int) -> dict[str, str | None]:
    """The real load with one class's method taken away: the error each gives (None: it loaded)."""
    import vllm.models.deepseek_v41.nvidia.model as model_module
    from spark_overlay.exl3.vllm.config import Exl3Config
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    out = {}
    hooked = model_module.ParallelLMHead
    model_module.ParallelLMHead = hooked.__wrapped__  # the head built without the hook: no EXL3 method
    try:
        out["head"] = _load_error(ckpt, tp)
    finally:
        model_module.ParallelLMHead = hooked
    original = Exl3Config.get_quant_method

    def without_wq_b(self, layer, prefix):
        return UnquantizedLinearMethod() if prefix.endswith(".attn.wq_b") else original(self, layer, prefix)

    Exl3Config.get_quant_method = without_wq_b
    try:
        out["attn.wq_b"] = _load_error(ckpt, tp)
    finally:
        Exl3Config.get_quant_method = original
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--init", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--twin", action="store_true", help="also build the dense twin (TP=1 only)")
    p.add_argument("--negatives", action="store_true", help="also load with a class's method taken away")
    args = p.parse_args(argv)
    from spark_overlay import plugin

    plugin.register()
    patches = cpu_patches()
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    vc = engine_config(args.ckpt / "exl3", args.tp)
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=args.tp, rank=args.rank, local_rank=args.rank,
                                     distributed_init_method=args.init, backend="gloo")
        ensure_model_parallel_initialized(args.tp, 1)
    result = {"patches": patches, "quant_method": type(vc.quant_config).__name__ if vc.quant_config else None,
              "routing": routing_in_use()}
    model = build(vc)
    result["load"] = load(model, vc, args.ckpt / "exl3")
    names = [n for n, _ in classes.linear_layers(model)]
    result["outputs"] = layer_outputs(model, vc, args.tp, args.rank, names)
    result["width_error"] = classes.full_width_error(model, vc, args.tp)
    if args.twin:
        tvc = engine_config(args.ckpt / "dense", args.tp)
        twin = build(tvc)
        result["twin_load"] = load(twin, tvc, args.ckpt / "dense")
        result["twin"] = layer_outputs(twin, tvc, args.tp, args.rank, names)
    if args.twin:
        result["draft"] = draft_result(args.ckpt / "exl3", vc)
        result["draft_twin"] = draft_result(args.ckpt / "dense", engine_config(args.ckpt / "dense", args.tp),
                                            result["draft"]["linears"])
    if args.negatives:
        result["negatives"] = negatives(args.ckpt / "exl3", args.tp)
    torch.save(result, args.out)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
