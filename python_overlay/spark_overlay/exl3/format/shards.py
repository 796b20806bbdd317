"""Tensor-parallel shards of EXL3 linears: checks at load, rank slices, decode (format doc §2.5-§2.6).

vLLM-free, so the slicing rules are tested without a distributed setup.

One checkpoint linear (prefix `name`, W of shape (in, out), padded to Kp x Np)
is served by a rank as the sub-matrix W[in_range, out_range]:

* column-parallel (q/k/v, gate/up, lm_head): out_range is the rank's columns,
  in_range everything;
* row-parallel (o_proj, down_proj): in_range is the rank's rows.

W = diag(suh)·Hk·W_hat·Hn·diag(svh) with block-diagonal 128-point Hadamards,
so a range whose start is a multiple of 128 and whose end is a multiple of
128 (or the end of the matrix) is served by whole trellis tiles: trellis dim
0 (rows, with suh) or dim 1 (columns, with svh). The rank then keeps and
decodes only its tiles. Any other range (tiny models: 32-wide KV heads) is
cut from the fully decoded matrix instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .codebook import CODEBOOK_3INST, CODEBOOK_MCG, CODEBOOK_MUL1, CODEBOOKS
from .errors import Exl3FormatError
from .linear import HADAMARD_BLOCK, check_marker, full_weight, k_from_trellis, unpack_signs
from .trellis import HALF_K, TILE

# Tensor kinds an EXL3 linear may carry on disk (format doc §1.4); "weight"
# is accepted only to reject it with a clear message.
PART_KINDS = ("trellis", "suh", "svh", "su", "sv", CODEBOOK_MCG, CODEBOOK_MUL1, "weight")
PART_DTYPES = {
    "trellis": torch.int16,
    "bias": torch.float16,
    "suh": torch.float16,
    "svh": torch.float16,
    "su": torch.int16,
    "sv": torch.int16,
    CODEBOOK_MCG: torch.int32,
    CODEBOOK_MUL1: torch.int32,
}


def padded(n: int) -> int:
    """n rounded up to the 128-wide Hadamard block (exllamav3 pads in/out to it)."""
    return -(-n // HADAMARD_BLOCK) * HADAMARD_BLOCK


@dataclass(frozen=True)
class ShardSpec:
    """What one rank serves of one checkpoint linear.

    `name` is the checkpoint prefix (e.g. "model.layers.0.self_attn.k_proj");
    in/out_features the unpadded full sizes; the ranges are half-open.
    """

    name: str
    in_features: int
    out_features: int
    in_range: tuple[int, int]
    out_range: tuple[int, int]

    def __post_init__(self) -> None:
        for what, (lo, hi), full in (
            ("in_range", self.in_range, self.in_features),
            ("out_range", self.out_range, self.out_features),
        ):
            if not 0 <= lo < hi <= full:
                raise Exl3FormatError(f"{self.name}: {what} {lo}..{hi} does not fit the size {full}")

    @property
    def padded_in(self) -> int:
        return padded(self.in_features)

    @property
    def padded_out(self) -> int:
        return padded(self.out_features)

    @property
    def whole_tiles(self) -> bool:
        """True when both ranges are made of whole 128-blocks, so the packed tensors can be sliced."""
        return _aligned(self.in_range, self.in_features) and _aligned(self.out_range, self.out_features)

    def padded_range(self, axis: str) -> tuple[int, int]:
        """The rank's range on `axis` ("in" | "out") in the padded matrix (whole-tile specs only)."""
        lo, hi = self.in_range if axis == "in" else self.out_range
        full = self.in_features if axis == "in" else self.out_features
        return lo, (padded(full) if hi == full else hi)


def _aligned(rng: tuple[int, int], full: int) -> bool:
    lo, hi = rng
    return lo % HADAMARD_BLOCK == 0 and (hi % HADAMARD_BLOCK == 0 or hi == full)


def check_part(spec: ShardSpec, kind: str, tensor: torch.Tensor) -> None:
    """Check one checkpoint tensor `spec.name`.`kind` against the layer it loads into.

    Raises Exl3FormatError naming the tensor and what was expected.
    """
    name = f"{spec.name}.{kind}"
    if kind == "weight":
        raise Exl3FormatError(
            f"{name}: a dense weight where the EXL3 checkpoint should hold {spec.name}.trellis/.suh/.svh; "
            "the model is not (fully) EXL3 -- serve it without --quantization exl3, or re-convert it"
        )
    if kind not in PART_DTYPES:
        raise Exl3FormatError(f"{name}: not an EXL3 tensor kind (expected one of {', '.join(PART_KINDS)})")
    want = PART_DTYPES[kind]
    if tensor.dtype != want:
        raise Exl3FormatError(f"{name}: dtype {tensor.dtype} is not {want}")
    if kind == "trellis":
        k_from_trellis(tensor.shape, name)
        tiles = [spec.padded_in // TILE, spec.padded_out // TILE]
        if list(tensor.shape[:2]) != tiles:
            raise Exl3FormatError(
                f"{name}: shape {list(tensor.shape)} does not match the layer: in {spec.in_features} "
                f"(padded {spec.padded_in}) x out {spec.out_features} (padded {spec.padded_out}) needs "
                f"[{tiles[0]}, {tiles[1]}, 16*K]; the checkpoint does not belong to this model config"
            )
    elif kind == "bias":
        if tensor.dim() != 1 or tensor.shape[0] != spec.padded_out:
            raise Exl3FormatError(
                f"{name}: shape {list(tensor.shape)} does not match [{spec.padded_out}] (out {spec.out_features} "
                "padded to 128, as exllamav3 writes biases)"
            )
    elif kind in ("suh", "svh", "su", "sv"):
        length = spec.padded_in if kind in ("suh", "su") else spec.padded_out
        if kind in ("su", "sv"):
            length //= TILE
        if tensor.dim() != 1 or tensor.shape[0] != length:
            raise Exl3FormatError(f"{name}: shape {list(tensor.shape)} does not match [{length}] for this layer")
    else:
        check_marker(name, tensor, kind)


def rank_part(spec: ShardSpec, kind: str, tensor: torch.Tensor) -> torch.Tensor:
    """The part of a checked tensor this rank keeps: whole-tile specs keep only their tiles."""
    if kind == "bias":
        return rank_bias(spec, tensor)
    if not spec.whole_tiles:
        return tensor
    i0, i1 = spec.padded_range("in")
    o0, o1 = spec.padded_range("out")
    if kind == "trellis":
        return tensor[i0 // TILE : i1 // TILE, o0 // TILE : o1 // TILE].contiguous()
    if kind == "suh":
        return tensor[i0:i1].contiguous()
    if kind == "svh":
        return tensor[o0:o1].contiguous()
    if kind == "su":
        return tensor[i0 // TILE : i1 // TILE].contiguous()
    if kind == "sv":
        return tensor[o0 // TILE : o1 // TILE].contiguous()
    return tensor


def rank_bias(spec: ShardSpec, bias: torch.Tensor) -> torch.Tensor:
    """The bias entries of this rank's output columns (padding dropped): bias[out_range].

    Column-parallel ranks get their slice; a row-parallel rank (out_range = all
    columns) gets the whole bias, which the layer must add once, after the
    partial outputs are summed (vLLM adds it on rank 0 only).
    """
    o0, o1 = spec.out_range
    return bias[o0:o1].contiguous()


def shard_codebook(spec: ShardSpec, parts: Mapping[str, torch.Tensor], expected: str | None) -> str:
    """The codebook of one linear from its marker; cross-checked with the config's `codebook` if given."""
    markers = [kind for kind in (CODEBOOK_MCG, CODEBOOK_MUL1) if kind in parts]
    if len(markers) > 1:
        raise Exl3FormatError(
            f"{spec.name}.mcg and {spec.name}.mul1: an EXL3 linear carries at most one codebook marker"
        )
    codebook = markers[0] if markers else CODEBOOK_3INST
    if expected is not None and codebook != expected:
        found = f"marker {spec.name}.{codebook}" if markers else f"no marker (3inst) on {spec.name}"
        raise Exl3FormatError(
            f"{spec.name}: {found}, but quantization_config.codebook is {expected!r}; "
            f"expected {spec.name}.{expected}" + ("" if expected == CODEBOOK_3INST else " (missing or wrong marker)")
        )
    return codebook


def _scales(spec: ShardSpec, parts: Mapping[str, torch.Tensor], new: str, legacy: str) -> torch.Tensor:
    if new in parts:
        return parts[new]
    if legacy in parts:
        return unpack_signs(parts[legacy], f"{spec.name}.{legacy}")
    raise Exl3FormatError(f"{spec.name}.{new}: missing from the checkpoint (needed beside {spec.name}.trellis)")


def decode_shard(
    spec: ShardSpec,
    parts: Mapping[str, torch.Tensor],
    expected_codebook: str | None = None,
) -> torch.Tensor:
    """The rank's weight W[in_range, out_range] as an nn.Linear weight [out_len, in_len], float32.

    `parts` holds the tensors kept by `rank_part` for every kind present.
    """
    if "trellis" not in parts:
        raise Exl3FormatError(f"{spec.name}.trellis: missing from the checkpoint")
    if expected_codebook is not None and expected_codebook not in CODEBOOKS:
        raise Exl3FormatError(f"quantization_config.codebook {expected_codebook!r} is not one of {CODEBOOKS}")
    trellis = parts["trellis"]
    suh = _scales(spec, parts, "suh", "su")
    svh = _scales(spec, parts, "svh", "sv")
    codebook = shard_codebook(spec, parts, expected_codebook)
    k = k_from_trellis(trellis.shape, f"{spec.name}.trellis")
    if k in HALF_K and codebook != CODEBOOK_MUL1:
        raise Exl3FormatError(f"{spec.name}.trellis: half-integer K={k} requires a {spec.name}.mul1 marker")
    w = full_weight(trellis, suh, svh, codebook, name=spec.name)
    (i0, i1), (o0, o1) = spec.in_range, spec.out_range
    if spec.whole_tiles:
        w = w[: i1 - i0, : o1 - o0]
    else:
        w = w[i0:i1, o0:o1]
    return w.t().contiguous()


def shard_k(parts: Mapping[str, torch.Tensor]) -> float:
    """K of a loaded shard (its trellis' last dim / 16)."""
    return k_from_trellis(parts["trellis"].shape)
