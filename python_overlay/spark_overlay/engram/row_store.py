"""Pure-Python row store: one rank's rows of one layer, read with ``os.preadv``.

Rows come back as 264-byte records (256 FP8 E4M3 weight bytes || 8 E8M0
scale bytes) into a caller-owned uint8 buffer ``[n, 264]``. Reads use O_DIRECT
(4 KiB-aligned offsets, lengths and buffers; the page cache is bypassed, so
lookups never fill host memory, which on GB10 is the GPU's) and fall back to
buffered reads where the filesystem refuses it, logged once. Misses go to a
small thread pool (``preadv`` releases the GIL); fewer than ``SERIAL_BELOW``
are read on the caller's thread. Id -1 is padding and ids outside the owned
range are zero-filled; an id outside the table or a short read raises
:class:`EngramError` naming the file and offset.

The host side makes no CUDA calls, so :meth:`RowStore.lookup_into` may run in
a CUDA host callback (see ``hook``). docs/decisions.md says why this is pure
Python rather than a compiled extension.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from . import EngramError
from .packed import HEADER_BYTES, ROW_BYTES, PackedHeader, read_header
from .tables import CheckpointTable

logger = logging.getLogger("vllm.spark_overlay.engram")

ALIGN = 4096
SERIAL_BELOW = 8
WEIGHT_BYTES = 256
SCALE_BYTES = 8

_fallback_reported = False
_fallback_lock = threading.Lock()


def _report_fallback(path: str, why: str) -> None:
    global _fallback_reported
    with _fallback_lock:
        if not _fallback_reported:
            _fallback_reported = True
            logger.warning(
                "Engram rows: O_DIRECT refused for %s (%s); reading through the page cache", path, why
            )


class _File:
    """A file read at positions, directly (aligned bounce buffer) or buffered."""

    def __init__(self, path: str, direct: bool) -> None:
        self.path = path
        self.direct = False
        flag = getattr(os, "O_DIRECT", 0)
        if direct and flag:
            try:
                fd = os.open(path, os.O_RDONLY | flag)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise EngramError(f"{path}: {err.strerror}") from err
                _report_fallback(path, f"open: {err.strerror}")
            else:
                probe = mmap.mmap(-1, ALIGN)
                try:
                    os.preadv(fd, [probe], 0)
                    self.fd, self.direct = fd, True
                    return
                except OSError as err:
                    os.close(fd)
                    if err.errno != errno.EINVAL:
                        raise EngramError(f"{path}: cannot read: {err.strerror}") from err
                    _report_fallback(path, f"read: {err.strerror}")
                finally:
                    probe.close()
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except OSError as err:
            raise EngramError(f"{path}: {err.strerror}") from err
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    def read_into(self, offset: int, dest: memoryview, scratch: memoryview) -> None:
        """Fill ``dest`` from ``offset``; ``scratch`` is a page-aligned buffer of >= 8 KiB."""
        n = len(dest)
        if self.direct:
            start = offset & ~(ALIGN - 1)
            span = -(-(offset + n - start) // ALIGN) * ALIGN
            got = os.preadv(self.fd, [scratch[:span]], start)
            skip = offset - start
            if got < skip + n:
                raise EngramError(
                    f"{self.path}: short read at offset {offset}: got {max(0, got - skip)} of {n} bytes (file truncated?)"
                )
            dest[:] = scratch[skip : skip + n]
            return
        got = os.preadv(self.fd, [dest], offset)
        if got < n:
            raise EngramError(f"{self.path}: short read at offset {offset}: got {got} of {n} bytes (file truncated?)")

    def close(self) -> None:
        os.close(self.fd)


class RowStore:
    """Rows ``[lo, hi)`` of a ``rows``-row table, from a packed shard or the checkpoint."""

    def __init__(
        self,
        *,
        layer: int,
        rows: int,
        lo: int,
        hi: int,
        packed: str | None = None,
        table: CheckpointTable | None = None,
        direct: bool = True,
        threads: int = 16,
        resident_scales: bool = False,
    ) -> None:
        if (packed is None) == (table is None):
            raise ValueError("RowStore needs exactly one of packed= or table=")
        if threads < 1:
            raise EngramError("Engram reader threads must be at least 1")
        self.layer, self.rows, self.lo, self.hi = layer, rows, lo, hi
        self.resident = None
        if packed is not None:
            read_header(packed, PackedHeader(layer, lo, hi, rows))
            self.packed = _File(packed, direct)
            self.primary = packed
        else:
            if hi > table.rows:
                raise EngramError(f"{table.weight.path}: owned rows [{lo}, {hi}) exceed the {table.rows}-row table")
            self.packed = None
            self.weight = _File(table.weight.path, direct)
            self.scale = _File(table.scale.path, direct)
            self.w_off, self.s_off = table.weight.offset, table.scale.offset
            self.primary = table.weight.path
            if resident_scales:
                self.resident = bytearray((hi - lo) * SCALE_BYTES)
                fd = os.open(table.scale.path, os.O_RDONLY)
                try:
                    view, done = memoryview(self.resident), 0
                    while done < len(view):
                        got = os.preadv(fd, [view[done : done + (8 << 20)]], self.s_off + lo * SCALE_BYTES + done)
                        if got <= 0:
                            raise EngramError(f"{table.scale.path}: short read at offset {self.s_off + lo * 8 + done}")
                        done += got
                    if hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads - 1, "engram-io") if threads > 1 else None
        self._local = threading.local()
        self.direct = (self.packed or self.weight).direct

    def _scratch(self) -> memoryview:
        s = getattr(self._local, "scratch", None)
        if s is None:
            s = memoryview(mmap.mmap(-1, 2 * ALIGN))
            self._local.scratch = s
        return s

    def _read(self, pairs, out: memoryview) -> None:
        scratch = self._scratch()
        for pos, rid in pairs:
            dest = out[pos * ROW_BYTES : (pos + 1) * ROW_BYTES]
            if self.packed is not None:
                self.packed.read_into(HEADER_BYTES + (rid - self.lo) * ROW_BYTES, dest, scratch)
            else:
                self.weight.read_into(self.w_off + rid * WEIGHT_BYTES, dest[:WEIGHT_BYTES], scratch)
                if self.resident is not None:
                    i = (rid - self.lo) * SCALE_BYTES
                    dest[WEIGHT_BYTES:] = self.resident[i : i + SCALE_BYTES]
                else:
                    self.scale.read_into(self.s_off + rid * SCALE_BYTES, dest[WEIGHT_BYTES:], scratch)

    def lookup_into(self, ids, out) -> int:
        """Fill ``out`` (writable buffer of ``len(ids) * 264`` bytes) with the rows of ``ids``
        (a sequence of ints). Returns the number of rows read from disk."""
        view = memoryview(out).cast("B")
        if hasattr(ids, "tolist"):
            ids = ids.tolist()  # numpy / torch: plain ints iterate much faster
        n = len(ids)
        if len(view) != n * ROW_BYTES:
            raise EngramError(f"Engram lookup buffer holds {len(view)} bytes, {n} ids need {n * ROW_BYTES}")
        zero = bytes(ROW_BYTES)
        misses = []
        for pos, rid in enumerate(ids):
            rid = int(rid)
            if rid == -1 or (0 <= rid < self.rows and not self.lo <= rid < self.hi):
                view[pos * ROW_BYTES : (pos + 1) * ROW_BYTES] = zero
            elif 0 <= rid < self.rows:
                misses.append((pos, rid))
            else:
                offset = (
                    HEADER_BYTES + (rid - self.lo) * ROW_BYTES if self.packed is not None else self.w_off + rid * WEIGHT_BYTES
                )
                raise EngramError(
                    f"{self.primary}: row id {rid} is outside the {self.rows}-row table of layer {self.layer} "
                    f"(it would be read at offset {offset})"
                )
        if len(misses) < SERIAL_BELOW or self._pool is None:
            self._read(misses, view)
            return len(misses)
        k = min(self.threads, len(misses))
        futures = [self._pool.submit(self._read, misses[i::k], view) for i in range(1, k)]
        error = None
        try:
            self._read(misses[0::k], view)
        except EngramError as err:
            error = err
        for f in futures:
            try:
                f.result()
            except EngramError as err:
                error = error or err
        if error is not None:
            raise error
        return len(misses)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for f in (self.packed,) if self.packed is not None else (self.weight, self.scale):
            f.close()
