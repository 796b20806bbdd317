"""Routed EXL3 experts through exllamav3's fused MoE kernel (`exl3_moe`), graph-safe.

Built on the per-expert loop (`cuda_backend.Exl3CudaMoE`), whose device tensors
it reuses: at load it builds the nine per-expert pointer tables (trellis / suh /
svh of gate, up, down), takes the shared temp buffers for the largest call
(vLLM's max_num_batched_tokens) and runs a self-check against the loop, which
also primes every kernel instance it will launch (attributes, exllamav3's lock
buffer) before any CUDA graph is captured. A call is then sync-free: routing on
the device (`moe_schedule.route`), launches from shapes only
(`moe_schedule.plan`), output accumulated by the kernel in float32.

Calls of up to `moe_schedule.DECODE_MAX_ROWS` rows (decode, speculation) take
a decode kernel instead, chosen by `select.moe_decode()`: exllamav3's
`exl3_moe_coop` in launches of up to 42 rows (`cuda_decode.coop_rows`, `=1`), or
spark-kit's own kernel (the default; `cuda_decode.own`: 1..64 rows on sm_80+, 1..4 below), which falls
back to exllamav3's (logged once) where it cannot take the layer; where its self-check
disagrees with exllamav3's it fails closed when `=own` was set explicitly, and falls back
with a warning when "own" is only the default (switch unset).

Fail closed at load, naming the tensor: a 3INST codebook (the kernel takes
mcg/mul1), gate/up/down of an expert on different codebooks, a missing
extension symbol or a call the extension rejects (ABI), a self-check that
disagrees with the loop. Shapes the kernel cannot take (hidden or the rank's
intermediate not a multiple of 128, expert biases) keep the loop, logged once
per layer; the loop cannot be captured and says so inside a capture.
"""

from __future__ import annotations

import logging

import torch

from ..format.codebook import CODEBOOK_MCG, CODEBOOK_MUL1
from ..format.errors import Exl3FormatError
from . import moe_schedule, select
from .cuda_backend import MOE_SHARDS, Exl3CudaMoE
from .cuda_decode import loader as decode_loader
from .cuda_decode import own as own_kernel
from .cuda_decode.coop_rows import CoopRows

logger = logging.getLogger("vllm.spark_overlay.exl3")

REQUIRED_SYMBOLS = ("exl3_moe", "exl3_moe_max_concurrency")
ACT_SILU = 0  # MOE_ACT_SILU in exllamav3's exl3_moe_common.cuh (and MOE_COOP_ACT_SILU)
COOP_ROWS = 8  # exllamav3's MAX_BSZN: its own module calls exl3_moe_coop at up to 8 token rows
SELF_CHECK_TOLERANCE = 1e-2  # fused vs loop, max |dy| / max |y| (both fp16 GEMMs, different order)

_buffers: dict[tuple, tuple[torch.Tensor, ...]] = {}


def shared_buffers(device: torch.device, rows: int, hidden: int, inter: int) -> tuple[torch.Tensor, ...]:
    """Flat fp16 temp storage (state g/u [rows, hidden], intermediate g/u [rows, inter]), one per shape and device.

    Every fused MoE layer of a process uses the same buffers: launches on one
    stream run one after another.
    """
    key = (str(device), rows, hidden, inter)
    if key not in _buffers:
        _buffers[key] = tuple(
            torch.empty(rows, dim, dtype=torch.float16, device=device) for dim in (hidden, hidden, inter, inter)
        )
    return _buffers[key]


def unsupported_reason(loop: Exl3CudaMoE) -> str | None:
    """Why the fused kernel cannot take this layer (the loop serves it then), or None."""
    if not loop.layers:
        return "no local experts"
    inter = loop.layers[0]["w1"].shards[0]["out"]
    if loop.hidden % 128 or inter % 128:
        return f"hidden {loop.hidden} / intermediate {inter} per rank not multiples of 128"
    if any(b is not None for biases in loop.biases for b in biases.values()):
        return "expert biases (exllamav3's fused kernel has none)"
    return None


class Exl3FusedMoE:
    """Sync-free fused MoE for one layer; the loop stays as the fallback (see the module docstring)."""

    def __init__(self, loop: Exl3CudaMoE, ext, device, max_rows: int, prefix: str, self_check: bool = True,
                 top_k: int = 8) -> None:
        self.loop = loop
        self.ext = ext
        self.prefix = prefix
        self.device = torch.device(device)
        self.fallback = unsupported_reason(loop)
        self._fallback_logged = False
        loop.label = f"{prefix} (per-expert loop: {self.fallback})" if self.fallback else prefix
        if self.fallback:
            return
        missing = [s for s in REQUIRED_SYMBOLS if not hasattr(ext, s)]
        if missing:
            raise Exl3FormatError(
                f"{prefix}: exllamav3's extension lacks {', '.join(missing)} (the fused MoE kernel); "
                "install exllamav3 1.6.5, whose extension has it"
            )
        self.num_local = len(loop.layers)
        self.hidden = loop.hidden
        self.inter = loop.layers[0]["w1"].shards[0]["out"]
        self.groups = self._groups()
        self.mul1 = all(cb == CODEBOOK_MUL1 for cb, *_ in self.groups)
        self.tables = self._tables()
        try:
            concurrency = int(ext.exl3_moe_max_concurrency(self.device.index or 0))
        except Exception as err:  # pybind TypeError: a different extension ABI
            raise Exl3FormatError(f"{prefix}: exl3_moe_max_concurrency failed ({err}); extension ABI mismatch") from err
        self.max_rows = max(1, int(max_rows))
        self.tiers = moe_schedule.tiers(concurrency, self.max_rows, self.mul1)
        rows = moe_schedule.buffer_rows(self.tiers)
        self.buffers = shared_buffers(self.device, rows, self.hidden, self.inter)
        self.buffer_bytes = rows * 2 * (2 * self.hidden + 2 * self.inter)
        self.top_k = max(1, min(int(top_k), self.num_local))
        self.coop = self._coop()
        self.own = self._own()
        if self_check:  # the own kernel first: a failed check drops it before the loop check serves it
            self.check_own()
            self.check_against_loop()

    # -- load ------------------------------------------------------------------------------

    def _groups(self) -> list[tuple]:
        """[(codebook, Kg, Ku, Kd, member bool [E+1] or None, experts)] -- one launch set per distinct key."""
        keys: dict[tuple, list[int]] = {}
        for e, layers in enumerate(self.loop.layers):
            cbs = []
            for sid in MOE_SHARDS:
                shard = layers[sid].shards[0]
                if shard["codebook"] not in (CODEBOOK_MCG, CODEBOOK_MUL1):
                    raise Exl3FormatError(
                        f"{layers[sid].name}: codebook {shard['codebook']} (no mcg/mul1 marker); exllamav3's fused MoE "
                        "kernel takes mcg or mul1 only -- re-convert the experts with -cb mul1"
                    )
                cbs.append(shard["codebook"])
            if len(set(cbs)) != 1:
                raise Exl3FormatError(
                    f"{layers['w2'].name}: gate/up/down of local expert {e} use codebooks {'/'.join(cbs)}; "
                    "the fused MoE kernel needs one codebook per expert"
                )
            key = (cbs[0], *(layers[sid].shards[0]["k"] for sid in MOE_SHARDS))
            keys.setdefault(key, []).append(e)
        out = []
        for key, experts in keys.items():
            member = None
            if len(keys) > 1:
                member = torch.zeros(self.num_local + 1, dtype=torch.bool)
                member[experts] = True
                member = member.to(self.device)
            out.append((*key, member, experts))
        return out

    def _tables(self) -> dict[str, torch.Tensor]:
        """Nine int64 device tables of data pointers, [num_local] each, built once."""
        tables = {}
        for sid in MOE_SHARDS:
            for kind in ("trellis", "suh", "svh"):
                ptrs = [layers[sid].shards[0][kind].data_ptr() for layers in self.loop.layers]
                tables[f"{sid}_{kind}"] = torch.tensor(ptrs, dtype=torch.int64).to(self.device)
        return tables

    def _coop(self) -> CoopRows | None:
        """exllamav3's decode kernel (exl3_moe_coop) for calls up to DECODE_MAX_ROWS, or None where it does not apply.

        It takes one bit width for gate and up and one launch for the layer (a single K group), reads
        the top-k ids directly (no sort) and keeps its own self-resetting completion counters.
        """
        if not select.moe_coop():
            return None
        if not hasattr(self.ext, "exl3_moe_coop") or len(self.groups) != 1:
            return None
        cb, kg, ku, kd = self.groups[0][:4]
        if kg != ku:
            return None
        return CoopRows(self.ext, self.tables, (float(kg), float(ku), float(kd)), cb == CODEBOOK_MCG,
                        cb == CODEBOOK_MUL1, self.hidden, self.inter, self.top_k,
                        moe_schedule.decode_chunk(self.top_k), self.device, self.prefix, self._decode_lib())

    def _decode_lib(self):
        """spark-kit's decode library (one-launch input/output conversions), or None: torch's conversions."""
        if self.device.type != "cuda":
            return None
        cap = torch.cuda.get_device_capability(self.device)
        try:
            return decode_loader.load(f"sm_{cap[0]}{cap[1]}")
        except (Exl3FormatError, OSError) as err:  # no nvcc, a failed build, a library that does not load
            logger.warning("exl3: %s: decode library not built (%s); torch converts the decode kernel's inputs",
                           self.prefix, err)
            return None

    def _own(self) -> own_kernel.OwnDecodeMoE | None:
        """spark-kit's own decode kernel (1..64 rows) when the switch asks for it and it can take the layer."""
        if self.coop is None or select.moe_decode() != select.DECODE_OWN:
            return None
        why = own_kernel.supports(self.groups, self.top_k) or (None if self.device.type == "cuda" else "not a CUDA device")
        if why is None:
            try:
                return own_kernel.OwnDecodeMoE(self.tables, int(self.groups[0][1]), self.hidden, self.inter,
                                               self.num_local, self.top_k, self.device)
            except (Exl3FormatError, OSError) as err:  # no nvcc, a failed build, a library that does not load
                why = str(err)
        logger.warning("exl3: %s: own decode kernel not used (%s); exllamav3's decode kernel", self.prefix, why)
        return None

    def check_own(self) -> None:
        """The own kernel vs exllamav3's decode kernel at every row count it takes.

        On a disagreement: with SPARK_EXL3_MOE_COOP=own set explicitly an Exl3FormatError (fail closed);
        with the switch unset and "own" its default, a warning and exllamav3's kernel for this layer."""
        if self.own is None:
            return
        gen = torch.Generator(device=self.device).manual_seed(2)
        experts = self.groups[0][-1]
        top = self.own.max_rows
        for rows in sorted({*range(1, min(top, 8) + 1), min(top, 16), min(top, 17), top}) + [1]:
            ids = self_check_ids(experts, self.num_local, self.top_k, rows).to(self.device)
            x = torch.randn(rows, self.hidden, generator=gen, device=self.device).to(torch.float16)
            w = torch.softmax(torch.randn(rows, self.top_k, generator=gen, device=self.device), -1)
            err = max_rel(self.own(x, w, ids), self.coop(x, w, ids, torch.float32))
            if not err <= SELF_CHECK_TOLERANCE:
                what = (f"{self.loop.layers[experts[0]]['w1'].name}: spark-kit's own decode kernel disagrees with "
                        f"exllamav3's on this layer at {rows} rows (max rel diff {err:.2e} > {SELF_CHECK_TOLERANCE})")
                own_check_failed(what, "exllamav3's decode kernel", select.moe_decode_explicit())
                self.own = None  # never serve the own kernel's result after a failed check
                return

    def check_against_loop(self) -> None:
        """Fused vs loop on rows that reach every tier of every expert group; primes each kernel instance."""
        gen = torch.Generator(device=self.device).manual_seed(1)
        top_k = self.top_k
        cases = [(group[-1], min(70, self.max_rows)) for group in self.groups]
        if self.coop is not None:  # the decode path: 1..8 rows, twice at 1 (counters reset), across launch bounds
            chunk = self.coop.chunk
            rows = (*range(1, COOP_ROWS + 1), 1, chunk, chunk + 1, moe_schedule.DECODE_MAX_ROWS)
            cases += [(self.groups[0][-1], n) for n in sorted(set(rows), key=rows.index)
                      if n <= moe_schedule.DECODE_MAX_ROWS]
        for experts, rows in cases:
            ids = self_check_ids(experts, self.num_local, top_k, rows)
            tokens = ids.shape[0]
            x = torch.randn(tokens, self.hidden, generator=gen, device=self.device).to(torch.float16)
            w = torch.softmax(torch.randn(tokens, top_k, generator=gen, device=self.device), -1)
            ids = ids.to(self.device)
            err = max_rel(self(x, w, ids), self.loop(x, w, ids))
            if not err <= SELF_CHECK_TOLERANCE:
                raise Exl3FormatError(
                    f"{self.loop.layers[experts[0]]['w1'].name}: exllamav3's fused MoE kernel disagrees with exl3_gemm "
                    f"on this layer (max rel diff {err:.2e} > {SELF_CHECK_TOLERANCE}); extension ABI mismatch?"
                )

    # -- call ------------------------------------------------------------------------------

    def __call__(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        expert_map: torch.Tensor | None = None,
        weight_on_input: bool = False,
    ) -> torch.Tensor:
        if self.fallback:
            if not self._fallback_logged:
                self._fallback_logged = True
                logger.warning("exl3: %s: fused MoE kernel not used (%s); per-expert loop", self.prefix, self.fallback)
            return self.loop(x, topk_weights, topk_ids, expert_map, weight_on_input)
        tokens, top_k = topk_ids.shape
        decode = expert_map is None and top_k <= self.top_k and 0 < tokens <= moe_schedule.DECODE_MAX_ROWS
        if decode and self.own is not None and tokens <= self.own.serve_rows and not weight_on_input:
            return self.own(x, topk_weights, topk_ids)  # reads and writes x's dtype: no conversion kernels
        if decode and self.coop is not None and not weight_on_input:
            return self.coop(x, topk_weights, topk_ids, x.dtype)  # one conversion launch at most each side
        x16 = x.reshape(tokens, self.hidden).to(torch.float16)
        if weight_on_input:
            if top_k != 1:
                raise Exl3FormatError(f"{self.prefix}: router weight on the input needs top-1 routing, not top-{top_k}")
            x16 = (x16.float() * topk_weights.float()).to(torch.float16)
            topk_weights = torch.ones_like(topk_weights)
        x16 = x16.contiguous()
        if decode and self.coop is not None:
            return self.coop(x16, topk_weights, topk_ids, x.dtype)
        out = torch.zeros(tokens, self.hidden, dtype=torch.float32, device=x.device)
        for start, stop in moe_schedule.chunks(tokens, self.max_rows):
            if stop == start:
                continue
            ids, wts = topk_ids[start:stop], topk_weights[start:stop]
            for cb, kg, ku, kd, member, _ in self.groups:
                count, token_sorted, weight_sorted = moe_schedule.route(ids, wts, self.num_local, expert_map, member)
                for launch in moe_schedule.plan(stop - start, top_k, self.num_local, self.tiers):
                    self._launch(x16[start:stop], out[start:stop], count, token_sorted, weight_sorted, cb, (kg, ku, kd),
                                 launch)
        return out.to(x.dtype)

    def _launch(self, x16, out, count, token_sorted, weight_sorted, cb, ks, launch) -> None:
        tier = launch.tier
        n = tier.groups * tier.rows
        sg, su, ig, iu = self.buffers
        views = (sg[:n].view(tier.groups, tier.rows, self.hidden), su[:n].view(tier.groups, tier.rows, self.hidden),
                 ig[:n].view(tier.groups, tier.rows, self.inter), iu[:n].view(tier.groups, tier.rows, self.inter))
        t = self.tables
        mcg, mul1 = cb == CODEBOOK_MCG, cb == CODEBOOK_MUL1
        try:
            self.ext.exl3_moe(
                x16, out, count, token_sorted, weight_sorted, *views, ACT_SILU, float(ks[0]), float(ks[1]),
                float(ks[2]),
                t["w1_trellis"], t["w1_suh"], t["w1_svh"], t["w3_trellis"], t["w3_suh"], t["w3_svh"],
                t["w2_trellis"], t["w2_suh"], t["w2_svh"],
                mcg, mul1, mcg, mul1, mcg, mul1, 0.0, launch.num_active, None, None,
                tier.count_lo, tier.count_hi, tier.m_tile,
            )
        except TypeError as err:  # pybind: the installed extension takes other arguments
            raise Exl3FormatError(f"{self.prefix}: exl3_moe rejected the call ({err}); extension ABI mismatch") from err


def max_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| in float32 (a self-check's measure; 0 when both are zero)."""
    got, want = got.float(), want.float()
    scale = float(want.abs().max()) or 1.0
    return float((got - want).abs().max()) / scale


def own_check_failed(what: str, keeps: str, explicit: bool) -> None:
    """A layer's own-kernel check disagreed (`what`): fail the load when SPARK_EXL3_MOE_COOP=own was set
    (`explicit`), else log that the layer keeps `keeps` (exllamav3's kernel) and return."""
    if explicit:
        raise Exl3FormatError(f"{what}; set {select.MOE_COOP_ENV}=1 to use exllamav3's kernels")
    logger.warning("exl3: %s; this layer uses %s (set %s=1 for every layer)", what, keeps, select.MOE_COOP_ENV)


def self_check_ids(experts: list[int], num_local: int, top_k: int, tokens: int) -> torch.Tensor:
    """Top-k ids [tokens, top_k] (distinct per row) giving experts[0..2] about tokens/40/20 rows, the rest few.

    So one call reaches the 16-, 32-, 64-row and wide tiers where the sizes allow.
    """
    pool = list(experts) + [e for e in range(num_local) if e not in set(experts)]
    heavy = [(experts[i], n) for i, n in enumerate((tokens, 40, 20)) if i < len(experts)]
    rest = [e for e in experts[len(heavy):]] or list(experts)
    rows = []
    for t in range(tokens):
        row = [e for e, n in heavy if t < n][:top_k]
        j = t * top_k
        while len(row) < top_k:
            cand = rest[j % len(rest)] if len(set(rest) - set(row)) else next(e for e in pool if e not in row)
            j += 1
            if cand not in row:
                row.append(cand)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int64)
