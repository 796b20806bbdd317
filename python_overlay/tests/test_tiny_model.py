"""tools/make_tiny_model.py: CLI contract, determinism, and an HF-loadable model.

Runs in the engine venv (needs torch, transformers, tokenizers, safetensors).
Builds the model twice with the default settings (~30 s each on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

OVERLAY_ROOT = Path(__file__).resolve().parents[1]
MAKER = OVERLAY_ROOT / "tools" / "make_tiny_model.py"
EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


def run_maker(out: Path, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(MAKER), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line, got: {proc.stdout!r}"
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The default model built twice, into two directories."""
    root = tmp_path_factory.mktemp("tiny")
    first = run_maker(root / "a", "--seed", "0")
    second = run_maker(root / "b")  # seed defaults to 0
    return root, first, second


def test_summary_fields(built):
    root, first, _ = built
    assert first["path"] == str(root / "a")
    assert first["params"] == 819_840
    assert first["seed"] == 0
    files = {p.name: p.stat().st_size for p in (root / "a").iterdir()}
    assert set(files) == EXPECTED_FILES
    assert first["bytes"] == sum(files.values())
    assert first["bytes"] < 8 * 1024 * 1024


def test_deterministic_across_runs(built):
    root, first, second = built
    assert first["sha256"] == second["sha256"]
    assert {k: v for k, v in first.items() if k != "path"} == {
        k: v for k, v in second.items() if k != "path"
    }
    for name in sorted(EXPECTED_FILES):
        assert (root / "a" / name).read_bytes() == (root / "b" / name).read_bytes(), name


def test_no_temporary_directories_left(built):
    root, _, _ = built
    assert sorted(p.name for p in root.iterdir()) == ["a", "b"]


def test_config_fits_cpu_attention_and_tp2(built):
    root, _, _ = built
    config = json.loads((root / "a" / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["hidden_size"] // heads
    assert config["head_dim"] == head_dim >= 32
    assert kv_heads == 2 and heads % 2 == 0  # TP=2 divides both
    assert config["vocab_size"] == 2048
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is False


def test_tokenizer_and_chat_template(built):
    from transformers import AutoTokenizer

    root, _, _ = built
    tokenizer = AutoTokenizer.from_pretrained(str(root / "a"))
    assert len(tokenizer) == 2048
    assert (tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 1, 2, 3)
    ids = tokenizer("def main():\n    return 0\n")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids[1:]) == "def main():\n    return 0\n"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<s>user: hello\nassistant:"


def test_greedy_text_is_not_degenerate(built):
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    root, _, _ = built
    tokenizer = AutoTokenizer.from_pretrained(str(root / "a"))
    model = LlamaForCausalLM.from_pretrained(str(root / "a")).eval()
    assert next(model.parameters()).dtype == torch.float32
    ids = tokenizer("def main(", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=32, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    assert len(new) == 32
    assert len(set(new)) >= 8, tokenizer.decode(new)


def test_replaces_existing_directory_atomically(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    summary = run_maker(out, "--train-steps", "0", "--seed", "1")
    assert set(p.name for p in out.iterdir()) == EXPECTED_FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert summary["train_steps"] == 0 and summary["final_loss"] is None
    assert out.stat().st_mode & 0o777 == 0o777 & ~_umask()  # not mkdtemp's 0700


def test_seed_changes_weights(tmp_path):
    a = run_maker(tmp_path / "s0", "--train-steps", "0", "--seed", "0")
    b = run_maker(tmp_path / "s1", "--train-steps", "0", "--seed", "1")
    assert a["sha256"] != b["sha256"]


def test_bad_arguments_fail_without_output(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(MAKER), "--out", str(tmp_path / "x"), "--train-steps", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert not (tmp_path / "x").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
