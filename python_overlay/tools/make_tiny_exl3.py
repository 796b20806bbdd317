"""Make spark-kit's tiny EXL3 test model and its dense twin, offline and deterministically.

    python make_tiny_exl3.py --out DIR [--dense-out DIR2] [--seed 0] [--train-steps 300]

1. Builds the dense tiny Llama with make_tiny_model.py (same seed/steps).
2. Packs every linear (q/k/v/o, gate/up/down of both layers, lm_head) with
   spark_overlay's EXL3 packer: random ±1 signs, a per-linear global scale in
   suh, the 128-point Hadamard on both sides, then a greedy tail-biting trellis
   encoder per 16x16 tile against the MUL1 codebook. K differs per linear
   (``K_PLAN``: 3, 3.5, 4, 5, 6; lm_head 6), like a real mixed-K conversion.
3. Writes the EXL3 model at ``--out`` in exllamav3's layout (format doc §1):
   config.json with ``quantization_config`` {quant_method exl3, codebook mul1,
   bits, head_bits}, quantization_config.json, model.safetensors with
   ``P.trellis`` int16 / ``P.suh`` ``P.svh`` fp16 / ``P.mul1`` int32 marker per
   linear (embeddings and norms as in the dense model), tokenizer files.
4. Writes the dense twin at ``--dense-out`` (default ``<out>-dense``): the same
   model with every linear replaced by its decoded EXL3 weight
   (``spark_overlay.exl3.full_weight``, float32). The EXL3 file is the truth;
   the twin is what it decodes to, so serving the twin densely and the EXL3
   model through the overlay must give the same tokens.

``--moe`` makes the tiny MoE variant instead: a random (untrained)
Qwen3MoeForCausalLM (hidden 128, 2 layers, 4 experts of intermediate 256,
top-2, 4 heads x 32, 2 KV heads, the same tokenizer) whose experts are packed
one EXL3 linear per expert and projection (``mlp.experts.{e}.{gate,up,down}_proj``,
K 3/3.5/4 by projection); the router ``mlp.gate`` stays dense, as exllamav3 leaves it.

stdout carries one JSON line: paths, sha256 of both safetensors, per-linear K
and relative error against the trained dense weights. Both directories are
built in temporary siblings and renamed into place.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import make_tiny_model as dense_maker  # noqa: E402

# K per linear (leaf name per layer), mixed on purpose; lm_head separately.
K_PLAN = {
    0: {"q_proj": 5, "k_proj": 5, "v_proj": 6, "o_proj": 4, "gate_proj": 3, "up_proj": 3.5, "down_proj": 4},
    1: {"q_proj": 4, "k_proj": 4, "v_proj": 5, "o_proj": 5, "gate_proj": 3.5, "up_proj": 3, "down_proj": 4},
}
HEAD_BITS = 6
CODEBOOK = "mul1"
LINEAR_LEAVES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
VERSION = "spark-kit-tiny-1"


def _exl3():
    from spark_overlay import exl3

    return exl3


def encode_linear(weight, k: float, generator):
    """Pack an nn.Linear weight [out, in] (float32) into EXL3 tensors (trellis, suh, svh, marker).

    W (in, out) = diag(suh)·Hk·W_hat·Hn·diag(svh); the target W_hat is
    Hk·diag(1/suh)·W·diag(1/svh)·Hn, scaled to unit RMS through suh. Each
    tile's symbols are chosen greedily in stream order (the 2^D states
    reachable from the previous one, nearest codebook value), twice around the
    ring so the wrap-around state is the settled one.
    """
    import torch

    exl3 = _exl3()
    out_f, in_f = weight.shape
    kp, np_ = -(-in_f // 128) * 128, -(-out_f // 128) * 128
    w = torch.zeros(kp, np_, dtype=torch.float64)
    w[:in_f, :out_f] = weight.t().to(torch.float64)
    su = torch.where(torch.rand(kp, generator=generator) < 0.5, -1.0, 1.0).to(torch.float64)
    sv = torch.where(torch.rand(np_, generator=generator) < 0.5, -1.0, 1.0).to(torch.float64)
    h = exl3.hadamard_128(torch.float64)
    rows = (w / su[:, None] / sv[None, :]).reshape(kp // 128, 128, np_)
    target = torch.matmul(h, rows).reshape(kp, np_)
    target = torch.matmul(target.reshape(kp, np_ // 128, 128), h).reshape(kp, np_)
    rms = float(target.pow(2).mean().sqrt()) or 1.0
    suh = (su * rms).to(torch.float16)
    svh = sv.to(torch.float16)
    # |suh| is the same for every row, so dividing after Hk equals dividing before;
    # use the stored (fp16-rounded) value so the decoded scale is exactly the one on disk.
    target = (target / float(suh[0].abs())).to(torch.float32)

    table = exl3.codebook_table(CODEBOOK).to(torch.float32)
    from spark_overlay.exl3.format.trellis import symbol_widths

    widths = symbol_widths(k)
    tiles = exl3.matrix_to_states(target)  # [T0, T1, 256] float targets in stream order
    t0, t1, _ = tiles.shape
    goal = tiles.reshape(-1, 256)
    n = goal.shape[0]
    state = torch.zeros(n, dtype=torch.int64)
    symbols = torch.zeros(n, 256, dtype=torch.int64)
    for _sweep in range(2):
        for t in range(256):
            d = int(widths[t])
            cand = ((state[:, None] << d) | torch.arange(1 << d)) & 0xFFFF
            err = (table[cand] - goal[:, t : t + 1]).abs()
            best = err.argmin(dim=1)
            symbols[:, t] = best
            state = cand[torch.arange(n), best]
    states = exl3.states_from_symbols(symbols, k)
    trellis = exl3.pack_states(states, k).reshape(t0, t1, -1)
    marker = torch.tensor(exl3.MARKER_VALUES[CODEBOOK], dtype=torch.int32)
    return trellis, suh, svh, marker


def decoded_weight(trellis, suh, svh, in_f: int, out_f: int):
    """The nn.Linear weight [out, in] float32 an EXL3 linear decodes to."""
    w = _exl3().full_weight(trellis, suh, svh, CODEBOOK)
    return w[:in_f, :out_f].t().contiguous()


MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": dense_maker.VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 256,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": dense_maker.MAX_POSITIONS,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": dense_maker.BOS_ID,
    "eos_token_id": dense_maker.EOS_ID,
    "pad_token_id": dense_maker.PAD_ID,
    "torch_dtype": "float32",
}
MOE_K = {"gate_proj": 3, "up_proj": 3.5, "down_proj": 4}


def moe_source(out: Path, seed: int) -> None:
    """A random tiny Qwen3-MoE in HF layout (weights N(0, 0.05), norms 1) with the dense maker's tokenizer."""
    import torch
    from safetensors.torch import save_file

    texts, _ = dense_maker.read_corpus(dense_maker.corpus_files())
    dense_maker.write_tokenizer_files(dense_maker.train_tokenizer(texts), out)
    c = MOE_CONFIG
    h, v, e, i = c["hidden_size"], c["vocab_size"], c["num_experts"], c["moe_intermediate_size"]
    hd, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen) * 0.05).contiguous()

    state = {"model.embed_tokens.weight": rnd(v, h), "model.norm.weight": torch.ones(h), "lm_head.weight": rnd(v, h)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        state[f"{p}.input_layernorm.weight"] = torch.ones(h)
        state[f"{p}.post_attention_layernorm.weight"] = torch.ones(h)
        state[f"{p}.self_attn.q_proj.weight"] = rnd(nh * hd, h)
        state[f"{p}.self_attn.k_proj.weight"] = rnd(nkv * hd, h)
        state[f"{p}.self_attn.v_proj.weight"] = rnd(nkv * hd, h)
        state[f"{p}.self_attn.o_proj.weight"] = rnd(h, nh * hd)
        state[f"{p}.self_attn.q_norm.weight"] = torch.ones(hd)
        state[f"{p}.self_attn.k_norm.weight"] = torch.ones(hd)
        state[f"{p}.mlp.gate.weight"] = rnd(e, h)
        for x in range(e):
            state[f"{p}.mlp.experts.{x}.gate_proj.weight"] = rnd(i, h)
            state[f"{p}.mlp.experts.{x}.up_proj.weight"] = rnd(i, h)
            state[f"{p}.mlp.experts.{x}.down_proj.weight"] = rnd(h, i)
    save_file(dict(sorted(state.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    dense_maker.write_json(out / "config.json", MOE_CONFIG)
    dense_maker.write_json(
        out / "generation_config.json",
        {"bos_token_id": dense_maker.BOS_ID, "eos_token_id": dense_maker.EOS_ID, "pad_token_id": dense_maker.PAD_ID},
    )


def moe_plan() -> dict[str, float]:
    c = MOE_CONFIG
    plan = {}
    for layer in range(c["num_hidden_layers"]):
        for leaf in LINEAR_LEAVES[:4]:
            plan[f"model.layers.{layer}.{leaf}"] = K_PLAN[layer][leaf.rsplit(".", 1)[-1]]
        for x in range(c["num_experts"]):
            for proj, k in MOE_K.items():
                plan[f"model.layers.{layer}.mlp.experts.{x}.{proj}"] = k
    plan["lm_head"] = HEAD_BITS
    return plan


def linear_plan() -> dict[str, float]:
    plan = {}
    for layer, leaves in K_PLAN.items():
        for leaf in LINEAR_LEAVES:
            plan[f"model.layers.{layer}.{leaf}"] = leaves[leaf.rsplit(".", 1)[-1]]
    plan["lm_head"] = HEAD_BITS
    return plan


def convert(dense_dir: Path, exl3_dir: Path, twin_dir: Path, seed: int, plan: dict[str, float] | None = None) -> dict:
    import torch
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(1)
    state = load_file(str(dense_dir / "model.safetensors"))
    plan = plan or linear_plan()
    generator = torch.Generator().manual_seed(seed + 1)
    packed: dict[str, torch.Tensor] = {}
    twin: dict[str, torch.Tensor] = {}
    report = {}
    numel_k = numel = 0
    for name in sorted(state):
        prefix = name.removesuffix(".weight")
        if prefix not in plan:
            packed[name] = state[name].contiguous()
            twin[name] = state[name].contiguous()
            continue
        k = plan[prefix]
        weight = state[name].to(torch.float32)
        trellis, suh, svh, marker = encode_linear(weight, k, generator)
        packed[f"{prefix}.trellis"] = trellis
        packed[f"{prefix}.suh"] = suh
        packed[f"{prefix}.svh"] = svh
        packed[f"{prefix}.{CODEBOOK}"] = marker
        dec = decoded_weight(trellis, suh, svh, weight.shape[1], weight.shape[0])
        twin[name] = dec
        rel = float((dec - weight).norm() / weight.norm())
        report[prefix] = {"k": k, "rel_err": round(rel, 4)}
        if prefix != "lm_head":
            numel_k += k * weight.numel()
            numel += weight.numel()
        print(f"packed {prefix}: K={k} rel err {rel:.4f}", file=sys.stderr)

    config = json.loads((dense_dir / "config.json").read_text())
    quant = {
        "quant_method": "exl3",
        "version": VERSION,
        "bits": round(numel_k / numel, 2),
        "head_bits": HEAD_BITS,
        "codebook": CODEBOOK,
        "out_scales": "never",
    }
    for out, tensors, cfg in (
        (exl3_dir, packed, {**config, "quantization_config": quant}),
        (twin_dir, twin, config),
    ):
        for f in dense_dir.iterdir():
            if f.name not in ("model.safetensors", "config.json"):
                shutil.copy2(f, out / f.name)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        dense_maker.write_json(out / "config.json", cfg)
    dense_maker.write_json(exl3_dir / "quantization_config.json", quant)
    return {"quantization_config": quant, "linears": report}


def make_tiny_exl3(out: Path, dense_out: Path | None = None, seed: int = 0,
                   train_steps: int = dense_maker.DEFAULT_TRAIN_STEPS, moe: bool = False) -> dict:
    out = out.absolute()
    dense_out = (dense_out or out.with_name(out.name + "-dense")).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    dense_out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.work-", dir=out.parent))
    staged_exl3 = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    staged_twin = Path(tempfile.mkdtemp(prefix=f".{dense_out.name}.tmp-", dir=dense_out.parent))
    try:
        if moe:
            (work / "source").mkdir()
            moe_source(work / "source", seed)
            source = {"sha256": dense_maker.sha256_file(work / "source" / "model.safetensors")}
            summary = convert(work / "source", staged_exl3, staged_twin, seed, moe_plan())
        else:
            source = dense_maker.make_tiny_model(work / "source", seed=seed, train_steps=train_steps)
            summary = convert(work / "source", staged_exl3, staged_twin, seed)
        dense_maker.finish_tree(staged_exl3)
        dense_maker.finish_tree(staged_twin)
        summary.update(
            {
                "path": str(out),
                "dense_path": str(dense_out),
                "sha256": dense_maker.sha256_file(staged_exl3 / "model.safetensors"),
                "dense_sha256": dense_maker.sha256_file(staged_twin / "model.safetensors"),
                "source_sha256": source["sha256"],
                "seed": seed,
                "train_steps": train_steps,
            }
        )
        dense_maker.install_dir(staged_twin, dense_out)
        dense_maker.install_dir(staged_exl3, out)
        return summary
    except BaseException:
        shutil.rmtree(staged_exl3, ignore_errors=True)
        shutil.rmtree(staged_twin, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="EXL3 model directory to write")
    parser.add_argument("--dense-out", type=Path, default=None, help="dense twin directory (<out>-dense)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the dense model and the signs (0)")
    parser.add_argument("--train-steps", type=int, default=dense_maker.DEFAULT_TRAIN_STEPS,
                        help=f"training steps of the dense source ({dense_maker.DEFAULT_TRAIN_STEPS})")
    parser.add_argument("--moe", action="store_true", help="make the tiny MoE variant (random Qwen3-MoE)")
    args = parser.parse_args(argv)
    if args.train_steps < 0:
        parser.error("--train-steps must be >= 0")
    with contextlib.redirect_stdout(sys.stderr):
        summary = make_tiny_exl3(args.out, args.dense_out, seed=args.seed, train_steps=args.train_steps,
                                 moe=args.moe)
    sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
