"""spark_overlay.child_exit: each child's ending is logged before vLLM's own reap."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from spark_overlay import child_exit

# The same pattern src/engine/child_exit.rs parses.
LINE = re.compile(r"spark-kit engine: child exited: pid=(\d+) (code|signal)=(-?\d+) comm=(.*)$")

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, time
    from spark_overlay import child_exit

    def nap():
        # In a child (forked or spawned) reaps are not logged: its children are not the engine's.
        child_exit.register()
        assert not child_exit.active(), "active in a child"
        time.sleep(60)

    def fail():
        sys.exit(3)

    if __name__ == "__main__":
        child_exit.register()
        assert child_exit.active() and hasattr(os.waitpid, "__wrapped__")
        ctx = multiprocessing.get_context(sys.argv[1])
        a = ctx.Process(target=nap, name="Napper")
        a.start()
        time.sleep(1.0)
        os.kill(a.pid, signal.SIGKILL)
        a.join()  # reaps at once, as vLLM's monitor does
        b = ctx.Process(target=fail, name="Failer")
        b.start()
        b.join()
        print(a.pid, a.exitcode, b.pid, b.exitcode)
    """
)


def _run(method: str, tmp_path) -> tuple[str, str]:
    script = tmp_path / "reap.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), method], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_a_killed_and_a_failed_child_are_logged_even_when_reaped_at_once(tmp_path):
    for method in ("spawn", "fork"):
        out, err = _run(method, tmp_path)
        a_pid, a_code, b_pid, b_code = (int(x) for x in out.split())
        assert (a_code, b_code) == (-9, 3)
        found = [m for m in map(LINE.search, err.splitlines()) if m]
        seen = {int(m[1]): (m[2], int(m[3])) for m in found}
        assert seen.get(a_pid) == ("signal", 9), (method, err)
        assert seen.get(b_pid) == ("code", 3), (method, err)
        # Each child once (a reused pid aside), and nothing from inside the children.
        assert [int(m[1]) for m in found].count(a_pid) == 1, err
        assert [int(m[1]) for m in found].count(b_pid) == 1, err


def test_line_format_matches_the_agents_parser():
    assert child_exit.line(42, 9, True, "VLLM::EngineCor") == (
        "spark-kit engine: child exited: pid=42 signal=9 comm=VLLM::EngineCor"
    )
    assert child_exit.line(7, 1, False, "python3").endswith("pid=7 code=1 comm=python3")
