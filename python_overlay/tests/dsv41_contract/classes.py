"""The K map's classes in the real checkpoint layout, the vLLM layer each lands in, and how it must be served.

`CLASSES` is the contract: every packed checkpoint linear belongs to exactly one class; its vLLM layer
must carry an EXL3 method ("exl3") or be one the overlay decodes to dense at load ("dense", vLLM builds
it with no quantization method). `violations` checks a model's method map against it; stripping one
class's method from the map (`strip`) must make it fail (the negative half of the test).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

LM = "language_model.model."


@dataclass(frozen=True)
class Class:
    name: str
    checkpoint: str  # regex over packed checkpoint prefixes; group 1 is the layer index
    module: str  # the vLLM module, "{0}" = the layer index
    served: str  # "exl3" or "dense"


CLASSES = (
    Class("routed", r"^layers\.(\d+)\.ffn\.experts\.\d+\.w[123]$", LM + "layers.{0}.ffn.experts.routed_experts", "exl3"),
    Class("shared", r"^layers\.(\d+)\.ffn\.shared_experts\.w[13]$", LM + "layers.{0}.ffn.shared_experts.gate_up_proj",
          "exl3"),
    Class("shared.w2", r"^layers\.(\d+)\.ffn\.shared_experts\.w2$", LM + "layers.{0}.ffn.shared_experts.down_proj",
          "exl3"),
    Class("attn.wq_a+wkv", r"^layers\.(\d+)\.attn\.(?:wq_a|wkv)$", LM + "layers.{0}.attn.fused_wqa_wkv", "exl3"),
    Class("attn.wq_b", r"^layers\.(\d+)\.attn\.wq_b$", LM + "layers.{0}.attn.wq_b", "exl3"),
    Class("attn.wo_b", r"^layers\.(\d+)\.attn\.wo_b$", LM + "layers.{0}.attn.wo_b", "exl3"),
    Class("attn.wo_a", r"^layers\.(\d+)\.attn\.wo_a\.slice\.\d+$", LM + "layers.{0}.attn.wo_a", "exl3"),
    Class("indexer.wq_b", r"^layers\.(\d+)\.attn\.indexer\.wq_b$", LM + "layers.{0}.attn.indexer.wq_b", "exl3"),
    Class("indexer.wk", r"^layers\.(\d+)\.attn\.indexer\.wk$", LM + "layers.{0}.attn.indexer.wk", "dense"),
    Class("compressor", r"^layers\.(\d+)\.attn\.compressor\.(?:wkv|wgate)$",
          LM + "layers.{0}.attn.compressor.fused_wkv_wgate", "dense"),
    Class("engram.wkv", r"^layers\.(\d+)\.engram\.wkv$", LM + "layers.{0}.engram.wkv", "exl3"),
    Class("head", r"^(head)$", "language_model.lm_head", "exl3"),
)
# The DSpark stage (mtp.*): vLLM's VL wrapper drops these names (nvidia/vl_model.py ~L103); its
# `dspark` draft model loads them. Checked separately (test_dsv41_contract.py).
DRAFT = re.compile(r"^mtp\.\d+\.")


def class_of(prefix: str) -> tuple[Class, str] | None:
    for c in CLASSES:
        m = re.match(c.checkpoint, prefix)
        if m:
            return c, c.module.format(m.group(1))
    return None


def packed_prefixes(names) -> list[str]:
    return sorted(n[: -len(".trellis")] for n in names if n.endswith(".trellis"))


def method_map(model: torch.nn.Module) -> dict[str, str]:
    """vLLM module name -> the class name of its quantization method (modules that have one)."""
    return {n: type(m.quant_method).__name__ for n, m in model.named_modules() if getattr(m, "quant_method", None)}


def violations(prefixes, methods: dict[str, str]) -> list[str]:
    """Every packed checkpoint linear whose vLLM layer does not serve it the way its class must be served."""
    bad = []
    for prefix in prefixes:
        if DRAFT.match(prefix):
            continue
        found = class_of(prefix)
        if found is None:
            bad.append(f"{prefix}: in no class of the K map")
            continue
        cls, module = found
        method = methods.get(module, "none")
        ok = method.startswith("Exl3") if cls.served == "exl3" else method.startswith("Unquantized")
        if not ok:
            want = "an EXL3 method" if cls.served == "exl3" else "vLLM's unquantized method (decoded to dense at load)"
            bad.append(f"class {cls.name}: {prefix} -> {module} has {method}, needs {want}")
    return bad


def strip(methods: dict[str, str], name: str) -> dict[str, str]:
    """The method map with every layer of class `name` left without its method."""
    cls = next(c for c in CLASSES if c.name == name)
    pattern = re.compile("^" + re.escape(cls.module).replace(r"\{0\}", r"\d+") + "$")
    return {m: ("none" if pattern.match(m) else v) for m, v in methods.items()}


def linear_layers(model):
    """(name, module) of every EXL3 linear of the language model (the head aside: its logits are checked), in a
    stable order."""
    return [(n, m) for n, m in model.named_modules()
            if n.startswith("language_model.") and not n.endswith("lm_head")
            and type(getattr(m, "quant_method", None)).__name__ == "Exl3LinearMethod"]


def dense_layers(model):
    """(name, module) of the layers served dense from EXL3 tensors (decoded at load)."""
    modules = dict(model.named_modules())
    out = []
    for cls in CLASSES:
        if cls.served != "dense":
            continue
        pattern = re.compile("^" + re.escape(cls.module).replace(r"\{0\}", r"\d+") + "$")
        out.extend((n, modules[n]) for n in sorted(modules) if pattern.match(n))
    return out


def head_ranges(text_config, layer_index: int) -> list[tuple[int, int]]:
    """(first global row, rows) of every hash head of the Engram layer `layer_index`."""
    from spark_overlay.engram.layout import Geometry

    cfg = {k: getattr(text_config, k) for k in (
        "engram_layer_ids", "engram_num_embeddings", "engram_max_ngram_size", "engram_n_heads",
        "engram_head_dim", "engram_vocab_size")}
    g = Geometry.from_config(cfg)
    sizes = g.head_sizes()[list(g.layer_ids).index(layer_index)]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return list(zip(starts, sizes))


def full_width_error(model, vc, tp: int) -> str | None:
    """At TP>1: a full-width input to a row-parallel EXL3 layer must raise (not corrupt memory); the message."""
    from spark_overlay.exl3.format.errors import Exl3FormatError
    from vllm.config import set_current_vllm_config

    if tp == 1:
        return None
    layer = model.language_model.model.layers[0].attn.wo_b
    x = torch.zeros(3, layer.input_size, dtype=torch.bfloat16)
    try:
        with set_current_vllm_config(vc), torch.no_grad():
            layer(x)
    except Exl3FormatError as err:
        return str(err)
    return "no error"


def engram_reference(dense_tensors, layer: int, ids: torch.Tensor, head_start: int, part: int) -> torch.Tensor:
    """The rows the table file holds for `ids` [T, heads] (this rank's heads), dequantised: fp8 × 2^(e−127) per 32."""
    w = dense_tensors[f"layers.{layer}.engram.embed.weight"].float()
    e = dense_tensors[f"layers.{layer}.engram.embed.scale"].view(torch.uint8).to(torch.int32) - 127
    rows = ids[:, head_start : head_start + part]
    vals = w[rows]  # [T, part, 256]
    scale = torch.pow(2.0, e[rows].float()).repeat_interleave(32, dim=-1)
    return (vals * scale).to(torch.bfloat16).float()
