"""The EXL3 package's tiers (docs/exl3-overlay.md, "Layout"), checked on the source.

* format/ imports neither vLLM nor anything CUDA; backends/ imports no vLLM;
* vllm/linear.py and vllm/moe.py never import each other (what they share is vllm/common.py);
* backends/select.py is the only file under exl3/ that reads the environment, and its switches parse
  strictly.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from spark_overlay.exl3.backends import select
from spark_overlay.exl3.format.errors import Exl3FormatError

EXL3 = Path(__file__).resolve().parents[1] / "spark_overlay" / "exl3"
TIERS = ("format", "backends", "vllm")


def imports(path: Path) -> set[str]:
    """Every module `path` imports, relative ones resolved against the exl3 package."""
    tree = ast.parse(path.read_text())
    here = ["spark_overlay", "exl3", *path.relative_to(EXL3).parts[:-1]]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def files(tier: str) -> list[Path]:
    return sorted((EXL3 / tier).glob("*.py"))


def test_the_three_tiers_exist_and_nothing_is_left_at_the_top():
    assert sorted(p.name for p in EXL3.glob("*.py")) == ["__init__.py"]
    for tier in TIERS:
        assert files(tier), tier
    assert (EXL3 / "backends" / "select.py").is_file()


@pytest.mark.parametrize("path", files("format") + files("backends"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_format_and_backends_do_not_import_vllm(path):
    bad = sorted(m for m in imports(path) if m == "vllm" or m.startswith("vllm.") or ".exl3.vllm" in m)
    assert not bad, f"{path.relative_to(EXL3)} imports {bad}"


@pytest.mark.parametrize("path", files("format"), ids=lambda p: p.name)
def test_format_uses_no_cuda(path):
    mods = imports(path)
    assert not any(m.split(".")[0] in ("exllamav3", "triton") or ".exl3.backends" in m for m in mods), path.name
    cuda = [n for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Attribute) and n.attr == "cuda" and ast.unparse(n.value) == "torch"]
    assert not cuda, f"{path.name} touches torch.cuda"


def test_glue_linear_and_moe_share_only_through_common():
    linear, moe = imports(EXL3 / "vllm" / "linear.py"), imports(EXL3 / "vllm" / "moe.py")
    assert not any(m.startswith("spark_overlay.exl3.vllm.moe") for m in linear)
    assert not any(m.startswith("spark_overlay.exl3.vllm.linear") for m in moe)
    assert "spark_overlay.exl3.vllm.common" in linear | {m.rsplit(".", 1)[0] for m in linear}


def reads_environment(path: Path) -> bool:
    return any(
        (isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv", "environb"))
        or (isinstance(n, ast.Name) and n.id in ("environ", "getenv"))
        for n in ast.walk(ast.parse(path.read_text()))
    )


def test_only_select_reads_the_environment():
    readers = sorted(str(p.relative_to(EXL3)) for p in EXL3.rglob("*.py") if reads_environment(p))
    assert readers == ["backends/select.py"]


def test_select_backend_and_switches():
    assert select.backend(True) == "cuda" and select.backend(False) == "cpu"
    assert select.moe_coop({}) is True
    assert select.moe_coop({"SPARK_EXL3_MOE_COOP": "0"}) is False
    with pytest.raises(Exl3FormatError, match="SPARK_EXL3_MOE_COOP='yes' is not 0, 1 or own"):
        select.moe_coop({"SPARK_EXL3_MOE_COOP": "yes"})
    assert select.moe_decode({}) == "own" and select.moe_decode({"SPARK_EXL3_MOE_COOP": "1"}) == "exllamav3"
    assert not select.moe_decode_explicit({}) and select.moe_decode_explicit({"SPARK_EXL3_MOE_COOP": "own"})
    assert select.moe_decode({"SPARK_EXL3_MOE_COOP": "own"}) == "own"
    assert select.moe_coop({"SPARK_EXL3_MOE_COOP": "own"}) is True
    assert select.moe_decode({"SPARK_EXL3_MOE_COOP": "0"}) == "off"
    assert select.SWITCHES == ("SPARK_EXL3_MOE_COOP",)
