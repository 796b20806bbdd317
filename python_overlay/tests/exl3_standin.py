"""A CPU stand-in for exllamav3's extension (`exl3_gemm`, `exl3_moe`), for tests without a GPU.

`exl3_gemm` is the reference decoder's forward. `exl3_moe` follows the fused
kernel's contract as exllamav3 1.6.5's exl3_moe.cu states it: the argument
checks (dtypes, shapes, one codebook, mcg xor mul1, wide row tiles for mul1 only
and no taller than the temp buffers, concurrency x 8 SMs within the device),
then per local expert (the pointer tables' order) the span of `token_sorted`
given by the running sum of `expert_count`, skipping experts with no rows, more
rows than the temp buffers hold, or a count outside [count_lo, count_hi];
SiLU(x Wg) * (x Wu) rounded to fp16, then W_d, times the routing weight, added
to the float32 output. Every launch is recorded (`launches`) so tests can check
the schedule: which experts ran where, against the `num_active` passed.

`NoHostSync` is a torch function mode that fails on anything that would make a
CUDA host wait (item, tolist, bincount, nonzero, boolean indexing, ...) outside
the stand-in's own "kernel" bodies.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from spark_overlay.exl3 import full_weight

NUM_SMS = 132  # an H200
SMS_PER_EXPERT = 8

_kernel_depth = [0]


@contextlib.contextmanager
def kernel_body():
    _kernel_depth[0] += 1
    try:
        yield
    finally:
        _kernel_depth[0] -= 1


class HostSyncError(AssertionError):
    pass


_BANNED = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.numpy, torch.Tensor.nonzero, torch.nonzero, torch.bincount, torch.Tensor.bincount, torch.unique,
    torch.Tensor.unique, torch.masked_select, torch.Tensor.masked_select, torch.argwhere, torch.Tensor.cpu,
}


class NoHostSync(TorchFunctionMode):
    """Raise HostSyncError on host-synchronising torch calls made outside `kernel_body()`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _kernel_depth[0]:
            if func in _BANNED:
                raise HostSyncError(f"host sync on the fused MoE path: {getattr(func, '__name__', func)}")
            if func is torch.Tensor.__getitem__ and _bool_index(args[1] if len(args) > 1 else None):
                raise HostSyncError("host sync on the fused MoE path: boolean-mask indexing")
            if func is torch.repeat_interleave and len(args) > 1 and isinstance(args[1], torch.Tensor):
                raise HostSyncError("host sync on the fused MoE path: repeat_interleave with tensor repeats")
        return func(*args, **kwargs)


def _bool_index(idx) -> bool:
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise RuntimeError(f"exl3_moe: {msg}")


class StandInExt:
    """exl3_gemm / exl3_moe / exl3_moe_max_concurrency on the CPU (see the module docstring)."""

    def __init__(self) -> None:
        self.tensors: dict[int, torch.Tensor] = {}
        self.weights: dict[tuple, torch.Tensor] = {}
        self.launches: list[dict] = []

    def register(self, loop) -> None:
        """Make the loop's device tensors resolvable from their data pointers (the kernel's pointer tables)."""
        for layers in loop.layers:
            for layer in layers.values():
                for shard in layer.shards:
                    for kind in ("trellis", "suh", "svh"):
                        self.tensors[shard[kind].data_ptr()] = shard[kind]

    def _weight(self, trellis_ptr: int, suh_ptr: int, svh_ptr: int, codebook: str) -> torch.Tensor:
        key = (trellis_ptr, suh_ptr, svh_ptr, codebook)
        if key not in self.weights:
            t, su, sv = (self.tensors[p] for p in (trellis_ptr, suh_ptr, svh_ptr))
            self.weights[key] = full_weight(t, su, sv, codebook)
        return self.weights[key]

    def exl3_gemm(self, x, trellis, y, suh, xh, svh, force_shape, mcg, mul1, graph):
        with kernel_body():
            cb = "mcg" if mcg else "mul1" if mul1 else "3inst"
            for t in (trellis, suh, svh):
                self.tensors[t.data_ptr()] = t
            w = self._weight(trellis.data_ptr(), suh.data_ptr(), svh.data_ptr(), cb)
            y.copy_((x.float() @ w).to(y.dtype))
            return 0

    def exl3_moe_coop(self, x, sel, rw, min_expert, max_expert, hi, g_t, g_su, g_sv, u_t, u_su, u_sv, d_t, d_su, d_sv,
                      g_bias, u_bias, d_bias, kg, ku, kd, mcg, mul1, act, act_limit, gated, had_g, had_u, gu_g, gu_u,
                      act_out, d_out, ctr, out, sh_out, sh_gate_w):
        """exllamav3's decode kernel: every (token, slot) through its expert, summed and stored in `out` rows 0..bsz-1.

        The real kernel stores every row (its last-arriving block writes the row's sum), so whatever
        `out` held before is overwritten; rows past bsz are left alone.
        """
        with kernel_body():
            _check(x.dtype == torch.float16 and sel.dtype == torch.int64 and rw.dtype == torch.float16, "coop dtypes")
            _check(sel.is_contiguous() and rw.is_contiguous() and sel.shape == rw.shape, "sel/rw (bsz, topk)")
            _check(sel.shape[0] == x.shape[0] and x.shape[1] <= hi and hi % 128 == 0, "coop x / Hi shape")
            _check(not (mcg and mul1) and kg == ku and 1 <= kd <= 8, "coop codebook / bit widths")
            _check(act == 0 and gated and g_bias is None and sh_out is None, "stand-in: gated SiLU, no biases")
            inter = gu_g.shape[-1]
            slots_max = min(had_g.numel() // hi, had_u.numel() // hi, gu_g.numel() // inter, gu_u.numel() // inter,
                            act_out.numel() // inter, d_out.numel() // out.shape[-1])
            bsz, top_k = sel.shape
            _check(bsz * top_k <= slots_max and bsz <= out.shape[0], "coop batch exceeds the scratch")
            ctr_len = slots_max * (inter // 128) + out.shape[0] * (out.shape[-1] // 128) + 2 + 2 * slots_max + 1
            _check(ctr.dtype == torch.int32 and ctr.numel() >= ctr_len and not ctr.any(), "coop counters (zeroed)")
            cb = "mcg" if mcg else "mul1"
            lo = 0 if min_expert < 0 else min_expert
            out[:bsz] = 0
            local = sel.long() - lo
            for e in sorted(set(local.reshape(-1).tolist())):  # each expert once, over all rows that picked it
                if min_expert >= 0 and not 0 <= e < max_expert - min_expert:
                    continue
                picked = local == e
                rows = picked.any(-1)
                xs = x[rows].float()
                g = xs @ self._weight(int(g_t[e]), int(g_su[e]), int(g_sv[e]), cb)
                u = xs @ self._weight(int(u_t[e]), int(u_su[e]), int(u_sv[e]), cb)
                h = (torch.nn.functional.silu(g) * u).to(torch.float16).float()
                wts = (rw.float() * picked).sum(-1)[rows]
                out[:bsz][rows] += wts[:, None] * (h @ self._weight(int(d_t[e]), int(d_su[e]), int(d_sv[e]), cb))
            self.launches.append({"coop": True, "bsz": bsz, "experts": []})

    def exl3_moe_max_concurrency(self, device: int) -> int:
        return NUM_SMS // SMS_PER_EXPERT

    def exl3_moe(self, x, out, count, token_sorted, weight_sorted, tsg, tsu, tig, tiu, act, kg, ku, kd,
                 g_t, g_su, g_sv, u_t, u_su, u_sv, d_t, d_su, d_sv, g_mcg, g_mul1, u_mcg, u_mul1, d_mcg, d_mul1,
                 act_limit, num_active, scratch, fused_base, count_lo, count_hi, m_tile):
        with kernel_body():
            _check(x.dtype == torch.float16 and x.dim() == 2, "hidden_state must be fp16 [bsz, hidden]")
            _check(out.dtype == torch.float32 and out.shape == x.shape, "output_state must be fp32 like hidden_state")
            _check(count.dtype == torch.int64 and count.dim() == 1 and count.shape[0] >= 1, "expert_count int64")
            _check(token_sorted.dtype == torch.int64 and weight_sorted.dtype == torch.float16, "sorted dtypes")
            _check(token_sorted.shape == weight_sorted.shape, "token_sorted / weight_sorted shapes")
            for t in (tsg, tsu, tig, tiu):
                _check(t.dtype == torch.float16 and t.dim() == 3, "temp buffers fp16, 3-d")
            _check(tsg.shape == tsu.shape and tsg.shape[2] == x.shape[1], "temp state [groups, rows, hidden]")
            _check(tig.shape == tiu.shape and tig.shape[:2] == tsg.shape[:2], "temp intermediate [groups, rows, I]")
            _check(g_mcg == u_mcg == d_mcg and g_mul1 == u_mul1 == d_mul1, "gate/up/down must share the codebook")
            _check(g_mcg != g_mul1, "only mcg and mul1 codebooks are supported")
            _check(act == 0, "stand-in: SiLU only")
            num_experts = count.shape[0] - 1
            for table in (g_t, g_su, g_sv, u_t, u_su, u_sv, d_t, d_su, d_sv):
                _check(table.shape == (num_experts,), "pointer tables [num_experts]")
            groups, rows, inter = tsg.shape[0], tsg.shape[1], tig.shape[2]
            _check(m_tile in (16, 32, 64), "m_tile 16/32/64")
            if m_tile > 16:
                _check(bool(g_mul1), "row tiles above 16 are instantiated for the mul1 codebook only")
                _check(rows >= m_tile, "temp buffers hold fewer rows than the tile")
            if not x.shape[0] or not num_experts or not num_active or not rows:
                self.launches.append({"experts": [], "num_active": num_active, "count_lo": count_lo,
                                      "count_hi": count_hi, "m_tile": m_tile, "groups": groups, "rows": rows})
                return
            _check(groups * SMS_PER_EXPERT <= NUM_SMS, "concurrency too high for device num_sms")
            cb = "mcg" if g_mcg else "mul1"
            counts = count.tolist()
            done = []
            start = 0
            for e in range(num_experts):
                n = counts[e]
                s, start = start, start + n
                if n == 0 or n > rows or n < count_lo or n > count_hi:
                    continue
                done.append((e, n))
                tok = token_sorted[s:s + n]
                w = weight_sorted[s:s + n].float()[:, None]
                xs = x[tok].float()
                g = xs @ self._weight(int(g_t[e]), int(g_su[e]), int(g_sv[e]), cb)
                u = xs @ self._weight(int(u_t[e]), int(u_su[e]), int(u_sv[e]), cb)
                h = (torch.nn.functional.silu(g) * u).to(torch.float16).float()
                y = h @ self._weight(int(d_t[e]), int(d_su[e]), int(d_sv[e]), cb)
                out.index_add_(0, tok, y * w)
            self.launches.append({"experts": done, "num_active": num_active, "count_lo": count_lo,
                                  "count_hi": count_hi, "m_tile": m_tile, "groups": groups, "rows": rows,
                                  "k": (kg, ku, kd), "inter": inter})
