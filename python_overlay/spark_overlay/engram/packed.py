"""The packed-shard header (mirrors src/engram/header.rs): 4096 bytes, six
little-endian u64 words (magic 0x31344E4531565344 "DSV41EN1", layer, lo, hi,
table rows, record bytes 264), then one 264-byte weight||scale record per
owned row."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from . import EngramError

MAGIC = 0x31344E4531565344
HEADER_BYTES = 4096
ROW_BYTES = 264


@dataclass(frozen=True)
class PackedHeader:
    layer: int
    lo: int
    hi: int
    rows: int
    row_bytes: int = ROW_BYTES

    def to_bytes(self) -> bytes:
        words = struct.pack("<6Q", MAGIC, self.layer, self.lo, self.hi, self.rows, self.row_bytes)
        return words + bytes(HEADER_BYTES - len(words))

    def file_len(self) -> int:
        return HEADER_BYTES + (self.hi - self.lo) * self.row_bytes


def file_name(layer: int, rank: int, world: int) -> str:
    return f"engram-l{layer}-r{rank}of{world}.bin"


def read_header(path, want: PackedHeader | None = None) -> PackedHeader:
    """Parse and check a packed shard's header; errors name the file."""
    import os

    with open(path, "rb") as f:
        raw = f.read(48)
        size = os.fstat(f.fileno()).st_size
    if len(raw) < 48 or size < HEADER_BYTES:
        raise EngramError(f"{path}: packed Engram shard: {size} bytes is too short for the header")
    magic, layer, lo, hi, rows, row_bytes = struct.unpack("<6Q", raw)
    if magic != MAGIC:
        raise EngramError(f"{path}: packed Engram shard: magic {magic:#018x} is not {MAGIC:#018x}")
    h = PackedHeader(layer, lo, hi, rows, row_bytes)
    if row_bytes != ROW_BYTES or lo > hi or hi > rows:
        raise EngramError(f"{path}: packed Engram shard: malformed header {h}")
    if size != h.file_len():
        what = "truncated" if size < h.file_len() else "longer than its header says"
        raise EngramError(
            f"{path}: packed Engram shard: {what}: {size} bytes, the header needs {h.file_len()}"
        )
    if want is not None:
        if h.layer != want.layer:
            raise EngramError(f"{path}: packed Engram shard holds layer {h.layer}, expected {want.layer}")
        if (h.lo, h.hi) != (want.lo, want.hi):
            raise EngramError(
                f"{path}: packed Engram shard holds rows [{h.lo}, {h.hi}), this rank owns "
                f"[{want.lo}, {want.hi}) (packed for another rank or tensor-parallel size)"
            )
        if h.rows != want.rows:
            raise EngramError(
                f"{path}: packed Engram shard was packed from a {h.rows}-row table, the checkpoint has {want.rows}"
            )
    return h
