"""The decode path of the fused EXL3 MoE (issue 30), on the CPU with the stand-in kernel.

Calls of up to 64 rows take exllamav3's decode kernel (`exl3_moe_coop`) in launches of as many
rows as its 256 slots allow (`moe_schedule.decode_chunk`); `SPARK_EXL3_MOE_COOP=own` asks for
spark-kit's own kernel (1..64 rows on sm_80+), which falls back to exllamav3's where it cannot run.
python_overlay/tests/gpu/exl3_moe_decode.py times and checks the same paths on an H200.
"""

from __future__ import annotations

import logging

import pytest
import torch

from exl3_standin import NoHostSync
from spark_overlay.exl3 import Exl3FormatError
from spark_overlay.exl3.backends import moe_schedule, select
from spark_overlay.exl3.backends.cuda_decode import own
from spark_overlay.exl3.backends.cuda_decode.coop_rows import CoopRows
from test_exl3_moe_fused import EXPERTS, HIDDEN, INTER, fused_layer, pack, reference, routing


@pytest.fixture(scope="module")
def uniform():
    gen = torch.Generator().manual_seed(31)
    return [{"w1": pack(HIDDEN, INTER, 3, gen), "w3": pack(HIDDEN, INTER, 3, gen), "w2": pack(INTER, HIDDEN, 3, gen)}
            for _ in range(EXPERTS)]


def test_decode_chunk_is_what_the_kernels_slots_allow():
    assert [moe_schedule.decode_chunk(k) for k in (1, 3, 6, 8, 300)] == [256, 85, 42, 32, 1]
    assert moe_schedule.DECODE_MAX_ROWS == 64


def coop(layer, chunk):
    return CoopRows(layer.ext, layer.tables, (3.0, 3.0, 3.0), False, True, HIDDEN, INTER, layer.top_k, chunk,
                    torch.device("cpu"), "model.layers.3.mlp.experts")


@pytest.mark.parametrize("tokens,launches", [(1, [1]), (5, [5]), (13, [5, 5, 3])])
def test_chunks_take_every_row_once_and_store_the_output(uniform, tokens, launches):
    layer, ext = fused_layer(uniform)
    rows = coop(layer, 5)
    x, w, ids = routing(tokens, seed=70 + tokens)
    ext.launches.clear()
    with NoHostSync():
        y = rows(x, w, ids)
    assert [launch["bsz"] for launch in ext.launches] == launches
    assert y.dtype == x.dtype and y.shape == (tokens, HIDDEN)
    ref = reference(uniform, x.float(), w, ids)
    assert (y.float() - ref).abs().max() <= 5e-3 * ref.abs().max()
    assert rows(x, w, ids, torch.float32).dtype == torch.float32


def test_a_chunk_beyond_the_kernels_slots_is_refused(uniform):
    layer, _ = fused_layer(uniform)
    with pytest.raises(ValueError, match="exceed the decode kernel's 256 slots"):
        coop(layer, 86)  # 86 rows x top-3 = 258 slots


def test_the_layer_routes_up_to_64_rows_through_the_decode_kernel_in_one_launch_at_top_3(uniform):
    layer, ext = fused_layer(uniform)
    assert layer.coop.chunk == 85 and layer.own is None
    x, w, ids = routing(40, seed=9)
    ext.launches.clear()
    with NoHostSync():
        layer(x, w, ids)
    assert [launch.get("bsz") for launch in ext.launches] == [40]


def test_switch_off_keeps_the_sorted_tiers(uniform, monkeypatch):
    monkeypatch.setenv(select.MOE_COOP_ENV, "0")
    layer, ext = fused_layer(uniform)
    assert layer.coop is None
    x, w, ids = routing(4, seed=2)
    ext.launches.clear()
    layer(x, w, ids)
    assert ext.launches and not any(launch.get("coop") for launch in ext.launches)


def test_own_kernel_off_cuda_falls_back_to_exllamav3s_logged(uniform, monkeypatch, caplog):
    monkeypatch.setenv(select.MOE_COOP_ENV, "own")
    with caplog.at_level(logging.WARNING, logger="vllm.spark_overlay.exl3"):
        layer, ext = fused_layer(uniform)
    assert layer.own is None and layer.coop is not None
    assert "own decode kernel not used (not a CUDA device); exllamav3's decode kernel" in caplog.text
    x, w, ids = routing(3, seed=4)
    ext.launches.clear()
    layer(x, w, ids)
    assert [launch.get("coop") for launch in ext.launches] == [True]


def test_own_kernel_gate_up_blocks_by_rows():
    # 1 row with the input Hadamard fused in: 4 k-parts of 4 x 1 blocks of 4 warps, capped per SM by the kernel
    assert own.gate_up_layout(1, fuse_in=True) == (4, False)
    assert own.gate_up_warps(1, fuse_in=True) == (4, own.CAP_AUTO)
    # 2 rows fused: the same 4 parts of 4 x 1 blocks of 4 warps, no cap, and down in blocks of 4 warps; unfused as before
    assert own.gate_up_layout(2, fuse_in=True) == (4, False)
    assert own.gate_up_warps(2, fuse_in=True) == (4, 0)
    assert [own.down_warps(r, fuse_in=True) for r in (1, 2, 4)] == [8, 4, 8]
    assert own.down_warps(2, fuse_in=False) == 8
    assert own.gate_up_warps(1, fuse_in=False) == (8, 0)
    # 4 rows unfused: blocks of 4 warps (2 n-tiles x 2 k-warps), uncapped; 3 and 8 rows keep 8-warp blocks
    assert [own.gate_up_warps(r, fuse_in=False) for r in (3, 4, 8)] == [(8, 0), (4, 0), (8, 0)]
    assert [own.gate_up_layout(r) for r in (1, 2, 4, 64)] == [(2, False), (1, False), (1, True), (1, True)]
    # the caps travel in 5 bits of the stage word each, above every stage flag
    assert own.CAP_AUTO < 32 and 1 << own.STAGE_CAP_A > own.STAGE_W2_B and own.STAGE_CAP_B == own.STAGE_CAP_A + 5


def own_kernel_on_cpu(monkeypatch, **over):
    """An OwnDecodeMoE with its served settings, built without a GPU (its layout and stage choices are pure)."""
    monkeypatch.setattr(own.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(own.loader, "load", lambda arch, defines=(): None)
    monkeypatch.setattr(own, "shared_scratch", lambda device, top_k, hidden, inter: tuple(
        own.torch.empty(n, 0) for n in (own.ROWS * top_k, 2 * own.ROWS * top_k, own.ROWS * top_k, own.ROWS * top_k, 1)))
    tables = {f"{sid}_{kind}": own.torch.zeros(384, dtype=own.torch.int64)
              for sid in ("w1", "w3", "w2") for kind in ("trellis", "suh", "svh")}
    kernel = own.OwnDecodeMoE(tables, 3, over.pop("hidden", 5120), 1152, 384, 6, "cpu")
    for name, value in over.items():
        setattr(kernel, name, value)
    return kernel


def served_call(kernel, rows: int, fuse_in: bool):
    """(fuse_in, gate/up k-parts, down k-parts, kw2_a, npw_a, npw_b) and the stage word of a call at `rows` rows"""
    layout = kernel._layout(rows, rows * 6, fuse_in)
    fuse_in, _, _, kw2_a, npw_a, npw_b = layout
    return layout, kernel._stages(rows, fuse_in, True, kw2_a, npw_a, npw_b)


def test_own_kernel_two_n_tiles_per_warp_where_measured(monkeypatch):
    def served_layout(rows, fuse_in, **over):
        return served_call(own_kernel_on_cpu(monkeypatch, **over), rows, fuse_in)[0]

    # (fuse_in, gate/up k-parts, down k-parts, kw2_a, npw_a, npw_b): 1 row fused, 2 n-tiles in both, parts doubled
    assert own.warp_tiles(1, True) == (2, 2) and own.warp_tiles(2, True) == (2, 1) and own.warp_tiles(4, False) == (1, 2)
    assert own.warp_tiles(3, False) == own.warp_tiles(8, False) == own.warp_tiles(4, True) == (1, 1)
    assert served_layout(1, True) == (True, 8, 2, False, 2, 2)
    assert served_layout(2, True) == (True, 8, 1, False, 2, 1)  # down stays in 4-warp blocks of 1 n-tile
    assert served_layout(4, False) == (False, 1, 2, True, 1, 2)  # down's 2 n-tiles: its k-parts doubled
    assert served_layout(8, False) == (False, 1, 1, True, 1, 1)
    # only in the blocks it was measured in: other warps per block, 6 blocks per SM, or no bias folding take 1
    assert served_layout(1, True, warps_a=8)[4] == 1 and served_layout(1, True, warps_b=4)[5] == 1
    assert served_layout(1, True, occ6_from=1)[5] == 1 and served_layout(1, True, nobias=False)[4:] == (1, 1)
    assert served_layout(1, True, npw_a=1, npw_b=1) == (True, 4, 1, False, 1, 1)
    # a hidden size whose doubled k-parts are not whole 128-chunks: the next that is
    assert served_layout(1, True, hidden=128 * 12)[:2] == (True, 12)
    assert served_layout(1, True, hidden=128 * 30)[:2] == (True, 10)
    # fewer 128-chunks than the doubled k-parts: the unfused 1-row layout, 1 n-tile per warp in both
    assert served_layout(1, True, hidden=128 * 7) == (False, 2, 1, False, 1, 1)


def test_own_kernel_serves_the_measured_two_n_tile_layouts(monkeypatch):
    # the served call at 1 and 2 rows is, launch for launch, the sweep's variant that was measured
    # (exl3_decode_own.NPW_VARIANTS: npw_a, npw_b, warps_b set on the served defaults)
    for rows, measured in ((1, {"npw_a": 2, "npw_b": 2, "warps_b": 8}), (2, {"npw_a": 2, "npw_b": 1, "warps_b": None})):
        served = served_call(own_kernel_on_cpu(monkeypatch), rows, True)
        assert served == served_call(own_kernel_on_cpu(monkeypatch, **measured), rows, True)
        assert served[1] & own.STAGE_NPW2_A and bool(served[1] & own.STAGE_NPW2_B) == (rows == 1)
    # 4 rows: down's 2 n-tiles on the served defaults, and the same call as the sweep's 4-warp gate/up layout
    # (exl3_decode_own.BLOCK_LAYOUTS_NO_FI (1, True, 4, 1, True, 8)) with down's 2 n-tiles
    served = served_call(own_kernel_on_cpu(monkeypatch), 4, False)
    assert served == served_call(own_kernel_on_cpu(monkeypatch, npw_a=1, npw_b=2, warps_b=8), 4, False)
    layout = {"parts_a": 1, "kw2_a": True, "warps_a": 4, "parts_b": 1, "kw2_b": True, "warps_b": 8, "cap_a": 0}
    assert served == served_call(own_kernel_on_cpu(monkeypatch, npw_b=2, **layout), 4, False)
    assert served[1] & own.STAGE_NPW2_B and not served[1] & own.STAGE_NPW2_A and served[1] & own.WARP_BITS["a"][4]
    # 64-bit stage word: the two bits above the 5-bit caps
    assert own.STAGE_NPW2_A > 31 << own.STAGE_CAP_B and own.STAGE_NPW2_B == 2 * own.STAGE_NPW2_A


def test_own_kernel_takes_one_mul1_k_in_2_to_6():
    experts = list(range(4))
    assert own.supports([("mul1", 3, 3, 3, None, experts)]) is None
    assert "codebook mcg" in own.supports([("mcg", 3, 3, 3, None, experts)])
    assert "K 3/3/4" in own.supports([("mul1", 3, 3, 4, None, experts)])
    assert "K 7/7/7" in own.supports([("mul1", 7, 7, 7, None, experts)])
    assert "different bit widths" in own.supports([("mul1", 3, 3, 3, None, [0]), ("mul1", 2, 2, 2, None, [1])])
    assert "top-9 routing" in own.supports([("mul1", 3, 3, 3, None, experts)], top_k=9)


def test_a_bad_switch_value_fails_naming_it(uniform, monkeypatch):
    monkeypatch.setenv(select.MOE_COOP_ENV, "fast")
    with pytest.raises(Exl3FormatError, match="SPARK_EXL3_MOE_COOP='fast' is not 0, 1 or own"):
        fused_layer(uniform)


class DisagreeingOwn:
    """Stands in for the own kernel object: exllamav3's decode result (the stand-in's), scaled by `scale`."""

    max_rows = serve_rows = moe_schedule.DECODE_MAX_ROWS

    def __init__(self, layer, scale: float):
        self.layer, self.scale, self.calls = layer, scale, 0

    def __call__(self, x, topk_weights, topk_ids, out=None):
        self.calls += 1
        return (self.layer.coop(x, topk_weights, topk_ids, torch.float32) * self.scale).to(x.dtype)


def own_standin(monkeypatch, scale: float) -> list:
    """Exl3FusedMoE's own kernel replaced by a DisagreeingOwn (scale 1: it agrees); the objects made, in order."""
    made = []

    def make(layer):
        made.append(DisagreeingOwn(layer, scale))
        return made[-1]

    monkeypatch.setattr("spark_overlay.exl3.backends.cuda_moe_fused.Exl3FusedMoE._own", make)
    return made


def own_default(monkeypatch):
    """The switch unset, with "own" as its default (the state the default is meant to move to)."""
    monkeypatch.delenv(select.MOE_COOP_ENV, raising=False)
    monkeypatch.setattr(select, "MOE_COOP_DEFAULT", "own")
    assert select.moe_decode() == select.DECODE_OWN and not select.moe_decode_explicit()


def test_own_kernel_agreeing_at_load_serves_the_decode_calls(uniform, monkeypatch):
    own_default(monkeypatch)
    made = own_standin(monkeypatch, 1.0)
    layer, ext = fused_layer(uniform)
    assert layer.own is made[0]
    checked = made[0].calls
    x, w, ids = routing(5, seed=11)
    ext.launches.clear()
    layer(x, w, ids)
    assert made[0].calls == checked + 1


def test_own_kernel_disagreeing_under_the_default_falls_back_to_exllamav3s_logged(uniform, monkeypatch, caplog):
    own_default(monkeypatch)
    made = own_standin(monkeypatch, 1.5)
    with caplog.at_level(logging.WARNING, logger="vllm.spark_overlay.exl3"):
        layer, ext = fused_layer(uniform)
    assert layer.own is None and layer.coop is not None
    assert "experts.0.gate_proj: spark-kit's own decode kernel disagrees with exllamav3's on this layer at 1 rows " \
        "(max rel diff 5.01e-01 > 0.01)" in caplog.text
    assert "this layer uses exllamav3's decode kernel (set SPARK_EXL3_MOE_COOP=1 for every layer)" in caplog.text
    calls = made[0].calls
    x, w, ids = routing(5, seed=12)
    ext.launches.clear()
    y = layer(x, w, ids)
    assert made[0].calls == calls and [launch.get("coop") for launch in ext.launches] == [True]
    ref = reference(uniform, x.float(), w, ids)
    assert (y.float() - ref).abs().max() <= 5e-3 * ref.abs().max()


def test_own_kernel_disagreeing_when_set_explicitly_fails_the_load(uniform, monkeypatch):
    monkeypatch.setenv(select.MOE_COOP_ENV, "own")
    own_standin(monkeypatch, 1.5)
    with pytest.raises(Exl3FormatError, match=r"experts\.0\.gate_proj: spark-kit's own decode kernel disagrees with "
                       r"exllamav3's on this layer at 1 rows \(max rel diff 5\.01e-01 > 0\.01\); set "
                       r"SPARK_EXL3_MOE_COOP=1 to use exllamav3's"):
        fused_layer(uniform)
