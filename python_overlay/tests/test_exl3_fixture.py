"""Reference EXL3 decoder against a real checkpoint made by exllamav3 1.6.5's converter.

Fixture: exl3-tiny-llama-b3.tar.gz (see its README): a random tiny Llama, its
EXL3 conversion (decoder linears K=3, lm_head K=6, MUL1) and exllamav3's own
reconstruction of the head. Located through $SPARK_KIT_TEST_FIXTURES, default
<repo>/../shared/fixtures. Run with -s to see the per-linear table.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
import torch

from spark_overlay.exl3 import forward, full_weight, full_weight_fp16, load_linear, weight_hat

safetensors_torch = pytest.importorskip("safetensors.torch")

ARCHIVE = "exl3-tiny-llama-b3.tar.gz"
REPO = Path(__file__).resolve().parents[2]


def _fixture_dir() -> Path:
    return Path(os.environ.get("SPARK_KIT_TEST_FIXTURES", REPO.parent / "shared" / "fixtures"))


# Expected quantisation error of a K-bit trellis code on Gaussian-like weights:
# the rate-distortion bound gives a relative RMS error of 2^-K; exllamav3 lands
# about 1.2x above it (head, K=6: 0.0196; decoder linears, K=3: 0.146-0.171).
# Allow 1.5x. At K=3 this means a cosine of ~0.985-0.989 is the correct result.
def _max_relative_error(k: float) -> float:
    return 1.5 * 2.0**-k


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    archive = _fixture_dir() / ARCHIVE
    if not archive.is_file():
        reason = f"fixture {archive} not found (set SPARK_KIT_TEST_FIXTURES to the folder holding {ARCHIVE})"
        print(reason)
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("exl3-fixture")
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(root, filter="data")
    return {
        "exl3": safetensors_torch.load_file(str(root / "shared-b3-exl3" / "model.safetensors")),
        "dense": safetensors_torch.load_file(str(root / "shared-b3-dense" / "model.safetensors")),
        "truth": safetensors_torch.load_file(str(root / "shared-b3-exl3" / "ground_truth_weights.safetensors")),
    }


def _prefixes(tensors) -> list[str]:
    return sorted(name[: -len(".trellis")] for name in tensors if name.endswith(".trellis"))


def test_head_reproduces_exllamav3_reconstruction(checkpoint):
    head = load_linear(checkpoint["exl3"], "lm_head")
    assert (head.k, head.codebook) == (6, "mul1")
    truth = checkpoint["truth"]["lm_head.weight_exllamav3"]
    assert truth.shape == (256, 1024) and truth.dtype == torch.float16

    exact = full_weight(head.trellis, head.suh, head.svh, head.codebook, name="lm_head")
    diff = (exact - truth.float()).abs()
    scale = truth.float().abs().max()
    mismatches = int((exact.half() != truth).sum())
    print(
        f"\nlm_head full_weight (fp32) vs exllamav3: max abs {diff.max():.3e}, "
        f"max rel to max|W| {diff.max() / scale:.3e}, fp16 mismatches {mismatches}/{truth.numel()}"
    )
    assert diff.max() <= 2e-3 * scale

    rounded = full_weight_fp16(head.trellis, head.suh, head.svh, head.codebook, name="lm_head")
    mismatches16 = int((rounded != truth).sum())
    print(f"lm_head full_weight_fp16 vs exllamav3: fp16 mismatches {mismatches16}/{truth.numel()}")
    assert torch.equal(rounded, truth)


def test_every_linear_is_close_to_its_dense_source(checkpoint):
    exl3, dense = checkpoint["exl3"], checkpoint["dense"]
    prefixes = _prefixes(exl3)
    assert len(prefixes) == 15  # 2 layers x 7 linears + lm_head
    rows = []
    for prefix in prefixes:
        lin = load_linear(exl3, prefix)
        source = dense[f"{prefix}.weight"].float()
        out_features, in_features = source.shape
        w = full_weight(lin.trellis, lin.suh, lin.svh, lin.codebook, name=prefix)[:in_features, :out_features].T
        cosine = torch.nn.functional.cosine_similarity(w.flatten(), source.flatten(), dim=0).item()
        relative = ((w - source).norm() / source.norm()).item()
        rows.append((prefix, lin.k, cosine, relative))
    print(f"\n{'linear':34s} {'K':>3s} {'cosine':>8s} {'rel err':>8s}")
    for prefix, k, cosine, relative in rows:
        print(f"{prefix:34s} {k:>3} {cosine:8.5f} {relative:8.4f}")
    for prefix, k, cosine, relative in rows:
        assert relative < _max_relative_error(k), prefix
        assert cosine > (0.99 if k >= 4 else 0.98), prefix
    head = next(r for r in rows if r[0] == "lm_head")
    assert abs(head[2] - 0.99981) < 5e-5 and abs(head[3] - 0.0196) < 5e-4  # fixture README figures


def test_forward_on_real_linear(checkpoint):
    exl3, dense = checkpoint["exl3"], checkpoint["dense"]
    prefix = "model.layers.0.mlp.down_proj"
    lin = load_linear(exl3, prefix)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(0))
    y = forward(x, lin.trellis, lin.suh, lin.svh, lin.codebook, name=prefix)
    want = x @ full_weight(lin.trellis, lin.suh, lin.svh, lin.codebook)
    assert (y - want).abs().max() < 1e-4 * want.abs().max()
    # and tracks the dense source layer
    dense_y = x @ dense[f"{prefix}.weight"].float().T
    assert torch.nn.functional.cosine_similarity(y.flatten(), dense_y.flatten(), dim=0) > 0.98


def test_w_hat_is_raw_codebook_values(checkpoint):
    lin = load_linear(checkpoint["exl3"], "model.layers.1.self_attn.q_proj")
    w_hat = weight_hat(lin.trellis, lin.codebook).float()
    assert w_hat.min() >= -3.453125 and w_hat.max() <= 3.34765625
    assert 0.9 < w_hat.std() < 1.1  # MUL1 std ~1.0003


def test_a_wrong_decode_loses_all_correlation(checkpoint):
    """The cosine figures above only mean something if a wrong decode scores ~0."""
    exl3, dense = checkpoint["exl3"], checkpoint["dense"]
    prefix = "model.layers.0.mlp.up_proj"
    lin = load_linear(exl3, prefix)
    source = dense[f"{prefix}.weight"].float()
    t0, t1, words = lin.trellis.shape
    unswapped = lin.trellis.reshape(t0, t1, words // 2, 2).flip(-1).reshape(t0, t1, words)
    for trellis, codebook in ((unswapped, "mul1"), (lin.trellis, "3inst")):
        w = full_weight(trellis, lin.suh, lin.svh, codebook)[:256, :512].T
        assert abs(torch.nn.functional.cosine_similarity(w.flatten(), source.flatten(), dim=0)) < 0.05
