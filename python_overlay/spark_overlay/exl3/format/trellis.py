"""EXL3 trellis tiles: bitstream layout, state extraction and tile element order.

A trellis tensor is int16 [Kp/16, Np/16, 16*K]; each [i, j] row is one 16x16
tile of W_hat stored as a circular bitstream of R = 256*K bits (format doc
§2.2). Words are read as little-endian uint32 pairs and each uint32 is
consumed MSB-first. Position t (0..255) owns D(t) bits ending at S(t); its
16-bit state is the window [S(t) - 16, S(t)) of the stream, taken mod R.

The 256 positions of a tile map to (row, col) by the tensor-core permutation
of §2.3. Everything here works on all tiles at once with tensor indexing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .errors import Exl3FormatError

TILE = 16
TILE_ELEMENTS = TILE * TILE
INTEGER_K = (1, 2, 3, 4, 5, 6, 7, 8)
HALF_K = (1.5, 2.5, 3.5)
VALID_K = INTEGER_K + HALF_K
HALF_K_PATTERN = 0xAAAA  # bit (t mod 16) set -> odd position takes one extra bit

# Tiles decoded per batch: bounds peak memory (~8 int64 [N, 256] temporaries).
_CHUNK_TILES = 8192


def words_per_tile(k: float) -> int:
    """Number of int16 words per tile for bits-per-weight `k` (16*K)."""
    if k not in VALID_K:
        raise Exl3FormatError(f"unsupported EXL3 bits per weight {k!r}; expected one of {VALID_K}")
    return int(16 * k)


def k_from_words(words: int) -> float:
    """Bits per weight for a tile of `words` int16 words: 16..128 -> 1..8, 24/40/56 -> 1.5/2.5/3.5."""
    if words % 16 == 0 and 1 <= words // 16 <= 8:
        return words // 16
    if words in (24, 40, 56):
        return words / 16
    raise Exl3FormatError(
        f"trellis last dimension {words} is not a valid EXL3 tile size "
        "(expected 16, 32, ..., 128 or 24, 40, 56)"
    )


def symbol_widths(k: float) -> torch.Tensor:
    """D(t) for t = 0..255: bits consumed by each position (int64 [256])."""
    words_per_tile(k)
    t = torch.arange(TILE_ELEMENTS, dtype=torch.int64)
    if k in HALF_K:
        base = int(k - 0.5)
        return base + ((HALF_K_PATTERN >> (t % 16)) & 1)
    return torch.full((TILE_ELEMENTS,), int(k), dtype=torch.int64)


@dataclass(frozen=True)
class StreamLayout:
    """Where each position's 16-bit window sits in a tile's stream.

    `first_word[t]` / `second_word[t]` index the (one or two) uint32 words
    covering the window; `offset[t]` is the window's start bit within
    `first_word`, counted from the MSB.
    """

    bits: int
    uint32_words: int
    widths: torch.Tensor
    ends: torch.Tensor
    first_word: torch.Tensor
    second_word: torch.Tensor
    offset: torch.Tensor


@lru_cache(maxsize=None)
def stream_layout(k: float) -> StreamLayout:
    widths = symbol_widths(k)
    ends = torch.cumsum(widths, 0)
    bits = int(ends[-1])
    uint32_words = bits // 32
    start = (ends - TILE) % bits
    first = start // 32
    return StreamLayout(
        bits=bits,
        uint32_words=uint32_words,
        widths=widths,
        ends=ends,
        first_word=first,
        second_word=(first + 1) % uint32_words,
        offset=start % 32,
    )


@lru_cache(maxsize=None)
def tile_permutation() -> torch.Tensor:
    """perm[t] = 16*r + c: the tile element filled by stream position t (int64 [256])."""
    t = torch.arange(TILE_ELEMENTS, dtype=torch.int64)
    lane = t >> 3
    j = t & 7
    r = 2 * (lane & 3) + (j & 1) + 8 * ((j >> 1) & 1)
    c = (lane >> 2) + 8 * ((j >> 2) & 1)
    return 16 * r + c


@lru_cache(maxsize=None)
def inverse_tile_permutation() -> torch.Tensor:
    """inv[16*r + c] = t: the stream position that fills tile element (r, c)."""
    perm = tile_permutation()
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(TILE_ELEMENTS, dtype=torch.int64)
    return inv


def _uint32_words(tiles: torch.Tensor) -> torch.Tensor:
    """int16 [N, 16K] -> little-endian uint32 pairs as int64 [N, 8K]."""
    u16 = tiles.to(torch.int64) & 0xFFFF
    return u16[:, 0::2] | (u16[:, 1::2] << 16)


def _windows(words: torch.Tensor, layout: StreamLayout, positions: torch.Tensor) -> torch.Tensor:
    """16-bit states of `positions` for every tile in `words` (int64 [N, len(positions)])."""
    offset = layout.offset[positions]
    hi = words[:, layout.first_word[positions]]
    lo = words[:, layout.second_word[positions]]
    # (hi:lo) << offset, top 32 bits; hi << 31 still fits in int64.
    top = (hi << offset) | (lo >> (32 - offset))
    return (top >> 16) & 0xFFFF


def _check_trellis(trellis: torch.Tensor, name: str) -> float:
    if trellis.dtype != torch.int16:
        raise Exl3FormatError(f"{name}: dtype {trellis.dtype} is not torch.int16")
    if trellis.dim() != 3:
        raise Exl3FormatError(f"{name}: shape {list(trellis.shape)} is not rank 3 [Kp/16, Np/16, 16*K]")
    try:
        return k_from_words(trellis.shape[-1])
    except Exl3FormatError as err:
        raise Exl3FormatError(f"{name}: {err}") from None


def decode_states(trellis: torch.Tensor, name: str = "trellis") -> torch.Tensor:
    """States of every tile in stream order: int16 [T0, T1, 16K] -> int32 [T0, T1, 256]."""
    k = _check_trellis(trellis, name)
    layout = stream_layout(k)
    t0, t1, words = trellis.shape
    flat = trellis.reshape(-1, words)
    out = torch.empty((flat.shape[0], TILE_ELEMENTS), dtype=torch.int32)
    positions = torch.arange(TILE_ELEMENTS)
    for lo in range(0, flat.shape[0], _CHUNK_TILES):
        chunk = _uint32_words(flat[lo : lo + _CHUNK_TILES])
        out[lo : lo + _CHUNK_TILES] = _windows(chunk, layout, positions).to(torch.int32)
    return out.reshape(t0, t1, TILE_ELEMENTS)


def states_to_matrix(states: torch.Tensor) -> torch.Tensor:
    """Place per-tile states [T0, T1, 256] (stream order) into the [16*T0, 16*T1] matrix."""
    t0, t1, _ = states.shape
    tiles = states[..., inverse_tile_permutation()]
    return tiles.reshape(t0, t1, TILE, TILE).permute(0, 2, 1, 3).reshape(TILE * t0, TILE * t1)


def matrix_to_states(matrix: torch.Tensor) -> torch.Tensor:
    """Inverse of `states_to_matrix`: [16*T0, 16*T1] -> [T0, T1, 256] in stream order."""
    rows, cols = matrix.shape
    if rows % TILE or cols % TILE:
        raise Exl3FormatError(f"matrix shape {[rows, cols]} is not a multiple of the 16x16 tile")
    t0, t1 = rows // TILE, cols // TILE
    tiles = matrix.reshape(t0, TILE, t1, TILE).permute(0, 2, 1, 3).reshape(t0, t1, TILE_ELEMENTS)
    return tiles[..., tile_permutation()]


def decode_matrix(trellis: torch.Tensor, table: torch.Tensor, name: str = "trellis") -> torch.Tensor:
    """W_hat: look every state of `trellis` up in the fp16 `table`; [16*T0, 16*T1] fp16.

    Decodes one band of input tiles at a time so the int64 temporaries stay
    bounded for large matrices.
    """
    k = _check_trellis(trellis, name)
    layout = stream_layout(k)
    t0, t1, words = trellis.shape
    out = torch.empty((TILE * t0, TILE * t1), dtype=table.dtype)
    # Positions taken in tile-element order, so the lookup lands in place.
    positions = inverse_tile_permutation()
    band = max(1, _CHUNK_TILES // max(t1, 1))
    for i in range(0, t0, band):
        rows = trellis[i : i + band]
        n = rows.shape[0]
        states = _windows(_uint32_words(rows.reshape(-1, words)), layout, positions)
        values = table[states].reshape(n, t1, TILE, TILE).permute(0, 2, 1, 3)
        out[TILE * i : TILE * (i + n)] = values.reshape(TILE * n, TILE * t1)
    return out
