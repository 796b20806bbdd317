"""Make spark-kit's tiny Llama test model, offline and deterministically.

    python make_tiny_model.py --out DIR [--seed 0] [--train-steps 300]

Writes a normal Hugging Face model directory (config.json,
generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json) that vLLM serves on CPU:

* tokenizer: byte-level BPE trained with ``tokenizers`` on the top-level
  ``*.py`` files of this Python's standard library, read in sorted path order;
  vocab 2048, specials ``<unk> <s> </s> <pad>`` (ids 0-3), ``<s>`` prepended,
  a minimal ``role: content`` chat template;
* model: LlamaForCausalLM, hidden 128, intermediate 256, 2 layers, 4 heads of
  32 (CPU attention needs head size >= 32), 2 KV heads (TP=2 divides),
  untied embeddings, max 512 positions, float32;
* weights: seeded init, then ``--train-steps`` AdamW steps of next-token
  training on the same text (single thread), so greedy output is text-like
  rather than one repeated token.

Same seed, same Python standard library, same torch build and CPU => same
bytes (``sha256`` of model.safetensors in the summary). The output directory
is built in a temporary sibling and renamed into place; an existing directory
at ``--out`` is replaced only once the new one is complete.

stdout carries exactly one line: a JSON summary
``{"path", "params", "bytes", "sha256", ...}``. Progress and library warnings
go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

# Must be set before tokenizers/torch start their thread pools: one thread
# keeps BPE training and float reductions in a fixed order.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0, 1, 2, 3
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
MAX_POSITIONS = 512
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": MAX_POSITIONS,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
    "torch_dtype": "float32",
}
log = logging.getLogger("make_tiny_model")

DEFAULT_TRAIN_STEPS = 300
TRAIN_BATCH = 8
TRAIN_SEQ_LEN = 128
TRAIN_LR = 3e-3


def corpus_files() -> list[Path]:
    """The training text: top-level stdlib ``*.py`` files, sorted by path."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    if not files:
        raise RuntimeError(f"no *.py files in the standard library at {stdlib}")
    return files


def read_corpus(files: list[Path]) -> tuple[list[str], str]:
    """File texts (undecodable bytes replaced) and their combined sha256."""
    digest = hashlib.sha256()
    texts = []
    for path in files:
        data = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + data + b"\0")
        texts.append(data.decode("utf-8", errors="replace"))
    return texts, digest.hexdigest()


def train_tokenizer(texts: list[str]):
    """Byte-level BPE, vocab 2048, ``<s>`` prepended by the post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", BOS_ID)],
    )
    for token_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != token_id:
            raise RuntimeError(f"special token {token} did not get id {token_id}")
    return tokenizer


def write_tokenizer_files(tokenizer, out: Path) -> None:
    tokenizer.save(str(out / "tokenizer.json"))
    specials = {
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(out / "tokenizer_config.json", tokenizer_config)
    write_json(out / "special_tokens_map.json", specials)


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_model(seed: int, train_steps: int, token_ids: list[int]):
    """Seeded LlamaForCausalLM, trained ``train_steps`` steps on ``token_ids``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    config = LlamaConfig(**{k: v for k, v in MODEL_CONFIG.items() if k != "architectures"})
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(torch.float32)

    final_loss = None
    if train_steps > 0:
        data = torch.tensor(token_ids, dtype=torch.long)
        window = TRAIN_SEQ_LEN + 1
        if data.numel() <= window:
            raise RuntimeError("training text is shorter than one training window")
        generator = torch.Generator().manual_seed(seed)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=TRAIN_LR, betas=(0.9, 0.95), weight_decay=0.0
        )
        model.train()
        for step in range(train_steps):
            # Linear warm-up over the first 10% of steps, linear decay to 10% at the end.
            scale = min(1.0, (step + 1) / max(1, train_steps // 10))
            scale *= 1.0 - 0.9 * step / train_steps
            for group in optimizer.param_groups:
                group["lr"] = TRAIN_LR * scale
            starts = torch.randint(0, data.numel() - window, (TRAIN_BATCH,), generator=generator)
            batch = torch.stack([data[s : s + window] for s in starts.tolist()])
            loss = _next_token_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            final_loss = float(loss.detach())
            if (step + 1) % 50 == 0 or step + 1 == train_steps:
                log.info("train step %d/%d loss %.3f", step + 1, train_steps, final_loss)
        model.eval()
    return model, final_loss


def _next_token_loss(model, batch):
    import torch.nn.functional as F

    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def write_weights(model, path: Path) -> int:
    """Write model.safetensors (float32, contiguous, sorted names); return params."""
    from safetensors.torch import save_file

    state = {
        name: tensor.detach().to("cpu").contiguous().clone()
        for name, tensor in sorted(model.state_dict().items())
        if not name.endswith("rotary_emb.inv_freq")
    }
    save_file(state, str(path), metadata={"format": "pt"})
    return sum(t.numel() for t in state.values())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def finish_tree(root: Path) -> None:
    """Give the staged tree normal permissions (mkdtemp makes it 0700) and fsync it."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(root, 0o777 & ~umask)
    for path in sorted(root.iterdir()):
        os.chmod(path, 0o666 & ~umask)
        with path.open("rb") as f:
            os.fsync(f.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install_dir(staged: Path, out: Path) -> None:
    """Move the complete ``staged`` directory to ``out``, replacing any old one."""
    old = None
    if out.exists() or out.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rename(out, old / "dir")
    os.rename(staged, out)
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old)


def make_tiny_model(out: Path, seed: int = 0, train_steps: int = DEFAULT_TRAIN_STEPS) -> dict:
    """Build the model directory at ``out``; return the summary dict."""
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        texts, corpus_sha256 = read_corpus(corpus_files())
        tokenizer = train_tokenizer(texts)
        write_tokenizer_files(tokenizer, staged)
        token_ids = [
            token_id
            for encoding in tokenizer.encode_batch(texts)
            for token_id in encoding.ids + [EOS_ID]
        ]
        model, final_loss = build_model(seed, train_steps, token_ids)
        params = write_weights(model, staged / "model.safetensors")
        write_json(staged / "config.json", MODEL_CONFIG)
        write_json(
            staged / "generation_config.json",
            {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID},
        )
        finish_tree(staged)
        summary = {
            "path": str(out),
            "params": params,
            "bytes": sum(p.stat().st_size for p in staged.iterdir()),
            "sha256": sha256_file(staged / "model.safetensors"),
            "seed": seed,
            "train_steps": train_steps,
            "final_loss": None if final_loss is None else round(final_loss, 4),
            "corpus_files": len(texts),
            "corpus_sha256": corpus_sha256,
        }
        install_dir(staged, out)
        return summary
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="model directory to write")
    parser.add_argument("--seed", type=int, default=0, help="initialisation and data seed (0)")
    parser.add_argument(
        "--train-steps",
        type=int,
        default=DEFAULT_TRAIN_STEPS,
        help=f"training steps after init, 0 = random weights ({DEFAULT_TRAIN_STEPS})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="make_tiny_model: %(message)s")
    if args.train_steps < 0:
        parser.error("--train-steps must be >= 0")
    # Only the summary goes to stdout; anything a library prints goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        summary = make_tiny_model(args.out, seed=args.seed, train_steps=args.train_steps)
    sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
