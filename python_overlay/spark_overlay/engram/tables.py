"""Where a layer's Engram table is in the checkpoint: ``layers.{L}.engram.embed.weight``
(F8_E4M3 ``[rows, 256]``) and ``.scale`` (F8_E8M0 ``[rows, 8]``), from
``model.safetensors.index.json`` and the shard's safetensors header."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

from . import EngramError

MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class Span:
    path: str
    offset: int  # absolute offset of the tensor's first byte


@dataclass(frozen=True)
class CheckpointTable:
    layer: int
    rows: int
    weight: Span
    scale: Span


def _header(path: str) -> tuple[dict, int]:
    with open(path, "rb") as f:
        raw = f.read(8)
        size = os.fstat(f.fileno()).st_size
        if len(raw) < 8:
            raise EngramError(f"{path}: too short for a safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise EngramError(f"{path}: safetensors header length {n} is corrupt or runs past the file")
        try:
            header = json.loads(f.read(n))
        except ValueError as err:
            raise EngramError(f"{path}: safetensors header is not valid JSON: {err}") from err
    return header, 8 + n


def checkpoint_table(directory: str, layer: int) -> CheckpointTable:
    """Locate and check ``layer``'s weight and scale under ``directory``."""
    wname = f"layers.{layer}.engram.embed.weight"
    sname = f"layers.{layer}.engram.embed.scale"
    index_path = os.path.join(directory, "model.safetensors.index.json")
    try:
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError) as err:
        raise EngramError(f"{index_path}: cannot read the weight_map: {err}") from err
    spans = {}
    rows = {}
    for name, dtype, width in ((wname, "F8_E4M3", 256), (sname, "F8_E8M0", 8)):
        key = next((k for k in weight_map if k == name or k.endswith("." + name)), None)
        if key is None:
            raise EngramError(f"{index_path}: no tensor {name!r} in the weight_map")
        path = os.path.join(directory, weight_map[key])
        header, data_start = _header(path)
        entry = header.get(key)
        if entry is None:
            raise EngramError(f"{path}: tensor {key!r} is not in this shard's header")
        shape = entry.get("shape")
        if entry.get("dtype") != dtype or not (isinstance(shape, list) and len(shape) == 2 and shape[1] == width):
            raise EngramError(
                f"{path}: tensor {key!r} is {entry.get('dtype')} {shape}, expected {dtype} [rows, {width}]"
            )
        begin, end = entry["data_offsets"]
        if end - begin != shape[0] * width or data_start + end > os.path.getsize(path):
            raise EngramError(f"{path}: tensor {key!r} data [{begin}, {end}) is inconsistent or truncated")
        spans[name] = Span(path, data_start + begin)
        rows[name] = shape[0]
    if rows[wname] != rows[sname]:
        raise EngramError(f"{directory}: {wname} has {rows[wname]} rows but {sname} has {rows[sname]}")
    return CheckpointTable(layer, rows[wname], spans[wname], spans[sname])
