"""File-backed replacement of vLLM's ``ParallelEngramEmbedding`` (DeepSeek V4.1).

Released vLLM (0.32.0 - 0.34.0; docs/exl3-overlay.md "Which vLLM") defines, in
``vllm.models.deepseek_v41.common.engram``::

    class ParallelEngramEmbedding(nn.Module):
        def __init__(self, num_embeddings, dim, head_sizes, block_size=32, cpu_offload=False,
                     dp_shared_memory=False, use_thp=False)
        def _storage(self) -> tuple[Tensor, Tensor]
        def lookup(self, indices, out, background=False) -> None   # [T, heads] -> [T, local_heads, dim] bf16

Stock, the rank's rows live in HBM, or with ``cpu_offload`` in pinned host
memory (~47 GiB per layer, which on GB10 *is* GPU memory). :func:`register`
(called by the overlay plugin in every vLLM process) replaces those three
methods when, and only when, that class exists. At registration it compares
their signatures, read from the release's source (no import of the model
code), with the ones above and fails closed, naming the vLLM version, when
they differ; the methods are replaced when vLLM imports the module
(``after_import``), after the same check on the live class. The replacement
sets every attribute the release reads of the table (``n_hash_cols``,
``part_n_hash_cols``, ``head_start``, ``vocab_start_idx``, ``vocab_end_idx``,
``part_num_embeddings``, ``tp_size``, ``dp_size``, ``cpu_offload``, ``dim``;
python_overlay/tests/test_vllm_interfaces.py checks the list against the
installed release's source), keeps ``cpu_offload`` false so the model
starts no prefetch side stream, makes the
parameters 0-row dummies whose loader skips the checkpoint rows, and serves
``lookup`` from a :class:`RowStore` over this rank's packed shard
(``$SPARK_ENGRAM_PACKED_DIR/engram-l{L}-r{rank}of{tp}.bin``) or, without one,
over the checkpoint shards in ``$SPARK_ENGRAM_DIR``.

Graph-safety contract (the reference kit's, kept): on CUDA, ``lookup``
enqueues on the current stream (1) a copy of this rank's ids into a pinned,
preallocated host buffer, (2) a host function (``cuLaunchHostFunc``) that
reads the rows into a pinned, preallocated record buffer, (3) a non-blocking
copy of the records to a preallocated device buffer and (4) the dequant
kernel. Nothing in (2) calls CUDA, nothing allocates memory whose size
depends on data, and no step syncs the host, so the sequence can be captured
in a CUDA graph and replayed. The host function needs the GIL (it is Python);
torch releases the GIL in its blocking calls, so a replay never waits on a
thread that holds it. An error inside the host function (an id outside the
table, a short read) is logged at once with file and offset, the step's rows
are zeros, and the next ``lookup`` call raises it.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import logging
import os
import threading
from dataclasses import dataclass

from spark_overlay import source
from spark_overlay.after_import import after_import

from . import EngramError
from .layout import Geometry, owned_range
from .packed import ROW_BYTES, file_name

logger = logging.getLogger("vllm.spark_overlay.engram")

MODULE = "vllm.models.deepseek_v41.common.engram"
CLASS = "ParallelEngramEmbedding"
_MISSING = source.MISSING
# The signatures this hook replaces: (name, default) per parameter.
EXPECTED: dict[str, tuple[tuple[str, object], ...]] = {
    "__init__": (
        ("self", _MISSING),
        ("num_embeddings", _MISSING),
        ("dim", _MISSING),
        ("head_sizes", _MISSING),
        ("block_size", 32),
        ("cpu_offload", False),
        ("dp_shared_memory", False),
        ("use_thp", False),
    ),
    "_storage": (("self", _MISSING),),
    "lookup": (("self", _MISSING), ("indices", _MISSING), ("out", _MISSING), ("background", False)),
}


class EngramHookError(RuntimeError):
    """The hook cannot be installed or cannot serve this layer (fails the boot)."""


def _describe(params) -> str:
    return "(" + ", ".join(n if d is _MISSING else f"{n}={d!r}" for n, d in params) + ")"


def signature_of(fn) -> tuple[tuple[str, object], ...]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY):
            out.append((("*" if p.kind == p.VAR_POSITIONAL else "**" if p.kind == p.VAR_KEYWORD else "*,") + p.name, _MISSING))
            continue
        out.append((p.name, _MISSING if p.default is p.empty else p.default))
    return tuple(out)


def check_signatures(cls, vllm_version: str) -> None:
    """Raise :class:`EngramHookError` unless every replaced method matches :data:`EXPECTED`."""
    found = {}
    for name in EXPECTED:
        fn = cls.__dict__.get(name)
        found[name] = None if fn is None else signature_of(fn)
    _compare(found, vllm_version)


def _compare(found: dict, vllm_version: str) -> None:
    for name, want in EXPECTED.items():
        have = found.get(name)
        if have is None:
            raise EngramHookError(
                f"vLLM {vllm_version}: {MODULE}.{CLASS} has no method {name}(); the file-backed Engram "
                "hook was written for another vLLM build. Refusing to start: the stock table would pin "
                "~47 GiB per layer. Use the vLLM the kit names, or set SPARK_ENGRAM=off to run the stock table."
            )
        if have != want:
            raise EngramHookError(
                f"vLLM {vllm_version}: {MODULE}.{CLASS}.{name}{_describe(have)} differs from "
                f"{name}{_describe(want)}, which the file-backed Engram hook replaces. Refusing to start: "
                "the stock table would pin ~47 GiB per layer. Use the vLLM the kit names, or set "
                "SPARK_ENGRAM=off to run the stock table."
            )


@dataclass
class Settings:
    """Where the rows are and how to read them (from the environment spark-kit sets)."""

    engram_dir: str | None
    packed_dir: str | None
    threads: int
    direct: bool
    resident_scales: bool

    @classmethod
    def from_env(cls, env=os.environ) -> "Settings":
        def flag(name: str, default: bool) -> bool:
            raw = env.get(name, "")
            if raw == "":
                return default
            if raw.lower() in ("1", "true", "on", "yes"):
                return True
            if raw.lower() in ("0", "false", "off", "no"):
                return False
            raise EngramHookError(f"{name}={raw!r} is not a boolean (use 1 or 0)")

        raw_threads = env.get("SPARK_ENGRAM_IO_THREADS", "16")
        if not raw_threads.isdigit() or not 1 <= int(raw_threads) <= 256:
            raise EngramHookError(f"SPARK_ENGRAM_IO_THREADS={raw_threads!r} is not a thread count 1..256")
        return cls(
            engram_dir=env.get("SPARK_ENGRAM_DIR") or None,
            packed_dir=env.get("SPARK_ENGRAM_PACKED_DIR") or None,
            threads=int(raw_threads),
            direct=flag("SPARK_ENGRAM_DIRECT", True),
            resident_scales=flag("SPARK_ENGRAM_RESIDENT_SCALES", False),
        )


class Runtime:
    """What the hook asks vLLM (replaced by tests)."""

    def tp(self) -> tuple[int, int]:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()

    def dp(self) -> int:
        """Data-parallel size (1 where this vLLM has no data-parallel group)."""
        try:
            from vllm.distributed.parallel_state import get_dp_group

            return int(get_dp_group().world_size)
        except (ImportError, AttributeError, AssertionError):
            return 1

    def max_tokens(self) -> int:
        from vllm.config import get_current_vllm_config

        return int(get_current_vllm_config().scheduler_config.max_num_batched_tokens)

    def device(self):
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None


runtime = Runtime()
_layers_taken: list[int] = []
_layers_lock = threading.Lock()


def _layer_for(geometry: Geometry, num_embeddings: int) -> int:
    """The layer whose table has ``num_embeddings`` rows (construction order breaks ties)."""
    with _layers_lock:
        candidates = [l for l, n in zip(geometry.layer_ids, geometry.num_embeddings) if n == num_embeddings]
        if not candidates:
            raise EngramHookError(
                f"no Engram layer has {num_embeddings} rows (config.json engram_num_embeddings = "
                f"{list(geometry.num_embeddings)})"
            )
        free = [l for l in candidates if l not in _layers_taken] or candidates
        _layers_taken.append(free[0])
        return free[0]


def _skip_rows_loader(param, loaded_weight, *args, **kwargs) -> None:
    """Weight loader of the 0-row dummies: the rows stay on disk (never read at load)."""
    return None


def _open_store(settings: Settings, layer: int, rows: int, lo: int, hi: int, rank: int, world: int):
    from .packed import read_header, PackedHeader
    from .row_store import RowStore
    from .tables import checkpoint_table

    if settings.packed_dir:
        path = os.path.join(settings.packed_dir, file_name(layer, rank, world))
        if os.path.exists(path):
            read_header(path, PackedHeader(layer, lo, hi, rows))  # a mismatch fails the boot
            return RowStore(layer=layer, rows=rows, lo=lo, hi=hi, packed=path, threads=settings.threads,
                            direct=settings.direct), path
    table = checkpoint_table(settings.engram_dir, layer)
    if table.rows != rows:
        raise EngramHookError(
            f"{table.weight.path}: layer {layer}'s table has {table.rows} rows, vLLM built the layer for {rows}"
        )
    store = RowStore(layer=layer, rows=rows, lo=lo, hi=hi, table=table, threads=settings.threads,
                     direct=settings.direct, resident_scales=settings.resident_scales)
    return store, table.weight.path


def _init(self, num_embeddings, dim, head_sizes, block_size=32, cpu_offload=False, dp_shared_memory=False,
          use_thp=False):
    import torch
    from torch import nn

    nn.Module.__init__(self)
    settings = Settings.from_env()
    if not settings.engram_dir:
        raise EngramHookError(
            "SPARK_ENGRAM_DIR is not set: the file-backed Engram table needs the slim Engram directory "
            "(spark-kit sets it from the kit's paths.engram_dir; run `spark-kit download --only engram`)"
        )
    if dim != 256 or block_size != 32:
        raise EngramHookError(f"file-backed Engram rows are 256 values in groups of 32, vLLM asked for {dim}/{block_size}")
    cfg_path = os.path.join(settings.engram_dir, "config.json")
    try:
        with open(cfg_path) as f:
            geometry = Geometry.from_config(json.load(f))
    except (OSError, ValueError) as err:
        raise EngramHookError(f"{cfg_path}: {err}") from err
    tp_size, tp_rank = runtime.tp()
    dp_size = runtime.dp()
    if dp_size != 1:
        # Ownership then spans tp x dp ranks; this table only knows its tensor-parallel rank.
        raise EngramHookError(
            f"data-parallel size {dp_size}: the file-backed Engram table supports data-parallel size 1 only; "
            "run with --data-parallel-size 1 or set SPARK_ENGRAM=off"
        )
    head_sizes = tuple(int(h) for h in head_sizes)
    owned = owned_range(head_sizes, tp_size, 1, tp_rank)
    self.num_embeddings = int(num_embeddings)
    self.dim = dim
    self.block_size = block_size
    self.n_hash_cols = len(head_sizes)
    self.part_n_hash_cols = -(-self.n_hash_cols // tp_size)
    self.head_start = tp_rank * self.part_n_hash_cols
    self.vocab_start_idx, self.vocab_end_idx = owned.lo, owned.hi
    self.part_num_embeddings = owned.rows
    self.tp_size = tp_size
    self.dp_size = 1  # checked above; the model sizes its staging rows by it
    # Rows come from the file on the current stream: no pinned host table, so no prefetch side stream,
    # no DP-shared memory and no huge pages (vLLM's options for its resident table).
    self.cpu_offload = False
    self.dp_shared_memory = False
    self.use_thp = False
    self.peer_rows = 0
    self._views = None
    self._view_src = None
    layer = _layer_for(geometry, self.num_embeddings)
    self._spark_layer = layer
    self._spark_store, source = _open_store(
        settings, layer, self.num_embeddings, owned.lo, owned.hi, tp_rank, tp_size
    )
    self.weight = nn.Parameter(torch.empty(0, dim, dtype=torch.float8_e4m3fn, device="cpu"), requires_grad=False)
    self.weight_scale_inv = nn.Parameter(
        torch.empty(0, dim // block_size, dtype=torch.uint8, device="cpu"), requires_grad=False
    )
    for p in (self.weight, self.weight_scale_inv):
        p.weight_loader = _skip_rows_loader
        p.engram_vocab_start = owned.lo
    capacity = runtime.max_tokens() * self.part_n_hash_cols
    device = runtime.device()
    pin = device is not None and device.type == "cuda"
    self._spark_ids_host = torch.empty(capacity, dtype=torch.int64, pin_memory=pin)
    self._spark_rows_host = torch.empty(capacity, ROW_BYTES, dtype=torch.uint8, pin_memory=pin)
    self._spark_rows_dev = torch.empty(capacity, ROW_BYTES, dtype=torch.uint8, device=device) if pin else None
    self._spark_callbacks = {}
    self._spark_error = None
    logger.info(
        "Engram layer %d rank %d/%d: rows [%d, %d) file-backed from %s (%s, %d threads; %.2f GiB not allocated)",
        layer, tp_rank, tp_size, owned.lo, owned.hi, source,
        "O_DIRECT" if self._spark_store.direct else "buffered", settings.threads,
        owned.rows * ROW_BYTES / 2**30,
    )


def _storage(self):
    raise EngramHookError(
        f"Engram layer {getattr(self, '_spark_layer', '?')} is file-backed: it has no resident table "
        "(only lookup() reads rows); a vLLM code path that needs _storage() is not supported"
    )


def _local_ids(self, indices):
    """[T, heads] -> this rank's [T * part] ids, -1 where a rank's last heads run past the end."""
    import torch

    t = indices.shape[0]
    end = min(self.head_start + self.part_n_hash_cols, self.n_hash_cols)
    local = indices[:, self.head_start:end].to(torch.int64)
    pad = self.part_n_hash_cols - local.shape[1]
    if pad > 0:
        local = torch.cat([local, local.new_full((t, pad), -1)], dim=1)
    return local.reshape(-1)


def _host_step(self, n: int) -> None:
    """Runs in a CUDA host callback: no CUDA calls, preallocated pinned buffers only."""
    try:
        ids = self._spark_ids_host[:n].numpy()
        self._spark_store.lookup_into(ids, self._spark_rows_host[:n].numpy())
    except Exception as err:  # noqa: BLE001 - cannot raise through CUDA; surfaced by the next lookup
        self._spark_rows_host[:n].zero_()
        self._spark_error = err
        logger.error("Engram layer %s lookup failed inside a CUDA step: %s", self._spark_layer, err)


def _lookup(self, indices, out, background=False):
    from . import dequant

    if self._spark_error is not None:
        err, self._spark_error = self._spark_error, None
        raise EngramError(str(err)) from err
    n = indices.shape[0] * self.part_n_hash_cols
    if n == 0:
        return
    if n > self._spark_rows_host.shape[0]:
        raise EngramHookError(
            f"Engram lookup of {indices.shape[0]} tokens exceeds the preallocated "
            f"{self._spark_rows_host.shape[0] // self.part_n_hash_cols} (max_num_batched_tokens)"
        )
    flat = out.view(n, self.dim)
    ids = _local_ids(self, indices)
    if not indices.is_cuda:
        rows = self._spark_rows_host[:n]
        self._spark_store.lookup_into(ids.numpy(), rows.numpy())
        dequant.dequant_records(rows, flat)
        return
    import torch

    self._spark_ids_host[:n].copy_(ids, non_blocking=True)
    stream = torch.cuda.current_stream()
    callback = self._spark_callbacks.get(n)
    if callback is None:
        callback = _HOST_FN(lambda _data, s=self, k=n: _host_step(s, k))
        self._spark_callbacks[n] = callback  # kept alive: captured graphs call it on every replay
    _launch_host_func(stream.cuda_stream, callback)
    rows = self._spark_rows_dev[:n]
    rows.copy_(self._spark_rows_host[:n], non_blocking=True)
    _dequant_cuda(rows, flat)


_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_libcuda = None


def _launch_host_func(stream_handle: int, callback) -> None:
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, _HOST_FN, ctypes.c_void_p]
        lib.cuLaunchHostFunc.restype = ctypes.c_int
        _libcuda = lib
    rc = _libcuda.cuLaunchHostFunc(ctypes.c_void_p(stream_handle), callback, None)
    if rc != 0:
        raise EngramHookError(f"cuLaunchHostFunc failed with CUresult {rc}")


def _dequant_cuda(rows, flat) -> None:
    try:
        from .dequant_triton import dequant_records
    except ImportError:
        from .dequant import dequant_records
    dequant_records(rows, flat)


def install(cls) -> None:
    """Replace the three methods (idempotent)."""
    if getattr(cls, "_spark_file_backed", False):
        return
    cls.__init__ = _init
    cls._storage = _storage
    cls.lookup = _lookup
    cls._spark_file_backed = True


def find_class():
    """The vLLM class if its module is imported (None when the module is not, or lacks the class)."""
    import sys

    module = sys.modules.get(MODULE)
    return None if module is None else getattr(module, CLASS, None)


def module_source() -> str | None:
    """The release's source file of :data:`MODULE`, or None when this vLLM has no DeepSeek V4.1 Engram."""
    return source.module_file(MODULE)


def check_source(path: str, vllm_version: str) -> None:
    """:func:`check_signatures` on the release's source (nothing imported)."""
    methods = source.class_methods(path, CLASS)
    if methods is None:
        raise EngramHookError(
            f"vLLM {vllm_version}: {path} defines no {CLASS}, the class the file-backed Engram hook patches. "
            "Refusing to start: vLLM would load its stock in-memory table, tens of GiB a layer. Use the vLLM "
            "the kit names, or set SPARK_ENGRAM=off to run the stock table."
        )
    _compare({name: methods.get(name) for name in EXPECTED}, vllm_version)


def _install_checked(module, vllm_version: str) -> None:
    cls = getattr(module, CLASS, None)
    if cls is None:
        raise EngramHookError(
            f"vLLM {vllm_version}: {MODULE} has no {CLASS}, the class the file-backed Engram hook patches. "
            "Refusing to start: vLLM would load its stock in-memory table instead, tens of GiB a layer. Use "
            "the vLLM the kit names, or set SPARK_ENGRAM=off to run the stock table."
        )
    check_signatures(cls, vllm_version)
    install(cls)


def register() -> None:
    """Plugin provider: patch the class where the release has it (fail closed on drift).

    The signatures are checked now, from the release's source; the methods are replaced when vLLM
    imports the module (at once if it already has). Without the module (a vLLM with no DeepSeek V4.1
    Engram) nothing is patched — unless this is an Engram kit (``SPARK_ENGRAM_DIR`` set): then the
    stock in-memory table would load, tens of GiB a layer, so it raises, naming the class and the
    vLLM version.
    """
    if os.environ.get("SPARK_ENGRAM", "").lower() in ("0", "off", "false"):
        logger.info("Engram file-backed rows disabled by SPARK_ENGRAM=%s", os.environ["SPARK_ENGRAM"])
        return
    import sys

    from spark_overlay.plugin import installed_vllm_version

    version = installed_vllm_version()
    if MODULE in sys.modules:
        _install_checked(sys.modules[MODULE], version)
        return
    path = module_source()
    if path is None:
        if os.environ.get("SPARK_ENGRAM_DIR"):
            raise EngramHookError(
                f"vLLM {version} has no {MODULE}.{CLASS}, the class the file-backed Engram "
                "hook patches, but SPARK_ENGRAM_DIR is set (an Engram kit). Refusing to start: vLLM would load "
                "its stock in-memory table instead, tens of GiB a layer. Use the vLLM the kit names, or set "
                "SPARK_ENGRAM=off to run the stock table."
            )
        return
    check_source(path, version)
    after_import(MODULE, lambda module: _install_checked(module, version))
