"""spark-kit's own EXL3 MoE decode kernel (decode_moe.cu) for 1..64 token rows.

Takes the layer's device pointer tables from the fused path (`Exl3FusedMoE.tables`), reads the
caller's dtypes as they are (x f16/bf16, ids int32/int64, weights f32/f16/bf16) and writes the
output in x's dtype: no conversion or zeroing kernels around its five launches. MUL1 codebook,
one K for gate/up/down in 2..6 (`supports`); anything else keeps exllamav3's decode kernel.
On sm_80+ its GEMVs run on the tensor cores (decode_mma.cuh: fp16 inputs, one MMA per weight tile
for up to 8 rows of an expert), 1..64 rows; else the CUDA-core GEMVs, 1..8 rows.
"""

from __future__ import annotations

import torch

from ...format.codebook import CODEBOOK_MUL1
from . import loader

ROWS = 64  # rows per call with the tensor-core GEMVs (the kernel's limit)
CUDA_CORE_ROWS = 8  # rows per call with the CUDA-core GEMVs
# Rows the served path gives it. Tensor-core GEMVs: every size, on an H200 0.62-0.72x of the served
# path's time at 1-64 rows (exllamav3's decode kernel in chunks of 42); CUDA-core GEMVs: 0.84x / 0.89x /
# 0.83x at 1 / 2 / 4 rows, but 1.15x at 8 (python_overlay/tests/gpu/results-h200-decode*.json, docs/performance.md)
SERVE_ROWS = 64
CUDA_CORE_SERVE_ROWS = 4
MAX_TOP_K = 8  # picks per row (the output kernel's warps per block)
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
STAGE_PDL = 32  # decode_moe.cu: launch with programmatic dependent launch
STAGE_OCC6 = 64  # decode_moe.cu: the gemv variant built for 6 blocks per SM
STAGE_XS = 128  # decode_moe.cu: the gemv variant that stages its inputs through shared memory
STAGE_MMA = 256  # decode_moe.cu: the tensor-core gemv (decode_mma.cuh), runs of 8 rows
STAGE_RUN16 = 512  # with STAGE_MMA: runs of 16 rows
STAGE_NOBIAS = 1024  # with STAGE_MMA: the codebook's affine map applied to the sums (no fp16x2 FMA per weight pair)
STAGE_OCC5 = 2048  # with STAGE_MMA: the gemv built for 5 blocks per SM (STAGE_OCC6: 6; else 4)
STAGE_KW2_A = 4096  # with STAGE_NOBIAS: gate/up blocks of 4 n-tiles x 2 k-warps (else 2 x 4)
STAGE_KW2_B = 8192  # with STAGE_NOBIAS: down blocks of 4 n-tiles x 2 k-warps
STAGE_FUSE_IN = 16384  # with STAGE_NOBIAS, <= FUSE_IN_ROWS rows: gate/up builds its own inputs (no input-Hadamard launch)
STAGE_FUSE_MID = 32768  # with STAGE_NOBIAS: the last gate/up block of a chunk runs its activation (no activation launch)
STAGE_FUSE_OUT = 65536  # with STAGE_NOBIAS: the last down block of an output chunk writes it (no output launch)
STAGE_W4_A, STAGE_W4_B = 131072, 262144  # with STAGE_NOBIAS: gate/up / down GEMV blocks of 4 warps (else 8)
STAGE_W2_A, STAGE_W2_B = 524288, 1048576  # with STAGE_NOBIAS: ... of 2 warps
WARP_BITS = {"a": {4: STAGE_W4_A, 2: STAGE_W2_A}, "b": {4: STAGE_W4_B, 2: STAGE_W2_B}}
STAGE_CAP_A, STAGE_CAP_B = 21, 26  # with STAGE_MMA: shifts of the blocks-per-SM caps of gate/up / down (5 bits each)
# with STAGE_NOBIAS: gate/up / down warps of 2 neighbouring n-tiles (blocks of twice the columns over half the k-range:
# the fused gate/up's 4-warp blocks, or 8-warp blocks of 2 k-warps)
STAGE_NPW2_A, STAGE_NPW2_B = 1 << 31, 1 << 32
CAP_AUTO = 31  # decode_mma.cuh: the launch's blocks over the SMs, rounded up, where that is below what fits
FUSE_IN_ROWS, FUSE_IN_MAX_K, FUSE_IN_MAX_BITS = 2, 2560, 3  # decode_mma.cuh: FI_ROWS, FI_MAX_K; shared memory fits K <= 3
# Served fusions (the H200's fastest, python_overlay/tests/gpu/results-h200-decode-own-fused*.json): the input
# Hadamard in gate/up at 1-2 rows (the gate/up blocks: `gate_up_layout`, `gate_up_warps`),
# the activation in gate/up's last blocks at 1-8 rows (0-1 % slower above); the output in down's last blocks
# never (2-7 % slower at every size)
FUSE_IN_AUTO_ROWS, FUSE_MID_AUTO_ROWS = 2, 8
_scratch: dict[tuple, tuple[torch.Tensor, ...]] = {}


def shared_scratch(device: torch.device, top_k: int, hidden: int, inter: int) -> tuple[torch.Tensor, ...]:
    """The kernel's fp32 scratch (xh, gu, ah, dd) and the fused launches' counters (int32, zeroed; each call
    leaves them zeroed), one set per shape and device for every layer.

    Launches on one stream run one after another, so the layers of a process share it (~33 MiB at
    64 rows x top-6): gu holds up to 4 gate/up k-parts of 8 rows or 2 of 64, dd 4 down k-parts of 8 or 1 of 64.
    """
    key = (str(device), top_k, hidden, inter)
    if key not in _scratch:
        slots, small = ROWS * top_k, CUDA_CORE_ROWS * top_k
        f32 = {"dtype": torch.float32, "device": device}
        _scratch[key] = (torch.empty(slots, 2, hidden, **f32), torch.empty(max(4 * small, 2 * slots), 2, inter, **f32),
                         torch.empty(slots, inter, **f32), torch.empty(max(4 * small, slots), hidden, **f32),
                         torch.zeros(ROWS * (MAX_TOP_K * (inter // 128) + hidden // 128), dtype=torch.int32, device=device))
    return _scratch[key]


def supports(groups: list[tuple], top_k: int = 1) -> str | None:
    """Why the own kernel cannot take a layer with these (codebook, Kg, Ku, Kd, ...) groups, or None."""
    if top_k > MAX_TOP_K:
        return f"top-{top_k} routing (the own kernel takes up to top-{MAX_TOP_K})"
    if len(groups) != 1:
        return "experts with different bit widths"
    cb, kg, ku, kd = groups[0][:4]
    if cb != CODEBOOK_MUL1:
        return f"codebook {cb} (the own kernel decodes mul1)"
    if not (kg == ku == kd) or kg not in (2, 3, 4, 5, 6):
        return f"K {kg}/{ku}/{kd} (the own kernel takes one integer K in 2..6)"
    return None


def gate_up_layout(rows: int, fuse_in: bool = False) -> tuple[int, bool]:
    """Gate/up k-parts and 4 x 2 blocks of the tensor-core GEMV at `rows` rows (the H200's fastest, bias folded):
    with the input Hadamard fused in 4 parts of 4 x 1 blocks of 4 warps at 1 and 2 rows (`gate_up_warps`); else 2
    parts of 2 x 4 blocks at 1 row, 1 part from 2 rows on, of 4 x 2 blocks from 4 rows on (2 x 2 blocks of 4 warps at
    4 rows: `gate_up_warps`)
    (python_overlay/tests/gpu/results-h200-decode-own-mma.json, results-h200-decode-own-fused*.json,
    results-h200-decode-own-blocks.json; 2 rows: results-h200-decode-own-bench-*.json)."""
    if fuse_in:
        return 4, False
    if rows <= 1:
        return 2, False
    return 1, rows >= 4


def gate_up_warps(rows: int, fuse_in: bool) -> tuple[int, int]:
    """Warps per gate/up block and its blocks-per-SM cap: at 1 row with the input Hadamard fused in, blocks of 4 warps
    capped at the launch's blocks over the SMs (on an H200 864 blocks, 7 per SM: 49.3 vs 51.5 us for the layer,
    results-h200-decode-own-blocks.json); at 2 rows fused blocks of 4 warps uncapped (more than one wave); at 4 rows
    unfused blocks of 4 warps (2 n-tiles x 2 k-warps: 144.74 and 144.46 vs 146.12 and 145.99 us for the layer in two
    H100 sweeps, results-h100-decode-own-npw.json, results-h100-decode-own-npw-served.json; with `warp_tiles`' 2
    n-tiles in down 143.87 vs 146.29 in a third, results-h100-decode-own-npw-4rows.json); else 8 warps, no cap."""
    if fuse_in and rows <= 2:
        return 4, CAP_AUTO if rows <= 1 else 0
    if not fuse_in and rows == 4:
        return 4, 0
    return 8, 0


def down_warps(rows: int, fuse_in: bool) -> int:
    """Warps per down block: 4 at 2 rows with the input Hadamard fused in (with `gate_up_warps`' 4-warp blocks: 81.8
    vs 85.0 us for the layer on an H200, five runs alike, results-h200-decode-own-bench-*.json), else 8."""
    return 4 if fuse_in and rows == 2 else 8


def warp_tiles(rows: int, fuse_in: bool) -> tuple[int, int]:
    """n-tiles per warp of gate/up and down (the k-parts doubled where 2): with the input Hadamard fused in, 2 in both
    at 1 row (44.13 vs 45.94 us for the layer on an H100) and 2 in gate/up at 2 rows (75.85 vs 78.23; down stays in
    4-warp blocks of 1), one sweep (python_overlay/tests/gpu/results-h100-decode-own-npw.json); at 4 rows unfused, 2
    in down (145.41 and 145.17 vs 146.12 and 145.99 us in two H100 sweeps, the second
    results-h100-decode-own-npw-served.json); else 1."""
    if fuse_in and rows <= 1:
        return 2, 2
    if fuse_in and rows <= 2:
        return 2, 1
    if not fuse_in and rows == 4:
        return 1, 2
    return 1, 1


class OwnDecodeMoE:
    """One layer's own decode kernel, sharing the fused path's pointer tables."""

    def __init__(self, tables: dict[str, torch.Tensor], k: int, hidden: int, inter: int, num_local: int,
                 top_k: int, device: torch.device) -> None:
        self.device = torch.device(device)
        cap = torch.cuda.get_device_capability(self.device)
        self.lib = loader.load(f"sm_{cap[0]}{cap[1]}")
        order = [f"{sid}_{kind}" for sid in ("w1", "w3", "w2") for kind in ("trellis", "suh", "svh")]
        self.tables = torch.stack([tables[name] for name in order]).contiguous()  # [9, num_local] int64
        self.k, self.hidden, self.inter, self.num_local, self.top_k = int(k), hidden, inter, num_local, top_k
        # 0: chosen per call (tensor cores: `gate_up_layout`; CUDA cores: 3 at <= 8 slots, else 2)
        self.parts_a, self.parts_b = 0, 1
        # k-tiles streamed per stage (16: 8 tiles x 4 deep, the fastest at 1, 4 and 8 rows on an H200);
        # launches to run (31: all five)
        self.unroll, self.stages = 16, 31
        self.occ6 = False  # gemv variant with registers capped for 6 blocks per SM (1-2 rows)
        # gemv variant that stages its inputs through shared memory with the weights (1-2 rows): measured
        # 3-7 % slower on an H200 (python_overlay/tests/gpu/results-h200-decode-own.json), so off
        self.xs = False
        # programmatic dependent launch (sm_90+): each launch's weight prefetch overlaps the one before
        self.pdl = cap[0] >= 9
        # tensor-core GEMVs (mma.sync m16n8k16: sm_80+); runs of 16 rows from run16_from rows on (0: never)
        self.mma = cap[0] >= 8
        self.run16_from = 0  # runs of 16 were 3-18 % slower than two runs of 8 at 16-64 rows on an H200
        # tensor cores: blocks per SM asked of the compiler (4, 5 or 6: 64 / 48 / 40 registers), and 6 from
        # occ6_from rows on (up to 6 % faster at 16-64 rows, 0.5-5 % slower below)
        # (0: never; with the options below 4 blocks were the fastest at every size on an H200)
        self.blocks, self.occ6_from = 4, 0
        # tensor cores: the codebook's affine map applied to the sums instead of per weight pair (1-5 % faster
        # at 1-64 rows); with it, gate/up (kw2_a; None: `gate_up_layout`) and down blocks of 4 n-tiles x 2
        # k-warps instead of 2 x 4 (twice the k-tiles per warp: down 15 % faster at 1 row)
        self.nobias = True
        self.kw2_a, self.kw2_b = None, True
        # tensor cores, bias folded: the small launches folded into the GEMVs (input Hadamard into gate/up at
        # <= FUSE_IN_ROWS rows, activation into gate/up's last block per chunk, output into down's)
        # (None: by rows, FUSE_IN_AUTO_ROWS / FUSE_MID_AUTO_ROWS)
        self.fuse_in: bool | None = None
        self.fuse_mid: bool | None = None
        self.fuse_out = False
        # tensor cores, bias folded: warps per gate/up / down GEMV block (8, 4 or 2; kw2_a / kw2_b then mean 2 k-warps
        # per n-tile instead of 1); blocks of 4 or 2 warps need the output step unfused
        # (warps_a / cap_a None: `gate_up_warps`; warps_b None: `down_warps`)
        self.warps_a: int | None = None
        self.warps_b: int | None = None
        # tensor cores: at most this many gate/up / down GEMV blocks per SM (0: as many as fit; 1..30; CAP_AUTO)
        self.cap_a: int | None = None
        self.cap_b = 0
        # tensor cores, bias folded: n-tiles per warp of gate/up / down (1, or 2: blocks of twice the columns, the k-parts
        # doubled so the blocks stay as many; gate/up with the input Hadamard fused in (4-warp blocks) or in 8-warp blocks
        # of 2 k-warps, down in 8-warp blocks of 2 k-warps; None: `warp_tiles`)
        self.npw_a: int | None = None
        self.npw_b: int | None = None
        self.xh, self.gu, self.ah, self.dd, self.cnt = shared_scratch(self.device, top_k, hidden, inter)

    @property
    def max_rows(self) -> int:
        return ROWS if self.mma else CUDA_CORE_ROWS

    @property
    def serve_rows(self) -> int:
        """Rows up to which the served path takes this kernel instead of exllamav3's."""
        return SERVE_ROWS if self.mma else CUDA_CORE_SERVE_ROWS

    def _stages(self, rows: int, fuse_in: bool, fuse_mid: bool, kw2_a: bool, npw_a: int, npw_b: int) -> int:
        """spark_decode_moe's stage word for one call: the launches, their kernels and layouts (decode_moe.cu)."""
        stages = self.stages | (STAGE_PDL if self.pdl else 0)
        if self.mma:
            blocks = self._blocks(rows)
            stages |= STAGE_MMA | (STAGE_RUN16 if 0 < self.run16_from <= rows else 0)
            stages |= (STAGE_NOBIAS if self.nobias else 0) | {6: STAGE_OCC6, 5: STAGE_OCC5}.get(blocks, 0)
            stages |= (STAGE_KW2_A if kw2_a else 0) | (STAGE_KW2_B if self.kw2_b else 0)
            fused = self.nobias and not 0 < self.run16_from <= rows
            stages |= STAGE_FUSE_IN if fuse_in and fused else 0
            stages |= (STAGE_FUSE_MID if fuse_mid else 0) | (STAGE_FUSE_OUT if self.fuse_out else 0) if fused else 0
            warps_a, cap_a, warps_b = self._warps(rows, fuse_in)
            stages |= WARP_BITS["a"].get(warps_a, 0) | WARP_BITS["b"].get(warps_b, 0) if fused else 0
            stages |= (min(cap_a, CAP_AUTO) << STAGE_CAP_A) | (min(self.cap_b, CAP_AUTO) << STAGE_CAP_B)
            stages |= (STAGE_NPW2_A if npw_a == 2 else 0) | (STAGE_NPW2_B if npw_b == 2 else 0) if fused else 0
        else:
            stages |= (STAGE_OCC6 if self.occ6 else 0) | (STAGE_XS if self.xs else 0)
        return stages

    def _blocks(self, rows: int) -> int:
        """Blocks per SM the tensor-core GEMVs are built for at `rows` rows (4, 5 or 6)."""
        return 6 if 0 < self.occ6_from <= rows else self.blocks

    def _warps(self, rows: int, fuse_in: bool) -> tuple[int, int, int]:
        """(warps per gate/up block, its blocks-per-SM cap, warps per down block): the set ones, else by rows."""
        auto_warps, auto_cap = gate_up_warps(rows, fuse_in)
        # (the fused output step wants 8-warp down blocks: a warp per pick)
        auto_b = 8 if self.fuse_out else down_warps(rows, fuse_in)
        return (auto_warps if self.warps_a is None else self.warps_a, auto_cap if self.cap_a is None else self.cap_a,
                auto_b if self.warps_b is None else self.warps_b)

    def _npw(self, rows: int, fuse_in: bool, kw2_a: bool) -> tuple[int, int]:
        """n-tiles per warp of gate/up and down: the set ones, else `warp_tiles` where the blocks it was measured in
        are the ones that run (4-warp fused gate/up blocks of 1 k-warp; 8-warp down blocks of 2, 4 per SM), else 1."""
        if not (self.mma and self.nobias):
            return 1, 1
        auto_a, auto_b = warp_tiles(rows, fuse_in)
        warps_a, _, warps_b = self._warps(rows, fuse_in)
        blocks = self._blocks(rows)
        auto_a = auto_a if warps_a == 4 and not kw2_a else 1
        auto_b = auto_b if warps_b == 8 and self.kw2_b and blocks < 6 else 1
        return (auto_a if self.npw_a is None else self.npw_a), (auto_b if self.npw_b is None else self.npw_b)

    def _layout(self, rows: int, slots: int, fuse_in: bool) -> tuple[bool, int, int, bool, int, int]:
        """(fuse_in, gate/up k-parts, down k-parts, kw2_a, npw_a, npw_b) at `rows` rows: the k-parts doubled where a
        warp takes 2 n-tiles; the input Hadamard fused in only where its k-parts are whole 128-chunks that fit the
        block's input buffer."""
        auto_parts, auto_kw2 = gate_up_layout(rows, fuse_in)
        kw2_a = auto_kw2 if self.kw2_a is None else self.kw2_a
        npw_a, npw_b = self._npw(rows, fuse_in, kw2_a)
        parts_a = (self.parts_a or (auto_parts if self.mma else 3 if slots <= 8 else 2)) * npw_a
        if fuse_in:  # whole 128-chunks per gate/up k-part, at most FUSE_IN_MAX_K of them
            fit = [p for p in range(parts_a, self.hidden // 128 + 1)
                   if self.hidden % (128 * p) == 0 and self.hidden // p <= FUSE_IN_MAX_K]
            if fit:
                return True, fit[0], self.parts_b * npw_b, kw2_a, npw_a, npw_b
            return self._layout(rows, slots, False)  # the layout without the input Hadamard fused in
        return False, parts_a, self.parts_b * npw_b, kw2_a, npw_a, npw_b

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        rows, top_k = topk_ids.shape
        if not 0 < rows <= self.max_rows or top_k > self.top_k:
            raise ValueError(f"own decode kernel: {rows} rows x top-{top_k} (takes 1..{self.max_rows} x top-{self.top_k})")
        dtype = x.dtype
        x = x.reshape(rows, self.hidden)
        x = x if x.dtype in (torch.float16, torch.bfloat16) else x.to(torch.float16)
        x = x.contiguous()
        ids = topk_ids if topk_ids.dtype in (torch.int32, torch.int64) else topk_ids.long()
        ids = ids.contiguous()
        w = topk_weights if topk_weights.dtype in DTYPES else topk_weights.float()
        w = w.contiguous()
        if out is None:
            out = torch.empty(rows, self.hidden, dtype=dtype if dtype in DTYPES else x.dtype, device=x.device)
        slots = rows * top_k
        want_in = rows <= FUSE_IN_AUTO_ROWS if self.fuse_in is None else self.fuse_in
        fuse_mid = rows <= FUSE_MID_AUTO_ROWS if self.fuse_mid is None else self.fuse_mid
        fuse_in = want_in and self.mma and self.nobias and rows <= FUSE_IN_ROWS and self.k <= FUSE_IN_MAX_BITS
        fuse_in = fuse_in and not 0 < self.run16_from <= rows
        fuse_in, parts_a, parts_b, kw2_a, npw_a, npw_b = self._layout(rows, slots, fuse_in)
        if parts_a * slots > self.gu.shape[0] or parts_b * slots > self.dd.shape[0]:
            raise ValueError(f"own decode kernel: {parts_a} / {parts_b} k-parts at {rows} rows exceed its scratch")
        stages = self._stages(rows, fuse_in, fuse_mid, kw2_a, npw_a, npw_b)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        err = self.lib.spark_decode_moe(
            x.data_ptr(), DTYPES[x.dtype], ids.data_ptr(), int(ids.dtype == torch.int64), w.data_ptr(),
            DTYPES[w.dtype], out.data_ptr(), DTYPES[out.dtype], rows, top_k, self.hidden, self.inter,
            self.num_local, self.tables.data_ptr(), self.k, self.xh.data_ptr(), self.gu.data_ptr(),
            self.ah.data_ptr(), self.dd.data_ptr(), parts_a, parts_b, self.unroll, stages, self.cnt.data_ptr(),
            stream,
        )
        loader.check(err, "spark_decode_moe")
        return out if out.dtype == dtype else out.to(dtype)
