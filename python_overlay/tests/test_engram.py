"""spark_overlay.engram: ownership, row store, dequant and the vLLM hook.

Synthetic Engram shards are written as real safetensors (F8_E4M3 [rows, 256]
weights, F8_E8M0 [rows, 8] scales behind a small BF16 tensor, an index and a
config.json), ~50 MiB in a temp dir. The CPU vLLM in the engine venv has no
DeepSeek V4.1 Engram class, so the hook is tested against a stand-in class
with the documented signature, installed in a fake module of the real name.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import types

import numpy as np
import pytest
import torch
from torch import nn

from spark_overlay.engram import EngramError, dequant, hook
from spark_overlay.engram.layout import Geometry, is_prime, owned_range
from spark_overlay.engram.packed import PackedHeader, file_name, read_header
from spark_overlay.engram.row_store import RowStore
from spark_overlay.engram.tables import checkpoint_table

LAYERS = (1, 14)
VOCAB = 4000  # 24 heads x ~4000 rows x 264 B: ~25 MiB a layer


def config(rows):
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "text_config": {
            "engram_layer_ids": list(LAYERS), "engram_num_embeddings": list(rows),
            "engram_max_ngram_size": 4, "engram_n_heads": 8, "engram_head_dim": 256,
            "engram_vocab_size": VOCAB,
        },
    }


def records(layer: int, rows: np.ndarray) -> np.ndarray:
    """Known content: [n, 264] bytes of global rows; every weight byte value occurs, scales 100..139."""
    j = np.arange(264, dtype=np.uint64)[None, :]
    r = rows.astype(np.uint64)[:, None]
    h = (r * np.uint64(2654435761) + j * np.uint64(40503) + np.uint64(layer * 977)) % np.uint64(1 << 32)
    v = ((h >> np.uint64(7)) & np.uint64(0xFF)).astype(np.uint8)
    v[:, 256:] = (100 + (h[:, 256:] >> np.uint64(9)) % np.uint64(40)).astype(np.uint8)
    return v


@pytest.fixture(scope="module")
def engram_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("engram")
    g = Geometry.from_config(config([1, 1]))
    rows = [sum(s) for s in g.head_sizes()]
    (d / "config.json").write_text(json.dumps(config(rows)))
    weight_map = {}
    for i, (layer, n) in enumerate(zip(LAYERS, rows)):
        name = f"model-{47 + i:05d}-of-00048.safetensors"
        rec = records(layer, np.arange(n))
        w, s = rec[:, :256].tobytes(), rec[:, 256:].tobytes()
        header = {
            "__metadata__": {"format": "pt"},
            f"layers.{layer}.engram.wkv.weight": {"dtype": "BF16", "shape": [3, 5], "data_offsets": [0, 30]},
            f"layers.{layer}.engram.embed.weight": {"dtype": "F8_E4M3", "shape": [n, 256], "data_offsets": [30, 30 + len(w)]},
            f"layers.{layer}.engram.embed.scale": {"dtype": "F8_E8M0", "shape": [n, 8], "data_offsets": [30 + len(w), 30 + len(w) + len(s)]},
        }
        h = json.dumps(header).encode()
        with open(d / name, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + bytes(30) + w + s)
        weight_map[f"layers.{layer}.engram.embed.weight"] = name
        weight_map[f"layers.{layer}.engram.embed.scale"] = name
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d, g, rows


def write_packed(path, layer, lo, hi, rows):
    with open(path, "wb") as f:
        f.write(PackedHeader(layer, lo, hi, rows).to_bytes())
        f.write(records(layer, np.arange(lo, hi)).tobytes())


def probe_ids(n_rows: int, seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(0, n_rows, 2000)
    return np.concatenate([ids, [-1, 0, n_rows - 1]]).astype(np.int64)


def check(layer, lo, hi, ids, out):
    for k, rid in enumerate(ids):
        if 0 <= rid and lo <= rid < hi:
            assert np.array_equal(out[k], records(layer, np.array([rid]))[0]), rid
        else:
            assert not out[k].any(), rid


# --- ownership -------------------------------------------------------------------------------


def test_head_sizes_and_ranges():
    g = Geometry.from_config(config([1, 1]))
    sizes = g.head_sizes()
    assert g.heads == 24 and len(sizes) == 2
    assert sizes[0][0] == next(p for p in range(VOCAB, VOCAB + 100) if is_prime(p))
    assert len({p for s in sizes for p in s}) == 48
    for tp in (1, 2, 4, 5):
        ranges = [owned_range(sizes[1], tp, 1, r) for r in range(tp)]
        assert ranges[0].lo == 0 and ranges[-1].hi == sum(sizes[1])
        assert all(a.hi == b.lo for a, b in zip(ranges, ranges[1:]))
    assert owned_range(sizes[0], 2, 1, 1).head_start == 12
    with pytest.raises(EngramError, match="rank 2 is out of range"):
        owned_range(sizes[0], 2, 1, 2)
    with pytest.raises(EngramError, match="engram_vocab_size"):
        Geometry.from_config({"text_config": {"engram_layer_ids": [1]}})


def test_pinned_values_shared_with_rust():
    # Same numbers in src/engram/layout.rs::pinned_values_shared_with_the_python_overlay.
    g = Geometry.from_config(config([97968, 102814]))
    s = g.head_sizes()
    assert s[0][:10] == [4001, 4003, 4007, 4013, 4019, 4021, 4027, 4049, 4051, 4057]
    assert s[1][21:] == [4363, 4373, 4391]
    assert (sum(s[0]), sum(s[1])) == (97968, 102814)
    o = g.owned(14, 2, 1, 1)
    assert (o.lo, o.hi, o.head_start, o.head_end) == (50836, 102814, 12, 24)


# --- row store -------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 8])
def test_checkpoint_rows_owned_zeros_and_errors(engram_dir, threads):
    d, g, rows = engram_dir
    for layer, n in zip(LAYERS, rows):
        table = checkpoint_table(str(d), layer)
        assert table.rows == n and table.weight.offset % 4096 != 0
        owners = np.zeros(n, dtype=np.int32)
        ids = probe_ids(n, layer)
        for rank in (0, 1):
            o = g.owned(layer, 2, 1, rank)
            owners[o.lo : o.hi] += 1
            store = RowStore(layer=layer, rows=n, lo=o.lo, hi=o.hi, table=table, threads=threads)
            out = np.full((len(ids), 264), 0xAA, dtype=np.uint8)
            store.lookup_into(ids, out)
            check(layer, o.lo, o.hi, ids, out)
            for bad in (n, -2):
                with pytest.raises(EngramError, match=rf"{table.weight.path}: row id {bad} is outside the {n}-row table.*offset"):
                    store.lookup_into([3, bad], np.zeros((2, 264), dtype=np.uint8))
            store.close()
        assert (owners == 1).all(), "ranks 0 and 1 must cover every row exactly once"


def test_packed_and_resident_scales_match(engram_dir, tmp_path):
    d, g, rows = engram_dir
    layer, n = LAYERS[1], rows[1]
    o = g.owned(layer, 2, 1, 1)
    table = checkpoint_table(str(d), layer)
    path = tmp_path / file_name(layer, 1, 2)
    write_packed(path, layer, o.lo, o.hi, n)
    ids = probe_ids(n, 7)
    outs = []
    for kw in ({"packed": str(path)}, {"table": table, "resident_scales": True}, {"table": table, "direct": False}):
        store = RowStore(layer=layer, rows=n, lo=o.lo, hi=o.hi, threads=4, **kw)
        out = np.zeros((len(ids), 264), dtype=np.uint8)
        store.lookup_into(ids, out)
        check(layer, o.lo, o.hi, ids, out)
        outs.append(out)
        store.close()
    assert all(np.array_equal(outs[0], x) for x in outs[1:])


def test_packed_refusals(engram_dir, tmp_path):
    d, g, rows = engram_dir
    layer, n = LAYERS[0], rows[0]
    o0, o1 = g.owned(layer, 2, 1, 0), g.owned(layer, 2, 1, 1)
    path = tmp_path / file_name(layer, 0, 2)
    write_packed(path, layer, o0.lo, o0.hi, n)
    with pytest.raises(EngramError, match="another rank"):
        read_header(path, PackedHeader(layer, o1.lo, o1.hi, n))
    with pytest.raises(EngramError, match="holds layer 1, expected 14"):
        read_header(path, PackedHeader(14, o0.lo, o0.hi, n))
    raw = bytearray(path.read_bytes())
    raw[0] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(EngramError, match="magic"):
        read_header(path)
    raw[0] ^= 1
    path.write_bytes(bytes(raw[:-5]))
    with pytest.raises(EngramError, match=f"{path}.*truncated"):
        RowStore(layer=layer, rows=n, lo=o0.lo, hi=o0.hi, packed=str(path))


# --- dequant ---------------------------------------------------------------------------------


def test_dequant_bit_exact_for_every_byte_value():
    # Every (weight byte, scale byte) pair: 256 rows, row i uses scale byte i for all 8 groups and
    # weight bytes 0..255 in order.
    w = torch.arange(256, dtype=torch.uint8).repeat(256, 1)
    s = torch.arange(256, dtype=torch.uint8)[:, None].repeat(1, 8)
    want = dequant.reference(w, s)
    got = dequant.dequant(w, s)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    # Independently: x * 2^(e-127) for every finite scale code; code 255 is E8M0's NaN.
    expected = w.view(torch.float8_e4m3fn).float() * torch.ldexp(torch.ones(256, 1, dtype=torch.float64), s[:, :1].double() - 127).float()
    assert torch.equal(want[:255].view(torch.int16), expected[:255].to(torch.bfloat16).view(torch.int16))
    assert torch.isnan(want[255].float()).all()
    rec = torch.cat([w, s], dim=1)
    out = torch.empty(256, 256, dtype=torch.bfloat16)
    dequant.dequant_records(rec, out)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def test_uint8_view_is_the_landmine():
    rec = torch.from_numpy(records(1, np.arange(64)))
    w, s = rec[:, :256], rec[:, 256:]
    right = dequant.reference(w, s)
    wrong = dequant.dequant_uint8_landmine(w, s)
    assert torch.isfinite(wrong).all()
    differ = (right.float() != wrong.float()).float().mean().item()
    assert differ > 0.9, differ


# --- the vLLM hook ---------------------------------------------------------------------------


class StandIn(nn.Module):
    """ParallelEngramEmbedding with the documented signature (stock behaviour: rows in memory)."""

    def __init__(self, num_embeddings, dim, head_sizes, block_size=32, cpu_offload=False, dp_shared_memory=False,
                 use_thp=False):
        super().__init__()
        self.stock = True

    def _storage(self):
        return None

    def lookup(self, indices, out, background=False):
        raise AssertionError("stock lookup called")


class FakeRuntime:
    def __init__(self, tp, rank, dp=1):
        self.tp_, self.rank, self.dp_ = tp, rank, dp

    def tp(self):
        return self.tp_, self.rank

    def dp(self):
        return self.dp_

    def max_tokens(self):
        return 64

    def device(self):
        return None


@pytest.fixture
def fake_vllm(monkeypatch):
    """A module of the real name holding a fresh stand-in class; restores everything after."""
    cls = type("ParallelEngramEmbedding", (StandIn,), {
        "__init__": StandIn.__init__, "_storage": StandIn._storage, "lookup": StandIn.lookup,
    })
    mod = types.ModuleType(hook.MODULE)
    mod.ParallelEngramEmbedding = cls
    monkeypatch.setitem(sys.modules, hook.MODULE, mod)
    monkeypatch.setattr(hook, "_layers_taken", [])
    monkeypatch.setattr("spark_overlay.plugin.installed_vllm_version", lambda: "0.1.dev20904+g179dd0fa9")
    return cls


def test_hook_serves_rows_per_rank(engram_dir, tmp_path, fake_vllm, monkeypatch):
    d, g, rows = engram_dir
    packed = tmp_path / "packed"
    packed.mkdir()
    layer, n = LAYERS[1], rows[1]
    o1 = g.owned(layer, 2, 1, 1)
    write_packed(packed / file_name(layer, 1, 2), layer, o1.lo, o1.hi, n)
    monkeypatch.setenv("SPARK_ENGRAM_DIR", str(d))
    monkeypatch.setenv("SPARK_ENGRAM_PACKED_DIR", str(packed))
    monkeypatch.setenv("SPARK_ENGRAM_IO_THREADS", "4")
    hook.register()
    assert fake_vllm._spark_file_backed
    sizes = g.head_sizes()[1]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rng = np.random.default_rng(3)
    tokens = 10
    hashed = rng.integers(0, np.array(sizes)[None, :], (tokens, 24)) + offsets[None, :]
    indices = torch.from_numpy(hashed.astype(np.int64))
    full = dequant.reference(*(lambda r: (r[:, :256], r[:, 256:]))(torch.from_numpy(records(layer, hashed.reshape(-1)))))
    full = full.view(tokens, 24, 256)
    gathered = []
    for rank in (0, 1):
        monkeypatch.setattr(hook, "runtime", FakeRuntime(2, rank))
        monkeypatch.setattr(hook, "_layers_taken", [1])  # layer 1 already built: this one is 14
        emb = fake_vllm(n, 256, tuple(sizes))
        assert not hasattr(emb, "stock")
        assert emb.weight.shape == (0, 256) and emb.weight_scale_inv.shape == (0, 8)
        assert emb.weight.weight_loader(emb.weight, torch.zeros(5, 256)) is None
        assert (emb.head_start, emb.part_n_hash_cols) == (12 * rank, 12)
        assert (emb.dp_size, emb.cpu_offload, emb.tp_size, emb.n_hash_cols) == (1, False, 2, 24)
        assert emb._spark_layer == layer
        out = torch.empty(tokens, 12, 256, dtype=torch.bfloat16)
        emb.lookup(indices, out)
        assert torch.equal(out.view(torch.int16), full[:, 12 * rank : 12 * rank + 12].contiguous().view(torch.int16))
        gathered.append(out)
        with pytest.raises(hook.EngramHookError, match="file-backed"):
            emb._storage()
    # What the all-gather over ranks assembles is the whole reference lookup.
    assert torch.equal(torch.cat(gathered, dim=1).view(torch.int16), full.view(torch.int16))
    # Out-of-range ids: the documented error, naming the file.
    bad = indices.clone()
    bad[0, 13] = n + 5
    with pytest.raises(EngramError, match=rf"row id {n + 5} is outside"):
        emb.lookup(bad, torch.empty(tokens, 12, 256, dtype=torch.bfloat16))


def test_hook_fails_closed_on_signature_drift(fake_vllm, monkeypatch):
    def drifted(self, num_embeddings, dim, head_sizes, block_size=32, cpu_offload=False, model_dir=None):  # 0909-era
        pass

    monkeypatch.setattr(fake_vllm, "__init__", drifted)
    with pytest.raises(hook.EngramHookError) as err:
        hook.register()
    msg = str(err.value)
    assert "vLLM 0.1.dev20904+g179dd0fa9" in msg and "model_dir=None" in msg and "SPARK_ENGRAM=off" in msg
    assert not getattr(fake_vllm, "_spark_file_backed", False)
    monkeypatch.delattr(fake_vllm, "lookup")
    monkeypatch.setattr(fake_vllm, "__init__", StandIn.__init__)
    with pytest.raises(hook.EngramHookError, match="has no method lookup"):
        hook.register()
    monkeypatch.setenv("SPARK_ENGRAM", "off")
    hook.register()  # disabled: no check, no install


def test_hook_not_installed_without_the_class(monkeypatch):
    monkeypatch.delitem(sys.modules, hook.MODULE, raising=False)
    monkeypatch.setattr(hook, "module_source", lambda: None)  # a vLLM without DeepSeek V4.1
    monkeypatch.delenv("SPARK_ENGRAM_DIR", raising=False)
    assert hook.find_class() is None
    hook.register()


def test_hook_refuses_a_missing_class_for_an_engram_kit(tmp_path, monkeypatch):
    """SPARK_ENGRAM_DIR set (an Engram kit) but no class to patch: the stock in-memory table would
    load (tens of GiB a layer), so register() raises, naming the class and the vLLM version."""
    monkeypatch.setattr("spark_overlay.plugin.installed_vllm_version", lambda: "0.1.dev20904+g179dd0fa9")
    monkeypatch.setenv("SPARK_ENGRAM_DIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, hook.MODULE, raising=False)
    monkeypatch.setattr(hook, "module_source", lambda: None)
    with pytest.raises(hook.EngramHookError) as err:
        hook.register()
    msg = str(err.value)
    assert f"{hook.MODULE}.{hook.CLASS}" in msg and "vLLM 0.1.dev20904+g179dd0fa9" in msg, msg
    assert "SPARK_ENGRAM=off" in msg, msg
    # The module exists but the class was renamed.
    monkeypatch.setitem(sys.modules, hook.MODULE, types.ModuleType(hook.MODULE))
    with pytest.raises(hook.EngramHookError, match=hook.CLASS):
        hook.register()
    monkeypatch.setenv("SPARK_ENGRAM", "off")
    hook.register()  # disabled on purpose: the stock table is what was asked for


def test_hook_refuses_missing_dir_and_wrong_packed_range(engram_dir, tmp_path, fake_vllm, monkeypatch):
    d, g, rows = engram_dir
    hook.register()
    monkeypatch.setattr(hook, "runtime", FakeRuntime(2, 0))
    monkeypatch.delenv("SPARK_ENGRAM_DIR", raising=False)
    sizes = tuple(g.head_sizes()[0])
    with pytest.raises(hook.EngramHookError, match="SPARK_ENGRAM_DIR is not set"):
        fake_vllm(rows[0], 256, sizes)
    monkeypatch.setenv("SPARK_ENGRAM_DIR", str(d))
    monkeypatch.setenv("SPARK_ENGRAM_PACKED_DIR", str(tmp_path))
    o1 = g.owned(1, 2, 1, 1)
    write_packed(tmp_path / file_name(1, 0, 2), 1, o1.lo, o1.hi, rows[0])  # rank 1's rows under rank 0's name
    with pytest.raises(EngramError, match="another rank"):
        fake_vllm(rows[0], 256, sizes)
    monkeypatch.setenv("SPARK_ENGRAM_IO_THREADS", "zero")
    with pytest.raises(hook.EngramHookError, match="SPARK_ENGRAM_IO_THREADS"):
        fake_vllm(rows[0], 256, sizes)
    monkeypatch.delenv("SPARK_ENGRAM_IO_THREADS")
    monkeypatch.setattr(hook, "runtime", FakeRuntime(2, 0, dp=2))
    with pytest.raises(hook.EngramHookError, match="data-parallel size 2"):
        fake_vllm(rows[0], 256, sizes)
