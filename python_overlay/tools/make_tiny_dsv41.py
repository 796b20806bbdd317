"""Make a tiny DeepSeek V4.1 EXL3 checkpoint in the REAL layout, its dense twin and its Engram table.

    python make_tiny_dsv41.py --out DIR [--seed 0]

For the contract test against vLLM's own `DeepseekV41ForCausalLM`
(python_overlay/tests/test_dsv41_contract.py). Writes, under DIR:

* ``exl3/``: config.json (the real `text_config` keys at tiny sizes, a
  0-layer vision tower, ``quantization_config`` {quant_method exl3, codebook
  mul1}), quantization_config.json, model.safetensors, tokenizer files. Tensor
  names and classes follow `src/checkpoint/dsv41.rs` (the real checkpoint):
  3 decoder layers (compress ratios 0/2/1; layers 1 and 2 own the compressor
  and the indexer keys, both run the indexer queries), Engram at layer 1, 64
  routed experts top-6 + 1 shared, one DSpark stage ``mtp.0`` (``main_proj``,
  a block, the Markov and confidence heads). Packed per the K map: routed 3,
  shared 5 (4 in layer 1, w2 5), attention 5 (layer 0 wq_a/wkv 6), indexer 8
  (wq_b and wk), compressor wkv/wgate 5, Engram wkv 5, MTP 4, head 6;
  ``attn.wo_a`` as ``o_groups`` slices ``attn.wo_a.slice.{g}``. Weights are
  random EXL3 (valid random trellises from `spark_overlay.exl3.random_trellis`,
  random-sign suh/svh scaled 1/sqrt(in)): the EXL3 file is the truth.
* ``dense/``: the same model with every packed linear replaced by its decoded
  weight (bf16; ``wo_a`` slices stacked into one ``attn.wo_a.weight``), the
  Engram table included, no quantization_config: the dense twin.
* ``engram/``: the slim Engram directory the file-backed hook reads
  (config.json, model.safetensors.index.json, the layer's fp8 table and
  e8m0 scales).

The tokenizer is make_tiny_model.py's (vocab 2048). ``engram_compressed_vocab_size``
comes from vLLM's own ``build_compressed_token_map`` and ``engram_num_embeddings``
from the hash-head primes, as vLLM checks them. stdout: one JSON line (paths,
tensor counts, the K of every packed linear).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXT = {
    "vocab_size": 2048, "hidden_size": 256, "num_hidden_layers": 3,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
    "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 128,
    "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 128,
    "hidden_act": "silu", "norm_topk_prob": True, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
    "routed_scaling_factor": 1.0, "swiglu_limit": 10.0, "num_hash_layers": 0, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "hc_mult": 4, "hc_eps": 1e-6, "hc_sinkhorn_iters": 20, "sliding_window": 128,
    "compress_ratios": [0, 2, 1, 0], "kv_source_layer_ids": [1, 2], "index_source_layer_ids": [1, 2],
    "index_n_heads": 4, "index_head_dim": 128, "index_topk": 64,
    "engram_layer_ids": [1], "engram_n_heads": 2, "engram_head_dim": 256,
    "engram_max_ngram_size": 3, "engram_vocab_size": 64, "engram_pad_token_id": 3,
    "num_nextn_predict_layers": 1, "dspark_n_routed_experts": 64, "dspark_num_experts_per_tok": 6,
    "dspark_target_layer_ids": [0, 1, 2], "dspark_markov_rank": 64,
    "expert_dtype": "bf16", "tie_word_embeddings": False,
}
VISION = {"num_hidden_layers": 0, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128,
          "patch_size": 14}
CODEBOOK = "mul1"
HEAD_BITS = 6


def k_of(role: str, layer: int, leaf: str, mtp: bool) -> int:
    """The K map (src/checkpoint/dsv41.rs `deepseek_k`, at tiny layer indices)."""
    if mtp:
        return 4
    if role == "routed":
        return 3
    if role == "shared":
        return 5 if layer != 1 or leaf == "w2" else 4
    if role == "attn":
        return 6 if layer == 0 and leaf in ("wq_a", "wkv") else 5
    if role == "indexer":
        return 8
    if role == "engram":
        return 5
    raise ValueError(role)


class Writer:
    """Collects the EXL3 tensors and the dense twin side by side."""

    def __init__(self, seed: int) -> None:
        import torch

        self.torch = torch
        self.gen = torch.Generator().manual_seed(seed)
        self.exl3: dict = {}
        self.dense: dict = {}
        self.ks: dict[str, float] = {}

    def native(self, name: str, shape, dtype="bf16", fill=None) -> None:
        torch = self.torch
        if fill is not None:
            t = torch.full(shape, fill, dtype=torch.float32)
        else:
            t = torch.randn(*shape, generator=self.gen) * 0.02
        t = t.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
        self.exl3[name] = t
        self.dense[name] = t

    def packed(self, prefix: str, n_in: int, n_out: int, k: int, dense_name: str | None = None):
        """A random EXL3 linear (in -> out); returns its decoded nn.Linear weight [out, in] (bf16)."""
        from spark_overlay import exl3

        torch = self.torch
        kp, np_ = -(-n_in // 128) * 128, -(-n_out // 128) * 128
        trellis, _ = exl3.random_trellis(kp // 16, np_ // 16, k, self.gen)
        sign = lambda n: torch.where(torch.rand(n, generator=self.gen) < 0.5, -1.0, 1.0)  # noqa: E731
        suh = (sign(kp) / n_in**0.5).to(torch.float16)
        svh = sign(np_).to(torch.float16)
        self.exl3[f"{prefix}.trellis"] = trellis
        self.exl3[f"{prefix}.suh"] = suh
        self.exl3[f"{prefix}.svh"] = svh
        self.exl3[f"{prefix}.{CODEBOOK}"] = torch.tensor(exl3.MARKER_VALUES[CODEBOOK], dtype=torch.int32)
        self.ks[prefix] = k
        w = exl3.full_weight(trellis, suh, svh, CODEBOOK)[:n_in, :n_out].t().contiguous().to(torch.bfloat16)
        if dense_name is not False:
            self.dense[dense_name or f"{prefix}.weight"] = w
        return w


def attention(w: Writer, c: dict, base: str, layer: int, mtp: bool) -> None:
    h, q = c["hidden_size"], c["num_attention_heads"] * c["head_dim"]
    k = lambda role, leaf: k_of(role, layer, leaf, mtp)  # noqa: E731
    w.native(f"{base}.attn_norm.weight", [h], fill=1.0)
    w.packed(f"{base}.attn.wq_a", h, c["q_lora_rank"], k("attn", "wq_a"))
    w.native(f"{base}.attn.q_norm.weight", [c["q_lora_rank"]], fill=1.0)
    w.packed(f"{base}.attn.wq_b", c["q_lora_rank"], q, k("attn", "wq_b"))
    w.packed(f"{base}.attn.wkv", h, c["head_dim"], k("attn", "wkv"))
    w.native(f"{base}.attn.kv_norm.weight", [c["head_dim"]], fill=1.0)
    groups = c["o_groups"]
    slices = [w.packed(f"{base}.attn.wo_a.slice.{g}", q // groups, c["o_lora_rank"], k("attn", "wo_a"), False)
              for g in range(groups)]
    w.dense[f"{base}.attn.wo_a.weight"] = w.torch.cat(slices, 0)
    w.packed(f"{base}.attn.wo_b", groups * c["o_lora_rank"], h, k("attn", "wo_b"))
    w.native(f"{base}.attn.attn_sink", [c["num_attention_heads"]], dtype="f32")
    if mtp:
        return
    if layer in c["kv_source_layer_ids"]:
        w.packed(f"{base}.attn.compressor.wkv", h, c["head_dim"], k("attn", "wkv"))
        w.native(f"{base}.attn.compressor.norm.weight", [c["head_dim"]], fill=1.0)
        if c["compress_ratios"][layer] > 1:
            w.packed(f"{base}.attn.compressor.wgate", h, c["head_dim"], k("attn", "wgate"))
        w.packed(f"{base}.attn.indexer.wk", c["head_dim"], c["index_head_dim"], k("indexer", "wk"))
        w.native(f"{base}.attn.indexer.k_norm.weight", [c["index_head_dim"]], fill=1.0)
    if layer in c["index_source_layer_ids"]:
        iq = c["index_n_heads"] * c["index_head_dim"]
        w.packed(f"{base}.attn.indexer.wq_b", c["q_lora_rank"], iq, k("indexer", "wq_b"))
        w.native(f"{base}.attn.indexer.weights_proj.weight", [c["index_n_heads"], h])
    if layer in c["engram_layer_ids"]:
        n_in = (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"] * c["engram_head_dim"]
        w.packed(f"{base}.engram.wkv", n_in, (c["hc_mult"] + 1) * h, k("engram", "wkv"))
        w.native(f"{base}.engram.k_weight", [c["hc_mult"], h])
        w.native(f"{base}.engram.q_weight", [c["hc_mult"], h])


def block(w: Writer, c: dict, base: str, layer: int, mtp: bool) -> None:
    h, hc = c["hidden_size"], c["hc_mult"]
    for part in ("attn", "ffn"):
        w.native(f"{base}.hc_{part}_fn", [(2 + hc) * hc, hc * h], dtype="f32")
        w.native(f"{base}.hc_{part}_base", [(2 + hc) * hc], dtype="f32")
        w.native(f"{base}.hc_{part}_scale", [3], dtype="f32", fill=1.0)
    attention(w, c, base, layer, mtp)
    experts = c["dspark_n_routed_experts"] if mtp else c["n_routed_experts"]
    inter = c["moe_intermediate_size"]
    w.native(f"{base}.ffn_norm.weight", [h], fill=1.0)
    w.native(f"{base}.ffn.gate.weight", [experts, h], dtype="f32" if mtp else "bf16")
    w.native(f"{base}.ffn.gate.bias", [experts], dtype="f32")
    k = lambda role, leaf: k_of(role, layer, leaf, mtp)  # noqa: E731
    for leaf, n_in, n_out in (("w1", h, inter), ("w3", h, inter), ("w2", inter, h)):
        w.packed(f"{base}.ffn.shared_experts.{leaf}", n_in, n_out, k("shared", leaf))
    for e in range(experts):
        for leaf, n_in, n_out in (("w1", h, inter), ("w3", h, inter), ("w2", inter, h)):
            w.packed(f"{base}.ffn.experts.{e}.{leaf}", n_in, n_out, k("routed", leaf))


def engram_table(w: Writer, c: dict, rows: int):
    """The layer's fp8 e4m3 rows [rows, 256] and e8m0 scales [rows, 8] (uint8 exponent bytes)."""
    torch = w.torch
    values = (torch.randn(rows, c["engram_head_dim"], generator=w.gen) * 0.5).to(torch.float8_e4m3fn)
    scales = torch.randint(120, 128, (rows, c["engram_head_dim"] // 32), generator=w.gen, dtype=torch.uint8)
    return values, scales


def text_config(tokenizer_dir: Path) -> dict:
    """TEXT with the Engram sizes vLLM derives and checks (compressed vocab, table rows)."""
    from transformers import AutoTokenizer
    from vllm.models.deepseek_v41.common.engram import build_compressed_token_map

    from spark_overlay.engram.layout import Geometry

    c = dict(TEXT)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    c["engram_compressed_vocab_size"] = build_compressed_token_map(tok)[1]
    c["engram_num_embeddings"] = [1] * len(c["engram_layer_ids"])
    sizes = Geometry.from_config(c).head_sizes()
    c["engram_num_embeddings"] = [sum(s) for s in sizes]
    return c


def save(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def make(out: Path, seed: int = 0) -> dict:
    import make_tiny_model as dense_maker
    import torch

    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        tok_dir.mkdir(exist_ok=True)
        texts, _ = dense_maker.read_corpus(dense_maker.corpus_files())
        dense_maker.write_tokenizer_files(dense_maker.train_tokenizer(texts), tok_dir)
    c = text_config(tok_dir)
    w = Writer(seed)
    h = c["hidden_size"]
    w.native("embed.weight", [c["vocab_size"], h])
    for layer in range(c["num_hidden_layers"]):
        block(w, c, f"layers.{layer}", layer, False)
    base = "mtp.0"
    w.packed(f"{base}.main_proj", len(c["dspark_target_layer_ids"]) * h, h, 4)
    w.native(f"{base}.main_norm.weight", [h], fill=1.0)
    block(w, c, base, c["num_hidden_layers"], True)
    r = c["dspark_markov_rank"]
    w.native(f"{base}.norm.weight", [h], fill=1.0)
    w.native(f"{base}.markov_head.embed.weight", [c["vocab_size"], r])
    w.native(f"{base}.markov_head.head.weight", [c["vocab_size"], r])
    w.native(f"{base}.confidence_head.proj.weight", [1, h + r])
    w.native("norm.weight", [h], fill=1.0)
    w.packed("head", h, c["vocab_size"], HEAD_BITS)
    tables = {}
    for layer, rows in zip(c["engram_layer_ids"], c["engram_num_embeddings"]):
        values, scales = engram_table(w, c, rows)
        tables[f"layers.{layer}.engram.embed.weight"] = values
        tables[f"layers.{layer}.engram.embed.scale"] = scales
    w.dense.update(tables)

    config = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "text_config": c,
              "vision_config": VISION, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
    quant = {"quant_method": "exl3", "codebook": CODEBOOK, "bits": 3.0, "head_bits": HEAD_BITS,
             "version": "spark-kit-tiny-dsv41-1"}
    for kind, tensors, extra in (("exl3", w.exl3, {"quantization_config": quant}), ("dense", w.dense, {})):
        d = out / kind
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        for f in tok_dir.iterdir():
            shutil.copy(f, d / f.name)
        (d / "config.json").write_text(json.dumps({**config, **extra}, indent=1))
        if extra:
            (d / "quantization_config.json").write_text(json.dumps(quant, indent=1))
        save(tensors, d / "model.safetensors")
    eng = out / "engram"
    eng.mkdir(exist_ok=True)
    (eng / "config.json").write_text(json.dumps(config, indent=1))
    # The slim directory stores the scales as F8_E8M0, as the released checkpoint does.
    save({k: (v.view(torch.float8_e8m0fnu) if k.endswith(".scale") else v) for k, v in tables.items()},
         eng / "engram.safetensors")
    (eng / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: "engram.safetensors" for k in tables}}, indent=1))
    return {"path": str(out), "exl3_tensors": len(w.exl3), "dense_tensors": len(w.dense), "k": w.ks,
            "engram_rows": c["engram_num_embeddings"], "engram_compressed_vocab_size": c["engram_compressed_vocab_size"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    summary = make(args.out, args.seed)
    summary["k"] = {p: k for p, k in summary["k"].items() if ".experts." not in p}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
