"""EXL3 tensor-parallel shards (spark_overlay.exl3.format.shards): TP=2 slices combine to the unsplit layer; bad packs fail closed.

vLLM-free: the same ShardSpec / check_part / rank_part / decode_shard the
vLLM linear method uses, driven directly.
"""

from __future__ import annotations

import pytest
import torch

from spark_overlay.exl3 import MARKER_VALUES, Exl3FormatError, random_trellis
from spark_overlay.exl3.format.shards import ShardSpec, check_part, decode_shard, rank_part

GEN_SEED = 5


def make_linear(n_in: int, n_out: int, k: float, seed: int, codebook: str = "mul1") -> dict[str, torch.Tensor]:
    """A valid EXL3 linear (tensors as on disk) for W of shape (n_in, n_out)."""
    gen = torch.Generator().manual_seed(seed)
    kp, np_ = -(-n_in // 128) * 128, -(-n_out // 128) * 128
    trellis, _ = random_trellis(kp // 16, np_ // 16, k, gen)
    parts = {
        "trellis": trellis,
        "suh": (torch.randn(kp, generator=gen) * 0.02).to(torch.float16),
        "svh": torch.where(torch.rand(np_, generator=gen) < 0.5, -1.0, 1.0).to(torch.float16),
    }
    if codebook != "3inst":
        parts[codebook] = torch.tensor(MARKER_VALUES[codebook], dtype=torch.int32)
    return parts


def load(spec: ShardSpec, tensors: dict[str, torch.Tensor], codebook: str | None = "mul1") -> torch.Tensor:
    """What the vLLM weight loader + process step do for one shard: check, keep the rank part, decode."""
    parts = {}
    for kind, tensor in tensors.items():
        check_part(spec, kind, tensor)
        parts[kind] = rank_part(spec, kind, tensor)
    return decode_shard(spec, parts, codebook)


def full_spec(name, n_in, n_out):
    return ShardSpec(name, n_in, n_out, (0, n_in), (0, n_out))


def column_specs(name, n_in, n_out, tp=2):
    per = n_out // tp
    return [ShardSpec(name, n_in, n_out, (0, n_in), (r * per, (r + 1) * per)) for r in range(tp)]


def row_specs(name, n_in, n_out, tp=2):
    per = n_in // tp
    return [ShardSpec(name, n_in, n_out, (r * per, (r + 1) * per), (0, n_out)) for r in range(tp)]


def fp16_close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() <= 1e-3 * b.abs().max())


@pytest.mark.parametrize("k", [3, 2.5, 6])
def test_column_parallel_halves_equal_unsplit(k):
    tensors = make_linear(256, 512, k, seed=1)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(GEN_SEED))
    whole = x @ load(full_spec("model.layers.0.mlp.up_proj", 256, 512), tensors).T
    specs = column_specs("model.layers.0.mlp.up_proj", 256, 512)
    assert all(s.whole_tiles for s in specs)
    # each rank keeps only its tiles and scales
    assert rank_part(specs[1], "trellis", tensors["trellis"]).shape[:2] == (16, 16)
    assert torch.equal(rank_part(specs[1], "svh", tensors["svh"]), tensors["svh"][256:])
    halves = [x @ load(s, tensors).T for s in specs]
    assert fp16_close(torch.cat(halves, -1), whole)


@pytest.mark.parametrize("k", [4, 1.5])
def test_row_parallel_partial_sums_equal_unsplit(k):
    tensors = make_linear(512, 256, k, seed=2)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(GEN_SEED))
    whole = x @ load(full_spec("model.layers.0.mlp.down_proj", 512, 256), tensors).T
    specs = row_specs("model.layers.0.mlp.down_proj", 512, 256)
    assert rank_part(specs[0], "trellis", tensors["trellis"]).shape[:2] == (16, 16)
    assert torch.equal(rank_part(specs[0], "suh", tensors["suh"]), tensors["suh"][:256])
    partial = [x[:, s.in_range[0] : s.in_range[1]] @ load(s, tensors).T for s in specs]
    assert fp16_close(partial[0] + partial[1], whole)


def test_unaligned_split_is_cut_from_the_decoded_matrix():
    """Tiny-model KV heads: out 64 split in 32s is not whole 128-blocks; ranks decode all and cut."""
    tensors = make_linear(128, 64, 5, seed=3)
    whole = load(full_spec("model.layers.0.self_attn.k_proj", 128, 64), tensors)
    specs = column_specs("model.layers.0.self_attn.k_proj", 128, 64)
    assert not any(s.whole_tiles for s in specs)
    assert rank_part(specs[0], "trellis", tensors["trellis"]) is tensors["trellis"]
    assert torch.equal(torch.cat([load(s, tensors) for s in specs], 0), whole)


def test_padded_tail_slice():
    """out 320 (padded 384) split in 160s: rank 1 starts mid-block (decode all); an aligned 256/64 split keeps tiles."""
    tensors = make_linear(128, 320, 3, seed=4)
    whole = load(full_spec("lin", 128, 320), tensors)
    tail = ShardSpec("lin", 128, 320, (0, 128), (256, 320))
    assert tail.whole_tiles and tail.padded_range("out") == (256, 384)
    assert torch.equal(load(tail, tensors), whole[256:320])
    assert load(ShardSpec("lin", 128, 320, (0, 128), (0, 256)), tensors).shape == (256, 128)


def test_moe_tp2_gate_up_column_down_row_equal_unsplit():
    """Per-expert packs; gate/up split on their output, down on its input; rank outputs summed."""
    experts, hidden, inter, top_k = 4, 256, 256, 2
    packs = {
        e: {
            "gate": make_linear(hidden, inter, 3, seed=10 + e),
            "up": make_linear(hidden, inter, 3.5, seed=20 + e),
            "down": make_linear(inter, hidden, 4, seed=30 + e),
        }
        for e in range(experts)
    }
    gen = torch.Generator().manual_seed(GEN_SEED)
    x = torch.randn(6, hidden, generator=gen)
    logits = torch.randn(6, experts, generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, -1), top_k, -1)

    def moe(gate_specs, up_specs, down_specs, rank):
        out = torch.zeros(6, hidden)
        for e in range(experts):
            name = f"model.layers.0.mlp.experts.{e}"
            g = load(gate_specs(f"{name}.gate_proj")[rank], packs[e]["gate"])
            u = load(up_specs(f"{name}.up_proj")[rank], packs[e]["up"])
            d = load(down_specs(f"{name}.down_proj")[rank], packs[e]["down"])
            h = torch.nn.functional.silu(x @ g.T) * (x @ u.T)
            y = h @ d.T
            w = (weights * (ids == e)).sum(-1, keepdim=True)
            out += w * y
        return out

    def whole(n_in, n_out):
        return lambda name: [full_spec(name, n_in, n_out)]

    reference = moe(whole(hidden, inter), whole(hidden, inter), whole(inter, hidden), 0)
    col = lambda name: column_specs(name, hidden, inter)  # noqa: E731
    row = lambda name: row_specs(name, inter, hidden)  # noqa: E731
    tp = moe(col, col, row, 0) + moe(col, col, row, 1)
    assert fp16_close(tp, reference)


# -- bad packs: the load fails and names the tensor ---------------------------------------------------


def test_wrong_marker_value_names_the_tensor():
    tensors = make_linear(128, 128, 3, seed=6)
    spec = full_spec("model.layers.1.mlp.up_proj", 128, 128)
    with pytest.raises(Exl3FormatError, match=r"model\.layers\.1\.mlp\.up_proj\.mul1: marker value"):
        check_part(spec, "mul1", torch.tensor(MARKER_VALUES["mcg"], dtype=torch.int32))


def test_marker_disagreeing_with_config_codebook_names_the_linear():
    tensors = make_linear(128, 128, 3, seed=6, codebook="mcg")
    spec = full_spec("model.layers.1.mlp.up_proj", 128, 128)
    with pytest.raises(Exl3FormatError, match=r"model\.layers\.1\.mlp\.up_proj: marker model\.layers\.1\.mlp\.up_proj\.mcg"):
        load(spec, tensors, codebook="mul1")


def test_missing_marker_with_mul1_config_fails():
    tensors = make_linear(128, 128, 3, seed=6, codebook="3inst")
    with pytest.raises(Exl3FormatError, match=r"lin: no marker \(3inst\).*expected lin\.mul1"):
        load(full_spec("lin", 128, 128), tensors, codebook="mul1")


def test_wrong_trellis_shape_names_the_tensor():
    tensors = make_linear(128, 256, 3, seed=7)  # a 128x256 pack for a 128x128 layer
    spec = full_spec("model.layers.0.self_attn.o_proj", 128, 128)
    with pytest.raises(Exl3FormatError, match=r"model\.layers\.0\.self_attn\.o_proj\.trellis: shape \[8, 16, 48\]"):
        check_part(spec, "trellis", tensors["trellis"])


def test_bad_trellis_word_count_names_the_tensor():
    spec = full_spec("lm_head", 128, 128)
    with pytest.raises(Exl3FormatError, match=r"lm_head\.trellis: trellis last dimension 50"):
        check_part(spec, "trellis", torch.zeros(8, 8, 50, dtype=torch.int16))


def test_missing_suh_names_the_tensor():
    tensors = make_linear(128, 128, 3, seed=8)
    del tensors["suh"]
    with pytest.raises(Exl3FormatError, match=r"model\.layers\.0\.mlp\.gate_proj\.suh: missing"):
        load(full_spec("model.layers.0.mlp.gate_proj", 128, 128), tensors)


def test_wrong_suh_length_and_dtype_name_the_tensor():
    spec = full_spec("model.layers.0.mlp.gate_proj", 128, 128)
    with pytest.raises(Exl3FormatError, match=r"gate_proj\.suh: shape \[256\] does not match \[128\]"):
        check_part(spec, "suh", torch.zeros(256, dtype=torch.float16))
    with pytest.raises(Exl3FormatError, match=r"gate_proj\.svh: dtype torch\.float32 is not torch\.float16"):
        check_part(spec, "svh", torch.zeros(128))


def test_dense_weight_in_exl3_model_names_the_tensor():
    spec = full_spec("model.layers.0.mlp.gate_proj", 128, 128)
    with pytest.raises(Exl3FormatError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight: a dense weight"):
        check_part(spec, "weight", torch.zeros(128, 128))


def test_half_k_needs_mul1():
    tensors = make_linear(128, 128, 2.5, seed=9)
    del tensors["mul1"]
    with pytest.raises(Exl3FormatError, match=r"lin\.trellis: half-integer K=2\.5 requires a lin\.mul1 marker"):
        load(full_spec("lin", 128, 128), tensors, codebook=None)
