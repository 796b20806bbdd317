"""Build and load spark-kit's own decode kernels (decode_moe.cu) as a plain shared library.

The source has no torch headers: nvcc (on PATH, else under torch's CUDA_HOME) compiles it (with the
decode_*.cuh it includes) for the device's compute capability into ~/.cache/spark-kit/exl3-decode, keyed by their hash,
and ctypes loads it. Every launcher returns a cudaError_t; `check` turns a non-zero one into Exl3FormatError.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from ...format.errors import Exl3FormatError

SOURCE = Path(__file__).with_name("decode_moe.cu")
_libs: dict[str, ctypes.CDLL] = {}


def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:
        return None
    return str(Path(CUDA_HOME) / "bin" / "nvcc") if CUDA_HOME else None


def cache_dir() -> Path:
    return Path.home() / ".cache" / "spark-kit" / "exl3-decode"


def library_path(arch: str, defines: tuple[str, ...] = ()) -> Path:
    """The cached library, keyed by the source, the headers it includes (decode_*.cuh beside it) and the macros."""
    digest = hashlib.sha256(" ".join(defines).encode())
    for part in [SOURCE, *sorted(SOURCE.parent.glob("*.cuh"))]:
        digest.update(part.read_bytes())
    return cache_dir() / f"decode_moe-{arch}-{digest.hexdigest()[:16]}.so"


def load(arch: str, defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The library for `arch` (e.g. "sm_90"): built once per source version, then loaded from the cache.
    `defines`: macros for a bench build (SPARK_TIMELINE: decode_timeline.cuh's per-block timeline)."""
    key = " ".join((arch, *defines))
    if key in _libs:
        return _libs[key]
    path = library_path(arch, defines)
    if not path.exists():
        nvcc = nvcc_path()
        if nvcc is None:
            raise Exl3FormatError("exl3 decode kernel: nvcc not found (put the CUDA toolkit's bin on PATH); it builds once")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        cmd = [nvcc, f"-arch={arch}", "-O3", "-shared", "-Xcompiler", "-fPIC", *(f"-D{d}" for d in defines), str(SOURCE),
               "-o", str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise Exl3FormatError(f"exl3 decode kernel: nvcc failed building {SOURCE.name}: {done.stderr.strip()[-400:]}")
        tmp.replace(path)
    lib = ctypes.CDLL(str(path))
    lib.spark_decode_moe.restype = ctypes.c_int
    lib.spark_decode_moe.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
    ]
    lib.spark_decode_prep.restype = ctypes.c_int
    lib.spark_decode_prep.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p,
    ]
    lib.spark_decode_cast.restype = ctypes.c_int
    lib.spark_decode_cast.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                                      ctypes.c_void_p]
    lib.spark_floor_read.restype = ctypes.c_int
    lib.spark_floor_read.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.spark_decode_supports.restype = ctypes.c_int
    lib.spark_decode_supports.argtypes = [ctypes.c_int]
    lib.spark_timeline_read.restype = ctypes.c_int
    lib.spark_timeline_read.argtypes = [ctypes.c_void_p]
    _libs[key] = lib
    return lib


def check(err: int, what: str) -> None:
    if err:
        raise Exl3FormatError(f"exl3 decode kernel: {what} failed to launch (cudaError {err})")
