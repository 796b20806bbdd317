"""Device-side scheduling for exllamav3's fused MoE kernel (`exl3_moe`), with no host sync.

The kernel takes, per launch: the tokens' assignments sorted by local expert
(`token_sorted`, int64; `weight_sorted`, fp16), the number of assignments per
expert (`expert_count`, int64, one extra "sentinel" bin the kernel never
reads), per-expert device pointer tables, and temp buffers of
[groups, rows, dim] -- an expert with more than `rows` assignments, or a count
outside the launch's [count_lo, count_hi], is skipped by that launch. Each
expert group of 8+ SMs takes one expert at a time; `num_active` only sizes the
grid (an upper bound is correct, it just leaves groups idle).

Everything here is plain torch on whatever device the inputs live on:

    route(...)      counts and token order from topk ids: argsort + scatter_add
                    (no bincount, no .tolist(), no boolean indexing)
    plan(...)       the launches for a call of `tokens` rows: a pure function of
                    shapes (Python ints), so a CUDA graph captures the same
                    launches for every input of that size
    chunks(...)     token ranges of at most `max_rows` (a calls' expert count can
                    never exceed its token count: top-k experts are distinct)
    decode_chunk()  rows of one decode-kernel launch (exl3_moe_coop) at a top-k:
                    calls up to DECODE_MAX_ROWS take that kernel in such chunks

CPU tests drive these with a stand-in kernel (python_overlay/tests/exl3_standin.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Row tiles of exllamav3 1.6.5's instances: 16 for every codebook, 32 and 64 for mul1 only.
M_TILES_MUL1 = ((1, 16, 16), (17, 32, 32), (33, 64, 64))
# Expert groups the tier above 64 rows runs at once (each up to 32 SMs wide); its rows are the
# largest call (vLLM's max_num_batched_tokens), so its buffers are the big ones.
WIDE_GROUPS = 4
# exllamav3's decode kernel (exl3_moe_coop) takes up to 256 (row, pick) slots per launch (its
# MAX_SLOTS), grouping an expert's rows into runs of 8 that share one weight decode. Measured on an
# H200 (python_overlay/tests/gpu/exl3_moe_decode.py): one launch per 42 rows at top-6 beats 8-row
# chunks and the sorted tiers up to 64 rows (729 / 1221 / 2418 us at 16 / 32 / 64 rows against
# 1580 / 2620 / 4103 for the tiers); above 64 rows the tiers are kept (not measured).
DECODE_SLOTS = 256
DECODE_MAX_ROWS = 64


@dataclass(frozen=True)
class Tier:
    """One kernel launch: experts with count_lo <= count <= count_hi, row tile m_tile."""

    count_lo: int
    count_hi: int
    m_tile: int
    groups: int  # temp-buffer groups (kernel concurrency)
    rows: int  # temp-buffer rows per group (the kernel's max_tokens_per_expert)


@dataclass(frozen=True)
class Launch:
    tier: Tier
    num_active: int  # upper bound on the experts this launch can find


def tiers(concurrency: int, max_rows: int, mul1: bool) -> tuple[Tier, ...]:
    """The row tiers of a layer whose largest call has `max_rows` tokens.

    mul1: 16/32/64-row tiles at `concurrency` groups, then experts above 64 rows
    (up to `max_rows`) at min(WIDE_GROUPS, concurrency) groups with 64-row tiles.
    mcg: the same count ranges, all with the 16-row tile (the only mcg instance).
    """
    if concurrency < 1 or max_rows < 1:
        raise ValueError(f"exl3 fused MoE: concurrency {concurrency} and max rows {max_rows} must be >= 1")
    out = []
    for lo, hi, m in M_TILES_MUL1:
        if lo > max_rows:
            break
        hi = min(hi, max_rows)
        # The kernel requires rows >= m_tile for the wide instances: keep the full tile height.
        out.append(Tier(lo, hi, m if mul1 else 16, concurrency, max(hi, m if mul1 else 16)))
    if max_rows > 64:
        out.append(Tier(65, max_rows, 64 if mul1 else 16, min(WIDE_GROUPS, concurrency), max_rows))
    return tuple(out)


def buffer_rows(layer_tiers: tuple[Tier, ...]) -> int:
    """Rows of the shared temp storage: every tier's [groups, rows] view fits in it."""
    return max(t.groups * t.rows for t in layer_tiers)


def plan(tokens: int, top_k: int, num_local: int, layer_tiers: tuple[Tier, ...]) -> list[Launch]:
    """The launches for a call of `tokens` rows (<= the tiers' max rows), widest tier first.

    A tier whose lowest count exceeds `tokens` cannot hold an expert (an expert
    gets at most one assignment per token) and is not launched; `num_active` is
    min(local experts, assignments // count_lo), an upper bound on its experts.
    """
    if tokens > layer_tiers[-1].count_hi:
        raise ValueError(f"exl3 fused MoE: {tokens} rows exceed the largest tier ({layer_tiers[-1].count_hi}); chunk")
    assignments = tokens * top_k
    out = []
    for tier in reversed(layer_tiers):
        if tier.count_lo > tokens:
            continue
        bound = min(num_local, assignments // tier.count_lo)
        if bound >= 1:
            out.append(Launch(tier, bound))
    return out


def chunks(tokens: int, max_rows: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of at most max_rows tokens covering 0..tokens."""
    return [(s, min(s + max_rows, tokens)) for s in range(0, tokens, max_rows)] or [(0, 0)]


def decode_chunk(top_k: int) -> int:
    """Rows per decode-kernel launch: as many as its slots allow (42 at top-6, 32 at top-8)."""
    return max(1, DECODE_SLOTS // max(1, top_k))


def route(
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_local: int,
    expert_map: torch.Tensor | None = None,
    member: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(expert_count [num_local + 1] int64, token_sorted [A] int64, weight_sorted [A] fp16), A = tokens * top_k.

    `expert_map` maps global to local ids (-1: another rank's expert); `member`
    (bool [num_local + 1], last False) keeps only one group of experts (those
    sharing K). Every other assignment goes to the sentinel bin `num_local`,
    sorted last, which the kernel never reads. Sort is stable, so an expert's
    rows keep token order.
    """
    tokens, top_k = topk_ids.shape
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        ids = expert_map[ids].long()
    sentinel = torch.full_like(ids, num_local)
    ids = torch.where((ids >= 0) & (ids < num_local), ids, sentinel)
    if member is not None:
        ids = torch.where(member[ids], ids, sentinel)
    order = torch.argsort(ids, stable=True)
    token_sorted = torch.div(order, top_k, rounding_mode="floor")
    weight_sorted = topk_weights.reshape(-1)[order].to(torch.float16)
    count = torch.zeros(num_local + 1, dtype=torch.int64, device=ids.device)
    count.scatter_add_(0, ids, torch.ones_like(ids))
    return count, token_sorted, weight_sorted
