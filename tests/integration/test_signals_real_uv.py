"""SIGTERM, SIGHUP and SIGKILL of ``ensure`` while the real uv runs a (hanging) build backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from bootstrap.env import generations
from bootstrap.primitives.lock import holder_path, inspect
from testing.processes import alive, session_members, start, wait_for
from testing.uvlog import read_uv_entries
from tests.integration.conftest import RealWorld


def hanging_backend(slow: Path, proc: subprocess.Popen[str]) -> int:
    """The pid of the build backend once it hangs in build_editable (see HANG_BACKEND)."""
    wait_for((slow / "HANGING").exists, timeout=120, proc=proc)
    return int((slow / "HANGING").read_text())


def uv_pids(world: RealWorld) -> list[int]:
    """The uv processes of ``world`` (the logging shim execs uv: the logged pid is uv's)."""
    return [int(e["pid"]) for e in read_uv_entries(world.uv_log)]


def holds(pid: int, path: Path) -> bool:
    """Whether ``pid`` has ``path`` open (its descriptors, as /proc shows them)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd) == str(path) for fd in fds.iterdir())
    except OSError:
        return False


@pytest.fixture
def hanging(real: RealWorld) -> Path:
    """A ready venv with one skill, and a second whose build hangs while its HANG file is."""
    real.write_config(requirements=[real.runtime_package()])
    real.skill("alpha")
    real.ensure()
    slow = real.hanging_skill("slow")
    (slow / "HANG").write_text("")
    return slow


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_during_a_real_build_stops_uv_and_its_backend(
        real: RealWorld, hanging: Path, signum: signal.Signals, code: int) -> None:
    proc = start(real)
    hanging_backend(hanging, proc)
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == code, err
    assert session_members(proc.pid) == []  # uv and the build backend are gone
    assert not inspect(real.venv).held and not holder_path(real.venv).exists()
    current = generations.current(real.venv)  # the venv's own tree: not a leftover
    assert [p.name for p in real.venv.parent.iterdir()
            if p.name.startswith(".venv.") and p != current] == []
    (hanging / "HANG").unlink()
    out = json.loads(real.ensure("--json").stdout)
    assert out["installed"] == ["slow"] and real.imports("slow")
    assert real.status()["ready"] is True


def test_a_sigkilled_session_leaves_no_backend_working_beside_the_next(
        real: RealWorld, hanging: Path) -> None:
    real.clear_log()
    proc = start(real)
    backend = hanging_backend(hanging, proc)
    [uv] = uv_pids(real)
    lock_file = real.venv.with_name("venv.lock")
    assert holds(uv, lock_file) and holds(backend, lock_file)  # inherited, through uv
    os.kill(proc.pid, signal.SIGKILL)  # ensure alone: uv and its backend live on
    proc.communicate(timeout=10)

    # They hold the lock, so the next session waits rather than installing beside them.
    assert alive(uv) and alive(backend)
    waited = real.ensure("--lock-timeout", "1", ok=False)
    assert waited.returncode == 1 and "timed out" in waited.stderr
    assert real.status()["lock"]["held"] is True

    (hanging / "HANG").unlink()  # the build finishes, uv installs it and exits: the lock is free
    wait_for(lambda: not alive(uv) and not alive(backend), timeout=120)
    real.ensure()
    assert real.imports("slow") and real.status()["ready"] is True
