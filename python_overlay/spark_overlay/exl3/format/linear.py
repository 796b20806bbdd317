"""EXL3 linear layers: validation, W_hat, full W and the forward pass (format doc §1.4, §2.1, §2.6).

W is stored as (in, out): y = x @ W + bias, and the nn.Linear weight is
W[:in, :out].T. With Hk = I ⊗ H, Hn = I ⊗ H and H the orthonormal 128-point
Sylvester Hadamard matrix:

    W = diag(suh) · Hk · W_hat · Hn · diag(svh)

All arithmetic after the (exact, fp16) W_hat runs in float32.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import torch

from .codebook import CODEBOOK_3INST, CODEBOOK_MCG, CODEBOOK_MUL1, MARKER_VALUES, codebook_table
from .errors import Exl3FormatError
from .trellis import HALF_K, TILE, decode_matrix, k_from_words

HADAMARD_BLOCK = 128
MARKER_SUFFIXES = (CODEBOOK_MCG, CODEBOOK_MUL1)


@lru_cache(maxsize=None)
def _hadamard_128_f64() -> torch.Tensor:
    idx = torch.arange(HADAMARD_BLOCK)
    anded = idx[:, None] & idx[None, :]
    parity = torch.zeros_like(anded)
    for bit in range(7):
        parity ^= (anded >> bit) & 1
    signs = 1.0 - 2.0 * parity.to(torch.float64)
    return signs / math.sqrt(HADAMARD_BLOCK)


def hadamard_128(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """H[a, b] = (-1)^popcount(a & b) / sqrt(128): Sylvester order, symmetric, orthonormal."""
    return _hadamard_128_f64().to(dtype)


def k_from_trellis(shape: Iterable[int], name: str = "trellis") -> float:
    """Bits per weight of a trellis of `shape`: last dim / 16, with 24/40/56 -> 1.5/2.5/3.5."""
    dims = list(shape)
    if len(dims) != 3:
        raise Exl3FormatError(f"{name}: shape {dims} is not rank 3 [Kp/16, Np/16, 16*K]")
    try:
        return k_from_words(dims[-1])
    except Exl3FormatError as err:
        raise Exl3FormatError(f"{name}: {err}") from None


def codebook_from_tensors(names: Iterable[str]) -> str:
    """Codebook of one linear from its tensor names: `.mcg` -> "mcg", `.mul1` -> "mul1", none -> "3inst".

    `names` are the tensor names of a single linear (full names such as
    "model.layers.0.mlp.up_proj.mul1", or bare suffixes). Both markers -> error.
    """
    found: dict[str, str] = {}
    for full in names:
        suffix = full.rsplit(".", 1)[-1]
        if suffix in MARKER_SUFFIXES:
            found[suffix] = full
    if len(found) > 1:
        raise Exl3FormatError(
            f"{found[CODEBOOK_MCG]} and {found[CODEBOOK_MUL1]}: an EXL3 linear carries at most one codebook marker"
        )
    if found:
        return next(iter(found))
    return CODEBOOK_3INST


def check_marker(name: str, marker: torch.Tensor, codebook: str) -> None:
    """A marker tensor must be a scalar int32 holding the codebook's multiplier."""
    if marker.dtype != torch.int32:
        raise Exl3FormatError(f"{name}: marker dtype {marker.dtype} is not torch.int32")
    if marker.dim() != 0:
        raise Exl3FormatError(f"{name}: marker shape {list(marker.shape)} is not a scalar []")
    expected = MARKER_VALUES[codebook]
    if int(marker) != expected:
        raise Exl3FormatError(
            f"{name}: marker value {int(marker)} does not match the {codebook} multiplier {expected}"
        )


def unpack_signs(packed: torch.Tensor, name: str) -> torch.Tensor:
    """Legacy packed sign words (int16 [n]) -> fp16 [16n] of ±1 (bit b of word w -> element 16w+b, set = −1)."""
    if packed.dtype != torch.int16 or packed.dim() != 1:
        raise Exl3FormatError(f"{name}: legacy sign tensor must be int16 rank 1, got {packed.dtype} {list(packed.shape)}")
    bits = (packed.to(torch.int64)[:, None] >> torch.arange(16)) & 1
    return (1.0 - 2.0 * bits.reshape(-1)).to(torch.float16)


def _resolve_table(codebook: str | torch.Tensor) -> torch.Tensor:
    if isinstance(codebook, str):
        return codebook_table(codebook)
    if codebook.dtype != torch.float16 or codebook.shape != (1 << 16,):
        raise Exl3FormatError(f"codebook table must be fp16 [65536], got {codebook.dtype} {list(codebook.shape)}")
    return codebook


def _check_vector(name: str, vector: torch.Tensor, length: int, what: str) -> None:
    if vector.dim() != 1 or vector.shape[0] != length:
        raise Exl3FormatError(f"{name}: shape {list(vector.shape)} does not match [{length}] ({what})")
    if not vector.dtype.is_floating_point:
        raise Exl3FormatError(f"{name}: dtype {vector.dtype} is not floating point")


def _check_shapes(
    trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, name: str
) -> tuple[int, int]:
    k_from_trellis(trellis.shape, f"{name}.trellis")
    if trellis.dtype != torch.int16:
        raise Exl3FormatError(f"{name}.trellis: dtype {trellis.dtype} is not torch.int16")
    kp, np_ = TILE * trellis.shape[0], TILE * trellis.shape[1]
    if kp % HADAMARD_BLOCK or np_ % HADAMARD_BLOCK:
        raise Exl3FormatError(
            f"{name}.trellis: shape {list(trellis.shape)} gives a {kp}x{np_} matrix; "
            f"both sides must be multiples of {HADAMARD_BLOCK} (first two dims multiples of 8)"
        )
    _check_vector(f"{name}.suh", suh, kp, "16 * trellis.shape[0]")
    _check_vector(f"{name}.svh", svh, np_, "16 * trellis.shape[1]")
    return kp, np_


def _hadamard_rows(m: torch.Tensor) -> torch.Tensor:
    """(I ⊗ H) · m for m [Kp, N]."""
    kp, n = m.shape
    h = hadamard_128(m.dtype)
    return torch.matmul(h, m.reshape(kp // HADAMARD_BLOCK, HADAMARD_BLOCK, n)).reshape(kp, n)


def _hadamard_last(m: torch.Tensor) -> torch.Tensor:
    """m · (I ⊗ H) along the last dimension (H per 128-block)."""
    lead, n = m.shape[:-1], m.shape[-1]
    h = hadamard_128(m.dtype)
    return torch.matmul(m.reshape(*lead, n // HADAMARD_BLOCK, HADAMARD_BLOCK), h).reshape(*lead, n)


def weight_hat(trellis: torch.Tensor, codebook: str | torch.Tensor, name: str = "linear") -> torch.Tensor:
    """Decode every tile: W_hat fp16 [Kp, Np] (bit-exact codebook values)."""
    k_from_trellis(trellis.shape, f"{name}.trellis")
    return decode_matrix(trellis, _resolve_table(codebook), f"{name}.trellis")


def full_weight(
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: str | torch.Tensor,
    name: str = "linear",
) -> torch.Tensor:
    """W = diag(suh) · Hk · W_hat · Hn · diag(svh), float32 [Kp, Np] (in, out)."""
    _check_shapes(trellis, suh, svh, name)
    w = weight_hat(trellis, codebook, name).to(torch.float32)
    w = _hadamard_rows(w)
    w = _hadamard_last(w)
    return suh.to(torch.float32)[:, None] * w * svh.to(torch.float32)[None, :]


def full_weight_fp16(
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: str | torch.Tensor,
    name: str = "linear",
) -> torch.Tensor:
    """W in fp16 [Kp, Np], rounded the way exllamav3's own reconstruction rounds it.

    Four steps, each computed in float32 and rounded to fp16: Hk·W_hat, ×suh
    (rows), ·Hn, ×svh (columns). On the fixture checkpoint's lm_head this
    reproduces `LinearEXL3.get_weight_tensor()` bit for bit; `full_weight`
    (no intermediate rounding) differs from it by up to ~1e-3 of max|W|.
    """
    _check_shapes(trellis, suh, svh, name)
    w = _hadamard_rows(weight_hat(trellis, codebook, name).to(torch.float32)).to(torch.float16)
    w = (w.to(torch.float32) * suh.to(torch.float32)[:, None]).to(torch.float16)
    w = _hadamard_last(w.to(torch.float32)).to(torch.float16)
    return (w.to(torch.float32) * svh.to(torch.float32)[None, :]).to(torch.float16)


def forward(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: str | torch.Tensor,
    bias: torch.Tensor | None = None,
    in_features: int | None = None,
    out_features: int | None = None,
    name: str = "linear",
) -> torch.Tensor:
    """y = x @ W[:in, :out] + bias without materialising W.

    Order: x ⊙ suh, H per 128-block, @ W_hat, H per 128-block, ⊙ svh, + bias.
    x is [..., in_features] (default Kp); the result is [..., out_features]
    (default Np) in x's dtype, computed in float32.
    """
    kp, np_ = _check_shapes(trellis, suh, svh, name)
    in_features = kp if in_features is None else in_features
    out_features = np_ if out_features is None else out_features
    if not 0 < in_features <= kp or kp - in_features >= HADAMARD_BLOCK:
        raise Exl3FormatError(f"{name}.trellis: in_features {in_features} does not pad to Kp {kp}")
    if not 0 < out_features <= np_ or np_ - out_features >= HADAMARD_BLOCK:
        raise Exl3FormatError(f"{name}.trellis: out_features {out_features} does not pad to Np {np_}")
    if x.shape[-1] != in_features:
        raise Exl3FormatError(f"{name}: input last dim {x.shape[-1]} != in_features {in_features}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] not in (out_features, np_)):
        raise Exl3FormatError(f"{name}.bias: shape {list(bias.shape)} is not [{np_}] or [{out_features}]")
    xf = x.to(torch.float32)
    if in_features < kp:
        xf = torch.nn.functional.pad(xf, (0, kp - in_features))
    xh = _hadamard_last(xf * suh.to(torch.float32))
    t = torch.matmul(xh, weight_hat(trellis, codebook, name).to(torch.float32))
    y = _hadamard_last(t) * svh.to(torch.float32)
    y = y[..., :out_features]
    if bias is not None:
        y = y + bias.to(torch.float32)[:out_features]
    return y.to(x.dtype)


@dataclass(frozen=True)
class Exl3Linear:
    """The validated tensors of one EXL3 linear."""

    prefix: str
    trellis: torch.Tensor
    suh: torch.Tensor
    svh: torch.Tensor
    codebook: str
    k: float
    bias: torch.Tensor | None = None

    @property
    def padded_in(self) -> int:
        return TILE * self.trellis.shape[0]

    @property
    def padded_out(self) -> int:
        return TILE * self.trellis.shape[1]


def load_linear(tensors: Mapping[str, torch.Tensor], prefix: str) -> Exl3Linear:
    """Collect and check the tensors `prefix.{trellis,suh,svh,mcg|mul1,bias}` (format doc §1.6).

    Accepts the legacy packed-sign `su`/`sv` in place of `suh`/`svh`. Any
    mismatch raises `Exl3FormatError` naming the tensor.
    """
    key = f"{prefix}.trellis"
    if key not in tensors:
        raise Exl3FormatError(f"{key}: missing")
    trellis = tensors[key]
    if trellis.dtype != torch.int16:
        raise Exl3FormatError(f"{key}: dtype {trellis.dtype} is not torch.int16")
    k = k_from_trellis(trellis.shape, key)
    if trellis.shape[0] % 8 or trellis.shape[1] % 8:
        raise Exl3FormatError(f"{key}: shape {list(trellis.shape)}: first two dims must be multiples of 8")

    def scales(new: str, legacy: str, length: int) -> torch.Tensor:
        if f"{prefix}.{new}" in tensors:
            vector = tensors[f"{prefix}.{new}"]
            if vector.dtype != torch.float16:
                raise Exl3FormatError(f"{prefix}.{new}: dtype {vector.dtype} is not torch.float16")
            _check_vector(f"{prefix}.{new}", vector, length, f"16 * {key} dim")
            return vector
        if f"{prefix}.{legacy}" in tensors:
            signs = unpack_signs(tensors[f"{prefix}.{legacy}"], f"{prefix}.{legacy}")
            _check_vector(f"{prefix}.{legacy}", signs, length, f"16 * {key} dim, unpacked")
            return signs
        raise Exl3FormatError(f"{prefix}.{new}: missing")

    suh = scales("suh", "su", TILE * trellis.shape[0])
    svh = scales("svh", "sv", TILE * trellis.shape[1])
    prefix_dot = f"{prefix}."
    own = [n for n in tensors if n.startswith(prefix_dot) and "." not in n[len(prefix_dot) :]]
    codebook = codebook_from_tensors(own)
    if codebook != CODEBOOK_3INST:
        check_marker(f"{prefix}.{codebook}", tensors[f"{prefix}.{codebook}"], codebook)
    if k in HALF_K and codebook != CODEBOOK_MUL1:
        raise Exl3FormatError(f"{key}: half-integer K={k} requires a {prefix}.mul1 marker")
    if f"{prefix}.weight" in tensors:
        raise Exl3FormatError(f"{prefix}.weight: present beside {key}; an EXL3 linear has no dense weight")
    bias = tensors.get(f"{prefix}.bias")
    if bias is not None:
        if bias.dtype != torch.float16:
            raise Exl3FormatError(f"{prefix}.bias: dtype {bias.dtype} is not torch.float16")
        _check_vector(f"{prefix}.bias", bias, TILE * trellis.shape[1], f"16 * {key} dim 1")
    return Exl3Linear(prefix=prefix, trellis=trellis, suh=suh, svh=svh, codebook=codebook, k=k, bias=bias)
