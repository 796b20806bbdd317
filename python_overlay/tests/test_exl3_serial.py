"""EXL3 kernels are kept off concurrent streams (backends/serial.py), checked on the CPU.

The rule: every EXL3 launch sequence of a CUDA device runs on that device's one EXL3 stream, under
its lock; the EXL3 stream waits for the caller's stream before, and the caller's stream waits for it
after. Driven with a recording stand-in for torch.cuda's stream calls, from several host threads and
several "caller" streams (vLLM's DeepSeek V4.1 runs work on auxiliary streams).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import torch

from spark_overlay.exl3.backends import cuda_backend, serial


class Recorder(serial.Streams):
    """Streams are names; `current` is per thread (as torch's current stream is)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.local = threading.local()
        self.created = 0
        self.lock = threading.Lock()

    def current(self, device):
        return getattr(self.local, "stream", f"default:{device}")

    def create(self, device):
        with self.lock:
            self.created += 1
        return f"exl3:{device}"

    def wait(self, waiter, waitee):
        with self.lock:
            self.log.append(("wait", waiter, waitee))

    def use(self, stream):
        rec = self

        class Use:
            def __enter__(self):
                self.old = rec.current(None)
                rec.local.stream = stream

            def __exit__(self, *exc):
                rec.local.stream = self.old

        return Use()


def test_launches_from_any_stream_and_thread_run_one_at_a_time_on_the_one_exl3_stream():
    rec = Recorder()
    ser = serial.Serializer(rec)
    active, overlaps, ran_on = [0], [], []
    guard = threading.Lock()

    def launch(caller_stream):
        rec.local.stream = caller_stream
        with ser.kernels("cuda:0"):
            with guard:
                active[0] += 1
                if active[0] > 1:
                    overlaps.append(caller_stream)
                ran_on.append(rec.current(None))
            time.sleep(0.002)
            with ser.kernels("cuda:0"):  # nested (the fused MoE's fallback loop): same stream, no new waits
                ran_on.append(rec.current(None))
            with guard:
                active[0] -= 1
        assert rec.current(None) == caller_stream  # the caller's stream is current again

    threads = [threading.Thread(target=launch, args=(f"aux{i % 3}",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [], f"EXL3 launch sequences overlapped (callers {overlaps})"
    assert set(ran_on) == {"exl3:cuda:0"} and len(ran_on) == 24
    assert rec.created == 1
    # Each sequence: the EXL3 stream waits for its caller, then the caller waits for the EXL3 stream.
    assert len(rec.log) == 24
    for before, after in zip(rec.log[::2], rec.log[1::2]):
        assert before[0] == after[0] == "wait"
        assert before[1] == "exl3:cuda:0" and before[2].startswith("aux")
        assert after[1] == before[2] and after[2] == "exl3:cuda:0"


def test_each_device_has_its_own_stream_and_cpu_only_takes_the_lock():
    rec = Recorder()
    ser = serial.Serializer(rec)
    with ser.kernels("cuda:0"):
        pass
    with ser.kernels("cuda:1"):
        pass
    with ser.kernels("cpu"):
        assert rec.current(None) == "default:None"
    assert rec.created == 2
    assert ser.stream_of("cuda:0") == "exl3:cuda:0" and ser.stream_of("cuda:1") == "exl3:cuda:1"
    assert ser.stream_of("cpu") is None


def test_the_backend_entry_points_go_through_the_serializer(monkeypatch):
    entered = []

    class Spy:
        def kernels(self, device):
            entered.append(str(device))
            return serial.Serializer(Recorder()).kernels(device)

    monkeypatch.setattr(serial, "serializer", Spy())
    layer = SimpleNamespace(exl3_cuda=lambda x, bias: x + 1, exl3_cuda_moe=lambda x, w, i, m, on: x * 2)
    x = torch.ones(2, 4)
    assert torch.equal(cuda_backend.cuda_linear(layer, x, None), x + 1)
    assert torch.equal(cuda_backend.cuda_moe(layer, x, None, None, None, False), x * 2)
    assert entered == ["cpu", "cpu"]
