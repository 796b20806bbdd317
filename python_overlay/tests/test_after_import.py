"""spark_overlay.after_import: a patch runs right after the module's first import, or at once if imported;
the module keeps its real loader's behaviour (source, file name); a patch that raises makes the import raise."""

from __future__ import annotations

import inspect
import sys

import pytest

from spark_overlay.after_import import after_import, pending


def test_patch_waits_for_the_import_then_runs_once(tmp_path, monkeypatch):
    (tmp_path / "spark_ai_demo.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spark_ai_demo", raising=False)
    calls = []
    after_import("spark_ai_demo", lambda m: calls.append(m.f()))
    assert pending("spark_ai_demo") and calls == []
    import spark_ai_demo

    assert calls == [1] and not pending("spark_ai_demo")
    assert inspect.getsource(spark_ai_demo.f).startswith("def f")
    assert spark_ai_demo.__loader__.get_filename("spark_ai_demo").endswith("spark_ai_demo.py")
    after_import("spark_ai_demo", lambda m: calls.append("now"))  # already imported: at once
    assert calls == [1, "now"]


def test_a_failing_patch_fails_the_import(tmp_path, monkeypatch):
    (tmp_path / "spark_ai_bad.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spark_ai_bad", raising=False)

    def refuse(module):
        raise RuntimeError("drifted")

    after_import("spark_ai_bad", refuse)
    with pytest.raises(RuntimeError, match="drifted"):
        import spark_ai_bad  # noqa: F401
    sys.modules.pop("spark_ai_bad", None)
