"""The GPU scripts (python_overlay/tests/gpu/*.py) on a machine without a GPU: they import, their stand-ins keep up.

* every script imports (its top level needs only torch and the overlay);
* every stand-in runtime class a script defines (name ending in "Runtime") overrides each public
  method of the Engram hook's `hook.Runtime` with the same parameters, so a method the hook starts
  calling (as `dp()` was) breaks this test, not a GPU run;
* the two-process TP=2 script runs its CPU dry run (gloo, the stand-in kernel) and its sum matches
  the unsplit reference.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark_overlay.engram import hook

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "python_overlay" / "tests" / "gpu"
SCRIPTS = sorted(GPU.glob("*.py"))


def load(path: Path):
    for p in (str(GPU), str(REPO / "python_overlay" / "tests")):
        if p not in sys.path:
            sys.path.insert(0, p)
    spec = importlib.util.spec_from_file_location(f"gpu_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def protocol() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(hook.Runtime).items()
            if callable(fn) and not name.startswith("_")}


def test_there_are_gpu_scripts():
    assert {p.name for p in SCRIPTS} >= {"engram_dequant.py", "exl3_ground_truth.py", "exl3_moe_fused.py", "exl3_tp2.py"}


def runtime_mismatches(cls) -> list[str]:
    bad = []
    for name, sig in protocol().items():
        own = vars(cls).get(name)
        if own is None:
            bad.append(f"{cls.__name__}.{name} missing (hook.Runtime has it)")
        elif list(inspect.signature(own).parameters) != list(sig.parameters):
            bad.append(f"{cls.__name__}.{name}{inspect.signature(own)} != hook.Runtime.{name}{sig}")
    return bad


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_gpu_script_imports_and_its_runtime_stand_ins_follow_the_hook(path):
    module = load(path)
    runtimes = [c for n, c in vars(module).items() if inspect.isclass(c) and n.endswith("Runtime")
                and c.__module__ == module.__name__]
    for cls in runtimes:
        assert runtime_mismatches(cls) == []


def test_the_runtime_check_fails_on_a_stand_in_without_dp():
    class OldRuntime:  # what gpu/engram_dequant.py had before the DP change
        def tp(self):
            return 2, 1

        def max_tokens(self):
            return 256

        def device(self):
            return None

    assert runtime_mismatches(OldRuntime) == ["OldRuntime.dp missing (hook.Runtime has it)"]


def test_tp2_script_cpu_dry_run(tmp_path):
    proc = subprocess.run([sys.executable, str(GPU / "exl3_tp2.py"), "--backend", "gloo", "--small", "--out",
                           str(tmp_path), "--port", "29631"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "OK"
    res = json.loads((tmp_path / "results-tp2.json").read_text())
    assert [r["tokens"] for r in res["accuracy"]] == [4, 16]
    assert all(r["moe_max_rel"] <= 2e-3 and r["wo_b_max_rel"] <= 2e-3 for r in res["accuracy"])
