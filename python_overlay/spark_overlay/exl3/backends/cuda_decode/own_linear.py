"""spark-kit's own decode GEMV for dense EXL3 linears (decode_linear.cuh) at 1..64 rows.

One launch sequence per shard (2 launches with programmatic dependent launch; 3 with `fused` off):
x * suh and the 128-point Hadamard into fp16, then the MoE kernel's tensor-core GEMV (decode_mma.cuh)
split over k-parts whose last block per (8 rows, 128 columns) sums the k-parts and applies the codebook's
affine map, the output Hadamard, * svh and the bias in x's dtype (with `fused` off, a third launch does).
MUL1 codebook, integer K 2..6, whole 128-blocks on both sides; anything else keeps exl3_gemm.
Graph-safe: no host sync, scratch allocated at load, sums in a fixed order (replay == eager).

`attach` builds it for an `Exl3CudaShards` layer and checks it against exl3_gemm at load: a
disagreement fails the load when SPARK_EXL3_MOE_COOP=own was set explicitly, else the layer keeps
exl3_gemm with a warning (as the own MoE kernel does, `cuda_moe_fused.Exl3FusedMoE.check_own`).
"""

from __future__ import annotations

import ctypes
import logging

import torch

from ...format.codebook import CODEBOOK_MUL1
from ...format.errors import Exl3FormatError
from . import loader

logger = logging.getLogger("vllm.spark_overlay.exl3")

MAX_ROWS = 64  # the kernel's limit (LINEAR_MAX_ROWS)
# Rows up to which Exl3CudaShards takes the own GEMV instead of exl3_gemm: on an H200 it was faster up to
# 32 rows where the output is no wider than the input (0.44-0.89x of exl3_gemm at 1-32 rows, 0.55-0.92x at 64)
# and up to 8 where it is wider (0.66-1.06x; 1.02-2.43x at 16-64 rows, where exl3_gemm's tensor-core GEMM
# catches up) (python_overlay/tests/gpu/results-h200-linear-own.json)
SERVE_ROWS_DEEP, SERVE_ROWS_WIDE = 32, 8
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
FLAG_PDL, FLAG_KW2, FLAG_OCC6, FLAG_OCC5, FLAG_FUSED, FLAG_RUN16 = 1, 2, 4, 8, 16, 32  # decode_linear.cuh's LINEAR_*
SELF_CHECK_ROWS = (1, 2, 3, 8)  # plus the serve rows
_scratch: dict[tuple[str, str], torch.Tensor] = {}
_ids: dict[str, torch.Tensor] = {}


def supports(shards: list[dict], in_features: int, padded_in: int) -> str | None:
    """Why the own GEMV cannot take a layer of these `Exl3CudaShards.shards`, or None."""
    if padded_in != in_features or in_features % 128:
        return f"input width {in_features} (padded {padded_in}; the own GEMV takes unpadded multiples of 128)"
    for s in shards:
        if s["codebook"] != CODEBOOK_MUL1:
            return f"codebook {s['codebook']} (the own GEMV decodes mul1)"
        if s["k"] not in (2, 3, 4, 5, 6):
            return f"K={s['k']} (the own GEMV takes an integer K in 2..6)"
        if s["pad_rows"] or s["out"] != s["svh"].shape[0] or s["out"] % 128:
            return f"output width {s['out']} (the own GEMV takes unpadded multiples of 128)"
    return None


def split_parts(rows: int, n_in: int, n_out: int, kw2: bool, target: int, run: int = 8, min_tiles: int = 4) -> int:
    """k-parts of the GEMV: enough working blocks for about `target` (one wave), at least
    `min_tiles` k-tiles per warp."""
    working = -(-rows // run) * n_out // (64 if kw2 else 32)  # blocks of a part that decode (runs of `run` rows)
    most = max(1, (n_in // 16) // ((2 if kw2 else 4) * min_tiles))
    return max(1, min(most, round(target / working)))


def serve_rows(n_in: int, n_out: int) -> int:
    """Rows up to which a layer of this shape takes the own GEMV (SERVE_ROWS_*)."""
    return SERVE_ROWS_DEEP if n_out <= n_in else SERVE_ROWS_WIDE


def scratch(device: torch.device, kind: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed scratch buffer of at least numel elements shared by the layers of a device (launches on one
    stream run in turn; the fused GEMV's counters are zero between calls); a larger ask replaces it, earlier
    layers keep theirs."""
    key = (str(device), kind)
    have = _scratch.get(key)
    if have is None or have.numel() < numel:
        _scratch[key] = torch.zeros(numel, dtype=dtype, device=device)
    return _scratch[key]


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    fn = lib.spark_decode_linear
    fn.restype = ctypes.c_int
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, i, p, i, ctypes.c_int64, p, i, p, p, p, p, i, i, i, i, p, p, p, p, i, i, p]
    return lib


class OwnDecodeLinear:
    """One layer's own decode GEMV over the shards of `Exl3CudaShards` (their device tensors)."""

    def __init__(self, shards: list[dict], in_features: int, device: torch.device) -> None:
        self.device = torch.device(device)
        cap = torch.cuda.get_device_capability(self.device)
        if cap[0] < 8:
            raise Exl3FormatError(f"sm_{cap[0]}{cap[1]}: the own GEMV needs tensor cores (mma.sync, sm_80+)")
        self.lib = _bind(loader.load(f"sm_{cap[0]}{cap[1]}"))
        self.shards = shards
        self.n_in = in_features
        self.n_out = sum(s["out"] for s in shards)
        self.pdl = cap[0] >= 9
        # launch options (the H200's fastest, results-h200-linear-own.json "sweep"): the GEMV's blocks of
        # 4 n-tiles x 2 k-warps (kw2; None: at 1 row where a shard's output is wider than its input, else
        # 2 x 4), blocks per SM asked of the compiler, working blocks aimed at (target; None: 264 (about two
        # per SM) up to 8 rows, 528 above)
        self.kw2, self.blocks, self.target = None, 4, None
        # fused: two launches, the output step in the GEMV's last blocks (4 blocks per SM; else three launches;
        # 0-1 us faster at most sizes)
        self.fused = True
        # runs of 16 rows (each tile decoded once for 16 rows, two MMAs) from run16_from rows on (0: never):
        # 1-9 us faster at 16 rows where the output is wider than the input, still not faster than exl3_gemm there
        self.run16_from = 0
        self.serve_rows = serve_rows(in_features, self.n_out)
        tables = [[0] * 6 + [s["trellis"].data_ptr(), 0, 0] for s in shards]
        self.tables = torch.tensor(tables, dtype=torch.int64, device=self.device)
        if str(self.device) not in _ids:
            _ids[str(self.device)] = torch.zeros(MAX_ROWS, dtype=torch.int32, device=self.device)
        self.ids = _ids[str(self.device)]
        self.reserve()

    def reserve(self) -> None:
        """Scratch for every row count up to MAX_ROWS with the current options (re-run after changing them)."""
        most = max(self.parts(r, s["out"]) * r * s["out"] for r in range(1, MAX_ROWS + 1) for s in self.shards)
        self.xh = scratch(self.device, "xh", MAX_ROWS * self.n_in, torch.float16)
        self.sums = scratch(self.device, "sums", MAX_ROWS * (self.n_in // 128), torch.float32)
        self.dd = scratch(self.device, "dd", most, torch.float32)
        self.counters = scratch(self.device, "counters", MAX_ROWS // 8 * max(s["out"] for s in self.shards) // 128,
                                torch.int32)

    def run16(self, rows: int) -> bool:
        return 0 < self.run16_from <= rows

    def wide(self, n_out: int, rows: int) -> bool:
        """Whether a shard of n_out columns runs blocks of 4 n-tiles x 2 k-warps (never in three launches of
        runs of 16)."""
        if self.run16(rows) and not self.fused:
            return False
        return (rows == 1 and n_out > self.n_in) if self.kw2 is None else self.kw2

    def parts(self, rows: int, n_out: int) -> int:
        run = 16 if self.run16(rows) else 8
        target = self.target or (264 if rows <= 8 else 528)
        return split_parts(rows, self.n_in, n_out, self.wide(n_out, rows), target, run)

    def flags(self, rows: int, n_out: int) -> int:
        occ = {6: FLAG_OCC6, 5: FLAG_OCC5}.get(self.blocks, 0)
        fused = FLAG_FUSED if self.fused else 0
        run16 = FLAG_RUN16 if self.run16(rows) else 0
        return (FLAG_PDL if self.pdl else 0) | (FLAG_KW2 if self.wide(n_out, rows) else 0) | occ | fused | run16

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """y [rows, out] in x's dtype for x [rows, in] (1..MAX_ROWS rows; fp16, bf16 or fp32)."""
        rows = x.shape[0]
        if not 0 < rows <= MAX_ROWS:
            raise ValueError(f"own decode GEMV: {rows} rows (takes 1..{MAX_ROWS})")
        x = (x if x.dtype in DTYPES else x.to(torch.float16)).contiguous()
        out = torch.empty(rows, self.n_out, dtype=x.dtype, device=x.device)
        if bias is not None:
            bias = (bias if bias.dtype in DTYPES else bias.float()).contiguous()
        stream = torch.cuda.current_stream(x.device).cuda_stream
        col = 0
        for i, s in enumerate(self.shards):
            n = s["out"]
            b = None if bias is None else bias.data_ptr() + col * bias.element_size()
            err = self.lib.spark_decode_linear(
                x.data_ptr(), DTYPES[x.dtype], out.data_ptr() + col * out.element_size(), DTYPES[out.dtype],
                self.n_out, b, DTYPES[bias.dtype] if bias is not None else 0, s["suh"].data_ptr(),
                s["svh"].data_ptr(), self.tables[i].data_ptr(), self.ids.data_ptr(), rows, self.n_in, n, s["k"],
                self.xh.data_ptr(), self.sums.data_ptr(), self.dd.data_ptr(), self.counters.data_ptr(),
                self.parts(rows, n), self.flags(rows, n), stream,
            )
            loader.check(err, "spark_decode_linear")
            col += n
        return out


def build(layer) -> OwnDecodeLinear:
    """The own GEMV over an Exl3CudaShards layer's device tensors; Exl3FormatError / OSError where it cannot run."""
    device = layer.shards[0]["trellis"].device
    if device.type != "cuda":
        raise Exl3FormatError(f"{device} is not a CUDA device")
    return OwnDecodeLinear(layer.shards, layer.in_features, device)


def attach(layer, explicit: bool) -> OwnDecodeLinear | None:
    """The own GEMV for `layer` (an Exl3CudaShards) after its load-time check against exl3_gemm, or None
    (the layer keeps exl3_gemm). explicit: SPARK_EXL3_MOE_COOP=own was set (a failed check raises)."""
    from ..cuda_moe_fused import SELF_CHECK_TOLERANCE, max_rel, own_check_failed

    why = supports(layer.shards, layer.in_features, layer.padded_in)
    if why is not None:
        logger.info("exl3: %s: own decode GEMV not used (%s); exl3_gemm", layer.name, why)
        return None
    try:
        own = build(layer)
    except (Exl3FormatError, OSError) as err:  # no nvcc, a failed build, a library that does not load
        logger.warning("exl3: %s: own decode GEMV not used (%s); exl3_gemm", layer.name, err)
        return None
    device = layer.shards[0]["trellis"].device
    gen = torch.Generator(device=device).manual_seed(3)
    for rows in sorted({*SELF_CHECK_ROWS, own.serve_rows}):
        x = torch.randn(rows, layer.in_features, generator=gen, device=device).to(torch.float16)
        err = max_rel(own(x), layer.gemm(x))
        if not err <= SELF_CHECK_TOLERANCE:
            what = (f"{layer.name}: spark-kit's own decode GEMV disagrees with exl3_gemm at {rows} rows "
                    f"(max rel diff {err:.2e} > {SELF_CHECK_TOLERANCE})")
            own_check_failed(what, "exl3_gemm", explicit)
            return None
    return own
