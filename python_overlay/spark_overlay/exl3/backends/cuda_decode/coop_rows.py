"""exllamav3's decode kernel (`exl3_moe_coop`) at any row count, in chunks, with no glue kernels.

exllamav3 calls its decode kernel at 1..8 rows only, but the kernel itself takes up to 256
(row, pick) slots: it groups the slots of one expert into runs of up to 8 rows that share one
weight decode. Above that this class cuts the call into chunks of `chunk` rows (one launch pair
each, graph-safe: chunk bounds come from the shape). Each chunk writes its rows of the call's
float32 output directly (the kernel stores every row; nothing to zero), so the only kernels
around the launches are the dtype conversions the caller's tensors need. With spark-kit's decode
library (`lib`, cuda_decode/decode_moe.cu) those are at most two tiny launches: x, ids and routing
weights converted in one (`spark_decode_prep`), and the output cast to x's dtype in one
(`spark_decode_cast`, none for float32); without it (no nvcc), torch's conversions.
"""

from __future__ import annotations

import torch

from ...format.errors import Exl3FormatError
from .. import moe_schedule
from . import loader

DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

ACT_SILU = 0
_scratch: dict[tuple, tuple[torch.Tensor, ...]] = {}


def shared_scratch(device: torch.device, chunk: int, top_k: int, hidden: int, inter: int) -> tuple[torch.Tensor, ...]:
    """The kernel's scratch (had_g, had_u, gu_g, gu_u, act, d_out, ctr), one set per shape and device.

    Every layer of a process shares it, as exllamav3's own module does: launches on one stream run
    one after another and the completion counters reset themselves (~12 MiB at 42 rows x top-6).
    """
    key = (str(device), chunk, top_k, hidden, inter)
    if key not in _scratch:
        slots = chunk * top_k
        half = {"dtype": torch.float16, "device": device}
        ctr_len = slots * (inter // 128) + chunk * (hidden // 128) + 2 + (slots + 1) + slots  # exl3_moe_coop_ctr_len
        _scratch[key] = (
            torch.empty(slots, hidden, **half), torch.empty(slots, hidden, **half), torch.empty(slots, inter, **half),
            torch.empty(slots, inter, **half), torch.empty(slots, inter, **half),
            torch.empty(slots, hidden, dtype=torch.float32, device=device),
            torch.zeros(ctr_len, dtype=torch.int32, device=device),
        )
    return _scratch[key]


class CoopRows:
    """Scratch and launches of `exl3_moe_coop` for chunks of up to `chunk` rows of one layer."""

    def __init__(self, ext, tables: dict[str, torch.Tensor], ks: tuple[float, float, float], mcg: bool, mul1: bool,
                 hidden: int, inter: int, top_k: int, chunk: int, device: torch.device, prefix: str,
                 lib=None) -> None:
        if not 1 <= chunk <= moe_schedule.decode_chunk(top_k):
            raise ValueError(f"{prefix}: {chunk} rows x top-{top_k} exceed the decode kernel's "
                             f"{moe_schedule.DECODE_SLOTS} slots")
        self.ext, self.t, self.ks, self.mcg, self.mul1 = ext, tables, ks, mcg, mul1
        self.hidden, self.inter, self.top_k, self.chunk, self.prefix = hidden, inter, top_k, chunk, prefix
        self.scratch = shared_scratch(torch.device(device), chunk, top_k, hidden, inter)
        self.lib = lib

    def launch(self, x16: torch.Tensor, ids64: torch.Tensor, w16: torch.Tensor, out: torch.Tensor) -> None:
        """One launch pair: rows of x16 (<= chunk) into out[:rows]; out has exactly `chunk` rows (counter layout)."""
        t = self.t
        try:
            self.ext.exl3_moe_coop(
                x16, ids64, w16, -1, -1, self.hidden,
                t["w1_trellis"], t["w1_suh"], t["w1_svh"], t["w3_trellis"], t["w3_suh"], t["w3_svh"],
                t["w2_trellis"], t["w2_suh"], t["w2_svh"], None, None, None, *self.ks,
                self.mcg, self.mul1, ACT_SILU, 0.0, True, *self.scratch, out, None, None,
            )
        except TypeError as err:  # pybind: the installed extension takes other arguments
            raise Exl3FormatError(f"{self.prefix}: exl3_moe_coop rejected the call ({err}); extension ABI mismatch") from err

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
        """The layer's output for every row of x, in `dtype` (x's by default)."""
        tokens = topk_ids.shape[0]
        dtype = dtype or x.dtype
        x = x.reshape(tokens, self.hidden)
        if self.lib is not None and x.dtype in DTYPES and topk_weights.dtype in DTYPES \
                and topk_ids.dtype in (torch.int32, torch.int64) and dtype in DTYPES:
            x16, ids, w16 = self._prep(x, topk_weights, topk_ids)
        else:
            x16 = x.to(torch.float16).contiguous()
            ids = topk_ids.long().contiguous()
            w16 = topk_weights.to(torch.float16).contiguous()
        # `chunk` spare rows: every launch gets a `chunk`-row view (the kernel's counter layout
        # depends on the output's row count), writing only its own rows.
        out = torch.empty(tokens + self.chunk, self.hidden, dtype=torch.float32, device=x16.device)
        for start, stop in moe_schedule.chunks(tokens, self.chunk):
            if stop > start:
                self.launch(x16[start:stop], ids[start:stop], w16[start:stop], out[start:start + self.chunk])
        if dtype == torch.float32:
            return out[:tokens]
        if self.lib is None or dtype not in DTYPES:
            return out[:tokens].to(dtype)
        y = torch.empty(tokens, self.hidden, dtype=dtype, device=out.device)
        err = self.lib.spark_decode_cast(out.data_ptr(), y.data_ptr(), DTYPES[dtype], y.numel(), 1,
                                         torch.cuda.current_stream(out.device).cuda_stream)
        loader.check(err, "spark_decode_cast")
        return y

    def _prep(self, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x as fp16, ids as int64, routing weights as fp16: one launch, or none when they already are."""
        if x.dtype == torch.float16 and w.dtype == torch.float16 and ids.dtype == torch.int64:
            return x.contiguous(), ids.contiguous(), w.contiguous()
        x, w, ids = x.contiguous(), w.contiguous(), ids.contiguous()
        rows, top_k = ids.shape
        x16 = torch.empty(rows, self.hidden, dtype=torch.float16, device=x.device)
        ids64 = torch.empty(rows, top_k, dtype=torch.int64, device=x.device)
        w16 = torch.empty(rows, top_k, dtype=torch.float16, device=x.device)
        err = self.lib.spark_decode_prep(
            x.data_ptr(), DTYPES[x.dtype], ids.data_ptr(), int(ids.dtype == torch.int64), w.data_ptr(),
            DTYPES[w.dtype], x16.data_ptr(), ids64.data_ptr(), w16.data_ptr(), rows, top_k, self.hidden, 1,
            torch.cuda.current_stream(x.device).cuda_stream,
        )
        loader.check(err, "spark_decode_prep")
        return x16, ids64, w16
