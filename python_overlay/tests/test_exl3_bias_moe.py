"""EXL3 biases (linear and MoE) and the CUDA MoE back end's routing logic, on the CPU.

The CUDA MoE class (`cuda_backend.Exl3CudaMoE`) is driven here with a stand-in for
exllamav3's extension whose `exl3_gemm` is the reference `forward`, so routing,
expert maps, router weights, biases and the TP=2 rule "down bias once" are
checked without a GPU; python_overlay/tests/gpu/exl3_ground_truth.py runs the same class on
the real kernel.
"""

from __future__ import annotations

import pytest
import torch

from spark_overlay.exl3 import MARKER_VALUES, Exl3FormatError, forward, random_trellis
from spark_overlay.exl3.backends.cuda_backend import Exl3CudaMoE
from spark_overlay.exl3.format.shards import ShardSpec, check_part, decode_shard, rank_part

MUL1 = torch.tensor(MARKER_VALUES["mul1"], dtype=torch.int32)


def make(n_in, n_out, k, seed, bias=True):
    gen = torch.Generator().manual_seed(seed)
    kp, np_ = -(-n_in // 128) * 128, -(-n_out // 128) * 128
    trellis, _ = random_trellis(kp // 16, np_ // 16, k, gen)
    parts = {
        "trellis": trellis,
        "suh": (torch.randn(kp, generator=gen) * 0.02).to(torch.float16),
        "svh": torch.where(torch.rand(np_, generator=gen) < 0.5, -1.0, 1.0).to(torch.float16),
        "mul1": MUL1,
    }
    if bias:
        b = (torch.randn(np_, generator=gen) * 0.1).to(torch.float16)
        b[n_out:] = 0  # exllamav3 zero-pads
        parts["bias"] = b
    return parts


def load(spec, tensors):
    parts = {}
    for kind, t in tensors.items():
        check_part(spec, kind, t)
        parts[kind] = rank_part(spec, kind, t)
    return parts


def linear(spec, parts, x):
    """What the vLLM method computes for one rank: x @ W_rank.T (+ the rank's bias where vLLM adds it)."""
    return x @ decode_shard(spec, parts, "mul1").T


def test_column_parallel_bias_slices_with_the_output():
    n_in, n_out = 256, 320  # out padded to 384: the bias is too
    tensors = make(n_in, n_out, 3, seed=1)
    x = torch.randn(4, n_in, generator=torch.Generator().manual_seed(2))
    ref = forward(x, tensors["trellis"], tensors["suh"], tensors["svh"], "mul1", tensors["bias"], n_in, n_out)
    specs = [ShardSpec("p", n_in, n_out, (0, n_in), r) for r in ((0, 256), (256, 320))]
    ranks = []
    for s in specs:
        parts = load(s, tensors)
        assert parts["bias"].shape == (s.out_range[1] - s.out_range[0],)
        ranks.append(linear(s, parts, x) + parts["bias"].float())
    y = torch.cat(ranks, -1)
    assert (y - ref).abs().max() <= 1e-3 * ref.abs().max()


def test_row_parallel_bias_is_added_once_after_the_sum():
    n_in, n_out = 512, 256
    tensors = make(n_in, n_out, 4, seed=3)
    x = torch.randn(4, n_in, generator=torch.Generator().manual_seed(4))
    ref = forward(x, tensors["trellis"], tensors["suh"], tensors["svh"], "mul1", tensors["bias"])
    specs = [ShardSpec("p", n_in, n_out, (r * 256, (r + 1) * 256), (0, n_out)) for r in range(2)]
    parts = [load(s, tensors) for s in specs]
    assert all(torch.equal(p["bias"], tensors["bias"]) for p in parts)  # every rank holds it whole
    partial = [linear(s, p, x[:, s.in_range[0] : s.in_range[1]]) for s, p in zip(specs, parts)]
    once = partial[0] + parts[0]["bias"].float() + partial[1]  # vLLM: bias on rank 0 only
    assert (once - ref).abs().max() <= 1e-3 * ref.abs().max()
    twice = once + parts[1]["bias"].float()
    assert (twice - ref).abs().max() > 1e-2 * ref.abs().max()


def test_bias_shape_and_dtype_are_checked():
    spec = ShardSpec("model.layers.0.self_attn.q_proj", 256, 320, (0, 256), (0, 320))
    with pytest.raises(Exl3FormatError, match=r"q_proj\.bias: shape \[320\] does not match \[384\]"):
        check_part(spec, "bias", torch.zeros(320, dtype=torch.float16))
    with pytest.raises(Exl3FormatError, match=r"q_proj\.bias: dtype torch\.float32"):
        check_part(spec, "bias", torch.zeros(384))


def test_bias_slot_places_fused_shards():
    vllm_linear = pytest.importorskip("spark_overlay.exl3.vllm.linear")
    OutputShard = vllm_linear.OutputShard
    # QKV at TP=2, rank 1: q 256 of 512, k/v 128 of 256 each.
    shards = [
        OutputShard("q", ShardSpec("q_proj", 256, 512, (0, 256), (256, 512)), 256),
        OutputShard("k", ShardSpec("k_proj", 256, 256, (0, 256), (128, 256)), 128),
        OutputShard("v", ShardSpec("v_proj", 256, 256, (0, 256), (128, 256)), 128),
    ]
    v = torch.arange(256, dtype=torch.float16)
    offset, part = vllm_linear.bias_slot(shards, "v", v)
    assert offset == 384 and torch.equal(part, v[128:])
    with pytest.raises(Exl3FormatError, match="shard id 'x'"):
        vllm_linear.bias_slot(shards, "x", v)


class ReferenceExt:
    """Stands in for exllamav3_ext: exl3_gemm computed by the reference decoder (float32, then fp16)."""

    calls = 0

    def exl3_gemm(self, x, trellis, y, suh, xh, svh, force_shape, mcg, mul1, graph):
        assert not mcg and mul1
        ReferenceExt.calls += 1
        y.copy_(forward(x.float(), trellis, suh, svh, "mul1").to(y.dtype))


def moe_setup(experts=4, hidden=256, inter=256, seed=10):
    packs = [
        {
            "w1": make(hidden, inter, 3, seed + 3 * e),
            "w3": make(hidden, inter, 3.5, seed + 3 * e + 1),
            "w2": make(inter, hidden, 4, seed + 3 * e + 2),
        }
        for e in range(experts)
    ]

    def rank(r, tp):
        per = inter // tp
        out = []
        for e, p in enumerate(packs):
            shards = {}
            for sid, t in p.items():
                if sid == "w2":
                    spec = ShardSpec(f"experts.{e}.down_proj", inter, hidden, (r * per, (r + 1) * per), (0, hidden))
                else:
                    spec = ShardSpec(f"experts.{e}.{sid}", hidden, inter, (0, hidden), (r * per, (r + 1) * per))
                shards[sid] = (spec, load(spec, t))
            out.append(shards)
        return out

    return packs, rank


def reference_moe(packs, x, weights, ids, hidden):
    out = torch.zeros(x.shape[0], hidden)
    for e, p in enumerate(packs):
        w = (weights * (ids == e)).sum(-1, keepdim=True)
        f = {sid: forward(x.float(), t["trellis"], t["suh"], t["svh"], "mul1", t["bias"]) for sid, t in p.items() if sid != "w2"}
        h = torch.nn.functional.silu(f["w1"]) * f["w3"]
        d = p["w2"]
        out += w * forward(h, d["trellis"], d["suh"], d["svh"], "mul1", d["bias"])
    return out


def test_cuda_moe_loop_tp2_equals_the_reference_and_adds_the_down_bias_once():
    packs, rank = moe_setup()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 256, generator=gen).to(torch.float16)
    weights, ids = torch.topk(torch.softmax(torch.randn(6, 4, generator=gen), -1), 2, -1)
    ref = reference_moe(packs, x, weights, ids, 256)
    ext = ReferenceExt()
    layers = [Exl3CudaMoE(rank(r, 2), "mul1", ext, "cpu", add_down_bias=r == 0) for r in range(2)]
    y = sum(layer(x, weights, ids).float() for layer in layers)
    rel = float((y - ref).abs().max() / ref.abs().max())
    assert rel < 5e-3, rel
    both = sum(Exl3CudaMoE(rank(r, 2), "mul1", ext, "cpu", add_down_bias=True)(x, weights, ids).float() for r in range(2))
    assert float((both - ref).abs().max() / ref.abs().max()) > 1e-2


def test_cuda_moe_expert_map_skips_other_ranks_experts():
    packs, rank = moe_setup()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 256, generator=gen).to(torch.float16)
    weights, ids = torch.topk(torch.softmax(torch.randn(5, 4, generator=gen), -1), 2, -1)
    full = rank(0, 1)
    # Expert parallel: this rank holds global experts 2 and 3 as local 0 and 1.
    layer = Exl3CudaMoE(full[2:], "mul1", ReferenceExt(), "cpu")
    expert_map = torch.tensor([-1, -1, 0, 1])
    y = layer(x, weights, ids, expert_map).float()
    keep = ids >= 2
    ref = reference_moe([packs[0], packs[1], packs[2], packs[3]], x, weights * keep, ids, 256)
    assert float((y - ref).abs().max() / ref.abs().max()) < 5e-3
    ReferenceExt.calls = 0
    none_local = torch.zeros_like(ids)  # every pick is expert 0: not on this rank
    assert torch.equal(layer(x, weights, none_local, expert_map), torch.zeros(5, 256, dtype=torch.float16))
    assert ReferenceExt.calls == 0


def test_cuda_moe_router_weight_on_input():
    packs, rank = moe_setup(experts=2)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    ids = torch.tensor([[0], [1], [0]])
    weights = torch.tensor([[0.5], [2.0], [1.0]])
    layer = Exl3CudaMoE(rank(0, 1), "mul1", ReferenceExt(), "cpu")
    y = layer(x, weights, ids, weight_on_input=True).float()
    ref = torch.cat([reference_moe(packs, (x[i : i + 1].float() * weights[i]).half(), torch.ones(1, 1), ids[i : i + 1], 256)
                     for i in range(3)])
    assert float((y - ref).abs().max() / ref.abs().max()) < 5e-3


def test_cuda_moe_refuses_unaligned_or_incomplete_experts():
    packs, rank = moe_setup(experts=1)
    shards = rank(0, 1)
    del shards[0]["w3"]
    with pytest.raises(Exl3FormatError, match="local expert 0: no EXL3 tensors for shard"):
        Exl3CudaMoE(shards, "mul1", ReferenceExt(), "cpu")
    odd = ShardSpec("experts.0.gate_proj", 256, 256, (0, 256), (0, 96))
    with pytest.raises(Exl3FormatError, match="whole 128-blocks"):
        Exl3CudaMoE([{"w1": (odd, load(odd, packs[0]["w1"])), **{k: v for k, v in rank(0, 1)[0].items() if k != "w1"}}],
                    "mul1", ReferenceExt(), "cpu")


def test_cuda_extension_missing_fails_closed(monkeypatch):
    from spark_overlay.exl3.backends import select
    import builtins

    real_import = builtins.__import__

    def no_exllamav3(name, *args, **kwargs):
        if name.startswith("exllamav3"):
            raise ImportError("No module named 'exllamav3'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_exllamav3)
    with pytest.raises(Exl3FormatError, match="EXL3 on CUDA needs exllamav3's extension"):
        select.cuda_extension()


def test_linear_bias_loader_places_checks_and_passes_other_params_through():
    vllm_linear = pytest.importorskip("spark_overlay.exl3.vllm.linear")
    from types import SimpleNamespace

    OutputShard = vllm_linear.OutputShard
    method = vllm_linear.Exl3LinearMethod(SimpleNamespace(packed_modules_mapping={}), "model.layers.0.self_attn.qkv_proj")
    layer = torch.nn.Module()
    layer.bias = torch.nn.Parameter(torch.full((512,), 7.0, dtype=torch.bfloat16), requires_grad=False)
    layer.exl3_biases = set()
    layer.exl3_shards = [
        OutputShard("q", ShardSpec("model.layers.0.self_attn.q_proj", 256, 512, (0, 256), (256, 512)), 256),
        OutputShard("k", ShardSpec("model.layers.0.self_attn.k_proj", 256, 256, (0, 256), (128, 256)), 128),
        OutputShard("v", ShardSpec("model.layers.0.self_attn.v_proj", 256, 256, (0, 256), (128, 256)), 128),
    ]
    passed = []
    load = method._bias_loader(layer, lambda param, loaded, *a, **k: passed.append((param, a)))
    other = torch.nn.Parameter(torch.zeros(3))
    load(other, torch.ones(3), "q")
    assert passed == [(other, ("q",))]
    q = torch.arange(512, dtype=torch.float16)
    v = -torch.arange(256, dtype=torch.float16)
    load(layer.bias, q, "q")
    load(layer.bias, v, "v")
    assert torch.equal(layer.bias[:256], q[256:].to(torch.bfloat16))  # converted to the layer's dtype
    assert torch.equal(layer.bias[384:], v[128:].to(torch.bfloat16))
    assert torch.equal(layer.bias[256:384].float(), torch.full((128,), 7.0))  # k not loaded yet
    with pytest.raises(Exl3FormatError, match=r"v_proj\.bias: loaded twice"):
        load(layer.bias, v, "v")
    with pytest.raises(Exl3FormatError, match=r"k_proj\.bias: shape \[200\] does not match \[256\]"):
        load(layer.bias, torch.zeros(200, dtype=torch.float16), "k")


def test_moe_biases_all_or_none_and_the_layer_must_take_them():
    vllm_moe = pytest.importorskip("spark_overlay.exl3.vllm.moe")
    from types import SimpleNamespace

    spec = lambda name: ShardSpec(name, 256, 256, (0, 256), (0, 256))  # noqa: E731
    with_b = [{sid: (spec(f"experts.{e}.{sid}"), {"trellis": None, "bias": None}) for sid in ("w1", "w3", "w2")}
              for e in range(2)]
    check = vllm_moe.Exl3MoEMethod._check_biases
    takes = SimpleNamespace(moe=SimpleNamespace(has_bias=True), prefix="model.layers.0.mlp.experts")
    takes_none = SimpleNamespace(moe=SimpleNamespace(has_bias=False), prefix="model.layers.0.mlp.experts")
    assert check(takes, with_b) is True
    with pytest.raises(Exl3FormatError, match=r"experts\.0\.w1\.bias: the checkpoint has expert biases but"):
        check(takes_none, with_b)
    del with_b[1]["w2"][1]["bias"]
    with pytest.raises(Exl3FormatError, match=r"experts\.1\.w2\.bias: missing from the checkpoint while"):
        check(takes, with_b)
    without = [{sid: (spec(f"experts.{e}.{sid}"), {"trellis": None}) for sid in ("w1", "w3", "w2")} for e in range(2)]
    assert check(takes_none, without) is False
    with pytest.raises(Exl3FormatError, match=r"experts\.0\.w1\.bias: missing from the checkpoint, but vLLM"):
        check(takes, without)
