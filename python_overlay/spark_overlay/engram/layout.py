"""Hash-head ownership, exactly as the runtime computes it (pure; mirrors src/engram/layout.rs).

Per layer, ``(max_ngram_size - 1) * n_heads`` hash heads; each head's bucket
count is the next prime above ``engram_vocab_size - 1`` not handed out before
(layer by layer, n-gram by n-gram, head by head). A rank owns whole heads:
``part = ceil(heads / (tp * dp))``, heads ``[r*part, (r+1)*part)``, i.e. rows
``[sum(sizes[:start]), sum(sizes[:end]))``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import EngramError

KEYS = (
    "engram_layer_ids",
    "engram_num_embeddings",
    "engram_max_ngram_size",
    "engram_n_heads",
    "engram_head_dim",
    "engram_vocab_size",
)


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for 64-bit integers."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in small:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class Owned:
    lo: int
    hi: int
    head_start: int
    head_end: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Geometry:
    layer_ids: tuple[int, ...]
    num_embeddings: tuple[int, ...]
    max_ngram_size: int
    n_heads: int
    head_dim: int
    vocab_size: int

    @classmethod
    def from_config(cls, config: dict) -> "Geometry":
        root = config
        if "engram_layer_ids" not in root and "engram_layer_ids" in config.get("text_config", {}):
            root = config["text_config"]
        missing = [k for k in KEYS if k not in root]
        if missing:
            raise EngramError(
                f"config.json has no {', '.join(missing)} (at the top level or under "
                "text_config): not a DeepSeek V4.1 checkpoint with Engram tables"
            )
        g = cls(
            layer_ids=tuple(int(v) for v in root["engram_layer_ids"]),
            num_embeddings=tuple(int(v) for v in root["engram_num_embeddings"]),
            max_ngram_size=int(root["engram_max_ngram_size"]),
            n_heads=int(root["engram_n_heads"]),
            head_dim=int(root["engram_head_dim"]),
            vocab_size=int(root["engram_vocab_size"]),
        )
        if len(g.layer_ids) != len(g.num_embeddings) or not g.layer_ids:
            raise EngramError(
                "config.json needs one engram_num_embeddings entry per engram_layer_ids entry"
            )
        return g

    @property
    def heads(self) -> int:
        return (self.max_ngram_size - 1) * self.n_heads

    def head_sizes(self) -> list[list[int]]:
        seen: set[int] = set()
        out = []
        for _ in self.layer_ids:
            sizes = []
            for _ in range(self.max_ngram_size - 1):
                current = self.vocab_size - 1
                for _ in range(self.n_heads):
                    current += 1
                    while not is_prime(current) or current in seen:
                        current += 1
                    seen.add(current)
                    sizes.append(current)
            out.append(sizes)
        return out

    def owned(self, layer: int, tp: int, dp: int, rank: int) -> Owned:
        if layer not in self.layer_ids:
            raise EngramError(
                f"layer {layer} has no Engram table (engram_layer_ids = {list(self.layer_ids)})"
            )
        sizes = self.head_sizes()[self.layer_ids.index(layer)]
        return owned_range(sizes, tp, dp, rank)


def owned_range(head_sizes, tp: int, dp: int, rank: int) -> Owned:
    world = tp * dp
    if world <= 0 or not 0 <= rank < world:
        raise EngramError(f"rank {rank} is out of range for tp {tp} x dp {dp}")
    heads = len(head_sizes)
    part = -(-heads // world)
    start = min(rank * part, heads)
    end = min(start + part, heads)
    return Owned(sum(head_sizes[:start]), sum(head_sizes[:end]), start, end)
