"""The own decode GEMV of the dense EXL3 linears (issue 30 item 5), on the CPU with the stand-in exl3_gemm.

`Exl3CudaShards` sends calls of up to the own GEMV's serve rows to it where SPARK_EXL3_MOE_COOP is
"own" (the default) and its load-time check agrees with exl3_gemm; everything else keeps exl3_gemm.
The kernel itself runs on a GPU only: python_overlay/tests/gpu/exl3_linear_own.py checks and times it.
"""

from __future__ import annotations

import logging

import pytest
import torch

from exl3_standin import StandInExt
from spark_overlay.exl3 import Exl3FormatError
from spark_overlay.exl3.backends import cuda_backend, select
from spark_overlay.exl3.backends.cuda_backend import Exl3CudaShards
from spark_overlay.exl3.backends.cuda_decode import own_linear
from spark_overlay.exl3.format.shards import ShardSpec
from test_exl3_moe_fused import pack

N_IN, N_OUT = 256, 128
NAME = "model.layers.0.self_attn.wq_a"


def layer(k=3, codebook="mul1", n_in=N_IN, n_out=N_OUT, seed=41) -> Exl3CudaShards:
    parts = pack(n_in, n_out, k, torch.Generator().manual_seed(seed), codebook)
    spec = ShardSpec(NAME, n_in, n_out, (0, n_in), (0, n_out))
    return Exl3CudaShards([spec], [parts], codebook, StandInExt(), "cpu")


class StandInOwn:
    """Stands in for OwnDecodeLinear: exl3_gemm's result (the stand-in's) scaled by `scale`, bias added."""

    def __init__(self, lin: Exl3CudaShards, scale: float, serve_rows: int = 8):
        self.lin, self.scale, self.serve_rows, self.calls = lin, scale, serve_rows, []

    def __call__(self, x, bias=None):
        self.calls.append(x.shape[0])
        y = (self.lin.gemm(x).float() * self.scale).to(x.dtype)
        return y if bias is None else y + bias


def stand_in(monkeypatch, scale: float) -> list:
    made = []

    def build(lin):
        made.append(StandInOwn(lin, scale))
        return made[-1]

    monkeypatch.setattr(own_linear, "build", build)
    return made


@pytest.mark.parametrize("raw,want", [(None, "own"), ("own", "own"), ("1", "exllamav3"), ("0", "exllamav3")])
def test_the_moe_switch_selects_the_linear_kernel(raw, want):
    env = {} if raw is None else {select.MOE_COOP_ENV: raw}
    assert select.linear_decode(env) == want


def test_a_bad_switch_value_fails_naming_it():
    with pytest.raises(Exl3FormatError, match="SPARK_EXL3_MOE_COOP='fast' is not 0, 1 or own"):
        select.linear_decode({select.MOE_COOP_ENV: "fast"})


def test_supports_mul1_integer_k_2_to_6_on_whole_blocks():
    for k in (2, 3, 4, 5, 6):
        lin = layer(k)
        assert own_linear.supports(lin.shards, lin.in_features, lin.padded_in) is None
    lin = layer(8)
    want = "K=8 (the own GEMV takes an integer K in 2..6)"
    assert own_linear.supports(lin.shards, lin.in_features, lin.padded_in) == want
    lin = layer(3, "mcg")
    assert own_linear.supports(lin.shards, lin.in_features, lin.padded_in) == "codebook mcg (the own GEMV decodes mul1)"
    lin = layer(3)
    assert "input width 250 (padded 256" in own_linear.supports(lin.shards, 250, 256)
    lin.shards[0]["pad_rows"] = 16
    assert "output width 128" in own_linear.supports(lin.shards, lin.in_features, lin.padded_in)


def test_split_fills_one_wave_and_keeps_tiles_per_warp():
    # 5120 -> 1152: 18 working blocks of 64 columns a part at 1 row -> 15 parts of 264; at 16 rows (2 runs) 7
    assert own_linear.split_parts(1, 5120, 1152, True, 264) == 15
    assert own_linear.split_parts(16, 5120, 1152, True, 264) == 7
    assert own_linear.split_parts(1, 5120, 1152, False, 264) == 7
    # 5120 -> 512 would want 33 parts; 4 k-tiles per warp of 2 allow 40
    assert own_linear.split_parts(1, 5120, 512, True, 264) == 33
    assert own_linear.split_parts(1, 256, 128, False, 264) == 1  # 16 k-tiles, 4 per warp of 4: one part
    assert own_linear.split_parts(64, 1024, 16384, True, 264) == 1


def test_serve_rows_follow_the_shape():
    assert own_linear.serve_rows(5120, 1152) == own_linear.SERVE_ROWS_DEEP == 32
    assert own_linear.serve_rows(1152, 5120) == own_linear.SERVE_ROWS_WIDE == 8


def test_agreeing_own_gemv_serves_calls_up_to_its_rows(monkeypatch):
    monkeypatch.delenv(select.MOE_COOP_ENV, raising=False)
    made = stand_in(monkeypatch, 1.0)
    lin = layer()
    cuda_backend.wire_own(lin)
    assert lin.own is made[0]
    checked = list(made[0].calls)
    assert checked == [1, 2, 3, 8]  # the load-time check's row counts (serve rows 8 among them)
    x = torch.randn(2, 3, N_IN, dtype=torch.float16)
    bias = torch.randn(N_OUT, dtype=torch.float16)
    y = lin(x, bias)
    assert made[0].calls == checked + [6] and y.shape == (2, 3, N_OUT) and y.dtype == torch.float16
    assert torch.allclose(y.float(), (lin.gemm(x.reshape(6, N_IN)).float() + bias.float()).reshape(2, 3, N_OUT),
                          atol=1e-2)
    lin(torch.randn(9, N_IN, dtype=torch.float16))
    assert made[0].calls == checked + [6]  # 9 rows: exl3_gemm


@pytest.mark.parametrize("raw", ["1", "0"])
def test_the_switch_at_exllamav3_keeps_exl3_gemm(monkeypatch, raw):
    monkeypatch.setenv(select.MOE_COOP_ENV, raw)
    made = stand_in(monkeypatch, 1.0)
    lin = layer()
    cuda_backend.wire_own(lin)
    assert lin.own is None and made == []


def test_disagreeing_own_gemv_under_the_default_falls_back_logged(monkeypatch, caplog):
    monkeypatch.delenv(select.MOE_COOP_ENV, raising=False)
    made = stand_in(monkeypatch, 1.5)
    lin = layer()
    with caplog.at_level(logging.WARNING, logger="vllm.spark_overlay.exl3"):
        cuda_backend.wire_own(lin)
    assert lin.own is None
    assert (f"{NAME}: spark-kit's own decode GEMV disagrees with exl3_gemm at 1 rows (max rel diff 5.00e-01 > 0.01); "
            "this layer uses exl3_gemm (set SPARK_EXL3_MOE_COOP=1 for every layer)") in caplog.text
    calls = list(made[0].calls)
    lin(torch.randn(1, N_IN, dtype=torch.float16))
    assert made[0].calls == calls


def test_disagreeing_own_gemv_set_explicitly_fails_the_load(monkeypatch):
    monkeypatch.setenv(select.MOE_COOP_ENV, "own")
    stand_in(monkeypatch, 1.5)
    with pytest.raises(Exl3FormatError, match=rf"{NAME}: spark-kit's own decode GEMV disagrees with exl3_gemm at 1 "
                       r"rows \(max rel diff 5\.00e-01 > 0\.01\); set SPARK_EXL3_MOE_COOP=1 to use exllamav3's kernels"):
        cuda_backend.wire_own(layer())


def test_no_cuda_device_or_no_build_keeps_exl3_gemm_logged(monkeypatch, caplog):
    monkeypatch.setenv(select.MOE_COOP_ENV, "own")
    lin = layer()
    with caplog.at_level(logging.WARNING, logger="vllm.spark_overlay.exl3"):
        cuda_backend.wire_own(lin)  # the real build: the tensors are on the CPU
    assert lin.own is None and f"{NAME}: own decode GEMV not used (cpu is not a CUDA device); exl3_gemm" in caplog.text

    def no_nvcc(_lin):
        raise Exl3FormatError("exl3 decode kernel: nvcc not found (put the CUDA toolkit's bin on PATH); it builds once")

    monkeypatch.setattr(own_linear, "build", no_nvcc)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.spark_overlay.exl3"):
        cuda_backend.wire_own(lin)
    assert lin.own is None and "own decode GEMV not used (exl3 decode kernel: nvcc not found" in caplog.text


def test_a_layer_it_cannot_take_keeps_exl3_gemm_without_building(monkeypatch):
    monkeypatch.delenv(select.MOE_COOP_ENV, raising=False)
    made = stand_in(monkeypatch, 1.0)
    lin = layer(8)
    cuda_backend.wire_own(lin)
    assert lin.own is None and made == []


class RecordingLib:
    """Records spark_decode_linear's arguments (the kernel itself runs on a GPU only)."""

    def __init__(self):
        self.calls = []

    def spark_decode_linear(self, *args):
        self.calls.append(args)
        return 0


def recorded(monkeypatch, lin: Exl3CudaShards, x, bias=None):
    lib = RecordingLib()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(own_linear.loader, "load", lambda arch: lib)
    monkeypatch.setattr(own_linear, "_bind", lambda found: found)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 7})())
    own = own_linear.OwnDecodeLinear(lin.shards, lin.in_features, torch.device("cpu"))
    y = own(x, bias)
    names = ("x", "x_dt", "out", "out_dt", "out_ld", "bias", "bias_dt", "suh", "svh", "tables", "ids", "rows",
             "n_in", "n_out", "k", "xh", "sums", "dd", "counters", "parts", "flags", "stream")
    return own, y, [dict(zip(names, call)) for call in lib.calls]


def test_each_shard_writes_its_columns_of_one_output(monkeypatch):
    gen = torch.Generator().manual_seed(43)
    specs = [ShardSpec(f"{NAME}.{i}", N_IN, N_OUT, (0, N_IN), (0, N_OUT)) for i in range(2)]
    parts = [pack(N_IN, N_OUT, k, gen) for k in (3, 5)]
    lin = Exl3CudaShards(specs, parts, "mul1", StandInExt(), "cpu")
    x = torch.randn(3, N_IN, dtype=torch.bfloat16)
    bias = torch.randn(2 * N_OUT, dtype=torch.bfloat16)
    own, y, calls = recorded(monkeypatch, lin, x, bias)
    assert y.shape == (3, 2 * N_OUT) and y.dtype == torch.bfloat16 and len(calls) == 2
    first, second = calls
    assert second["out"] - first["out"] == N_OUT * 2 and first["out_ld"] == second["out_ld"] == 2 * N_OUT
    assert second["bias"] - first["bias"] == N_OUT * 2 and first["bias_dt"] == 2 and first["x_dt"] == 2
    assert [c["k"] for c in calls] == [3, 5] and [c["n_out"] for c in calls] == [N_OUT, N_OUT]
    assert [c["suh"] for c in calls] == [s["suh"].data_ptr() for s in lin.shards]
    assert [int(t[6]) for t in own.tables] == [s["trellis"].data_ptr() for s in lin.shards]
    assert first["tables"] == own.tables[0].data_ptr() and second["tables"] == own.tables[1].data_ptr()
    assert first["rows"] == 3 and first["stream"] == 7
    assert first["flags"] == own_linear.FLAG_PDL | own_linear.FLAG_FUSED  # 3 rows: blocks of 2 n-tiles x 4 k-warps
    assert first["parts"] == own_linear.split_parts(3, N_IN, N_OUT, False, 264)


def test_one_row_on_a_wide_output_takes_the_4x2_blocks(monkeypatch):
    lin = layer(3, n_in=128, n_out=256)
    _, _, calls = recorded(monkeypatch, lin, torch.randn(1, 128, dtype=torch.float16))
    assert calls[0]["flags"] == own_linear.FLAG_PDL | own_linear.FLAG_FUSED | own_linear.FLAG_KW2
    assert calls[0]["bias"] is None and calls[0]["out_ld"] == 256
    _, _, calls = recorded(monkeypatch, lin, torch.randn(12, 128, dtype=torch.float16))
    assert calls[0]["flags"] == own_linear.FLAG_PDL | own_linear.FLAG_FUSED
    assert calls[0]["parts"] == own_linear.split_parts(12, 128, 256, False, 528)  # above 8 rows: 528 blocks
