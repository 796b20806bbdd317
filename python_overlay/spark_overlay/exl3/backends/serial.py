"""EXL3 CUDA kernels never run concurrently on one device: one stream per device, one lock per device.

exllamav3's kernels keep one lock buffer per device; two of them on different
streams at the same time deadlock (the reference kit saw it). vLLM's DeepSeek
V4.1 runs work on auxiliary CUDA streams (`nvidia/model.py` creates three:
0.32 ~L694, 0.33 ~L749), so a layer may be called with any of them current.
`kernels(device)` serialises every EXL3 launch of the device:

* a per-device re-entrant lock, so host threads never interleave launch sequences;
* one EXL3 stream per device: it waits for the caller's stream, runs the
  launches, and the caller's stream waits for it, so on the device the
  kernels run one after another in issue order, each after the work it
  depends on. The pattern (fork/join by stream waits) is allowed inside a
  CUDA graph capture: the EXL3 stream joins the capture.

`Streams` is the seam the CPU test drives (tests/test_exl3_serial.py); on a
device that is not CUDA only the lock applies.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch


class Streams:
    """Stream operations of torch.cuda (the CPU test swaps in a recorder)."""

    def current(self, device: torch.device):
        return torch.cuda.current_stream(device)

    def create(self, device: torch.device):
        return torch.cuda.Stream(device=device)

    def wait(self, waiter, waitee) -> None:
        waiter.wait_stream(waitee)

    def use(self, stream):
        return torch.cuda.stream(stream)


class Serializer:
    """`with serializer.kernels(device): <launch EXL3 kernels>` — see the module docstring."""

    def __init__(self, streams: Streams | None = None) -> None:
        self.streams = streams or Streams()
        self._guard = threading.Lock()
        self._locks: dict[str, threading.RLock] = {}
        self._own: dict[str, object] = {}
        self._depth = threading.local()

    def _lock(self, key: str) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault(key, threading.RLock())

    @contextmanager
    def kernels(self, device: torch.device | str):
        device = torch.device(device)
        key = str(device)
        with self._lock(key):
            depth = getattr(self._depth, key, 0)
            if device.type != "cuda" or depth:  # not CUDA, or already on the EXL3 stream (nested call)
                setattr(self._depth, key, depth + 1)
                try:
                    yield
                finally:
                    setattr(self._depth, key, depth)
                return
            own = self._own.get(key)
            if own is None:
                own = self._own[key] = self.streams.create(device)
            caller = self.streams.current(device)
            self.streams.wait(own, caller)
            setattr(self._depth, key, 1)
            try:
                with self.streams.use(own):
                    yield
            finally:
                setattr(self._depth, key, 0)
                self.streams.wait(caller, own)

    def stream_of(self, device: torch.device | str):
        """The device's EXL3 stream (None before its first launch)."""
        return self._own.get(str(torch.device(device)))


serializer = Serializer()


def kernels(device: torch.device | str):
    """Serialise the EXL3 launches in the `with` body on `device` (module docstring)."""
    return serializer.kernels(device)  # looked up per call: tests swap the module-level serializer
