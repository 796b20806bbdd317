"""Reference decoder vs exllamav3 1.6.5's CUDA kernels, from fixtures written on an H200.

data/exl3_kernel_cases.safetensors comes from python_overlay/tests/gpu/exl3_ground_truth.py
(README beside it): 128x128 random valid trellises for 3inst K 1/4, mcg K 2/8,
mul1 K 3/6/1.5/3.5 with random suh/svh, the kernel's W_hat
(`ext.reconstruct`) and, for three cases, its fused full W
(`ext.reconstruct_had_slice`, fp16 intermediates).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spark_overlay.exl3 import full_weight, weight_hat

safetensors_torch = pytest.importorskip("safetensors.torch")

DATA = Path(__file__).parent / "data" / "exl3_kernel_cases.safetensors"
CASES = ["3inst_k1", "3inst_k4", "mcg_k2", "mcg_k8", "mul1_k3", "mul1_k6", "mul1_k1p5", "mul1_k3p5"]


@pytest.fixture(scope="module")
def cases():
    return safetensors_torch.load_file(str(DATA))


def test_every_case_is_present(cases):
    assert sorted({name.split(".")[0] for name in cases}) == sorted(CASES)
    assert sum(1 for name in cases if name.endswith(".w_full_fused")) == 3


@pytest.mark.parametrize("case", CASES)
def test_w_hat_bit_exact_with_kernel(cases, case):
    codebook, k = case.split("_k")
    k = float(k.replace("p", "."))
    trellis = cases[f"{case}.trellis"]
    assert trellis.shape == (8, 8, int(16 * k))
    ours = weight_hat(trellis, codebook)
    theirs = cases[f"{case}.w_hat"]
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))


@pytest.mark.parametrize("case", ["mul1_k3", "mcg_k2", "3inst_k4"])
def test_full_weight_matches_fused_kernel(cases, case):
    codebook = case.split("_k")[0]
    w = full_weight(cases[f"{case}.trellis"], cases[f"{case}.suh"], cases[f"{case}.svh"], codebook)
    kernel = cases[f"{case}.w_full_fused"].float()
    # fp16 intermediates in the fused kernel: ~1e-3 of max|W| (format doc §2.7)
    assert (w - kernel).abs().max() <= 2e-3 * kernel.abs().max()


def test_a_wrong_codebook_does_not_match(cases):
    ours = weight_hat(cases["mul1_k3.trellis"], "mcg")
    assert not torch.equal(ours, cases["mul1_k3.w_hat"])
