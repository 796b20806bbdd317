"""The fixture's real EXL3 checkpoint (exllamav3 1.6.5 converter) served by vLLM through the overlay.

Runs vLLM's offline LLM (CPU build) in subprocesses (vllm_greedy.py), with
the overlay laid out on PYTHONPATH the way spark-kit materialises it:

* the EXL3 model tracks its dense source: greedy tokens for 10 prompts, and
  the first-step top-20 log-probabilities (logit error). The fixture is a
  *random* tiny Llama: its next-token distribution is nearly flat (top
  log-probs ~ -6.0 +- 0.1 over 1024 tokens), so K=3 quantisation noise
  (~15 % relative per linear) flips greedy choices often; the bounds below
  are what separates "tracks" from a broken decode (which shares ~0.4 of 20
  top tokens by chance and agrees on ~0 first tokens);
* a corrupted marker stops the load with an error naming the tensor;
* the tiny MoE EXL3 model (tools/make_tiny_exl3.py --moe) served with
  tensor parallelism 2 (column/row/QKV/LM-head slices, experts' gate/up split
  on the output and down on the input) gives the tokens and log-probs of its
  dense twin served without quantization, and the exl3 methods ran in both
  workers.

Run with -s to see the per-prompt table.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import spark_overlay

safetensors_torch = pytest.importorskip("safetensors.torch")

HERE = Path(__file__).resolve().parent
OVERLAY_ROOT = HERE.parent
REPO = OVERLAY_ROOT.parent
ARCHIVE = "exl3-tiny-llama-b3.tar.gz"


def _fixture_dir() -> Path:
    return Path(os.environ.get("SPARK_KIT_TEST_FIXTURES", REPO.parent / "shared" / "fixtures"))


@pytest.fixture(scope="module")
def overlay(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("overlay") / f"overlay-{spark_overlay.__version__}"
    shutil.copytree(OVERLAY_ROOT / "spark_overlay", root / "spark_overlay",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(OVERLAY_ROOT / "spark_overlay.dist-info-template",
                    root / f"spark_overlay-{spark_overlay.__version__}.dist-info")
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    archive = _fixture_dir() / ARCHIVE
    if not archive.is_file():
        pytest.skip(f"fixture {archive} not found (set SPARK_KIT_TEST_FIXTURES to the folder holding {ARCHIVE})")
    root = tmp_path_factory.mktemp("exl3-fixture-models")
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(root, filter="data")
    exl3 = root / "shared-b3-exl3"
    # exllamav3's head reconstruction sits beside the model in the fixture; it is not part of it.
    (exl3 / "ground_truth_weights.safetensors").rename(root / "ground_truth_weights.safetensors")
    return {"exl3": exl3, "dense": root / "shared-b3-dense"}


def run_greedy(model: Path, overlay: Path, cwd: Path, tp: int = 1) -> tuple[int, str, dict | None]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_PLUGINS")}
    env.update(PYTHONPATH=str(overlay), VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_LOGGING_LEVEL="INFO")
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(r % (os.cpu_count() or 1)) for r in range(tp))
    proc = subprocess.run([sys.executable, str(HERE / "vllm_greedy.py"), str(model), "--tp", str(tp)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"prompts"')]
    return proc.returncode, output, (json.loads(lines[0]) if lines else None)


def test_fixture_exl3_served_tracks_dense_source(models, overlay, tmp_path):
    rc, log, exl3 = run_greedy(models["exl3"], overlay, tmp_path)
    assert rc == 0 and exl3 is not None, log[-6000:]
    # the exl3 method ran in the worker, on every linear and the head
    ready = [line for line in log.splitlines() if "exl3: " in line and " ready on cpu" in line]
    assert len(ready) == 9, log[-6000:]  # 2 x (qkv, o, gate_up, down) + lm_head
    assert any("lm_head ready on cpu (1 packed linear, K 6)" in line for line in ready)
    assert any("exl3: first cpu forward through" in line for line in log.splitlines())

    rc, log, dense = run_greedy(models["dense"], overlay, tmp_path)
    assert rc == 0 and dense is not None, log[-6000:]
    assert "exl3: " not in log

    first_agree = 0
    overlaps, errors = [], []
    print(f"\n{'prompt':18s} {'first tok':>9s} {'same prefix':>11s} {'top20 shared':>12s} {'mean|dlogp|':>11s}")
    for prompt, a, b, la, lb in zip(exl3["prompts"], exl3["tokens"], dense["tokens"],
                                    exl3["first_logprobs"], dense["first_logprobs"]):
        shared = set(la) & set(lb)
        err = [abs(la[t] - lb[t]) for t in shared]
        prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        first_agree += a[0] == b[0]
        overlaps.append(len(shared))
        errors += err
        print(f"{prompt!r:18s} {str(a[0] == b[0]):>9s} {prefix:>11d} {len(shared):>12d} {sum(err) / len(err):11.4f}")
    mean_err = sum(errors) / len(errors)
    print(f"first-token agreement {first_agree}/10, mean top-20 overlap {sum(overlaps) / 10:.1f}, "
          f"log-prob error mean {mean_err:.4f} max {max(errors):.4f}")
    assert first_agree >= 3
    assert sum(overlaps) / len(overlaps) >= 12
    assert mean_err <= 0.1 and max(errors) <= 0.35


def test_corrupted_marker_stops_the_load_naming_the_tensor(models, overlay, tmp_path):
    bad = tmp_path / "bad-exl3"
    shutil.copytree(models["exl3"], bad)
    tensors = safetensors_torch.load_file(str(bad / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.mul1"].fill_(-877912083)  # the MCG multiplier under a .mul1 name
    safetensors_torch.save_file(tensors, str(bad / "model.safetensors"))
    rc, log, result = run_greedy(bad, overlay, tmp_path)
    assert rc != 0 and result is None
    assert ("model.layers.1.mlp.up_proj.mul1: marker value -877912083 does not match the mul1 multiplier "
            "-2082680531") in log, log[-6000:]


def test_tiny_moe_exl3_tp2_equals_its_dense_twin(overlay, tmp_path):
    maker = OVERLAY_ROOT / "tools" / "make_tiny_exl3.py"
    out = tmp_path / "tiny-moe-exl3"
    proc = subprocess.run([sys.executable, str(maker), "--moe", "--out", str(out)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(overlay)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(summary["dense_path"]) == tmp_path / "tiny-moe-exl3-dense"

    rc, log, exl3 = run_greedy(out, overlay, tmp_path, tp=2)
    assert rc == 0 and exl3 is not None, log[-6000:]
    for rank in (0, 1):
        mine = [line for line in log.splitlines() if line.startswith(f"(Worker_TP{rank} ")]
        assert sum(" ready on cpu (3 packed linears" in line for line in mine) == 2, log[-6000:]
        assert sum("mlp.experts ready on cpu (4 experts" in line for line in mine) == 2, log[-6000:]
        assert any("lm_head ready on cpu" in line for line in mine)
        assert any("exl3: first cpu moe forward through model.layers.0.mlp.experts" in line for line in mine)

    rc, log, dense = run_greedy(Path(summary["dense_path"]), overlay, tmp_path, tp=1)
    assert rc == 0 and dense is not None, log[-6000:]
    assert "exl3: " not in log
    assert exl3["tokens"] == dense["tokens"]
    worst = max(abs(exl3_lp[t] - dense_lp[t]) for exl3_lp, dense_lp in zip(exl3["first_logprobs"],
                                                                          dense["first_logprobs"]) for t in dense_lp)
    print(f"\ntiny MoE EXL3 (TP=2) vs dense twin (TP=1): 10/10 same tokens, max |dlogprob| {worst:.2e}")
    assert worst < 1e-4
