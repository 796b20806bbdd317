"""Contract test: the overlay against vLLM's OWN DeepseekV41ForCausalLM, on the CPU, at TP=1 and TP=2.

A tiny DeepSeek V4.1 in the real checkpoint layout (tools/make_tiny_dsv41.py: the K map's classes, the
head at K=6, indexer.wk, the compressor, wo_a as slices, Engram, a DSpark stage) is loaded through the
release's model class built directly (dsv41_harness.py, one process per rank, gloo, shared
VLLM_DIST_IDENT, OMP_NUM_THREADS=1), with the exl3 quantization config from its config.json. Proven:

* construction, every checkpoint tensor consumed (the DSpark stage's `mtp.*` aside: the release's VL
  wrapper drops them, nvidia/vl_model.py ~L103, and its `dspark` draft model loads them) and no model
  parameter left unloaded, process_weights_after_loading;
* the quant-method map: every class of the K map lands in a layer with an EXL3 method or one the
  overlay decodes to dense at load; a class whose method is stripped fails that check, and two classes
  (a linear, and the head built without the overlay's hook) losing their method fail the real load,
  naming the tensor;
* every EXL3 linear, each MoE block, Engram's WKV, the logits (the EXL3 head through vLLM's
  compute_logits) and the o-projection (vLLM's own `_o_proj`: the EXL3 wo_a groups through the hooked
  deep_gemm_fp8_o_proj, then wo_b) inside the real model equal the dense twin's; lm_head and every wo_a
  hold only packed EXL3 tensors (bytes asserted, vocab / groups split at TP=2); the dense-at-load
  classes (indexer.wk, the compressor) equal the decoded twin's weights; Engram rows come from the
  table file through the hook into the real ParallelEngramEmbedding;
* TP=2 equals TP=1 (sharded outputs reassembled); a full-width input to a row-parallel EXL3 layer at
  TP=2 raises instead of corrupting memory.

Not run on a CPU (no CPU kernels in vLLM for DeepSeek V4.1): the attention (FlashMLA / FlashInfer sparse
MLA, the compressor and indexer kernels, the o-projection's inverse RoPE: a CPU stand-in passes the heads
on unrotated, dsv41_harness.CPU_PATCHES), Engram's n-gram hashing (Triton) and
so a whole-model forward or `vllm.LLM`. Where the CPU lacks AVX512-BF16, vLLM's kernel library has no
DeepSeek V4 routing ops and the MoE blocks route through a torch stand-in (dsv41_harness.sqrtsoftplus_topk,
tested equal to the kernel in test_dsv41_cpu_routing.py where the kernel runs). The DSpark draft model
(`dspark`, which loads `mtp.*`) is built from the target's config with a speculative-config stand-in
(dsv41_harness.draft_config: a CPU cannot validate a dspark config) and checked the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from dsv41_contract import classes

TESTS = Path(__file__).resolve().parent
OVERLAY = TESTS.parent
HARNESS = TESTS / "dsv41_harness.py"
MAKER = OVERLAY / "tools" / "make_tiny_dsv41.py"
TIMEOUT = 900


def _cpu_platform_reason() -> str | None:
    """Why this vLLM cannot build DeepSeek V4.1 layers on this machine (None when it can)."""
    from spark_overlay import source

    if source.module_file("vllm.models.deepseek_v41.nvidia.model") is None:
        return "this vLLM has no vllm/models/deepseek_v41"
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return f"vLLM's platform is {type(current_platform).__name__}, not the CPU platform the harness patches for"
    except Exception as err:  # noqa: BLE001 - a VLLM_TARGET_DEVICE=empty build cannot even pick a platform
        return f"vLLM cannot resolve a platform here ({type(err).__name__}: {err})"
    return None


REASON = _cpu_platform_reason()
if REASON:
    print(f"test_dsv41_contract: skipped: {REASON}", file=sys.stderr)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _env(tiny: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "SPARK_ENGRAM")}
    env.update(PYTHONPATH=str(OVERLAY), OMP_NUM_THREADS="1", VLLM_DIST_IDENT=f"dsv41-{uuid.uuid4().hex[:8]}",
               SPARK_ENGRAM_DIR=str(tiny / "engram"), VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def _run(tiny: Path, out: Path, tp: int, extra: list[str]) -> list[dict]:
    """The harness at `tp` ranks (processes started together); each rank's result."""
    env = _env(tiny)
    init = f"file://{out.parent / ('init-' + uuid.uuid4().hex[:8])}"
    procs = []
    for rank in range(tp):
        path = out.with_name(f"{out.stem}-r{rank}.pt")
        cmd = [sys.executable, str(HARNESS), "--ckpt", str(tiny), "--tp", str(tp), "--rank", str(rank),
               "--init", init, "--out", str(path), *extra]
        procs.append((path, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True)))
    results = []
    for path, proc in procs:
        log, _ = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, f"harness rank failed (rc {proc.returncode}):\n{log[-6000:]}"
        results.append(torch.load(path, weights_only=False))
    return results


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dsv41") / "tiny"
    proc = subprocess.run([sys.executable, str(MAKER), "--out", str(out)], env={**os.environ, "PYTHONPATH": str(OVERLAY)},
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="session")
def tp1(tiny) -> dict:
    return _run(tiny, tiny.parent / "tp1.pt", 1, ["--twin", "--negatives"])[0]


@pytest.fixture(scope="session")
def tp2(tiny) -> list[dict]:
    return _run(tiny, tiny.parent / "tp2.pt", 2, [])


def _names(tiny: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(tiny / "exl3" / "model.safetensors"), "pt") as f:
        return list(f.keys())


def _close(got: torch.Tensor, want: torch.Tensor, what: str, rel: float = 0.0) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    tol = rel * float(want.abs().max()) if rel else 0.0
    diff = float((got - want).abs().max()) if got.numel() else 0.0
    assert diff <= tol, f"{what}: max |diff| {diff:.3g} > {tol:.3g}"


ROUTER = "vllm.model_executor.layers.fused_moe.router.cpu_router._sqrtsoftplus_bias_topk:"


def _routing_ops_missing() -> bool:
    """Whether the kernel library vLLM loads on this CPU lacks DeepSeek V4's routing ops, asked here rather than
    taken from the harness, whose answer is under test."""
    import vllm._custom_ops  # noqa: F401 - its import loads the library vLLM picks for this CPU

    return not all(hasattr(torch.ops._C, op) for op in ("biased_topk_cpu", "hash_topk_cpu"))


def test_built_with_the_exl3_config_and_the_named_cpu_patches(tp1):
    assert tp1["quant_method"] == "Exl3Config"
    patches, missing = tp1["patches"], _routing_ops_missing()
    assert len(patches) == 4 + missing and all(".py" in p for p in patches), patches
    assert sum(p.startswith(ROUTER) for p in patches) == missing, patches  # the routing patch iff the ops are missing
    assert tp1["routing"].startswith("torch stand-in" if missing else "vllm kernel"), tp1["routing"]


def test_every_checkpoint_tensor_is_consumed_and_no_parameter_is_missing(tp1, tiny):
    names = _names(tiny)
    load = tp1["load"]
    assert load["names"] == len(names)
    left = load["not_consumed"]
    assert left == sorted(n for n in names if classes.DRAFT.match(n)), [n for n in left if not classes.DRAFT.match(n)]
    assert load["never_loaded"] == []
    assert tp1["twin_load"]["never_loaded"] == []


def test_every_class_of_the_k_map_gets_its_method(tp1, tiny):
    prefixes = classes.packed_prefixes(_names(tiny))
    assert classes.violations(prefixes, tp1["load"]["methods"]) == []
    found = {classes.class_of(p)[0].name for p in prefixes if not classes.DRAFT.match(p)}
    assert found == {c.name for c in classes.CLASSES}, found


@pytest.mark.parametrize("name", [c.name for c in classes.CLASSES])
def test_a_class_that_loses_its_method_fails_the_contract(tp1, tiny, name):
    prefixes = classes.packed_prefixes(_names(tiny))
    bad = classes.violations(prefixes, classes.strip(tp1["load"]["methods"], name))
    assert bad and all(b.startswith(f"class {name}:") for b in bad), bad


def test_losing_a_method_fails_the_real_load_naming_the_tensor(tp1):
    errors = tp1["negatives"]
    assert set(errors) == {"attn.wq_b", "head"}
    for name, message in errors.items():
        assert message and "EXL3 tensor reached a vLLM layer with no EXL3 method" in message, (name, message)
    assert "wq_b" in errors["attn.wq_b"] and errors["head"].split(":")[1].strip().startswith("head."), errors["head"]


def test_exl3_layers_inside_the_real_model_equal_the_dense_twin(tp1):
    outs, twin = tp1["outputs"], tp1["twin"]
    kinds = {k.split(":")[0] for k in outs}
    assert {"linear", "moe", "engram_rows", "logits", "o_proj"} <= kinds, kinds
    assert any("engram.wkv" in k for k in outs) and sum(k.startswith("moe:") for k in outs) == 3
    for key, want in twin.items():
        _close(outs[key], want, key, rel=1e-3)


def test_dense_at_load_classes_equal_the_decoded_twin(tp1):
    dense, twin = tp1["load"]["dense"], tp1["twin_load"]["dense"]
    assert {k.rsplit(".", 1)[-1] for k in dense} == {"wk", "fused_wkv_wgate"}
    for key, want in twin.items():
        _close(dense[key], want, key)


def _check_packed(packed: dict, what: str) -> None:
    """Every parameter vLLM holds for lm_head / wo_a is an EXL3 tensor: the trellis at K/8 bytes per weight of
    the rank's padded matrix, fp16 sign vectors, markers; no dense weight."""
    assert any(n.endswith("lm_head") for n in packed) and sum(n.endswith(".attn.wo_a") for n in packed) >= 3, packed
    for name, params in packed.items():
        assert set(params) >= {"trellis", "suh", "svh"} and "weight" not in params, (what, name, params)
        dtype, shape, nbytes = params["trellis"]
        assert dtype == "torch.int16", (what, name, dtype)
        *tiles, k16 = shape  # [G_local,] in/16, out/16, 16·K
        groups = tiles[0] if len(tiles) == 3 else 1
        weights = groups * tiles[-2] * 16 * tiles[-1] * 16
        assert nbytes == weights * (k16 // 16) // 8, (what, name, shape, nbytes)
        for kind in ("suh", "svh"):
            assert params[kind][0] == "torch.float16", (what, name, kind, params[kind])
        total = sum(b for _, _, b in params.values())
        assert total < weights * 2 * 0.8, f"{what} {name}: {total} bytes held, a bf16 weight would be {weights * 2}"


def test_head_and_wo_a_are_held_as_packed_exl3_tensors(tp1, tp2):
    _check_packed(tp1["load"]["packed"], "TP=1")
    for r, rank in enumerate(tp2):
        _check_packed(rank["load"]["packed"], f"TP=2 rank {r}")
    head = tp1["load"]["packed"]["language_model.lm_head"]["trellis"][2]
    halves = [rank["load"]["packed"]["language_model.lm_head"]["trellis"][2] for rank in tp2]
    assert sum(halves) == head and halves[0] == halves[1], (head, halves)  # vocab-sharded, not replicated
    wo_a = tp1["load"]["packed"]["language_model.model.layers.0.attn.wo_a"]["trellis"][1][0]
    assert [rank["load"]["packed"]["language_model.model.layers.0.attn.wo_a"]["trellis"][1][0] for rank in tp2] \
        == [wo_a // 2] * 2  # each rank holds its half of the groups


def test_engram_rows_come_from_the_table_file_through_the_hook(tp1, tiny):
    from safetensors.torch import load_file

    table = load_file(str(tiny / "dense" / "model.safetensors"))
    outs = tp1["outputs"]
    for key in [k for k in outs if k.startswith("engram_rows:")]:
        layer = int(key.split(":")[1])
        ids = outs[f"engram_ids:{layer}"]
        want = classes.engram_reference(table, layer, ids, 0, ids.shape[1])
        _close(outs[key], want, key)


# How each EXL3 linear's rank outputs reassemble the TP=1 output.
REDUCED = ("attn.wo_b",)  # row-parallel: all-reduced, equal on every rank
PARTIAL = ("shared_experts.down_proj",)  # row-parallel without its reduction (the MoE block all-reduces)
REPLICATED = ("fused_wqa_wkv", "indexer.wq_b", "engram.wkv")  # disable_tp / replicated / gather_output
MERGED = ("gate_up_proj",)  # column-parallel per sub-linear: [gate_r, up_r] on rank r


def _reassemble(name: str, ranks: list[torch.Tensor]) -> torch.Tensor:
    if name.endswith(REDUCED) or name.endswith(REPLICATED):
        for r in ranks[1:]:
            _close(r, ranks[0], f"{name} rank outputs", rel=1e-6)
        return ranks[0]
    if name.endswith(PARTIAL):
        return torch.stack(ranks).sum(0)
    if name.endswith(MERGED):
        halves = [r.chunk(2, -1) for r in ranks]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], -1)
    return torch.cat(ranks, -1)  # column-parallel


def test_tp2_equals_tp1(tp1, tp2):
    one = tp1["outputs"]
    for key, want in one.items():
        if key == "logits":  # gathered on rank 0
            _close(tp2[0]["outputs"][key], want, f"TP=2 {key}", rel=2e-2)
            continue
        ranks = [r["outputs"][key] for r in tp2]
        if key.startswith("o_proj:"):  # wo_b all-reduces: every rank has the whole output
            _close(ranks[0], ranks[1], f"TP=2 {key} ranks", rel=1e-6)
            _close(ranks[0], want, f"TP=2 {key}", rel=2e-2)
        elif key.startswith("linear:"):
            _close(_reassemble(key, ranks), want, f"TP=2 {key}", rel=2e-2)
        elif key.startswith("moe:"):
            _close(ranks[0], ranks[1], f"TP=2 {key} ranks", rel=1e-6)
            _close(ranks[0], want, f"TP=2 {key}", rel=2e-2)
        elif key.startswith("engram_rows:"):
            _close(torch.cat(ranks, 1), want, f"TP=2 {key}")
    dense = tp1["load"]["dense"]
    for key, want in dense.items():
        ranks = [r["load"]["dense"][key] for r in tp2]
        got = ranks[0] if key.endswith(("indexer.wk", "fused_wkv_wgate")) else torch.cat(ranks, 0)
        _close(got, want, f"TP=2 {key}")
    for r in tp2:
        assert r["load"]["never_loaded"] == []


def test_a_full_width_input_to_a_row_parallel_layer_raises_at_tp2(tp2):
    for r in tp2:
        assert "does not end in this rank's input width" in (r["width_error"] or ""), r["width_error"]


def test_the_dspark_stage_loads_into_the_draft_model_with_exl3(tp1):
    """vLLM's VL wrapper drops `mtp.*`; its `dspark` draft model (DSparkDeepseekV4ForCausalLM) loads them:
    built with the target's exl3 config, it consumes every `mtp.*` tensor, its linears and MoE get EXL3
    methods (wo_a the grouped one, held packed) and match the dense twin's draft (o-projection included)."""
    draft, twin = tp1["draft"], tp1["draft_twin"]
    assert draft["not_consumed"] == [] and draft["never_loaded"] == [], (draft["not_consumed"], draft["never_loaded"])
    methods = draft["methods"]
    assert methods["model.main_proj"] == "Exl3LinearMethod"
    layers = {m.split(".attn.")[0] for m in methods if ".attn." in m}
    assert layers, methods
    for layer in layers:
        for leaf in ("attn.fused_wqa_wkv", "attn.wq_b", "attn.wo_b", "ffn.shared_experts.gate_up_proj",
                     "ffn.shared_experts.down_proj"):
            assert methods[f"{layer}.{leaf}"] == "Exl3LinearMethod", (layer, leaf)
        assert methods[f"{layer}.ffn.experts.routed_experts"] == "Exl3MoEMethod"
        assert methods[f"{layer}.attn.wo_a"] == "Exl3GroupedMethod"
        assert draft["packed"][f"{layer}.attn.wo_a"]["trellis"][0] == "torch.int16"
    assert any(k.startswith("o_proj:") for k in draft["outputs"]) and len(draft["outputs"]) >= 8
    for key, want in twin["outputs"].items():
        _close(draft["outputs"][key], want, f"draft {key}", rel=1e-3)
