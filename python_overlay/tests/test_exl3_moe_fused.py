"""The fused EXL3 MoE path's device-side scheduling, on the CPU with a stand-in kernel.

`cuda_moe_fused.Exl3FusedMoE` is driven with `exl3_standin.StandInExt`, whose
`exl3_moe` follows the contract of exllamav3's kernel (which experts a launch
takes, from counts, tiers and buffer rows). Checked: TP=2 halves summed equal
the float32 reference at decode and prefill sizes (chunks, every row tier, two
K groups), no host sync on the call path, every expert served by exactly one
launch with `num_active` an upper bound, and the fail-closed cases.
python_overlay/tests/gpu/exl3_moe_fused.py runs the same class on the real kernel.
"""

from __future__ import annotations

import logging

import pytest
import torch

from exl3_standin import HostSyncError, NoHostSync, StandInExt
from spark_overlay.exl3 import MARKER_VALUES, Exl3FormatError, full_weight, random_trellis
from spark_overlay.exl3.backends import cuda_backend, moe_schedule
from spark_overlay.exl3.backends.cuda_backend import Exl3CudaMoE, Exl3CudaShards
from spark_overlay.exl3.backends.cuda_moe_fused import Exl3FusedMoE, self_check_ids
from spark_overlay.exl3.format.shards import ShardSpec, rank_part

HIDDEN, INTER, EXPERTS = 256, 512, 8


def pack(n_in, n_out, k, gen, codebook="mul1", bias=False):
    trellis, _ = random_trellis(n_in // 16, n_out // 16, k, gen)
    parts = {"trellis": trellis, "suh": (torch.randn(n_in, generator=gen) * 0.05).to(torch.float16),
             "svh": torch.where(torch.rand(n_out, generator=gen) < 0.5, -1.0, 1.0).to(torch.float16)}
    if codebook != "3inst":
        parts[codebook] = torch.tensor(MARKER_VALUES[codebook], dtype=torch.int32)
    if bias:
        parts["bias"] = (torch.randn(n_out, generator=gen) * 0.1).to(torch.float16)
    return parts


@pytest.fixture(scope="module")
def packs():
    gen = torch.Generator().manual_seed(21)
    out = []
    for e in range(EXPERTS):
        ks = (2, 4, 3) if e % 4 == 3 else (3, 3, 3)  # two K groups: two launch sets
        out.append({"w1": pack(HIDDEN, INTER, ks[0], gen), "w3": pack(HIDDEN, INTER, ks[1], gen),
                    "w2": pack(INTER, HIDDEN, ks[2], gen)})
    return out


def rank_experts(packs, rank, tp):
    per = INTER // tp
    experts = []
    for e, p in enumerate(packs):
        shards = {}
        for sid, proj in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            if sid == "w2":
                spec = ShardSpec(f"experts.{e}.{proj}", INTER, HIDDEN, (rank * per, (rank + 1) * per), (0, HIDDEN))
            else:
                spec = ShardSpec(f"experts.{e}.{proj}", HIDDEN, INTER, (0, HIDDEN), (rank * per, (rank + 1) * per))
            shards[sid] = (spec, {kind: rank_part(spec, kind, t) for kind, t in p[sid].items()})
        experts.append(shards)
    return experts


def fused_layer(packs, rank=0, tp=1, max_rows=128, ext=None, codebook="mul1", self_check=True):
    ext = ext or StandInExt()
    loop = Exl3CudaMoE(rank_experts(packs, rank, tp), codebook, ext, "cpu", add_down_bias=rank == 0)
    if hasattr(ext, "register"):
        ext.register(loop)
    layer = Exl3FusedMoE(loop, ext, "cpu", max_rows, "model.layers.3.mlp.experts", self_check=self_check, top_k=3)
    return layer, ext


@pytest.fixture(scope="module")
def uniform():
    """One K for every expert: the decode kernel (exl3_moe_coop) applies."""
    gen = torch.Generator().manual_seed(22)
    return [{"w1": pack(HIDDEN, INTER, 3, gen), "w3": pack(HIDDEN, INTER, 3, gen), "w2": pack(INTER, HIDDEN, 4, gen)}
            for _ in range(EXPERTS)]


def reference(packs, x, weights, ids):
    dense = [{sid: full_weight(p[sid]["trellis"], p[sid]["suh"], p[sid]["svh"], "mul1") for sid in p} for p in packs]
    out = torch.zeros(x.shape[0], HIDDEN)
    for e, d in enumerate(dense):
        w = (weights * (ids == e)).sum(-1, keepdim=True)
        h = torch.nn.functional.silu(x @ d["w1"]) * (x @ d["w3"])
        out += w * (h @ d["w2"])
    return out


def routing(tokens, top_k=3, seed=0, skew=False):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, EXPERTS, generator=gen)
    if skew:
        logits[:, 0] += 6.0  # expert 0 in every token: the widest tiers
    weights, ids = torch.topk(torch.softmax(logits, -1), top_k, -1)
    x = torch.randn(tokens, HIDDEN, generator=gen).to(torch.float16)
    return x, weights, ids


@pytest.mark.parametrize("tokens,max_rows", [(1, 24), (5, 24), (40, 24), (40, 128), (100, 128), (150, 64)])
def test_tp2_fused_equals_the_float32_reference(packs, tokens, max_rows):
    x, w, ids = routing(tokens, skew=tokens > 20, seed=tokens)
    ref = reference(packs, x.float(), w, ids)
    ranks = [fused_layer(packs, r, 2, max_rows)[0] for r in range(2)]
    y = sum(layer(x, w, ids).float() for layer in ranks)
    assert (y - ref).abs().max() <= 5e-3 * ref.abs().max()


@pytest.mark.parametrize("tokens", [1, 3, 8, 9, 30, 64, 65])
def test_decode_kernel_takes_up_to_64_rows_of_a_uniform_k_layer(uniform, tokens):
    x, w, ids = routing(tokens, seed=40 + tokens)
    ref = reference(uniform, x.float(), w, ids)
    ranks = [fused_layer(uniform, r, 2)[0] for r in range(2)]
    assert all(layer.coop is not None for layer in ranks)
    for layer in ranks:
        layer.ext.launches.clear()
    with NoHostSync():
        y = sum(layer(x, w, ids).float() for layer in ranks)
    assert (y - ref).abs().max() <= 5e-3 * ref.abs().max()
    used = {bool(launch.get("coop")) for layer in ranks for launch in layer.ext.launches}
    assert used == {tokens <= moe_schedule.DECODE_MAX_ROWS}
    # Another rank's experts (expert map) need the sorted path: the decode kernel reads global ids.
    emap = torch.arange(EXPERTS)
    ranks[0].ext.launches.clear()
    ranks[0](x, w, ids, expert_map=emap)
    assert not any(launch.get("coop") for launch in ranks[0].ext.launches)


def test_mixed_k_layers_skip_the_decode_kernel(packs):
    assert fused_layer(packs)[0].coop is None


def test_no_host_sync_and_every_expert_in_exactly_one_launch(packs):
    layer, ext = fused_layer(packs, max_rows=128)
    x, w, ids = routing(90, skew=True, seed=3)
    ext.launches.clear()
    with NoHostSync():
        layer(x, w, ids)
    counts = torch.bincount(ids.reshape(-1), minlength=EXPERTS).tolist()
    served = {}
    for launch in ext.launches:
        assert len(launch["experts"]) <= launch["num_active"]  # the bound sizes the grid, never too small
        for e, n in launch["experts"]:
            assert e not in served, f"expert {e} served twice"
            assert launch["count_lo"] <= n <= launch["count_hi"] <= launch["rows"]
            served[e] = n
    assert served == {e: n for e, n in enumerate(counts) if n}
    assert {launch["m_tile"] for launch in ext.launches} == {16, 32, 64}  # 90 rows reach every tier
    assert {launch["k"] for launch in ext.launches} == {(3.0, 3.0, 3.0), (2.0, 4.0, 3.0)}


def test_the_no_host_sync_check_can_fail(packs):
    layer, _ = fused_layer(packs)
    x, w, ids = routing(4)
    with pytest.raises(HostSyncError, match="boolean-mask|bincount|tolist"), NoHostSync():
        layer.loop(x, w, ids)  # the loop reads counts on the host


def test_route_maps_other_ranks_experts_to_the_sentinel_and_keeps_token_order():
    ids = torch.tensor([[5, 1], [1, 7], [2, 5]])
    weights = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]])
    expert_map = torch.tensor([-1, 0, 1, -1, -1, 2, -1, -1])  # global 1, 2, 5 are local 0, 1, 2
    count, token_sorted, weight_sorted = moe_schedule.route(ids, weights, 3, expert_map)
    assert count.tolist() == [2, 1, 2, 1]  # last bin: global 7 (another rank)
    assert token_sorted.tolist()[:5] == [0, 1, 2, 0, 2]
    assert weight_sorted.dtype == torch.float16
    assert weight_sorted[:5].float().tolist() == pytest.approx([0.4, 0.7, 0.5, 0.6, 0.5], abs=1e-3)


def test_tiers_and_plans_are_pure_functions_of_shapes():
    tiers = moe_schedule.tiers(16, 1536, mul1=True)
    assert [(t.count_lo, t.count_hi, t.m_tile, t.groups, t.rows) for t in tiers] == [
        (1, 16, 16, 16, 16), (17, 32, 32, 16, 32), (33, 64, 64, 16, 64), (65, 1536, 64, 4, 1536)]
    assert moe_schedule.buffer_rows(tiers) == 4 * 1536
    assert {t.m_tile for t in moe_schedule.tiers(16, 1536, mul1=False)} == {16}
    small = moe_schedule.tiers(6, 24, mul1=True)  # a GB10 (48 SMs), capture sizes up to 24
    assert [(t.count_lo, t.count_hi, t.m_tile, t.rows) for t in small] == [(1, 16, 16, 16), (17, 24, 32, 32)]
    one = moe_schedule.plan(1, 6, 384, tiers)
    assert [(p.tier.count_lo, p.num_active) for p in one] == [(1, 6)]
    many = moe_schedule.plan(1536, 6, 384, tiers)
    assert [(p.tier.count_lo, p.num_active) for p in many] == [(65, 141), (33, 279), (17, 384), (1, 384)]
    assert moe_schedule.chunks(3100, 1536) == [(0, 1536), (1536, 3072), (3072, 3100)]
    with pytest.raises(ValueError, match="chunk"):
        moe_schedule.plan(1537, 6, 384, tiers)


def test_router_weight_on_input_top1(packs):
    layer, _ = fused_layer(packs)
    x, w, ids = routing(6, top_k=1, seed=9)
    want = layer.loop(x, w, ids, weight_on_input=True).float()
    got = layer(x, w, ids, weight_on_input=True).float()
    assert (got - want).abs().max() <= 1e-2 * want.abs().max()
    with pytest.raises(Exl3FormatError, match="top-1"):
        layer(*routing(2, top_k=2), weight_on_input=True)


def test_self_check_ids_reach_every_tier():
    ids = self_check_ids(list(range(8)), 8, 6, 70)
    assert ids.shape == (70, 6)
    assert all(len(set(r)) == 6 for r in ids.tolist())
    counts = torch.bincount(ids.reshape(-1), minlength=8).tolist()
    assert counts[0] == 70 and 33 <= counts[1] <= 64 and 17 <= counts[2] <= 32


def test_3inst_experts_fail_closed_naming_the_tensor():
    gen = torch.Generator().manual_seed(5)
    packs = [{"w1": pack(HIDDEN, INTER, 3, gen, "3inst"), "w3": pack(HIDDEN, INTER, 3, gen, "3inst"),
              "w2": pack(INTER, HIDDEN, 3, gen, "3inst")} for _ in range(2)]
    with pytest.raises(Exl3FormatError, match=r"experts\.0\.gate_proj: codebook 3inst .*mcg or mul1"):
        fused_layer(packs, codebook=None)


def test_mixed_codebooks_in_one_expert_fail_closed():
    gen = torch.Generator().manual_seed(6)
    packs = [{"w1": pack(HIDDEN, INTER, 3, gen, "mcg"), "w3": pack(HIDDEN, INTER, 3, gen),
              "w2": pack(INTER, HIDDEN, 3, gen)}]
    with pytest.raises(Exl3FormatError, match=r"experts\.0\.down_proj: gate/up/down .* mcg/mul1/mul1"):
        fused_layer(packs, codebook=None)


def test_missing_symbol_and_abi_mismatch_fail_closed(packs):
    class NoMoe:
        def exl3_gemm(self, *a):
            return StandInExt().exl3_gemm(*a)

    with pytest.raises(Exl3FormatError, match="model.layers.3.mlp.experts: .*lacks exl3_moe, exl3_moe_max_concurrency"):
        fused_layer(packs, ext=NoMoe())

    class OldAbi(StandInExt):
        def exl3_moe(self, x, out, count):  # another signature: pybind would raise TypeError
            raise TypeError("exl3_moe(): incompatible function arguments")

    with pytest.raises(Exl3FormatError, match="exl3_moe rejected the call .*ABI mismatch"):
        fused_layer(packs, ext=OldAbi())

    class Wrong(StandInExt):
        def exl3_moe(self, *args):
            super().exl3_moe(*args)
            args[1].mul_(0.5)  # a kernel that computes something else

    with pytest.raises(Exl3FormatError, match=r"experts\.\d+\.gate_proj: exllamav3's fused MoE kernel disagrees"):
        fused_layer(packs, ext=Wrong())


def test_biases_fall_back_to_the_loop_logged_once(caplog):
    gen = torch.Generator().manual_seed(7)
    packs = [{"w1": pack(HIDDEN, INTER, 3, gen, bias=True), "w3": pack(HIDDEN, INTER, 3, gen, bias=True),
              "w2": pack(INTER, HIDDEN, 3, gen, bias=True)} for _ in range(4)]
    layer, ext = fused_layer(packs)
    assert layer.fallback == "expert biases (exllamav3's fused kernel has none)"
    x = torch.randn(3, HIDDEN).to(torch.float16)
    w, ids = torch.full((3, 2), 0.5), torch.tensor([[0, 1], [1, 2], [3, 0]])
    with caplog.at_level(logging.WARNING, logger="vllm.spark_overlay.exl3"):
        first = layer(x, w, ids)
        layer(x, w, ids)
    assert torch.equal(first, layer.loop(x, w, ids))
    warned = [r.getMessage() for r in caplog.records if "fused MoE kernel not used" in r.getMessage()]
    assert warned == ["exl3: model.layers.3.mlp.experts: fused MoE kernel not used "
                      "(expert biases (exllamav3's fused kernel has none)); per-expert loop"]
    assert not ext.launches


def test_capture_guards(packs, monkeypatch):
    layer, _ = fused_layer(packs)
    gate: Exl3CudaShards = layer.loop.layers[0]["w1"]
    gate.pretune([1, 4], "cpu")
    monkeypatch.setattr(cuda_backend, "capturing", lambda: True)
    gate(torch.zeros(4, HIDDEN, dtype=torch.float16))  # pretuned size: fine inside a capture
    with pytest.raises(Exl3FormatError, match=r"experts\.0\.gate_proj: a CUDA graph captures exl3_gemm at 3 rows"):
        gate(torch.zeros(3, HIDDEN, dtype=torch.float16))
    with pytest.raises(Exl3FormatError, match="per-expert EXL3 MoE loop .* cannot run inside a CUDA graph"):
        layer.loop(*routing(2))
    layer(*routing(2))  # the fused path captures
