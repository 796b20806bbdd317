"""Reference EXL3 decoder: codebooks, bitstream, packer, Hadamard, forward and format errors."""

from __future__ import annotations

import math
import struct
import time

import pytest
import torch

from spark_overlay.exl3 import (
    CODEBOOKS,
    MARKER_VALUES,
    VALID_K,
    Exl3FormatError,
    codebook_from_tensors,
    codebook_table,
    decode_states,
    forward,
    full_weight,
    full_weight_fp16,
    hadamard_128,
    k_from_trellis,
    load_linear,
    matrix_to_states,
    pack_matrix,
    pack_states,
    random_trellis,
    states_are_valid,
    states_from_symbols,
    states_to_matrix,
    tile_permutation,
    unpack_signs,
    weight_hat,
)

# ---------------------------------------------------------------- codebooks
# Independent scalar model of format doc §2.4: Python ints, struct's
# correctly rounded double -> half conversion.


def _half(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def _to_half_bits(value: float) -> int:
    return struct.unpack("<H", struct.pack("<e", value))[0]


def _scalar_value(codebook: str, s: int) -> int:
    if codebook == "mul1":
        x = (s * 0x83DCD12D) & 0xFFFFFFFF
        b = sum((x >> (8 * i)) & 0xFF for i in range(4))
        return _to_half_bits((1024 + b) * _half(0x1EEE) + _half(0xC931))
    x = (s * 89226354 + 64248484) if codebook == "3inst" else s * 0xCBAC1FED
    x = ((x & 0xFFFFFFFF) & 0x8FFF8FFF) ^ 0x3B603B60
    return _to_half_bits(_half(x & 0xFFFF) + _half(x >> 16))


@pytest.mark.parametrize("codebook", CODEBOOKS)
def test_codebook_matches_scalar_model_for_every_state(codebook):
    table = codebook_table(codebook)
    assert table.dtype == torch.float16 and table.shape == (65536,)
    got = table.view(torch.int16).to(torch.int64) & 0xFFFF
    want = torch.tensor([_scalar_value(codebook, s) for s in range(65536)], dtype=torch.int64)
    assert torch.equal(got, want)


def test_mul1_range_and_spread():
    table = codebook_table("mul1").to(torch.float64)
    assert table.min().item() == -3.453125
    assert table.max().item() == 3.34765625
    assert abs(table.std().item() - 1.0003) < 1e-3
    # state 0: x = 0, byte sum 0 -> fp16(1024 * 0.00676727294921875 - 10.3828125)
    assert table[0].item() == _half(_to_half_bits(1024 * 0.00676727294921875 - 10.3828125))


@pytest.mark.parametrize("codebook", ["3inst", "mcg"])
def test_half_sum_codebooks_are_finite_and_scaled(codebook):
    table = codebook_table(codebook).to(torch.float64)
    assert torch.isfinite(table).all()
    assert table.abs().max().item() < 4.0
    # 1.24371088 is exllamav3's codebook_scale (std of the 3INST table).
    assert abs(table.std().item() - 1.24371088) < 2e-3


def test_marker_values():
    assert MARKER_VALUES == {"mcg": -877912083, "mul1": -2082680531}


def test_unknown_codebook():
    with pytest.raises(Exl3FormatError, match="unknown EXL3 codebook"):
        codebook_table("mul2")


# ---------------------------------------------------------------- bitstream


def _reference_tile_states(words: list[int], k: float) -> list[int]:
    """Per-bit decode of one tile straight from format doc §2.8."""
    u16 = [w & 0xFFFF for w in words]
    u32 = [u16[2 * m] | (u16[2 * m + 1] << 16) for m in range(len(u16) // 2)]
    bits_total = 16 * len(words)

    def bit(b: int) -> int:
        return (u32[b >> 5] >> (31 - (b & 31))) & 1

    base = int(k)
    states, end = [], 0
    for t in range(256):
        end += base + (((0xAAAA >> (t & 15)) & 1) if k != base else 0)
        s = 0
        for q in range(16):
            s = (s << 1) | bit((end - 16 + q) % bits_total)
        states.append(s)
    return states


def test_permutation_start():
    perm = tile_permutation()
    assert perm[:16].tolist() == [0, 16, 128, 144, 8, 24, 136, 152, 32, 48, 160, 176, 40, 56, 168, 184]
    assert sorted(perm.tolist()) == list(range(256))


@pytest.mark.parametrize("k", VALID_K)
def test_vectorised_decode_matches_per_bit_reference(k):
    gen = torch.Generator().manual_seed(int(k * 10))
    trellis = torch.randint(-32768, 32768, (1, 2, int(16 * k)), generator=gen, dtype=torch.int64).to(torch.int16)
    states = decode_states(trellis)
    for j in range(2):
        assert states[0, j].tolist() == _reference_tile_states(trellis[0, j].tolist(), k)


@pytest.mark.parametrize("k", VALID_K)
@pytest.mark.parametrize("codebook", CODEBOOKS)
def test_pack_decode_round_trip(codebook, k):
    gen = torch.Generator().manual_seed(1000 + int(k * 10) + CODEBOOKS.index(codebook))
    trellis, states = random_trellis(2, 3, k, generator=gen)
    assert trellis.dtype == torch.int16 and trellis.shape == (2, 3, int(16 * k))
    assert k_from_trellis(trellis.shape) == k
    assert states_are_valid(states, k).all()
    assert torch.equal(decode_states(trellis).to(torch.int64), states)
    assert torch.equal(pack_states(decode_states(trellis), k), trellis)
    table = codebook_table(codebook)
    w_hat = weight_hat(trellis, codebook)
    assert w_hat.shape == (32, 48) and w_hat.dtype == torch.float16
    assert torch.equal(w_hat, table[states_to_matrix(states).to(torch.int64)])
    # Element (r, c) of tile (i, j) comes from stream position inv_perm[16r + c].
    t = int((tile_permutation() == 16 * 5 + 9).nonzero())
    assert w_hat[16 + 5, 32 + 9] == table[states[1, 2, t]]


def test_matrix_layout_round_trip_and_pack_matrix():
    trellis, states = random_trellis(2, 2, 4, generator=torch.Generator().manual_seed(7))
    matrix = states_to_matrix(states)
    assert torch.equal(matrix_to_states(matrix), states)
    assert torch.equal(pack_matrix(matrix, 4), trellis)


def test_states_from_symbols_is_tail_biting():
    symbols = torch.zeros(256, dtype=torch.int64)
    symbols[0] = 0b101  # K=3: the first symbol shows up in the last states' history only through the wrap
    states = states_from_symbols(symbols, 3)
    assert states[0].item() == 0b101
    assert states[1].item() == 0b101 << 3
    assert states[255].item() == 0  # 255 positions later the symbol has left the 16-bit window
    assert states_are_valid(states, 3)
    broken = states.clone()
    broken[10] ^= 0x8000
    assert not states_are_valid(broken, 3)


def test_half_k_widths_follow_0xaaaa():
    # K=2.5: even positions 2 bits, odd positions 3 bits; symbol t = t's width of ones.
    symbols = torch.tensor([(1 << (2 + (t & 1))) - 1 for t in range(256)])
    trellis = pack_states(states_from_symbols(symbols, 2.5), 2.5)
    assert trellis.shape[-1] == 40
    assert (trellis == -1).all()  # all-ones stream: 640 bits, every word 0xFFFF
    with pytest.raises(Exl3FormatError, match="widths"):
        states_from_symbols(torch.full((256,), 7), 2.5)


def test_decode_4096_square_k3_is_fast():
    trellis, _ = random_trellis(8, 8, 3, generator=torch.Generator().manual_seed(3))
    big = trellis.repeat(32, 32, 1)
    start = time.perf_counter()
    w_hat = weight_hat(big, "mul1")
    elapsed = time.perf_counter() - start
    print(f"\n4096x4096 K=3 W_hat decode: {elapsed:.2f} s")
    assert w_hat.shape == (4096, 4096)
    assert torch.equal(w_hat[128:256, 384:512], weight_hat(trellis, "mul1"))
    assert elapsed < 10.0


# ---------------------------------------------------------------- Hadamard / W / forward


def test_hadamard_orthonormal_symmetric():
    h = hadamard_128(torch.float64)
    assert torch.equal(h, h.T)
    assert torch.allclose(h @ h, torch.eye(128, dtype=torch.float64), atol=1e-12)
    assert torch.equal(h.abs(), torch.full_like(h, 1 / math.sqrt(128)))
    assert (h[0] > 0).all() and (h[:, 0] > 0).all()
    assert h[3, 1] < 0 and h[3, 4] > 0  # popcount(3&1)=1, popcount(3&4)=0
    assert torch.equal(h[:64, :64], h[64:, :64]) and torch.equal(h[64:, 64:], -h[:64, :64])


def _random_linear(k: float, codebook: str, kp: int, np_: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    trellis, _ = random_trellis(kp // 16, np_ // 16, k, generator=gen)
    suh = ((torch.rand(kp, generator=gen) + 0.5) * torch.sign(torch.randn(kp, generator=gen)) * 0.02).half()
    svh = ((torch.rand(np_, generator=gen) + 0.5) * torch.sign(torch.randn(np_, generator=gen))).half()
    return trellis, suh, svh


def test_full_weight_equals_dense_matrix_product():
    trellis, suh, svh = _random_linear(3, "mcg", 256, 384, seed=11)
    w_hat = weight_hat(trellis, "mcg").to(torch.float64)
    h = hadamard_128(torch.float64)
    hk = torch.block_diag(*[h] * 2)
    hn = torch.block_diag(*[h] * 3)
    want = torch.diag(suh.double()) @ hk @ w_hat @ hn @ torch.diag(svh.double())
    got = full_weight(trellis, suh, svh, "mcg")
    assert got.dtype == torch.float32 and got.shape == (256, 384)
    assert torch.allclose(got.double(), want, rtol=0, atol=1e-6 * want.abs().max().item())
    fp16 = full_weight_fp16(trellis, suh, svh, "mcg")
    assert fp16.dtype == torch.float16
    assert (fp16.double() - want).abs().max() < 2e-3 * want.abs().max()


@pytest.mark.parametrize("codebook,k", [("mul1", 2.5), ("3inst", 4), ("mcg", 6)])
def test_forward_matches_dense_weight(codebook, k):
    trellis, suh, svh = _random_linear(k, codebook, 256, 384, seed=21)
    in_features, out_features = 200, 300
    gen = torch.Generator().manual_seed(5)
    bias = torch.randn(384, generator=gen).half()
    x = torch.randn(3, 4, in_features, generator=gen)
    w = full_weight(trellis, suh, svh, codebook)[:in_features, :out_features]
    want = x @ w + bias[:out_features].float()
    got = forward(x, trellis, suh, svh, codebook, bias, in_features, out_features)
    assert got.shape == (3, 4, out_features) and got.dtype == torch.float32
    assert (got - want).abs().max() < 1e-4 * want.abs().max()
    # fp16 activations come back in fp16, close to the fp32 result.
    got16 = forward(x.half(), trellis, suh, svh, codebook, bias, in_features, out_features)
    assert got16.dtype == torch.float16
    assert (got16.float() - want).abs().max() < 1e-2 * want.abs().max()


# ---------------------------------------------------------------- format errors


def _linear_tensors(prefix: str = "model.layers.0.mlp.up_proj", k: float = 3, marker: str | None = "mul1"):
    trellis, suh, svh = _random_linear(k, marker or "3inst", 128, 256, seed=31)
    tensors = {f"{prefix}.trellis": trellis, f"{prefix}.suh": suh, f"{prefix}.svh": svh}
    if marker:
        tensors[f"{prefix}.{marker}"] = torch.tensor(MARKER_VALUES[marker], dtype=torch.int32)
    return tensors


def test_load_linear_accepts_valid_tensors():
    p = "model.layers.0.mlp.up_proj"
    lin = load_linear(_linear_tensors(p), p)
    assert (lin.codebook, lin.k, lin.padded_in, lin.padded_out) == ("mul1", 3, 128, 256)
    assert load_linear(_linear_tensors(p, marker=None), p).codebook == "3inst"
    assert load_linear(_linear_tensors(p, marker="mcg"), p).codebook == "mcg"
    assert load_linear(_linear_tensors(p, k=1.5), p).k == 1.5


def _expect_error(tensors, prefix, fragment):
    with pytest.raises(Exl3FormatError) as err:
        load_linear(tensors, prefix)
    assert fragment in str(err.value), str(err.value)


def test_bad_trellis_shapes_name_the_tensor():
    p = "model.layers.0.mlp.up_proj"
    bad_last = _linear_tensors(p)
    bad_last[f"{p}.trellis"] = torch.zeros(8, 16, 50, dtype=torch.int16)
    _expect_error(bad_last, p, f"{p}.trellis: trellis last dimension 50")
    bad_rank = _linear_tensors(p)
    bad_rank[f"{p}.trellis"] = torch.zeros(8, 16 * 48, dtype=torch.int16)
    _expect_error(bad_rank, p, f"{p}.trellis: shape [8, 768] is not rank 3")
    bad_dtype = _linear_tensors(p)
    bad_dtype[f"{p}.trellis"] = bad_dtype[f"{p}.trellis"].to(torch.int32)
    _expect_error(bad_dtype, p, f"{p}.trellis: dtype torch.int32")
    bad_tiles = _linear_tensors(p)
    bad_tiles[f"{p}.trellis"] = torch.zeros(4, 16, 48, dtype=torch.int16)
    _expect_error(bad_tiles, p, "multiples of 8")
    _expect_error({}, p, f"{p}.trellis: missing")


def test_bad_scales_name_the_tensor():
    p = "lm_head"
    short = _linear_tensors(p)
    short[f"{p}.suh"] = short[f"{p}.suh"][:64]
    _expect_error(short, p, f"{p}.suh: shape [64] does not match [128]")
    wrong_dtype = _linear_tensors(p)
    wrong_dtype[f"{p}.svh"] = wrong_dtype[f"{p}.svh"].float()
    _expect_error(wrong_dtype, p, f"{p}.svh: dtype torch.float32")
    missing = _linear_tensors(p)
    del missing[f"{p}.svh"]
    _expect_error(missing, p, f"{p}.svh: missing")
    with pytest.raises(Exl3FormatError, match=r"q\.suh: shape \[64\]"):
        t = _linear_tensors(p)
        full_weight(t[f"{p}.trellis"], t[f"{p}.suh"][:64], t[f"{p}.svh"], "mul1", name="q")


def test_bad_markers_name_the_tensor():
    p = "model.layers.1.self_attn.o_proj"
    wrong_dtype = _linear_tensors(p)
    wrong_dtype[f"{p}.mul1"] = torch.tensor(MARKER_VALUES["mul1"], dtype=torch.int64)
    _expect_error(wrong_dtype, p, f"{p}.mul1: marker dtype torch.int64")
    wrong_shape = _linear_tensors(p)
    wrong_shape[f"{p}.mul1"] = torch.tensor([MARKER_VALUES["mul1"]], dtype=torch.int32)
    _expect_error(wrong_shape, p, f"{p}.mul1: marker shape [1]")
    wrong_value = _linear_tensors(p, marker="mcg")
    wrong_value[f"{p}.mcg"] = torch.tensor(MARKER_VALUES["mul1"], dtype=torch.int32)
    _expect_error(wrong_value, p, f"{p}.mcg: marker value")
    both = _linear_tensors(p)
    both[f"{p}.mcg"] = torch.tensor(MARKER_VALUES["mcg"], dtype=torch.int32)
    _expect_error(both, p, f"{p}.mcg and {p}.mul1")
    half_without_mul1 = _linear_tensors(p, k=2.5, marker="mcg")
    _expect_error(half_without_mul1, p, f"{p}.trellis: half-integer K=2.5 requires a {p}.mul1")
    dense_too = _linear_tensors(p)
    dense_too[f"{p}.weight"] = torch.zeros(256, 128, dtype=torch.float16)
    _expect_error(dense_too, p, f"{p}.weight: present beside")


def test_codebook_from_tensor_names():
    assert codebook_from_tensors(["a.trellis", "a.suh", "a.svh"]) == "3inst"
    assert codebook_from_tensors(["a.trellis", "a.mcg"]) == "mcg"
    assert codebook_from_tensors(["mul1"]) == "mul1"
    with pytest.raises(Exl3FormatError, match="a.mcg and a.mul1"):
        codebook_from_tensors(["a.mul1", "a.mcg"])


def test_k_from_trellis():
    assert [k_from_trellis((8, 8, w)) for w in (16, 24, 40, 56, 128)] == [1, 1.5, 2.5, 3.5, 8]
    with pytest.raises(Exl3FormatError, match="blk.trellis: trellis last dimension 136"):
        k_from_trellis((8, 8, 136), "blk.trellis")


def test_legacy_packed_signs():
    packed = torch.tensor([0b101, -32768], dtype=torch.int16)
    signs = unpack_signs(packed, "x.su")
    assert signs.dtype == torch.float16 and signs.shape == (32,)
    assert signs[0] == -1 and signs[1] == 1 and signs[2] == -1 and signs[31] == -1 and signs[16] == 1
    p = "legacy"
    tensors = _linear_tensors(p, marker=None)
    del tensors[f"{p}.suh"]
    tensors[f"{p}.su"] = torch.zeros(8, dtype=torch.int16)
    assert torch.equal(load_linear(tensors, p).suh, torch.ones(128, dtype=torch.float16))
