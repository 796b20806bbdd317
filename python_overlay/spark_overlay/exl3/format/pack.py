"""EXL3 packer: per-tile trellis states -> int16 trellis words (format doc §2.2, "Packing").

Each position t keeps only the low D(t) bits of its state (its symbol). The
symbols of positions 0..255 are concatenated MSB-first into one circular
stream, grouped into uint32 words MSB-first and stored as little-endian int16
pairs. A set of states is *valid* (decodes back to itself) when every state's
upper 16 - D(t) bits equal the low bits of the previous state, circularly:
`state_t >> D(t) == state_{t-1} mod 2^(16 - D(t))`.
"""

from __future__ import annotations

import torch

from .errors import Exl3FormatError
from .trellis import (
    TILE_ELEMENTS,
    matrix_to_states,
    stream_layout,
    symbol_widths,
    words_per_tile,
)

_CHUNK_TILES = 4096


def _stream_bit_sources(k: float) -> tuple[torch.Tensor, torch.Tensor]:
    """For each stream bit b: the position owning it and the bit of that position's state."""
    layout = stream_layout(k)
    b = torch.arange(layout.bits, dtype=torch.int64)
    owner = torch.searchsorted(layout.ends, b, right=True)
    shift = layout.ends[owner] - 1 - b
    return owner, shift


def _to_int16(u16: torch.Tensor) -> torch.Tensor:
    return torch.where(u16 >= 0x8000, u16 - 0x10000, u16).to(torch.int16)


def _check_states(states: torch.Tensor) -> torch.Tensor:
    if states.dtype.is_floating_point or states.dtype.is_complex or states.dtype == torch.bool:
        raise Exl3FormatError(f"states must be an integer tensor, got {states.dtype}")
    if states.dim() < 1 or states.shape[-1] != TILE_ELEMENTS:
        raise Exl3FormatError(f"states shape {list(states.shape)} must end in {TILE_ELEMENTS}")
    wide = states.to(torch.int64)
    if wide.numel() and (int(wide.min()) < 0 or int(wide.max()) > 0xFFFF):
        raise Exl3FormatError("states must lie in [0, 65536)")
    return wide


def pack_states(states: torch.Tensor, k: float) -> torch.Tensor:
    """Pack tile states [..., 256] (stream order) into trellis words int16 [..., 16*K].

    Only the low D(t) bits of each state are stored; invalid state sequences
    pack without error but will not decode back to themselves.
    """
    wide = _check_states(states)
    words = words_per_tile(k)
    layout = stream_layout(k)
    owner, shift = _stream_bit_sources(k)
    weights = torch.tensor([1 << (31 - q) for q in range(32)], dtype=torch.int64)
    lead = wide.shape[:-1]
    flat = wide.reshape(-1, TILE_ELEMENTS)
    out = torch.empty((flat.shape[0], words), dtype=torch.int16)
    for lo in range(0, flat.shape[0], _CHUNK_TILES):
        chunk = flat[lo : lo + _CHUNK_TILES]
        bits = (chunk[:, owner] >> shift) & 1
        u32 = (bits.reshape(-1, layout.uint32_words, 32) * weights).sum(-1)
        pairs = torch.stack((u32 & 0xFFFF, u32 >> 16), dim=-1).reshape(-1, words)
        out[lo : lo + _CHUNK_TILES] = _to_int16(pairs)
    return out.reshape(*lead, words)


def pack_matrix(state_matrix: torch.Tensor, k: float) -> torch.Tensor:
    """Pack a [Kp, Np] matrix of states (W_hat layout) into a trellis [Kp/16, Np/16, 16*K]."""
    return pack_states(matrix_to_states(state_matrix), k)


def states_from_symbols(symbols: torch.Tensor, k: float) -> torch.Tensor:
    """The unique valid (tail-biting) states for per-position symbols [..., 256].

    state_t = the last 16 bits of the stream ending at position t, i.e.
    `(state_{t-1} << D(t) | symbol_t) mod 2^16`, wrapping from position 255
    back to 0. Two passes over the ring settle the wrap-around.
    """
    wide = _check_states(symbols)
    widths = symbol_widths(k)
    if bool((wide >= (1 << widths)).any()):
        raise Exl3FormatError(f"symbols exceed their D(t)-bit widths for K={k}")
    lead = wide.shape[:-1]
    flat = wide.reshape(-1, TILE_ELEMENTS)
    state = torch.zeros(flat.shape[0], dtype=torch.int64)
    out = torch.empty_like(flat)
    for sweep in range(2):
        for t in range(TILE_ELEMENTS):
            state = ((state << int(widths[t])) | flat[:, t]) & 0xFFFF
            if sweep == 1:
                out[:, t] = state
    return out.reshape(*lead, TILE_ELEMENTS)


def states_are_valid(states: torch.Tensor, k: float) -> torch.Tensor:
    """Per tile: True when the states [..., 256] form a consistent tail-biting sequence."""
    wide = _check_states(states)
    widths = symbol_widths(k)
    previous = torch.roll(wide, shifts=1, dims=-1)
    keep = (1 << (16 - widths)) - 1
    return ((wide >> widths) == (previous & keep)).all(dim=-1)


def random_trellis(
    input_tiles: int,
    output_tiles: int,
    k: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A valid random trellis [input_tiles, output_tiles, 16*K] and its states [.., .., 256].

    Symbols are drawn uniformly for every position; the states follow from
    them (`states_from_symbols`), and the trellis is their packing.
    """
    widths = symbol_widths(k)
    shape = (input_tiles, output_tiles, TILE_ELEMENTS)
    noise = torch.randint(0, 1 << 16, shape, generator=generator, dtype=torch.int64)
    symbols = noise & ((1 << widths) - 1)
    states = states_from_symbols(symbols, k)
    return pack_states(states, k), states
