"""python_overlay/tools/all_reduce.py, the rank preflight runs on each node (docs/preflight.md,
"Fabric all-reduce"): two gloo ranks on this machine meet, time, sum right and print one JSON line
each; a rank whose peer never comes prints an error line, not a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "all_reduce.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank(r: int, world: int, port: int, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, str(TOOL), "--rank", str(r), "--world", str(world), "--master-addr", "127.0.0.1"]
    argv += ["--master-port", str(port), "--backend", "gloo", "--bw-bytes", str(1 << 20), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_gloo_ranks_meet_and_sum_right():
    port = free_port()
    procs = [rank(0, 2, port), rank(1, 2, port)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        line = json.loads(out.strip().splitlines()[-1])
        assert line["correct"] is True, line
        assert set(line["latency_us"]) == {"8192", "32768", "65536"}, line
        assert all(v > 0 for v in line["latency_us"].values()), line
        assert line["busbw_gbps"] > 0 and line["world"] == 2, line


def test_a_rank_alone_reports_an_error_line():
    p = rank(1, 2, free_port(), "--timeout-s", "3")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    line = json.loads(out.strip().splitlines()[-1])
    assert "error" in line and line["rank"] == 1, line
