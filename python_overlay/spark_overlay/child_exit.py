"""Say how each child of vLLM's top process ended, at the moment it is reaped.

vLLM's API server exits 0 after its EngineCore crashed or was killed, so the
engine's own exit status says nothing about what died. spark-kit's agent reads
one line per child exit from the engine log::

    spark-kit engine: child exited: pid=7 signal=9 comm=VLLM::EngineCor

The venv runtime's engine process also watches its children from a native
thread, but vLLM can reap a dead child before that thread looks. This hook
closes the race from the inside: in the top process only (not in EngineCore
or workers, whose children are not the engine's), ``os.waitpid`` is wrapped so
that, before the real call reaps a child, ``os.waitid(..., WNOWAIT)`` reads its
ending and ``/proc/<pid>/comm`` without reaping it, and the line is written to
stderr. It also runs inside a container (the docker runtime), where no native
watcher exists. The line format is shared with ``src/engine/child_exit.rs``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading

PREFIX = "spark-kit engine: child exited: "

_lock = threading.Lock()
_reported: set[int] = set()
_owner: int | None = None  # the pid that installed the wrapper (a forked child inherits it)


def line(pid: int, code: int, killed: bool, comm: str) -> str:
    """The log line for one child's ending (``signal=`` when killed)."""
    how = f"signal={code}" if killed else f"code={code}"
    return f"{PREFIX}pid={pid} {how} comm={comm}"


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _target(pid: int) -> tuple[int, int]:
    """``waitpid``'s pid argument as ``waitid``'s (idtype, id)."""
    if pid > 0:
        return os.P_PID, pid
    if pid == -1:
        return os.P_ALL, 0
    return os.P_PGID, (os.getpgid(0) if pid == 0 else -pid)


def peek(pid: int, options: int) -> None:
    """Report the child that ``waitpid(pid, options)`` is about to reap, if any."""
    idtype, ident = _target(pid)
    flags = os.WEXITED | os.WNOWAIT | (options & os.WNOHANG)
    try:
        info = os.waitid(idtype, ident, flags)
    except (ChildProcessError, InterruptedError, OSError):
        return
    if info is None or info.si_pid <= 0:
        return
    killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
    with _lock:
        if info.si_pid in _reported:
            return
        _reported.add(info.si_pid)
    try:
        sys.stderr.write(line(info.si_pid, info.si_status, killed, _comm(info.si_pid)) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def active() -> bool:
    """Whether this process's reaps are logged (not in a forked child of the top process)."""
    return _owner == os.getpid()


def install() -> bool:
    """Wrap ``os.waitpid`` in this process; True if it was installed now."""
    global _owner
    with _lock:
        if _owner is not None:
            return False
        _owner = os.getpid()
    real = os.waitpid

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        if not active():
            return real(pid, options)
        peek(pid, options)
        got = real(pid, options)
        if got[0] > 0:
            with _lock:
                _reported.discard(got[0])  # a later child may reuse the pid
        return got

    waitpid.__wrapped__ = real  # type: ignore[attr-defined]
    os.waitpid = waitpid
    return True


def register() -> None:
    """Overlay provider: install in vLLM's top process only."""
    if multiprocessing.parent_process() is None:
        install()
