"""File-backed Engram tables for DeepSeek V4.1 (docs/engram.md).

The two Engram n-gram tables (layers 1 and 14, ~95 GiB each in FP8) stay on
disk: each rank reads only the rows its hash heads own, from the checkpoint's
Engram shards or from its packed shard (``spark-kit pack-engram``), and
dequantizes them on the GPU. Nothing is pinned except small preallocated
staging buffers.

Modules: ``layout`` (hash-head ownership, as the runtime computes it),
``packed`` (the 4 KiB packed-shard header), ``tables`` (where a layer's
tensors are), ``row_store`` (O_DIRECT preadv reads, thread pool, zero-fill),
``dequant`` (FP8 E4M3 x 2^(E8M0-127) -> bf16, CPU reference and torch path),
``dequant_triton`` (the fused GPU kernel), ``hook`` (the vLLM replacement of
``ParallelEngramEmbedding``, installed by the plugin only when that class
exists). Importing this package imports neither vLLM nor torch.
"""

__all__ = ["EngramError"]


class EngramError(RuntimeError):
    """An Engram table or lookup problem; the message names the file (and offset)."""
